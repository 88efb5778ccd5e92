"""Query pruning (indexer/query_pruning.py): which tokens are kept, the posting lists' maxima, and
that the exact path (keep_mass 1, or every dropped token rescored) is the exact search. Correctness
only; what pruning costs in recall and saves in time is measured by experiments.query_pruning."""
from __future__ import annotations

import math

import numpy as np
import pytest

from indexer.inverted_index import InvertedIndex
from indexer.query_pruning import kept_positions, list_max_weights, prune_query, pruned_search, rescore, token_values

VOCAB = 60


def tiny_index(seed: int = 0, n_docs: int = 200, k: int = 12, negative: bool = False) -> InvertedIndex:
    """``n_docs`` documents of ``k`` distinct tokens out of :data:`VOCAB` (the last ten in none),
    Zipf-like so that some lists are long; weights in 1-30 (some below 0 where ``negative``)."""
    rng = np.random.default_rng(seed)
    p = 1.0 / np.arange(1, VOCAB - 9)
    tokens = np.stack([rng.choice(VOCAB - 10, k, replace=False, p=p / p.sum()) for _ in range(n_docs)])
    weights = rng.uniform(1.0, 30.0, (n_docs, k)).astype(np.float32)
    if negative:
        weights[rng.random(weights.shape) < 0.3] *= -1.0
    return InvertedIndex.from_forward(tokens, weights, VOCAB)


def random_query(seed: int, n: int = 40) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    return rng.choice(VOCAB, n, replace=False).astype(np.int64), rng.uniform(0.05, 4.0, n).astype(np.float32)


# ------------------------------------------------------------------ which tokens are kept
@pytest.mark.parametrize("with_bound", [False, True])
def test_keep_mass_one_returns_the_query_unchanged(with_bound):
    tokens, weights = random_query(1)
    bound = list_max_weights(tiny_index()) if with_bound else None
    got_t, got_w = prune_query(tokens, weights, 1.0, bound)
    assert np.array_equal(got_t, tokens) and np.array_equal(got_w, weights)
    assert np.array_equal(kept_positions(token_values(tokens, weights, bound), 1), np.arange(len(tokens)))


@pytest.mark.parametrize("keep_mass", [0.999, 0.99, 0.95, 0.9, 0.8, 0.5, 0.1, 1e-9])
@pytest.mark.parametrize("with_bound", [False, True])
def test_the_kept_tokens_are_the_fewest_top_value_ones_covering_the_mass(keep_mass, with_bound):
    bound = list_max_weights(tiny_index()) if with_bound else None
    for seed in range(20):
        tokens, weights = random_query(seed)
        values = token_values(tokens, weights, bound)
        keep = kept_positions(values, keep_mass)
        got_t, got_w = prune_query(tokens, weights, keep_mass, bound)
        assert np.array_equal(got_t, tokens[keep]) and np.array_equal(got_w, weights[keep])
        dropped = np.setdiff1d(np.arange(len(tokens)), keep)
        total = values.sum()
        assert values[keep].sum() >= keep_mass * total * (1 - 1e-9)  # covers the mass
        if len(dropped):
            assert values[keep].min() >= values[dropped].max()  # the top-value ones
        if len(keep) > 1:  # the fewest: without its smallest kept token, the rest falls short
            assert values[keep].sum() - values[keep].min() < keep_mass * total


def test_the_value_is_the_weight_times_the_lists_bound():
    index = tiny_index()
    bound = list_max_weights(index)
    tokens = np.array([0, 1, VOCAB - 1, -3, VOCAB + 5], np.int64)  # a token in no document, two outside the vocabulary
    weights = np.array([2.0, -0.5, 9.0, 1.0, 1.0], np.float32)
    assert np.allclose(token_values(tokens, weights), [2.0, 0.5, 9.0, 1.0, 1.0])
    assert np.allclose(token_values(tokens, weights, bound), [2.0 * bound[0], 0.5 * bound[1], 0.0, 0.0, 0.0])
    # the weight share keeps the heavy token in no document; the bound drops it first (it scores nothing)
    assert VOCAB - 1 in prune_query(tokens, weights, 0.5)[0]
    assert VOCAB - 1 not in prune_query(tokens, weights, 0.999, bound)[0]


def test_order_is_preserved():
    tokens = np.array([5, 3, 9, 1, 7, 2], np.int64)
    weights = np.array([0.1, 5.0, 0.2, 4.0, 3.0, 0.05], np.float32)
    got_t, got_w = prune_query(tokens, weights, 0.9)
    assert got_t.tolist() == [3, 1, 7] and got_w.tolist() == pytest.approx([5.0, 4.0, 3.0])
    for seed in range(10):
        tokens, weights = random_query(seed)
        got_t, _ = prune_query(tokens, weights, 0.7)
        where = [int(np.flatnonzero(tokens == t)[0]) for t in got_t]
        assert where == sorted(where)


