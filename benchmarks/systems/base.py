"""What every benchmark system is: settings, the System interface, index stats, and the registry."""
from __future__ import annotations

import importlib.metadata
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

import benchmarks  # noqa: F401  (cache locations before numba loads)
from benchmarks.datasets import Dataset
from benchmarks.timing import Stopwatch

Hits = list[tuple[str, float]]  # (doc id, score), best first


class SystemUnavailable(RuntimeError):
    """A requested system cannot run here (missing package, model...)."""


@dataclass
class Settings:
    """What every system of a run is configured with (recorded in the results).

    ``top_k`` / ``expansion_m`` default to the engine's own defaults, read at run time.
    ``work_dir``: where indexes are built (one sub-folder per dataset and system).
    """

    work_dir: Path
    model: str | None = None
    adapter: str = "default"
    top_k: int | None = None
    expansion_m: int | None = None
    dense_kind: str = "Flat"
    device: str | None = None
    progress: bool = True
    threads: int | None = None  # torch / FAISS threads after loading (None: the libraries' own choice)
    embedding_cache: Path | None = None  # reuse document embeddings across runs (embedder/cache.py)
    embedfilter_tau: int | None = None  # the "dense-ef" channel's τ (None: embedder.embedfilter.DEFAULT_TAU)
    lexical: str = "words"  # the "bm25" channel's analyser: "words" or "tokens"
    dtype: str = "auto"  # the LLM encoder's precision (embedder/hardware.py)
    runtime: str = "auto"  # how the LLM encoder runs: auto, torch or openvino
    encoder: str = "minilm"  # the "encoder" channel's sentence-transformers model (embedder/sentence_encoder.py)
    # fusion settings by channel subset ("bm25+encoder", "bm25+encoder+sparse", ...), e.g. the ones
    # experiments/fusion_cv.py --subsets chose on all collections (beir-eval --fusion-from); the
    # hybrid-* systems and bm25+minilm use them instead of their untuned fallbacks
    fusions: dict = field(default_factory=dict)
    segments: bool = False  # multi-vector documents (indexer/segments.py): whole documents, max/best over windows
    # what encodes queries for the LLM channels (Retriever query_encoder): auto, llm, distilled, none or a student's folder;
    # None: "auto" for the single modes and hybrid-*, the profile's for default and default-best
    query_encoder: str | None = None
    profile: str = "auto"  # the operating point of the `default` system (retriever/profiles.py; auto = fast)
    feedback: Any = None  # the hybrid's first-pass feedback (retriever.feedback.Feedback; None: none)
    sparse_pruning: Any = None  # the aligned-token channel searched pruned (retriever.pruning.SparsePruning; None: exact)


@dataclass
class IndexStats:
    """Index build cost and size for one dataset."""

    n_docs: int
    seconds: float
    bytes: int
    details: dict = field(default_factory=dict)

    def to_dict(self) -> dict:
        return {
            "n_docs": self.n_docs,
            "seconds": round(self.seconds, 3),
            "docs_per_s": round(self.n_docs / max(self.seconds, 1e-9), 2),
            "bytes": self.bytes,
            "bytes_per_doc": round(self.bytes / max(self.n_docs, 1), 1),
            **self.details,
        }


class System:
    """Base class: one retrieval system under test."""

    name: str = "?"
    description: str = ""

    def __init__(self, settings: Settings, shared: dict) -> None:
        self.settings = settings
        self.shared = shared  # objects shared by the systems of one run (e.g. the engine)

    def load(self) -> None:
        """Load models / start runtimes. Timed apart by the harness (not query time)."""

    def params(self) -> dict:
        """Everything that identifies this system's configuration."""
        return {}

    def index(self, ds: Dataset) -> IndexStats:
        raise NotImplementedError

    def warm_up(self, queries: list[str], k: int) -> None:
        """First encodes + searches: compile Numba kernels, warm the JVM's JIT and oneDNN.
        Timed apart by the harness, never counted as query time."""
        for q in queries:
            enc, _ = self.encode([q])
            self.search_all(enc, k)

    def forget_encodings(self) -> None:
        """Drop encodings kept from earlier calls (a system that keeps them overrides this), so
        that the next :meth:`encode` is measured, not recalled."""

    def encode(self, queries: list[str]) -> tuple[list[Any], list[float]]:
        """Encode each query on its own; returns (encodings, seconds per query)."""
        return list(queries), [0.0] * len(queries)

    def search(self, encoded: Any, k: int) -> Hits:
        raise NotImplementedError

    def search_all(self, encoded: list[Any], k: int) -> tuple[list[Hits], list[float]]:
        """Search each pre-encoded query on its own; returns (hits, seconds per query).

        Systems that run elsewhere (another process) override this to time each search
        where it runs, so that no inter-process round trip is counted.
        """
        hits, secs = [], []
        for enc in encoded:
            with Stopwatch() as sw:
                found = self.search(enc, k)
            hits.append(found)
            secs.append(sw.seconds)
        return hits, secs

    def close(self) -> None:
        """Free what :meth:`load` took."""


Factory = Callable[[Settings, dict], System]
REGISTRY: dict[str, tuple[Factory, str]] = {}


def register(name: str, description: str) -> Callable[[Factory], Factory]:
    """Add a system to the registry under ``name``."""

    def deco(factory: Factory) -> Factory:
        if name in REGISTRY:
            raise ValueError(f"system {name!r} registered twice")
        REGISTRY[name] = (factory, description)
        return factory

    return deco


def register_each(factory: Callable[..., System], variants: dict[str, tuple[str, dict]]) -> None:
    """Register one class under several names, each with its own keyword arguments:
    ``variants`` = {name: (description, kwargs)} (e.g. the Milvus systems, one per mode)."""
    for name, (description, kwargs) in variants.items():
        register(name, description)(partial(factory, **kwargs))


def make(name: str, settings: Settings, shared: dict) -> System:
    """Instantiate a registered system (raises KeyError with the known names)."""
    if name not in REGISTRY:
        raise KeyError(f"unknown system {name!r}; known: {', '.join(REGISTRY)}")
    system = REGISTRY[name][0](settings, shared)
    system.name = name
    system.description = REGISTRY[name][1]
    return system


def dir_bytes(path: Path, predicate: Callable[[Path], bool] = lambda p: True) -> int:
    """Bytes of the files under ``path`` that ``predicate`` keeps."""
    return sum(p.stat().st_size for p in Path(path).rglob("*") if p.is_file() and predicate(p))


def package_version(dist: str) -> str | None:
    """The installed version of a distribution, or None."""
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return None


def torch_threads() -> int | None:
    """The torch threads in use (recorded in the systems' params), or None without torch."""
    try:
        import torch

        return torch.get_num_threads()
    except ImportError:
        return None


def load_timed(system: System) -> float:
    """Load a system; returns the seconds it took (reported apart from query time)."""
    t0 = time.perf_counter()
    system.load()
    return time.perf_counter() - t0
