"""Each channel's search, as its row of the channel table (indexer/channels.py) says: the query
it needs (the aligned tokens, the LLM state, the analysed BM25 terms, the sentence encoder's
embedding) asked of the backend (retriever/backends) by its query kind, and a metadata filter
applied by reading the channel ever deeper until enough documents pass.
"""
from __future__ import annotations

import functools
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from indexer.channels import ANALYSED_TERMS, ENCODER_EMBEDDING, LITERAL_TOKENS, LLM_STATE, ChannelSpec, spec
from retriever.backends import Backend
from retriever.query import EncodedQuery

# analysed BM25 queries kept (by text): a search analyses its query once, for the channel and
# for every hit's explanation, and a filtered search asks the channel again, deeper
ANALYSED_CACHE = 256


class ChannelSearch:
    """Searches one channel at a time. ``engine``: the backend answering the channels;
    ``channels``: {mode: the opened channel} of the index; ``analyze``: the BM25 analyser of
    the index's lexical channel (None without one); ``n_docs``: documents in the index."""

    def __init__(self, engine: Backend, channels: Mapping[str, Any], analyze: Callable[[str], list[str]] | None, n_docs: int) -> None:
        self.engine = engine
        self.channels = dict(channels)
        self.analyze = analyze
        self.n_docs = n_docs
        # thread-safe; per instance (a cached method would keep every index it ever saw alive)
        self._analysed = functools.lru_cache(maxsize=ANALYSED_CACHE)(self._analyse)

    def terms(self, mode: str, text: str) -> tuple[np.ndarray, np.ndarray, list[str]]:
        """The query ``text`` as channel ``mode`` (one that needs analysed terms) reads it:
        (term ids, weights, terms as analysed), analysed once per text; shared by every caller,
        so never changed in place."""
        return self._analysed(mode, text)

    def _analyse(self, mode: str, text: str) -> tuple[np.ndarray, np.ndarray, list[str]]:
        return self.channels[mode].encode_query(self.analyze(text))

    def query(self, q: EncodedQuery, row: ChannelSpec) -> Any:
        """``q`` as channel ``row`` is searched with: (ids, weights) for a sparse query kind, one
        vector for a dense one; ValueError where ``q`` was encoded without what the channel needs."""
        mode, needs = row.mode, row.query_needs
        if LLM_STATE in needs and q.embedding.size == 0 and not (LITERAL_TOKENS in needs and q.query_encoder == "none"):
            if q.query_encoder == "none":
                raise ValueError(f"mode {mode!r}: a query encoded with query_encoder 'none' has no embedding to search it with")
            raise ValueError(f"mode {mode!r}: the query was encoded without the LLM (Retriever.encode(queries, mode={mode!r}))")
        if ENCODER_EMBEDDING in needs:
            if mode not in q.encoder_embeddings:
                raise ValueError(f"mode {mode!r}: the query was encoded without the encoder of that channel (Retriever.encode(queries, mode={mode!r}))")
            return q.encoder_embeddings[mode]
        if ANALYSED_TERMS in needs:
            terms, weights, _ = self.terms(mode, q.text)
            return terms, weights
        return (q.tokens, q.weights) if row.query_kind == "sparse" else q.embedding

    def search(self, q: EncodedQuery, mode: str, k: int, mask: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
        """Channel ``mode``'s (doc numbers, scores), best first, -1 padded; with ``mask``, its best
        documents among those the mask lets through (read ever deeper until k pass or the
        channel has no more)."""
        if mask is None:
            return self._search_all(q, mode, k)
        depth = max(4 * k, 64)
        while True:
            depth = min(depth, self.n_docs)
            docs, scores = self._search_all(q, mode, depth)
            keep = (docs >= 0) & mask[np.maximum(docs, 0)]
            if keep.sum() >= k or depth >= self.n_docs or (docs < 0).any():
                docs, scores = docs[keep][:k], scores[keep][:k]
                pad = k - len(docs)
                return np.concatenate([docs, np.full(pad, -1, docs.dtype)]), np.concatenate([scores, np.full(pad, -np.inf, scores.dtype)])
            depth *= 4

    def _search_all(self, q: EncodedQuery, mode: str, k: int) -> tuple[np.ndarray, np.ndarray]:
        row = spec(mode)
        query = self.query(q, row)
        if row.query_kind == "sparse":
            return self.engine.search_sparse(mode, *query, k)
        return self.engine.search_dense(mode, query, k)
