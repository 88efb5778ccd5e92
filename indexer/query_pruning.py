"""Query pruning for the aligned-token channel: drop the query tokens that can barely change a score.

A document's aligned-token score is ``sum over matched query tokens t of q_weight[t] * doc_weight[t]``
(term at a time, indexer/kernels.py), and every query token costs a scan of its whole posting list.
LLM-expanded queries carry 130-200 tokens, many of them with small IDF weights and long lists: the
expensive ones that move scores least. :func:`prune_query` keeps the fewest highest-value tokens
whose values cover a share ``keep_mass`` of the query's total value (1: the query unchanged, the exact
reference), where a token's value is

* ``|q_weight|`` (its share of the query's weight mass), or, with ``list_max`` given,
* ``|q_weight| * list_max[token]``: an upper bound of what the token can add to any document's
  score (:func:`list_max_weights`: the largest absolute weight of its posting list). Then the
  values dropped bound the change of every document's score: no score moves by more than
  ``(1 - keep_mass) * total``. A token whose posting list is empty has value 0 (it scores nothing
  and costs nothing) and goes first.

:func:`rescore` is the other half of a cut: the pruned query's top candidates (say its top 100)
rescored exactly with the dropped tokens, a binary search per candidate and dropped token and no
list scanned, so that the final top-k are ranked by their exact scores wherever the kept tokens
brought them among the candidates.

Measured on the shared collections and a synthetic corpus by ``experiments.query_pruning``
(benchmarks/results/query-pruning/query-pruning.json). Nothing here is wired into the Retriever.
"""
from __future__ import annotations

import math
import numbers

import numba as nb
import numpy as np

from indexer.inverted_index import InvertedIndex
from indexer.kernels import code_at


def check_keep_mass(keep_mass: object) -> float:
    """``keep_mass`` as a float, or ValueError unless it is a real number in (0, 1]."""
    number = isinstance(keep_mass, numbers.Real) and not isinstance(keep_mass, bool)
    value = float(keep_mass) if number else math.nan  # type: ignore[arg-type]
    if not (0.0 < value <= 1.0):  # also refuses NaN and what is not a number
        raise ValueError(f"keep_mass must be in (0, 1] (1 keeps the query unchanged); got {keep_mass!r}")
    return value


def token_values(tokens: np.ndarray, weights: np.ndarray, list_max: np.ndarray | None = None) -> np.ndarray:
    """Each query token's value (float64): ``|weight|``, or ``|weight| * list_max[token]`` where
    ``list_max`` (one entry per posting list, :func:`list_max_weights`) is given; a token outside
    ``list_max``'s range has value 0 (the kernels skip it)."""
    tokens = np.asarray(tokens)
    weights = np.asarray(weights)
    if tokens.ndim != 1 or weights.ndim != 1 or tokens.shape != weights.shape:
        raise ValueError(f"tokens and weights must be 1-D of one length; got shapes {tokens.shape} and {weights.shape}")
    values = np.abs(weights.astype(np.float64))
    if list_max is None:
        return values
    list_max = np.asarray(list_max)
    if list_max.ndim != 1:
        raise ValueError(f"list_max must be 1-D (one entry per posting list); got shape {list_max.shape}")
    inside = (tokens >= 0) & (tokens < list_max.shape[0])
    bound = np.zeros(tokens.shape[0], np.float64)
    bound[inside] = np.abs(list_max[tokens[inside]].astype(np.float64))
    return values * bound


def kept_positions(values: np.ndarray, keep_mass: float, min_tokens: int = 1) -> np.ndarray:
    """Positions (ascending, int64) of the fewest highest values whose sum reaches ``keep_mass`` of
    the total, and at least ``min_tokens`` of them (all where there are fewer). Ties go to the earlier
    position. ``keep_mass`` 1 keeps every position."""
    keep_mass = check_keep_mass(keep_mass)
    if isinstance(min_tokens, bool) or not isinstance(min_tokens, numbers.Integral) or min_tokens < 1:
        raise ValueError(f"min_tokens must be an integer >= 1 (a query is never pruned to nothing); got {min_tokens!r}")
    values = np.asarray(values, np.float64)
    n = values.shape[0]
    if keep_mass >= 1.0 or n <= min_tokens:
        return np.arange(n, dtype=np.int64)
    order = np.argsort(-values, kind="stable")  # best first, ties by position
    covered = np.cumsum(values[order])
    total = covered[-1]
    # the first prefix whose sum reaches the target; a tiny relative slack absorbs the rounding of
    # the running sum (otherwise a share that is exactly reached could ask for one more token)
    needed = int(np.searchsorted(covered, keep_mass * total * (1.0 - 1e-12), side="left")) + 1 if total > 0 else 0
    count = min(n, max(needed, int(min_tokens)))
    return np.sort(order[:count]).astype(np.int64)


def prune_query(
    tokens: np.ndarray, weights: np.ndarray, keep_mass: float, list_max: np.ndarray | None = None, min_tokens: int = 1
) -> tuple[np.ndarray, np.ndarray]:
    """``(tokens, weights)`` of the query without its low-value tokens, in their original order.

    Keeps the fewest highest-value tokens (:func:`token_values`: ``|weight|``, times the posting
    list's largest absolute weight where ``list_max`` is given) whose values sum to at least
    ``keep_mass`` of the query's total, and at least ``min_tokens`` (never an empty query for a
    non-empty one). ``keep_mass`` is in (0, 1]; 1 returns the query unchanged (the exact reference).
    """
    tokens = np.asarray(tokens)
    weights = np.asarray(weights)
    values = token_values(tokens, weights, list_max)  # checks the shapes
    if check_keep_mass(keep_mass) >= 1.0:
        return tokens, weights
    keep = kept_positions(values, keep_mass, min_tokens)
    return tokens[keep], weights[keep]


