"""The load_cost study (experiments/load_cost.py): one row per query encoder it is asked to time."""
from __future__ import annotations

import json

from embedder.encoder import Embedder
from indexer.build import build_index


def test_load_cost_times_the_load_once_per_query_encoder(toy_corpus, tiny_model_dir, tmp_path, capsys):
    from experiments.load_cost import main

    index = tmp_path / "index"
    build_index(toy_corpus, index, Embedder.load(tiny_model_dir, adapter="none", device="cpu"), top_k=8, lexical="words", progress=False)
    assert main(["--index", str(index), "--repeat", "1", "--query-encoders", "none,llm"]) == 0
    rows = [json.loads(line) for line in capsys.readouterr().out.splitlines() if line.startswith("{")]
    assert [r["query_encoder"] for r in rows] == ["none", "llm"]
    assert all(r["index"] == str(index) and r["n_docs"] == 40 and r["load_s"] > 0 and r["checksums_s"] > 0 for r in rows)