def test_ties_go_to_the_earlier_token():
    tokens = np.arange(4, dtype=np.int64)
    weights = np.ones(4, np.float32)
    assert prune_query(tokens, weights, 0.5)[0].tolist() == [0, 1]


def test_never_empty_and_min_tokens():
    tokens, weights = random_query(3)
    assert len(prune_query(tokens, weights, 1e-12)[0]) == 1
    assert len(prune_query(tokens, weights, 1e-12, min_tokens=5)[0]) == 5
    assert len(prune_query(tokens[:3], weights[:3], 1e-12, min_tokens=5)[0]) == 3
    # no value at all (zero weights; tokens in no list): still a token left
    assert len(prune_query(tokens, np.zeros_like(weights), 0.5)[0]) == 1
    assert len(prune_query(np.array([VOCAB - 1, -1]), np.ones(2, np.float32), 0.5, list_max_weights(tiny_index()))[0]) == 1
    empty_t, empty_w = prune_query(np.zeros(0, np.int64), np.zeros(0, np.float32), 0.5)
    assert empty_t.size == 0 and empty_w.size == 0


@pytest.mark.parametrize("bad", [0, 0.0, -0.1, 1.0000001, 2, math.nan, math.inf, -math.inf, "0.9", None, True, [0.9]])
def test_bad_keep_mass_is_refused(bad):
    tokens, weights = random_query(0)
    with pytest.raises(ValueError, match=r"keep_mass must be .*\(0, 1\]"):
        prune_query(tokens, weights, bad)
    with pytest.raises(ValueError, match="keep_mass"):
        kept_positions(np.ones(3), bad)


def test_numpy_keep_masses_are_accepted():
    tokens, weights = random_query(0)
    assert np.array_equal(prune_query(tokens, weights, np.float32(0.9))[0], prune_query(tokens, weights, 0.9)[0])


@pytest.mark.parametrize("bad", [0, -1, 1.5, True, None])
def test_bad_min_tokens_is_refused(bad):
    tokens, weights = random_query(0)
    with pytest.raises(ValueError, match="min_tokens"):
        prune_query(tokens, weights, 0.9, min_tokens=bad)


def test_bad_shapes_are_refused():
    with pytest.raises(ValueError, match="one length"):
        prune_query(np.arange(3), np.ones(2, np.float32), 0.9)
    with pytest.raises(ValueError, match="list_max"):
        prune_query(np.arange(3), np.ones(3, np.float32), 0.9, np.ones((2, 2), np.float32))


# ------------------------------------------------------------------ the lists' maxima
def brute_list_max(index: InvertedIndex) -> np.ndarray:
    w = index.float_weights()
    return np.array([np.abs(w[a:b]).max() if b > a else 0.0 for a, b in zip(index.indptr[:-1], index.indptr[1:])], np.float32)


@pytest.mark.parametrize("negative", [False, True])
def test_list_max_of_float32_and_8_bit_impacts(negative):
    index = tiny_index(negative=negative)
    got = list_max_weights(index)
    assert got.dtype == np.float32 and got.shape == (VOCAB,)
    assert np.array_equal(got, brute_list_max(index))
    assert np.all(got[-10:] == 0.0)  # empty lists
    compact = index.quantise()
    assert np.allclose(list_max_weights(compact), brute_list_max(compact), rtol=0, atol=1e-5)
    # per list at most half a quantisation step from the float32 maximum
    assert np.all(np.abs(list_max_weights(compact) - got) <= compact.scale / 2 + 1e-5)
    assert np.array_equal(list_max_weights(compact.pack()), list_max_weights(compact))


def test_list_max_by_hand():
    # lists: [3, -7], [], [2.5], [] (float32), then the same as 8-bit impacts
    index = InvertedIndex(np.array([0, 2, 2, 3, 3], np.int64), np.array([0, 1, 1], np.int32), np.array([3.0, -7.0, 2.5], np.float32), 2)
    assert list_max_weights(index).tolist() == [7.0, 0.0, 2.5, 0.0]
    codes = InvertedIndex(index.indptr, index.docs, np.array([255, 0, 0], np.uint8), 2,
                          scale=np.array([10 / 255, 0, 0, 0], np.float32), offset=np.array([-7.0, 0, 2.5, 0], np.float32))
    assert list_max_weights(codes) == pytest.approx([7.0, 0.0, 2.5, 0.0])
    empty = InvertedIndex(np.zeros(3, np.int64), np.zeros(0, np.int32), np.zeros(0, np.float32), 0)
    assert list_max_weights(empty).tolist() == [0.0, 0.0]


