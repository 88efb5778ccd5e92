"""No runtime can take the process down (issue 28): a runtime's first compile runs in a child
process, a child that dies by a signal makes the engine fall back (and say why), the verdict is
kept on disk; a build worker that dies fails the build at once, naming its shard, and the
committed shards stay for the rerun. Crashes are simulated, so this runs on any CPU."""
from __future__ import annotations

import json
import logging
from pathlib import Path

import numpy as np
import pytest

from embedder.runtime_probe import VERDICTS_FILE, probe, run_in_child

pytest.importorskip("openvino")

CRASHES = "_runtime_crashes"  # tests/_runtime_crashes.py, importable by children (they get our sys.path)


def test_a_child_killed_by_a_signal_is_a_verdict_not_a_crash():
    verdict = run_in_child(f"{CRASHES}:die", {"signal_name": "SIGFPE"})
    assert not verdict.ok and verdict.reason == "killed by SIGFPE"


def test_a_child_that_raises_gives_its_message():
    verdict = run_in_child(f"{CRASHES}:raise_value_error", {})
    assert not verdict.ok
    assert verdict.reason.startswith("exit 1:") and "a compile that fails politely" in verdict.reason


def test_a_child_that_hangs_is_stopped():
    verdict = run_in_child(f"{CRASHES}:hang", {"seconds": 30}, timeout=2)
    assert not verdict.ok and "no answer after 2 s" in verdict.reason


def test_a_verdict_is_kept_and_reused_per_setting(tmp_path):
    count = tmp_path / "calls.txt"
    fields = {"config": {"INFERENCE_PRECISION_HINT": "bf16"}, "cpu": "mocked"}
    kwargs = {"xml": "unused", "config": {"INFERENCE_PRECISION_HINT": "bf16"}, "count_in": str(count)}
    first = probe(tmp_path, fields, f"{CRASHES}:compile_that_crashes_in_bf16", kwargs)
    again = probe(tmp_path, fields, f"{CRASHES}:compile_that_crashes_in_bf16", kwargs)
    assert not first.ok and not first.cached and first.reason == "killed by SIGFPE"
    assert not again.ok and again.cached and again.reason == first.reason
    assert count.read_text().splitlines() == ["bf16"]  # one child for both calls
    other = probe(tmp_path, {**fields, "cpu": "another CPU"}, f"{CRASHES}:die", {"signal_name": "SIGSEGV"})
    assert other.reason == "killed by SIGSEGV" and not other.cached  # another machine: probed again
    saved = json.loads((tmp_path / VERDICTS_FILE).read_text())
    assert sorted(v["reason"] for v in saved.values()) == ["killed by SIGFPE", "killed by SIGSEGV"]


def test_a_damaged_verdicts_file_is_probed_again(tmp_path):
    (tmp_path / VERDICTS_FILE).write_text("{not json")
    verdict = probe(tmp_path, {"x": 1}, f"{CRASHES}:die", {"signal_name": "SIGABRT"})
    assert verdict.reason == "killed by SIGABRT" and not verdict.cached


def _texts() -> list[str]:
    return ["the cat sat near the river", "computer memory and data", "a game of chess with the team"]


def test_bf16_that_crashes_falls_back_to_openvino_fp32(make_embedder, monkeypatch, tmp_path, caplog):
    """The AMX case, simulated: bf16 kills its compile; the engine runs fp32 and says why."""
    from embedder.runtime import OpenVINORuntime

    monkeypatch.setenv("ALIGNED_TOKENS_CACHE", str(tmp_path))  # a machine that never probed this graph
    monkeypatch.setattr(OpenVINORuntime, "probe_target", f"{CRASHES}:compile_that_crashes_in_bf16")
    reference = make_embedder(runtime="openvino", dtype="fp32").embed(_texts())
    embedder = make_embedder(runtime="openvino", dtype="bf16")
    with caplog.at_level(logging.WARNING, logger="embedder.runtime"):
        got = embedder.embed(_texts())
    info = embedder.runtime_info()
    assert (info["name"], info["dtype"]) == ("openvino", "fp32")
    assert "fallback" in info["reason"] and "bf16" in info["reason"] and "SIGFPE" in info["reason"]
    assert any("SIGFPE" in r.getMessage() for r in caplog.records)  # said, not only recorded
    np.testing.assert_array_equal(got, reference)
    verdicts = json.loads(next(tmp_path.rglob(VERDICTS_FILE)).read_text())
    assert sorted((v["fields"]["config"]["INFERENCE_PRECISION_HINT"], v["ok"]) for v in verdicts.values()) == [("bf16", False), ("f32", True)]


def test_openvino_that_always_crashes_falls_back_to_torch(make_embedder, monkeypatch, tmp_path):
    from embedder.runtime import OpenVINORuntime

    monkeypatch.setenv("ALIGNED_TOKENS_CACHE", str(tmp_path))
    monkeypatch.setattr(OpenVINORuntime, "probe_target", f"{CRASHES}:compile_that_always_crashes")
    embedder = make_embedder(runtime="openvino", dtype="bf16")
    got = embedder.embed(_texts())
    assert (embedder.runtime_info()["name"], embedder.runtime_info()["dtype"]) == ("torch", "fp32")
    np.testing.assert_allclose(got, make_embedder(runtime="torch", dtype="fp32").embed(_texts()), rtol=0, atol=0)


