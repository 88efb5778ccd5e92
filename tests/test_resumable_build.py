"""Sharded, resumable builds: a build killed with SIGKILL and run again ends with the index an
uninterrupted build makes, byte for byte; a multi-worker build equals a single-process one."""
from __future__ import annotations

import json
import signal
import subprocess
import time

import pytest
from _builds import ENV, assert_same_index, build_cmd, committed, kill_after_commits, run
from conftest import REPO, listing, toy_docs, write_corpus


@pytest.fixture(scope="module")
def corpus_and_reference(tmp_path_factory, tiny_model_dir):
    """600 short documents (30 shards of 20) and the index an uninterrupted build makes of them."""
    work = tmp_path_factory.mktemp("resume")
    corpus = write_corpus(work / "corpus", toy_docs(600), "beir")
    run(build_cmd(corpus, work / "reference", tiny_model_dir))
    assert committed(work / "reference") == []  # shards are removed once the index is in place
    return corpus, work / "reference"


def test_sigkilled_build_resumes_to_the_same_index(corpus_and_reference, tiny_model_dir, tmp_path):
    corpus, reference = corpus_and_reference
    target = tmp_path / "index"
    cmd = build_cmd(corpus, target, tiny_model_dir)
    done_before = kill_after_commits(cmd, target, ENV)
    assert 3 <= done_before < 30 and not target.exists()

    out = run(cmd).stdout
    manifest = json.loads((target / "manifest.json").read_text())
    assert manifest["build"]["shards"] == 30 and manifest["build"]["shards_resumed"] >= done_before
    assert f"resumed {manifest['build']['shards_resumed']} of 30 shards" in out
    assert committed(target) == [] and listing(tmp_path) == ["index"]
    assert_same_index(reference, target)


def test_another_command_does_not_resume_and_sweeps_the_old_shards(corpus_and_reference, tiny_model_dir, tmp_path):
    """Shards are keyed by the command: other settings start afresh, and the abandoned shards go."""
    corpus, _ = corpus_and_reference
    target = tmp_path / "index"
    proc = subprocess.Popen(build_cmd(corpus, target, tiny_model_dir), cwd=REPO, env=ENV, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 300
    while len(committed(target)) < 2 and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.002)
    proc.send_signal(signal.SIGKILL)
    assert proc.wait() == -signal.SIGKILL
    cmd = build_cmd(corpus, target, tiny_model_dir)
    cmd[cmd.index("--top-k") + 1] = "8"
    run(cmd)
    manifest = json.loads((target / "manifest.json").read_text())
    assert manifest["build"]["shards_resumed"] == 0 and manifest["channels"]["sparse"]["top_k"] == 8
    assert listing(tmp_path) == ["index"]


def test_two_workers_build_the_same_index(corpus_and_reference, tiny_model_dir, tmp_path):
    corpus, reference = corpus_and_reference
    run(build_cmd(corpus, tmp_path / "index", tiny_model_dir, "--workers", "2"))
    assert_same_index(reference, tmp_path / "index")


def test_workers_need_a_way_to_load_the_embedder(tiny_embedder, toy_corpus, tmp_path):
    from indexer.build import build_index

    with pytest.raises(ValueError, match="embedder_spec"):
        build_index(toy_corpus, tmp_path / "index", tiny_embedder, workers=2, progress=False)


def test_postings_merged_from_shards_are_those_of_one_inversion(tmp_path):
    """InvertedIndex.write_from_shards writes the very bytes from_forward + save write, whatever the shard size."""
    import numpy as np

    from indexer.inverted_index import InvertedIndex

    rng = np.random.default_rng(0)
    vocab, k, n = 300, 16, 1000
    tokens = np.stack([rng.choice(vocab, k, replace=False) for _ in range(n)]).astype(np.int32)
    weights = rng.random((n, k)).astype(np.float32)
    InvertedIndex.from_forward(tokens, weights, vocab).save((tmp_path / "one").mkdir() or tmp_path / "one")
    for size in (1, 128, 999, 1000):
        out = tmp_path / f"shards-{size}"
        out.mkdir()
        shards = lambda size=size: ((tokens[i : i + size], weights[i : i + size]) for i in range(0, n, size))
        assert InvertedIndex.write_from_shards(shards, vocab, out) == n
        for name in ("indptr", "docs", "weights"):
            assert (out / f"postings_{name}.npy").read_bytes() == (tmp_path / "one" / f"postings_{name}.npy").read_bytes(), (size, name)
    with pytest.raises(ValueError, match="outside the vocabulary"):
        InvertedIndex.write_from_shards(lambda: iter([(tokens, weights)]), 10, tmp_path)
