"""Feedback from the first pass (retriever/feedback.py) and model-free queries (``query_encoder="none"``)."""
from __future__ import annotations

import argparse

import numpy as np
import pytest
from conftest import retriever_over as _retriever

from indexer.inverted_index import InvertedIndex
from retriever.feedback import DocumentTokens, Feedback, feedback_arg
from retriever.fusion import fuse
from retriever.query import literal_ids


def test_feedback_settings_are_checked_and_parsed():
    assert Feedback.parse("3,128,0.25") == Feedback() == Feedback(3, 128, 0.25)
    assert Feedback.parse("1, 8, 1").to_dict() == {"docs": 1, "tokens": 8, "weight": 1.0}
    for bad in ({"docs": 0}, {"tokens": -1}, {"weight": 0.0}, {"weight": float("nan")}, {"docs": True}, {"docs": 2.5}):
        with pytest.raises(ValueError, match=f"feedback {next(iter(bad))}"):
            Feedback(**bad)
    for text in ("3,64", "3,64,x", "a,b,c,d"):
        with pytest.raises(ValueError, match="DOCS,TOKENS,WEIGHT"):
            Feedback.parse(text)
    with pytest.raises(argparse.ArgumentTypeError, match="DOCS,TOKENS,WEIGHT"):
        feedback_arg("3")


def _postings(rows: list[dict[int, float]], vocab: int) -> InvertedIndex:
    """An inverted index of documents given as {token: weight}, each with as many tokens (top-K)."""
    ids = np.array([list(r) for r in rows], np.int64)
    weights = np.array([list(r.values()) for r in rows], np.float32)
    return InvertedIndex.from_forward(ids, weights, vocab)


def test_document_tokens_average_each_documents_weights_divided_by_its_largest():
    rows = [{1: 4.0, 2: 2.0, 3: 1.0}, {2: 10.0, 4: 5.0, 6: 0.0}, {5: 3.0, 6: 1.0, 7: 1.0}]
    inv = _postings(rows, vocab=8)
    dt = DocumentTokens(inv.doc_vectors())
    ids, means = dt.expansion(np.array([0, 1]), exclude=np.array([], np.int64), n=10)
    # doc 0 / 4: {1: 1, 2: .5, 3: .25}; doc 1 / 10: {2: 1, 4: .5}; mean over the two documents
    expected = {2: 0.75, 1: 0.5, 4: 0.25, 3: 0.125}
    assert ids.tolist() == list(expected)  # best first; only tokens the documents hold with a positive weight
    np.testing.assert_allclose(means, list(expected.values()), rtol=1e-6)
    ids, _ = dt.expansion(np.array([0, 1]), exclude=np.array([2]), n=2)
    assert ids.tolist() == [1, 4]  # the query's own tokens are not fed back
    assert dt.expansion(np.array([], np.int64), np.array([], np.int64), 5)[0].size == 0


# ------------------------------------------------------------------ in the Retriever


QUERY = "cat and dog near the river"


@pytest.mark.parametrize("query_encoder", ["llm", "none"])
def test_hybrid_feedback_searches_the_first_pass_documents_tokens(encoder_index, tiny_embedder, query_encoder):
    path, encoder = encoder_index
    fb = Feedback(docs=2, tokens=5, weight=0.5)
    r = _retriever(path, tiny_embedder, encoder, query_encoder=query_encoder, feedback=fb)
    q = r.encode([QUERY])[0]
    weights = r.fusion["weights"]
    first = {m: r.search_channel(q, m, 100) for m in ("bm25", "encoder")}
    top = [f.doc for f in fuse(first, weights, 2)]
    # by hand: each of the two documents' aligned tokens over its largest weight, averaged
    by_doc = r.sparse.doc_vectors()
    mean, held = np.zeros(r.sparse.vocab_size), np.zeros(r.sparse.vocab_size, bool)
    for d in top:
        row = by_doc[d].toarray().ravel()
        mean += row / np.abs(row).max() / 2
        held |= row != 0
    held[q.tokens] = False
    candidates = np.flatnonzero(held)
    expected = candidates[np.argsort(-mean[candidates], kind="stable")[:5]]
    fed = r.with_feedback(q, first)
    assert fed.tokens[: q.tokens.size].tolist() == q.tokens.tolist()
    assert sorted(fed.tokens[q.tokens.size :].tolist()) == sorted(expected.tolist())
    np.testing.assert_allclose(fed.weights[q.tokens.size :], 0.5 * r.token_idf[fed.tokens[q.tokens.size :]], rtol=1e-6)
    channels = {**first, "sparse": r.search_channel(fed, "sparse", 100)}
    want = [(r.doc_ids[f.doc], f.score) for f in fuse(channels, weights, 5)]
    hits = r.search(QUERY, k=5, mode="hybrid")
    assert [(h.doc_id, pytest.approx(h.score)) for h in hits] == want
    assert all(h.query_encoder == query_encoder for h in hits)
    # feedback is the hybrid's: the sparse channel alone searches the query as encoded
    plain = _retriever(path, tiny_embedder, encoder, query_encoder=query_encoder)
    assert [(h.doc_id, h.score) for h in r.search(QUERY, k=5, mode="sparse")] == [(h.doc_id, h.score) for h in plain.search(QUERY, k=5, mode="sparse")]
    assert "first 2 documents" in r.describe_mode("hybrid")


