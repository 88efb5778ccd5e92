"""One atomic publish (issue 33): a reader sees the old index or the new one, never half of one.

- loads racing a loop of publishes: every load is entirely index A or entirely index B;
- a crash at each step of the publish leaves the old or the new index loadable, and the next
  build sweeps what it left;
- one build per target; an index that appeared meanwhile is never replaced without overwrite;
- old-layout indexes (files directly in the directory) load and are replaced atomically.
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
from conftest import REPO, toy_docs, write_corpus

from indexer import generations
from indexer.build import build_index
from indexer.generations import build_lock, open_generation, publish
from indexer.manifest import DOC_IDS, Manifest
from indexer.reader import open_index
from indexer.shards import BuildInProgress
from retriever.retriever import Retriever

ENV = {**os.environ, "PYTHONPATH": str(REPO)}


def beside(target: Path) -> list[str]:
    """What is beside ``target`` besides the generation it points at and its build lock."""
    keep = {f".{target.name}.lock", os.readlink(target) if target.is_symlink() else None}
    return sorted(p.name for p in target.parent.iterdir() if p.name.startswith(f".{target.name}.") and p.name not in keep)


@pytest.fixture(scope="module")
def two_indexes(tmp_path_factory, tiny_tokenizer):
    """Indexes A (12 documents) and B (15 other documents) with every channel, built once."""
    from conftest import build_tiny_model, tiny_identity

    from embedder.encoder import Embedder, EmbedderConfig

    root = tmp_path_factory.mktemp("publish")
    embedder = Embedder(build_tiny_model(tiny_tokenizer, 0), tiny_tokenizer, EmbedderConfig(max_length=64, batch_size=4),
                        identity=tiny_identity(0), dtype="fp32")  # fmt: skip
    out = {}
    for name, n, seed in (("A", 12, 0), ("B", 15, 1)):
        corpus = write_corpus(root / f"corpus-{name}", toy_docs(n, seed), "beir")
        build_index(corpus, root / name, embedder, top_k=8, dense=True, lexical="words", progress=False)
        out[name] = Path(os.path.realpath(root / name))
    return out


def fingerprint(opened) -> tuple:
    """Everything a load read, from every file: equal fingerprints are the same index."""
    ch = opened.channels
    return (
        json.dumps(opened.manifest.files, sort_keys=True),
        tuple(opened.doc_ids),
        np.asarray(ch["sparse"].indptr).tobytes(), np.asarray(ch["sparse"].docs).tobytes(), np.asarray(ch["sparse"].weights).tobytes(),
        ch["dense"].index.ntotal, ch["bm25"].postings.docs.tobytes(),
    )


def expected(path: Path) -> tuple:
    opened = open_index(path)
    try:
        return fingerprint(opened)
    finally:
        opened.close()


PUBLISHER = textwrap.dedent(
    """
    import shutil, sys, tempfile, time
    from pathlib import Path
    from indexer.generations import build_lock, publish

    target, a, b, rounds, seconds = Path(sys.argv[1]), Path(sys.argv[2]), Path(sys.argv[3]), int(sys.argv[4]), float(sys.argv[5])
    end = time.monotonic() + seconds
    done = 0
    while done < rounds and time.monotonic() < end:
        tmp = Path(tempfile.mkdtemp(dir=target.parent, prefix=f".{target.name}.building-"))
        shutil.rmtree(tmp)
        shutil.copytree(b if done % 2 == 0 else a, tmp)
        with build_lock(target):
            publish(tmp, target, overwrite=True)
        done += 1
    print(done)
    """
)


@pytest.mark.parametrize("layout", ["generations", "old-layout"])
def test_loads_racing_publishes_are_always_one_whole_index(tmp_path, two_indexes, layout):
    want = {expected(two_indexes["A"]): "A", expected(two_indexes["B"]): "B"}
    target = tmp_path / "index"
    if layout == "old-layout":
        shutil.copytree(two_indexes["A"], target)  # files directly in the directory, as before generations
    else:
        with build_lock(target):
            tmp = tmp_path / ".index.building-x"
            shutil.copytree(two_indexes["A"], tmp)
            publish(tmp, target, overwrite=False)
    rounds = 300
    writer = subprocess.Popen([sys.executable, "-c", PUBLISHER, str(target), str(two_indexes["A"]), str(two_indexes["B"]), str(rounds), "90"],
                              cwd=REPO, env=ENV, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)  # fmt: skip
    seen = {"A": 0, "B": 0}
    loads = 0
    while writer.poll() is None:
        opened = open_index(target)
        try:
            got = fingerprint(opened)
        finally:
            opened.close()
        assert got in want, "a load mixed two indexes"
        seen[want[got]] += 1
        loads += 1
    out, err = writer.communicate()
    assert writer.returncode == 0, err
    published = int(out)
    assert published >= 100, f"only {published} publishes in 90 s"
    assert loads >= 50 and seen["A"] and seen["B"], (loads, seen)
    with build_lock(target):
        generations.sweep(target)
    assert beside(target) == []  # every replaced generation removed once no reader held it


def test_a_held_generation_outlives_its_replacement(tmp_path, two_indexes):
    target = tmp_path / "index"
    for name, overwrite in (("A", False), ("B", True)):
        tmp = tmp_path / f".index.building-{name}"
        shutil.copytree(two_indexes[name], tmp)
        if name == "B":
            held = open_index(target)  # a reader of A, before B is published
        with build_lock(target):
            publish(tmp, target, overwrite=overwrite)
    assert held.path.exists() and fingerprint(held) == expected(two_indexes["A"])  # still there, still A
    assert expected(target) == expected(two_indexes["B"])
    assert len(beside(target)) == 1  # A's generation, kept for its reader
    held.close()
    with build_lock(target):
        generations.sweep(target)
    assert beside(target) == [] and not held.path.exists()


class _Crash(RuntimeError):
    pass


class _OsCrashingAt:
    """``os`` for indexer.generations, raising at the n-th call of one function."""

    def __init__(self, name: str) -> None:
        self.name, self.calls = name, 0

    def __getattr__(self, attr):
        real = getattr(os, attr)
        if attr != self.name:
            return real

        def crash(*args, **kw):
            raise _Crash(f"injected crash in os.{attr}")

        return crash


# every step of generations.publish, in order; the ones from the switch of the link on
# publish the new index, the ones before it leave the old one
STEPS = [("fn", "_fsync_tree", "old"), ("os", "rename", "old"), ("os", "symlink", "old"), ("fn", "_point", "old"),
         ("fn", "_fsync_dir", "new"), ("fn", "retire", "new"), ("fn", "sweep", "new")]  # fmt: skip


@pytest.mark.parametrize("layout", ["generations", "old-layout"])
@pytest.mark.parametrize("kind, step, which", STEPS, ids=[s[1] for s in STEPS])
def test_a_crash_at_each_step_of_the_publish(tmp_path, tiny_embedder, monkeypatch, layout, kind, step, which):
    corpora = [write_corpus(tmp_path / f"c{i}", toy_docs(10 + i, i), "beir") for i in range(3)]
    target = tmp_path / "index"
    build_index(corpora[0], target, tiny_embedder, top_k=8, progress=False)
    if layout == "old-layout":
        real = Path(os.path.realpath(target))
        target.unlink()
        shutil.copytree(real, target)
        shutil.rmtree(real)
    ids = [json.loads((c / "corpus.jsonl").read_text().splitlines()[0])["_id"] for c in corpora]
    if kind == "os":
        monkeypatch.setattr(generations, "os", _OsCrashingAt(step))
    else:
        def crash(*a, **k):
            raise _Crash(f"injected crash in {step}")

        monkeypatch.setattr(generations, step, crash)
    if layout == "old-layout" and step == "_point":
        monkeypatch.undo()  # for the old layout the link is switched by renameat2: crash there instead
        monkeypatch.setattr(generations, "rename_exchange", lambda *a: (_ for _ in ()).throw(_Crash("injected crash in rename_exchange")))
    with pytest.raises(_Crash):
        build_index(corpora[1], target, tiny_embedder, top_k=8, overwrite=True, progress=False)
    monkeypatch.undo()
    with Retriever.load(target, embedder=tiny_embedder, warm=False) as r:
        assert r.doc_ids[0] == ids[0 if which == "old" else 1]
        assert len(r.doc_ids) == (10 if which == "old" else 11)
    build_index(corpora[2], target, tiny_embedder, top_k=8, overwrite=True, progress=False)
    assert beside(target) == []  # the next build swept what the crash left
    assert len(Retriever.load(target, embedder=tiny_embedder, warm=False).doc_ids) == 12


def test_a_second_build_of_one_target_is_refused(tmp_path, tiny_embedder, make_corpus):
    target = tmp_path / "index"
    corpus = make_corpus()
    # the lock held as a running build holds it
    with build_lock(target), pytest.raises(BuildInProgress, match="another build of this index is running"):
        build_index(corpus, target, tiny_embedder, top_k=8, progress=False)
    assert not os.path.lexists(target)


def test_an_index_that_appeared_meanwhile_is_never_replaced(tmp_path, tiny_embedder, make_corpus, monkeypatch):
    """Without overwrite, an index published by someone else during the build stays."""
    target = tmp_path / "index"
    other = tmp_path / "other"
    build_index(make_corpus(n=7), other, tiny_embedder, top_k=8, progress=False)
    real_publish = generations.publish_staged

    def appear_then_publish(staged, tgt, overwrite):
        shutil.copytree(other, tgt)  # a copy placed by hand while the build ran
        return real_publish(staged, tgt, overwrite)

    monkeypatch.setattr("indexer.build.publish_staged", appear_then_publish)
    with pytest.raises(FileExistsError, match="appeared during the build"):
        build_index(make_corpus(n=9), target, tiny_embedder, top_k=8, progress=False)
    assert Manifest.read(target).n_docs == 7 and not target.is_symlink()
    assert beside(target) == []  # the unpublished generation and its link are removed


def test_a_cli_build_while_another_runs_is_refused_in_one_line(tmp_path, tiny_model_dir):
    """build-index on a target another build holds (here: this process, as a running build
    does): exit 2, one line, and nothing written."""
    corpus = write_corpus(tmp_path / "corpus", toy_docs(20), "beir")
    target = tmp_path / "index"
    argv = [sys.executable, "-m", "indexer.cli", "--corpus", str(corpus), "--index", str(target),
            "--model", str(tiny_model_dir), "--adapter", "none", "--top-k", "8", "--quiet", "--overwrite"]  # fmt: skip
    with build_lock(target):
        proc = subprocess.run(argv, cwd=REPO, env=ENV, check=False, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
    lines = [line for line in proc.stderr.strip().splitlines() if line.strip() and not line.startswith("Loading weights")]  # model-loading bars and their blank lines
    assert len(lines) == 1 and f"another build of this index is running (pid {os.getpid()})" in lines[0], proc.stderr
    assert not os.path.lexists(target) and beside(target) == []


def test_orphans_of_the_old_two_rename_swap_are_swept(tmp_path, tiny_embedder, make_corpus):
    target = tmp_path / "index"
    dead = int(subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], check=False, capture_output=True, text=True).stdout)
    (tmp_path / f".index.old-{dead}").mkdir()  # what a crash between the two renames left
    (tmp_path / f".index.old-{dead}" / DOC_IDS).write_text("[]")
    (tmp_path / ".index.trash-1-x").mkdir()
    build_index(make_corpus(), target, tiny_embedder, top_k=8, progress=False)
    assert beside(target) == []


def test_open_generation_of_an_old_layout_directory(tmp_path):
    (tmp_path / "old").mkdir()
    with open_generation(tmp_path / "old") as gen:
        assert gen.path == Path(os.path.realpath(tmp_path / "old")) and not gen.moved()
    with pytest.raises(FileNotFoundError):
        open_generation(tmp_path / "missing")
