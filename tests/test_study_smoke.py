"""Smoke tests of the studies that had none (experiments/): each study's ``main`` run end to end on the
tiny model and toy data, and what it writes checked: a results table with a row per system, variant or
collection it was asked for, and finite numbers in the cells that hold measurements.

What the numbers are worth is not judged here (a tiny random model); that the study runs against
today's code, and writes what ``beir-eval report`` renders, is.
"""
from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
from conftest import save_tiny_sentence_encoder


def _table(path: Path) -> dict:
    data = json.loads(path.read_text(encoding="utf-8"))
    assert data["kind"] == "table" and data["command"].startswith("python -m experiments.")
    assert all(len(row) == len(data["columns"]) for row in data["rows"])
    return data


def _finite(*values) -> bool:
    return all(isinstance(v, (int, float)) and math.isfinite(v) for v in values)


def _write_beir(root: Path, docs: list[dict], queries: dict[str, str], qrels: dict[str, dict[str, int]]) -> Path:
    (root / "qrels").mkdir(parents=True)
    (root / "corpus.jsonl").write_text("".join(json.dumps(d) + "\n" for d in docs), encoding="utf-8")
    (root / "queries.jsonl").write_text("".join(json.dumps({"_id": q, "text": t}) + "\n" for q, t in queries.items()), encoding="utf-8")
    lines = ["query-id\tcorpus-id\tscore"] + [f"{q}\t{d}\t{s}" for q, rel in qrels.items() for d, s in rel.items()]
    (root / "qrels" / "test.tsv").write_text("\n".join(lines) + "\n", encoding="utf-8")
    return root


@pytest.fixture
def toy_beir(tmp_path) -> Path:
    """A judged BEIR collection of the conftest's toy documents (three topics' words)."""
    from conftest import toy_docs

    docs = toy_docs(24)
    queries = {"q1": "cat dog pet", "q2": "computer memory software", "q3": "snow mountain ski"}
    qrels = {q: {docs[i]["_id"]: 1 for i in range(j, 24, 8)} for j, q in enumerate(queries)}
    return _write_beir(tmp_path / "toy", docs, queries, qrels)


# ------------------------------------------------------------------ milvus_rankers
def test_milvus_rankers_reads_each_channels_runs_and_writes_a_row_per_collection(tmp_path):
    from experiments import milvus_rankers

    for collection, scale in (("adi", 1.0), ("cisi", 30.0)):
        folder = tmp_path / "run" / "runs" / collection
        folder.mkdir(parents=True)
        for channel in milvus_rankers.CHANNELS:
            lines = [f"q{q} Q0 d{r} {r + 1} {scale * (10 - r) / 10:.4f} {channel}-milvus" for q in range(3) for r in range(10)]
            (folder / f"{channel}-milvus.trec").write_text("\n".join(lines) + "\n", encoding="utf-8")
    out = tmp_path / "rankers.json"
    assert milvus_rankers.main(["--runs", str(tmp_path / "run"), "--out", str(out)]) == 0
    data = _table(out)
    assert [row[0] for row in data["rows"]] == ["adi", "cisi"]
    for row in data["rows"]:
        assert _finite(*row[1:]) and all(0 <= spread <= 1 for spread in row[2::2])
    # large scores are squashed by arctan: cisi's spread (scores up to 30) is far below adi's (up to 1)
    assert data["rows"][1][2] < data["rows"][0][2]


# ------------------------------------------------------------------ text2token_table
def test_text2token_table_scores_sts_per_variant(tmp_path, tiny_model_dir):
    from experiments import text2token_table

    pairs = tmp_path / "sts.tsv"
    rows = [("a cat and a dog", "a dog and a cat", 5.0), ("computer memory", "snow on the mountain", 0.0),
            ("ski on snow", "snow for skiing", 4.0), ("software bug", "a pet cat", 0.5)]  # fmt: skip
    pairs.write_text("sentence1\tsentence2\tscore\n" + "".join(f"{a}\t{b}\t{s}\n" for a, b, s in rows), encoding="utf-8")
    out = tmp_path / "t2t.json"
    assert text2token_table.main(["--pairs", str(pairs), "--variant", "raw=none", "--model", str(tiny_model_dir), "--out", str(out)]) == 0
    data = _table(out)
    assert [row[0] for row in data["rows"]] == ["raw"]
    row = data["rows"][0]
    assert _finite(row[2]) and -1 <= row[2] <= 1  # STS-B Spearman
    assert row[3:] == ["–"] * (len(data["columns"]) - 3)  # no beir-eval run named: no nDCG cells


