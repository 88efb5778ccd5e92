"""One interface for the engines that answer a channel's top-k: chosen by name.

A *backend* answers the per-channel searches of :class:`~retriever.retriever.Retriever`:

- ``"numba"``: this index's own files (Numba postings, FAISS), :mod:`retriever.backends.local`;
- ``"lucene"``: the aligned-token channel from a Pyserini/Lucene impact export
  (:mod:`retriever.backends.lucene`), the other channels from the index's own files;
- ``"milvus"``: a Milvus collection (Milvus Lite file or server, :mod:`retriever.backends.milvus`)
  for the sparse, dense and bm25 channels, the others from the index's own files.

The Retriever encodes a query once, hands each channel its query vector (sparse channels:
token or term ids with weights; dense channels: one vector) and fuses; it never asks which
engine answered. Backends are imported on first use: Lucene starts a JVM, Milvus a client.
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from indexer.channels import of_kind
from indexer.manifest import Manifest

# each channel's query_kind in the channel table (indexer/channels.py)
SPARSE_CHANNELS = of_kind("sparse")  # queried with (ids, weights): ("sparse", "bm25")
DENSE_CHANNELS = of_kind("dense")  # queried with one vector: ("dense", "dense-ef", "encoder")
BACKENDS = ("numba", "lucene", "milvus")


class Backend(Protocol):
    """What the Retriever needs from an engine. Doc numbers are the index's (0..n_docs-1);
    results are (doc numbers, scores), best first, padded with -1 when fewer than ``k``."""

    name: str

    def search_sparse(self, channel: str, ids: np.ndarray, weights: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
        """Top-k of a sparse channel ("sparse": aligned-token ids, "bm25": term ids) for one query."""
        ...

    def search_dense(self, channel: str, vector: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
        """Top-k of a dense channel ("dense", "dense-ef", "encoder") for one query vector."""
        ...

    def contributions(self, channel: str, ids: np.ndarray, doc: int) -> np.ndarray:
        """Document ``doc``'s weight for each query id of a sparse channel (0 where absent):
        the per-token explanation of a hit, in the units the backend scores with."""
        ...


def open_backend(name: str, index_dir: Path, manifest: Manifest, channels: dict[str, Any], **options: Any) -> Backend:
    """The backend called ``name`` over an opened index (``channels``: indexer.verify.open_channels).

    ``options``: ``lucene_index`` (the export directory) for "lucene"; ``milvus_uri`` (a
    Milvus Lite file or a server address), ``milvus_collection``, ``milvus_search_params``
    for "milvus". An option another backend needs is refused, so a typo is not ignored.
    """
    from retriever.backends.local import LocalBackend

    given = {k for k, v in options.items() if v is not None}
    local = LocalBackend(channels, options.get("sparse_pruning") if name == "numba" else None)
    wanted = {"numba": {"sparse_pruning"}, "lucene": {"lucene_index"}, "milvus": {"milvus_uri", "milvus_collection", "milvus_search_params"}}
    if name not in wanted:
        raise ValueError(f"backend must be one of {BACKENDS}, not {name!r}")
    if given - wanted[name]:
        raise ValueError(f"backend {name!r} takes no {', '.join(sorted(given - wanted[name]))}")
    if name == "numba":
        return local
    if name == "lucene":
        if options.get("lucene_index") is None:
            raise ValueError("backend 'lucene' needs lucene_index=<export directory> (build-index --export-pyserini)")
        from retriever.backends.lucene import LuceneBackend

        return Routed(LuceneBackend(index_dir, options["lucene_index"]), ("sparse",), local)
    if options.get("milvus_uri") is None:
        raise ValueError("backend 'milvus' needs milvus_uri=<Milvus Lite file or server address> (build-index --export-milvus)")
    from retriever.backends.milvus import MilvusBackend

    milvus = MilvusBackend(index_dir, manifest, os.fspath(options["milvus_uri"]), options.get("milvus_collection"), options.get("milvus_search_params"))
    return Routed(milvus, milvus.channels, local)


class Routed:
    """``primary`` answers its ``channels``, ``fallback`` (the index's own files) the rest."""

    def __init__(self, primary: Any, channels: tuple[str, ...], fallback: Backend) -> None:
        self.primary, self.channels, self.fallback = primary, tuple(channels), fallback
        self.name = primary.name

    def _for(self, channel: str) -> Any:
        return self.primary if channel in self.channels else self.fallback

    def search_sparse(self, channel: str, ids: np.ndarray, weights: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
        return self._for(channel).search_sparse(channel, ids, weights, k)

    def search_dense(self, channel: str, vector: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
        return self._for(channel).search_dense(channel, vector, k)

    def contributions(self, channel: str, ids: np.ndarray, doc: int) -> np.ndarray:
        # an engine that stores the index's weights unchanged (Milvus) leaves explanations to the
        # index's own postings; one that quantises them (Lucene) explains in its own units
        primary = self.primary if getattr(self.primary, "explains_hits", False) else self.fallback
        return (primary if channel in self.channels else self.fallback).contributions(channel, ids, doc)

    def __getattr__(self, attr: str) -> Any:  # engine-specific extras (e.g. Milvus's own hybrid rankers)
        return getattr(self.primary, attr)


__all__ = ["BACKENDS", "DENSE_CHANNELS", "SPARSE_CHANNELS", "Backend", "open_backend"]
