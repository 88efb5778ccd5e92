"""Two ways to take a query's top k from its accumulators, timed side by side (issue 53, item 3).

The exact search adds every posting of every query token into one float per document, then ranks.
Until now it listed each document the first time a posting touched it (a branch per posting that the
CPU cannot predict where most documents are touched) and ranked that list; it can instead set a flag
per posting without a branch and rank all accumulators in one pass. The kernels pick the second from
``kernels.SCAN_WHOLE_FROM`` postings per document on (``auto``); this study forces each way
(``whole_from`` 0 or inf) on the same queries, one thread and split over 2 threads, checks that
every way returns the same ranking, and reports the p50s.

Reads the index a scale run wrote (``python -m experiments.scale --out DIR``: synthetic
512-token documents) and searches its first N documents, as ``experiments.split_search`` does:

    python -m experiments.accumulators --index /tmp/scale-262k/index --docs 10000,100000,262144 \\
        --out benchmarks/results/scale/accumulators.json
"""
from __future__ import annotations

import argparse
import functools
import os
import sys
import time
from pathlib import Path

import numba as nb
import numpy as np

from benchmarks.synthetic import first_documents
from indexer.kernels import _top_k

WAYS = {"touched list": np.inf, "one pass": 0.0}  # whole_from forcing each way


@nb.njit(cache=True)
def search_before(indptr, docs, weights, q_tokens, q_weights, n_docs, k):
    """The one-thread float32 search as it was before the two ways (commit 6ae1db2), the baseline:
    a touched list as long as the index whatever the query, and a branch per posting."""
    scores = np.zeros(n_docs, dtype=np.float32)
    seen = np.zeros(n_docs, dtype=np.bool_)
    touched = np.empty(n_docs, dtype=np.int32)
    n_touched = 0
    for j in range(q_tokens.shape[0]):
        t = q_tokens[j]
        if t < 0 or t >= indptr.shape[0] - 1:
            continue
        qw = q_weights[j]
        for p in range(indptr[t], indptr[t + 1]):
            d = docs[p]
            if not seen[d]:
                seen[d] = True
                touched[n_touched] = d
                n_touched += 1
            scores[d] += qw * weights[p]
    return _top_k(scores, touched, n_touched, k)


def searchers(indptr: np.ndarray, docs: np.ndarray, weights: np.ndarray, n: int, k: int, impacts: str) -> dict:
    """name -> search(tokens, weights): each way forced, and the shipped choice (``auto``), on one
    thread and split into 2 document ranges, on postings as stored (float32, or format 4 ``packed``)."""
    from indexer import kernels, packed_docs
    from indexer.inverted_index import quantise_weights

    if impacts == "float32":
        def one(t, w, f):
            return kernels.search_one(indptr, docs, weights, t, w, n, k, f)

        def split(t, w, f):
            return kernels.search_one_split(indptr, docs, weights, t, w, n, k, 2, f)
    else:
        codes, scale, offset = quantise_weights(indptr, weights)
        p = packed_docs.PackedDocs.pack(indptr, docs)
        arrays = (indptr, p.list_block, p.block_bit, p.first, p.width, p.words, codes, scale, offset)

        def one(t, w, f):
            return packed_docs.search_one(*arrays, t, w, n, k, f)

        def split(t, w, f):
            return packed_docs.search_one_split(*arrays, t, w, n, k, 2, f)
    out = {}
    if impacts == "float32":
        out["one thread, before"] = lambda t, w: search_before(indptr, docs, weights, t, w, n, k)
    for label, run in (("one thread", one), ("split over 2 threads", split)):
        for way, whole_from in {**WAYS, "auto": kernels.SCAN_WHOLE_FROM}.items():
            out[f"{label}, {way}"] = functools.partial(_call, run, whole_from)
    return out


