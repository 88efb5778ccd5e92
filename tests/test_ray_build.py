"""``build-index --ray`` against a real Ray head on loopback (2 worker CPUs), started and stopped
here: the index is the local build's, byte for byte; a Ray worker SIGKILLed in the middle of
the build is replaced and the build still ends with that index; a killed driver resumes."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from _builds import ENV, assert_same_index, build_cmd, committed, kill_after_commits, run
from conftest import REPO, toy_docs, write_corpus

from indexer.ray_workers import LOOPBACK_ENV, local_head

RAY_ENV = {**ENV, **LOOPBACK_ENV}  # the build-index drivers stay on loopback too


@pytest.fixture(scope="module")
def ray_head():
    """A Ray head on 127.0.0.1 with 2 CPUs (2 worker processes at one CPU each), stopped after the module."""
    pytest.importorskip("ray", reason="Ray is not installed: pip install -e '.[ray]' (make installs it)")
    with local_head(2, env=ENV) as address:
        yield address


@pytest.fixture(scope="module")
def corpus_and_reference(tmp_path_factory, tiny_model_dir):
    """600 short documents (60 shards of 10) and the index a local build makes of them."""
    work = tmp_path_factory.mktemp("ray")
    corpus = write_corpus(work / "corpus", toy_docs(600), "beir")
    run(build_cmd(corpus, work / "reference", tiny_model_dir, "--shard-size", "10"))
    return corpus, work / "reference"


def ray_cmd(corpus: Path, target: Path, model: Path, address: str) -> list[str]:
    return build_cmd(corpus, target, model, "--shard-size", "10", "--ray", address, "--workers", "2")


def test_a_ray_build_is_the_local_build(ray_head, corpus_and_reference, tiny_model_dir, tmp_path):
    corpus, reference = corpus_and_reference
    proc = subprocess.run(ray_cmd(corpus, tmp_path / "index", tiny_model_dir, ray_head), cwd=REPO, env=RAY_ENV,
                          capture_output=True, text=True, timeout=600, check=False)  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert_same_index(reference, tmp_path / "index")
    build = json.loads((tmp_path / "index" / "manifest.json").read_text())["build"]
    assert build["executor"]["executor"] == "ray" and build["executor"]["workers"] == 2
    local = json.loads((reference / "manifest.json").read_text())["build"]
    assert build["shards"] == 60 and build["encoded_with"] == local["encoded_with"]  # each shard names its runtime
    assert committed(tmp_path / "index") == []


def _actor_processes() -> list:
    import psutil

    found = []
    for p in psutil.process_iter(["pid", "cmdline"]):
        title = " ".join(p.info["cmdline"] or [])
        if "ShardEncoderActor" in title:
            found.append((p.info["pid"], title))
    return found


def test_a_worker_killed_mid_build_is_replaced_and_the_index_is_the_same(ray_head, corpus_and_reference, tiny_model_dir, tmp_path):
    corpus, reference = corpus_and_reference
    target = tmp_path / "index"
    build = subprocess.Popen(ray_cmd(corpus, target, tiny_model_dir, ray_head), cwd=REPO, env=RAY_ENV,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)  # fmt: skip
    killed = None
    deadline = time.monotonic() + 300
    # a worker busy with a shard (its process title names the method it runs), once some shards are in
    while killed is None and build.poll() is None and time.monotonic() < deadline:
        if len(committed(target)) >= 2:
            busy = [pid for pid, title in _actor_processes() if "encode" in title]
            if busy:
                os.kill(busy[0], signal.SIGKILL)
                killed = busy[0]
        time.sleep(0.001)
    _out, err = build.communicate(timeout=600)
    assert killed is not None, "the build ended before a worker could be killed mid-way"
    assert build.returncode == 0, err[-4000:]
    assert len(committed(target)) == 0
    assert_same_index(reference, target)
    assert killed not in [pid for pid, _ in _actor_processes()]


def test_a_killed_driver_resumes_on_ray(ray_head, corpus_and_reference, tiny_model_dir, tmp_path):
    corpus, reference = corpus_and_reference
    target = tmp_path / "index"
    cmd = ray_cmd(corpus, target, tiny_model_dir, ray_head)
    done_before = kill_after_commits(cmd, target, RAY_ENV)
    proc = subprocess.run(cmd, cwd=REPO, env=RAY_ENV, capture_output=True, text=True, timeout=600, check=False)
    assert proc.returncode == 0, proc.stderr[-4000:]
    manifest = json.loads((target / "manifest.json").read_text())
    assert manifest["build"]["shards_resumed"] >= done_before >= 3
    assert_same_index(reference, target)


def test_without_ray_the_flag_says_how_to_install_it(monkeypatch, capsys, toy_corpus, tiny_model_dir, tmp_path):
    from indexer.cli import main

    monkeypatch.setitem(sys.modules, "ray", None)  # import ray raises ImportError
    code = main(["--corpus", str(toy_corpus), "--index", str(tmp_path / "index"), "--model", str(tiny_model_dir),
                 "--adapter", "none", "--ray", "auto", "--quiet"])  # fmt: skip
    assert code == 2
    err = capsys.readouterr().err
    assert "pip install -e '.[ray]'" in err and "--ray" in err
    assert not (tmp_path / "index").exists()
