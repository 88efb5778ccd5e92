"""The term-at-a-time search every doc layout shares (issue 69): one Numba driver, each layout giving
only how to walk one term's postings.

A query is scored a *window* of documents at a time: the window's accumulators (a float32 score a
document, a seen flag where needed, the list of documents touched), every query token's postings
in the window added in query order, then the window's top k (indexer/kernels.py: a touched list or
one pass over the accumulators, :func:`indexer.kernels.accumulator_plan`; without flags where every
posting adds a positive amount and the layout asks for it: :func:`register`), and the windows' lists
merged. The windows are the whole collection (one), ``parts`` equal ranges over Numba's threads (a
split search: ``InvertedIndex.search`` from ``SPLIT_MIN_POSTINGS`` on), or, for a layout whose doc
numbers are stored relative to fixed ranges (range16), those ranges. Every document is scored by one
window with its query tokens added in the same order, so any windowing gives the same ranking and
the same float32 scores, bit for bit.

What a layout gives (:func:`register`, once, in its own module): a *scan*
``scan(postings, indptr, t, lo, hi, buf, codes, qa, qb, scores, seen, touched, n_touched, flags, whole)``
that finds the runs of term ``t``'s postings whose doc numbers lie in ``[lo, hi)`` and hands each
run to :func:`add_postings`, the one loop that adds postings to the accumulators (returning the
touched count); ``postings`` is the layout's tuple of arrays with its tag first
(:meth:`indexer.doc_numbers.DocNumbers.postings`), ``buf`` a scratch array of ``scratch`` int64
(a bit-packed block's doc numbers, say). The weights need nothing from the layout: float32 weights
(``scale`` None) add ``q_weight * weight``, 8- and 4-bit codes ``qa * code + qb`` with
``qa, qb = q_weight * scale[t], q_weight * offset[t]`` (the codes' dtype chooses the reader:
:data:`indexer.kernels.NIBBLES`).

How the layout reaches the driver: its tag, a zero-length array whose record dtype names the layout
(and a digest of its module's source), is the first element of ``postings``, so the tuple's Numba
type says which scan to inline (an ``overload`` of :func:`scan` that looks the tag up); the driver's
three kernels (:func:`search_one`, :func:`search_split`, :func:`search_many`) are compiled once a
layout and impact width, and cached on disk (``cache=True``) under a signature that holds the digest,
so an edited layout module is compiled afresh rather than served from a stale cache. Measured
against the two other ways Numba offers (scratch experiments, Numba 0.68): a jitted scan passed as an
argument (a first-class function) and a driver closed over it both missed the on-disk cache in
every new process (the dispatcher's type and a closure's cells pickle with a per-process id), so
every process would compile every kernel again; a tag costs a few tenths of a microsecond a call.
"""
from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path

import numba as nb
import numpy as np
from numba import types
from numba.extending import overload

from indexer.kernels import SCAN_WHOLE_FROM, _merge_parts, _top_k_positive, accumulator_plan, positive_query, ranked


@dataclass(frozen=True)
class _Layout:
    name: str
    field: str  # the tag's record field: name and source digest
    scan: object  # the scan, jitted (inlined where the driver calls it)
    window_bits: int  # > 0: doc numbers relative to fixed ranges of 2**window_bits documents, the search's windows
    scratch: int  # int64 entries of the scan's scratch buffer
    positive_pass: bool  # rank a positive query's accumulators without seen flags


_LAYOUTS: dict[str, _Layout] = {}  # by tag field


def register(name: str, scan, source: str | Path, window_bits: int = 0, scratch: int = 0, positive_pass: bool = False) -> np.ndarray:
    """Register a doc layout's scan (a plain function, jitted here; module docstring) and return its
    tag, the first element of its ``postings`` tuple. ``source``: the layout module's file (its
    digest is part of the tag, so the driver's cached kernels follow edits to the scan);
    ``window_bits``: the doc numbers are stored relative to ranges of ``2**window_bits`` documents,
    which are then the search's windows (``[lo, hi)`` one such range); ``scratch``: the size of
    ``buf``; ``positive_pass``: where the query ranks its accumulators in one pass and every posting
    it reads adds a positive amount (:func:`indexer.kernels.positive_query`), keep no seen flags and
    rank the documents of positive score (the same ranking, bit for bit). Chosen by measurement,
    per layout: ~10% faster a posting on range16's scan (a scratch trial on 1M synthetic documents),
    but 1.15-1.3x slower on the int32 and bit-packed scans of 4-bit codes (cisi, paired runs against
    their kernels before the driver), which therefore keep their flags as they did."""
    try:
        digest = hashlib.sha256(Path(source).read_bytes()).hexdigest()[:16]
    except OSError:  # no source beside the module (a zip, say): no digest; the cache is Numba's as ever
        digest = "-"
    field = f"{name}:{digest}"
    _LAYOUTS[field] = _Layout(name, field, nb.njit(inline="always")(scan), int(window_bits), int(scratch), bool(positive_pass))
    return np.zeros(0, np.dtype([(field, np.uint8)]))


