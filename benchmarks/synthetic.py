"""Synthetic aligned-token vectors: what the scale studies search instead of encoded documents.

Each document gets K distinct token ids drawn from a Zipfian distribution over the vocabulary (token r
has probability ~ 1 / r**s; draws are repeated until K distinct tokens are found, so frequent tokens
saturate at "in nearly every document" as real aligned tokens do) and logits uniform in the range the
default model gives its top 512 tokens. Queries: distinct Zipfian tokens with IDF weights, as the
Retriever weights them. Used by experiments.scale (and the split-search study, deleted since).
:func:`zipf_documents` draws the same documents (the same distribution, another random stream) in
Numba, ~30x faster, for the ten-million-document run (experiments.ten_million).
:func:`fitted_shard` draws documents like a real index instead (its tokens' document frequencies and
its weights; experiments.real_vectors).
"""
from __future__ import annotations

import numba as nb
import numpy as np

VOCAB = 49152  # SmolLM2's vocabulary, the default backbone
LOGIT_RANGE = (15.0, 35.0)


def zipf_cdf(vocab: int, s: float, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """(cumulative probabilities over a shuffled vocabulary, the shuffle): rank r -> token perm[r]."""
    p = 1.0 / np.arange(1, vocab + 1, dtype=np.float64) ** s
    return np.cumsum(p / p.sum()), np.random.default_rng(seed).permutation(vocab).astype(np.int32)


def synthetic_shard(n: int, k: int, cdf: np.ndarray, perm: np.ndarray, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """``n`` documents x ``k`` distinct Zipfian tokens with logits sorted high to low."""
    rng = np.random.default_rng(seed)
    tokens = draw_tokens(rng, n, k, cdf, perm)
    weights = -np.sort(-rng.uniform(*LOGIT_RANGE, size=(n, k)).astype(np.float32), axis=1)
    return tokens, weights


def fitted_cdf(df: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(cumulative probabilities, identity order) drawing token t in proportion to ``df[t]``, its
    document frequency in a real index: documents drawn from it have that index's posting-list
    lengths, token by token (up to the saturation of frequent tokens, as in a real index)."""
    p = np.asarray(df, np.float64)
    if p.sum() <= 0:
        raise ValueError("an index with no postings cannot be fitted")
    cdf = np.cumsum(p / p.sum())
    cdf[-1] = 1.0  # no draw past the last token from rounding
    return cdf, np.arange(p.shape[0], dtype=np.int32)


def fitted_shard(n: int, k: int, cdf: np.ndarray, weight_pool: np.ndarray, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """``n`` documents x ``k`` distinct tokens drawn by :func:`fitted_cdf`, with weights drawn from
    ``weight_pool`` (a real index's weights) and sorted high to low."""
    rng = np.random.default_rng(seed)
    tokens = draw_tokens(rng, n, k, cdf, np.arange(cdf.shape[0], dtype=np.int32))
    weights = -np.sort(-rng.choice(np.asarray(weight_pool, np.float32), size=(n, k)), axis=1)
    return tokens, weights


def draw_tokens(rng: np.random.Generator, n: int, k: int, cdf: np.ndarray, perm: np.ndarray) -> np.ndarray:
    """``n`` rows of ``k`` distinct tokens: rank r drawn with probability cdf[r] - cdf[r - 1], mapped to perm[r]."""
    tokens = np.empty((n, k), np.int32)
    draws = 4 * k
    for lo in range(0, n, 1024):
        hi = min(n, lo + 1024)
        ranks = np.searchsorted(cdf, rng.random((hi - lo, draws))).astype(np.int32)  # int32: a faster sort
        ranks.sort(axis=1)
        dup = np.zeros_like(ranks, dtype=bool)
        dup[:, 1:] = ranks[:, 1:] == ranks[:, :-1]
        if int((~dup).sum(axis=1).min()) < k:
            raise ValueError(f"fewer than {k} distinct tokens in {draws} draws: lower --zipf-s")
        keys = rng.random(ranks.shape)
        keys[dup] = 2.0  # duplicates are never among the k chosen
        pick = np.argpartition(keys, k - 1, axis=1)[:, :k]
        tokens[lo:hi] = perm[np.take_along_axis(ranks, pick, axis=1)]
    return tokens


def alias_table(p: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Walker's alias table (Vose's construction) of the distribution ``p``: draw i uniform in
    0..n-1 and u uniform in [0, 1); the draw is i where u < prob[i], else alias[i]. O(1) a draw."""
    p = np.asarray(p, np.float64)
    n = p.shape[0]
    scaled = p / p.sum() * n
    prob = np.ones(n, np.float64)
    alias = np.arange(n, dtype=np.int32)
    small = [i for i in range(n) if scaled[i] < 1.0]
    large = [i for i in range(n) if scaled[i] >= 1.0]
    while small and large:
        s, g = small.pop(), large.pop()
        prob[s], alias[s] = scaled[s], g
        scaled[g] -= 1.0 - scaled[s]
        (small if scaled[g] < 1.0 else large).append(g)
    return prob, alias  # what is left has probability 1 (up to rounding): prob 1, its own alias


def zipf_table(vocab: int, s: float) -> tuple[np.ndarray, np.ndarray]:
    """:func:`alias_table` of the Zipfian ranks of :func:`zipf_cdf` (rank r ~ 1 / (r + 1)**s)."""
    return alias_table(1.0 / np.arange(1, vocab + 1, dtype=np.float64) ** s)


CHUNK = 1024  # documents drawn from one seed: a document's draws depend on (seed, its chunk) only


@nb.njit(cache=True, parallel=True)
def _zipf_documents(first, n, k, prob, alias, perm, seed, lo, hi, tokens, weights):
    vocab = prob.shape[0]
    draws = 4 * k
    n_chunks = (n + CHUNK - 1) // CHUNK
    short = 0
    for c in nb.prange(n_chunks):
        np.random.seed(seed * 1_000_003 + (first // CHUNK) + c)
        stamp = np.full(vocab, -1, np.int64)
        distinct = np.empty(draws, np.int32)
        spacing = np.empty(k + 1, np.float64)
        for i in range(c * CHUNK, min(n, (c + 1) * CHUNK)):
            nd = 0
            for _ in range(draws):
                u = np.random.random() * vocab
                r = min(np.int64(u), vocab - 1)
                if u - r >= prob[r]:
                    r = alias[r]
                if stamp[r] != i:
                    stamp[r] = i
                    distinct[nd] = r
                    nd += 1
            if nd < k:
                short += 1
                continue
            for j in range(k):  # k of the distinct ranks, uniformly (a partial Fisher-Yates shuffle)
                m = j + np.random.randint(0, nd - j)
                distinct[j], distinct[m] = distinct[m], distinct[j]
                tokens[i, j] = perm[distinct[j]]
            # k sorted uniforms from k + 1 exponential spacings (no sort), high to low
            total = 0.0
            for j in range(k + 1):
                total += -np.log(1.0 - np.random.random())
                spacing[j] = total
            for j in range(k):
                weights[i, j] = np.float32(lo + (hi - lo) * spacing[k - 1 - j] / total)
    return short


def zipf_documents(first: int, n: int, k: int, prob: np.ndarray, alias: np.ndarray, perm: np.ndarray, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Documents ``first`` .. ``first + n - 1`` of the corpus :func:`synthetic_shard` draws (K distinct
    Zipfian tokens out of 4K draws, chosen uniformly among the distinct ones; logits uniform in
    :data:`LOGIT_RANGE`, high to low), drawn in Numba over its threads from (``seed``, the document's
    chunk of :data:`CHUNK`): the same documents whichever shards ask for them (``first`` a multiple of CHUNK)."""
    if first % CHUNK:
        raise ValueError(f"first must be a multiple of {CHUNK}")
    tokens = np.empty((n, k), np.int32)
    weights = np.empty((n, k), np.float32)
    short = _zipf_documents(first, n, k, prob, alias, perm, seed, LOGIT_RANGE[0], LOGIT_RANGE[1], tokens, weights)
    if short:
        raise ValueError(f"fewer than {k} distinct tokens in {4 * k} draws for {short} documents: lower --zipf-s")
    return tokens, weights


def make_queries(n: int, m: int, cdf: np.ndarray, perm: np.ndarray, df: np.ndarray, n_docs: int, seed: int) -> list[tuple[np.ndarray, np.ndarray]]:
    """``n`` queries of ``m`` distinct Zipfian tokens, IDF-weighted as the Retriever weights them."""
    rng = np.random.default_rng(seed)
    idf = np.log((n_docs + 1) / (df + 1)).astype(np.float32)
    out = []
    for _ in range(n):
        ranks = np.unique(np.searchsorted(cdf, rng.random(8 * m)))
        toks = perm[rng.permutation(ranks)[:m]].astype(np.int64)
        out.append((toks, idf[toks]))
    return out



def first_documents(indptr: np.ndarray, docs: np.ndarray, weights: np.ndarray, n: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The postings of documents 0..n-1 only (doc numbers ascend in every list): a smaller index cut from a larger one."""
    keep = docs < n
    kept_before = np.concatenate([[0], np.cumsum(keep)])
    return kept_before[indptr].astype(np.int64), np.ascontiguousarray(docs[keep]), np.ascontiguousarray(weights[keep])


__all__ = ["CHUNK", "LOGIT_RANGE", "VOCAB", "alias_table", "draw_tokens", "first_documents", "fitted_cdf", "fitted_shard", "make_queries", "synthetic_shard", "zipf_cdf", "zipf_documents", "zipf_table"]

