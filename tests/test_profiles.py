"""Operating points (issue 50): ``fast`` and ``best`` on one index, chosen at load time.

- Retriever.load: "auto" is fast where the index has fast's channels, an older index is searched
  as it was built; "best" fuses the second encoder channel (mpnet) in MiniLM's place, no LLM
  per query, and on an index without it encodes queries with the LLM and fuses the dense channel
  too; an explicit query encoder or fusion overrides the profile's;
- search-index --profile, beir-eval systems default / default-best on one shared index;
- the fusion rules of experiments/operating_points.py on toy matrices.
"""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from conftest import save_tiny_sentence_encoder

from indexer.build import build_index
from indexer.manifest import Manifest
from retriever.profiles import PROFILES, fit_profile, get_profile, profile_fusion
from retriever.retriever import DEFAULT_FUSION_WITH_ENCODER, Retriever

pytest.importorskip("sentence_transformers")


@pytest.fixture(scope="module")
def st_dir(tmp_path_factory) -> Path:
    return save_tiny_sentence_encoder(tmp_path_factory.mktemp("tiny-st"), seed=0)


@pytest.fixture(scope="module")
def st2_dir(tmp_path_factory) -> Path:
    return save_tiny_sentence_encoder(tmp_path_factory.mktemp("tiny-st2"), seed=1)  # another model, as mpnet is to MiniLM


@pytest.fixture
def full_index(toy_corpus, tiny_embedder, st_dir, st2_dir, tmp_path) -> Path:
    """Every channel build-index builds by default: sparse, dense, bm25, encoder, encoder2."""
    from embedder.sentence_encoder import SentenceEncoder

    build_index(toy_corpus, tmp_path / "index", tiny_embedder, top_k=16, progress=False, dense=True, lexical="words",
                channels={"encoder": SentenceEncoder.load(st_dir), "encoder2": SentenceEncoder.load(st2_dir)})  # fmt: skip
    return tmp_path / "index"


@pytest.fixture
def minilm_index(toy_corpus, tiny_embedder, st_dir, tmp_path) -> Path:
    """build-index's default where mpnet is not installed: sparse, dense, bm25, encoder."""
    from embedder.sentence_encoder import SentenceEncoder

    build_index(toy_corpus, tmp_path / "minilm", tiny_embedder, top_k=16, progress=False, dense=True, lexical="words",
                encoder=SentenceEncoder.load(st_dir))  # fmt: skip
    return tmp_path / "minilm"


def test_the_default_index_is_searched_fast_without_the_llm(full_index, tiny_embedder, monkeypatch):
    r = Retriever.load(full_index, embedder=tiny_embedder, warm=False)
    # BM25 + MiniLM weighed as the index's calibration says (issue 71: the toy corpus yields enough held-out spans)
    assert r.profile is PROFILES["fast"] and r.query_encoder == "none" and r.fusion == profile_fusion(PROFILES["fast"], r.manifest.calibration)[0]
    assert r.channels_of("hybrid") == ["bm25", "encoder"] and r.fusion_source.startswith("calibrated on this corpus")

    def no_llm(*args, **kwargs):
        raise AssertionError("the fast profile ran the LLM on a query")

    monkeypatch.setattr("retriever.query_encoding.encode_queries", no_llm)
    hits = r.search("cat and dog near the river", k=3)
    assert len(hits) == 3 and all(h.query_encoder == "" for h in hits)  # "": no LLM channel was read
    assert set().union(*(h.channels for h in hits)) <= {"bm25", "encoder"}
    assert r.describe_mode().startswith("profile fast, mode hybrid")
    with pytest.raises(ValueError, match="query_encoder 'llm' or 'auto'"):
        r.search("cat", mode="dense")  # the error names the way to get it


