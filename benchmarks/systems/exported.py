"""This project's index exported to other engines and searched there: the sparse channel quantised
as in the Pyserini export (Numba) and in Lucene (sparse-quantised, sparse-lucene), and every
channel in Milvus Lite (*-milvus, with the hybrid fused by us or by Milvus's rankers).
"""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from benchmarks.datasets import Dataset
from benchmarks.systems.base import (
    Hits,
    IndexStats,
    Settings,
    SystemUnavailable,
    dir_bytes,
    package_version,
    register,
    register_each,
)
from benchmarks.systems.engine import AlignedTokensSystem
from benchmarks.timing import Stopwatch


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
        p.update(pyserini=package_version("pyserini"), searcher="LuceneImpactSearcher(min_idf=-1), pass-through query encoder")
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
        stats.bytes = dir_bytes(export_dir / info["lucene_index"], lambda p: p.name != "write.lock")
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
class MilvusSystem(AlignedTokensSystem):
    """A mode of this project's Retriever with its channels answered by Milvus Lite: the run's
    index (every channel these systems need: sparse, dense, bm25) exported once per dataset
    to a Milvus Lite file beside it, then searched through ``Retriever(backend="milvus")``.
    ``method`` (hybrid only): who fuses DEFAULT_FUSION's channels (None: this project's fusion over
    the channel lists; "milvus-weighted" / "milvus-rrf": Milvus's own rankers)."""

    def __init__(self, settings: Settings, shared: dict, mode: str, method: str | None = None) -> None:
        try:
            import milvus_lite  # noqa: F401
            import pymilvus  # noqa: F401
        except ImportError as exc:
            raise SystemUnavailable(f"{mode}-milvus: {exc} (pip install -e '.[milvus]')") from None
        self.mode = mode
        if mode == "hybrid":
            from retriever.retriever import DEFAULT_FUSION

            self.fusion = DEFAULT_FUSION if method is None else {**DEFAULT_FUSION, "method": method}
        super().__init__(settings, shared)

    def index_options(self, settings: Settings) -> dict:
        return {"dense": True, "lexical": settings.lexical}

    @property
    def retriever(self):
        return self.shared.get(self._key) if self.engine.retriever is not None else None

    @property
    def _key(self) -> str:
        return f"milvus-retriever:{self.engine.dataset}:{json.dumps(self.fusion, sort_keys=True)}"

    def params(self) -> dict:
        p = super().params()
        p.update(backend="milvus", pymilvus=package_version("pymilvus"), milvus_lite=package_version("milvus-lite"),
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
            exported = self.shared[f"milvus-export:{ds.name}"] = {"seconds": sw.seconds, "info": info, "bytes": dir_bytes(Path(uri))}
        if self._key not in self.shared:
            r = e.retriever
            self.shared[self._key] = Retriever(
                r.index_dir, r.manifest, e.embedder, expansion_m=e.expansion_m, fusion=self.fusion, backend="milvus", milvus_uri=uri,
                profile=None, query_encoder="llm",
            )
        stats.details.update(milvus_export_seconds=round(exported["seconds"], 3), milvus_uri=uri,
                             bytes_counted="the Milvus Lite file (all channels)", engine_index_bytes=stats.bytes)
        stats.bytes = exported["bytes"]
        stats.seconds += exported["seconds"]
        return stats


register_each(MilvusSystem, {
    **{f"{mode}-milvus": (f"this project's {mode} channel exported to Milvus Lite and searched there (Retriever backend milvus)", {"mode": mode})
       for mode in ("sparse", "dense", "bm25")},
    "hybrid-milvus": ("this project's hybrid (DEFAULT_FUSION: min-max, our fusion) over channel lists from Milvus Lite", {"mode": "hybrid"}),
    "hybrid-milvus-weighted": ("hybrid fused inside Milvus Lite: WeightedRanker with DEFAULT_FUSION's weights",
                               {"mode": "hybrid", "method": "milvus-weighted"}),
    "hybrid-milvus-rrf": ("hybrid fused inside Milvus Lite: RRFRanker(k=60) over the channels DEFAULT_FUSION weighs",
                          {"mode": "hybrid", "method": "milvus-rrf"}),
})
