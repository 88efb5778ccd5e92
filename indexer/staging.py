"""Staging directories: a build writes beside its target and renames into place when complete.

A build writes into ``.NAME.building-PID-XXXXXXXX`` next to ``NAME`` and renames it over the
target only when everything is written, so a reader never sees half an index. A build killed
outright (SIGKILL, OOM killer, power loss) cannot clean up, so the next build of the same
target sweeps the staging directories whose owner is gone.

Whether the owner is alive: it holds an ``flock`` on its staging directory for as long as it
runs (the kernel drops the lock however the process dies), and the pid in the name covers the
instant between creating the directory and locking it. A directory is swept only when its
lock is free *and* its pid is not a running process.
"""
from __future__ import annotations

import contextlib
import fcntl
import glob
import os
import re
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path


def _pid_running(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # another user's process
    try:  # a killed child its parent has not reaped yet is a zombie: dead for our purpose
        stat = Path(f"/proc/{pid}/stat").read_text()
        return stat[stat.rindex(")") + 2] != "Z"
    except (OSError, ValueError, IndexError):
        return True


def _owner_alive(path: Path, pid: int | None) -> bool:
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return True  # gone already, or not ours to judge
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        return True
    os.close(fd)  # closing releases the lock: we only needed to know it was free
    return pid is not None and _pid_running(pid)


def sweep_stale(target: Path, purpose: str = "building") -> list[Path]:
    """Remove ``target``'s staging directories left by dead processes; returns those removed."""
    target = Path(target)
    pattern = re.compile(rf"^\.{re.escape(target.name)}\.{re.escape(purpose)}-(?:(\d+)-)?[^/]+$")
    removed = []
    for path in target.parent.glob(f".{glob.escape(target.name)}.{purpose}-*"):
        m = pattern.match(path.name)
        if not m or not path.is_dir() or _owner_alive(path, int(m.group(1)) if m.group(1) else None):
            continue
        shutil.rmtree(path, ignore_errors=True)
        removed.append(path)
    return removed


@contextlib.contextmanager
def staging_dir(target: Path, purpose: str = "building") -> Iterator[Path]:
    """A fresh, locked staging directory beside ``target``, after sweeping stale ones.

    The body moves the directory into place (e.g. ``os.replace``) on success; whatever is
    still at the staging path on exit (an exception, or no move) is removed, and the lock
    released.
    """
    target = Path(target)
    target.parent.mkdir(parents=True, exist_ok=True)
    sweep_stale(target, purpose)
    tmp = Path(tempfile.mkdtemp(dir=target.parent, prefix=f".{target.name}.{purpose}-{os.getpid()}-"))
    fd = os.open(tmp, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        os.chmod(tmp, 0o755)  # mkdtemp makes it private; an index is meant to be shared
        yield tmp
    finally:
        shutil.rmtree(tmp, ignore_errors=True)  # still locked: no sweeper can race this
        os.close(fd)