def test_model_free_queries_are_their_own_tokens_and_run_no_model(encoder_index, tiny_embedder, monkeypatch):
    path, encoder = encoder_index

    def no_model(*args, **kwargs):
        raise AssertionError("query_encoder 'none' ran the LLM")

    monkeypatch.setattr(tiny_embedder, "embed", no_model)
    r = _retriever(path, tiny_embedder, encoder, query_encoder="none")
    q = r.encode([QUERY])[0]
    assert q.tokens.tolist() == literal_ids(tiny_embedder, QUERY, r.literal) and q.n_literal == q.tokens.size
    np.testing.assert_array_equal(q.weights, r.token_idf[q.tokens])
    assert q.embedding.size == 0 and r.query_encoder == "none"
    assert "dense" not in r.modes and "sparse" in r.modes
    assert all(h.query_encoder == "none" for h in r.search(QUERY, k=3, mode="hybrid"))
    with pytest.raises(ValueError, match="mode 'dense': query_encoder 'none' gives queries no embedding"):
        r.search(QUERY, k=3, mode="dense")


def test_model_free_queries_refuse_a_fusion_that_weighs_the_dense_channel(encoder_index, tiny_embedder):
    path, encoder = encoder_index
    fusion = {"method": "minmax", "weights": {"dense": 0.4, "bm25": 0.6}}
    with pytest.raises(ValueError, match="query_encoder 'none' gives the dense channel no query"):
        _retriever(path, tiny_embedder, encoder, query_encoder="none", fusion=fusion)


def test_feedback_is_refused_where_milvus_fuses(encoder_index, tiny_embedder):
    path, encoder = encoder_index
    fusion = {"method": "milvus-weighted", "weights": {"sparse": 0.5, "bm25": 0.5}}
    with pytest.raises(ValueError, match="fuses inside Milvus"):
        _retriever(path, tiny_embedder, encoder, fusion=fusion, feedback=Feedback())
    with pytest.raises(TypeError, match="feedback must be"):
        _retriever(path, tiny_embedder, encoder, feedback={"docs": 3})


def test_the_feedback_study_scores_every_setting_and_leaves_the_retriever_as_it_was(encoder_index, tiny_embedder):
    from experiments.feedback import NONE, grid, scores_by_setting, setting_name

    path, encoder = encoder_index
    settings = grid([1, 2], [4], [0.5])
    assert [setting_name(s) for s in settings] == [NONE, "1/4/0.5", "2/4/0.5"]
    r = _retriever(path, tiny_embedder, encoder, query_encoder="llm")
    queries = {"q1": QUERY, "q2": "computer memory data", "q3": "  "}
    top = r.search(QUERY, k=1, mode="hybrid")[0].doc_id
    qrels = {"q1": {top: 1}, "q2": {"nothing-relevant": 1}, "q3": {top: 1}}
    got = scores_by_setting(r, queries, qrels, settings)
    assert list(got) == [NONE, "1/4/0.5", "2/4/0.5"]
    assert got[NONE] == {"q1": 1.0, "q2": 0.0}  # the blank query is not scored; q1's relevant document ranks first
    assert r.feedback is None


