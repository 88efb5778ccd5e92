"""Pruned search of the aligned-token channel through the Retriever (retriever/pruning.py)."""
from __future__ import annotations

import numpy as np
import pytest
from conftest import retriever_over

from indexer.query_pruning import pruned_search
from retriever.backends import open_backend
from retriever.pruning import SparsePruning, sparse_pruning_arg

QUERIES = ["cat and dog near the river", "computer memory", "a puzzle for the team"]


def test_settings_are_checked_and_parsed():
    assert SparsePruning.parse("0.9,50") == SparsePruning(0.9, 50)
    assert SparsePruning.parse("0.8") == SparsePruning(0.8, 100)
    assert SparsePruning(1, 3).keep_mass == 1.0 and SparsePruning(0.9, 7).to_dict() == {"keep_mass": 0.9, "depth": 7}
    for bad in ("", "0.9,", "x,5", "0.9,5,1", "1.5,10", "0,10", "0.9,0", "0.9,2.5"):
        with pytest.raises(ValueError):
            SparsePruning.parse(bad)
    with pytest.raises(ValueError, match="depth"):
        SparsePruning(0.9, True)
    import argparse

    with pytest.raises(argparse.ArgumentTypeError, match="KEEP"):
        sparse_pruning_arg("nope")


def test_the_retriever_searches_the_sparse_channel_pruned(encoder_index, tiny_embedder):
    path, encoder = encoder_index
    exact = retriever_over(path, tiny_embedder, encoder, query_encoder="llm")
    pruned = retriever_over(path, tiny_embedder, encoder, query_encoder="llm", sparse_pruning="0.6,4")
    whole = retriever_over(path, tiny_embedder, encoder, query_encoder="llm", sparse_pruning=(1.0, 4))
    assert pruned.sparse_pruning == SparsePruning(0.6, 4)
    differs = 0
    for q in exact.encode(QUERIES):
        want = pruned_search(exact.sparse, q.tokens, q.weights, 5, 0.6, 4)
        got = pruned.search_channel(q, "sparse", 5)
        n = len(want[0])
        assert np.array_equal(got[0][:n], want[0]) and np.allclose(got[1][:n], want[1])
        ref = exact.search_channel(q, "sparse", 5)
        assert all(np.array_equal(a, b) for a, b in zip(whole.search_channel(q, "sparse", 5), ref))  # keep 1: exact
        differs += not np.array_equal(got[0], ref[0])
        # the other channels are searched exactly
        for mode in ("bm25", "dense", "encoder"):
            assert all(np.array_equal(a, b) for a, b in zip(pruned.search_channel(q, mode, 5), exact.search_channel(q, mode, 5)))
    assert differs  # pruning to 60% of the weight, 4 candidates deep, changed some ranking here
    for r in (exact, pruned, whole):
        r.close()
    with pytest.raises(TypeError, match="sparse_pruning"):
        retriever_over(path, tiny_embedder, encoder, sparse_pruning=0.5)


def test_only_the_numba_backend_takes_it(encoder_index):
    with pytest.raises(ValueError, match="takes no sparse_pruning"):
        open_backend("lucene", encoder_index[0], None, {}, lucene_index="x", sparse_pruning=SparsePruning())


@pytest.mark.parametrize("module", ["retriever.cli", "retriever.server.cli", "benchmarks.cli"])
def test_the_command_lines_take_it(module, capsys):
    import importlib

    cli = importlib.import_module(module)
    make = getattr(cli, "parser", None) or cli._run_parser
    first = {"retriever.cli": ["--index", "INDEX", "a query"], "retriever.server.cli": ["INDEX"], "benchmarks.cli": ["--out", "OUT"]}[module]
    assert make().parse_args([*first, "--sparse-pruning", "0.95,100"]).sparse_pruning == SparsePruning(0.95, 100)
    assert make().parse_args(first).sparse_pruning is None  # exact unless asked for
    with pytest.raises(SystemExit) as exit_:
        make().parse_args([*first, "--sparse-pruning", "2"])
    assert exit_.value.code == 2 and "keep_mass" in capsys.readouterr().err


def test_serve_reports_it(encoder_index, tiny_embedder):
    pytest.importorskip("fastapi", reason="the serve extra is not installed: pip install '.[serve]'")
    from fastapi.testclient import TestClient

    from retriever.server.app import create_app
    from retriever.server.config import ServerConfig

    path, encoder = encoder_index
    r = retriever_over(path, tiny_embedder, encoder, query_encoder="llm", sparse_pruning="0.9,20")
    with TestClient(create_app(r, ServerConfig(), None, "no documents")) as client:
        assert client.get("/info").json()["sparse_pruning"] == {"keep_mass": 0.9, "depth": 20}
        hits = client.post("/search", json={"query": QUERIES[0], "k": 3, "mode": "sparse"}).json()
    assert [h["id"] for h in hits["hits"]] == [h.doc_id for h in r.search(QUERIES[0], k=3, mode="sparse")]
    r.close()
