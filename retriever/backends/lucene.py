"""Lucene backend: search a Pyserini export of an index with Pyserini's LuceneImpactSearcher.

The export (``indexer.exports.lucene``) holds the documents' aligned-token vectors with
integer impacts ``round(w * doc_scale)``. A query (token ids, weights) is turned into
``{spelling: round(w * query_scale)}`` and handed to ``LuceneImpactSearcher`` through a
pass-through query encoder; Lucene's score is ``sum(query_int * doc_int)`` over matched
tokens. ``min_idf=-1`` matters: with Pyserini's default (0) a query token whose idf is 0,
i.e. one that occurs in *every* document, is silently left out of the query.

:class:`LuceneBackend` answers like :class:`~indexer.inverted_index.InvertedIndex`
(``search`` / ``batch_search`` / ``contributions`` in the index's weight units, i.e. the
integer score divided by ``doc_scale * query_scale``), so a :class:`~retriever.retriever.Retriever`
can route sparse search to it; ``search_quantised`` gives Lucene's raw integer scores.
"""
from __future__ import annotations

import json
import os
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from indexer.build import DOC_IDS
from indexer.codec import PostingsCodec
from indexer.exports.lucene import check_export_matches, quantise_index, quantise_query, read_export, read_token_map
from indexer.inverted_index import InvertedIndex
from indexer.manifest import IndexFormatError, Manifest


class PassThroughEncoder:
    """A Pyserini query encoder for queries that are already ``{token: int weight}`` dicts."""

    def encode(self, query: dict[str, int], **kwargs) -> dict[str, int]:
        return query