def test_the_feedback_studys_held_out_choice_is_made_on_the_other_collections():
    from experiments.feedback import leave_one_out

    order = ["off", "1/4/0.5", "2/4/0.5"]
    means = {
        "a": {"off": 0.5, "1/4/0.5": 0.6, "2/4/0.5": 0.6},
        "b": {"off": 0.5, "1/4/0.5": 0.4, "2/4/0.5": 0.7},
        "c": {"off": 0.5, "1/4/0.5": 0.6, "2/4/0.5": 0.6},
    }
    # a: on b and c, 2/4/0.5 (0.65) beats 1/4/0.5 (0.5); b: on a and c they tie at 0.6, the first listed wins
    assert leave_one_out(means, order) == {"a": ("2/4/0.5", 0.6), "b": ("1/4/0.5", 0.4), "c": ("2/4/0.5", 0.6)}


@pytest.mark.parametrize("module", ["retriever.cli", "retriever.server.cli", "benchmarks.cli"])
def test_the_command_lines_take_feedback_and_the_model_free_query_encoder(module, capsys):
    import importlib

    cli = importlib.import_module(module)
    make = getattr(cli, "parser", None) or cli._run_parser
    first = {"retriever.cli": ["--index", "INDEX", "a query"], "retriever.server.cli": ["INDEX"], "benchmarks.cli": ["--out", "OUT"]}[module]
    args = make().parse_args([*first, "--feedback", "2,8,0.5", "--query-encoder", "none"])
    assert args.feedback == Feedback(2, 8, 0.5) and args.query_encoder == "none"
    assert make().parse_args(first).feedback is None  # off unless asked for
    with pytest.raises(SystemExit) as exit_:
        make().parse_args([*first, "--feedback", "2,8"])
    assert exit_.value.code == 2 and "DOCS,TOKENS,WEIGHT" in capsys.readouterr().err


def test_model_free_loading_reads_the_tokenizer_alone(toy_corpus, tiny_model_dir, tmp_path, monkeypatch):
    """Retriever.load(query_encoder="none") never loads the LLM's weights, and searches as a
    model-free Retriever over the full embedder does; the tokenizer-only embedder answers
    what the full one answers and refuses a query encoder that needs the model."""
    import transformers

    from embedder.encoder import Embedder
    from embedder.tokenization import TokenizerOnly
    from indexer.build import build_index
    from indexer.manifest import Manifest
    from retriever.retriever import Retriever

    full = Embedder.load(tiny_model_dir, adapter="none", device="cpu")
    index = tmp_path / "index"
    build_index(toy_corpus, index, full, top_k=8, lexical="words", progress=False)
    expected = {mode: [(h.doc_id, h.score) for h in _retriever(index, full, None, query_encoder="none").search(QUERY, k=5, mode=mode)]
                for mode in ("sparse", "hybrid")}

    def no_weights(*args, **kwargs):
        raise AssertionError("query_encoder 'none' loaded the LLM's weights")

    monkeypatch.setattr(transformers.AutoModelForCausalLM, "from_pretrained", no_weights)
    r = Retriever.load(index, query_encoder="none")
    assert isinstance(r.embedder, TokenizerOnly) and r.query_encoder == "none"
    for mode, hits in expected.items():
        assert [(h.doc_id, h.score) for h in r.search(QUERY, k=5, mode=mode)] == hits
    tokens = r.embedder
    assert tokens.identity == full.identity and tokens.adapter == full.adapter and tokens.vocab_size == full.vocab_size
    assert tokens.literal_token_ids("THE CAT sat") == full.literal_token_ids("THE CAT sat")
    assert tokens.token_strings(range(full.vocab_size)) == full.token_strings(range(full.vocab_size))
    assert tokens.runtime_info()["name"] == "none"
    with pytest.raises(RuntimeError, match="no model loaded"):
        tokens.embed([QUERY])
    with pytest.raises(ValueError, match="query_encoder 'llm' needs the LLM"):
        Retriever(index, Manifest.read(index), tokens, query_encoder="llm")
