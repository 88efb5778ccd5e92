"""benchmarks.encode_cache: documents encoded on one machine are what a beir-eval run on another reads."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import torch

from benchmarks.datasets import load_beir_folder
from benchmarks.encode_cache import main
from embedder.cache import CachedEmbedder
from embedder.encoder import Embedder
from embedder.hardware import Capability


def write_beir(root: Path, docs: list[dict]) -> Path:
    (root / "qrels").mkdir(parents=True)
    (root / "corpus.jsonl").write_text("".join(json.dumps(d) + "\n" for d in docs), encoding="utf-8")
    (root / "queries.jsonl").write_text(json.dumps({"_id": "q1", "text": "a question"}) + "\n", encoding="utf-8")
    (root / "qrels" / "test.tsv").write_text(f"query-id\tcorpus-id\tscore\nq1\t{docs[0]['_id']}\t1\n", encoding="utf-8")
    return root


def test_the_cache_it_fills_serves_every_document_of_a_later_run(tmp_path, tiny_model_dir, docs_factory, monkeypatch):
    beir = write_beir(tmp_path / "toy", docs_factory(30))
    cache = tmp_path / "cache"
    args = ["--data", str(beir), "--model", str(tiny_model_dir), "--adapter", "none", "--dtype", "fp32",
            "--runtime", "torch", "--device", "cpu", "--batch-size", "7", "--cache", str(cache)]
    assert main(args) == 0
    record = json.loads((cache / "encode_cache.json").read_text(encoding="utf-8"))
    assert record["collections"]["toy"] == {"documents": 30, "encoded": 30, "seconds": record["collections"]["toy"]["seconds"]}

    # A later run, loaded as beir-eval loads it (same model, adapter, dtype, runtime; another batch size):
    reader = Embedder.load(tiny_model_dir, adapter="none", device="cpu", dtype="fp32", runtime="torch")
    texts = [d.text for d in load_beir_folder(beir).docs]
    expected = np.zeros((len(texts), reader.dim), np.float32)
    with torch.inference_mode():
        for pos, h, _ in reader.iter_batches(texts):
            expected[pos] = h.float().numpy()

    def no_forward(*a, **k):
        raise AssertionError("a document the cache holds was encoded again")

    cached = CachedEmbedder(reader, cache)
    monkeypatch.setattr(reader, "_forward_pooled", no_forward)
    monkeypatch.setattr(reader, "_runtime_pooled", no_forward)
    got = cached.embed_texts(texts)
    assert cached.hits == 30 and cached.misses == 0
    assert record["keys"]["document"] == cached.directory.name
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-6)

    # Filled twice: nothing is encoded again.
    assert main(args) == 0
    assert json.loads((cache / "encode_cache.json").read_text(encoding="utf-8"))["collections"]["toy"]["encoded"] == 0


def test_a_gpu_is_described_without_cpu_flags():
    gpu = Capability("cuda", "NVIDIA H200", (), True)
    assert gpu.describe() == "cuda: NVIDIA H200 native bf16: yes"
    assert Capability("cpu", "Old CPU", (), False).describe() == "cpu: Old CPU [no AVX2] native bf16: no"
