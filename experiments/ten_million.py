"""Ten million synthetic documents on one machine (issue 53): build, size, memory, speed and recall.

``build`` draws the scale run's synthetic corpus (benchmarks/synthetic.py: K Zipfian tokens a
document, logits uniform in 15-35; :func:`benchmarks.synthetic.zipf_documents`, the same documents
whichever shard asks) and writes it straight to format-5 postings
(:func:`indexer.range_docs.write_from_shards`: 8-bit impacts per list, doc numbers as 16-bit offsets
in ranges of 65,536 documents), one 65,536-document shard at a time, drawn twice (counting, then
placing): memory is one shard and the per-list tables, whatever the number of documents.

``measure`` opens the postings memory-mapped, reads them once into the page cache (the index must
fit in RAM), and searches ``--queries`` queries of ``--query-tokens`` Zipfian IDF-weighted tokens
(as the scale run draws them) with ``InvertedIndex.search``: exactly (one thread, then all, k=10 and
k=100; ``--format-3``: also with int32 doc numbers, ``--four-bit``: also with 4-bit impacts, both made in
memory from the same postings), and pruned (indexer/query_pruning.py: the fewest highest-weight tokens covering
``keep_mass`` of the query's weight, the top ``--depth`` of the pruned query rescored exactly with
the dropped tokens), each with recall@10 against the exact top 10. Times are each query's fastest
of ``--rounds`` passes; p50 and p99 over the queries.

    python -m experiments.ten_million build --docs 10000000 --out /work/runs/s16/ten-million
    python -m experiments.ten_million measure --out /work/runs/s16/ten-million --results benchmarks/results/scale/ten-million.json
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import numba
import numpy as np
from tqdm.auto import tqdm

from benchmarks.synthetic import VOCAB, make_queries, zipf_cdf, zipf_documents, zipf_table
from benchmarks.tables import study_command
from embedder.util import write_json_atomic
from indexer.range_docs import RANGE

SHARD = RANGE  # documents drawn and placed at a time
BUILD = "build.json"


def shards_of(n_docs: int, k: int, zipf_s: float, seed: int, desc: str):
    """The ``shards()`` callable :func:`indexer.range_docs.write_from_shards` reads: the corpus in
    shards of :data:`SHARD` documents, with a progress bar (documents a second) on each pass."""
    prob, alias = zipf_table(VOCAB, zipf_s)
    _, perm = zipf_cdf(VOCAB, zipf_s, seed)
    passes = iter(("count", "place"))

    def shards():
        bar = tqdm(total=n_docs, desc=f"{desc}: {next(passes, 'pass')}", unit="doc", unit_scale=True, file=sys.stderr)
        for first in range(0, n_docs, SHARD):
            n = min(SHARD, n_docs - first)
            yield zipf_documents(first, n, k, prob, alias, perm, seed)
            bar.update(n)
        bar.close()

    return shards


def build(out: Path, n_docs: int, k: int, zipf_s: float, seed: int) -> dict:
    """Write the postings under ``out``/index (atomically: a staging directory renamed at the end)."""
    from indexer.range_docs import write_from_shards

    final = out / "index"
    if final.exists():
        raise FileExistsError(f"{final} exists: remove it to build again")
    stage = out / ".index.partial"
    stage.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    write_from_shards(shards_of(n_docs, k, zipf_s, seed, f"{n_docs:,} documents"), VOCAB, stage)
    seconds = time.perf_counter() - t0
    files = {p.name: p.stat().st_size for p in sorted(stage.glob("postings_*.npy"))}
    info = {"n_docs": n_docs, "top_k": k, "zipf_s": zipf_s, "seed": seed, "vocab": VOCAB, "build_seconds": round(seconds, 1),
            "files": files, "bytes_per_doc": round(sum(files.values()) / n_docs, 1), "cpu_count": os.cpu_count()}
    write_json_atomic(stage / BUILD, info, indent=1, newline=True)
    os.replace(stage, final)
    return info


def _rss() -> dict:
    """This process's resident memory now and at its peak (bytes), from /proc/self/status."""
    out = {}
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(("VmRSS:", "VmHWM:")):
            out[line.split(":")[0]] = int(line.split()[1]) * 1024
    return out


def _timed(run, queries, rounds: int) -> tuple[list, np.ndarray]:
    """(each query's result, each query's fastest time in seconds over ``rounds`` passes)."""
    best = np.full(len(queries), np.inf)
    results: list = [None] * len(queries)
    for _ in range(rounds):
        for i, q in enumerate(queries):
            t0 = time.perf_counter()
            results[i] = run(*q)
            best[i] = min(best[i], time.perf_counter() - t0)
    return results, best


def _recall(got: list, want: list, k: int = 10) -> float:
    return float(np.mean([len(set(map(int, g[0][:k])) & set(map(int, w[0][:k]))) / max(1, min(k, len(w[0]))) for g, w in zip(got, want)]))


