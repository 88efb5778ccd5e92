"""Search semantics end to end on the tiny model: scores, explanations, batch, dense, loading."""
from __future__ import annotations

import numpy as np
import pytest

from embedder.encoder import Embedder, EmbedderConfig
from indexer.build import build_index
from retriever.query import encode_queries, literal_ids
from retriever.retriever import Hit, Retriever

QUERIES = ["cat and dog near the river", "computer memory", "game", "a puzzle for the team", "snow"]


@pytest.fixture
def retriever(toy_corpus, tiny_embedder, tmp_path) -> Retriever:
    build_index(toy_corpus, tmp_path / "index", tiny_embedder, top_k=16, dense=True, progress=False)
    return Retriever.load(tmp_path / "index", embedder=tiny_embedder)


def brute_force(r: Retriever, tokens: np.ndarray, weights: np.ndarray, k: int) -> list[tuple[str, float]]:
    """Eq. 16 from the definition: each document's weights summed over the query tokens
    (times the query token weights); every document holding a query token is a candidate."""
    mat = r.sparse.doc_vectors().toarray().astype(np.float64)
    scores = mat[:, tokens] @ weights.astype(np.float64)
    matched = np.flatnonzero((mat[:, tokens] != 0).any(1))
    order = sorted(matched, key=lambda d: (-scores[d], d))[:k]
    return [(r.doc_ids[d], float(scores[d])) for d in order]


def assert_same_ranking(hits: list[Hit], want: list[tuple[str, float]], r: Retriever, enc) -> None:
    """Same scores; a different doc at a rank only where float32 rounding decides a near-tie."""
    assert len(hits) == len(want)
    np.testing.assert_allclose([h.score for h in hits], [s for _, s in want], rtol=1e-5, atol=1e-5)
    full = dict(brute_force(r, enc.tokens, enc.weights, r.manifest.n_docs))
    for h, (doc, score) in zip(hits, want):
        if h.doc_id != doc:
            assert full[h.doc_id] == pytest.approx(score, rel=1e-5, abs=1e-5)


def test_hits_and_their_matched_tokens(retriever):
    for q in QUERIES:
        enc = retriever.encode([q])[0]
        hits = retriever.search(q, k=5, mode="sparse")
        assert 0 < len(hits) <= 5 and all(isinstance(h, Hit) for h in hits)
        assert len({h.doc_id for h in hits}) == len(hits)
        assert [h.score for h in hits] == sorted((h.score for h in hits), reverse=True)
        for h in hits:
            if h.score > 0:
                assert h.matched_tokens, "a hit with a positive score matched at least one token"
            # the readable words and the raw ids both add up to the score
            assert sum(h.matched_tokens.values()) == pytest.approx(h.score, rel=1e-5, abs=1e-5)
            assert sum(h.matched_ids.values()) == pytest.approx(h.score, rel=1e-5, abs=1e-5)
            assert set(h.matched_ids) <= set(enc.tokens.tolist())
            for values in (list(h.matched_tokens.values()), list(h.matched_ids.values())):
                assert values == sorted(values, reverse=True)
            # the matched tokens are among the document's own aligned tokens
            row = retriever.sparse.doc_vectors().getrow(retriever.doc_ids.index(h.doc_id))
            assert set(h.matched_ids) <= set(row.indices.tolist())
            # every readable entry is a decoded matched token, marked or grouped
            pieces = {retriever.explainer.piece(t)[0].lower() for t in h.matched_ids}
            assert {w.lower().strip("…") for w in h.matched_tokens if w != "(symbols)"} <= pieces


def test_default_mode_is_hybrid_where_the_index_has_channels_to_fuse(retriever, toy_corpus, tiny_embedder, tmp_path):
    assert retriever.default_mode == "hybrid" and retriever.channels_of("hybrid") == ["sparse", "dense"]
    assert retriever.search(QUERIES[0], k=5) == retriever.search(QUERIES[0], k=5, mode="hybrid")
    assert "hybrid" in retriever.describe_mode()
    build_index(toy_corpus, tmp_path / "sparse-only", tiny_embedder, top_k=16, progress=False)
    alone = Retriever.load(tmp_path / "sparse-only", embedder=tiny_embedder)
    assert alone.default_mode == "sparse"  # one channel: nothing to fuse
    assert alone.search(QUERIES[0], k=5) == alone.search(QUERIES[0], k=5, mode="sparse")
    assert "no other channel" in alone.describe_mode()


