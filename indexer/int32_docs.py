"""Doc numbers as int32, one a posting (``postings_docs.npy``; formats 1-3, and 6 with them): the
reference layout, the only one that also holds float32 weights (an index that is not compact).

Its search is indexer/term_at_a_time.py's driver with :func:`_scan` (a list's postings are one run;
a window short of the whole collection found by binary search); this module is its entry in the
codec (indexer/codec.py) and :class:`Int32Docs`, its :class:`indexer.doc_numbers.DocNumbers`.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numba as nb
import numpy as np

from indexer import kernels, term_at_a_time
from indexer.diskspace import save_npy
from indexer.doc_numbers import DocLayout, DocNumbers
from indexer.integrity import load_npy

NAME = "int32"
FILE = "docs"  # postings_docs.npy


@dataclass
class Int32Docs(DocNumbers):
    """Every posting's doc number, int32, ascending within each list."""

    docs: np.ndarray
    layout = NAME

    def decode(self, indptr: np.ndarray) -> np.ndarray:
        return self.docs

    @property
    def nbytes(self) -> int:
        return int(self.docs.nbytes)

    def save(self, directory: Path, prefix: str = "postings_") -> None:
        save_npy(Path(directory) / f"{prefix}{FILE}.npy", self.docs)

    def find(self, indptr, t: int, doc: int) -> int:
        lo, hi = int(indptr[t]), int(indptr[t + 1])
        p = lo + int(np.searchsorted(self.docs[lo:hi], doc))
        return p if p < hi and self.docs[p] == doc else -1

    @property
    def postings(self) -> tuple:
        return (TAG, self.docs)

    def contributions(self, indptr, codes, scale, offset, q_tokens, doc: int) -> np.ndarray:
        q_tokens = np.asarray(q_tokens, np.int64)
        if scale is None:
            return kernels.contributions(indptr, self.docs, codes, q_tokens, doc)
        return kernels.contributions_u8(indptr, self.docs, codes, scale, offset, q_tokens, doc)

    def add_dropped(self, indptr, codes, scale, offset, cands, tokens, q_weights, scores) -> None:
        order = np.argsort(cands, kind="stable")
        added = np.zeros(cands.shape[0], np.float32)
        none = np.zeros(0, np.float32)
        _add_dropped(np.asarray(indptr, np.int64), self.docs, codes, none if scale is None else scale, none if offset is None else offset,
                     np.asarray(cands, np.int32)[order], tokens, q_weights, added)
        scores[order] += added


@nb.njit(cache=True)
def _add_dropped(indptr, docs, weights, scale, offset, cands, tokens, q_weights, scores):
    """``scores[i] += q_weight * doc weight`` for each token of ``tokens`` that document ``cands[i]``
    holds (``cands`` ascending: each binary search starts where the previous one ended). 8-bit
    impacts where ``scale`` is not empty (weight = offset[t] + scale[t] * code, as the kernels read
    them). One call for all candidates: measured ~10x faster than one
    :meth:`InvertedIndex.contributions` call per candidate (~4.5 µs of call overhead each)."""
    quantised = scale.shape[0] > 0
    n_lists = indptr.shape[0] - 1
    for j in range(tokens.shape[0]):
        t = tokens[j]
        if t < 0 or t >= n_lists:
            continue
        start, hi = indptr[t], indptr[t + 1]
        for i in range(cands.shape[0]):
            d = cands[i]
            lo, up = start, hi
            while lo < up:
                mid = (lo + up) >> 1
                if docs[mid] < d:
                    lo = mid + 1
                else:
                    up = mid
            start = lo
            if lo < hi and docs[lo] == d:
                w = offset[t] + scale[t] * np.float32(kernels.code_at(weights, lo)) if quantised else np.float32(kernels.code_at(weights, lo))
                scores[i] += q_weights[j] * w


def _scan(postings, indptr, t, lo, hi, buf, codes, qa, qb, scores, seen, touched, n_touched, flags, whole):
    """List ``t``'s postings with doc numbers in ``[lo, hi)`` (the whole list where the window holds
    it: no search) to the window's accumulators (indexer/term_at_a_time.py)."""
    docs = postings[1]
    a, b = indptr[t], indptr[t + 1]
    if a < b and docs[a] < lo:
        a += np.searchsorted(docs[a:b], lo)
    if a < b and docs[b - 1] >= hi:
        b = a + np.searchsorted(docs[a:b], hi)
    return term_at_a_time.add_postings(docs, a, lo, codes, a, b - a, qa, qb, scores, seen, touched, n_touched, flags, whole)


TAG = term_at_a_time.register(NAME, _scan, __file__)


def search(indptr, docs, codes, q_tokens, q_weights, n_docs: int, k: int, scale=None, offset=None, parts: int = 1,
           whole_from: float = kernels.SCAN_WHOLE_FROM):
    """Top-k (doc numbers int32, scores float32) of one query on int32 doc numbers ``docs`` and
    ``codes`` (float32 weights, or 8- or 4-bit codes with ``scale`` and ``offset``): the driver's
    search, ``parts`` > 1 split over Numba's threads (for tests and studies; an index calls
    :meth:`Int32Docs.search`)."""
    return Int32Docs(docs).search(indptr, codes, scale, offset, q_tokens, q_weights, n_docs, k, parts, whole_from)


def _load(directory: Path, indptr: np.ndarray, n_docs: int, mmap: bool = True) -> Int32Docs:
    # not called by InvertedIndex.load (csr=True: checked with the CSR there); for completeness
    return Int32Docs(load_npy(Path(directory) / f"postings_{FILE}.npy", "int32", 1, mmap))


def _int32(docs: np.ndarray) -> np.ndarray:
    """``docs`` as they are where int32 (a memory map stays one), else converted."""
    return docs if isinstance(docs, np.ndarray) and docs.dtype == np.int32 else np.asarray(docs, np.int32)


LAYOUT = DocLayout(
    name=NAME, files=(FILE,), load=_load, encode=lambda indptr, docs, n_docs: Int32Docs(_int32(docs)),
    encode_saved=lambda directory, n_docs: None, doc_ids=None, format_version=3, float_weights=True, csr=True, option="int32",
    summary="int32 doc numbers, 4 bytes a posting (postings_docs.npy)",
)

__all__ = ["LAYOUT", "NAME", "TAG", "Int32Docs", "search"]
