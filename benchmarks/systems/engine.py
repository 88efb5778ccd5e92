"""This project's engine as benchmark systems: one system per Retriever mode (sparse, dense, dense-ef,
bm25, hybrid, encoder, and the hybrids of the encoder channel's subsets), all served by one
:class:`AlignedTokensEngine` per run: one index built with every channel they need, queries encoded once.
"""
from __future__ import annotations

import itertools
import json
import time
from collections.abc import Callable, Mapping
from fnmatch import fnmatch
from pathlib import Path
from typing import Any

from benchmarks.datasets import Dataset
from benchmarks.systems.base import Hits, IndexStats, Settings, System, SystemUnavailable, register, register_each, torch_threads
from benchmarks.timing import Stopwatch

# documents of the untimed warm-up build (AlignedTokensEngine._warm_build): enough for the calibration's
# minimum of 20 pseudo-queries on a collection of short documents, so that its kernels compile too
WARMUP_DOCS = 64


def _query_models(channels: list[str]) -> tuple[bool, tuple[str, ...]]:
    """Whether queries for ``channels`` run the LLM (or its distilled student), and the encoder
    channels among them whose sentence encoder runs: the channels' query needs in the channel
    table (indexer/channels.py; imported here, as the engine's modules are, on first use)."""
    from indexer.channels import CHANNEL_SPECS, ENCODER_EMBEDDING, LLM_STATE

    rows = [s for s in CHANNEL_SPECS if s.mode in channels]
    return any(LLM_STATE in s.query_needs for s in rows), tuple(s.mode for s in rows if ENCODER_EMBEDDING in s.query_needs)


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
        self.encoders: dict = {}  # the sentence-transformers encoders of the encoder channels, by mode, when required
        self.retriever = None
        self.dataset: str | None = None
        self.build_stats: dict = {}
        self._encoded: dict[tuple, tuple[list, list[float]]] = {}
        self._retrievers: dict[str, Any] = {}  # the index searched with other fusion settings
        self._build_warmed = False  # _warm_build ran (once per engine)

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
        from indexer.channels import sentence_encoder_specs

        for s in sentence_encoder_specs():
            if s.mode not in self.encoders and self.build_options.get(s.option):
                from embedder.sentence_encoder import SentenceEncoder

                self.encoders[s.mode] = SentenceEncoder.load(self.build_options[s.option], device=self.settings.device)

    @property
    def encoder(self):
        """The encoder channel's sentence model (None: not required)."""
        return self.encoders.get("encoder")

    def channel_settings(self) -> tuple[dict, dict]:
        """build_index's ``channels`` ({mode: setting}, the sentence encoders as the models loaded
        once, not their names) and its other options, from the systems' required options."""
        from indexer.channels import CHANNEL_SPECS

        by_option = {s.option: s.mode for s in CHANNEL_SPECS if s.option is not None}
        channels = {by_option[k]: v for k, v in self.build_options.items() if k in by_option and v not in (None, False)}
        rest = {k: v for k, v in self.build_options.items() if k not in by_option}
        return channels | self.encoders, rest

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
            "torch_threads": torch_threads(),
            "runtime": e.runtime_info() if e else None,
        }
        for mode, model in self.encoders.items():
            p[mode] = {**model.describe(), "runtime_reason": model.runtime_reason}
        # Query-side settings as the Retriever applies them (its defaults, read from it).
        for attr in ("literal", "query_weighting", "fusion", "backend", "query_encoder"):
            if r is not None and hasattr(r, attr):
                p[attr] = getattr(r, attr)
        if getattr(r, "feedback", None) is not None:
            p["feedback"] = r.feedback.to_dict()
        if getattr(r, "sparse_pruning", None) is not None:
            p["sparse_pruning"] = r.sparse_pruning.to_dict()
        student = getattr(r, "student", None)
        if student is not None:  # where the distilled head ran: its precision changes its timings
            p["query_encoder_runtime"] = student.runtime_reason
        return p

    def index(self, ds: Dataset) -> dict:
        """Build (once per dataset) the index holding every channel the systems need."""
        if self.dataset == ds.name and self.retriever is not None:
            # served from the build another system's call paid for, warm-up included
            return {**self.build_stats, "warmup_build_seconds": None}
        from indexer.build import build_index, index_size_bytes
        from indexer.corpus import CorpusSpec
        from retriever.retriever import Retriever

        self.load()
        folder = self.settings.work_dir / ds.name
        corpus = ds.write_corpus(folder / "corpus.jsonl")
        index_dir = folder / "aligned-tokens"
        channels, options = self.channel_settings()
        if self.settings.segments:
            options["segments"] = True
        warmup_seconds = self._warm_build(corpus, folder, channels, options)
        hits_before = getattr(self.embedder, "hits", 0)
        manifest = build_index(
            CorpusSpec(corpus, fmt="jsonl"),
            index_dir,
            self.embedder,
            top_k=self.top_k,
            dense_kind=self.settings.dense_kind,
            overwrite=True,
            progress=self.settings.progress,
            channels=channels,
            **options,
        )
        # no query cache: every query is encoded (and timed) as a first query would be
        self.retriever = Retriever(index_dir, manifest, self.embedder, expansion_m=self.expansion_m, query_encoder=self.settings.query_encoder or "auto",
                                   query_cache_size=0, feedback=self.settings.feedback, profile=None,
                                   sparse_pruning=self.settings.sparse_pruning, encoders=self.encoders)
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
            "warmup_build_seconds": warmup_seconds,
        }
        return self.build_stats

    def _warm_build(self, corpus: Path, folder: Path, channels: dict, options: dict) -> float | None:
        """Build, untimed, an index of the first WARMUP_DOCS documents with the same channels and
        options, once per engine: the build's Numba kernels (BM25 inversion, the calibration's deep
        searches, the compact codecs) compile on their first call, and a timed first build would
        count that compilation as build time (9 of adi's 11.2 s in the first Xeon five-collection
        run, 2.2 s warm). Returns its seconds, or None where nothing was built: already warm, or an
        embedding cache in use (the warm-up's documents would be served from it to the timed build)."""
        if self._build_warmed or self.settings.embedding_cache is not None:
            return None
        import tempfile

        from indexer.build import build_index
        from indexer.corpus import CorpusSpec

        self._build_warmed = True
        t0 = time.perf_counter()
        with tempfile.TemporaryDirectory(dir=folder, prefix=".warmup-") as tmp:
            sample = Path(tmp) / "corpus.jsonl"
            with open(corpus, encoding="utf-8") as src, open(sample, "w", encoding="utf-8") as dst:
                dst.writelines(itertools.islice(src, WARMUP_DOCS))
            build_index(CorpusSpec(sample, fmt="jsonl"), Path(tmp) / "index", self.embedder, top_k=self.top_k,
                        dense_kind=self.settings.dense_kind, overwrite=True, progress=False, channels=channels, **options)
        return round(time.perf_counter() - t0, 3)

    def retriever_for(self, fusion: dict | None, query_encoder: str | None = None):
        """The index's Retriever with ``fusion`` as its hybrid setting and ``query_encoder`` encoding
        its queries (None: the run's). Another fusion alone is a view of the run's Retriever
        (Retriever.with_fusion: same channels, models and query encoder, checked as the
        constructor checks it); another query encoder is a Retriever of its own."""
        if fusion is None and query_encoder is None:
            return self.retriever
        key = json.dumps([fusion, query_encoder], sort_keys=True)
        if key not in self._retrievers and query_encoder is None:
            self._retrievers[key] = self.retriever.with_fusion(fusion)
        if key not in self._retrievers:
            from retriever.retriever import Retriever

            r = self.retriever
            run_encoder = r.student or ("none" if r.model_free else "llm")
            self._retrievers[key] = Retriever(r.index_dir, r.manifest, self.embedder, expansion_m=self.expansion_m, fusion=fusion,
                                              query_encoder=query_encoder or run_encoder, query_cache_size=0, profile=None,
                                              feedback=r.feedback, sparse_pruning=r.sparse_pruning, encoders=self.encoders)
        return self._retrievers[key]

    def forget_encodings(self) -> None:
        """Drop the encoded queries kept per query set (and their times): the next :meth:`encode` encodes again."""
        self._encoded.clear()

    def encode(self, queries: list[str], mode: str | None = None, retriever=None) -> tuple[list, list[float]]:
        """Each query encoded alone, with what ``mode``'s channels need (Retriever.encode): the
        LLM (literal + top-M aligned tokens, and its embedding) and/or the sentence encoder.
        ``mode`` None: every channel of the index (older callers)."""
        r = retriever or self.retriever
        channels = r.channels_of(mode) if hasattr(r, "channels_of") else []
        needs = _query_models(channels)
        # who encoded is part of the key: systems of one run may encode with different query encoders
        key = (needs, r.query_encoder, tuple(queries)) if hasattr(r, "channels_of") else tuple(queries)
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
        if mode != "hybrid" and hasattr(r, "search_channel"):
            docs, scores = r.search_channel(enc, mode, k)
        elif mode == "sparse" and not hasattr(r, "search_channel"):
            docs, scores = r.sparse.search(enc.tokens, enc.weights, k)
        elif mode == "dense" and not hasattr(r, "search_channel"):
            d, s = r.dense.search(enc.embedding[None, :], k)
            docs, scores = d[0], s[0]
        else:
            return [(h.doc_id, float(h.score)) for h in r.search_encoded([enc], k=k, mode=mode, explain=False)[0]]
        ids = r.doc_ids
        return [(ids[d], float(s)) for d, s in zip(docs, scores) if d >= 0]

    def timed_call(self, mode: str) -> str:
        r = self.retriever
        if mode != "hybrid" and (r is None or hasattr(r, "search_channel") or mode in ("sparse", "dense")):
            return "index-level top-k (ids and scores; no matched-token explanations)"
        return "Retriever.search_encoded(explain=False): every channel, then fusion (ids, scores, per-channel shares)"