def test_best_fuses_the_second_encoder_without_the_llm(full_index, tiny_embedder, monkeypatch):
    r = Retriever.load(full_index, embedder=tiny_embedder, warm=False, profile="best")
    assert r.profile is PROFILES["best"] and r.query_encoder == "none"
    assert r.channels_of("hybrid") == ["bm25", "encoder2"]

    def no_llm(*args, **kwargs):
        raise AssertionError("the best profile ran the LLM on a query")

    monkeypatch.setattr("retriever.query_encoding.encode_queries", no_llm)
    (q,) = r.encode(["cat and dog near the river"], mode="hybrid")
    assert set(q.encoder_embeddings) == {"encoder2"}  # MiniLM does not run for a fusion that does not weigh it
    np.testing.assert_allclose(q.encoder_embeddings["encoder2"], r.sentence_encoders["encoder2"].encode(["cat and dog near the river"])[0], atol=1e-6)
    hits = r.search("cat and dog near the river", k=5)
    assert len(hits) == 5 and "encoder2" in set().union(*(h.channels for h in hits))
    assert set().union(*(h.channels for h in hits)) <= {"bm25", "encoder2"}
    # each encoder channel is searched with its own model's query: the two differ
    docs2, _ = r.search_channel(q, "encoder2", 5)
    (q1,) = r.encode(["cat and dog near the river"], mode="encoder")
    docs1, _ = r.search_channel(q1, "encoder", 5)
    assert not np.allclose(q1.encoder_embedding, q.encoder_embeddings["encoder2"][: len(q1.encoder_embedding)])
    assert len(docs1) == len(docs2) == 5
    # the same index, the other point: no rebuild
    fast = Retriever.load(full_index, embedder=tiny_embedder, warm=False, profile="fast")
    assert fast.generation.path == r.generation.path and fast.channels_of("hybrid") == ["bm25", "encoder"]


def test_a_point_loads_only_the_encoder_its_hybrid_weighs(full_index, tiny_embedder):
    """The fast point never loads mpnet (seconds and memory at every load), nor best MiniLM; the
    other encoder is loaded, and checked, on its channel's first query."""
    fast = Retriever.load(full_index, embedder=tiny_embedder)  # warmed: the channels it weighs
    assert set(fast.sentence_encoders) == {"encoder"} and "encoder2" not in fast.sentence_encoders
    hits = fast.search("cat and dog near the river", k=3, mode="encoder2")
    assert len(hits) == 3 and set(fast.sentence_encoders) == {"encoder", "encoder2"}
    assert fast.sentence_encoders["encoder2"].identity["sha256"] == Manifest.read(full_index).record("encoder2")["sha256"]
    best = Retriever.load(full_index, embedder=tiny_embedder, profile="best")
    assert set(best.sentence_encoders) == {"encoder2"}
    view = best.with_fusion({"method": "minmax", "weights": {"bm25": 0.5, "encoder": 0.5}})
    assert len(view.search("cat and dog near the river", k=3)) == 3 and set(best.sentence_encoders) == {"encoder", "encoder2"}


def test_best_without_the_second_encoder_encodes_with_the_llm_and_fuses_dense(minilm_index, tiny_embedder):
    r = Retriever.load(minilm_index, embedder=tiny_embedder, warm=False, profile="best")
    assert r.profile is PROFILES["best"].fallback and r.profile.name == "best" and r.query_encoder == "llm"
    assert set(r.channels_of("hybrid")) == set(PROFILES["best"].fallback.channels) and "dense" in r.channels_of("hybrid")
    hits = r.search("cat and dog near the river", k=5)
    assert len(hits) == 5 and "dense" in set().union(*(h.channels for h in hits))


def test_a_profile_fits_the_channels_held():
    best = PROFILES["best"]
    assert fit_profile("best", ["sparse", "dense", "bm25", "encoder", "encoder2"]) is best
    assert fit_profile(best, ["sparse", "bm25", "encoder2"]) is best
    assert fit_profile("best", ["sparse", "dense", "bm25", "encoder"]) is best.fallback
    # neither fits: the setting whose held channels carry more of its weight (0.6 of the fallback's, 0.4 of its own)
    assert fit_profile("best", ["sparse", "dense", "bm25"]) is best.fallback
    assert fit_profile("best", ["sparse", "bm25"]) is best.fallback  # 0.5 against 0.4
    assert fit_profile("best", ["bm25", "encoder2"]) is best  # 0.9 against 0.3
    assert fit_profile("fast", ["sparse"]) is PROFILES["fast"]


def test_explicit_settings_override_the_profile(full_index, tiny_embedder):
    fusion = {"method": "minmax", "weights": {"bm25": 0.5, "encoder": 0.5}}
    r = Retriever.load(full_index, embedder=tiny_embedder, warm=False, profile="best", query_encoder="llm", fusion=fusion)
    assert r.query_encoder == "llm" and r.fusion == fusion and r.profile.name == "best"
    r = Retriever.load(full_index, embedder=tiny_embedder, warm=False, profile=None)
    assert r.profile is None and r.query_encoder == "llm"  # "auto" without a student beside the adapter
    assert r.fusion == DEFAULT_FUSION_WITH_ENCODER
    with pytest.raises(ValueError, match="profile must be one of fast, best"):
        Retriever.load(full_index, embedder=tiny_embedder, warm=False, profile="fastest")
    with pytest.raises(ValueError, match="profile must be one of"):
        get_profile("")


