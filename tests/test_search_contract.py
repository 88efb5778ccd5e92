"""The search contract, the same for ``search``, ``batch_search`` and ``search-index``:
a query is a str (TypeError otherwise), a blank query has no hits, ``k`` is a positive int
(ValueError otherwise), an unknown mode lists the modes; any str is answered, from any
number of threads."""
from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest
from conftest import build_tiny_model, save_tiny_sentence_encoder, tiny_identity, toy_docs, write_corpus
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from embedder.encoder import Embedder, EmbedderConfig
from indexer.build import build_index
from indexer.channels import CHANNEL_SPECS, sentence_encoder_specs
from retriever import cli as search_cli
from retriever.retriever import MODES, Retriever

BLANK = ["", " ", "   \t\n", "\u3000\u2003", "\r\n\x0b\x0c"]
ODD = ["x" * 20000, "😀🐍👩\u200d💻", "cat\x00dog", "\x00", "\x1b[31mcat\x1b[0m", "\u202eevil", "a\ud800b", "\x7f\x01\x02", "ǅ" * 50]


@pytest.fixture(scope="module")
def retriever(tmp_path_factory, tiny_tokenizer) -> Retriever:
    """Every channel over the 40-document toy corpus (module-scoped: hypothesis runs many
    examples against one index)."""
    root = tmp_path_factory.mktemp("contract")
    embedder = Embedder(build_tiny_model(tiny_tokenizer, 0), tiny_tokenizer, EmbedderConfig(max_length=64, batch_size=4), identity=tiny_identity(0))
    corpus = write_corpus(root / "corpus", toy_docs(40), "beir")
    from embedder.sentence_encoder import SentenceEncoder

    encoder = SentenceEncoder.load(save_tiny_sentence_encoder(root / "st"))
    encoder2 = SentenceEncoder.load(save_tiny_sentence_encoder(root / "st2", seed=1))
    # every row of the channel table, at its default setting (the sentence encoders: tiny models; EmbedFilter: tau 2)
    settings = {s.mode: s.default_setting() for s in CHANNEL_SPECS if not s.required} | {"dense-ef": 2}
    models = {s.mode: m for s, m in zip(sentence_encoder_specs(), (encoder, encoder2))}
    build_index(corpus, root / "index", embedder, top_k=16, channels=settings | models, progress=False)
    # LLM queries: every mode can be searched
    return Retriever.load(root / "index", embedder=embedder, encoders=models, profile="best", query_encoder="llm")


def test_every_mode_is_present(retriever):
    assert retriever.modes == list(MODES)


@pytest.mark.parametrize("mode", MODES)
def test_blank_queries_have_no_hits(retriever, mode):
    for q in BLANK:
        assert retriever.search(q, mode=mode) == []
    got = retriever.batch_search(["", "cat and dog", " "], k=3, mode=mode)
    assert got[0] == [] and got[2] == [] and got[1] == retriever.search("cat and dog", k=3, mode=mode)
    assert retriever.batch_search([], mode=mode) == []


@pytest.mark.parametrize("k", [0, -5, "10", 2.0, None, True, [3]])
@pytest.mark.parametrize("mode", MODES)
def test_bad_k_is_a_value_error(retriever, k, mode):
    with pytest.raises(ValueError, match=r"^k must be a positive integer, got "):
        retriever.search("cat", k=k, mode=mode)
    with pytest.raises(ValueError, match=r"^k must be a positive integer, got "):
        retriever.batch_search(["cat"], k=k, mode=mode)


def test_numpy_integer_k_and_k_beyond_the_corpus(retriever):
    assert len(retriever.search("cat", k=np.int64(3))) == 3
    for mode in MODES:
        assert 0 < len(retriever.search("cat dog river game", k=10**9, mode=mode)) <= 40


@pytest.mark.parametrize("query", [None, 42, b"cat", ["cat"], 3.5])
def test_a_query_must_be_a_str(retriever, query):
    with pytest.raises(TypeError, match=r"^query must be a str, got "):
        retriever.search(query)
    with pytest.raises(TypeError, match=r"^queries\[1\] must be a str, got "):
        retriever.batch_search(["cat", query])


@pytest.mark.parametrize("queries", ["cat", b"cat", None, 42])
def test_queries_must_be_a_sequence_of_str(retriever, queries):
    with pytest.raises(TypeError, match=r"^queries must be a sequence of str, got "):
        retriever.batch_search(queries)


