"""Multi-vector documents against single-vector ones (indexer/segments.py), on BEIR-style collections.

    python -m experiments.segments_study --data ../shared/data/cisi --data ../shared/data/medline \\
        --embedding-cache .cache/embeddings --out benchmarks/results/segments.json

For each collection, two indexes with the same embedder (sparse + dense + BM25 channels): one
vector per document truncated at ``max_length`` tokens (the default), and whole documents as
``max_length`` windows (``--segments``). Queries are encoded once per collection (and cached
under the embedding cache) and run through both; nDCG@10 by ranx. Writes a ``kind: table``
results file that ``beir-eval report`` renders.

Build seconds count encoding; documents served by the embedding cache are not re-encoded, so
a build's seconds are mostly the windows that are new (the column says how many were encoded).
"""
from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import benchmarks  # noqa: F401  (cache locations first)

MODES = ("sparse", "dense", "hybrid")


class _QueryCache:
    """An embedder whose ``embed`` (queries, read with the query template) reads and fills an ArrayCache; all else delegated."""

    def __init__(self, embedder, directory: Path) -> None:
        from embedder.cache import ArrayCache, embedder_key

        inner = getattr(embedder, "embedder", embedder)
        self._e = embedder
        self._cache = ArrayCache(directory / f"queries-{embedder_key(inner, role='query')}")

    def __getattr__(self, name):
        return getattr(self._e, name)

    def embed(self, texts, role: str = "query"):
        from embedder.cache import cached_arrays

        if role != "query":  # the cache holds query-template embeddings only
            return self._e.embed(texts, role=role)
        encode = lambda part: self._e.embed(part, role="query")
        return cached_arrays(self._cache, list(texts), encode, (self._e.dim,), desc="queries", progress=False)


def study(ds, embedder, work: Path, k: int = 100) -> list[dict]:
    """One row per variant (single, multi) of one collection."""
    from benchmarks.metrics import evaluate_run
    from indexer.build import build_index, index_size_bytes
    from indexer.corpus import CorpusSpec
    from retriever.retriever import Retriever

    corpus = ds.write_corpus(work / ds.name / "corpus.jsonl")
    qids = sorted(ds.queries)
    rows = []
    for variant in ("single", "multi"):
        misses = getattr(embedder, "misses", 0)
        t0 = time.perf_counter()
        m = build_index(CorpusSpec(corpus, fmt="jsonl"), work / ds.name / variant, embedder, dense=True, lexical="words",
                        overwrite=True, progress=False, segments=variant == "multi")
        build_s = time.perf_counter() - t0
        r = Retriever(work / ds.name / variant, m, embedder)
        enc = r.encode([ds.queries[q] for q in qids])
        row = {"collection": ds.name, "variant": variant, "docs": m.n_docs,
               "vectors": (m.segments or {}).get("n_segments", m.n_docs),
               "docs_split": (m.segments or {}).get("docs_with_several", 0),
               "bytes": index_size_bytes(work / ds.name / variant), "build_s": round(build_s, 1),
               "encoded": getattr(embedder, "misses", 0) - misses}
        for mode in MODES:
            r.search_encoded(enc[:1], k=k, mode=mode, explain=False)  # warm-up (Numba compilation) apart from the timing
            t1 = time.perf_counter()
            hits = r.search_encoded(enc, k=k, mode=mode, explain=False)
            row[f"{mode}_ms"] = round(1000 * (time.perf_counter() - t1) / len(qids), 2)
            run = {q: {h.doc_id: float(h.score) for h in hs} for q, hs in zip(qids, hits)}
            row[f"{mode}_ndcg"] = evaluate_run(ds.qrels, run, ["ndcg@10"])["ndcg@10"]
        rows.append(row)
    return rows


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    p = argparse.ArgumentParser(prog="python -m experiments.segments_study", description=__doc__.split("\n\n")[0])
    p.add_argument("--data", action="append", required=True, help="a BEIR folder; repeatable")
    p.add_argument("--adapter", default="default")
    p.add_argument("--runtime", choices=("auto", "reference"), default="auto")
    p.add_argument("--embedding-cache", type=Path, default=None)
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--threads", type=int, default=None, help="compute threads (default: all cores; 1 beside another job)")
    args = p.parse_args(argv)
    from benchmarks.datasets import load_beir_folder
    from embedder.cache import CachedEmbedder
    from embedder.encoder import Embedder

    emb = Embedder.load(adapter=args.adapter, runtime=None if args.runtime == "reference" else "auto")
    if args.threads:
        from embedder.util import set_threads

        set_threads(args.threads)  # after loading (Embedder.load sizes torch's pool), before the runtime is built
    if args.embedding_cache:
        emb = _QueryCache(CachedEmbedder(emb, args.embedding_cache), args.embedding_cache)
    rows: list[dict] = []
    with tempfile.TemporaryDirectory() as work:
        for d in args.data:
            ds = load_beir_folder(d)
            rows += study(ds, emb, Path(work))
            print(rows[-2], rows[-1], sep="\n", flush=True)
            _write(args, argv, emb, rows)  # after each collection: a cut-short run keeps what it measured
    return 0


def _write(args, argv, emb, rows: list[dict]) -> None:
    from benchmarks.tables import study_command, write_table

    cols = ["collection", "variant", "docs", "vectors", "docs_split", "sparse_ndcg", "dense_ndcg", "hybrid_ndcg", "bytes", "build_s", "encoded", "sparse_ms", "dense_ms", "hybrid_ms"]
    header = ["Collection", "Documents", "Vectors", "Docs split", "sparse nDCG@10", "dense nDCG@10", "hybrid nDCG@10",
              "Index bytes", "Build s", "Texts encoded", "sparse ms/q", "dense ms/q", "hybrid ms/q"]
    table_rows = [[f"{r['collection']} ({r['variant']})"] + [r[c] for c in cols[2:]] for r in rows]
    write_table(
        args.out,
        "Multi-vector documents (whole documents as 256-token windows) against single-vector (truncated at 256)",
        study_command("experiments.segments_study", argv),
        (
            "Same embedder (" + emb.runtime_summary() + "), same queries (encoded once), sparse/dense/hybrid as the Retriever "
            "runs them (hybrid: the default minmax fusion with BM25). *multi*: a document longer than 256 tokens is read whole "
            "as 256-token windows; sparse = each token's maximum over windows, dense = the best window. *Docs split*: documents "
            "with more than one window. *Build s* includes encoding only for the *Texts encoded* (the rest came from the "
            "embedding cache); ms/q: search of a pre-encoded query, on a machine shared with other jobs: "
            "compare the two variants, not absolute values."
        ),
        header,
        table_rows,
        details={"rows": rows},
    )


if __name__ == "__main__":
    raise SystemExit(main())