def list_max_weights(index: InvertedIndex) -> np.ndarray:
    """The largest absolute weight of each posting list (float32, one per vocabulary token; 0 for an
    empty list): an upper bound of what one posting of the list adds to a score per unit of query weight.

    float32 weights are read as they are; 8-bit impacts (``index.quantised``) as the levels of the
    list's smallest and largest codes (``offset[t] + scale[t] * code``, as the kernels dequantise
    them), so the bound is that of the quantised scores. One pass over the weights (or codes)."""
    indptr = np.asarray(index.indptr, np.int64)
    out = np.zeros(indptr.shape[0] - 1, np.float32)
    nonempty = np.flatnonzero(indptr[1:] > indptr[:-1])
    if nonempty.size == 0:
        return out
    starts = indptr[nonempty]
    # consecutive non-empty lists are contiguous (empty ones hold nothing between them), so each
    # reduceat segment is exactly one list; the last runs to the end of the weights
    if index.nibbles:  # two codes a byte: no NumPy reduction reads them
        lo, hi = _code_bounds(indptr, index.weights, nonempty)
    else:
        weights = index.weights[: indptr[-1]]
        hi = np.maximum.reduceat(weights, starts)
        lo = np.minimum.reduceat(weights, starts)
    if index.quantised:
        scale, offset = np.asarray(index.scale, np.float32)[nonempty], np.asarray(index.offset, np.float32)[nonempty]
        hi = offset + scale * hi.astype(np.float32)
        lo = offset + scale * lo.astype(np.float32)
    out[nonempty] = np.maximum(np.abs(hi.astype(np.float32)), np.abs(lo.astype(np.float32)))
    return out


def rescore(
    index: InvertedIndex, docs: np.ndarray, scores: np.ndarray, dropped_tokens: np.ndarray, dropped_weights: np.ndarray, k: int
) -> tuple[np.ndarray, np.ndarray]:
    """Top-``k`` of a pruned query's candidates with their exact scores: ``docs`` / ``scores`` are
    its hits (doc numbers, -1 padded, and the scores of the kept tokens), to which each dropped
    token adds ``weight * the document's weight``, found by binary search of the candidates in the
    token's posting list (no list scanned: a Numba kernel, all candidates in one call). Best first,
    ties by the lower doc number, as the kernels rank. Exact wherever the exact top-``k`` are among
    the candidates (up to float32 rounding: the sum is taken in another order)."""
    docs = np.asarray(docs)
    valid = docs >= 0
    docs = docs[valid].astype(np.int32)
    exact = np.asarray(scores, np.float32)[valid].copy()
    dropped_tokens = np.asarray(dropped_tokens, np.int64)
    dropped_weights = np.asarray(dropped_weights, np.float32)
    if docs.size and dropped_tokens.size:  # through the doc layout (indexer/doc_numbers.py): a kernel where it has one
        index.numbers.add_dropped(np.asarray(index.indptr, np.int64), index.weights, index.scale, index.offset, docs, dropped_tokens,
                                  dropped_weights, exact)
    order = np.lexsort((docs, -exact))[:k]
    return docs[order], exact[order]


def pruned_search(index: InvertedIndex, tokens: np.ndarray, weights: np.ndarray, k: int = 10, keep_mass: float = 0.95, depth: int = 100,
                  list_max: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Top-``k`` (doc numbers, scores) of a query searched pruned: its fewest highest-value tokens
    covering ``keep_mass`` of its value (:func:`prune_query`) searched to ``depth`` (at least ``k``),
    those candidates rescored exactly with the dropped tokens (:func:`rescore`), best first. Not exact:
    a document the kept tokens leave below ``depth`` is lost (measured as recall against the exact
    search: benchmarks/results/scale/ten-million.json, benchmarks/results/query-pruning/). ``keep_mass`` 1: the exact search."""
    tokens = np.asarray(tokens, np.int64)
    weights = np.asarray(weights, np.float32)
    if check_keep_mass(keep_mass) >= 1.0:
        return index.search(tokens, weights, k)
    if isinstance(depth, bool) or not isinstance(depth, numbers.Integral) or depth < 1:
        raise ValueError(f"depth must be a positive integer, not {depth!r}")
    keep = kept_positions(token_values(tokens, weights, list_max), keep_mass)
    dropped = np.ones(tokens.shape[0], bool)
    dropped[keep] = False
    docs, scores = index.search(tokens[keep], weights[keep], max(int(depth), k))
    return rescore(index, docs, scores, tokens[dropped], weights[dropped], k)


@nb.njit(cache=True)
def _code_bounds(indptr, codes, lists):
    """The smallest and largest code of each of ``lists`` (non-empty), read through :func:`code_at`."""
    lo = np.empty(lists.shape[0], np.int64)
    hi = np.empty(lists.shape[0], np.int64)
    for i in range(lists.shape[0]):
        t = lists[i]
        first = np.int64(code_at(codes, indptr[t]))
        lo[i], hi[i] = first, first
        for p in range(indptr[t] + 1, indptr[t + 1]):
            c = np.int64(code_at(codes, p))
            lo[i], hi[i] = min(lo[i], c), max(hi[i], c)
    return lo, hi
