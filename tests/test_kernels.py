"""The Numba scoring kernels against the brute-force SciPy reference on random indexes."""
from __future__ import annotations

import numpy as np
import pytest
import scipy.sparse as sp

from indexer import int32_docs, kernels, term_at_a_time
from indexer.inverted_index import InvertedIndex


def random_index(rng: np.random.Generator, weights: str) -> InvertedIndex:
    """A random CSR index whose posting lists have any length, including empty ones.

    weights: "int" (1..3, so many exact ties) or "float" (normal, negatives included:
    low-ranked logits can be negative).
    """
    vocab = int(rng.integers(1, 60))
    n_docs = int(rng.integers(1, 50))
    density = rng.uniform(0.0, 0.4)
    mask = rng.random((vocab, n_docs)) < density
    if weights == "int":
        vals = rng.integers(1, 4, size=mask.shape).astype(np.float32)
    else:
        vals = rng.normal(size=mask.shape).astype(np.float32)
        vals[vals == 0] = 0.5  # an explicit zero weight would mean "present" to one side only
    m = sp.csr_matrix(np.where(mask, vals, 0.0).astype(np.float32))
    m.sort_indices()
    return InvertedIndex(m.indptr.astype(np.int64), m.indices.astype(np.int32), m.data.astype(np.float32), n_docs)


def random_query(rng: np.random.Generator, vocab: int, weights: str) -> tuple[np.ndarray, np.ndarray]:
    """Token ids with duplicates and out-of-vocabulary ids (both kernels must skip those)."""
    n = int(rng.integers(0, 12))
    tokens = rng.integers(-2, vocab + 2, size=n).astype(np.int64)
    if n > 2:
        tokens[1] = tokens[0]  # always at least one duplicate
    if weights == "ones":
        w = np.ones(n, np.float32)
    elif weights == "int":
        w = rng.integers(1, 3, size=n).astype(np.float32)
    else:
        w = rng.uniform(0.1, 2.0, size=n).astype(np.float32)
    return tokens, w


def dense_scores(index: InvertedIndex, tokens: np.ndarray, w: np.ndarray) -> np.ndarray:
    """Every document's score, straight from the definition (float64)."""
    mat = index.doc_vectors().toarray().astype(np.float64)  # docs x vocab
    out = np.zeros(index.n_docs)
    for t, qw in zip(tokens, w):
        if 0 <= t < index.vocab_size:
            out += qw * mat[:, t]
    return out


def search(index: InvertedIndex, tokens: np.ndarray, w: np.ndarray, k: int):
    return int32_docs.search(index.indptr, index.docs, index.weights, tokens, w, index.n_docs, k)


def split(indptr, docs, codes, scale, offset, tokens, w, n_docs, k, parts, whole_from=kernels.SCAN_WHOLE_FROM):
    """One query split into ``parts`` document ranges over Numba's threads (even one part)."""
    return term_at_a_time.search((int32_docs.TAG, docs), indptr, codes, scale, offset, tokens, w, n_docs, k, parts, True, whole_from)


def reference(index: InvertedIndex, tokens: np.ndarray, w: np.ndarray, k: int):
    return kernels.reference_search(index.indptr, index.docs, index.weights, tokens, w, index.n_docs, k)


@pytest.mark.parametrize("weights", ["int", "float"])
def test_search_one_matches_reference(weights):
    rng = np.random.default_rng(12345 if weights == "int" else 54321)
    n_compared = n_short = n_ties = 0
    ways = {True: 0, False: 0}  # queries ranked by a pass over all accumulators / over the touched list
    for _ in range(300):
        index = random_index(rng, weights)
        tokens, w = random_query(rng, index.vocab_size, "int" if weights == "int" else rng.choice(["ones", "float"]))
        ways[bool(kernels.scan_whole(index.indptr, tokens, index.n_docs))] += 1
        for k in (1, 3, 10, index.n_docs + 5):
            got_d, got_s = search(index, tokens, w, k)
            ref_d, ref_s = reference(index, tokens, w, k)
            assert got_d.dtype == np.int32 and got_s.dtype == np.float32
            assert len(got_d) == len(ref_d) <= k
            n_short += len(ref_d) < k
            if weights == "int":
                # integer weights: sums are exact, so the ranking (ties included) must be identical
                np.testing.assert_array_equal(got_d, ref_d)
                np.testing.assert_array_equal(got_s, ref_s)
                n_ties += int(np.any(np.diff(ref_s) == 0))
            else:
                tol = 1e-5 * max(1.0, float(np.abs(ref_s).max(initial=0)))
                np.testing.assert_allclose(got_s, ref_s, rtol=1e-5, atol=tol)
                # a different doc at a rank is only allowed where float rounding decides a near-tie
                full = dense_scores(index, tokens, w)
                for r in np.flatnonzero(got_d != ref_d):
                    assert abs(full[got_d[r]] - ref_s[r]) <= 2 * tol
                assert len(set(got_d.tolist())) == len(got_d)
            n_compared += 1
    # the random cases did exercise what they claim to
    assert n_compared == 1200 and n_short > 100
    assert min(ways.values()) > 50, ways
    if weights == "int":
        assert n_ties > 100


