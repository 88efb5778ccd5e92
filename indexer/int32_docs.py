"""Doc numbers as int32, one a posting (``postings_docs.npy``; formats 1-3, and 6 with them): the
reference layout, the only one that also holds float32 weights (an index that is not compact).

Its kernels are indexer/kernels.py's (the CSR scoring loops every other layout is measured against);
this module is its entry in the codec (indexer/codec.py) and :class:`Int32Docs`, its
:class:`indexer.doc_numbers.DocNumbers`.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numba as nb
import numpy as np

from indexer import kernels
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

    def search(self, indptr, codes, scale, offset, q_tokens, q_weights, n_docs, k, parts=1):
        if parts > 1:
            if scale is None:
                return kernels.search_one_split(indptr, self.docs, codes, q_tokens, q_weights, n_docs, k, parts)
            return kernels.search_one_u8_split(indptr, self.docs, codes, scale, offset, q_tokens, q_weights, n_docs, k, parts)
        if scale is None:
            return kernels.search_one(indptr, self.docs, codes, q_tokens, q_weights, n_docs, k)
        return kernels.search_one_u8(indptr, self.docs, codes, scale, offset, q_tokens, q_weights, n_docs, k)

    def search_many(self, indptr, codes, scale, offset, q_indptr, q_tokens, q_weights, n_docs, k):
        if scale is None:
            return kernels.search_many(indptr, self.docs, codes, q_indptr, q_tokens, q_weights, n_docs, k)
        return kernels.search_many_u8(indptr, self.docs, codes, scale, offset, q_indptr, q_tokens, q_weights, n_docs, k)

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

__all__ = ["LAYOUT", "NAME", "Int32Docs"]
