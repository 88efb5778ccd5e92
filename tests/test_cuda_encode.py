"""The CUDA encode study (experiments/cuda_encode.py), on a CPU with the tiny model: the plain
loop and the engine's paths agree on the same model and precision, sizes are counted right, the
results file has its fields. No timing is judged; the GPU run is marked and skipped without one."""
from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from embedder.encoder import Embedder
from experiments import cuda_encode as study
from indexer.corpus import CorpusSpec, Document

K = 16  # of a ~170-token vocabulary: a real cut, not the whole vocabulary


def _config(**kw) -> study.StudyConfig:
    return study.StudyConfig(**{"plain_batch": 8, "plain_dtype": "fp32", "top_k": K, "shard_size": 16, **kw})


@pytest.mark.parametrize("runtime", [None, "torch"])
def test_plain_loop_and_engine_agree_on_the_same_model(make_embedder, docs_factory, runtime, tmp_path):
    """fp32 everywhere: the plain loop, the engine's per-shard encoding and the built index hold the
    same K tokens for every document, and the same pooled state (to float rounding; SQ8 in the index)."""
    embedder = make_embedder(runtime=runtime, dtype="fp32", max_length=32, batch_size=4)
    docs = [Document(d["_id"], f"{d['title']} {d['text']}") for d in docs_factory(30)]
    results = study.run_study(embedder, docs, tmp_path / "work", _config())

    for system in ("engine encode", "engine build"):
        agree = results["agreement"][system]
        assert agree["equal_fraction"] == 1.0 and agree["overlap_mean"] == 1.0 and agree["overlap_min"] == 1.0, system
    assert results["agreement"]["engine encode"]["cos_min"] > 0.99999
    assert results["agreement"]["engine build"]["cos_min"] > 0.99  # the compact index's dense channel is SQ8
    # sizes: every system read the same documents and prompt tokens, as the build counted them
    n_tokens = sum(len(r) for r in embedder.prompt_ids([d.text for d in docs]))
    assert results["n_docs"] == 30 and results["n_tokens"] == n_tokens == results["manifest_n_tokens"]
    assert results["k"] == K and results["channels"] == ["sparse", "dense"]
    assert results["plain_padded_tokens"] >= n_tokens
    for name in study.SYSTEMS:
        t = results["systems"][name]
        assert t["n_docs"] == 30 and t["n_tokens"] == n_tokens and t["seconds"] > 0 and t["peak_gpu_bytes"] is None
        assert t["hours_per_1m_docs"] == pytest.approx(1e6 / t["docs_per_s"] / 3600, rel=1e-2)
    b = results["breakdown"]
    assert b["forward"]["calls"] >= 30 / 4 and b["lm_head_topk"]["calls"] >= 30 / 4 and b["forward"]["gpu_s"] is None
    assert b["wall_s"] >= b["encode_s"] > 0


def test_the_wrappers_are_taken_off_after_the_build(tiny_embedder, docs_factory, tmp_path):
    docs = [Document(d["_id"], d["text"]) for d in docs_factory(6)]
    study.run_study(tiny_embedder, docs, tmp_path, _config())
    assert "top_tokens" not in vars(tiny_embedder) and "prompt_ids" not in vars(tiny_embedder)
    assert "_forward_pooled" not in vars(tiny_embedder)


def test_topk_agreement_counts_sets_not_orders():
    a = np.array([[1, 2, 3, 4], [5, 6, 7, 8]])
    b = np.array([[4, 3, 2, 1], [5, 6, 7, 9]])
    got = study.topk_agreement(a, b)
    assert got == {"equal_fraction": 0.5, "overlap_mean": pytest.approx(0.875), "overlap_min": 0.75}


def test_padded_tokens_count_each_batch_at_its_longest(tiny_embedder):
    texts = ["cat", "cat dog horse fish mouse lion", "dog dog", "tiger"]
    lengths = sorted((len(r) for r in tiny_embedder.prompt_ids(texts)), reverse=True)
    assert study.padded_tokens(tiny_embedder, texts, 2) == 2 * lengths[0] + 2 * lengths[2]
    assert study.padded_tokens(tiny_embedder, texts, 4) == 4 * lengths[0]


def test_read_documents_prefixes_ids_of_several_corpora_and_stops_at_max(make_corpus):
    one, two = make_corpus("beir", n=5), make_corpus("jsonl", n=5, seed=1)
    docs = study.read_documents([one, two], max_docs=7)
    assert len(docs) == 7 and docs[0].doc_id.startswith("beir/") and docs[5].doc_id.startswith("corpus.jsonl/")
    assert [d.doc_id for d in study.read_documents([one])] == [d.doc_id for d in CorpusSpec(one)]


def test_main_writes_the_table_and_its_details(toy_corpus, tiny_model_dir, tmp_path, capsys):
    out = tmp_path / "cuda-encode.json"
    argv = ["--data", str(toy_corpus), "--max-docs", "24", "--device", "cpu", "--model", str(tiny_model_dir), "--adapter", "none",
            "--dtype", "fp32", "--runtime", "torch", "--top-k", str(K), "--plain-batch", "8", "--quiet", "--commit", "abc123",
            "--out", str(out)]
    assert study.main(argv) == 0
    data = json.loads(out.read_text())
    assert data["kind"] == "table" and data["columns"] == study.COLUMNS
    assert [row[0] for row in data["rows"]] == list(study.SYSTEMS)
    assert all(row[5] == 1.0 for row in data["rows"])  # top-K equal: fp32 everywhere
    details = data["details"]
    assert details["commit"]["sha"] == "abc123" and details["command"].startswith("python -m experiments.cuda_encode --data")
    assert details["device"]["device"] == "cpu" and details["device"]["name"]
    assert details["n_docs"] == 24 and details["k"] == K and details["plain"]["dtype"] == "fp32"
    assert set(details["systems"]) == set(study.SYSTEMS) and set(details["ratio_to_plain"]) == set(study.SYSTEMS)
    assert details["embedder"]["runtime"] == {"name": "torch", "dtype": "fp32"}
    printed = capsys.readouterr().out
    assert "| system | docs/s |" in printed and "engine build breakdown:" in printed
    assert not list(tmp_path.glob(".cuda-encode.json.*"))  # written through a temporary file, renamed


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_on_cuda_bf16_the_engine_agrees_with_the_plain_loop(tiny_model_dir, docs_factory, tmp_path):
    """On a GPU, both in bf16: the paths run, time on the GPU, and mostly agree (a random tiny model's
    logits are close together, so rounding moves more of its K-th places than a real model's)."""
    embedder = Embedder.load(tiny_model_dir, adapter="none", device="cuda", dtype="bf16", runtime="torch")
    docs = [Document(d["_id"], d["text"]) for d in docs_factory(40)]
    results = study.run_study(embedder, docs, tmp_path, _config(plain_dtype="bf16"))
    assert results["agreement"]["engine encode"]["overlap_mean"] > 0.5
    assert results["systems"]["plain"]["peak_gpu_bytes"] > 0
    assert results["breakdown"]["forward"]["gpu_s"] > 0