def _layout(postings) -> _Layout | None:
    """The registered layout a ``postings`` tuple's Numba type names (by its tag), or None."""
    if not isinstance(postings, types.BaseTuple) or len(postings) == 0:
        return None
    tag = postings[0]
    if not (isinstance(tag, types.Array) and isinstance(tag.dtype, types.Record) and len(tag.dtype.fields) == 1):
        return None
    return _LAYOUTS.get(next(iter(tag.dtype.fields)))


def scan(postings, indptr, t, lo, hi, buf, codes, qa, qb, scores, seen, touched, n_touched, flags, whole):
    """Term ``t``'s postings with doc numbers in ``[lo, hi)`` added to the window's accumulators, by
    the scan of the layout ``postings``' tag names; returns the touched count. Numba only."""
    raise NotImplementedError("term_at_a_time.scan runs inside a Numba kernel only")


@overload(scan, inline="always")
def _scan(postings, indptr, t, lo, hi, buf, codes, qa, qb, scores, seen, touched, n_touched, flags, whole):
    layout = _layout(postings)
    if layout is None:
        return None
    walk = layout.scan

    def impl(postings, indptr, t, lo, hi, buf, codes, qa, qb, scores, seen, touched, n_touched, flags, whole):
        return walk(postings, indptr, t, lo, hi, buf, codes, qa, qb, scores, seen, touched, n_touched, flags, whole)
    return impl


def _traits(postings):
    """(window_bits, scratch, positive_pass) of the layout ``postings`` names. Numba only."""
    raise NotImplementedError


@overload(_traits, inline="always")
def _traits_overload(postings):
    layout = _layout(postings)
    if layout is None:
        return None
    bits, scratch, positive = layout.window_bits, layout.scratch, layout.positive_pass
    return lambda postings: (bits, scratch, positive)


# --------------------------------------------------------------------- the accumulate loop
@nb.njit(cache=True, inline="always")
def _add(d, code, qa, qb, scores, seen, touched, n_touched, flags, whole):
    """One posting's score added to document ``d``'s accumulator (listed as touched on first sight
    where the query ranks only the documents it touches); returns the touched count."""
    if flags:
        if not whole and not seen[d]:
            touched[n_touched] = d
            n_touched += 1
        seen[d] = True
    scores[d] += qa * np.float32(code) + qb
    return n_touched


@nb.njit(cache=True, inline="always")
def _add_weight(d, w, qw, scores, seen, touched, n_touched, flags, whole):
    """:func:`_add` for a float32 weight: ``q_weight * weight`` (no offset to add)."""
    if flags:
        if not whole and not seen[d]:
            touched[n_touched] = d
            n_touched += 1
        seen[d] = True
    scores[d] += qw * w
    return n_touched


def add_postings(docs, first, shift, codes, start, n, qa, qb, scores, seen, touched, n_touched, flags, whole):
    """The loop every layout's scan ends in: for the ``n`` postings from ``start`` (the position of
    their weights or codes), document ``docs[first + i] - shift`` gains ``qa * code + qb`` (a float32
    weight: ``qa * weight``); ``flags``: keep the seen flags and, unless ``whole``, the touched list;
    returns the touched count. Numba only (the overload below): one posting at a time for 8-bit
    codes and float32 weights, two at a time for 4-bit ones, which then cost one byte load a pair (a
    posting at a time, the half-byte shift made them 1.5x slower:
    benchmarks/results/scale/one-million-4-bit.json)."""
    raise NotImplementedError("term_at_a_time.add_postings runs inside a Numba kernel only")


