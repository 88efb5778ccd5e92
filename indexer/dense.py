"""Optional dense channel: the pooled embeddings in a FAISS inner-product index.

Embeddings are L2-normalised before indexing, so inner product = cosine similarity.
``kind`` is a FAISS factory string: "Flat" (exact, default), "HNSW32", "IVF256,PQ16"...
"""
from __future__ import annotations

import os
import struct
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import numpy as np

from indexer.diskspace import save_npy, write_bytes
from indexer.errors import IndexFormatError
from indexer.integrity import load_npy
from indexer.regular_files import open_regular

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

    def __init__(self, index, projection: np.ndarray | None = None, row_doc: np.ndarray | None = None) -> None:
        self.index = index
        self.projection = projection
        # multi-vector documents (indexer/segments.py): the document number of each stored row
        self.row_doc = row_doc
        self.max_rows_per_doc = int(np.bincount(row_doc).max()) if row_doc is not None and len(row_doc) else 1

    @classmethod
    def build(cls, embeddings: np.ndarray, kind: str = "Flat", projection: np.ndarray | None = None, row_doc: np.ndarray | None = None) -> DenseIndex:
        import faiss

        x = normalise(embeddings @ projection if projection is not None else embeddings)
        index = faiss.index_factory(x.shape[1], kind, faiss.METRIC_INNER_PRODUCT)
        if not index.is_trained:
            index.train(x)
        index.add(x)
        if row_doc is not None and len(row_doc) != len(x):
            raise ValueError(f"{len(x)} vectors but {len(row_doc)} row -> document entries")
        return cls(index, projection, None if row_doc is None else np.asarray(row_doc, np.int64))

    @classmethod
    def build_from_chunks(
        cls, chunks: Callable[[], Iterator[np.ndarray]], kind: str = "Flat", projection: np.ndarray | None = None,
        row_doc: np.ndarray | None = None,
    ) -> DenseIndex:
        """:meth:`build` over embeddings that come in chunks (a build's shards), added chunk by
        chunk so that only one is in memory besides the index itself. A kind that must be
        trained first (IVF, PQ) is trained on all of them, which needs them all at once; but a
        scalar quantiser with min-max ranges (``SQ8``, ``SQ6``: a compact index's defaults; ``SQ4``) is
        trained on the per-dimension minima and maxima of every chunk, found in one more pass over
        them (its ranges, and so its file, are then those of training on all of them, in the memory
        of one chunk). ``row_doc``: as in :meth:`build`, the document of each row over all chunks."""
        import faiss

        index = None
        pending: list[np.ndarray] = []
        for chunk in chunks():
            x = normalise(chunk @ projection if projection is not None else chunk)
            if index is None:
                index = faiss.index_factory(x.shape[1], kind, faiss.METRIC_INNER_PRODUCT)
                if not index.is_trained and _min_max_trained(index):
                    lo, hi = x.min(axis=0), x.max(axis=0)
                    for other in chunks():
                        y = normalise(other @ projection if projection is not None else other)
                        lo, hi = np.minimum(lo, y.min(axis=0)), np.maximum(hi, y.max(axis=0))
                    index.train(np.stack([lo, hi]))
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
        if row_doc is not None and len(row_doc) != index.ntotal:
            raise ValueError(f"{index.ntotal} vectors but {len(row_doc)} row -> document entries")
        return cls(index, projection, None if row_doc is None else np.asarray(row_doc, np.int64))

    def save(self, directory: Path, name: str = DENSE_NAME) -> None:
        import faiss

        write_bytes(directory / f"{name}.faiss", faiss.serialize_index(self.index).data)
        if self.projection is not None:
            save_npy(directory / f"{name}_projection.npy", self.projection)
        if self.row_doc is not None:
            save_npy(directory / f"{name}_rows.npy", self.row_doc)

    @classmethod
    def load(cls, directory: Path, name: str = DENSE_NAME, n_docs: int | None = None, dim: int | None = None) -> DenseIndex:
        """Open a saved index, checked against what the manifest records (``n_docs`` vectors of
        ``dim`` dimensions); a mismatch or damaged file is an IndexFormatError naming it."""
        import faiss

        path = Path(directory) / f"{name}.faiss"
        proj_file = Path(directory) / f"{name}_projection.npy"
        projection = load_npy(proj_file, "float32", 2, mmap=False) if os.path.lexists(proj_file) else None
        if projection is not None and not np.isfinite(projection).all():
            raise IndexFormatError(f"{proj_file}: non-finite values")
        if projection is not None and dim is not None and projection.shape[1] != dim:
            raise IndexFormatError(f"{proj_file}: projects to {projection.shape[1]} dimensions, the manifest records {dim}")
        rows_file = Path(directory) / f"{name}_rows.npy"
        row_doc = load_npy(rows_file, "int64", 1, mmap=False) if os.path.lexists(rows_file) else None
        n_vectors = len(row_doc) if row_doc is not None else n_docs
        with open_regular(path) as f:
            check_faiss_header(path, f, n_vectors, dim)
            f.seek(0)
            try:
                # read through the descriptor just checked, not by path again
                index = faiss.read_index(faiss.PyCallbackIOReader(f.read))
            except Exception as exc:  # noqa: BLE001 - a damaged index must end as IndexFormatError; FAISS reports damage as a C++ RuntimeError with a multi-line trace
                raise IndexFormatError(f"{path}: unreadable FAISS index ({str(exc).splitlines()[0] if str(exc) else type(exc).__name__})") from None
        if row_doc is not None:
            if len(row_doc) and (row_doc.min() < 0 or (n_docs is not None and row_doc.max() >= n_docs)):
                raise IndexFormatError(f"{rows_file}: document numbers outside 0..{(n_docs or 0) - 1}")
            if n_docs is not None and len(np.unique(row_doc)) != n_docs:
                raise IndexFormatError(f"{rows_file}: {len(np.unique(row_doc))} documents have vectors, the manifest records {n_docs}")
        check_faiss(path, index, n_vectors, dim)
        return cls(index, projection, row_doc)

    def search(self, queries: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
        """(doc numbers int64 (n, k), cosine scores float32 (n, k)); -1 pads missing hits."""
        q = queries @ self.projection if self.projection is not None else queries
        with one_thread_for_one_query(len(q)):
            if self.row_doc is None:
                scores, docs = self.index.search(normalise(q), k)
                return docs, scores
            from indexer.segments import best_per_document

            # k documents need at most k * (rows of the longest document) rows: every row ranked
            # above a top-k document's best row belongs to one of the k-1 documents before it
            depth = min(self.index.ntotal, k * self.max_rows_per_doc)
            scores, rows = self.index.search(normalise(q), depth)
            return best_per_document(rows, scores, self.row_doc, k)


@contextmanager
def one_thread_for_one_query(n_queries: int) -> Iterator[None]:
    """FAISS's OpenMP pool cut to one thread (in the calling thread, restored after) while it
    searches a single query. FAISS splits a search by queries, so one query runs on one thread
    anyway; the parallel region still wakes the other threads, and on a core another runtime
    holds (the sentence encoder's or the LLM's threads, spinning after their forward) it waits
    for them to be scheduled (the encoder channel's search of adi's 82 vectors: 7.5 ms p50 against
    0.09 ms with one thread, two busy cores); and the woken threads spin after it, on the core the
    next query's sentence encoder needs: on two idle cores the default query's MiniLM forward took
    4.2-10.1 ms with one thread against 7.1-13.5 ms without, the whole query 13-29 % less
    (benchmarks/results/query-stages-fast/). Batches keep every thread."""
    if n_queries != 1:
        yield
        return
    import faiss

    before = faiss.omp_get_max_threads()
    faiss.omp_set_num_threads(1)
    try:
        yield
    finally:
        faiss.omp_set_num_threads(before)


def _min_max_trained(index) -> bool:
    """A FAISS scalar quantiser whose training is the per-dimension [min, max] of the vectors
    (uniform or non-uniform 8/6/4-bit, RS_minmax ranges): training on the two vectors of minima and
    maxima then gives what training on all the vectors gives (byte for byte, tests/test_compact.py)."""
    import faiss

    sq = faiss.downcast_index(index)
    if not isinstance(sq, faiss.IndexScalarQuantizer):
        return False
    q = sq.sq
    uniform = (faiss.ScalarQuantizer.QT_8bit_uniform, faiss.ScalarQuantizer.QT_4bit_uniform)
    per_dim = (faiss.ScalarQuantizer.QT_8bit, faiss.ScalarQuantizer.QT_4bit, faiss.ScalarQuantizer.QT_6bit)
    return q.rangestat == faiss.ScalarQuantizer.RS_minmax and q.rangestat_arg == 0 and q.qtype in uniform + per_dim


# FAISS's serialised header: a four-character code, then d (int32), ntotal (int64), two unused
# int64, is_trained (bool), metric_type (int32); the exact (Flat) kinds then hold one size_t
# count of floats and the floats. faiss/impl/index_write.cpp, write_index_header.
_FAISS_HEADER = struct.Struct("<4siqqq?i")
_FLAT_CODES = (b"IxFI", b"IxF2", b"IxFl")
# IndexScalarQuantizer after the common header: qtype, rangestat, rangestat_arg, d, code_size, len(trained)
_SQ_HEADER = struct.Struct("<iifQQQ")


def check_faiss_header(path: Path, f, n_vectors: int | None, dim: int | None) -> None:
    """The sizes a FAISS file declares, checked against the manifest and the file's size
    before FAISS reads it (and allocates what its header says)."""
    size = os.fstat(f.fileno()).st_size
    head = f.read(_FAISS_HEADER.size)
    if len(head) < _FAISS_HEADER.size:
        raise IndexFormatError(f"{path}: {size} bytes, too short for a FAISS index header")
    code, d, ntotal, _, _, _, metric = _FAISS_HEADER.unpack(head)
    if d <= 0 or ntotal < 0:
        raise IndexFormatError(f"{path}: header declares {ntotal} vectors of {d} dimensions")
    if n_vectors is not None and ntotal != n_vectors:
        raise IndexFormatError(f"{path}: header declares {ntotal} vectors, the manifest records {n_vectors}")
    if dim is not None and d != dim:
        raise IndexFormatError(f"{path}: header declares {d} dimensions, the manifest records {dim}")
    if code in _FLAT_CODES:
        if metric > 1:
            f.read(4)  # metric_arg
        raw = f.read(8)
        count = struct.unpack("<Q", raw)[0] if len(raw) == 8 else -1
        need = f.tell() + 4 * max(count, 0)
        if count != ntotal * d or need != size:
            raise IndexFormatError(f"{path}: header declares {max(count, 0)} floats ({need} bytes) for {ntotal} x {d}, the file holds {size} bytes")
    elif code == b"IxSQ":  # a scalar quantiser (compact indexes): its trained values, then the codes
        if metric > 1:
            f.read(4)
        raw = f.read(_SQ_HEADER.size)
        if len(raw) < _SQ_HEADER.size:
            raise IndexFormatError(f"{path}: {size} bytes, too short for a scalar quantiser header")
        _, _, _, sq_dim, code_size, n_trained = _SQ_HEADER.unpack(raw)
        if sq_dim != d or not 0 < code_size <= 4 * d or n_trained > 2 * d:
            raise IndexFormatError(f"{path}: scalar quantiser header declares {sq_dim} dimensions, {code_size} bytes a vector, "
                                   f"{n_trained} trained values for {d} dimensions")
        f.seek(4 * n_trained, os.SEEK_CUR)
        raw = f.read(8)
        count = struct.unpack("<Q", raw)[0] if len(raw) == 8 else -1
        need = f.tell() + max(count, 0)
        if count != ntotal * code_size or need != size:
            raise IndexFormatError(f"{path}: header declares {max(count, 0)} code bytes ({need} bytes) for {ntotal} x {code_size}, "
                                   f"the file holds {size} bytes")


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