def four_bit_copy(index):
    """``index`` (8-bit impacts) with 4-bit impacts as format 6 stores them: each list's codes
    requantised to 16 levels over the same [min, max] (code // 17, rounded: a step of 17 of the
    256 levels, so the list's scale times 17), packed two a byte in memory, a block at a time.
    (A build quantises the float weights to 16 levels directly; from the 8-bit codes a weight can
    round the other way where it lies within half an 8-bit step of a 16-level boundary.)"""
    from indexer import kernels
    from indexer.inverted_index import InvertedIndex

    codes = index.weights
    packed = np.empty((codes.shape[0] + 1) // 2, np.uint8)
    for s in range(0, codes.shape[0], 1 << 26):  # an even block size: each block starts on a byte
        block = np.rint(np.asarray(codes[s : s + (1 << 26)], np.float32) / 17).astype(np.uint8)
        packed[s // 2 : s // 2 + (block.shape[0] + 1) // 2] = kernels.pack_nibbles(block)
    return InvertedIndex(index.indptr, index.numbers, packed.view(kernels.NIBBLES), index.n_docs, (index.scale * 17).astype(np.float32),
                         index.offset)


def measure(out: Path, results: Path, n_queries: int, query_tokens: int, rounds: int, keep_masses: list[float], depths: list[int],
            threads: list[int], command: str, format_3: bool = False, four_bit: bool = False) -> None:
    from benchmarks.tables import write_table
    from indexer.codec import PostingsCodec
    from indexer.inverted_index import InvertedIndex
    from indexer.query_pruning import prune_query, pruned_search

    index_dir = out / "index"
    info = json.loads((index_dir / BUILD).read_text())
    n_docs = int(info["n_docs"])
    t0 = time.perf_counter()
    index = InvertedIndex.load(index_dir, n_docs, mmap=True, codec=PostingsCodec.named("range16", 8))
    load_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    checksum = 0
    for a in (index.ranges.low, index.weights):  # into the page cache, and resident: the index must fit in RAM
        for s in range(0, a.shape[0], 1 << 28):
            checksum += int(np.asarray(a[s : s + (1 << 28)]).sum(dtype=np.uint64))
    warm_s = time.perf_counter() - t0
    rss_warm = _rss()
    cdf, perm = zipf_cdf(VOCAB, info["zipf_s"], info["seed"])
    df = np.diff(np.asarray(index.indptr))
    queries = make_queries(n_queries, query_tokens, cdf, perm, df, n_docs, info["seed"] + 1)
    postings = [int(df[t].sum()) for t, _ in queries]
    rows, details = [], {"build": info, "load_seconds": round(load_s, 2), "warm_seconds": round(warm_s, 1), "rss_after_warm": rss_warm,
                         "postings_per_query_median": int(np.median(postings)), "checksum": checksum % 997}
    all_threads = max(threads)
    exact = {}
    for k in (10, 100):
        for th in threads:
            numba.set_num_threads(th)
            got, secs = _timed(lambda t, w, k=k: index.search(t, w, k), queries, rounds)
            exact[k, th] = got
            rows.append(["exact", "–", 1.0, k, th, _recall(got, exact[k, threads[0]], k), round(1000 * np.percentile(secs, 50), 2),
                         round(1000 * np.percentile(secs, 99), 2)])
            print(rows[-1], file=sys.stderr, flush=True)
    same = all(np.array_equal(a[0], b[0]) and np.array_equal(a[1], b[1]) for th in threads for a, b in zip(exact[10, th], exact[10, threads[0]]))
    details["exact_same_on_every_thread_count"] = same
    if format_3:  # the same postings with int32 doc numbers (decoded into memory), the same queries
        plain = InvertedIndex(index.indptr, index.doc_numbers(), index.weights, n_docs, index.scale, index.offset)
        for th in threads:
            numba.set_num_threads(th)
            got, secs = _timed(lambda t, w: plain.search(t, w, 10), queries, rounds)
            rows.append(["exact, format 3", "–", 1.0, 10, th, _recall(got, exact[10, threads[0]]), round(1000 * np.percentile(secs, 50), 2),
                         round(1000 * np.percentile(secs, 99), 2)])
            details.setdefault("format_3_same_as_format_5", True)
            details["format_3_same_as_format_5"] &= all(np.array_equal(a[0], b[0]) and np.array_equal(a[1], b[1]) for a, b in zip(got, exact[10, th]))
            print(rows[-1], file=sys.stderr, flush=True)
        del plain
    if four_bit:  # the same postings with 4-bit impacts (format 6), the same queries
        nib = four_bit_copy(index)
        details["four_bit_impact_bytes"] = int(nib.weights.nbytes)
        for th in threads:
            numba.set_num_threads(th)
            got, secs = _timed(lambda t, w: nib.search(t, w, 10), queries, rounds)
            rows.append(["exact, 4-bit impacts", "–", 1.0, 10, th, _recall(got, exact[10, threads[0]]), round(1000 * np.percentile(secs, 50), 2),
                         round(1000 * np.percentile(secs, 99), 2)])
            print(rows[-1], file=sys.stderr, flush=True)
        details["rss_with_four_bit_copy"] = _rss()
    numba.set_num_threads(all_threads)
    searched = [("", index)] + ([(", 4-bit impacts", nib)] if four_bit else [])
    for keep in keep_masses:
        kept = float(np.mean([int(df[prune_query(t, w, keep)[0]].sum()) / max(1, p) for (t, w), p in zip(queries, postings)]))
        for depth in depths:
            for label, postings_index in searched:
                got, secs = _timed(lambda t, w, keep=keep, depth=depth, x=postings_index: pruned_search(x, t, w, 10, keep, depth), queries, rounds)
                rows.append([f"pruned {keep}{label}", depth, round(kept, 3), 10, all_threads, _recall(got, exact[10, threads[0]]),
                             round(1000 * np.percentile(secs, 50), 2), round(1000 * np.percentile(secs, 99), 2)])
                print(rows[-1], file=sys.stderr, flush=True)
    details["rss_at_end"] = _rss()
    files = info["files"]
    write_table(
        results,
        f"{n_docs:,} synthetic documents in format 5 (8-bit impacts, range-blocked doc numbers): exact and pruned search, memory-mapped",
        command,
        f"Built by `python -m experiments.ten_million build --docs {n_docs}` in {info['build_seconds']} s ({info['top_k']} Zipfian tokens "
        f"a document, s={info['zipf_s']}, logits uniform in 15-35, drawn twice; {info['bytes_per_doc']} bytes a document of postings: "
        + ", ".join(f"{k} {v / 1e9:.2f} GB" for k, v in files.items())
        + f"). Read once into the page cache ({warm_s:.0f} s), then {n_queries} queries of {query_tokens} Zipfian IDF-weighted tokens "
        f"(median {int(np.median(postings)):,} postings a query, {np.median(postings) / n_docs:.2f} a document), through InvertedIndex.search "
        "(ranges in parallel from 65,536 postings on). 'pruned m': the fewest highest-weight query tokens covering m of the query's weight, "
        "searched to the given depth, then rescored exactly with the dropped tokens (indexer.query_pruning.rescore) and cut to 10; "
        "'exact, format 3': the same postings with their doc numbers decoded to int32 in memory (format 3, split into L2-sized ranges "
        "where a query reads 65,536 postings or more); 'exact, 4-bit impacts': the same postings with each list's codes requantised "
        "to 16 levels (four_bit_copy) and packed two a byte in memory, recall against the 8-bit exact top 10 (so too for 'pruned m, 4-bit impacts'). 'postings kept': the pruned queries' share of the exact ones'. recall@k: share of the exact top-k (one thread) found. "
        f"Times: each query's fastest of {rounds} passes; p50 and p99 over the queries. Resident memory after the warm read: "
        f"{rss_warm.get('VmRSS', 0) / 2**30:.1f} GiB (the memory map counts once read). Numba {numba.threading_layer()} layer.",
        ["search", "depth", "postings kept", "k", "threads", "recall@k vs exact", "p50 ms", "p99 ms"],
        rows,
        details,
    )


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    b = sub.add_parser("build", help="draw the corpus and write its format-5 postings")
    b.add_argument("--docs", type=int, required=True)
    b.add_argument("--out", type=Path, required=True, help="a directory outside the repository (the postings go to OUT/index)")
    b.add_argument("--top-k", type=int, default=512, help="tokens a document")
    b.add_argument("--zipf-s", type=float, default=1.0)
    b.add_argument("--seed", type=int, default=0)
    m = sub.add_parser("measure", help="search the built postings")
    m.add_argument("--out", type=Path, required=True)
    m.add_argument("--results", type=Path, required=True)
    m.add_argument("--queries", type=int, default=100)
    m.add_argument("--query-tokens", type=int, default=80)
    m.add_argument("--rounds", type=int, default=2)
    m.add_argument("--keep-mass", default="0.99,0.98,0.95,0.9")
    m.add_argument("--depth", default="100,1000", help="pruned search depths rescored")
    m.add_argument("--threads", default="1,2")
    m.add_argument("--format-3", action="store_true", help="also search the postings with int32 doc numbers (decoded into memory: 4 bytes a posting)")
    m.add_argument("--four-bit", action="store_true", help="also search the postings with 4-bit impacts (requantised and packed in memory: half a byte a posting)")
    args = p.parse_args(argv)
    if args.cmd == "build":
        info = build(args.out, args.docs, args.top_k, args.zipf_s, args.seed)
        print(json.dumps(info, indent=1))
        return 0
    command = study_command("experiments.ten_million", argv)
    measure(args.out, args.results, args.queries, args.query_tokens, args.rounds, [float(x) for x in args.keep_mass.split(",")],
            [int(x) for x in args.depth.split(",")], [int(x) for x in args.threads.split(",")], command, args.format_3, args.four_bit)
    print(f"wrote {args.results}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