@overload(add_postings, inline="always")
def _add_postings(docs, first, shift, codes, start, n, qa, qb, scores, seen, touched, n_touched, flags, whole):
    if isinstance(codes, types.Array) and codes.dtype == types.int8:
        def pairs(docs, first, shift, codes, start, n, qa, qb, scores, seen, touched, n_touched, flags, whole):
            i = 0
            if n > 0 and start & 1:  # a run starting in a byte's high half
                n_touched = _add(np.int64(docs[first]) - shift, np.uint8(codes[start >> 1]) >> 4, qa, qb, scores, seen, touched, n_touched, flags,
                                 whole)
                i = 1
            while i + 1 < n:
                byte = np.uint8(codes[(start + i) >> 1])
                n_touched = _add(np.int64(docs[first + i]) - shift, byte & 15, qa, qb, scores, seen, touched, n_touched, flags, whole)
                n_touched = _add(np.int64(docs[first + i + 1]) - shift, byte >> 4, qa, qb, scores, seen, touched, n_touched, flags, whole)
                i += 2
            if i < n:
                n_touched = _add(np.int64(docs[first + i]) - shift, np.uint8(codes[(start + i) >> 1]) & 15, qa, qb, scores, seen, touched,
                                 n_touched, flags, whole)
            return n_touched
        return pairs
    if isinstance(codes, types.Array) and codes.dtype == types.float32:
        def weights(docs, first, shift, codes, start, n, qa, qb, scores, seen, touched, n_touched, flags, whole):
            for i in range(n):
                n_touched = _add_weight(np.int64(docs[first + i]) - shift, codes[start + i], qa, scores, seen, touched, n_touched, flags, whole)
            return n_touched
        return weights

    def each(docs, first, shift, codes, start, n, qa, qb, scores, seen, touched, n_touched, flags, whole):
        for i in range(n):
            n_touched = _add(np.int64(docs[first + i]) - shift, codes[start + i], qa, qb, scores, seen, touched, n_touched, flags, whole)
        return n_touched
    return each


def _affine(q_weight, scale, offset, t):
    """(qa, qb) of a query token on list ``t``. Numba only."""
    raise NotImplementedError


@overload(_affine, inline="always")
def _affine_overload(q_weight, scale, offset, t):
    if isinstance(scale, (types.NoneType, types.Omitted)):
        return lambda q_weight, scale, offset, t: (q_weight, q_weight)  # float32 weights: qb is not read
    return lambda q_weight, scale, offset, t: (q_weight * scale[t], q_weight * offset[t])


def _positive(postings, indptr, scale, offset, q_tokens, q_weights):
    """:func:`indexer.kernels.positive_query` where the layout takes the positive pass, else a
    constant False (so is float32 weights'). Numba only."""
    raise NotImplementedError


@overload(_positive, inline="always")
def _positive_overload(postings, indptr, scale, offset, q_tokens, q_weights):
    layout = _layout(postings)
    if layout is None:
        return None
    if isinstance(scale, (types.NoneType, types.Omitted)) or not layout.positive_pass:
        return lambda postings, indptr, scale, offset, q_tokens, q_weights: False
    return lambda postings, indptr, scale, offset, q_tokens, q_weights: positive_query(indptr, scale, offset, q_tokens, q_weights)


# --------------------------------------------------------------------- windows
@nb.njit(cache=True, inline="always")
def _windows(postings, n_docs, parts):
    """How many windows a search has: the layout's fixed ranges, else ``parts``."""
    bits = _traits(postings)[0]
    if bits > 0:
        return max(1, (n_docs + (1 << bits) - 1) >> bits)
    return max(1, parts)


@nb.njit(cache=True, inline="always")
def _window(postings, n_docs, parts, i):
    """The doc numbers [lo, hi) of window ``i``."""
    bits = _traits(postings)[0]
    if bits > 0:
        lo = np.int64(i) << bits
        return lo, min(lo + (1 << bits), np.int64(n_docs))
    return np.int64(n_docs) * i // parts, np.int64(n_docs) * (i + 1) // parts


def _score_window_py(postings, indptr, codes, scale, offset, q_tokens, q_weights, lo, hi, k, whole, room):
    """The top k (doc numbers relative to ``lo``, scores) of the documents [lo, hi). The
    accumulators are allocated here, not passed in: LLVM then knows they alias no input (3.6 ms a
    query against 4.1 ms passed in: indexer/kernels.py's 8-bit impacts set-up)."""
    # loop-invariant (a constant where the layout takes no positive pass): LLVM makes a loop of each case
    flags = not (whole and _positive(postings, indptr, scale, offset, q_tokens, q_weights))
    size = hi - lo
    scores = np.zeros(size, dtype=np.float32)
    seen = np.zeros(size if flags else 0, dtype=np.bool_)
    touched = np.empty(min(room, size), dtype=np.int32)
    buf = np.empty(_traits(postings)[1], dtype=np.int64)
    n_touched = 0
    for j in range(q_tokens.shape[0]):
        t = q_tokens[j]
        if t < 0 or t >= indptr.shape[0] - 1:
            continue
        qa, qb = _affine(q_weights[j], scale, offset, t)
        n_touched = scan(postings, indptr, t, lo, hi, buf, codes, qa, qb, scores, seen, touched, n_touched, flags, whole)
    if flags:
        return ranked(scores, seen, touched, n_touched, k, whole)
    return _top_k_positive(scores, k)


