"""The doc-number half of the postings codec (indexer/codec.py): what every doc layout provides.

A posting list's doc numbers are stored by one *doc layout* (int32, the bit-packed stream, 16-bit
offsets within ranges, ...): one module each (indexer/int32_docs.py, indexer/packed_docs.py,
indexer/range_docs.py), which describes itself with a :class:`DocLayout` and is registered in
:data:`indexer.codec.DOC_LAYOUTS`. Its in-memory form is a :class:`DocNumbers`: the index
(indexer/inverted_index.py) holds one and calls it for every search, lookup, export and save,
without knowing which layout it is. A layout stores only the doc numbers; ``postings_indptr`` and
the weights (float32, or 8- or 4-bit impact codes: the codec's impact width) stay at their posting
positions, whatever the layout.

Here, below every layout module, so that they import it and never the codec or the index.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

import numpy as np

from indexer import term_at_a_time
from indexer.kernels import SCAN_WHOLE_FROM


class DocNumbers:
    """The doc numbers of a CSR index's postings in one layout (``indptr`` is always the index's).

    A layout implements :meth:`decode`, :attr:`nbytes`, :meth:`save`, :meth:`find` and
    :attr:`postings` (its arrays for the search, after the tag its module registered with
    indexer/term_at_a_time.py: :meth:`search` and :meth:`search_many` are that driver's, whatever
    the layout); :meth:`contributions` and :meth:`add_dropped` have generic versions here (through
    :meth:`find`) that a layout may replace with a kernel.
    ``codes``, ``scale`` and ``offset`` are the index's weights: quantised impacts
    (``offset[t] + scale[t] * code``); float32 weights (``scale`` None) only where the layout
    accepts them (:attr:`DocLayout.float_weights`)."""

    layout: ClassVar[str] = ""  # the registered name (DocLayout.name)

    def decode(self, indptr: np.ndarray) -> np.ndarray:
        """Every posting's doc number (int32, nnz), in posting order."""
        raise NotImplementedError

    @property
    def nbytes(self) -> int:
        """Bytes of the doc numbers on disk."""
        raise NotImplementedError

    def save(self, directory: Path, prefix: str = "postings_") -> None:
        raise NotImplementedError

    def find(self, indptr: np.ndarray, t: int, doc: int) -> int:
        """The posting of ``doc`` in list ``t``, or -1."""
        raise NotImplementedError

    @property
    def postings(self) -> tuple:
        """``(tag, arrays...)``: what the layout's scan reads (indexer/term_at_a_time.py), its tag
        (what :func:`indexer.term_at_a_time.register` returned) first."""
        raise NotImplementedError

    def search(self, indptr, codes, scale, offset, q_tokens, q_weights, n_docs: int, k: int, parts: int = 1,
               whole_from: float = SCAN_WHOLE_FROM):
        """Top-k (doc numbers int32, scores float32) of one query, best first; ``parts`` > 1: split
        over Numba's threads (the same ranking, bit for bit; the caller holds the parallel lock).
        ``whole_from``: :func:`indexer.kernels.accumulator_plan`'s (0 or inf force one way, for tests)."""
        return term_at_a_time.search(self.postings, indptr, codes, scale, offset, q_tokens, q_weights, n_docs, k, parts, False, whole_from)

    def search_many(self, indptr, codes, scale, offset, q_indptr, q_tokens, q_weights, n_docs: int, k: int):
        """Top-k of many CSR-packed queries in parallel, padded with doc -1 and score -inf."""
        return term_at_a_time.search_many(self.postings, indptr, codes, scale, offset, q_indptr, q_tokens, q_weights, n_docs, k)

    def contributions(self, indptr, codes, scale, offset, q_tokens, doc: int) -> np.ndarray:
        """The document's weight for each query token (0 where the document lacks it)."""
        from indexer.kernels import code_at

        out = np.zeros(len(q_tokens), np.float32)
        n_lists = indptr.shape[0] - 1
        for j, t in enumerate(np.asarray(q_tokens, np.int64)):
            p = self.find(indptr, int(t), int(doc)) if 0 <= t < n_lists else -1
            if p >= 0:
                code = np.float32(code_at(codes, p))
                out[j] = code if scale is None else offset[t] + scale[t] * code
        return out

    def add_dropped(self, indptr, codes, scale, offset, cands, tokens, q_weights, scores) -> None:
        """``scores[i] += q_weight * weight`` for each of ``tokens`` that document ``cands[i]``
        holds (indexer/query_pruning.py's rescoring)."""
        for i, d in enumerate(cands):
            scores[i] += np.float32(np.dot(q_weights, self.contributions(indptr, codes, scale, offset, tokens, int(d))))


@dataclass(frozen=True)
class DocLayout:
    """One doc layout, as its module registers it (indexer/codec.py's table)."""

    name: str  # what a channel's manifest record names ("doc_layout")
    files: tuple[str, ...]  # its postings_<name>.npy files
    # (directory, indptr already checked, n_docs, mmap) -> DocNumbers, checked before any kernel reads them
    load: Callable[[Path, np.ndarray, int, bool], DocNumbers]
    # (indptr, int32 doc numbers ascending within each list, n_docs) -> DocNumbers
    encode: Callable[[np.ndarray, np.ndarray, int], DocNumbers]
    # saved postings_docs.npy (beside postings_indptr.npy) turned into this layout's files in place
    encode_saved: Callable[[Path, int], None]
    doc_ids: str | None = None  # the manifest's "doc_ids" of formats 4-7 (None: int32 or a layout newer than them)
    format_version: int | None = None  # the format of a compact index with it (formats 3-7); None: the codec's
    float_weights: bool = False  # also holds float32 weights (an index that is not compact)
    # its doc numbers are the CSR's own int32 array (postings_docs.npy), loaded and checked with the
    # CSR by indexer/integrity.py's check_csr, then handed to ``encode``; ``load`` is not called
    csr: bool = False
    option: str | None = None  # build-index --doc-ids NAME that builds it; None: read (and updated) only
    aliases: tuple[str, ...] = ()  # more --doc-ids names for it
    summary: str = ""


__all__ = ["DocLayout", "DocNumbers"]
