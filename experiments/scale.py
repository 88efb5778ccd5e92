"""Scale run: a synthetic corpus of aligned-token vectors through the build's shard/merge path
and through Milvus, with build time, index bytes, peak RSS and search latency / throughput.

Vectors are generated, not encoded: each document gets K distinct token ids drawn from a
Zipfian distribution over the vocabulary (token r has probability ~ 1 / r**s; draws are
repeated until K distinct tokens are found, so frequent tokens saturate at "in nearly every
document" as real aligned tokens do) and logits uniform in the range the default model gives
its top 512 tokens (15-35, README). Queries: ``--query-tokens`` distinct Zipfian tokens with
IDF weights, as the Retriever weights them.

The inverted index is built exactly as ``build_index`` builds it from committed shards
(indexer/shards.py, then InvertedIndex.write_from_shards through memory maps), and searched
memory-mapped. The Milvus part exports the first ``--milvus-docs`` documents (Milvus Lite
holds its sparse postings as Python objects: see BENCHMARKS.md for what that allows) through
``export_milvus`` and searches them through the Milvus backend.

    nice -n 10 python -m experiments.scale --docs 1000000 --out /tmp/scale --milvus-docs 50000
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import sys
import time
from pathlib import Path

import numpy as np
from tqdm.auto import tqdm

from benchmarks.synthetic import VOCAB, make_queries, synthetic_shard, zipf_cdf
from benchmarks.tables import study_command


def peak_rss_bytes() -> int:
    """This process's peak resident set size so far (Linux reports KiB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def write_shards(store: Path, n_docs: int, shard: int, k: int, cdf: np.ndarray, perm: np.ndarray, seed: int) -> tuple[int, int, float]:
    """Generate and commit the shards as a build does, skipping those already committed (a
    resumed run: shard i is generated from seed + i, so it comes out the same). Returns the
    number of shards, how many this run generated, and the seconds that took (generation +
    commit; shards committed by an earlier run are not timed here)."""
    from indexer.shards import commit_shard

    store.mkdir(parents=True, exist_ok=True)
    numbers = range((n_docs + shard - 1) // shard)
    made, seconds = 0, 0.0
    for i in tqdm(numbers, desc="generate + commit shards", unit="shard"):
        if (store / f"shard-{i:06d}").is_dir():
            continue
        t0 = time.perf_counter()
        n = min(shard, n_docs - i * shard)
        tok, wts = synthetic_shard(n, k, cdf, perm, seed + i)
        commit_shard(store, i, {"tokens": tok, "weights": wts}, {"ids": [f"s{i * shard + j}" for j in range(n)], "n_tokens": 0, "encode_seconds": 0.0})
        seconds += time.perf_counter() - t0
        made += 1
    return len(numbers), made, seconds


def write_index(index_dir: Path, store: Path, n_shards: int, top_k: int, n_docs: int | None = None) -> dict:
    """An index directory (postings, doc ids, manifest) merged from the committed shards;
    ``n_docs``: only the first documents (for the Milvus subset)."""
    from indexer.integrity import record_files
    from indexer.inverted_index import InvertedIndex
    from indexer.manifest import DOC_IDS, Manifest
    from indexer.shards import read_shard

    index_dir.mkdir(parents=True, exist_ok=True)
    limit = n_docs

    def shards():
        left = limit
        for i in range(n_shards):
            got, _ = read_shard(store, i, ("tokens", "weights"), mmap=True)
            tok, wts = got["tokens"], got["weights"]
            if left is not None:
                if left <= 0:
                    return
                tok, wts = tok[:left], wts[:left]
                left -= len(tok)
            yield np.asarray(tok), np.asarray(wts)

    t0 = time.perf_counter()
    n = InvertedIndex.write_from_shards(shards, VOCAB, index_dir)
    seconds = time.perf_counter() - t0
    ids = [f"s{i}" for i in range(n)]
    (index_dir / DOC_IDS).write_text(json.dumps(ids), encoding="utf-8")
    Manifest(
        model={"name": "synthetic", "sha256": "synthetic"}, adapter=None, embedding={}, channels={"sparse": {"top_k": top_k, "vocab_size": VOCAB, "weight": "logit"}},
        n_docs=n, corpus={"synthetic": True}, files=record_files(index_dir),
    ).write(index_dir)
    return {"n_docs": n, "merge_seconds": round(seconds, 1)}


def time_numba(index, queries, k: int) -> dict:
    """p50/p95 of one-query searches and QPS of batch search at 1 and 2 Numba threads."""
    import numba

    res: dict = {}
    for q in queries[:3]:
        index.search(q[0], q[1], k)  # compile / warm the page cache of the touched lists
    index.batch_search(queries[:4], k)
    lat = []
    for t, w in queries:
        t0 = time.perf_counter()
        index.numbers.search(index.indptr, index.weights, index.scale, index.offset, t, w, index.n_docs, k)
        lat.append(time.perf_counter() - t0)
    res["p50_ms"] = round(1000 * float(np.percentile(lat, 50)), 2)
    res["p95_ms"] = round(1000 * float(np.percentile(lat, 95)), 2)
    res["qps_1_query_at_a_time"] = round(len(lat) / sum(lat), 1)
    # one query split by document range over 2 threads (what InvertedIndex.search does for a query
    # reading SPLIT_MIN_POSTINGS postings or more); the ranking must be the exact one, bit for bit
    numba.set_num_threads(2)
    args = (index.indptr, index.weights, index.scale, index.offset)
    index.numbers.search(*args, queries[0][0], queries[0][1], index.n_docs, k, 2)  # compile
    lat, same = [], True
    for t, w in queries:
        t0 = time.perf_counter()
        got = index.numbers.search(*args, t, w, index.n_docs, k, 2)
        lat.append(time.perf_counter() - t0)
        exact = index.numbers.search(*args, t, w, index.n_docs, k)
        same = same and np.array_equal(got[0], exact[0]) and np.array_equal(got[1], exact[1])
    res["split_2_threads_p50_ms"] = round(1000 * float(np.percentile(lat, 50)), 2)
    res["split_2_threads_p95_ms"] = round(1000 * float(np.percentile(lat, 95)), 2)
    res["split_same_ranking_as_exact"] = bool(same)
    for threads in (1, 2):
        numba.set_num_threads(threads)
        t0 = time.perf_counter()
        index.batch_search(queries, k)
        res[f"qps_batch_{threads}_threads"] = round(len(queries) / (time.perf_counter() - t0), 1)
    return res


def time_milvus(backend, queries, k: int, threads: int) -> dict:
    """p50/p95 and QPS of Milvus searches, ``threads`` clients at a time."""
    from concurrent.futures import ThreadPoolExecutor

    backend.search_sparse("sparse", queries[0][0], queries[0][1], k)  # builds the segment's index on first use
    lat = []

    def one(q):
        t0 = time.perf_counter()
        backend.search_sparse("sparse", q[0], q[1], k)
        return time.perf_counter() - t0

    t0 = time.perf_counter()
    with ThreadPoolExecutor(threads) as pool:
        lat = list(pool.map(one, queries))
    wall = time.perf_counter() - t0
    return {"p50_ms": round(1000 * float(np.percentile(lat, 50)), 1), "p95_ms": round(1000 * float(np.percentile(lat, 95)), 1), "qps": round(len(queries) / wall, 2)}


def dir_bytes(path: Path) -> int:
    return sum(p.stat().st_size for p in Path(path).rglob("*") if p.is_file())


def write_scale_table(result: dict, path: Path) -> Path:
    """The figures as a table results file (benchmarks/tables.py) for ``beir-eval report``;
    the raw measurements go along as ``details``."""
    from benchmarks.tables import write_table

    gib = lambda b: round(b / 2**30, 2)
    n = result["numba"]
    rows = [
        ["Numba inverted index (mmap)", result["docs"], result["postings"], gib(result["index_bytes"]),
         result["merge_seconds"], gib(result["peak_rss_after_search_bytes"]),
         n["p50_ms"], n["p95_ms"], n.get("split_2_threads_p50_ms", "–"), n["qps_batch_1_threads"], n["qps_batch_2_threads"]],
    ]
    m = result.get("milvus_lite")
    if m:
        mn = m["numba_same_docs"]
        rows.append(["Numba, the same documents as Milvus Lite", m["docs"], m["postings"], "–", "–", "–",
                     mn["p50_ms"], mn["p95_ms"], mn.get("split_2_threads_p50_ms", "–"), mn["qps_batch_1_threads"], mn["qps_batch_2_threads"]])
        rows.append(["Milvus Lite (exact sparse IP)", m["docs"], m["postings"], gib(m["bytes"]),
                     f"{m['export_seconds']} (export) + {m['first_search_seconds']} (first search builds the index)",
                     "not apart (same process as the 1M run)",
                     m["1_threads"]["p50_ms"], m["1_threads"]["p95_ms"], "–", m["1_threads"]["qps"], m["2_threads"]["qps"]])
    description = (
        f"Synthetic aligned-token vectors (K={result['top_k']} distinct tokens per document, Zipfian token frequencies with "
        f"s={result['zipf_s']} over a {result['vocab']}-token vocabulary, logits uniform in 15-35; generated, not encoded), "
        + (f"{result.get('cpu_count')} CPU cores, load average at the start {result['load_avg_start']}. " if "load_avg_start" in result
           else f"{result.get('cpu_count')} CPU cores shared with other jobs (training runs), `nice -n 10`. ")
        + "Build s (Numba) = merging the committed shards into the postings (`InvertedIndex.write_from_shards`, memory-mapped "
        "output), what a build does after encoding; generating the synthetic shards stands in for encoding and is not a build "
        f"cost ({result.get('shards_generated_this_run', '?')} of {result.get('shards', '?')} shards generated in the final run took "
        f"{result['generate_commit_seconds']} s, generation + atomic commit). Latency: one query at a time (Numba `term_at_a_time.search_one`; "
        "Milvus: one `search` call), "
        f"{result.get('queries', '?')} queries of {result.get('query_tokens', '?')} IDF-weighted tokens, top-{result.get('k', '?')}. "
        "Split: the same queries, each over 2 threads by document range (`term_at_a_time.search_split`, what "
        "`InvertedIndex.search` does for a query reading `SPLIT_MIN_POSTINGS` postings or more; its ranking checked identical to `search_one`'s). "
        "QPS: Numba `batch_search` with 1 and 2 Numba threads; Milvus: 1 and 2 client threads. Peak RSS: the process's "
        "maximum resident set, memory-mapped index pages included (the merge writes the 4 GB of postings through a memory map: "
        "those pages are file-backed and reclaimable, not heap). Milvus Lite 3.2 (pure Python) "
        "holds a segment's sparse postings as Python objects and builds them on the first search, so it was measured on the "
        "first documents only (the same documents' Numba figures beside it); a Milvus server is the path beyond that."
    )
    return write_table(
        path, "Scale run: synthetic aligned-token corpus (issue 13)", result["command"], description,
        ["engine", "docs", "postings", "index GiB", "build s", "peak RSS GiB", "p50 ms", "p95 ms", "p50 ms, split over 2 threads",
         "QPS 1 thread", "QPS 2 threads"],
        rows, details=result,
    )


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m experiments.scale", description=__doc__.split("\n\n")[0])
    p.add_argument("--docs", type=int, default=1_000_000)
    p.add_argument("--top-k", type=int, default=512)
    p.add_argument("--shard-size", type=int, default=16384)
    p.add_argument("--zipf-s", type=float, default=1.0, help="Zipf exponent of token frequencies")
    p.add_argument("--queries", type=int, default=200)
    p.add_argument("--query-tokens", type=int, default=80, help="tokens per query (the default M=64 expansion + the query's own)")
    p.add_argument("--k", type=int, default=100, help="hits per query")
    p.add_argument("--milvus-docs", type=int, default=50_000, help="documents exported to Milvus Lite (0: skip)")
    p.add_argument("--milvus-queries", type=int, default=50)
    p.add_argument("--out", type=Path, required=True, help="work directory (shards, index, Milvus file)")
    p.add_argument("--results", type=Path, help="write the figures as JSON here")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--resume", action="store_true", help="keep the shards an interrupted run of the same command committed in --out")
    p.add_argument("--table-from", type=Path, help="only write --results as a table from this raw JSON of an earlier run")
    args = p.parse_args(argv)
    if args.table_from:
        if not args.results:
            p.error("--table-from needs --results")
        raw = json.loads(args.table_from.read_text(encoding="utf-8"))
        for key, value in (("queries", args.queries), ("query_tokens", args.query_tokens), ("k", args.k)):
            raw.setdefault(key, value)  # runs from before these were recorded used the defaults
        write_scale_table(raw, args.results)
        return 0
    from indexer.inverted_index import InvertedIndex
    from indexer.manifest import Manifest

    out = args.out
    if not args.resume:
        shutil.rmtree(out, ignore_errors=True)
    for stale in ("index", "index-milvus", "milvus.db"):  # always rebuilt: only shards are resumed
        shutil.rmtree(out / stale, ignore_errors=True)
    out.mkdir(parents=True, exist_ok=True)
    cdf, perm = zipf_cdf(VOCAB, args.zipf_s, args.seed)
    result: dict = {"command": study_command("experiments.scale", argv),
                    "queries": args.queries, "query_tokens": args.query_tokens, "k": args.k, "docs": args.docs, "top_k": args.top_k, "vocab": VOCAB, "zipf_s": args.zipf_s, "cpu_count": os.cpu_count(),
                    "load_avg_start": [round(x, 2) for x in os.getloadavg()]}
    n_shards, made, seconds = write_shards(out / "shards", args.docs, args.shard_size, args.top_k, cdf, perm, args.seed)
    result.update(shards=n_shards, shards_generated_this_run=made, generate_commit_seconds=round(seconds, 1))
    result["shards_bytes"] = dir_bytes(out / "shards")
    merged = write_index(out / "index", out / "shards", n_shards, args.top_k)
    result.update(merged)
    result["index_bytes"] = dir_bytes(out / "index")
    result["peak_rss_build_bytes"] = peak_rss_bytes()
    print(json.dumps(result), flush=True)

    t0 = time.perf_counter()
    index = InvertedIndex.load(out / "index", Manifest.read(out / "index").n_docs, mmap=True, n_lists=VOCAB)
    result["load_seconds"] = round(time.perf_counter() - t0, 2)
    df = np.diff(np.asarray(index.indptr))
    result["postings"] = int(df.sum())
    result["df_max_fraction"] = round(float(df.max()) / args.docs, 3)
    result["tokens_in_no_doc"] = int((df == 0).sum())
    queries = make_queries(args.queries, args.query_tokens, cdf, perm, df, args.docs, args.seed + 1)
    result["numba"] = time_numba(index, queries, args.k)
    result["peak_rss_after_search_bytes"] = peak_rss_bytes()
    print(json.dumps(result), flush=True)
    del index

    if args.milvus_docs:
        from indexer.exports.milvus import export_milvus
        from retriever.backends.milvus import MilvusBackend

        sub = write_index(out / "index-milvus", out / "shards", n_shards, args.top_k, n_docs=args.milvus_docs)
        t0 = time.perf_counter()
        info = export_milvus(out / "index-milvus", str(out / "milvus.db"), collection="scale")
        m = {"docs": sub["n_docs"], "export_seconds": round(time.perf_counter() - t0, 1)}
        m["bytes"] = dir_bytes(out / "milvus.db")
        manifest = Manifest.read(out / "index-milvus")
        t0 = time.perf_counter()
        backend = MilvusBackend(out / "index-milvus", manifest, str(out / "milvus.db"), collection="scale")
        sub_index = InvertedIndex.load(out / "index-milvus", manifest.n_docs, n_lists=VOCAB)
        sub_df = np.diff(np.asarray(sub_index.indptr))
        mq = make_queries(args.milvus_queries, args.query_tokens, cdf, perm, sub_df, manifest.n_docs, args.seed + 2)
        backend.search_sparse("sparse", mq[0][0], mq[0][1], args.k)
        m["first_search_seconds"] = round(time.perf_counter() - t0, 1)  # loads the segment and builds its sparse index
        for threads in (1, 2):
            m[f"{threads}_threads"] = time_milvus(backend, mq, args.k, threads)
        m["numba_same_docs"] = time_numba(sub_index, mq, args.k)
        m["peak_rss_bytes"] = peak_rss_bytes()
        m["postings"] = info["postings"]
        result["milvus_lite"] = m
    print(json.dumps(result), flush=True)
    if args.results:
        write_scale_table(result, args.results)
    return 0


if __name__ == "__main__":
    sys.exit(main())