def sparse_queries(n_queries: int, per_doc: float, df: np.ndarray, n_docs: int, seed: int = 2) -> list[tuple[np.ndarray, np.ndarray]]:
    """Queries of uncommon tokens (each in fewer than 5% of the documents, in random order) taken
    until they read ``per_doc`` postings per document: the short end that Zipfian queries, whose
    commonest token alone reads ~0.4 per document, never reach. Uniform random weights."""
    rng = np.random.default_rng(seed)
    pool = np.flatnonzero((df > 0) & (df < 0.05 * n_docs))
    out = []
    for _ in range(n_queries):
        tokens = rng.permutation(pool)
        m = int(np.searchsorted(np.cumsum(df[tokens]), per_doc * n_docs)) + 1
        out.append((tokens[:m].astype(np.int64), rng.random(m).astype(np.float32)))
    return out


def tiled(indptr: np.ndarray, docs: np.ndarray, weights: np.ndarray, n_docs: int, copies: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``copies`` copies of an index side by side: document d of copy r is r * n_docs + d (every
    list stays ascending). A larger index with the same list shapes, for timing only."""
    if copies == 1:
        return indptr, docs, weights
    lengths = np.diff(indptr)
    out_indptr = np.concatenate([[0], np.cumsum(lengths * copies)]).astype(np.int64)
    # posting p of list t in copy r lands at out_indptr[t] + r * len(t) + (p - indptr[t])
    list_of = np.repeat(np.arange(lengths.shape[0]), lengths)
    within = np.arange(docs.shape[0]) - indptr[list_of]
    out_docs = np.empty(docs.shape[0] * copies, np.int32)
    out_weights = np.empty(docs.shape[0] * copies, weights.dtype)
    for r in range(copies):
        at = out_indptr[list_of] + r * lengths[list_of] + within
        out_docs[at] = docs + r * n_docs
        out_weights[at] = weights
    return out_indptr, out_docs, out_weights


def _call(run, whole_from, tokens, weights):
    return run(tokens, weights, whole_from)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m experiments.accumulators", description=__doc__.split("\n\n")[0])
    p.add_argument("--index", type=Path, required=True, help="a scale run's index folder (OUT/index)")
    p.add_argument("--docs", default="10000,100000,262144", help="index sizes (first N documents), comma-separated")
    p.add_argument("--query-tokens", default="1,5,10,80", help="Zipfian queries of these token counts")
    p.add_argument("--sparse", default="0.001,0.05,0.1,0.2,0.3,0.5",
                   help="also queries of uncommon tokens reading these many postings per document (sparse_queries)")
    p.add_argument("--queries", type=int, default=60)
    p.add_argument("--rounds", type=int, default=2, help="passes over the queries, the ways interleaved query by query")
    p.add_argument("--k", type=int, default=10)
    p.add_argument("--tile", type=int, default=1, help="search R copies of the index side by side (R x its documents)")
    p.add_argument("--impacts", choices=("float32", "packed"), default="float32")
    p.add_argument("--out", type=Path, required=True)
    args = p.parse_args(argv)
    import numba

    from benchmarks.synthetic import VOCAB, make_queries, zipf_cdf
    from benchmarks.tables import write_table
    from indexer.inverted_index import InvertedIndex
    from indexer.manifest import Manifest

    full = InvertedIndex.load(args.index, Manifest.read(args.index).n_docs, mmap=False, n_lists=VOCAB)
    indptr_all, docs_all, weights_all = tiled(np.asarray(full.indptr), np.asarray(full.docs), np.asarray(full.weights), full.n_docs, args.tile)
    cdf, perm = zipf_cdf(VOCAB, 1.0, 0)  # the scale run's defaults (seed 0, s = 1)
    numba.set_num_threads(2)
    load_start = [round(x, 2) for x in os.getloadavg()]
    rows = []
    for n in (int(x) for x in args.docs.split(",")):
        n = min(n, full.n_docs * args.tile)
        indptr, docs, weights = first_documents(indptr_all, docs_all, weights_all, n)
        ways = searchers(indptr, docs, weights, n, args.k, args.impacts)
        # a negative m stands for a sparse query reading -m postings per document (see sparse_queries)
        for m in [int(x) for x in args.query_tokens.split(",")] + [-float(x) for x in args.sparse.split(",") if x]:
            queries = make_queries(args.queries, m, cdf, perm, np.diff(indptr), n, 1) if m > 0 else sparse_queries(args.queries, -m, np.diff(indptr), n)
            postings = float(np.median([np.diff(indptr)[t].sum() for t, _ in queries]))
            for t, w in queries[:2]:  # compile, warm
                for run in ways.values():
                    run(t, w)
            best = {name: np.full(len(queries), np.inf) for name in ways}  # each query's fastest pass
            same = True
            for _ in range(args.rounds):
                for i, (t, w) in enumerate(queries):
                    want = None
                    names = list(ways)
                    # every way on the same query in turn (drift hits all alike), the first way rotating
                    # from query to query (the first to read a query's postings reads them from memory)
                    for name in names[i % len(names):] + names[: i % len(names)]:
                        run = ways[name]
                        t0 = time.perf_counter()
                        got = run(t, w)
                        best[name][i] = min(best[name][i], time.perf_counter() - t0)
                        want = got if want is None else want
                        same &= bool(np.array_equal(got[0], want[0]) and np.array_equal(got[1], want[1]))
            for label in ("one thread", "split over 2 threads"):
                ms = {way: 1000 * float(np.median(best[f"{label}, {way}"])) for way in (*WAYS, "auto", "before") if f"{label}, {way}" in best}
                before = ms.get("before")
                row = [n, m if m > 0 else "sparse", round(postings / n, 3), label, round(before, 3) if before else "–", round(ms["touched list"], 3),
                       round(ms["one pass"], 3), round(ms["auto"], 3), round(before / ms["auto"], 2) if before else "–", "yes" if same else "NO"]
                print(row, file=sys.stderr, flush=True)
                rows.append(row)
    from indexer import kernels

    write_table(
        args.out,
        "Ranking a query's accumulators: the touched list against one pass over all of them (exact search, synthetic vectors"
        + (")" if args.impacts == "float32" else ", 8-bit impacts and bit-packed doc numbers)"),
        "python -m experiments.accumulators " + " ".join(argv if argv is not None else sys.argv[1:]),
        f"The first N documents of the scale run's index ({args.index}: 512 Zipfian tokens a document"
        + (f", {args.tile} copies side by side" if args.tile > 1 else "") + "), searched "
        + ("with float32 weights; " if args.impacts == "float32" else "with 8-bit impacts per list and bit-packed doc numbers (format 4); ")
        + f"{args.queries} queries of each token count (Zipfian tokens, IDF-weighted, as the scale run draws them) and of each "
        "'sparse' size (uncommon tokens until the query reads that many postings per document, random weights), "
        f"top-{args.k}. "
        "'before': the one-thread float32 search as it was at commit 6ae1db2 (search_before: a touched list as long as the index, "
        "a branch per posting). "
        f"Each way forced (whole_from inf: the touched list; 0: one pass) and auto (one pass from {kernels.SCAN_WHOLE_FROM} postings "
        f"per document on), every way on the same query in turn, the first way rotating; each query's fastest of {args.rounds} passes, then the median. "
        f"'same ranking': every way returned the same ids and scores on every query. 2 Numba threads ({numba.threading_layer()} layer); "
        f"load average at the start {load_start}, at the end {[round(x, 2) for x in os.getloadavg()]}.",
        ["docs", "query tokens", "postings per document (median query)", "search", "before p50 ms", "touched list p50 ms", "one pass p50 ms",
         "auto p50 ms", "speed-up of auto over before", "same ranking"],
        rows,
    )
    print(f"wrote {args.out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
