"""The pieces the Retriever is a facade over (issue 49, item 2): the Fusion value type, the BM25
query analysed once per search, and the views sharing every piece."""
from __future__ import annotations

import json

import numpy as np
import pytest
from conftest import retriever_over

from retriever.fusion import DEFAULT_FUSION, Fusion, check_fusion, default_fusion, fuse

SETTING = {"method": "rrf", "weights": {"sparse": 0.3, "bm25": 0.5, "encoder": 0.2}, "rrf_k": 20}
QUERY = "cat and dog near the river"


# ====================================================================== Fusion
def test_fusion_reads_as_the_dict_it_was_made_from():
    f = Fusion(SETTING)
    assert f == SETTING and SETTING == f and dict(f) == SETTING
    assert f["weights"] == SETTING["weights"] and f.get("norm_score") is None
    assert (f.method, f.weights, f.rrf_k, f.norm_score) == ("rrf", SETTING["weights"], 20, True)
    assert json.loads(json.dumps(f.as_dict())) == SETTING
    # the defaults where a key is not given: ranx's rrf_k, Milvus's norm_score, min-max
    plain = Fusion({"weights": {"bm25": 1.0}})
    assert (plain.method, plain.rrf_k, plain.norm_score, plain.in_engine) == ("minmax", 60, True, False)
    assert Fusion({"method": "milvus-rrf", "weights": {"bm25": 1.0}}).in_engine


def test_fusion_cannot_be_changed_by_its_maker_or_its_readers():
    given = json.loads(json.dumps(SETTING))
    f = Fusion(given)
    given["weights"]["sparse"] = 9.0
    f["weights"]["bm25"] = 9.0
    f.weights["encoder"] = 9.0
    f.as_dict()["weights"]["sparse"] = 9.0
    assert f == SETTING
    with pytest.raises(TypeError):
        f["method"] = "minmax"  # type: ignore[index]


@pytest.mark.parametrize("bad", [{"weights": {"telepathy": 1}}, {"method": "borda", "weights": {}}, {"weights": {"bm25": -1}}, [("bm25", 1)]])
def test_fusion_refuses_what_check_fusion_refuses_with_its_message(bad):
    with pytest.raises(ValueError) as made:
        Fusion(bad)
    with pytest.raises(ValueError) as checked:
        check_fusion(bad)
    assert str(made.value) == str(checked.value)


def test_fusion_of_a_fusion_is_itself_and_fuses_as_fuse_does():
    f = Fusion(SETTING)
    assert Fusion.of(f) is f and Fusion.of(SETTING) == f and Fusion(f) == f
    assert f.channels(["dense", "bm25", "sparse", "encoder"]) == ["bm25", "sparse", "encoder"]
    rng = np.random.default_rng(0)
    lists = {c: (rng.permutation(30)[:10], np.sort(rng.random(10))[::-1]) for c in ("sparse", "bm25", "encoder")}
    assert f.fuse(lists, 5) == fuse(lists, SETTING["weights"], 5, "rrf", 20)
    assert default_fusion(False) == DEFAULT_FUSION


# ====================================================================== one analysis per search
def test_the_bm25_query_is_analysed_once_per_search(encoder_index, tiny_embedder):
    pytest.importorskip("sentence_transformers")
    path, encoder = encoder_index
    r = retriever_over(path, tiny_embedder, encoder, query_encoder="llm", fusion={"method": "minmax", "weights": {"sparse": 0.5, "bm25": 0.5}})
    analyze, seen = r.channel_search.analyze, []

    def counted(text: str) -> list[str]:
        seen.append(text)
        return analyze(text)

    r.channel_search.analyze = counted
    hits = r.search(QUERY, k=8, mode="hybrid")  # the channel's query, then every hit's explanation
    assert any(h.matched_terms for h in hits)
    assert seen.count(QUERY) == 1
    r.search(QUERY, k=8, mode="bm25", where=None)
    assert seen.count(QUERY) == 1  # kept: the same text is not analysed again
    r.close()


def test_a_fusion_view_shares_every_piece(encoder_index, tiny_embedder):
    pytest.importorskip("sentence_transformers")
    path, encoder = encoder_index
    r = retriever_over(path, tiny_embedder, encoder, query_encoder="llm")
    view = r.with_fusion(SETTING)
    for piece in ("queries", "channel_search", "hybrid", "explanations", "filters"):
        assert getattr(view, piece) is getattr(r, piece), piece
    assert isinstance(view.fusion, Fusion) and view.fusion == SETTING and r.fusion != SETTING
    r.close()


def test_assigning_a_fusion_checks_it(encoder_index, tiny_embedder):
    pytest.importorskip("sentence_transformers")
    path, encoder = encoder_index
    r = retriever_over(path, tiny_embedder, encoder, query_encoder="llm")
    r.fusion = dict(SETTING)
    assert isinstance(r.fusion, Fusion) and r.fusion == SETTING
    assert r.search(QUERY, k=3, mode="hybrid")
    with pytest.raises(ValueError, match="unknown channel"):
        r.fusion = {"weights": {"telepathy": 1}}
    assert r.fusion == SETTING  # a refused setting leaves the one before
    r.close()