def test_scores_equal_the_definition(retriever):
    for enc in retriever.encode(QUERIES):
        hits = retriever.search_encoded([enc], k=8, mode="sparse")[0]
        assert_same_ranking(hits, brute_force(retriever, enc.tokens, enc.weights, 8), retriever, enc)


def test_query_weighting(toy_corpus, tiny_embedder, tmp_path):
    build_index(toy_corpus, tmp_path / "index", tiny_embedder, top_k=16, progress=False)
    one = Retriever.load(tmp_path / "index", embedder=tiny_embedder, query_weighting="one")
    idf = Retriever.load(tmp_path / "index", embedder=tiny_embedder, query_weighting="idf")
    (e1,) = one.encode(QUERIES[:1])
    (e2,) = idf.encode(QUERIES[:1])
    assert np.array_equal(e1.tokens, e2.tokens)
    assert np.all(e1.weights == 1)  # the paper's Eq. 16
    df = np.diff(np.asarray(idf.sparse.indptr))[e2.tokens]
    np.testing.assert_allclose(e2.weights, np.log((40 + 1) / (df + 1)), rtol=1e-6)
    for r, enc in ((one, e1), (idf, e2)):
        assert_same_ranking(r.search_encoded([enc], k=8)[0], brute_force(r, enc.tokens, enc.weights, 8), r, enc)
    with pytest.raises(ValueError, match="query_weighting"):
        Retriever.load(tmp_path / "index", embedder=tiny_embedder, query_weighting="bm25")


def test_batch_search_equals_search(retriever):
    batch = retriever.batch_search(QUERIES, k=6, mode="sparse")
    assert len(batch) == len(QUERIES)
    for q, hits in zip(QUERIES, batch):
        single = retriever.search(q, k=6, mode="sparse")
        assert [h.doc_id for h in hits] == [h.doc_id for h in single]
        np.testing.assert_allclose([h.score for h in hits], [h.score for h in single], rtol=1e-5)
    assert retriever.batch_search([], k=3) == []


def test_k_larger_than_the_matches(retriever):
    enc = retriever.encode(["game"])[0]
    hits = retriever.search_encoded([enc], k=1000, mode="sparse")[0]
    assert len(hits) == len(brute_force(retriever, enc.tokens, enc.weights, 1000)) <= retriever.manifest.n_docs


def test_query_encoding(tiny_embedder):
    q = "the cat and the dog"
    lit = literal_ids(tiny_embedder, q, "both")
    (enc,) = encode_queries(tiny_embedder, [q], m=10)
    assert enc.tokens.dtype == np.int64 and enc.weights.dtype == np.float32
    assert np.all(enc.weights == 1)  # Eq. 16: every query token weighs 1
    assert enc.n_literal == len(lit) and enc.tokens[: len(lit)].tolist() == lit
    assert len(set(enc.tokens.tolist())) == len(enc.tokens)
    top, _ = tiny_embedder.top_tokens(tiny_embedder.embed([q]), 10)
    assert set(enc.tokens.tolist()) == set(lit) | set(top[0].tolist())
    np.testing.assert_allclose(enc.embedding, tiny_embedder.embed([q])[0], atol=1e-6)
    (no_expansion,) = encode_queries(tiny_embedder, [q], m=0)
    assert no_expansion.tokens.tolist() == lit
    assert tiny_embedder.token_strings(literal_ids(tiny_embedder, q, "space")) == ["the", "cat", "and", "dog"]
    with pytest.raises(ValueError, match="forms"):
        literal_ids(tiny_embedder, q, "neither")