def test_an_index_without_the_profiles_channels_is_searched_as_built(toy_corpus, tiny_embedder, tmp_path, caplog):
    build_index(toy_corpus, tmp_path / "old", tiny_embedder, top_k=16, progress=False, dense=True, lexical="words")
    r = Retriever.load(tmp_path / "old", embedder=tiny_embedder, warm=False)
    assert r.profile is None and r.query_encoder == "llm" and r.channels_of("hybrid") == ["sparse", "dense", "bm25"]
    with caplog.at_level("WARNING"):
        best = Retriever.load(tmp_path / "old", embedder=tiny_embedder, warm=False, profile="best")
    assert "lacks" in caplog.text and "encoder" in caplog.text
    # what is there, weighed as the setting of best that weighs more of it weighs it (its fallback's: LLM queries, dense)
    assert best.query_encoder == "llm"
    assert best.channels_of("hybrid") == [c for c in ("sparse", "dense", "bm25") if c in PROFILES["best"].fallback.channels]


def test_build_index_defaults_hold_both_profiles_channels():
    from indexer.channel_set import PROFILE_CHANNELS, WITH_ENCODER

    for profile in PROFILES.values():
        assert set(profile.channels) <= set(PROFILE_CHANNELS["both"])
    # without mpnet, the default set still holds fast and best's fallback
    assert set(PROFILES["fast"].channels) | set(PROFILES["best"].fallback.channels) <= set(WITH_ENCODER)


def test_search_index_cli_profile(toy_corpus, tiny_model_dir, st_dir, st2_dir, tmp_path, capsys):
    from indexer import cli as build_cli
    from retriever import cli as search_cli

    index = tmp_path / "index"
    assert build_cli.main(["--corpus", str(toy_corpus), "--index", str(index), "--model", str(tiny_model_dir), "--adapter", "none",
                           "--top-k", "16", "--quiet", "--channels", "sparse,dense,bm25,encoder,encoder2", "--encoder", str(st_dir),
                           "--encoder2", str(st2_dir)]) == 0  # fmt: skip
    assert Manifest.read(index).record("encoder2")["name"] != Manifest.read(index).record("encoder")["name"]
    capsys.readouterr()
    for profile, channels in (("fast", {"bm25", "encoder"}), ("best", {"bm25", "encoder2"})):
        assert search_cli.main(["--index", str(index), "--profile", profile, "--json", "-k", "3", "cat and dog"]) == 0
        (row,) = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
        assert len(row["hits"]) == 3 and {h["query_encoder"] for h in row["hits"]} == {""}
        assert set().union(*(h["channels"] for h in row["hits"])) <= channels
    with pytest.raises(SystemExit):
        search_cli.main(["--index", str(index), "--profile", "fastest", "cat"])
    assert "profile must be one of" in capsys.readouterr().err


def test_beir_eval_default_and_default_best_build_their_profiles_indexes(tmp_path, docs_factory, tiny_model_dir, st_dir, st2_dir, monkeypatch):
    from test_encoder_channel import write_beir

    from benchmarks import datasets, systems
    from benchmarks.suite import run_suite
    from indexer import channel_set

    monkeypatch.setitem(channel_set.DEFAULT_SETTINGS, "encoder", str(st_dir))
    monkeypatch.setitem(channel_set.DEFAULT_SETTINGS, "encoder2", str(st2_dir))
    docs = docs_factory(30)
    queries = [{"_id": f"q{i}", "text": d["title"]} for i, d in enumerate(docs[:4])]
    ds = datasets.load_beir_folder(write_beir(tmp_path / "toyq", docs, queries))
    settings = systems.Settings(work_dir=tmp_path / "work", progress=False, model=str(tiny_model_dir), adapter="none", device="cpu")
    results = run_suite([ds], ["default", "default-best"], settings, tmp_path / "out", depth=10, command="test")
    params = results["systems"]
    assert params["default"]["params"]["profile"] == "fast" and params["default"]["params"]["query_encoder"] == "none"
    assert params["default-best"]["params"]["profile"] == "best" and params["default-best"]["params"]["query_encoder"] == "none"
    assert params["default-best"]["params"]["fusion"].startswith("calibrated per collection on the bm25+encoder2 pair")
    assert (params["default"]["params"]["build_profile"], params["default-best"]["params"]["build_profile"]) == ("fast", "best")
    (entry,) = results["datasets"]
    assert len({res["index"]["bytes"] for res in entry["results"].values()}) == 2  # one index each: build-index --profile
    channels = {name: set(params[name]["params"]["channels"]) for name in ("default", "default-best")}
    assert channels == {"default": {"bm25", "encoder"}, "default-best": {"bm25", "encoder2"}}


