"""Helpers of the tests that build indexes with the ``build-index`` command and compare them."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from conftest import REPO

ENV = {**os.environ, "PYTHONPATH": str(REPO)}
# fields of the manifest that say when and how fast, not what was built
TIMING_FIELDS = ("build", "created", "checksum")


def build_cmd(corpus: Path, target: Path, model: Path, *extra: str) -> list[str]:
    return [sys.executable, "-m", "indexer.cli", "--corpus", str(corpus), "--index", str(target), "--model", str(model),
            "--adapter", "none", "--top-k", "16", "--dense", "--lexical", "words", "--shard-size", "20", "--quiet", *extra]  # fmt: skip


def run(cmd: list[str]) -> subprocess.CompletedProcess:
    proc = subprocess.run(cmd, cwd=REPO, env=ENV, capture_output=True, text=True, timeout=600, check=False)
    assert proc.returncode == 0, proc.stderr
    return proc


def assert_same_index(a: Path, b: Path) -> None:
    """Every file byte for byte; the manifests equal but for their timing fields."""
    files_a = sorted(str(p.relative_to(a)) for p in a.rglob("*") if p.is_file())
    files_b = sorted(str(p.relative_to(b)) for p in b.rglob("*") if p.is_file())
    assert files_a == files_b
    for rel in files_a:
        if rel != "manifest.json":
            assert (a / rel).read_bytes() == (b / rel).read_bytes(), f"{rel} differs"
    ma, mb = (json.loads((d / "manifest.json").read_text()) for d in (a, b))
    assert {k: v for k, v in ma.items() if k not in TIMING_FIELDS} == {k: v for k, v in mb.items() if k not in TIMING_FIELDS}


def committed(target: Path) -> list[Path]:
    return sorted(target.parent.glob(f".{target.name}.shards-*/shard-*"))


def kill_after_commits(cmd: list[str], target: Path, env: dict, shards: int = 3) -> int:
    """Start ``cmd`` (a build into ``target``), SIGKILL it once ``shards`` shards are committed,
    and return how many were: the state a crash leaves for the rerun to resume from."""
    proc = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 300
    while len(committed(target)) < shards and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.002)
    proc.send_signal(signal.SIGKILL)
    assert proc.wait() == -signal.SIGKILL, "the build ended before it could be killed mid-way"
    return len(committed(target))
