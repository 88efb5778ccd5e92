"""The index's own files as a backend: Numba postings (aligned tokens, BM25) and FAISS (dense)."""
from __future__ import annotations

from typing import Any

import numpy as np


class LocalBackend:
    """Answers every channel an index directory holds (``channels``: indexer.verify.open_channels)."""

    name = "numba"

    def __init__(self, channels: dict[str, Any]) -> None:
        self.channels = channels

    def _postings(self, channel: str):
        if channel == "sparse":
            return self.channels["sparse"]
        if channel == "bm25":
            return self.channels["bm25"].postings
        raise ValueError(f"{channel!r} is not a sparse channel")

    def search_sparse(self, channel: str, ids: np.ndarray, weights: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
        return self._postings(channel).search(ids, weights, k)

    def search_dense(self, channel: str, vector: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
        docs, scores = self.channels[channel].search(np.asarray(vector)[None, :], k)
        return docs[0], scores[0]

    def contributions(self, channel: str, ids: np.ndarray, doc: int) -> np.ndarray:
        return self._postings(channel).contributions(ids, doc)
