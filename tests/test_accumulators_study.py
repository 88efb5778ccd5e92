"""experiments.accumulators: the index it tiles and the sparse queries it draws."""
from __future__ import annotations

import numpy as np

from experiments.accumulators import search_before, sparse_queries, tiled
from indexer import kernels
from indexer.inverted_index import InvertedIndex


def random_forward(rng: np.random.Generator, n_docs: int, vocab: int, k: int) -> tuple[np.ndarray, np.ndarray]:
    tokens = np.stack([rng.choice(vocab, k, replace=False) for _ in range(n_docs)]).astype(np.int32)
    return tokens, rng.integers(1, 9, size=(n_docs, k)).astype(np.float32)


def test_copies_side_by_side_are_the_index_of_the_repeated_documents():
    rng = np.random.default_rng(0)
    tokens, weights = random_forward(rng, 30, 40, 5)
    one = InvertedIndex.from_forward(tokens, weights, vocab_size=40)
    three = InvertedIndex.from_forward(np.tile(tokens, (3, 1)), np.tile(weights, (3, 1)), vocab_size=40)
    indptr, docs, w = tiled(one.indptr, one.docs, one.weights, one.n_docs, 3)
    np.testing.assert_array_equal(indptr, three.indptr)
    np.testing.assert_array_equal(docs, three.docs)
    np.testing.assert_array_equal(w, three.weights)
    assert tiled(one.indptr, one.docs, one.weights, one.n_docs, 1)[1] is one.docs


def test_sparse_queries_read_about_the_asked_postings_per_document_from_uncommon_tokens():
    rng = np.random.default_rng(1)
    tokens, weights = random_forward(rng, 2000, 3000, 20)
    index = InvertedIndex.from_forward(tokens, weights, vocab_size=3000)
    df = np.diff(index.indptr)
    for per_doc in (0.01, 0.1, 0.3):
        for q, qw in sparse_queries(20, per_doc, df, index.n_docs):
            assert len(q) == len(qw) == len(set(q.tolist()))
            assert (df[q] < 0.05 * index.n_docs).all()
            read = df[q].sum()
            assert read >= per_doc * index.n_docs and read - df[q[-1]] < per_doc * index.n_docs  # the last token crossed it


def test_the_baseline_kernel_ranks_as_the_engine_does():
    rng = np.random.default_rng(2)
    tokens, weights = random_forward(rng, 500, 200, 12)
    index = InvertedIndex.from_forward(tokens, weights, vocab_size=200)
    for q, qw in sparse_queries(10, 0.05, np.diff(index.indptr), index.n_docs) + [(np.arange(200, dtype=np.int64), np.ones(200, np.float32))]:
        want = kernels.search_one(index.indptr, index.docs, index.weights, q, qw, index.n_docs, 10)
        got = search_before(index.indptr, index.docs, index.weights, q, qw, index.n_docs, 10)
        np.testing.assert_array_equal(got[0], want[0])
        np.testing.assert_array_equal(got[1], want[1])
