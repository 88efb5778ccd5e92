"""Builds and the model cache under concurrency and sudden death: no race, nothing left behind."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

from conftest import REPO, toy_docs, write_corpus

from indexer.build import build_index
from indexer.manifest import Manifest
from indexer.staging import staging_dir, sweep_stale

ENV = {**os.environ, "PYTHONPATH": str(REPO)}


def leftovers(target: Path) -> list[str]:
    """What is beside ``target`` besides the generation it points at and its build lock."""
    keep = {f".{target.name}.lock", os.readlink(target) if target.is_symlink() else None}
    return sorted(p.name for p in target.parent.iterdir() if p.name.startswith(f".{target.name}.") and p.name not in keep)


def test_sigkilled_build_leaves_nothing_after_the_next_build(tmp_path, tiny_model_dir, tiny_embedder):
    corpus = write_corpus(tmp_path / "corpus", toy_docs(600), "beir")
    target = tmp_path / "index"
    argv = [sys.executable, "-m", "indexer.cli", "--corpus", str(corpus), "--index", str(target),
            "--model", str(tiny_model_dir), "--adapter", "none", "--top-k", "16", "--quiet"]  # fmt: skip
    proc = subprocess.Popen(argv, cwd=REPO, env=ENV, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 120
    while not leftovers(target) and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.005)
    proc.send_signal(signal.SIGKILL)
    assert proc.wait() == -signal.SIGKILL
    stale = leftovers(target)
    # the committed shards (kept for a resume, indexer/shards.py), and the merge's staging
    # directory if the kill came that late
    assert any(s.startswith(".index.shards-") for s in stale), stale
    assert all(s.startswith((".index.shards-", ".index.building-", ".index.gen-")) for s in stale), stale
    assert not target.exists()

    tiny_embedder.identity = {"name": "tiny", "sha256": "0"}  # another model: another command, its shards swept
    build_index(corpus, target, tiny_embedder, top_k=16, progress=False)
    assert leftovers(target) == []
    assert Manifest.read(target).n_docs == 600


def test_a_live_build_is_never_swept(tmp_path):
    target = tmp_path / "index"
    with staging_dir(target) as mine:
        (mine / "half-written").write_text("x")
        assert sweep_stale(target) == []  # locked by a running process (this one)
        assert mine.exists()
    assert leftovers(target) == []  # not moved into place: removed on exit


def test_sweep_rules(tmp_path):
    target = tmp_path / "index"
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True, check=True)
    dead_pid = int(dead.stdout)
    (tmp_path / f".index.building-{dead_pid}-abc").mkdir()  # owner gone, lock free: stale
    (tmp_path / ".index.building-oldstyle1").mkdir()  # made before pids were recorded: stale
    (tmp_path / f".index.building-{os.getpid()}-xyz").mkdir()  # unlocked, but its pid runs: may be starting
    (tmp_path / f".other.building-{dead_pid}-abc").mkdir()  # another target's: not ours to sweep
    removed = sorted(p.name for p in sweep_stale(target))
    assert removed == sorted([".index.building-oldstyle1", f".index.building-{dead_pid}-abc"])
    assert sorted(p.name for p in tmp_path.iterdir()) == [f".index.building-{os.getpid()}-xyz", f".other.building-{dead_pid}-abc"]


PUBLISH = textwrap.dedent(
    """
    import os, sys, time
    from pathlib import Path
    from embedder.models import publish_once

    target, log = Path(sys.argv[1]), Path(sys.argv[2])

    def fill(tmp):
        with open(log, "a") as f:
            f.write(f"{os.getpid()}\\n")
        time.sleep(1.0)  # a slow conversion: the other process arrives meanwhile
        (tmp / "model.safetensors").write_bytes(b"weights")
        (tmp / "config.json").write_text("{}")

    assert publish_once(target, fill) == target
    assert (target / "model.safetensors").read_bytes() == b"weights"
    """
)


def test_two_cold_cache_processes_both_succeed_and_convert_once(tmp_path):
    target, log = tmp_path / "models" / "tiny-0123", tmp_path / "conversions.log"
    argv = [sys.executable, "-c", PUBLISH, str(target), str(log)]
    procs = [subprocess.Popen(argv, cwd=REPO, env=ENV, stderr=subprocess.PIPE, text=True) for _ in range(2)]
    errors = [p.communicate(timeout=120)[1] for p in procs]
    assert [p.returncode for p in procs] == [0, 0], errors
    assert len(log.read_text().split()) == 1  # converted by one of them; the other used its result
    assert sorted(p.name for p in target.parent.iterdir() if not p.name.endswith(".lock")) == ["tiny-0123"]


def test_a_killed_conversion_is_cleaned_up_by_the_next(tmp_path):
    from embedder.models import publish_once

    target = tmp_path / "models" / "m"
    target.parent.mkdir(parents=True)
    (target.parent / ".m.tmp-deadbeef").mkdir()  # what a SIGKILLed conversion leaves
    publish_once(target, lambda tmp: (tmp / "config.json").write_text("{}"))
    assert sorted(p.name for p in target.parent.iterdir() if not p.name.endswith(".lock")) == ["m"]
