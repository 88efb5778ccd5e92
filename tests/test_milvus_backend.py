"""Milvus backend: export an index into Milvus Lite, search it through Retriever(backend="milvus"),
compare with the Numba/FAISS index (tiny model; the ADI test needs the default model and ../shared/data)."""
from __future__ import annotations

import json
from itertools import pairwise

import numpy as np
import pytest

from indexer.manifest import IndexFormatError
from retriever.ties import same_up_to_near_ties

pytest.importorskip("pymilvus", reason="pymilvus is not installed (pip install -e '.[milvus]')")
pytest.importorskip("milvus_lite", reason="milvus-lite is not installed (pip install -e '.[milvus]')")

# Milvus Lite adds the float32 products in float64, in another order than the Numba kernel
# (float32): the same scores to ~1e-7 relative; 1e-5 leaves room without hiding a wrong weight.
RTOL = 1e-5


def compare_channels(numba, milvus, queries: list[str], modes: list[str], k: int) -> int:
    """Every mode's top-k through both retrievers agree up to near ties; returns hits compared."""
    compared = 0
    for mode in modes:
        enc = numba.encode(queries, mode)
        for q in enc:
            a = numba.search_channel(q, mode, k)
            b = milvus.search_channel(q, mode, k)
            problem = same_up_to_near_ties(a[0], a[1], b[0], b[1], k, RTOL)
            assert problem is None, f"mode {mode}, query {q.text!r}: {problem}"
            compared += int((np.asarray(b[0]) >= 0).sum())
    return compared


@pytest.fixture
def toy_export(tiny_embedder, toy_corpus, tmp_path):
    from indexer.build import build_index
    from indexer.exports.milvus import export_milvus

    index = tmp_path / "index"
    build_index(toy_corpus, index, tiny_embedder, top_k=16, dense=True, lexical="words", progress=False)
    uri = str(tmp_path / "milvus.db")
    info = export_milvus(index, uri, progress=False)
    return index, uri, info


def test_milvus_channels_match_numba_on_toy_index(toy_export, tiny_embedder):
    from retriever.retriever import Retriever

    index, uri, info = toy_export
    assert info["channels"] == ["sparse", "dense", "bm25"] and info["n_docs"] == 40 and info["postings"] == 40 * 16
    numba = Retriever.load(index, embedder=tiny_embedder)
    milvus = Retriever.load(index, embedder=tiny_embedder, backend="milvus", milvus_uri=uri)
    queries = ["python programming language", "mountain river hiking", "cooking recipes with garlic", "zzz unknown"]
    assert compare_channels(numba, milvus, queries, ["sparse", "dense", "bm25"], k=10) >= 60
    # hybrid: the Retriever fuses Milvus's channel lists with its own min-max: the same ranking
    for q in queries:
        a, b = numba.search(q, k=10, mode="hybrid"), milvus.search(q, k=10, mode="hybrid")
        assert [h.doc_id for h in a] == [h.doc_id for h in b] or np.allclose([h.score for h in a], [h.score for h in b], rtol=RTOL)
        assert a[0].matched_tokens == b[0].matched_tokens  # explanations come from the index's own postings


def test_milvus_own_rankers_answer(toy_export, tiny_embedder):
    """Milvus's WeightedRanker / RRFRanker fuse inside Milvus; they return the fused top-k."""
    from retriever.retriever import Retriever

    index, uri, _ = toy_export
    weights = {"sparse": 0.2, "dense": 0.2, "bm25": 0.6}
    for method in ("milvus-weighted", "milvus-rrf"):
        r = Retriever.load(index, embedder=tiny_embedder, backend="milvus", milvus_uri=uri, fusion={"method": method, "weights": weights})
        hits = r.search("python programming language", k=5, mode="hybrid")
        assert len(hits) == 5 and all(a.score >= b.score for a, b in pairwise(hits))
    numba = Retriever.load(index, embedder=tiny_embedder, fusion={"method": "milvus-rrf", "weights": weights})
    with pytest.raises(ValueError, match="needs backend='milvus'"):
        numba.search("python", mode="hybrid")