def shared_engine(settings: Settings, shared: dict) -> AlignedTokensEngine:
    """The run's one engine (created on first use)."""
    if "aligned-tokens" not in shared:
        shared["aligned-tokens"] = AlignedTokensEngine(settings)
    return shared["aligned-tokens"]


def _channel_files(mode: str) -> Callable[[str], bool] | None:
    """Whether an index file (its path relative to the index) belongs to channel ``mode``: the
    file patterns of its row in the channel table (indexer/channels.py); None for a mode that is
    no channel (hybrid). The rest, e.g. doc_ids.json and the manifest, is shared by all channels
    and counted in each."""
    from indexer.channels import CHANNEL_SPECS

    patterns = next((s.files for s in CHANNEL_SPECS if s.mode == mode), None)
    return None if patterns is None else (lambda name: any(fnmatch(name, p) for p in patterns))


_SHARED_FILES = ("doc_ids.json", "manifest.json")


class AlignedTokensSystem(System):
    """A search mode of this project's engine (``Retriever`` mode) as a benchmark system.

    Subclass with ``mode`` and ``build_options`` (the index channels the mode needs) and
    register it, e.g. ``mode = "hybrid"; build_options = {"dense": True}``; where the channels
    depend on the run's settings, override :meth:`index_options` instead.
    """

    mode = "sparse"
    build_options: Mapping[str, Any] = {}  # read-only: index_options copies it per instance
    fusion: dict | None = None  # hybrid: None = the Retriever's default for the index's channels
    query_encoder: str | None = None  # None: the run's (beir-eval --query-encoder)

    def __init__(self, settings: Settings, shared: dict) -> None:
        super().__init__(settings, shared)
        self.build_options = self.index_options(settings)
        self.engine = shared_engine(settings, shared)
        self.engine.require(**self.build_options)

    def index_options(self, settings: Settings) -> dict:
        """The index channels this system needs (options of the shared index build)."""
        return dict(self.build_options)

    @property
    def retriever(self):
        return self.engine.retriever_for(self.fusion, self.query_encoder) if self.engine.retriever is not None else None

    def load(self) -> None:
        self.engine.load()

    def forget_encodings(self) -> None:
        # the engine keeps each query set's encodings and their times (sparse and dense share
        # them), warm-up queries included: a later measurement must encode again
        self.engine.forget_encodings()

    def params(self) -> dict:
        from indexer.channels import sentence_encoder_specs

        encoder_modes = tuple(s.mode for s in sentence_encoder_specs())  # the sentence-encoder channels
        p = self.engine.params()
        p["mode"] = self.mode
        p["timed_search"] = self.engine.timed_call(self.mode)
        r = self.retriever
        if self.mode == "hybrid":
            if r is not None:
                p["fusion"] = r.fusion.as_dict()
                p["channels_fused"] = r.channels_of("hybrid")
            elif self.fusion is not None:
                p["fusion"] = self.fusion
            if self.fusion is None:
                p["fusion_source"] = "the Retriever's default for the index's channels (DEFAULT_FUSION, or DEFAULT_FUSION_WITH_ENCODER with an encoder channel)"
        elif self.mode not in encoder_modes:  # a sentence encoder's provenance only where its channel is searched
            for mode in encoder_modes:
                p.pop(mode, None)
        if self.mode in ("dense", "dense-ef", "bm25", *encoder_modes):
            for key in ("top_k", "expansion_m", "literal", "query_weighting", "fusion"):
                p.pop(key, None)
        if self.mode in encoder_modes:
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
        own = _channel_files(self.mode)
        files = b["files"]
        size = b["total_bytes"] if own is None else sum(v for k, v in files.items() if own(k) or k in _SHARED_FILES)
        details = {
            "bytes_counted": "all index files" if own is None else f"{self.mode} channel files + doc ids + manifest",
            "shared_build": "one index build serves all of this project's systems in the run (the corpus is encoded once)",
            "total_index_bytes": b["total_bytes"],
            "encode_seconds": b["manifest_build"].get("encode_seconds"),
            "tokens_per_s": b["manifest_build"].get("tokens_per_s"),
            "embeddings_cached": b["embeddings_cached"],
            # an untimed build of the first documents ran before this collection's (compilation kept out)
            "warmup_build_seconds": b.get("warmup_build_seconds"),
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
    build_options: Mapping[str, Any] = {"dense": True}


def _embedfilter_tau(settings: Settings) -> int:
    from embedder.embedfilter import DEFAULT_TAU

    return settings.embedfilter_tau if settings.embedfilter_tau is not None else DEFAULT_TAU


@register("dense-ef", "this project: the pooled embedding projected by EmbedFilter (LM-head spectrum), cosine (FAISS)")
class AlignedTokensDenseEF(AlignedTokensSystem):
    mode = "dense-ef"

    def index_options(self, settings: Settings) -> dict:
        return {"embedfilter_tau": _embedfilter_tau(settings)}


@register("bm25", "this project: BM25 (k1=0.9, b=0.4) on its own Numba inverted index, no JVM")
class LexicalBM25(AlignedTokensSystem):
    mode = "bm25"

    def index_options(self, settings: Settings) -> dict:
        return {"lexical": settings.lexical}

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
        super().__init__(settings, shared)

    def index_options(self, settings: Settings) -> dict:
        options: dict = {"dense": True, "lexical": settings.lexical}
        if self.fusion["weights"].get("dense-ef", 0) > 0:
            options["embedfilter_tau"] = _embedfilter_tau(settings)
        return options


@register("encoder", "this project: the encoder channel (build-index --encoder; all-MiniLM-L6-v2 by default), cosine (FAISS)")
class AlignedTokensEncoder(AlignedTokensSystem):
    mode = "encoder"

    def index_options(self, settings: Settings) -> dict:
        return {"encoder": settings.encoder}


# Hybrids of the encoder channel with this engine's own channels, one system per channel subset
# (issue 16: does the aligned-token channel add anything on top of BM25 + a small encoder?).
# Weights: Settings.fusions[subset] (beir-eval --fusion-from: the setting fusion_cv --subsets chose
# on all collections), else these UNTUNED fallbacks (the 0.6 / 0.4 starting point, the
# rest of the weight spread over the extra channels). Latency depends on the channels, not the weights.
ENCODER_SUBSET_FALLBACKS: dict[str, dict] = {
    "bm25+encoder": {"method": "minmax", "weights": {"bm25": 0.6, "encoder": 0.4}},
    "bm25+encoder+sparse": {"method": "minmax", "weights": {"bm25": 0.5, "encoder": 0.3, "sparse": 0.2}},
    "bm25+encoder+sparse+dense": {"method": "minmax", "weights": {"bm25": 0.5, "encoder": 0.3, "sparse": 0.1, "dense": 0.1}},
}


@register("default", "this project as a user gets it: build-index + search-index with no flags (the fast profile's index and search)")
class UserDefault(AlignedTokensSystem):
    """Exactly what ``build-index`` and ``search-index`` give with no flags: the channels of
    ``build-index --profile fast`` (indexer/build_profiles.py) with their default options and its
    compact layout, the engine's default top-K, expansion M and adapter, searched in the
    Retriever's default mode at the ``fast`` operating point. Run settings that would change that
    (``--top-k``, ``--adapter``, ``--lexical``...) are ignored; how the encoder runs (dtype,
    runtime, device, threads, embedding cache) is the machine's, not the system's, and is kept.
    Its index is its own (under ``WORK/default-fast``), since other systems of a run may ask the
    shared index for other channels.

    ``default-best`` is ``build-index --profile best`` + ``search-index --profile best``, over an
    index of its own. A run's ``--profile`` other than auto searches ``default``'s index at that
    profile instead of ``fast``. The profile's query encoder, unless ``--query-encoder`` names
    another."""

    profile_name: str | None = None  # None: the run's --profile
    build_profile_name = "fast"

    def __init__(self, settings: Settings, shared: dict) -> None:
        from dataclasses import replace

        from indexer import channel_set
        from indexer.build_profiles import get_build_profile
        from indexer.compact import DEFAULT_COMPACT, doc_id_encoding
        from retriever.profiles import DEFAULT_PROFILE, fit_profile

        name = self.profile_name or (DEFAULT_PROFILE if settings.profile == "auto" else settings.profile)
        built = get_build_profile(self.build_profile_name)
        default_channels = channel_set.resolve(None, profile=built.name)[0]
        options = channel_set.build_options(default_channels)  # keyed by each row's option, as systems require them
        self.profile = fit_profile(name, default_channels)  # best without mpnet installed: its fallback
        self.fusion = self.profile.fusion
        self.query_encoder = settings.query_encoder or self.profile.query_encoder

        System.__init__(self, settings, shared)
        own = replace(settings, work_dir=settings.work_dir / f"default-{built.name}", top_k=None, expansion_m=None, adapter="default",
                      dense_kind="Flat", embedfilter_tau=None, lexical=channel_set.DEFAULT_ANALYZER,
                      encoder=channel_set.DEFAULT_SETTINGS["encoder"], fusions={}, segments=False)
        self.engine = shared.setdefault(f"aligned-tokens-default-{built.name}", AlignedTokensEngine(own))
        self.channels = default_channels
        self.build_profile = built
        # the index build-index writes with no flags but --profile: compact as it is (its profile's
        # impact bits and doc-number encoding, each dense channel's compact kind), not the float32 reference
        self.engine.require(**options, sparse="sparse" in default_channels, compact=DEFAULT_COMPACT,
                            doc_ids=doc_id_encoding(built.doc_ids, DEFAULT_COMPACT), impact_bits=built.impact_bits)

    @property
    def mode(self) -> str:  # the Retriever's default for the index built, at this profile's fusion (hybrid, unless one channel)
        r = self.retriever
        return r.default_mode if r is not None else "hybrid"

    def index(self, ds: Dataset) -> IndexStats:
        stats = super().index(ds)
        r = self.retriever
        if r is not None:  # the fusion this collection's index gave the profile, and why
            stats.details.update({"fusion": r.fusion.as_dict(), "fusion_source": self.fusion_why,
                                  "calibration_seconds": self.engine.build_stats.get("manifest_build", {}).get("calibration_seconds")})
        return stats

    @property
    def retriever(self):
        """The index searched as search-index searches it at this profile: with the fusion the
        settings resolve to (retriever.settings.resolve_settings: its manifest's calibration of the
        profile's pair, else the profile's fixed setting), and why."""
        r = self.engine.retriever
        if r is None:
            return None
        from indexer.channels import CHANNEL_SPECS
        from retriever.settings import SearchSettings, resolve_settings

        held = [s.mode for s in CHANNEL_SPECS if s.record(r.manifest) is not None]
        resolved = resolve_settings(SearchSettings(profile=self.profile), r.manifest, held, r.index_dir)
        self.fusion, self.fusion_why = resolved.fusion.as_dict(), resolved.why["fusion"]
        return self.engine.retriever_for(self.fusion, self.query_encoder)

    def params(self) -> dict:
        p = super().params()
        p["channels"] = list(self.channels)
        build = "build-index CORPUS" + ("" if self.build_profile.name == "fast" else f" --profile {self.build_profile.name}")
        search = "search-index" + ("" if self.profile.name == "fast" else f" --profile {self.profile.name}")
        p["definition"] = f"{build} + {search}" + (" (no flags)" if self.build_profile.name == self.profile.name == "fast" else "")
        p["profile"] = self.profile.name
        p["build_profile"] = self.build_profile.name
        if self.profile.calibrated is not None:  # each collection's own: its index's details say which (index())
            p["fusion"] = f"calibrated per collection on the {self.profile.calibrated} pair (retriever.profiles.profile_fusion)"
        p["fusion_source"] = f"retriever.profiles.PROFILES[{self.profile.name!r}] and the index's calibration"
        r = self.retriever
        if r is not None:
            p["query_encoder"] = r.query_encoder
        return p


@register("default-best", "this project at its best operating point: build-index --profile best + search-index --profile best (BM25 + mpnet, calibrated)")
class UserDefaultBest(UserDefault):
    """``build-index --profile best`` (its own index: BM25, mpnet; 8-bit impacts,
    range16 doc numbers), searched at the ``best`` operating point."""

    profile_name = "best"
    build_profile_name = "best"


class EncoderHybrid(AlignedTokensSystem):
    """The hybrid mode over one subset of channels with the encoder channel (``subset``, e.g.
    "bm25+encoder+sparse"), fused with Settings.fusions[subset] or its untuned fallback."""

    mode = "hybrid"

    def __init__(self, settings: Settings, shared: dict, subset: str) -> None:
        self.subset = subset
        fusion = settings.fusions.get(subset) or ENCODER_SUBSET_FALLBACKS[subset]
        unknown = set(fusion["weights"]) - set(subset.split("+"))
        if any(fusion["weights"][c] > 0 for c in unknown):
            raise SystemUnavailable(f"hybrid-{subset}: fusion {fusion} weighs channels outside the subset")
        self.fusion = fusion
        self.fusion_source = "--fusion-from" if subset in settings.fusions else "untuned fallback (benchmarks.systems.ENCODER_SUBSET_FALLBACKS)"
        super().__init__(settings, shared)

    def index_options(self, settings: Settings) -> dict:
        options: dict = {"encoder": settings.encoder, "lexical": settings.lexical}
        if "dense" in self.subset.split("+"):
            options["dense"] = True
        return options

    def params(self) -> dict:
        p = super().params()
        p["fusion_source"] = self.fusion_source
        return p


register_each(EncoderHybrid, {
    f"hybrid-{subset}": (f"this project: fusion of its {', '.join(subset.split('+'))} channels (Retriever mode hybrid)", {"subset": subset})
    for subset in ENCODER_SUBSET_FALLBACKS
})
