"""The systems a benchmark run compares: a registry of name -> system, one module per family.

- :mod:`~benchmarks.systems.base`: Settings, the System interface, IndexStats, the registry;
- :mod:`~benchmarks.systems.engine`: this project's Retriever modes (one shared engine per run);
- :mod:`~benchmarks.systems.exported`: the index exported to Lucene (Pyserini) and Milvus Lite;
- :mod:`~benchmarks.systems.baselines`: Pyserini BM25, all-MiniLM-L6-v2, all-mpnet-base-v2, and BM25 fused with each.

A system indexes a :class:`~benchmarks.datasets.Dataset`, encodes queries one at a time
(timed per query) and searches one pre-encoded query at a time (timed per query), so
that the harness can report search alone and end to end (encoding + search) for every
system the same way. Everything a system loads once (models, the JVM) is timed apart
and never counted as query time; so is the first call that compiles (Numba) or warms up
(JIT, oneDNN).

Add a system by decorating a factory with :func:`register`; a search mode of this
project's ``Retriever`` needs only its mode and the index channels it uses::

    @register("hybrid", "this project: sparse + dense + BM25 channels, fused")
    class Hybrid(AlignedTokensSystem):
        mode = "hybrid"
        build_options = {"dense": True, "lexical": "words"}

The aligned-token systems share one :class:`AlignedTokensEngine` per run: one index built
with every channel they need serves all of them, and queries are encoded once.
"""
from __future__ import annotations

# importing the family modules registers their systems, in this order (the registry's, shown by `beir-eval`)
# isort: off
from benchmarks.systems import engine  # noqa: F401
from benchmarks.systems import exported  # noqa: F401
from benchmarks.systems import baselines  # noqa: F401
# isort: on
from benchmarks.systems.base import (
    REGISTRY,
    Hits,
    IndexStats,
    Settings,
    System,
    SystemUnavailable,
    load_timed,
    make,
    register,
)
from benchmarks.systems.baselines import MINILM_DIST, MPNET_DISTS, minilm_dir, mpnet_dir
from benchmarks.systems.engine import ENCODER_SUBSET_FALLBACKS, AlignedTokensEngine, AlignedTokensSystem, shared_engine

__all__ = [
    "ENCODER_SUBSET_FALLBACKS", "MINILM_DIST", "MPNET_DISTS", "REGISTRY", "AlignedTokensEngine", "AlignedTokensSystem", "Hits", "IndexStats",
    "Settings", "System", "SystemUnavailable", "load_timed", "make", "minilm_dir", "mpnet_dir", "register", "shared_engine",
]