@pytest.mark.parametrize("seed", range(4))
def test_ranking_the_flagged_accumulators_equals_ranking_the_touched_list(seed):
    """The two ways a query's top k is taken (kernels.scan_whole) agree, ties and all."""
    rng = np.random.default_rng(seed)
    for _ in range(200):
        n_docs = int(rng.integers(1, 300))
        seen = rng.random(n_docs) < rng.uniform(0.0, 1.0)
        scores = np.where(seen, rng.integers(-3, 4, n_docs), 0).astype(np.float32)  # small integers: many ties
        touched = rng.permutation(np.flatnonzero(seen)).astype(np.int32)  # in the order first met: any order
        for k in (0, 1, 5, n_docs + 1):
            got = kernels._top_k_flagged(scores, seen, k)
            want = kernels._top_k(scores, np.concatenate([touched, np.zeros(n_docs - len(touched), np.int32)]), len(touched), k)
            np.testing.assert_array_equal(got[0], want[0])
            np.testing.assert_array_equal(got[1], want[1])


def test_a_query_ranks_in_one_pass_from_its_threshold_of_postings_per_document():
    # 4 documents; token 0 is in documents 0 and 3, token 4 in none
    index = InvertedIndex.from_forward(np.array([[0, 1], [1, 2], [2, 3], [3, 0]], np.int32), np.ones((4, 2), np.float32), vocab_size=5)
    below = int(np.floor(2 / kernels.SCAN_WHOLE_FROM)) + 1  # 2 postings over more documents than 2 / threshold
    assert not kernels.scan_whole(index.indptr, np.array([0], np.int64), below)
    assert kernels.scan_whole(index.indptr, np.array([0], np.int64), 4)
    assert kernels.scan_whole(index.indptr, np.array([0, 7, -1], np.int64), 4)  # unknown tokens count nothing
    assert not kernels.scan_whole(index.indptr, np.array([4, 7], np.int64), 4)  # no postings: nothing to scan for
    assert kernels.scan_whole(index.indptr, np.array([0], np.int64), below, 0.0)  # forced
    assert not kernels.scan_whole(index.indptr, np.array([0], np.int64), 4, np.inf)


def test_reference_matches_definition():
    """The reference itself: scores are sums of document weights, every matched doc listed."""
    rng = np.random.default_rng(7)
    for _ in range(100):
        index = random_index(rng, "float")
        tokens, w = random_query(rng, index.vocab_size, "float")
        ref_d, ref_s = reference(index, tokens, w, index.n_docs)
        full = dense_scores(index, tokens, w)
        mat = index.doc_vectors().toarray()
        valid = tokens[(tokens >= 0) & (tokens < index.vocab_size)]
        matched = np.flatnonzero((mat[:, valid] != 0).any(axis=1)) if len(valid) else np.array([], int)
        assert sorted(ref_d.tolist()) == matched.tolist()
        np.testing.assert_allclose(ref_s, full[ref_d], rtol=1e-5, atol=1e-5)


def test_ties_go_to_lower_doc_number():
    # docs 0..4; token 0 is in docs 1, 2, 4 with weight 2; token 1 in docs 0 and 3 with weight 1
    index = InvertedIndex.from_forward(
        np.array([[1], [0], [0], [1], [0]], np.int32), np.array([[1], [2], [2], [1], [2]], np.float32), vocab_size=3
    )
    q = np.array([0, 1], np.int64)
    d, s = search(index, q, np.ones(2, np.float32), 10)
    assert d.tolist() == [1, 2, 4, 0, 3]
    assert s.tolist() == [2, 2, 2, 1, 1]
    d, s = search(index, q, np.ones(2, np.float32), 2)
    assert d.tolist() == [1, 2]


def test_duplicate_query_tokens_count_twice():
    index = InvertedIndex.from_forward(np.array([[0, 1], [1, 2]], np.int32), np.array([[3, 1], [1, 5]], np.float32), 3)
    d, s = search(index, np.array([1, 1, 2], np.int64), np.ones(3, np.float32), 5)
    assert d.tolist() == [1, 0]
    assert s.tolist() == [7.0, 2.0]