@pytest.mark.parametrize("q", ["the cat and the dog", "CAT AND DOG", "  river  bank ", "", "dog dog"])
def test_literal_tokens_are_the_word_initial_forms_then_each_word_alone(tiny_embedder, q):
    """"both" reads the text with a leading space (Embedder.literal_token_ids), then each word
    tokenised alone, in one tokenizer call: the same ids, in that order, each once."""
    space = tiny_embedder.literal_token_ids(q)
    bare = [i for row in tiny_embedder.token_ids(tiny_embedder.normalise(q).split()) for i in row if i not in tiny_embedder.special_ids]
    assert literal_ids(tiny_embedder, q, "space") == space
    assert literal_ids(tiny_embedder, q, "bare") == list(dict.fromkeys(bare))
    assert literal_ids(tiny_embedder, q, "both") == list(dict.fromkeys(space + bare))


def test_without_expansion_only_query_words_match(toy_corpus, tiny_embedder, tmp_path):
    build_index(toy_corpus, tmp_path / "index", tiny_embedder, top_k=64, progress=False)
    r = Retriever.load(tmp_path / "index", embedder=tiny_embedder, expansion_m=0)
    q = "cat dog river"
    allowed = set(literal_ids(tiny_embedder, q, "both"))
    hits = r.search(q, k=10)
    assert hits and all(set(h.matched_ids) <= allowed for h in hits)
    assert all(set(h.matched_tokens) <= set(q.split()) for h in hits)  # query words, spelled as words


def test_dense_mode(retriever, docs_factory):
    docs = docs_factory(40)
    hits = retriever.search(f"{docs[7]['title']} {docs[7]['text']}", k=5, mode="dense")
    assert len(hits) == 5 and all(h.matched_tokens == {} for h in hits)
    assert hits[0].doc_id == docs[7]["_id"] and hits[0].score == pytest.approx(1.0, abs=1e-4)
    # exact search: the ranking by cosine similarity computed here
    emb = retriever.embedder.embed([f"{d['title']} {d['text']}" for d in docs])
    q = retriever.encode(QUERIES[:1])[0].embedding
    cos = emb @ q / np.linalg.norm(emb, axis=1) / np.linalg.norm(q)
    got = retriever.search(QUERIES[0], k=5, mode="dense")
    assert [h.doc_id for h in got] == [docs[i]["_id"] for i in np.argsort(-cos, kind="stable")[:5]]
    np.testing.assert_allclose([h.score for h in got], np.sort(cos)[::-1][:5], atol=1e-4)


def test_dense_mode_needs_dense_vectors(toy_corpus, tiny_embedder, tmp_path):
    build_index(toy_corpus, tmp_path / "index", tiny_embedder, top_k=8, progress=False)
    r = Retriever.load(tmp_path / "index", embedder=tiny_embedder)
    with pytest.raises(ValueError, match=r"index: mode 'dense' needs an index built with --dense"):
        r.search("cat", mode="dense")
    with pytest.raises(ValueError, match="mode must be one of"):
        r.search("cat", mode="telepathy")


def test_encoded_queries_serve_both_modes(retriever):
    enc = retriever.encode(QUERIES)
    assert retriever.search_encoded(enc, k=4) == retriever.batch_search(QUERIES, k=4)  # the default mode, hybrid
    assert retriever.search_encoded(enc, k=4, mode="sparse") == retriever.batch_search(QUERIES, k=4, mode="sparse")
    assert retriever.search_encoded(enc, k=4, mode="dense") == retriever.batch_search(QUERIES, k=4, mode="dense")


def test_load_by_path_end_to_end(toy_corpus, tiny_model_dir, tmp_path):
    """Build from a model directory, reopen the index from its manifest alone."""
    config = EmbedderConfig(pooling="mean", max_length=32)  # not the defaults: the manifest must carry them
    built_with = Embedder.load(tiny_model_dir, adapter="none", config=config, device="cpu")
    build_index(toy_corpus, tmp_path / "index", built_with, top_k=16, progress=False)
    r = Retriever.load(tmp_path / "index", device="cpu")  # model and settings from the manifest
    assert r.embedder.identity == built_with.identity
    assert r.embedder.config == built_with.config
    hits = r.search("parrot and lion", k=3)
    assert len(hits) == 3 and all(h.matched_tokens for h in hits)
    assert hits == Retriever.load(tmp_path / "index", embedder=built_with).search("parrot and lion", k=3)