def test_the_server_serves_either_point_of_one_index(full_index, tiny_embedder):
    from fastapi.testclient import TestClient

    from retriever.server.app import create_app
    from retriever.server.config import ServerConfig
    from retriever.server.documents import Documents

    m = Manifest.read(full_index)
    for profile, channels in (("fast", {"bm25", "encoder"}), ("best", {"bm25", "encoder2"})):
        r = Retriever.load(full_index, embedder=tiny_embedder, profile=profile)
        documents, note = Documents.for_index(full_index, r.manifest, r.doc_ids)
        with TestClient(create_app(r, ServerConfig(), documents, note)) as client:
            info = client.get("/info").json()
            assert info["profile"] == profile and info["query_encoder"] == "none"
            assert info["fusion_source"] == r.fusion_source and info["fusion"] == r.fusion.as_dict()  # which weights, and why
            assert info["settings"] == r.settings.explain() and info["settings"]["profile"] == {"value": profile, "why": "asked"}
            assert (info["encoder"], info["encoder2"]) == (m.record("encoder")["name"], m.record("encoder2")["name"])
            assert info["channels"] == ["sparse", "bm25", "encoder", "encoder2"]  # dense has no query without the LLM
            hits = client.post("/search", json={"query": "cat and dog near the river", "k": 3}).json()["hits"]
            assert len(hits) == 3 and set().union(*(h["channels"] for h in hits)) <= channels


# ------------------------------------------------------------------ the fusion rules
def test_rules_on_a_toy_matrix():
    from experiments.operating_points import choose, loco

    # settings x collections: s0 wins the mean on one collection's strength and is far off on
    # another; s2 is never far from each collection's best
    means = np.array([
        [0.90, 0.50, 0.20],
        [0.60, 0.45, 0.45],
        [0.75, 0.45, 0.35],
    ])  # fmt: skip
    assert choose(means, "mean") == 0  # means 0.533 / 0.500 / 0.517
    assert choose(means, "regret") == 2  # worst regrets 0.25 / 0.30 / 0.15
    assert choose(means, "rank") == 0  # mean ranks 0.67 / 1.00 / 1.33
    assert loco(means, "mean") == [1, 0, 0]
    assert loco(means, "regret") == [1, 2, 0]
    assert choose(np.array([[0.5, 0.8], [0.6, 0.75]]), "rank") == 1  # ranks (1, 0) and (0, 1) tie: the higher mean (0.675)
    reference = np.array([0.70, 0.45, 0.40])  # the baseline the margin rule guards
    assert choose(means, "margin", reference) == 2  # worst margins -0.20 / -0.10 / -0.05
    assert loco(means, "margin", reference) == [1, 2, 0]
    with pytest.raises(ValueError, match="needs the reference"):
        choose(means, "margin")
    with pytest.raises(ValueError, match="rule must be one of"):
        choose(means, "median")


def test_public_channel_search_and_fusion_view(full_index, tiny_embedder):
    """What benchmarks and the server use instead of the Retriever's privates (issue 49)."""
    r = Retriever.load(full_index, embedder=tiny_embedder, warm=False, profile="best", query_encoder="llm")
    (q,) = r.encode(["cat and dog near the river"], mode="dense")
    docs, scores = r.search_channel(q, "dense", 5)
    hits = r.search_encoded([q], k=5, mode="dense", explain=False)[0]
    assert [r.doc_ids[d] for d in docs if d >= 0] == [h.doc_id for h in hits]
    assert np.allclose(scores[: len(hits)], [h.score for h in hits])
    with pytest.raises(ValueError, match="one channel"):
        r.search_channel(q, "hybrid", 5)
    view = r.with_fusion({"method": "minmax", "weights": {"bm25": 0.5, "encoder": 0.5}})
    assert view.channels_of("hybrid") == ["bm25", "encoder"] and view.doc_ids is r.doc_ids
    assert r.fusion == profile_fusion(PROFILES["best"], r.manifest.calibration)[0]  # the original is untouched
    with pytest.raises(ValueError, match="weights.bm25"):
        r.with_fusion({"method": "minmax", "weights": {"bm25": -1}})
    fast = Retriever.load(full_index, embedder=tiny_embedder, warm=False)
    with pytest.raises(ValueError, match="gives the dense channel no query"):
        fast.with_fusion({"method": "minmax", "weights": {"bm25": 0.5, "dense": 0.5}})