# ------------------------------------------------------------------ the exact path
@pytest.mark.parametrize("quantised", [False, True])
def test_pruned_search_at_keep_mass_one_is_the_exact_search(quantised):
    index = tiny_index(seed=4)
    index = index.quantise() if quantised else index
    bound = list_max_weights(index)
    for seed in range(10):
        tokens, weights = random_query(seed)
        exact = index.search(tokens, weights, 10)
        for values in (None, bound):
            got = index.search(*prune_query(tokens, weights, 1.0, values), 10)
            assert np.array_equal(got[0], exact[0]) and np.array_equal(got[1], exact[1])


@pytest.mark.parametrize("kind", ["float32", "uint8", "packed", "ranged"])
def test_rescoring_every_candidate_gives_the_exact_ranking(kind):
    index = tiny_index(seed=5)
    index = {"float32": index, "uint8": index.quantise(), "packed": index.quantise().pack(), "ranged": index.quantise().split_ranges()}[kind]
    bound = list_max_weights(index)
    for seed in range(10):
        tokens, weights = random_query(seed)
        exact_docs, exact_scores = index.search(tokens, weights, 10)
        keep = kept_positions(token_values(tokens, weights, bound), 0.6)
        dropped = np.setdiff1d(np.arange(len(tokens)), keep)
        assert dropped.size  # something was pruned
        # every document the kept tokens match is a candidate (one matched by dropped tokens alone scores too little to be in the top 10 here)
        docs, scores = index.search(tokens[keep], weights[keep], index.n_docs)
        got_docs, got_scores = rescore(index, docs, scores, tokens[dropped], weights[dropped], 10)
        assert np.allclose(got_scores, exact_scores, rtol=1e-5, atol=1e-4)
        tied = np.isclose(got_scores[:, None], got_scores[None, :], rtol=1e-5, atol=1e-4).sum(axis=1) > 1
        assert np.array_equal(got_docs[~tied], exact_docs[~tied])  # the same ranking, up to float ties
        assert set(got_docs[tied].tolist()) <= set(docs.tolist())


def test_rescore_with_nothing_dropped_reorders_nothing():
    index = tiny_index(seed=6)
    tokens, weights = random_query(2)
    docs, scores = index.search(tokens, weights, 20)
    padded = np.concatenate([docs, [-1, -1]]), np.concatenate([scores, [-np.inf, -np.inf]]).astype(np.float32)
    got_docs, got_scores = rescore(index, *padded, np.zeros(0, np.int64), np.zeros(0, np.float32), 10)
    assert np.array_equal(got_docs, docs[:10]) and np.array_equal(got_scores, scores[:10])


@pytest.mark.parametrize("kind", ["float32", "ranged"])
def test_pruned_search_is_prune_then_search_then_rescore(kind):
    index = tiny_index(seed=7)
    index = index if kind == "float32" else index.quantise().split_ranges()
    for seed in range(6):
        tokens, weights = random_query(seed)
        # keep_mass 1: the exact search itself
        assert all(np.array_equal(a, b) for a, b in zip(pruned_search(index, tokens, weights, 10, 1.0), index.search(tokens, weights, 10)))
        keep = kept_positions(token_values(tokens, weights), 0.7)
        dropped = np.setdiff1d(np.arange(len(tokens)), keep)
        docs, scores = index.search(tokens[keep], weights[keep], 30)
        want = rescore(index, docs, scores, tokens[dropped], weights[dropped], 10)
        got = pruned_search(index, tokens, weights, 10, 0.7, depth=30)
        assert np.array_equal(got[0], want[0]) and np.array_equal(got[1], want[1])
        # searched to the whole index, the candidates hold the exact top 10 (every matched document)
        exact = index.search(tokens, weights, 10)
        deep = pruned_search(index, tokens, weights, 10, 0.7, depth=index.n_docs)
        assert np.allclose(deep[1], exact[1], rtol=1e-5, atol=1e-4)
    for depth in (0, -1, 2.5, True):
        with pytest.raises(ValueError, match="depth"):
            pruned_search(index, tokens, weights, 10, 0.7, depth=depth)


@pytest.mark.parametrize("layout", ["int32", "packed", "ranged"])
def test_pruning_reads_4_bit_impacts_as_the_same_codes_a_byte_each(layout):
    """4-bit impacts (two a byte): the lists' maxima, the rescoring of dropped tokens and the
    pruned search are those of the same 16-level codes stored one a byte, exactly."""
    index = tiny_index(seed=8, negative=True).quantise(levels=16)
    index = index.pack() if layout == "packed" else index.split_ranges() if layout == "ranged" else index
    nibbles = index.to_nibbles()
    assert np.array_equal(list_max_weights(nibbles), list_max_weights(index))
    for seed in range(6):
        tokens, weights = random_query(seed)
        got, want = pruned_search(nibbles, tokens, weights, 10, 0.7, depth=30), pruned_search(index, tokens, weights, 10, 0.7, depth=30)
        assert np.array_equal(got[0], want[0]) and np.array_equal(got[1], want[1])
