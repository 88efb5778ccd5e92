"""Try a runtime's first compile in a child process, so that a native crash cannot take ours down.

Some (graph, precision, CPU, threads) combinations kill the process that compiles them: OpenVINO
2026.4's CPU plugin raises SIGFPE ("trap divide error") when it compiles the decoder graph in
bf16 on one thread of an AMX Xeon (../shared/notes/openvino-amx.md). A signal cannot be caught,
so it took pytest, ``build-index --workers 2`` (whose workers each get one thread) or a server
down with it (the cause, a division by ``threads // 2`` in the AMX MLP kernel, is now avoided up
front: embedder.hardware.openvino_threads). Knowing every bad combination in advance is not
possible; trying each one once, in a child, is.

The first use of a combination runs ``target`` (``"module:function"``, called with keyword
arguments) in a fresh interpreter. Its verdict is cached in ``probes.json`` beside the exported
graph, keyed by everything that decides it (the settings, the CPU model and flags, the runtime's
version), so later processes on the same machine trust it without a child. A child that dies by
a signal, exits with an error, or runs past ``timeout`` gives a verdict of "unusable" with the
reason, and the caller (embedder/runtime.py) falls back to the next runtime.
"""
from __future__ import annotations

import hashlib
import json
import logging
import os
import signal
import subprocess
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

log = logging.getLogger(__name__)

VERDICTS_FILE = "probes.json"
# Bump when what a probe checks changes, so that older verdicts are not trusted.
PROBE_VERSION = 1
# A real model compiles in seconds; a child still busy after this long is taken as a hang.
DEFAULT_TIMEOUT_S = 300.0
_STDERR_TAIL = 600


@dataclass(frozen=True)
class ProbeVerdict:
    """Whether a runtime setting survived its first compile in a child process, and why not."""

    ok: bool
    reason: str  # "compiled", "killed by signal SIGFPE", "exit 1: ...", "no answer after 300 s"
    seconds: float
    cached: bool = False  # read from probes.json: no child was run this time

    def to_dict(self) -> dict:
        return asdict(self)


def probe_key(fields: dict) -> str:
    """The cache key of one probe: a digest of everything that decides its outcome."""
    return hashlib.sha256(json.dumps({**fields, "probe": PROBE_VERSION}, sort_keys=True).encode("utf-8")).hexdigest()[:20]


def _signal_name(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"


def run_in_child(target: str, kwargs: dict, timeout: float = DEFAULT_TIMEOUT_S) -> ProbeVerdict:
    """Call ``target(**kwargs)`` (``"module:function"``) in a fresh interpreter and judge how it ended.

    The child sees the parent's ``sys.path`` (so that whatever the parent can import, it can)
    and reads its arguments as JSON from standard input.
    """
    code = "from embedder.runtime_probe import _child_main; _child_main()"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}
    start = time.perf_counter()
    try:
        done = subprocess.run(
            [sys.executable, "-c", code], input=json.dumps({"target": target, "kwargs": kwargs}),
            capture_output=True, text=True, timeout=timeout, env=env, check=False,
        )
    except subprocess.TimeoutExpired:
        return ProbeVerdict(False, f"no answer after {timeout:.0f} s (taken as a hang)", time.perf_counter() - start)
    seconds = time.perf_counter() - start
    if done.returncode == 0:
        return ProbeVerdict(True, "compiled", seconds)
    if done.returncode < 0:
        return ProbeVerdict(False, f"killed by {_signal_name(-done.returncode)}", seconds)
    tail = (done.stderr or "").strip().splitlines()
    return ProbeVerdict(False, f"exit {done.returncode}: {tail[-1][:_STDERR_TAIL] if tail else 'no message'}", seconds)


def _child_main() -> None:
    """The child's side of :func:`run_in_child` (stdin: {"target", "kwargs"})."""
    import importlib

    job = json.loads(sys.stdin.read())
    module, _, name = job["target"].partition(":")
    getattr(importlib.import_module(module), name)(**job["kwargs"])


def _read_verdicts(path: Path) -> dict:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):  # absent, or damaged: probe again rather than trust it
        return {}
    return data if isinstance(data, dict) else {}


def _write_atomic(path: Path, data: dict) -> None:
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    tmp.write_text(json.dumps(data, indent=1, sort_keys=True), encoding="utf-8")
    os.replace(tmp, path)


def probe(directory: Path, fields: dict, target: str, kwargs: dict, timeout: float = DEFAULT_TIMEOUT_S) -> ProbeVerdict:
    """The verdict for ``fields`` (a setting on this machine): cached in ``directory``, else run.

    Processes that start together (``--workers N``) wait on one lock, so that one child
    probes and the others read its verdict.
    """

    def run() -> dict:
        log.info("trying %s in a child process once on this machine (%s)", target, fields)
        return run_in_child(target, kwargs, timeout).to_dict()

    known, cached = remember(directory, fields, run, valid=lambda v: isinstance(v.get("ok"), bool))
    return ProbeVerdict(known["ok"], str(known.get("reason", "")), float(known.get("seconds", 0.0)), cached=cached)


def remember(directory: Path, fields: dict, compute, valid=lambda verdict: True, refresh: bool = False) -> tuple[dict, bool]:
    """The verdict (a JSON object) kept in ``directory``'s ``probes.json`` for ``fields``, or
    ``compute()``'s, then kept there; and whether it was read rather than computed. One lock per
    directory: processes that start together compute it once. ``valid``: whether a kept verdict
    can be trusted (else it is computed again); ``refresh``: compute it again anyway (and keep the new one)."""
    from filelock import FileLock

    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / VERDICTS_FILE
    key = probe_key(fields)
    with FileLock(str(directory / f".{VERDICTS_FILE}.lock")):
        known = _read_verdicts(path).get(key)
        if isinstance(known, dict) and valid(known) and not refresh:
            return {k: v for k, v in known.items() if k not in ("fields", "date")}, True
        verdict = {k: v for k, v in compute().items() if k != "cached"}
        _store(path, key, fields, verdict)
    return verdict, False


def record(directory: Path, fields: dict, verdict: ProbeVerdict) -> None:
    """Keep ``verdict`` for ``fields`` as :func:`probe` would have (a child that already tried the
    setting, such as the speed probe's, spares the next load its own child)."""
    from filelock import FileLock

    directory = Path(directory)
    with FileLock(str(directory / f".{VERDICTS_FILE}.lock")):
        verdict_dict = verdict.to_dict()
        verdict_dict.pop("cached", None)
        _store(directory / VERDICTS_FILE, probe_key(fields), fields, verdict_dict)


def _store(path: Path, key: str, fields: dict, verdict: dict) -> None:
    verdicts = _read_verdicts(path)
    verdicts[key] = {**verdict, "fields": fields, "date": time.strftime("%Y-%m-%dT%H:%M:%S")}
    _write_atomic(path, verdicts)


__all__ = ["DEFAULT_TIMEOUT_S", "VERDICTS_FILE", "ProbeVerdict", "probe", "probe_key", "record", "remember", "run_in_child"]
