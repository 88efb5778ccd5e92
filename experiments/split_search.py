"""One query's exact search split by document range over two threads, against the one-thread search (issue 53).

Reads the index a scale run wrote (``python -m experiments.scale --out DIR``: synthetic
512-token documents) and, for each ``--docs`` size, searches its first N documents (every posting
list cut at doc N) with ``kernels.search_one`` and ``kernels.search_one_split`` (2 parts; with
``--impacts packed``, 8-bit impacts and bit-packed doc numbers: ``packed_docs.search_one`` and
``packed_docs.search_one_split``),
in alternating blocks of queries, checking that both return the same ranking. Queries are drawn as the
scale run draws them (Zipfian tokens, IDF-weighted), with each ``--query-tokens`` count: 80 stands
for an LLM-expanded query, 10 for a query's own tokens (the default profiles).

``--encoder NAME`` also times a sentence-encoder forward (a cisi query) right before each search, so
that a thread pool left spinning by the split search would show as a slower next forward (as
FAISS's OpenMP pool once did, README).

    python -m experiments.split_search --index /tmp/scale-262k/index --docs 1000,10000,100000,262144 \\
        --encoder minilm --queries-from ../shared/data/cisi --out benchmarks/results/scale/split-search.json
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import numpy as np

from benchmarks.synthetic import first_documents

BLOCK = 20  # queries in a row of one mode (exact, split), the modes alternating


def searches(indptr: np.ndarray, docs: np.ndarray, weights: np.ndarray, n: int, k: int, impacts: str):
    """(one-thread search, split search over 2 parts) of ``(tokens, weights)`` on these postings, as
    stored: float32 weights, or ``packed`` (8-bit impacts per list, doc numbers bit-packed: format 4)."""
    from indexer import kernels, packed_docs
    from indexer.inverted_index import quantise_weights

    if impacts == "float32":
        return (lambda t, w: kernels.search_one(indptr, docs, weights, t, w, n, k),
                lambda t, w: kernels.search_one_split(indptr, docs, weights, t, w, n, k, 2))
    codes, scale, offset = quantise_weights(indptr, weights)
    p = packed_docs.PackedDocs.pack(indptr, docs)
    arrays = (indptr, p.list_block, p.block_bit, p.first, p.width, p.words, codes, scale, offset)
    return (lambda t, w: packed_docs.search_one(*arrays, t, w, n, k),
            lambda t, w: packed_docs.search_one_split(*arrays, t, w, n, k, 2))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m experiments.split_search", description=__doc__.split("\n\n")[0])
    p.add_argument("--index", type=Path, required=True, help="a scale run's index folder (OUT/index)")
    p.add_argument("--docs", default="1000,10000,100000,262144", help="index sizes (first N documents), comma-separated")
    p.add_argument("--query-tokens", default="10,80")
    p.add_argument("--queries", type=int, default=100)
    p.add_argument("--k", type=int, default=10)
    p.add_argument("--impacts", choices=("float32", "packed"), default="float32",
                   help="the postings as searched: float32 weights, or 8-bit impacts with bit-packed doc numbers (format 4)")
    p.add_argument("--encoder", help="also time this sentence encoder's forward before each search")
    p.add_argument("--queries-from", type=Path, help="a BEIR folder whose queries.jsonl the encoder reads")
    p.add_argument("--out", type=Path, required=True)
    args = p.parse_args(argv)
    import numba

    from benchmarks.synthetic import VOCAB, make_queries, zipf_cdf
    from benchmarks.tables import write_table
    from indexer.inverted_index import InvertedIndex
    from indexer.manifest import Manifest

    if args.encoder and not args.queries_from:
        p.error("--encoder needs --queries-from (the texts it encodes)")
    full = InvertedIndex.load(args.index, Manifest.read(args.index).n_docs, mmap=False, n_lists=VOCAB)
    encode = None
    if args.encoder:
        from embedder.sentence_encoder import SentenceEncoder

        encoder = SentenceEncoder.load(args.encoder)
        with (args.queries_from / "queries.jsonl").open(encoding="utf-8") as f:
            texts = [json.loads(line)["text"] for line in f if line.strip()]
        encode = lambda i: encoder.encode([texts[i % len(texts)]])
    cdf, perm = zipf_cdf(VOCAB, 1.0, 0)  # the scale run's defaults (seed 0, s = 1)
    numba.set_num_threads(2)
    load_start = [round(x, 2) for x in os.getloadavg()]
    rows = []
    for n in (int(x) for x in args.docs.split(",")):
        n = min(n, full.n_docs)
        indptr, docs, weights = first_documents(np.asarray(full.indptr), np.asarray(full.docs), np.asarray(full.weights), n)
        for m in (int(x) for x in args.query_tokens.split(",")):
            queries = make_queries(args.queries, m, cdf, perm, np.diff(indptr), n, 1)
            one, split = searches(indptr, docs, weights, n, args.k, args.impacts)
            for t, w in queries[:3]:  # compile, warm
                one(t, w)
                split(t, w)
            times: dict[str, list[float]] = {"exact": [], "split": [], "exact_forward": [], "split_forward": []}
            got: dict[str, list] = {"exact": [None] * len(queries), "split": [None] * len(queries)}
            # blocks of one mode at a time, alternating: inside a block each forward follows a search of
            # the same mode, so a pool the split search leaves spinning shows in "split_forward"
            for start in [s for _ in range(2) for s in range(0, len(queries), BLOCK)]:
                for mode in ("exact", "split"):
                    for i in range(start, min(start + BLOCK, len(queries))):
                        t, w = queries[i]
                        t0 = time.perf_counter()
                        if encode is not None:
                            encode(i)
                        t1 = time.perf_counter()
                        got[mode][i] = one(t, w) if mode == "exact" else split(t, w)
                        t2 = time.perf_counter()
                        times[mode].append(t2 - t1)
                        if i > start:  # the block's first forward follows the other mode
                            times[mode + "_forward"].append(t1 - t0)
            same = all(np.array_equal(a, b) for x, y in zip(got["exact"], got["split"]) for a, b in zip(x, y))
            ms = {key: round(1000 * float(np.median(v)), 3) for key, v in times.items()}
            row = [n, int(indptr[-1]), m, ms["exact"], ms["split"], round(ms["exact"] / ms["split"], 2),
                   ms["exact_forward"] if encode else "–", ms["split_forward"] if encode else "–", "yes" if same else "NO"]
            print(row, file=sys.stderr, flush=True)
            rows.append(row)
    write_table(
        args.out,
        "One query split by document range over 2 threads vs one thread (exact search, synthetic vectors"
        + (")" if args.impacts == "float32" else ", 8-bit impacts and bit-packed doc numbers)"),
        "python -m experiments.split_search " + " ".join(argv if argv is not None else sys.argv[1:]),
        f"The first N documents of the scale run's index ({args.index}: 512 Zipfian tokens a document), searched "
        + ("with float32 weights; " if args.impacts == "float32" else "with 8-bit impacts per list and bit-packed doc numbers (format 4); ")
        + f"{args.queries} queries of each token count, IDF-weighted, top-{args.k}; p50 of the search alone, both searches "
        "in alternating blocks. "
        + (f"Before each search, one {args.encoder} forward of a query of {args.queries_from}; the modes run in alternating "
           f"blocks of {BLOCK} queries (twice), so a forward column is the forward after a search of the same mode: a pool left "
           "spinning by the split search would slow it. " if encode else "")
        + f"2 Numba threads ({numba.threading_layer()} layer); load average at the start {load_start}.",
        ["docs", "postings", "query tokens", "one thread p50 ms", "split p50 ms", "speed-up", "forward p50 ms after one-thread",
         "forward p50 ms after split", "same ranking"],
        rows,
    )
    print(f"wrote {args.out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
