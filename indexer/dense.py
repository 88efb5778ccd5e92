"""Optional dense channel: the pooled embeddings in a FAISS inner-product index.

Embeddings are L2-normalised before indexing, so inner product = cosine similarity.
``kind`` is a FAISS factory string: "Flat" (exact, default), "HNSW32", "IVF256,PQ16"...
"""
from __future__ import annotations

from pathlib import Path
from typing import Callable, Iterator

import numpy as np

from indexer.integrity import load_npy
from indexer.manifest import IndexFormatError

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

    @classmethod
    def build_from_chunks(cls, chunks: Callable[[], Iterator[np.ndarray]], kind: str = "Flat", projection: np.ndarray | None = None) -> "DenseIndex":
        """:meth:`build` over embeddings that come in chunks (a build's shards), added chunk by
        chunk so that only one is in memory besides the index itself. A kind that must be
        trained first (IVF, PQ) is trained on all of them, which needs them all at once."""
        import faiss

        index = None
        pending: list[np.ndarray] = []
        for chunk in chunks():
            x = normalise(chunk @ projection if projection is not None else chunk)
            if index is None:
                index = faiss.index_factory(x.shape[1], kind, faiss.METRIC_INNER_PRODUCT)
            if index.is_trained:
                index.add(x)
            else:
                pending.append(x)
        if index is None:
            raise ValueError("no embeddings to index")
        if pending:
            x = np.concatenate(pending)
            index.train(x)
            index.add(x)
        return cls(index, projection)

    def save(self, directory: Path, name: str = DENSE_NAME) -> None:
        import faiss

        faiss.write_index(self.index, str(directory / f"{name}.faiss"))
        if self.projection is not None:
            np.save(directory / f"{name}_projection.npy", self.projection)

    @classmethod
    def load(cls, directory: Path, name: str = DENSE_NAME, n_docs: int | None = None, dim: int | None = None) -> "DenseIndex":
        """Open a saved index, checked against what the manifest records (``n_docs`` vectors of
        ``dim`` dimensions); a mismatch or damaged file is an IndexFormatError naming it."""
        import faiss

        path = Path(directory) / f"{name}.faiss"
        proj_file = Path(directory) / f"{name}_projection.npy"
        projection = load_npy(proj_file, "float32", 2, mmap=False) if proj_file.exists() else None
        if projection is not None and not np.isfinite(projection).all():
            raise IndexFormatError(f"{proj_file}: non-finite values")
        if projection is not None and dim is not None and projection.shape[1] != dim:
            raise IndexFormatError(f"{proj_file}: projects to {projection.shape[1]} dimensions, the manifest records {dim}")
        if not path.exists():
            raise IndexFormatError(f"{path}: missing")
        try:
            index = faiss.read_index(str(path))
        except Exception as exc:  # FAISS reports damage as a C++ RuntimeError with a multi-line trace
            raise IndexFormatError(f"{path}: unreadable FAISS index ({str(exc).splitlines()[0] if str(exc) else type(exc).__name__})") from None
        check_faiss(path, index, n_docs, dim)
        return cls(index, projection)

    def search(self, queries: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
        """(doc numbers int64 (n, k), cosine scores float32 (n, k)); -1 pads missing hits."""
        q = queries @ self.projection if self.projection is not None else queries
        scores, docs = self.index.search(normalise(q), k)
        return docs, scores


def check_faiss(path: Path, index, n_docs: int | None, dim: int | None) -> None:
    """Vector count, dimension and metric as the manifest records; for exact (Flat) indexes,
    also every stored vector finite and unit-length (or zero), which catches most flipped bytes."""
    import faiss

    if n_docs is not None and index.ntotal != n_docs:
        raise IndexFormatError(f"{path}: {index.ntotal} vectors, the manifest records {n_docs} documents")
    if dim is not None and index.d != dim:
        raise IndexFormatError(f"{path}: {index.d}-dimensional, the manifest records {dim}")
    if index.metric_type != faiss.METRIC_INNER_PRODUCT:
        raise IndexFormatError(f"{path}: metric {index.metric_type}, expected inner product ({faiss.METRIC_INNER_PRODUCT})")
    flat = faiss.downcast_index(index)
    if isinstance(flat, faiss.IndexFlat) and index.ntotal:
        x = faiss.rev_swig_ptr(flat.get_xb(), index.ntotal * index.d).reshape(index.ntotal, index.d)
        if not np.isfinite(x).all():
            raise IndexFormatError(f"{path}: non-finite vector components")
        norms = np.linalg.norm(x, axis=1)
        bad = np.flatnonzero((np.abs(norms - 1) > 1e-3) & (norms != 0))
        if bad.size:
            raise IndexFormatError(f"{path}: vector {int(bad[0])} has norm {float(norms[bad[0]]):.4g}, stored vectors are unit-length")
