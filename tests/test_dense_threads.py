"""A single query's FAISS search runs on one OpenMP thread (indexer/dense.py:
one_thread_for_one_query): the same results as with every thread, the caller's thread count
restored afterwards, batches untouched."""
from __future__ import annotations

import numpy as np
import pytest

from indexer.dense import DenseIndex, one_thread_for_one_query

faiss = pytest.importorskip("faiss")


@pytest.fixture
def two_threads():
    before = faiss.omp_get_max_threads()
    faiss.omp_set_num_threads(2)
    yield
    faiss.omp_set_num_threads(before)


def test_one_query_runs_on_one_thread_and_the_count_is_restored(two_threads):
    with one_thread_for_one_query(1):
        assert faiss.omp_get_max_threads() == 1
    assert faiss.omp_get_max_threads() == 2
    with one_thread_for_one_query(8):
        assert faiss.omp_get_max_threads() == 2
    with pytest.raises(RuntimeError), one_thread_for_one_query(1):
        raise RuntimeError("a failed search")
    assert faiss.omp_get_max_threads() == 2  # restored on the way out of an error too


@pytest.mark.parametrize("kind", ["Flat", "SQ8"])
def test_a_single_query_finds_what_the_batch_finds(two_threads, kind):
    rng = np.random.default_rng(0)
    x = rng.normal(size=(300, 24)).astype(np.float32)
    index = DenseIndex.build(x, kind)
    queries = rng.normal(size=(5, 24)).astype(np.float32)
    docs, scores = index.search(queries, 10)
    for i in range(5):
        d, s = index.search(queries[i : i + 1], 10)
        np.testing.assert_array_equal(d[0], docs[i])
        np.testing.assert_allclose(s[0], scores[i], rtol=1e-6)