# ------------------------------------------------------------------ segments_study
def test_segments_study_writes_a_single_and_a_multi_row_per_collection(toy_beir, tmp_path, tiny_embedder, monkeypatch):
    from embedder.encoder import Embedder
    from experiments import segments_study

    monkeypatch.setattr(Embedder, "load", classmethod(lambda cls, *a, **kw: tiny_embedder))
    out = tmp_path / "segments.json"
    assert segments_study.main(["--data", str(toy_beir), "--out", str(out)]) == 0
    data = _table(out)
    assert [row[0] for row in data["rows"]] == ["toy (single)", "toy (multi)"]
    for row in data["rows"]:
        docs, vectors, _split, sparse, dense, hybrid = row[1:7]
        assert docs == 24 and vectors >= docs and _finite(sparse, dense, hybrid) and all(0 <= v <= 1 for v in (sparse, dense, hybrid))


# ------------------------------------------------------------------ update_cost
def test_update_cost_updates_and_rebuilds_to_the_same_index(toy_beir, tmp_path, tiny_embedder, monkeypatch):
    from embedder.encoder import Embedder
    from embedder.sentence_encoder import SentenceEncoder
    from experiments import update_cost

    encoder_dir = save_tiny_sentence_encoder(tmp_path / "encoder")
    tiny_encoder = SentenceEncoder.load(str(encoder_dir))
    monkeypatch.setattr(Embedder, "load", classmethod(lambda cls, *a, **kw: tiny_embedder))
    monkeypatch.setattr(SentenceEncoder, "load", classmethod(lambda cls, *a, **kw: tiny_encoder))
    out = tmp_path / "update.json"
    assert update_cost.main(["--data", str(toy_beir), "--replace", "2", "--delete", "2", "--out", str(out)]) == 0
    data = _table(out)
    assert len(data["rows"]) >= 1 and data["rows"][0][0] == "toy"
    result = data["details"]["toy"]
    assert result["documents"] == {"initial": 22, "added": 2, "replaced": 2, "deleted": 2, "final": 22}
    assert _finite(*result["seconds"].values())
    for mode, same in result["same_as_rebuild"].items():
        assert same["queries"] == 3 and same["top10_ids_differ"] == 0, mode  # the update gives the rebuild's index


# ------------------------------------------------------------------ server_load
def test_server_load_serves_unique_queries_without_errors(toy_corpus, tiny_model_dir, tmp_path):
    pytest.importorskip("fastapi", reason="the serve extra is not installed: pip install '.[serve]'")
    pytest.importorskip("httpx", reason="httpx is not installed: pip install '.[serve]'")
    from experiments import server_load
    from indexer import cli as build_cli

    index = tmp_path / "index"
    assert build_cli.main(["--corpus", str(toy_corpus), "--index", str(index), "--model", str(tiny_model_dir), "--adapter", "none",
                           "--top-k", "16", "--quiet", "--channels", "sparse,bm25"]) == 0  # fmt: skip
    queries = tmp_path / "queries.txt"
    queries.write_text("cat and dog\ncomputer memory\nsnow on the mountain\n", encoding="utf-8")
    out = tmp_path / "server-load.json"
    rc = server_load.main(["--index", str(index), "--queries", str(queries), "--clients", "1,2", "--concurrency", "1",
                           "--seconds", "1", "--out", str(out)])  # fmt: skip
    assert rc == 0
    data = _table(out)
    assert [(row[0], row[1]) for row in data["rows"]] == [(1, 1), (1, 2)]  # a row per (max concurrency, clients)
    for _conc, _clients, requests, seconds, qps, p50, p99, errors, _per_forward in data["rows"]:
        assert requests > 0 and errors == 0 and _finite(seconds, qps, p50, p99) and p50 <= p99
