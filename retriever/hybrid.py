"""The hybrid search: each channel the fusion reads answers with its top :data:`FUSION_DEPTH`,
optionally the sparse query is fed back from the others' first documents (retriever/feedback.py),
and the lists are fused (retriever/fusion.py) here or, for Milvus's rankers, inside the backend.
"""
from __future__ import annotations

from typing import Any

import numpy as np

from indexer.channels import spec
from retriever.channel_search import ChannelSearch
from retriever.feedback import Feedback, FeedbackExpander
from retriever.fusion import COMPLETION_DEPTH, FusedDoc, Fusion
from retriever.query import EncodedQuery

FUSION_DEPTH = 100  # hits taken from each channel before fusing


class HybridSearch:
    """Fuses the channels of ``channels`` (a :class:`ChannelSearch`) with a :class:`Fusion`;
    ``expander`` expands sparse queries where a search asks for feedback."""

    def __init__(self, channels: ChannelSearch, expander: FeedbackExpander) -> None:
        self.channels = channels
        self.expander = expander

    def search(
        self, q: EncodedQuery, fusion: Fusion, used: list[str], k: int, mask: np.ndarray | None = None, feedback: Feedback | None = None
    ) -> tuple[EncodedQuery, list[FusedDoc]]:
        """(the query as the sparse channel searched it, the top ``k`` fused documents) for the
        channels ``used``; with ``feedback``, the sparse query is first expanded from the other
        channels' fused first pass. A fusion made inside the backend (Milvus's) takes no ``mask``
        and no ``feedback``: the Retriever refuses both before asking."""
        if fusion.in_engine:
            return q, self._in_engine(q, fusion, used, k)
        # a completed fusion reads deeper lists for the scores of the candidates (retriever/fusion.py)
        deep = max(COMPLETION_DEPTH, FUSION_DEPTH) if fusion.complete else FUSION_DEPTH
        if feedback is not None and "sparse" in used and q.tokens.size:
            lists = {m: self.channels.search(q, m, deep, mask) for m in used if m != "sparse"}
            q = self.with_feedback(q, lists, fusion, feedback)
            lists["sparse"] = self.channels.search(q, "sparse", deep, mask)
        else:
            lists = {m: self.channels.search(q, m, deep, mask) for m in used}
        return q, fusion.fuse(lists, k, FUSION_DEPTH)

    def with_feedback(
        self, q: EncodedQuery, first_pass: dict[str, tuple[np.ndarray, np.ndarray]], fusion: Fusion, feedback: Feedback
    ) -> EncodedQuery:
        """``q`` with its sparse side expanded from the top ``feedback.docs`` documents of
        ``first_pass`` ({channel: (doc numbers, scores)}, fused by ``fusion``; where it is
        empty, the sparse channel's own top documents)."""
        if first_pass:
            docs = np.array([f.doc for f in fusion.fuse(first_pass, feedback.docs, FUSION_DEPTH)], np.int64)
        else:
            docs, _ = self.channels.search(q, "sparse", feedback.docs)
            docs = docs[docs >= 0]
        return self.expander.expand(q, docs, feedback)

    def _in_engine(self, q: EncodedQuery, fusion: Fusion, used: list[str], k: int) -> list[FusedDoc]:
        """Fused by the backend itself (Milvus's WeightedRanker / RRFRanker, fusion method
        "milvus-weighted" / "milvus-rrf"): each channel's top FUSION_DEPTH, ranked by Milvus."""
        engine = self.channels.engine
        queries: dict[str, Any] = {}
        held = getattr(engine, "channels", ())  # the channels the collection holds (retriever/backends: Routed)
        for m in used:
            if m not in held:
                raise ValueError(f"fusion method {fusion.method!r}: channel {m!r} is not in the Milvus collection (give it weight 0)")
            queries[m] = self.channels.query(q, spec(m))
        docs, scores = engine.hybrid(queries, fusion.weights, k, fusion.method, FUSION_DEPTH, fusion.rrf_k, fusion.norm_score)
        return [FusedDoc(d, s, {}) for d, s in zip(docs.tolist(), scores.tolist()) if d >= 0]
