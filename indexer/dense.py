"""Optional dense channel: the pooled embeddings in a FAISS inner-product index.

Embeddings are L2-normalised before indexing, so inner product = cosine similarity.
``kind`` is a FAISS factory string: "Flat" (exact, default), "HNSW32", "IVF256,PQ16"...
"""
from __future__ import annotations

from pathlib import Path

import numpy as np

DENSE_NAME = "dense"
EMBEDFILTER_NAME = "dense_ef"
ENCODER_NAME = "encoder"  # an external sentence-transformers encoder's embeddings (build-index --encoder)
DENSE_FILE = f"{DENSE_NAME}.faiss"


def normalise(x: np.ndarray) -> np.ndarray:
    x = np.ascontiguousarray(x, dtype=np.float32)
    return x / np.maximum(np.linalg.norm(x, axis=1, keepdims=True), 1e-12)


class DenseIndex:
    """A FAISS index of (optionally projected) embeddings; ``projection`` (d, k) is applied
    to documents at build time and to queries at search time (EmbedFilter)."""

    def __init__(self, index, projection: np.ndarray | None = None) -> None:
        self.index = index
        self.projection = projection

    @classmethod
    def build(cls, embeddings: np.ndarray, kind: str = "Flat", projection: np.ndarray | None = None) -> "DenseIndex":
        import faiss

        x = normalise(embeddings @ projection if projection is not None else embeddings)
        index = faiss.index_factory(x.shape[1], kind, faiss.METRIC_INNER_PRODUCT)
        if not index.is_trained:
            index.train(x)
        index.add(x)
        return cls(index, projection)

    def save(self, directory: Path, name: str = DENSE_NAME) -> None:
        import faiss

        faiss.write_index(self.index, str(directory / f"{name}.faiss"))
        if self.projection is not None:
            np.save(directory / f"{name}_projection.npy", self.projection)

    @classmethod
    def load(cls, directory: Path, name: str = DENSE_NAME) -> "DenseIndex":
        import faiss

        proj_file = directory / f"{name}_projection.npy"
        projection = np.load(proj_file) if proj_file.exists() else None
        return cls(faiss.read_index(str(directory / f"{name}.faiss")), projection)

    def search(self, queries: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
        """(doc numbers int64 (n, k), cosine scores float32 (n, k)); -1 pads missing hits."""
        q = queries @ self.projection if self.projection is not None else queries
        scores, docs = self.index.search(normalise(q), k)
        return docs, scores