def test_empty_query_unknown_tokens_and_k_zero():
    rng = np.random.default_rng(3)
    index = random_index(rng, "int")
    for tokens in (np.zeros(0, np.int64), np.array([-1, index.vocab_size, index.vocab_size + 10], np.int64)):
        d, s = search(index, tokens, np.ones(len(tokens), np.float32), 5)
        assert len(d) == len(s) == 0
    d, s = search(index, np.arange(index.vocab_size, dtype=np.int64), np.ones(index.vocab_size, np.float32), 0)
    assert len(d) == 0


def test_search_many_equals_search_one():
    rng = np.random.default_rng(99)
    for _ in range(40):
        index = random_index(rng, "float")
        queries = [random_query(rng, index.vocab_size, "float") for _ in range(int(rng.integers(1, 9)))]
        k = int(rng.integers(1, index.n_docs + 4))
        docs, scores = index.batch_search(queries, k)
        assert docs.shape == scores.shape == (len(queries), k)
        for i, (t, w) in enumerate(queries):
            d1, s1 = index.search(t, w, k)
            n = len(d1)
            np.testing.assert_array_equal(docs[i, :n], d1)
            np.testing.assert_array_equal(scores[i, :n], s1)
            assert np.all(docs[i, n:] == -1) and np.all(np.isneginf(scores[i, n:]))


def test_search_many_no_queries():
    index = random_index(np.random.default_rng(0), "int")
    docs, scores = index.batch_search([], 4)
    assert docs.shape == scores.shape == (0, 4)


def test_default_query_weights_are_one():
    rng = np.random.default_rng(5)
    index = random_index(rng, "float")
    t, _ = random_query(rng, index.vocab_size, "ones")
    d_default, s_default = index.search(t, None, 7)
    d_ones, s_ones = index.search(t, np.ones(len(t), np.float32), 7)
    np.testing.assert_array_equal(d_default, d_ones)
    np.testing.assert_array_equal(s_default, s_ones)


def test_contributions_equal_matrix_entries():
    rng = np.random.default_rng(11)
    for _ in range(60):
        index = random_index(rng, "float")
        mat = index.doc_vectors().toarray()
        tokens, _ = random_query(rng, index.vocab_size, "ones")
        for doc in range(index.n_docs):
            got = index.contributions(tokens, doc)
            want = np.array([mat[doc, t] if 0 <= t < index.vocab_size else 0.0 for t in tokens], np.float32)
            np.testing.assert_array_equal(got, want)


def test_contributions_sum_to_score():
    rng = np.random.default_rng(13)
    for _ in range(60):
        index = random_index(rng, "int")
        tokens, w = random_query(rng, index.vocab_size, "int")
        for d, s in zip(*index.search(tokens, w, index.n_docs)):
            assert float((index.contributions(tokens, int(d)) * w).sum()) == float(s)


def test_from_forward_inverts_exactly():
    rng = np.random.default_rng(17)
    for _ in range(30):
        vocab, n_docs = int(rng.integers(5, 80)), int(rng.integers(1, 40))
        k = int(rng.integers(1, min(vocab, 12) + 1))
        tokens = np.stack([rng.choice(vocab, size=k, replace=False) for _ in range(n_docs)]).astype(np.int32)
        weights = rng.normal(size=(n_docs, k)).astype(np.float32)
        index = InvertedIndex.from_forward(tokens, weights, vocab)
        assert index.vocab_size == vocab and index.n_docs == n_docs and len(index.docs) == n_docs * k
        want = np.zeros((n_docs, vocab), np.float32)
        np.put_along_axis(want, tokens.astype(np.int64), weights, axis=1)
        np.testing.assert_array_equal(index.doc_vectors().toarray(), want)
        for t in range(vocab):  # contributions() binary-searches: postings must be ascending
            post = index.docs[index.indptr[t] : index.indptr[t + 1]]
            assert np.all(np.diff(post) > 0)


def test_from_forward_rejects_out_of_vocabulary_tokens():
    with pytest.raises(ValueError, match="outside the vocabulary"):
        InvertedIndex.from_forward(np.array([[0, 5]], np.int32), np.ones((1, 2), np.float32), vocab_size=5)