def test_auto_on_a_mocked_amx_cpu_ends_on_what_survives_its_probe(tiny_model_dir, monkeypatch, tmp_path):
    """``--dtype auto`` on an AMX CPU measures the candidates; where OpenVINO bf16 crashes in its
    probe child (timings mocked so that it would have been the fastest), it is never chosen, a
    build still works, and its manifest says what ran and why (issue 54)."""
    import embedder.encoder as encoder_module
    import embedder.runtime as runtime_module
    from embedder import speed_probe
    from embedder.encoder import Embedder
    from embedder.hardware import Capability
    from indexer.build import build_index

    amx = Capability("cpu", "Intel Xeon (mocked AMX)", ("avx2", "avx512f", "avx512_bf16", "amx_bf16"), native_bf16=True)
    monkeypatch.setattr(encoder_module, "device_capability", lambda device: amx)
    monkeypatch.setattr(runtime_module, "cpu_capability", lambda: amx)
    monkeypatch.setenv("ALIGNED_TOKENS_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(speed_probe, "OPENVINO_TARGET", f"{CRASHES}:time_that_crashes_in_bf16")
    real, seconds = speed_probe.measure, {"torch fp32": 1.0, "torch bf16": 0.6, "openvino fp32": 0.5, "openvino bf16": 0.1}

    def timed(candidate, setup, crashes):
        got = real(candidate, setup, crashes)
        if got.ok:
            got.doc_seconds, got.query_seconds = seconds[" ".join(candidate)], [seconds[" ".join(candidate)]] * len(setup.queries)
        return got

    monkeypatch.setattr(speed_probe, "measure", timed)
    embedder = Embedder.load(str(tiny_model_dir), adapter="none", dtype="auto", runtime="auto")
    assert (embedder.precision.runtime, embedder.precision.dtype) == ("auto", "auto")  # measured at first use, not read off the flags
    corpus = tmp_path / "docs.tsv"
    corpus.write_text("".join(f"d{i}\t{t}\n" for i, t in enumerate(_texts())), encoding="utf-8")
    manifest = build_index(corpus, tmp_path / "index", embedder, top_k=8, progress=False)
    assert (manifest.runtime["name"], manifest.runtime["dtype"]) == ("openvino", "fp32")
    assert manifest.runtime["speed_probe"]["documents"] == "openvino fp32"
    assert any(line.startswith("openvino bf16") and "SIGFPE" in line for line in manifest.runtime["speed_probe"]["candidates"])
    assert manifest.build["encoded_with"] == {"openvino fp32": 1}


AMX = ("avx2", "avx512f", "avx512_vnni", "avx512_bf16", "amx_bf16", "amx_int8")


@pytest.mark.parametrize(
    ("flags", "precision", "threads", "expected"),
    [
        (AMX, "bf16", 1, 2),  # the crash avoided: the AMX MLP kernel needs a pair of threads
        (AMX, "bf16", 2, 2),
        (AMX, "bf16", 4, 4),
        (AMX, "f32", 1, 1),  # f32 is not fused into that kernel: one thread compiles
        (("avx2", "avx512f", "avx512_vnni", "avx512_bf16"), "bf16", 1, 1),  # AVX512-BF16 without AMX
        (("avx2",), "bf16", 1, 1),
    ],
)
def test_openvino_threads_avoid_the_known_crash_up_front(flags, precision, threads, expected):
    from embedder.hardware import Capability, openvino_threads

    cap = Capability("cpu", "mocked", flags, native_bf16="avx512_bf16" in flags)
    assert openvino_threads(cap, precision, threads) == expected


def test_bf16_on_one_thread_of_an_amx_cpu_compiles_with_two_and_stays_bf16(make_embedder, monkeypatch, tmp_path):
    """pytest's one torch thread (and a one-core build worker) on a mocked AMX CPU whose plugin
    crashes as the real one does: bf16 is compiled on two threads, so it is kept, not fallen back from."""
    import embedder.runtime as runtime_module
    from embedder.hardware import Capability
    from embedder.runtime import OpenVINORuntime

    amx = Capability("cpu", "Intel Xeon (mocked AMX)", AMX, native_bf16=True)
    monkeypatch.setattr(runtime_module, "cpu_capability", lambda: amx)
    monkeypatch.setenv("ALIGNED_TOKENS_CACHE", str(tmp_path))
    monkeypatch.setattr(OpenVINORuntime, "probe_target", f"{CRASHES}:compile_that_crashes_in_bf16_on_one_thread")
    monkeypatch.setattr("torch.get_num_threads", lambda: 1)
    embedder = make_embedder(runtime="openvino", dtype="bf16")
    embedder.embed(_texts())
    info = embedder.runtime_info()
    assert (info["name"], info["dtype"]) == ("openvino", "bf16") and "fallback" not in info.get("reason", "")
    verdicts = json.loads(next(tmp_path.rglob(VERDICTS_FILE)).read_text())
    assert [(v["fields"]["config"]["INFERENCE_NUM_THREADS"], v["ok"]) for v in verdicts.values()] == [(2, True)]


# ------------------------------------------------------------------ build workers that die
@pytest.fixture
def worker_corpus(tmp_path) -> Path:
    from conftest import toy_docs, write_corpus

    return write_corpus(tmp_path / "corpus", toy_docs(120), "beir")


def _parent_embedder(model_dir: Path):
    from indexer.build import EmbedderSpec

    return EmbedderSpec(str(model_dir), adapter="none", dtype="fp32", runtime="torch").load()[0]


@pytest.mark.parametrize("how", ["SIGKILL", "SIGFPE", "raise"])
def test_a_worker_that_dies_fails_the_build_at_once_naming_its_shard(tiny_model_dir, worker_corpus, tmp_path, how):
    from _runtime_crashes import DyingSpec

    from indexer.build import build_index
    from indexer.workers import WorkerFailed

    target = tmp_path / "index"
    with pytest.raises(WorkerFailed) as failed:
        build_index(worker_corpus, target, _parent_embedder(tiny_model_dir), top_k=8, chunk_size=20, progress=False,
                    workers=2, embedder_spec=DyingSpec(str(tiny_model_dir), die_on=2, how=how))
    err = failed.value
    assert err.shard in (2, 3)  # each worker dies on its second shard: worker 0's is 2, worker 1's is 3
    assert f"shard {err.shard}" in str(err) and "run the same command again to resume" in str(err)
    assert ("killed by " + how) in str(err) if how != "raise" else "worker gave up on its shard" in str(err)
    assert not target.exists()
    shards = sorted(p.name for p in tmp_path.glob(".index.shards-*/shard-*"))
    # the dead worker's first shard was committed before its death and is kept for the rerun (the
    # other worker is stopped at once, so whether its own first shard was done is a race)
    assert f"shard-{err.shard - 2:06d}" in shards


def test_the_manifest_says_when_workers_encoded_with_another_runtime(tiny_model_dir, worker_corpus, tmp_path):
    """A worker that ends on another runtime than the parent (as after a fallback) is not hidden
    behind the parent's runtime in the manifest."""
    from indexer.build import EmbedderSpec, build_index

    manifest = build_index(worker_corpus, tmp_path / "index", _parent_embedder(tiny_model_dir), top_k=8, chunk_size=20,
                           progress=False, workers=2, embedder_spec=EmbedderSpec(str(tiny_model_dir), adapter="none", dtype="fp32", runtime="openvino"))
    assert manifest.build["encoded_with"] == {"openvino fp32": 6}
    assert manifest.runtime["name"] == "torch"  # this process's, as before
    assert manifest.runtime["shards_encoded_with"] == "openvino fp32 (6 shards)"
    assert "the documents were encoded with openvino fp32 (6 shards)" in manifest.runtime["reason"]


def test_a_worker_that_dies_while_loading_is_named_so(tiny_model_dir, worker_corpus, tmp_path):
    from _runtime_crashes import DyingSpec

    from indexer.build import build_index
    from indexer.workers import WorkerFailed

    with pytest.raises(WorkerFailed, match="before its first shard .*killed by SIGSEGV"):
        build_index(worker_corpus, tmp_path / "index", _parent_embedder(tiny_model_dir), top_k=8, chunk_size=20, progress=False,
                    workers=2, embedder_spec=DyingSpec(str(tiny_model_dir), die_on=0, how="SIGSEGV"))


def test_the_rerun_after_a_dead_worker_resumes_to_the_full_index(tiny_model_dir, worker_corpus, tmp_path):
    from _runtime_crashes import DyingSpec

    from indexer.build import EmbedderSpec, build_index
    from indexer.workers import WorkerFailed

    embedder = _parent_embedder(tiny_model_dir)
    common = {"top_k": 8, "chunk_size": 20, "progress": False, "workers": 2}
    with pytest.raises(WorkerFailed):
        build_index(worker_corpus, tmp_path / "index", embedder, embedder_spec=DyingSpec(str(tiny_model_dir), die_on=2), **common)
    spec = EmbedderSpec(str(tiny_model_dir), adapter="none", dtype="fp32", runtime="torch")
    resumed = build_index(worker_corpus, tmp_path / "index", embedder, embedder_spec=spec, **common)
    fresh = build_index(worker_corpus, tmp_path / "fresh", embedder, top_k=8, chunk_size=20, progress=False)
    assert resumed.build["shards_resumed"] >= 1 and resumed.n_docs == fresh.n_docs == 120  # at least the dead worker's first shard
    for name in ("postings_indptr.npy", "postings_docs.npy", "postings_weights.npy", "doc_ids.json"):
        assert (tmp_path / "index" / name).read_bytes() == (tmp_path / "fresh" / name).read_bytes(), name
