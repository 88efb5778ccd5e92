"""One settings value (issue 69): SearchSettings, resolved against an index by the one function
resolve_settings, which says why it chose each value; the Retriever, /info and search-index show it."""
from __future__ import annotations

import pytest
from conftest import retriever_over

from retriever.fusion import DEFAULT_FUSION_WITH_ENCODER, Fusion
from retriever.settings import SearchSettings, resolve_settings

pytest.importorskip("sentence_transformers")


def test_overrides_are_settings_by_name():
    s = SearchSettings().with_overrides(profile="best", query_encoder="llm")
    assert (s.profile, s.query_encoder) == ("best", "llm") and SearchSettings().profile == "auto"
    with pytest.raises(TypeError, match="unknown search setting.*profle"):
        SearchSettings().with_overrides(profle="best")
    with pytest.raises(AttributeError):
        s.profile = "fast"  # frozen


def test_one_function_chooses_and_says_why(encoder_index, tiny_embedder):
    path, encoder = encoder_index  # sparse, dense, bm25, encoder
    r = retriever_over(path, tiny_embedder, encoder, query_encoder="llm")  # no profile
    held = r.channels_of()
    auto = resolve_settings(SearchSettings(), r.manifest, held, path)
    assert auto.profile.name == "fast" and auto.why["profile"].startswith("auto: fast")
    assert auto.query_encoder == "none" and auto.why["query_encoder"] == "the fast profile's"
    none = resolve_settings(SearchSettings(profile=None), r.manifest, held, path)
    assert none.profile is None and none.query_encoder == "auto" and none.fusion == Fusion.of(DEFAULT_FUSION_WITH_ENCODER)
    assert none.why["fusion"] == "the default for the index's channels (no profile)"
    given = resolve_settings(SearchSettings(fusion={"method": "minmax", "weights": {"bm25": 1.0}}), r.manifest, held, path)
    assert given.why["fusion"] == "given by the caller"
    explained = r.settings.explain()
    assert set(explained) == {"profile", "query_encoder", "fusion", "feedback", "sparse_pruning", "backend"}
    assert explained["query_encoder"] == {"value": "llm", "why": "asked"} and all(e["why"] for e in explained.values())
    assert r.with_fusion({"method": "minmax", "weights": {"bm25": 1.0}}).settings.why["fusion"] == "given by the caller"
    r.close()


def test_the_constructor_and_load_resolve_alike(encoder_index, tiny_embedder):
    from retriever.retriever import Retriever

    path, encoder = encoder_index
    for profile in ("auto", None, "fast"):
        direct = retriever_over(path, tiny_embedder, encoder, profile=profile)
        loaded = Retriever.load(path, SearchSettings(profile=profile), embedder=tiny_embedder, encoders={"encoder": encoder}, warm=False)
        assert direct.settings.explain() == loaded.settings.explain(), profile
        direct.close(), loaded.close()


def test_search_index_explains_its_settings(toy_corpus, tiny_model_dir, tmp_path, capsys):
    from conftest import save_tiny_sentence_encoder

    from indexer import cli as build_cli
    from retriever import cli as search_cli

    index, st = tmp_path / "index", save_tiny_sentence_encoder(tmp_path / "st")
    assert build_cli.main(["--corpus", str(toy_corpus), "--index", str(index), "--model", str(tiny_model_dir), "--adapter", "none",
                           "--quiet", "--channels", "bm25,encoder", "--encoder", str(st)]) == 0
    capsys.readouterr()
    assert search_cli.main(["--index", str(index), "--explain-settings", "-k", "2", "cat"]) == 0
    err = capsys.readouterr().err
    for name in ("profile", "query_encoder", "fusion", "feedback", "sparse_pruning", "backend"):
        assert f"search-index: settings: {name}: " in err
    assert "search-index: settings: profile: 'fast' - auto: fast" in err
