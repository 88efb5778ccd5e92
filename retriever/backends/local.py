"""The index's own files as a backend: Numba postings (aligned tokens, BM25) and FAISS (dense)."""
from __future__ import annotations

from typing import Any

import numpy as np

from indexer.channels import of_kind
from indexer.query_pruning import pruned_search


class LocalBackend:
    """Answers every channel an index directory holds (``channels``: indexer.verify.open_channels)."""

    name = "numba"

    def __init__(self, channels: dict[str, Any], sparse_pruning: Any = None) -> None:
        """``sparse_pruning``: a retriever.pruning.SparsePruning; the aligned-token channel is then
        searched pruned (indexer.query_pruning.pruned_search), else exactly."""
        self.channels = channels
        self.sparse_pruning = sparse_pruning

    def _postings(self, channel: str):
        """A sparse channel's inverted index: the channel itself (aligned tokens), or the one it
        scores with (BM25's ``postings``)."""
        if channel not in of_kind("sparse"):
            raise ValueError(f"{channel!r} is not a sparse channel")
        opened = self.channels[channel]
        return getattr(opened, "postings", opened)

    def search_sparse(self, channel: str, ids: np.ndarray, weights: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
        if channel == "sparse" and self.sparse_pruning is not None:
            p = self.sparse_pruning
            return pruned_search(self._postings(channel), ids, weights, k, p.keep_mass, p.depth)
        return self._postings(channel).search(ids, weights, k)

    def search_dense(self, channel: str, vector: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
        docs, scores = self.channels[channel].search(np.asarray(vector)[None, :], k)
        return docs[0], scores[0]

    def contributions(self, channel: str, ids: np.ndarray, doc: int) -> np.ndarray:
        return self._postings(channel).contributions(ids, doc)