def test_milvus_export_refusals(toy_export, tiny_embedder, make_corpus, tmp_path):
    from indexer.build import build_index
    from indexer.exports.milvus import MilvusExportError, export_milvus
    from retriever.retriever import Retriever

    index, uri, _ = toy_export
    with pytest.raises(MilvusExportError, match="exists"):
        export_milvus(index, uri, progress=False)
    again = export_milvus(index, uri, overwrite=True, progress=False)  # replaced in one rename
    assert again["n_docs"] == 40
    with pytest.raises(IndexFormatError, match="no collection 'nope'"):
        Retriever.load(index, embedder=tiny_embedder, backend="milvus", milvus_uri=uri, milvus_collection="nope")
    other = tmp_path / "other"
    build_index(make_corpus(n=30, seed=3), other, tiny_embedder, top_k=16, progress=False)
    export_milvus(other, uri, collection="other", progress=False)
    with pytest.raises(IndexFormatError, match="another index"):
        Retriever.load(index, embedder=tiny_embedder, backend="milvus", milvus_uri=uri, milvus_collection="other")
    with pytest.raises(ValueError, match="needs milvus_uri"):
        Retriever.load(index, embedder=tiny_embedder, backend="milvus")
    with pytest.raises(ValueError, match="takes no milvus_uri"):
        Retriever.load(index, embedder=tiny_embedder, backend="numba", milvus_uri=uri)
    with pytest.raises(ValueError, match="backend must be one of"):
        Retriever.load(index, embedder=tiny_embedder, backend="elastic")


def test_build_index_export_milvus_and_search_cli(toy_corpus, tiny_model_dir, tmp_path, capsys):
    """``build-index --export-milvus URI`` then ``search-index --backend milvus --milvus-uri URI``."""
    from indexer import cli as build_cli
    from retriever import cli as search_cli

    index, uri = tmp_path / "index", str(tmp_path / "m.db")
    args = ["--corpus", str(toy_corpus), "--index", str(index), "--model", str(tiny_model_dir), "--quiet", "--top-k", "16", "--lexical", "words"]
    assert build_cli.main([*args, "--export-milvus", uri]) == 0
    assert "Milvus collection 'at_index'" in capsys.readouterr().out
    query = ["python programming language", "-k", "3", "--json"]
    assert search_cli.main(["--index", str(index), *query]) == 0
    local = [json.loads(x) for x in capsys.readouterr().out.splitlines()]
    assert search_cli.main(["--index", str(index), "--backend", "milvus", "--milvus-uri", uri, *query]) == 0
    remote = [json.loads(x) for x in capsys.readouterr().out.splitlines()]
    assert [h["doc_id"] for h in local[0]["hits"]] == [h["doc_id"] for h in remote[0]["hits"]]
    assert search_cli.main(["--index", str(index), "--backend", "milvus", "--milvus-uri", uri, "--milvus-collection", "x", *query]) == 2
    assert "no collection 'x'" in capsys.readouterr().err


@pytest.fixture(scope="module")
def default_embedder():
    from embedder.encoder import Embedder
    from embedder.models import ModelNotAvailable

    try:
        return Embedder.load("smollm2-135m")
    except ModelNotAvailable as exc:
        pytest.skip(f"default model unavailable: {exc}")


@pytest.mark.slow
def test_milvus_equals_numba_on_adi_top100(default_embedder, adi, tmp_path_factory):
    """The default model on ADI: Milvus Lite's sparse (and dense, bm25) top-100 equal the Numba /
    FAISS index's up to ties, for every ADI query."""
    from indexer.build import build_index
    from indexer.exports.milvus import export_milvus
    from retriever.retriever import Retriever

    work = tmp_path_factory.mktemp("adi-milvus")
    build_index(adi, work / "index", default_embedder, dense=True, lexical="words", progress=False)
    info = export_milvus(work / "index", str(work / "milvus.db"), progress=False)
    assert info["postings"] == info["n_docs"] * 512
    numba = Retriever.load(work / "index", embedder=default_embedder)
    milvus = Retriever.load(work / "index", embedder=default_embedder, backend="milvus", milvus_uri=str(work / "milvus.db"))
    texts = [json.loads(x)["text"] for x in (adi / "queries.jsonl").read_text(encoding="utf-8").splitlines() if x.strip()]
    compared = compare_channels(numba, milvus, texts, ["sparse"], k=100)
    # ADI has 82 docs: nearly every document is ranked (78.7 a query with the v4 adapter's LLM queries, 80+ with v2's student)
    assert compared >= 75 * len(texts)
    assert compare_channels(numba, milvus, texts, ["dense", "bm25"], k=100) > 0
