"""A ``serve`` subprocess on loopback, for the studies that load it (load_test, server_load)."""
from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import benchmarks

HOST = "127.0.0.1"  # loopback only: a study never sends load elsewhere


def free_port() -> int:
    with socket.socket() as s:
        s.bind((HOST, 0))
        return s.getsockname()[1]


def start_server(index: Path, port: int, extra: list[str], log: Path, timeout: float = 300) -> subprocess.Popen:
    """``serve INDEX`` on 127.0.0.1:port; returns once /healthz answers (or raises, with its log)."""
    import httpx

    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(benchmarks.REPO_ROOT), os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep)}
    with open(log, "w") as out:  # the child keeps its own descriptor
        proc = subprocess.Popen([sys.executable, "-m", "retriever.server.cli", str(index), "--host", HOST, "--port", str(port), *extra],
                                stdout=out, stderr=subprocess.STDOUT, env=env)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"serve exited with {proc.returncode}; its log: {log}")
        try:
            if httpx.get(f"http://{HOST}:{port}/healthz", timeout=2).status_code == 200:
                return proc
        except httpx.HTTPError:
            pass
        time.sleep(0.5)
    proc.kill()
    raise RuntimeError(f"serve did not answer /healthz within {timeout:.0f} s; its log: {log}")


def stop_server(proc: subprocess.Popen, grace: float = 15) -> None:
    """Stop a server ``start_server`` started: SIGTERM, then SIGKILL if it has not exited within ``grace`` seconds."""
    proc.terminate()
    try:
        proc.wait(grace)
    except subprocess.TimeoutExpired:
        proc.kill()
