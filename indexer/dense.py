"""Optional dense channel: the pooled embeddings in a FAISS inner-product index.

Embeddings are L2-normalised before indexing, so inner product = cosine similarity.
``kind`` is a FAISS factory string: "Flat" (exact, default), "HNSW32", "IVF256,PQ16"...
"""
from __future__ import annotations

from pathlib import Path

import numpy as np

DENSE_FILE = "dense.faiss"


def normalise(x: np.ndarray) -> np.ndarray:
    x = np.ascontiguousarray(x, dtype=np.float32)
    return x / np.maximum(np.linalg.norm(x, axis=1, keepdims=True), 1e-12)


class DenseIndex:
    def __init__(self, index) -> None:
        self.index = index

    @classmethod
    def build(cls, embeddings: np.ndarray, kind: str = "Flat") -> "DenseIndex":
        import faiss

        x = normalise(embeddings)
        index = faiss.index_factory(x.shape[1], kind, faiss.METRIC_INNER_PRODUCT)
        if not index.is_trained:
            index.train(x)
        index.add(x)
        return cls(index)

    def save(self, directory: Path) -> None:
        import faiss

        faiss.write_index(self.index, str(directory / DENSE_FILE))

    @classmethod
    def load(cls, directory: Path) -> "DenseIndex":
        import faiss

        return cls(faiss.read_index(str(directory / DENSE_FILE)))

    def search(self, queries: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
        """(doc numbers int64 (n, k), cosine scores float32 (n, k)); -1 pads missing hits."""
        scores, docs = self.index.search(normalise(queries), k)
        return docs, scores
