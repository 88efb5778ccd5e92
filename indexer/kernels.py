"""Scoring kernels of the inverted index: Numba (fast) beside NumPy/SciPy (reference).

The search loop itself, one for every doc layout and impact width, is indexer/term_at_a_time.py's
driver; here are the parts it and the layouts share (the accumulators' top k, the plan, the impact
readers), the lookups of the int32 layout, the quantisation and the reference search.

The index is CSR by token: the postings of token t are ``docs[indptr[t]:indptr[t+1]]``
(ascending doc numbers) with ``weights`` alongside. A query is a set of token ids with
weights; score(q, d) = sum over matched tokens of q_weight * d_weight (Eq. 16 of
text-is-worth-several-tokens uses q_weight = 1). Ties are broken by the lower doc number
so that every implementation returns the same ranking.

Two ways to find the top k in the accumulators, chosen per query from its posting count
(:func:`scan_whole`). A query that reads few postings lists the documents it touches as it first
meets them and ranks only those. From :data:`SCAN_WHOLE_FROM` postings per document on, a flag is
set per posting without a branch and all accumulators are ranked in one pass: the list costs a
branch per posting that the CPU cannot predict once many documents are touched, the pass a read of
every accumulator. Both sum the same terms in the same order, so the ranking is the same, bit for
bit (benchmarks/results/scale/accumulators*.json: a study deleted once settled: git show ed91196:benchmarks/studies/accumulators.py).
"""
from __future__ import annotations

import numba as nb
import numpy as np
import scipy.sparse as sp
from numba import types
from numba.extending import overload

# 4-bit impacts (format 6, indexer/compact.py): two codes a byte, posting p's in the low half of byte
# p // 2 when p is even, in the high half when p is odd. Their bytes reach the kernels as an int8 view
# (NIBBLES): the element type, not a flag, tells Numba which reader to compile, so the 8-bit and
# float32 kernels compile as before, with no test in their loops.
NIBBLES = np.dtype(np.int8)


def code_at(codes: np.ndarray, p: int):
    """Posting ``p``'s code (or float32 weight): ``codes[p]``, or its half byte where ``codes`` is a
    :data:`NIBBLES` view. Plain Python here; in a kernel, the overload below."""
    if codes.dtype == NIBBLES:
        return (int(codes[p >> 1 : (p >> 1) + 1].view(np.uint8)[0]) >> ((p & 1) << 2)) & 15
    return codes[p]


@overload(code_at, inline="always")
def _code_at(codes, p):
    if isinstance(codes, types.Array) and codes.dtype == types.int8:
        return lambda codes, p: (np.uint8(codes[p >> 1]) >> ((p & 1) << 2)) & 15
    return lambda codes, p: codes[p]


