"""Run command-line ``main`` functions in forked child processes, imports paid once.

A fresh ``python -m retriever.cli`` spends ~4 s importing torch before it reads an index, which
makes a matrix of dozens of damaged indexes take minutes. This server imports the CLI modules
once (and runs nothing that starts threads), then forks one child per request: each run is
still its own process, so a crash shows as a signal in its wait status exactly as for a fresh
interpreter, and an uncaught exception prints a traceback and exits 1 as the interpreter would.

Protocol: one JSON request per line on stdin, ``{"module": ..., "argv": [...]}``; one JSON
reply per line on stdout, ``{"returncode": rc or -signal, "stdout": ..., "stderr": ...}``.
"""
from __future__ import annotations

import importlib
import json
import os
import sys
import tempfile
import traceback

MODULES = ("retriever.cli", "indexer.verify_cli")


def _child(module: str, argv: list[str], out_path: str, err_path: str) -> None:
    out = os.open(out_path, os.O_WRONLY)
    err = os.open(err_path, os.O_WRONLY)
    os.dup2(out, 1)
    os.dup2(err, 2)
    sys.stdout = os.fdopen(1, "w", closefd=False)
    sys.stderr = os.fdopen(2, "w", closefd=False)
    try:
        rc = importlib.import_module(module).main(argv)
    except SystemExit as exc:
        rc = exc.code if isinstance(exc.code, int) else 1
    except BaseException:  # noqa: BLE001 - a forked child must reach os._exit whatever happens (the traceback is printed)
        traceback.print_exc()
        rc = 1
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(rc or 0)


def serve() -> None:
    for name in MODULES:
        importlib.import_module(name)
    reply = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)  # nothing a module prints may corrupt the reply stream
    for line in sys.stdin:
        request = json.loads(line)
        with tempfile.TemporaryDirectory() as tmp:
            paths = [os.path.join(tmp, "out"), os.path.join(tmp, "err")]
            for p in paths:
                open(p, "w").close()
            pid = os.fork()
            if pid == 0:
                _child(request["module"], request["argv"], *paths)
            _, status = os.waitpid(pid, 0)
            rc = os.waitstatus_to_exitcode(status)  # -N when killed by signal N
            with open(paths[0]) as f_out, open(paths[1]) as f_err:
                result = {"returncode": rc, "stdout": f_out.read(), "stderr": f_err.read()}
        reply.write(json.dumps(result) + "\n")
        reply.flush()


if __name__ == "__main__":
    serve()