def test_unknown_mode_lists_the_modes(retriever):
    with pytest.raises(ValueError, match="mode must be one of .*'sparse'.*'hybrid'"):
        retriever.search("cat", mode="telepathy")


@pytest.mark.parametrize("mode", MODES)
def test_odd_queries_are_answered(retriever, mode):
    for q, hits in zip(ODD, retriever.batch_search(ODD, k=5, mode=mode)):
        assert isinstance(hits, list) and len(hits) <= 5, q[:20]
        alone = retriever.search(q, k=5, mode=mode)
        # batched with longer texts, a query is padded: float rounding moves its scores by
        # ~1e-7, which may reorder near-ties (hybrid's min-max scores tie often)
        assert [h.score for h in hits] == pytest.approx([h.score for h in alone], rel=1e-5, abs=1e-6)
        tie = 1e-5
        for a, b in zip(hits, alone):
            assert a.doc_id == b.doc_id or abs(a.score - b.score) < tie, q[:20]


@pytest.mark.parametrize("mode", MODES)
def test_concurrent_threads_give_the_serial_results(retriever, mode):
    queries = [f"{a} {b}" for a in ("cat", "memory", "river", "game") for b in ("dog", "disk", "lake", "team", "")]
    serial = [retriever.search(q, k=5, mode=mode) for q in queries]
    with ThreadPoolExecutor(max_workers=4) as pool:
        threaded = list(pool.map(lambda q: retriever.search(q, k=5, mode=mode), queries * 3))
    assert threaded == serial * 3


KS = st.one_of(st.integers(-3, 60), st.sampled_from([10**6, "5", 2.5, None, True]))
QUERIES = st.text(alphabet=st.characters(codec=None, exclude_categories=()), max_size=40)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(query=QUERIES, k=KS, mode=st.sampled_from(MODES + ("bogus",)))
def test_property_only_documented_errors_and_well_formed_hits(retriever, query, k, mode):
    valid_k = isinstance(k, int) and not isinstance(k, bool) and k > 0
    try:
        hits = retriever.search(query, k=k, mode=mode)
    except ValueError as exc:
        assert (not valid_k and str(exc).startswith("k must be a positive integer, got ")) or (
            mode == "bogus" and str(exc).startswith("mode must be one of")
        ), exc
        return
    assert valid_k and mode != "bogus"
    if not query.strip():
        assert hits == []
    assert len(hits) <= k
    scores = [h.score for h in hits]
    assert scores == sorted(scores, reverse=True)
    assert all(np.isfinite(scores))
    ids = [h.doc_id for h in hits]
    assert len(set(ids)) == len(ids) and set(ids) <= set(retriever.doc_ids)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(queries=st.lists(QUERIES, max_size=6), k=st.integers(1, 45))
def test_property_batch_equals_one_by_one(retriever, queries, k):
    # sparse: exact (the same tokens either way); fused modes read embeddings, which a batch may
    # round differently in the last bit, so near-ties can swap there
    assert retriever.batch_search(queries, k=k, mode="sparse") == [retriever.search(q, k=k, mode="sparse") for q in queries]


# ------------------------------------------------------------------ the command line
def _index_of(retriever) -> Path:
    return retriever.index_dir


def test_cli_empty_query_prints_no_hits(retriever, capsys, monkeypatch):
    monkeypatch.setattr(Retriever, "load", classmethod(lambda cls, *a, **kw: retriever))
    assert search_cli.main(["--index", str(_index_of(retriever)), "--json", "", "   "]) == 0
    rows = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert rows == [{"query": "", "mode": "hybrid", "hits": []}, {"query": "   ", "mode": "hybrid", "hits": []}]


@pytest.mark.parametrize("k", ["0", "-5"])
def test_cli_bad_k_is_one_line_exit_2(retriever, capsys, monkeypatch, k):
    monkeypatch.setattr(Retriever, "load", classmethod(lambda cls, *a, **kw: retriever))
    assert search_cli.main(["--index", str(_index_of(retriever)), "-k", k, "cat"]) == 2
    err = capsys.readouterr().err
    assert err == f"search-index: error: k must be a positive integer, got {k}\n"


def test_cli_non_integer_k_is_a_usage_error(retriever, capsys):
    with pytest.raises(SystemExit) as info:
        search_cli.main(["--index", str(_index_of(retriever)), "-k", "ten", "cat"])
    assert info.value.code == 2 and "usage:" in capsys.readouterr().err