def pack_nibbles(codes: np.ndarray) -> np.ndarray:
    """uint8 codes below 16, one a posting, as two a byte (:data:`NIBBLES`' layout; uint8, odd counts padded with 0)."""
    codes = np.asarray(codes, np.uint8)
    if codes.size and int(codes.max()) > 15:
        raise ValueError(f"4-bit impacts: a code of {int(codes.max())} does not fit half a byte")
    padded = np.zeros(2 * ((codes.shape[0] + 1) // 2), np.uint8)
    padded[: codes.shape[0]] = codes
    return padded[0::2] | (padded[1::2] << 4)


def unpack_nibbles(packed: np.ndarray, n: int) -> np.ndarray:
    """The ``n`` uint8 codes that :func:`pack_nibbles` packed."""
    packed = np.asarray(packed).view(np.uint8)
    out = np.empty(2 * packed.shape[0], np.uint8)
    out[0::2], out[1::2] = packed & 15, packed >> 4
    return out[:n]


@nb.njit(cache=True, inline="always")
def _worse(s_a: float, d_a: int, s_b: float, d_b: int) -> bool:
    """Is (s_a, d_a) ranked below (s_b, d_b)?"""
    return s_a < s_b or (s_a == s_b and d_a > d_b)


@nb.njit(cache=True)
def _sift_down(hs: np.ndarray, hd: np.ndarray, i: int, n: int) -> None:
    # min-heap on rank: the root is the worst of the kept candidates
    while True:
        left = 2 * i + 1
        if left >= n:
            return
        child = left
        right = left + 1
        if right < n and _worse(hs[right], hd[right], hs[left], hd[left]):
            child = right
        if _worse(hs[child], hd[child], hs[i], hd[i]):
            hs[i], hs[child] = hs[child], hs[i]
            hd[i], hd[child] = hd[child], hd[i]
            i = child
        else:
            return


@nb.njit(cache=True)
def _top_k(scores: np.ndarray, touched: np.ndarray, n_touched: int, k: int) -> tuple[np.ndarray, np.ndarray]:
    """Partial selection of the k best touched docs with a size-k heap: O(n log k)."""
    k = min(k, n_touched)
    hs = np.empty(k, dtype=np.float32)
    hd = np.empty(k, dtype=np.int32)
    for j in range(k):
        hs[j] = scores[touched[j]]
        hd[j] = touched[j]
    for j in range(k // 2 - 1, -1, -1):
        _sift_down(hs, hd, j, k)
    for j in range(k, n_touched):
        d = touched[j]
        if k > 0 and _worse(hs[0], hd[0], scores[d], d):
            hs[0] = scores[d]
            hd[0] = d
            _sift_down(hs, hd, 0, k)
    # heap-sort in place: repeatedly move the worst to the end -> best first
    for end in range(k - 1, 0, -1):
        hs[0], hs[end] = hs[end], hs[0]
        hd[0], hd[end] = hd[end], hd[0]
        _sift_down(hs, hd, 0, end)
    return hd, hs


# Postings per document from which a query's accumulators are ranked in one pass over all of them:
# the two ways cross between 0.2 and 0.3 on 262,144 and on 1,048,576 synthetic documents (2-core
# Xeon, one thread; git show ed91196:benchmarks/studies/accumulators.py).
SCAN_WHOLE_FROM = 0.25


@nb.njit(cache=True)
def query_postings(indptr, q_tokens) -> int:
    """How many postings the query reads (unknown tokens read none)."""
    total = 0
    for j in range(q_tokens.shape[0]):
        t = q_tokens[j]
        if 0 <= t < indptr.shape[0] - 1:
            total += indptr[t + 1] - indptr[t]
    return total


@nb.njit(cache=True)
def accumulator_plan(indptr, q_tokens, n_docs, whole_from=SCAN_WHOLE_FROM) -> tuple[bool, int]:
    """(rank in one pass?, room for the touched list) of a query: one pass where it reads at least
    ``whole_from`` postings per document (and any at all), else a touched list with room for one
    entry a posting, never more than the documents (not one as long as the index: a short query
    would pay for it). The kernels take ``whole_from`` too: 0 ranks every query in one pass, ``inf``
    every query through the touched list (for measuring them)."""
    total = query_postings(indptr, q_tokens)
    whole = total > 0 and total >= whole_from * n_docs
    return whole, 0 if whole else min(total, n_docs)


@nb.njit(cache=True)
def scan_whole(indptr, q_tokens, n_docs, whole_from=SCAN_WHOLE_FROM) -> bool:
    """Do the search kernels rank this query's accumulators in one pass (:func:`accumulator_plan`)?"""
    return accumulator_plan(indptr, q_tokens, n_docs, whole_from)[0]


@nb.njit(cache=True)
def _kept(hs: np.ndarray, hd: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """A size-k min-heap whose room not yet taken holds (-inf, -1), heap-sorted in place: its
    taken entries best first."""
    for end in range(k - 1, 0, -1):
        hs[0], hs[end] = hs[end], hs[0]
        hd[0], hd[end] = hd[end], hd[0]
        _sift_down(hs, hd, 0, end)
    n = 0
    while n < k and hd[n] >= 0:
        n += 1
    return hd[:n], hs[:n]


@nb.njit(cache=True)
def _top_k_flagged(scores: np.ndarray, seen: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """The k best flagged documents, best first, in one ascending pass: a later document that
    ties the worst kept one ranks below it, so a strict comparison keeps the tie-break."""
    hs = np.full(k, -np.inf, dtype=np.float32)
    hd = np.full(k, -1, dtype=np.int32)  # (-inf, -1): room not yet taken
    worst = hs[0] if k > 0 else np.float32(np.inf)
    # -inf added to an unflagged document's score, 0 to a flagged one's: arithmetic, not a branch
    # on the flag, which the CPU cannot predict where the flags are mixed
    bar = np.array([-np.inf, 0.0], dtype=np.float32)
    for d in range(scores.shape[0]):
        if scores[d] + bar[np.int64(seen[d])] > worst:
            hs[0] = scores[d]
            hd[0] = d
            _sift_down(hs, hd, 0, k)
            worst = hs[0]
    return _kept(hs, hd, k)


@nb.njit(cache=True)
def _top_k_positive(scores: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """The k best documents of positive score, best first, in one ascending pass: where every
    posting adds a positive amount (:func:`positive_query`), those are the touched ones, and no flag is needed."""
    hs = np.full(k, -np.inf, dtype=np.float32)
    hd = np.full(k, -1, dtype=np.int32)
    bar = np.float32(0.0) if k > 0 else np.float32(np.inf)
    for d in range(scores.shape[0]):
        if scores[d] > bar:
            hs[0] = scores[d]
            hd[0] = d
            _sift_down(hs, hd, 0, k)
            bar = max(hs[0], np.float32(0.0))
    return _kept(hs, hd, k)


@nb.njit(cache=True)
def positive_query(indptr, scale, offset, q_tokens, q_weights) -> bool:
    """Does every posting the query reads (8-bit impacts) add a positive amount to its document's
    score? So where each query token's weight and its list's offset (the lowest level) are positive
    and its scale is not negative (``q * offset + q * scale * code`` >= ``q * offset`` > 0 in float32,
    and a sum of positive float32 stays positive): then a document was touched exactly where its score is above 0."""
    for j in range(q_tokens.shape[0]):
        t = q_tokens[j]
        if t < 0 or t >= indptr.shape[0] - 1 or indptr[t] == indptr[t + 1]:
            continue
        if not (q_weights[j] > 0 and q_weights[j] * offset[t] > 0 and scale[t] >= 0):
            return False
    return True


@nb.njit(cache=True)
def ranked(scores, seen, touched, n_touched, k, whole):
    """The top k of a query's accumulators, by whichever way they were kept."""
    if whole:
        return _top_k_flagged(scores, seen, k)
    return _top_k(scores, touched, n_touched, k)


@nb.njit(cache=True)
def contributions(indptr, docs, weights, q_tokens, doc):
    """Weight of each query token in one document's vector (0 where absent): binary search
    in each posting list, which is sorted by doc number."""
    out = np.zeros(q_tokens.shape[0], dtype=np.float32)
    for j in range(q_tokens.shape[0]):
        t = q_tokens[j]
        if t < 0 or t >= indptr.shape[0] - 1:
            continue
        lo, hi = indptr[t], indptr[t + 1]
        p = lo + np.searchsorted(docs[lo:hi], doc)
        if p < hi and docs[p] == doc:
            out[j] = weights[p]
    return out


# --------------------------------------------------------------------- 8-bit impacts
# A compact index (indexer/compact.py) stores each weight as a uint8 code with an affine map per
# posting list: weight = offset[t] + scale[t] * code. The map is folded into the query weight once
# per query token (a = q_weight * scale[t], b = q_weight * offset[t]), so a posting costs one
# multiply-add, as in the float32 kernel, on a quarter of the weight bytes. The scores are those of
# the float32 kernels on the dequantised weights up to float32 rounding (tests/test_compact.py).
# Measured (50k synthetic Zipfian documents x 512 tokens, 80-token queries reading 2.3M postings,
# 2 shared AVX2 cores, medians of 12 interleaved rounds): 3.6 ms a query, against 3.7-3.9 for the
# float32 kernel and 4.1 for a 256-entry table of q_weight * level (exact, but a dependent load).


@nb.njit(cache=True)
def quantise_lists(indptr, weights, codes, scale, offset, levels=256):
    """Per posting list t: scale[t], offset[t] (float32) and codes[p] (uint8) with
    offset + scale * code = the weight rounded to the nearest of ``levels`` (2-256) levels spanning
    the list's [min, max] (error at most scale / 2). A list of one value gets scale 0 and code 0 (exact)."""
    top = np.float64(levels - 1)
    for t in range(indptr.shape[0] - 1):
        a, b = indptr[t], indptr[t + 1]
        if a == b:
            scale[t] = 0.0
            offset[t] = 0.0
            continue
        lo = weights[a]
        hi = weights[a]
        for p in range(a + 1, b):
            w = weights[p]
            lo = min(lo, w)
            hi = max(hi, w)
        s = np.float32((np.float64(hi) - np.float64(lo)) / top)
        offset[t] = lo
        scale[t] = s
        for p in range(a, b):
            if s > 0:
                c = np.rint((np.float64(weights[p]) - np.float64(lo)) / np.float64(s))
                codes[p] = np.uint8(min(max(c, 0.0), top))
            else:
                codes[p] = np.uint8(0)


@nb.njit(cache=True, inline="always")
def _level(scale, offset, t, v):
    """The weight code ``v`` of list ``t`` stands for (float32, as :func:`dequantise` computes it)."""
    return offset[t] + scale[t] * np.float32(v)


@nb.njit(cache=True)
def dequantise(indptr, codes, scale, offset):
    """float32 weights of every posting: offset[t] + scale[t] * code."""
    out = np.empty(indptr[-1], dtype=np.float32)
    for t in range(indptr.shape[0] - 1):
        for p in range(indptr[t], indptr[t + 1]):
            out[p] = _level(scale, offset, t, code_at(codes, p))
    return out


@nb.njit(cache=True)
def contributions_u8(indptr, docs, codes, scale, offset, q_tokens, doc):
    """:func:`contributions` on 8-bit impacts (the dequantised weights)."""
    out = np.zeros(q_tokens.shape[0], dtype=np.float32)
    for j in range(q_tokens.shape[0]):
        t = q_tokens[j]
        if t < 0 or t >= indptr.shape[0] - 1:
            continue
        lo, hi = indptr[t], indptr[t + 1]
        p = lo + np.searchsorted(docs[lo:hi], doc)
        if p < hi and docs[p] == doc:
            out[j] = _level(scale, offset, t, code_at(codes, p))
    return out


# ------------------------------------------------------------ one query, several threads
# One query's postings split by document range (indexer/term_at_a_time.py's windows): each range
# scored into accumulators of its own keeps its top k, and the ranges' lists are merged here. Each
# document is scored by one range, adding its query tokens in the same order as a search in one
# piece: the scores and the ranking are that search's, bit for bit. Worth it only where a query
# reads many postings; each range pays a binary search per query token and a top-k of its own
# (InvertedIndex.search splits a query from SPLIT_MIN_POSTINGS postings on).
@nb.njit(cache=True)
def _merge_parts(part_d, part_s, k):
    """The k best of the parts' top-k lists (each best first, padded with doc -1)."""
    parts, width = part_d.shape
    head = np.zeros(parts, dtype=np.int64)
    out_d = np.empty(k, dtype=np.int32)
    out_s = np.empty(k, dtype=np.float32)
    n = 0
    while n < k:
        best = -1
        for i in range(parts):
            h = head[i]
            if h < width and part_d[i, h] >= 0 and (best < 0 or _worse(part_s[best, head[best]], part_d[best, head[best]], part_s[i, h], part_d[i, h])):
                best = i
        if best < 0:
            break
        out_d[n] = part_d[best, head[best]]
        out_s[n] = part_s[best, head[best]]
        head[best] += 1
        n += 1
    return out_d[:n], out_s[:n]


# --------------------------------------------------------------------- reference
def reference_search(
    indptr: np.ndarray, docs: np.ndarray, weights: np.ndarray, q_tokens: np.ndarray, q_weights: np.ndarray, n_docs: int, k: int
) -> tuple[np.ndarray, np.ndarray]:
    """Brute-force SciPy version of the search (indexer/term_at_a_time.py): full matrix-vector product, full sort."""
    vocab = indptr.shape[0] - 1
    term_doc = sp.csr_matrix((weights, docs, indptr), shape=(vocab, n_docs))
    q = np.zeros(vocab, dtype=np.float64)
    valid = (q_tokens >= 0) & (q_tokens < vocab)
    np.add.at(q, q_tokens[valid], q_weights[valid])
    scores = np.asarray(term_doc.T @ q).ravel().astype(np.float32)
    matched = np.asarray((term_doc.T != 0) @ (q != 0)).ravel() > 0
    cand = np.flatnonzero(matched)
    order = np.lexsort((cand, -scores[cand]))[:k]  # score desc, then doc number asc
    return cand[order].astype(np.int32), scores[cand[order]]
