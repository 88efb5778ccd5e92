"""Helper of tests/test_doc_commands.py, run as a subprocess: ``--help`` of programs, answered as JSON.

Reads a JSON list of ``{"kind": "script" | "module", "prog", "target", "sub"}`` on standard input;
for each, runs the console script's function (``target``, ``module:function``) or the module as
``__main__`` with ``[sub] --help`` as its arguments, in this process, output captured, 60 s at most;
prints one JSON line: the list with ``ok``, ``help`` (the output) and ``error`` added.
"""
from __future__ import annotations

import contextlib
import importlib
import importlib.util
import io
import json
import os
import runpy
import signal
import sys

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")


class _Timeout(Exception):
    pass


def _alarm(signum, frame):
    raise _Timeout("no answer to --help in 60 s")


def ask(kind: str, prog: str, target: str | None, sub: str | None) -> dict:
    argv = ([sub] if sub else []) + ["--help"]
    out = io.StringIO()
    code: object = None
    error = None
    old_argv = sys.argv
    signal.signal(signal.SIGALRM, _alarm)
    signal.alarm(60)
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):
            if kind == "script":
                module, _, func = (target or "").partition(":")
                code = getattr(importlib.import_module(module), func)(argv)
            else:
                if importlib.util.find_spec(prog) is None:
                    raise ModuleNotFoundError(f"no module named {prog!r}")
                sys.argv = [prog, *argv]
                runpy.run_module(prog, run_name="__main__", alter_sys=True)
    except SystemExit as exc:
        code = exc.code
    except BaseException as exc:  # noqa: BLE001 - any failure is the answer
        error = f"{type(exc).__name__}: {exc}"
    finally:
        signal.alarm(0)
        sys.argv = old_argv
    text = out.getvalue()
    if error is None and code not in (0, None):
        error = f"exit status {code}: {text[-400:]}"
    if error is None and "usage:" not in text.lower():
        error = f"no usage line in its --help output: {text[:300]!r}"
    return {"kind": kind, "prog": prog, "sub": sub, "ok": error is None, "help": text, "error": error}


def main() -> int:
    asks = json.load(sys.stdin)
    answers = [ask(a["kind"], a["prog"], a.get("target"), a.get("sub")) for a in asks]
    sys.stdout.write(json.dumps(answers) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