# Compiled twice from the one source: called where the windows run one after another, and inlined
# into the split search's parallel loop, whose body Numba compiles as a kernel of its own with its
# array arguments marked as not aliasing (parfor lowering's noalias): called from there instead, the
# 4-bit and bit-packed scans ran 2-9x slower (the 4-bit pairs and the block decode do not get that
# kernel's code; cisi, BM25 queries, contended cores, scratch measurement).
_score_window = nb.njit(_score_window_py)
_score_window_inline = nb.njit(inline="always")(_score_window_py)


# --------------------------------------------------------------------- the kernels
@nb.njit(cache=True)
def search_one(postings, indptr, codes, scale, offset, q_tokens, q_weights, n_docs, k, parts, whole_from):
    """Top-k (doc numbers int32, scores float32) of one query, best first, the windows one after
    another (one window unless the layout has fixed ranges or ``parts`` > 1)."""
    whole, room = accumulator_plan(indptr, q_tokens, n_docs, whole_from)
    n_w = _windows(postings, n_docs, parts)
    if n_w == 1:
        return _score_window(postings, indptr, codes, scale, offset, q_tokens, q_weights, 0, n_docs, k, whole, room)
    part_d = np.full((n_w, k), -1, dtype=np.int32)
    part_s = np.full((n_w, k), -np.inf, dtype=np.float32)
    for i in range(n_w):
        lo, hi = _window(postings, n_docs, parts, i)
        top_d, top_s = _score_window(postings, indptr, codes, scale, offset, q_tokens, q_weights, lo, hi, k, whole, room)
        part_d[i, : top_d.shape[0]] = top_d + lo
        part_s[i, : top_s.shape[0]] = top_s
    return _merge_parts(part_d, part_s, k)


@nb.njit(cache=True, parallel=True)
def search_split(postings, indptr, codes, scale, offset, q_tokens, q_weights, n_docs, k, parts, whole_from):
    """:func:`search_one` with the windows spread over Numba's threads: the same top k, bit for bit."""
    whole, room = accumulator_plan(indptr, q_tokens, n_docs, whole_from)
    n_w = _windows(postings, n_docs, parts)
    part_d = np.full((n_w, k), -1, dtype=np.int32)
    part_s = np.full((n_w, k), -np.inf, dtype=np.float32)
    for i in nb.prange(n_w):
        lo, hi = _window(postings, n_docs, parts, i)
        top_d, top_s = _score_window_inline(postings, indptr, codes, scale, offset, q_tokens, q_weights, lo, hi, k, whole, room)
        part_d[i, : top_d.shape[0]] = top_d + lo
        part_s[i, : top_s.shape[0]] = top_s
    return _merge_parts(part_d, part_s, k)


@nb.njit(cache=True, parallel=True)
def search_many(postings, indptr, codes, scale, offset, q_indptr, q_tokens, q_weights, n_docs, k):
    """Top-k of many queries (CSR-packed: query i owns q_tokens[q_indptr[i]:q_indptr[i+1]]), the
    queries spread over Numba's threads: (docs int32 (n_q, k), scores float32 (n_q, k)), rows with
    fewer than k matching documents padded with doc -1 and score -inf."""
    n_q = q_indptr.shape[0] - 1
    out_d = np.full((n_q, k), -1, dtype=np.int32)
    out_s = np.full((n_q, k), -np.inf, dtype=np.float32)
    for i in nb.prange(n_q):
        a, b = q_indptr[i], q_indptr[i + 1]
        top_d, top_s = search_one(postings, indptr, codes, scale, offset, q_tokens[a:b], q_weights[a:b], n_docs, k, 1, SCAN_WHOLE_FROM)
        out_d[i, : top_d.shape[0]] = top_d
        out_s[i, : top_s.shape[0]] = top_s
    return out_d, out_s


def search(postings, indptr, codes, scale, offset, q_tokens, q_weights, n_docs: int, k: int, parts: int = 1, parallel: bool = False,
           whole_from: float = SCAN_WHOLE_FROM):
    """One query's top k: :func:`search_split` where ``parts`` > 1 or ``parallel`` (the caller holds
    the parallel lock), else :func:`search_one`."""
    if parts > 1 or parallel:
        return search_split(postings, indptr, codes, scale, offset, q_tokens, q_weights, n_docs, k, parts, whole_from)
    return search_one(postings, indptr, codes, scale, offset, q_tokens, q_weights, n_docs, k, 1, whole_from)


__all__ = ["add_postings", "register", "scan", "search", "search_many", "search_one", "search_split"]