class LuceneBackend:
    """Sparse search of an index through its Lucene impact export.

    ``index_dir``: the index the export was made from (checked: same documents, same model);
    its doc ids map Lucene's hits back to doc numbers and its postings explain hits.
    """

    name = "lucene"
    explains_hits = True  # quantised weights: explanations in Lucene's own units

    def __init__(self, index_dir: str | os.PathLike[str], export_dir: str | os.PathLike[str], query_scale: float | None = None) -> None:
        self.index_dir, self.export_dir = Path(index_dir), Path(export_dir)
        info = read_export(self.export_dir)
        check_export_matches(info, self.index_dir)
        if not info.get("lucene_index"):
            raise IndexFormatError(f"{self.export_dir}: exported without a Lucene index (rebuild the export with Lucene)")
        self.info = info
        self.doc_scale = float(info["quantisation"]["doc_scale"])
        self.query_scale = float(query_scale if query_scale is not None else info["quantisation"]["query_scale"])
        self.unit = self.doc_scale * self.query_scale  # integer score / unit ~ float score
        self.spellings = read_token_map(self.export_dir)
        self.doc_ids: list[str] = json.loads((self.index_dir / DOC_IDS).read_text(encoding="utf-8"))
        self._number = {d: i for i, d in enumerate(self.doc_ids)}
        self._quantised: InvertedIndex | None = None

        from indexer.exports.lucene_jvm import import_pyserini

        lucene = import_pyserini()  # starts the JVM (seconds) on first use
        self.searcher = lucene.LuceneImpactSearcher(str(self.export_dir / info["lucene_index"]), PassThroughEncoder(), min_idf=-1)

    @property
    def n_docs(self) -> int:
        return len(self.doc_ids)

    def query_vector(self, tokens: np.ndarray, weights: np.ndarray | None = None) -> dict[str, int]:
        """The Lucene query: ``{spelling: integer weight}`` (tokens rounding below 1 dropped)."""
        tokens = np.asarray(tokens, dtype=np.int64)
        weights = np.ones(len(tokens), np.float32) if weights is None else np.asarray(weights)
        valid = (tokens >= 0) & (tokens < len(self.spellings))
        toks, w = quantise_query(tokens[valid], weights[valid], self.query_scale)
        vec: dict[str, int] = {}
        for t, c in zip(toks.tolist(), w.tolist()):
            s = self.spellings[t]
            vec[s] = vec.get(s, 0) + c  # a repeated token adds up, as in the Numba kernel
        return vec

    # ------------------------------------------------------------------ raw Lucene
    def search_quantised(self, tokens: np.ndarray, weights: np.ndarray | None = None, k: int = 10) -> tuple[np.ndarray, np.ndarray]:
        """Top-k (doc numbers int32, Lucene's integer scores as float64), best first; ties
        come in Anserini's order (external doc id, as a string)."""
        vec = self.query_vector(tokens, weights)
        if not vec:
            return np.zeros(0, np.int32), np.zeros(0, np.float64)
        hits = self.searcher.search(vec, int(k))
        docs = np.fromiter((self._number[h.docid] for h in hits), dtype=np.int32, count=len(hits))
        # Anserini's ScoreTiesAdjusterReranker rounds scores to 1e-4 and takes 1e-6 off each
        # further document of a tie (so that trec_eval keeps its docid order); every exact
        # score here is an integer, so rounding to the nearest one undoes that.
        scores = np.rint(np.fromiter((h.score for h in hits), dtype=np.float64, count=len(hits)))
        return docs, scores

    def batch_search_quantised(self, queries: Sequence[tuple[np.ndarray, np.ndarray]], k: int = 10) -> tuple[np.ndarray, np.ndarray]:
        """Top-k of many queries; padded with doc -1 / score -inf like ``InvertedIndex.batch_search``."""
        out_d = np.full((len(queries), k), -1, dtype=np.int32)
        out_s = np.full((len(queries), k), -np.inf, dtype=np.float64)
        for i, (t, w) in enumerate(queries):
            d, s = self.search_quantised(t, w, k)
            out_d[i, : len(d)] = d
            out_s[i, : len(s)] = s
        return out_d, out_s

    # ------------------------------------------------------------------ InvertedIndex-like
    def search(self, q_tokens: np.ndarray, q_weights: np.ndarray | None = None, k: int = 10) -> tuple[np.ndarray, np.ndarray]:
        """Top-k (doc numbers, float64 scores in weight units: integer score / (doc_scale * query_scale))."""
        d, s = self.search_quantised(q_tokens, q_weights, k)
        return d, s / self.unit  # float64: float32 could merge close scores (ulp 0.016 at 2e5)

    def batch_search(self, queries: Sequence[tuple[np.ndarray, np.ndarray]], k: int = 10) -> tuple[np.ndarray, np.ndarray]:
        d, s = self.batch_search_quantised(queries, k)
        return d, s / self.unit

    # ------------------------------------------------------------------ the Backend interface
    def search_sparse(self, channel: str, ids: np.ndarray, weights: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
        """The aligned-token channel through Lucene (retriever/backends/__init__.py)."""
        if channel != "sparse":
            raise ValueError(f"the Lucene export holds the aligned-token channel only, not {channel!r}")
        return self.search(ids, weights, k)

    def contributions(self, channel: str, ids: np.ndarray, doc: int) -> np.ndarray:
        """The document's quantised weight (divided by doc_scale) for each query token."""
        if channel != "sparse":
            raise ValueError(f"the Lucene export holds the aligned-token channel only, not {channel!r}")
        return self.quantised_index().contributions(ids, doc) / np.float32(self.doc_scale)

    def quantised_index(self) -> InvertedIndex:
        """The Numba index over the very integers Lucene holds (built on first use)."""
        if self._quantised is None:
            manifest = Manifest.read(self.index_dir)
            self._quantised, _ = quantise_index(InvertedIndex.load(self.index_dir, manifest.n_docs,
                                                                 codec=PostingsCodec.of_record(manifest.record("sparse"), self.index_dir, "sparse")),
                                                 self.doc_scale)
        return self._quantised

    def close(self) -> None:
        self.searcher.close()