@pytest.mark.parametrize("weights", ["int", "float"])
def test_one_query_split_by_document_range_is_the_exact_search_bit_for_bit(weights):
    rng = np.random.default_rng(7 if weights == "int" else 8)
    for _ in range(200):
        index = random_index(rng, weights)
        tokens, w = random_query(rng, index.vocab_size, weights)
        codes = rng.integers(0, 256, size=len(index.weights)).astype(np.uint8)
        scale = rng.uniform(0.01, 0.2, index.vocab_size).astype(np.float32)
        offset = rng.uniform(-1.0, 1.0, index.vocab_size).astype(np.float32)
        for k in (0, 1, 3, index.n_docs + 5):
            exact = search(index, tokens, w, k)
            exact_u8 = int32_docs.search(index.indptr, index.docs, codes, tokens, w, index.n_docs, k, scale, offset)
            for parts in (1, 2, 3, index.n_docs + 2):  # more parts than documents: empty ranges
                got = split(index.indptr, index.docs, index.weights, None, None, tokens, w, index.n_docs, k, parts)
                np.testing.assert_array_equal(got[0], exact[0])
                np.testing.assert_array_equal(got[1], exact[1])
                got = split(index.indptr, index.docs, codes, scale, offset, tokens, w, index.n_docs, k, parts)
                np.testing.assert_array_equal(got[0], exact_u8[0])
                np.testing.assert_array_equal(got[1], exact_u8[1])
            # either way of ranking the accumulators (forced), one thread or split: the same ranking
            for whole_from in (0.0, np.inf):
                for got, want in (
                    (int32_docs.search(index.indptr, index.docs, index.weights, tokens, w, index.n_docs, k, whole_from=whole_from), exact),
                    (split(index.indptr, index.docs, index.weights, None, None, tokens, w, index.n_docs, k, 2, whole_from), exact),
                    (int32_docs.search(index.indptr, index.docs, codes, tokens, w, index.n_docs, k, scale, offset, whole_from=whole_from), exact_u8),
                    (split(index.indptr, index.docs, codes, scale, offset, tokens, w, index.n_docs, k, 3, whole_from), exact_u8),
                ):
                    np.testing.assert_array_equal(got[0], want[0])
                    np.testing.assert_array_equal(got[1], want[1])


def test_the_index_splits_a_query_only_from_its_threshold_of_postings_on(monkeypatch):
    import numba

    from indexer import inverted_index

    rng = np.random.default_rng(11)
    index = random_index(rng, "int")
    while index.n_docs < 4:
        index = random_index(rng, "int")
    tokens, w = random_query(rng, index.vocab_size, "int")
    while kernels.query_postings(index.indptr, tokens) == 0:
        tokens, w = random_query(rng, index.vocab_size, "int")
    exact = index.search(tokens, w, 5)
    assert index.search_parts() == index.search_parts(tokens) == 1  # a small index: one thread
    calls = []
    real = term_at_a_time.search_split
    monkeypatch.setattr(term_at_a_time, "search_split", lambda *a: calls.append(a[-2]) or real(*a))
    monkeypatch.setattr(inverted_index, "SPLIT_MIN_POSTINGS", kernels.query_postings(index.indptr, tokens))
    assert index.search_parts(tokens) == min(numba.get_num_threads(), index.n_docs)  # a query reading that many postings
    assert index.search_parts(tokens[:0]) == 1  # one reading fewer
    got = index.search(tokens, w, 5)
    np.testing.assert_array_equal(got[0], exact[0])
    np.testing.assert_array_equal(got[1], exact[1])
    assert calls == ([index.search_parts(tokens)] if index.search_parts(tokens) > 1 else [])


def test_a_range_of_the_split_search_holds_an_eighth_of_the_l2_cache_in_documents(tmp_path):
    from indexer.inverted_index import L2_FALLBACK_BYTES, range_docs

    for name, level, kind, size in (("index0", 1, "Data", "48K"), ("index1", 1, "Instruction", "32K"), ("index2", 2, "Unified", "1M"),
                                    ("index3", 3, "Unified", "266240K")):
        (tmp_path / name).mkdir()
        for field, value in (("level", level), ("type", kind), ("size", size)):
            (tmp_path / name / field).write_text(f"{value}\n")
    assert range_docs(tmp_path) == (1 << 20) // 8
    assert range_docs(tmp_path / "absent") == L2_FALLBACK_BYTES // 8


def test_a_large_index_splits_a_query_into_ranges_that_fit_the_cache(monkeypatch):
    import numba

    from indexer import inverted_index

    rng = np.random.default_rng(12)
    index = random_index(rng, "int")
    while index.n_docs < 20:
        index = random_index(rng, "int")
    tokens, w = random_query(rng, index.vocab_size, "int")
    exact = index.search(tokens, w, 5)
    monkeypatch.setattr(inverted_index, "SPLIT_MIN_POSTINGS", 1)
    monkeypatch.setattr(inverted_index, "range_docs", lambda: 3)
    assert index.search_parts() == max(min(numba.get_num_threads(), index.n_docs), -(-index.n_docs // 3))
    got = index.search(tokens, w, 5)
    np.testing.assert_array_equal(got[0], exact[0])
    np.testing.assert_array_equal(got[1], exact[1])
