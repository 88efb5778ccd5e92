"""Real vectors at scale (issue 53, items 1 and 4): the long sides of the training pairs as a corpus,
encoded by the engine, and the engine's exact search beside Seismic and BMP on the same vectors.

The pairs (``../shared/data/pairs``) are training data: here they are used only for *size and speed*
(how real aligned-token vectors are distributed, what a search over them costs), never to report
retrieval quality. Three steps:

1. ``corpus``: the distinct positives of every pairs file, in a seeded shuffle, the first ``--docs``
   of them as a BEIR corpus, and the anchor of each chosen document's pair as a query
   (``queries.jsonl``), both written outside the repository::

       python -m experiments.real_vectors corpus --pairs ../shared/data/pairs --docs 20000 --out /work/runs/real

2. The engine's own build of it (sharded and resumable, so it can run in the background over
   several sittings)::

       build-index --corpus /work/runs/real/corpus --index /work/runs/real/index --channels sparse,dense

3. ``measure``: the distribution of the index's weights and posting-list lengths beside the
   synthetic corpus of the same size (benchmarks/synthetic.py), the queries encoded by the LLM as
   the Retriever searches them, and the exact search (one thread and split over the cores, k=10 and
   k=100) beside Seismic (``pyseismic-lsr``) and BMP (``bmp``) at several settings, with recall@10
   against the exact search::

       python -m experiments.real_vectors measure --out /work/runs/real --results benchmarks/results/scale/real-vectors.json

4. ``fitted``: a larger corpus generated in the real index's shape (each token drawn in proportion to
   its real document frequency, weights drawn from the real weights), searched exactly with the
   same real queries, as 8-bit impacts (format 3) and bit-packed (format 4)::

       python -m experiments.real_vectors fitted --out /work/runs/real --docs 1000000 --results benchmarks/results/scale/real-shaped-1m.json
"""
from __future__ import annotations

import argparse
import csv
import json
import os
import shutil
import sys
import time
from pathlib import Path

import numpy as np

from embedder.util import write_text_atomic

SEED = 20261128


def read_pairs(pairs: Path) -> list[tuple[str, str, str]]:
    """(document id, anchor, positive) of every row of every ``*.tsv`` under ``pairs``, in file and
    row order; the id names the file and the line (``debian:17``)."""
    files = sorted(pairs.glob("*.tsv"))
    if not files:
        raise FileNotFoundError(f"{pairs}: no *.tsv pairs files (expected ../shared/data/pairs, see its README)")
    rows = []
    for path in files:
        with path.open(encoding="utf-8", newline="") as f:
            reader = csv.reader(f, delimiter="\t", quoting=csv.QUOTE_NONE)
            header = next(reader, None)
            if not header or header[:2] != ["anchor", "positive"]:
                raise ValueError(f"{path}:1: header must start with anchor<TAB>positive, got {header!r}")
            for line, row in enumerate(reader, start=2):
                if len(row) < 2 or not row[0].strip() or not row[1].strip():
                    raise ValueError(f"{path}:{line}: field {'anchor' if not row or not row[0].strip() else 'positive'} is missing or empty")
                rows.append((f"{path.stem}:{line}", row[0], row[1]))
    return rows


def choose_documents(rows: list[tuple[str, str, str]], n_docs: int, seed: int = SEED) -> list[tuple[str, str, str]]:
    """The first ``n_docs`` rows of a seeded shuffle whose positive was not seen before (a positive
    shared by several rows, such as a SciTLDR abstract, is one document)."""
    order = np.random.default_rng(seed).permutation(len(rows))
    seen: set[str] = set()
    chosen = []
    for i in order:
        doc_id, anchor, positive = rows[int(i)]
        if positive in seen:
            continue
        seen.add(positive)
        chosen.append((doc_id, anchor, positive))
        if len(chosen) == n_docs:
            break
    if len(chosen) < n_docs:
        raise ValueError(f"only {len(chosen)} distinct positives in the pairs, {n_docs} asked")
    return chosen


def write_corpus(pairs: Path, n_docs: int, out: Path) -> dict:
    """``out/corpus/corpus.jsonl`` (the chosen positives) and ``out/corpus/queries.jsonl`` (their
    anchors, query id = document id), each written to a temporary file and renamed."""
    chosen = choose_documents(read_pairs(pairs), n_docs)
    folder = out / "corpus"
    folder.mkdir(parents=True, exist_ok=True)
    write_text_atomic(folder / "corpus.jsonl", "".join(json.dumps({"_id": d, "title": "", "text": p}) + "\n" for d, _, p in chosen))
    write_text_atomic(folder / "queries.jsonl", "".join(json.dumps({"_id": d, "text": a}) + "\n" for d, a, _ in chosen))
    by_file: dict[str, int] = {}
    for d, _, _ in chosen:
        by_file[d.split(":")[0]] = by_file.get(d.split(":")[0], 0) + 1
    info = {"pairs": str(pairs), "docs": n_docs, "seed": SEED, "by_file": by_file}
    write_text_atomic(folder / "corpus-info.json", json.dumps(info, indent=1) + "\n")
    return info


# ------------------------------------------------------------------------------ measure
K_VALUES = (10, 100)
SEISMIC_SETTINGS = ((10, 0.8), (20, 0.9), (50, 0.9), (50, 1.0), (0, 1.0))  # (query_cut, heap_factor); query_cut 0: every query token
BMP_ALPHAS = (1.0, 0.9, 0.8, 0.6)  # block-termination threshold; 1.0 is BMP's exact search (over its integer impacts)
PRUNE_MASSES = (0.95, 0.9, 0.8)  # query pruning: share of the query's bound mass kept
RESCORE_DEPTH = 100
BMP_SCALE = 255.0  # BMP stores integer impacts: weights scaled so the largest is 255 (8 bits, as the engine's default)


def distribution(index, sample: int = 500_000, seed: int = 0) -> dict:
    """How an index's weights and posting lists are spread: the figures that decide what a scan costs
    (a token in most documents costs a pass over most of the corpus) and what 8-bit impacts lose."""
    weights = np.asarray(index.float_weights())
    rng = np.random.default_rng(seed)
    w = weights[rng.choice(weights.size, min(weights.size, sample), replace=False)] if weights.size else weights
    df = np.diff(np.asarray(index.indptr))
    nonempty = np.sort(df[df > 0])[::-1]
    share = nonempty / index.n_docs
    top = lambda n: round(float(nonempty[:n].sum() / max(nonempty.sum(), 1)), 4)
    return {
        "docs": int(index.n_docs),
        "postings": int(df.sum()),
        "postings_per_doc": round(float(df.sum()) / max(index.n_docs, 1), 1),
        "lists": int(nonempty.size),
        "weight_percentiles": {str(p): round(float(np.percentile(w, p)), 3) for p in (1, 10, 50, 90, 99)} if w.size else {},
        "list_share_percentiles": {str(p): round(float(np.percentile(share, p)), 5) for p in (50, 90, 99, 99.9)} if share.size else {},
        "lists_in_half_the_docs": int((share >= 0.5).sum()),
        "postings_in_top_100_lists": top(100),
        "postings_in_top_1000_lists": top(1000),
    }


def synthetic_like(n_docs: int, doc_tokens: int, seed: int = 0):
    """The synthetic corpus of benchmarks/synthetic.py at the same size (Zipf s = 1, the scale run's)."""
    from benchmarks.synthetic import VOCAB, synthetic_shard, zipf_cdf
    from indexer.inverted_index import InvertedIndex

    cdf, perm = zipf_cdf(VOCAB, 1.0, seed)
    tokens, weights = synthetic_shard(n_docs, doc_tokens, cdf, perm, seed)
    return InvertedIndex.from_forward(tokens, weights, VOCAB)


def encode_queries(index_dir: Path, texts: list[str]) -> list[tuple[np.ndarray, np.ndarray]]:
    """The queries as the Retriever searches the aligned-token channel with LLM queries: the literal
    tokens plus the top-M aligned tokens, IDF-weighted (token ids, weights)."""
    from retriever.retriever import Retriever

    with Retriever.load(index_dir, profile=None, query_encoder="llm", warm=False) as r:
        encoded = r.encode(texts, "sparse")
    return [(np.asarray(q.tokens, np.int64), np.asarray(q.weights, np.float32)) for q in encoded]


def recall_at(exact: np.ndarray, got, k: int) -> float:
    """Share of the exact top-k found in the approximate top-k."""
    want = {int(d) for d in exact[:k] if d >= 0}
    return len(want & {int(d) for d in list(got)[:k]}) / max(len(want), 1)


def timed(search, queries, rounds: int) -> tuple[list, list[float]]:
    """Each query's result and its fastest time over ``rounds`` passes (the first pass also warms)."""
    best = [float("inf")] * len(queries)
    out: list = [None] * len(queries)
    for _ in range(rounds):
        for i, (t, w) in enumerate(queries):
            t0 = time.perf_counter()
            out[i] = search(t, w)
            best[i] = min(best[i], time.perf_counter() - t0)
    return out, best


def engine_rows(index, queries, rounds: int) -> tuple[list[dict], dict[int, list[np.ndarray]]]:
    """The exact search on one thread and split over the cores, at each k; the exact top-k lists."""
    import numba

    from indexer.query_pruning import list_max_weights

    rows, exact = [], {}
    threads = numba.config.NUMBA_NUM_THREADS
    for k in K_VALUES:
        for n_threads in sorted({1, threads}):
            numba.set_num_threads(n_threads)
            for t, w in queries[:3]:
                index.search(t, w, k)
            got, secs = timed(lambda t, w, k=k: index.search(t, w, k), queries, rounds)
            if n_threads == 1:
                exact[k] = [d for d, _ in got]
            split = sum(index.search_parts(t) > 1 for t, _ in queries)  # InvertedIndex.search splits the queries that read many postings
            rows.append({"system": "engine, exact" + ("" if n_threads == 1 else f", {n_threads} threads"), "k": k,
                         "setting": f"{n_threads} thread(s); {split} of {len(queries)} queries split ({index.search_parts()} parts), "
                                    f"the others on one thread", "secs": secs,
                         "recall": [recall_at(exact[k][i], got[i][0], k) for i in range(len(queries))]})
    # the engine's own approximation (indexer/query_pruning.py): the lowest-bound query tokens dropped,
    # the pruned query's top candidates rescored exactly with them
    list_max = list_max_weights(index)
    for keep_mass in PRUNE_MASSES:
        for k in K_VALUES:
            got, secs = timed(lambda t, w, k=k, m=keep_mass: pruned_search(index, t, w, k, m, list_max), queries, rounds)
            rows.append({"system": f"engine, query pruning + rescore, {threads} threads", "k": k,
                         "setting": f"value bound, keep_mass {keep_mass}, rescore top {rescore_depth(k)}", "secs": secs,
                         "recall": [recall_at(exact[k][i], got[i][0], k) for i in range(len(queries))]})
    numba.set_num_threads(threads)
    return rows, exact


def rescore_depth(k: int) -> int:
    """Candidates a pruned query rescores: :data:`RESCORE_DEPTH`, and twice k for a deeper k."""
    return max(RESCORE_DEPTH, 2 * k)


def pruned_search(index, tokens: np.ndarray, weights: np.ndarray, k: int, keep_mass: float, list_max: np.ndarray):
    """Top-k of the query without its lowest-bound tokens, its top :func:`rescore_depth` rescored exactly with them."""
    from indexer.query_pruning import kept_positions, rescore, token_values

    keep = kept_positions(token_values(tokens, weights, list_max), keep_mass)
    docs, scores = index.search(tokens[keep], weights[keep], rescore_depth(k))
    dropped = np.ones(len(tokens), bool)
    dropped[keep] = False
    return rescore(index, docs, scores, tokens[dropped], weights[dropped], k)


def seismic_rows(index, queries, exact: dict, rounds: int, n_postings: int, work: Path) -> tuple[list[dict], dict]:
    """Seismic (pyseismic-lsr) built from the index's own (dequantised) vectors, searched one query at a time."""
    import seismic

    csr = index.doc_vectors().tocsr()
    csr.sort_indices()
    ds = seismic.SeismicDataset()
    ds.add_documents_by_id([str(i) for i in range(csr.shape[0])], csr.indices.astype(np.int64), csr.data.astype(np.float32), csr.indptr.astype(np.int64))
    t0 = time.perf_counter()
    sx = seismic.SeismicIndex.build_from_dataset(ds, n_postings=n_postings, num_threads=os.cpu_count())
    build_s = time.perf_counter() - t0
    saved = work / "seismic"
    sx.save(str(saved))
    saved_file = work / "seismic.index.seismic"  # SeismicIndex.save adds its extension
    size = saved_file.stat().st_size
    saved_file.unlink()
    string = seismic.get_seismic_string()
    q_str = [(np.asarray([str(int(x)) for x in t], dtype=string), np.asarray(w, np.float32)) for t, w in queries]
    rows = []
    for cut, heap in SEISMIC_SETTINGS:
        for k in K_VALUES:
            def search(t, w, cut=cut, heap=heap, k=k):
                res = sx.search("q", t, w, k=k, query_cut=cut or len(t), heap_factor=heap)
                return [int(d) for _, _, d in res]
            search(*q_str[0])
            got, secs = timed(search, q_str, rounds)
            rows.append({"system": "Seismic", "k": k, "setting": f"n_postings {n_postings}, query_cut {cut or 'all'}, heap_factor {heap}",
                         "secs": secs, "recall": [recall_at(exact[k][i], got[i], k) for i in range(len(queries))]})
    return rows, {"build_s": round(build_s, 1), "n_postings": n_postings, "bytes": size}


def bmp_rows(index, queries, exact: dict, rounds: int, work: Path) -> tuple[list[dict], dict]:
    """BMP (block-max pruning, bsize 32) over the same vectors as integer impacts, searched one query at a time."""
    import bmp

    csr = index.doc_vectors().tocsr()
    top = float(csr.data.max()) if csr.nnz else 1.0
    path = work / "index.bmp"
    path.unlink(missing_ok=True)
    t0 = time.perf_counter()
    ix = bmp.Indexer(str(path), bsize=32, compress_range=False)
    for d in range(csr.shape[0]):
        lo, hi = csr.indptr[d], csr.indptr[d + 1]
        impacts = np.maximum(np.rint(csr.data[lo:hi] / top * BMP_SCALE), 1).astype(np.int64)  # a stored token keeps impact >= 1
        ix.add_document(str(d), dict(zip(map(str, csr.indices[lo:hi].tolist()), impacts.tolist())))
    ix.finish()
    build_s = time.perf_counter() - t0
    searcher = bmp.Searcher(str(path))
    q_bmp = [({str(int(x)): float(v) for x, v in zip(t, w)}, None) for t, w in queries]  # BMP quantises a query's weights itself
    rows = []
    for alpha in BMP_ALPHAS:
        for k in K_VALUES:
            def search(q, _, alpha=alpha, k=k):
                return [int(d) for d in searcher.search(q, k=k, alpha=alpha, beta=1.0)[0]]
            search(*q_bmp[0])
            got, secs = timed(search, q_bmp, rounds)
            rows.append({"system": "BMP", "k": k, "setting": f"bsize 32, alpha {alpha}, beta 1.0", "secs": secs,
                         "recall": [recall_at(exact[k][i], got[i], k) for i in range(len(queries))]})
    return rows, {"build_s": round(build_s, 1), "bytes": path.stat().st_size}


def index_bytes(index_dir: Path) -> int:
    """Bytes of the aligned-token channel's posting files."""
    return sum(p.stat().st_size for p in Path(index_dir).glob("postings_*"))


def measure(out: Path, results: Path, n_queries: int, rounds: int, n_postings: int, argv: list[str]) -> None:
    from benchmarks.provenance import load_avg
    from benchmarks.tables import write_table
    from indexer.codec import PostingsCodec
    from indexer.inverted_index import InvertedIndex
    from indexer.manifest import Manifest

    index_dir = out / "index"
    manifest = Manifest.read(index_dir)
    index = InvertedIndex.load(index_dir, manifest.n_docs, mmap=False, n_lists=int(manifest.record("sparse")["vocab_size"]),
                               codec=PostingsCodec.of_record(manifest.record("sparse"), index_dir))
    with (out / "corpus" / "queries.jsonl").open(encoding="utf-8") as f:
        texts = [json.loads(line)["text"] for line in f if line.strip()][:n_queries]
    t0 = time.perf_counter()
    queries = encode_queries(index_dir, texts)
    encode_s = time.perf_counter() - t0
    df = np.diff(np.asarray(index.indptr))
    real = distribution(index)
    real["query_tokens"] = round(float(np.mean([len(t) for t, _ in queries])), 1)
    real["query_postings_per_doc"] = round(float(np.mean([df[t].sum() for t, _ in queries])) / index.n_docs, 2)
    synth = distribution(synthetic_like(index.n_docs, round(real["postings_per_doc"])))
    load_start = load_avg()
    engine, exact = engine_rows(index, queries, rounds)
    seismic, seismic_info = seismic_rows(index, queries, exact, rounds, n_postings, out)
    bmp, bmp_info = bmp_rows(index, queries, exact, rounds, out)
    load_end = load_avg()
    rows = []
    for r in engine + seismic + bmp:
        ms = 1000 * np.asarray(r["secs"])
        rows.append([r["system"], r["setting"], r["k"], round(float(np.mean(r["recall"])), 4), round(float(np.min(r["recall"])), 2),
                     round(float(np.percentile(ms, 50)), 3), round(float(np.percentile(ms, 99)), 3)])
    one_thread = next(r for r in engine if r["k"] == 10 and r["setting"].startswith("1 thread"))
    scanned = float(np.mean([df[t].sum() for t, _ in queries]))
    real["engine_one_thread_ns_per_scanned_posting"] = round(1e9 * float(np.median(one_thread["secs"])) / scanned, 2)
    details = {"real": real, "synthetic_same_size": synth, "engine_postings_bytes": index_bytes(index_dir), "bytes_per_doc": {
               "engine": round(index_bytes(index_dir) / index.n_docs), "seismic": round(seismic_info["bytes"] / index.n_docs),
               "bmp": round(bmp_info["bytes"] / index.n_docs)}, "seismic": seismic_info, "bmp": bmp_info,
               "query_encode_s": round(encode_s, 1), "corpus": json.loads((out / "corpus" / "corpus-info.json").read_text())}
    write_table(
        results,
        "Real vectors: the engine's exact search beside Seismic and BMP on encoded documents (issue 53)",
        "python -m experiments.real_vectors " + " ".join(argv),
        f"{index.n_docs:,} documents: the distinct positives of ../shared/data/pairs (training data, used here for size and speed only, "
        f"never for quality), in a seeded shuffle, indexed by build-index with the default model and adapter ({manifest.model['name']} + "
        f"{Path((manifest.adapter or {}).get('path', 'no adapter')).name}, "
        f"{real['postings_per_doc']:.0f} aligned tokens a document, 8-bit impacts); {len(queries)} queries: the anchors of the same pairs, "
        f"encoded by the LLM as the Retriever searches the sparse channel ({real['query_tokens']} tokens a query on average: literal + "
        "aligned, IDF-weighted). Every system searches the same vectors (Seismic: the dequantised weights; BMP: integer impacts, the "
        f"largest document weight = {BMP_SCALE:.0f}; it quantises the query weights itself). Recall@k: share of the engine's exact one-thread top-k found "
        f"(mean, min over queries). p50/p99: each query's fastest of {rounds} passes, one query at a time. Load average {load_start} at the "
        f"start, {load_end} at the end. Distributions of weights and posting lists, real beside synthetic: in details.",
        ["system", "setting", "k", "recall@k mean", "recall@k min", "p50 ms", "p99 ms"],
        rows,
        details=details,
    )


# ------------------------------------------------------------------------------ fitted: a larger corpus shaped like the real one
FITTED_SHARD = 16384  # documents generated at a time (memory: one shard)


def write_fitted_index(real, n_docs: int, directory: Path, seed: int = SEED) -> dict:
    """An index of ``n_docs`` generated documents shaped like ``real`` (an InvertedIndex): each token
    drawn in proportion to its real document frequency, weights drawn from the real weights
    (benchmarks/synthetic.py: fitted_shard), as many tokens a document; written as a build writes
    its postings (memory-mapped, then 8-bit impacts: the default compact format 3)."""
    from benchmarks.synthetic import fitted_cdf, fitted_shard
    from indexer.inverted_index import InvertedIndex

    df = np.diff(np.asarray(real.indptr))
    cdf, _ = fitted_cdf(df)
    weights = np.asarray(real.float_weights())
    pool = weights[np.random.default_rng(seed).choice(weights.size, min(weights.size, 1_000_000), replace=False)]
    k = round(float(df.sum()) / real.n_docs)

    def shards():
        for i, lo in enumerate(range(0, n_docs, FITTED_SHARD)):
            yield fitted_shard(min(FITTED_SHARD, n_docs - lo), k, cdf, pool, seed + i)

    if directory.exists():
        strays = [p.name for p in directory.iterdir() if not p.name.startswith(("postings_", ".postings_"))]
        if strays:  # only ever remove what this function writes
            raise FileExistsError(f"{directory}: holds files this study did not write ({', '.join(sorted(strays)[:3])}); choose another --out")
        shutil.rmtree(directory)
    directory.mkdir(parents=True)
    t0 = time.perf_counter()
    InvertedIndex.write_from_shards(shards, real.vocab_size, directory)
    InvertedIndex.quantise_saved(directory)
    return {"docs": n_docs, "tokens_per_doc": k, "generate_merge_quantise_s": round(time.perf_counter() - t0, 1)}


def search_in_parts(index, tokens: np.ndarray, weights: np.ndarray, k: int, parts: int):
    """The exact search of an 8-bit-impact index (in any doc layout) split into ``parts`` document ranges (1: not split)."""
    return index.numbers.search(index.indptr, index.weights, index.scale, index.offset, tokens, weights, index.n_docs, k, parts)


def time_search(index, queries, rounds: int, k: int, threads: int) -> tuple[list, list[float]]:
    """Each query's top-k and fastest time through ``InvertedIndex.search`` with ``threads`` Numba threads."""
    import numba

    numba.set_num_threads(threads)
    for t, w in queries[:3]:
        index.search(t, w, k)
    return timed(lambda t, w: index.search(t, w, k), queries, rounds)


def measure_fitted(out: Path, results: Path, n_docs: int, n_queries: int, rounds: int, argv: list[str], parts: tuple[int, ...] = ()) -> None:
    """The fitted corpus at ``n_docs``: build cost, bytes, memory and the exact search (one thread,
    split; k = 10 and 100) with the real queries, as 8-bit impacts (format 3) and bit-packed (format 4).
    Query pruning is left to the real index (``measure``): the generated weights are not tied to their
    tokens as real ones are, so the bounds pruning relies on would not be the real ones."""
    import numba

    from benchmarks.provenance import load_avg
    from benchmarks.tables import write_table
    from indexer.codec import PostingsCodec
    from indexer.inverted_index import InvertedIndex
    from indexer.manifest import Manifest

    index_dir = out / "index"
    manifest = Manifest.read(index_dir)
    real = InvertedIndex.load(index_dir, manifest.n_docs, mmap=False, n_lists=int(manifest.record("sparse")["vocab_size"]),
                              codec=PostingsCodec.of_record(manifest.record("sparse"), index_dir))
    with (out / "corpus" / "queries.jsonl").open(encoding="utf-8") as f:
        texts = [json.loads(line)["text"] for line in f if line.strip()][:n_queries]
    queries = encode_queries(index_dir, texts)
    fitted_dir = out / f"fitted-{n_docs}"
    info = write_fitted_index(real, n_docs, fitted_dir)
    threads = numba.config.NUMBA_NUM_THREADS
    load_start = load_avg()
    rows, layouts = [], {}
    for layout in ("8-bit impacts (format 3)", "8-bit impacts, bit-packed doc numbers (format 4)"):
        packed = "format 4" in layout
        if packed:
            InvertedIndex.encode_saved(fitted_dir, "stream", n_docs)
        index = InvertedIndex.load(fitted_dir, n_docs, mmap=True, n_lists=real.vocab_size, codec=PostingsCodec.named("stream" if packed else "int32", 8))
        postings_bytes = sum(p.stat().st_size for p in fitted_dir.glob("postings_*"))
        df = np.diff(np.asarray(index.indptr))
        layouts[layout] = {"bytes_per_doc": round(postings_bytes / n_docs, 1),
                           "query_postings_per_doc": round(float(np.mean([df[t].sum() for t, _ in queries])) / n_docs, 2)}
        exact = {}
        for k in K_VALUES:
            for n_threads in sorted({1, threads}):
                got, secs = time_search(index, queries, rounds, k, n_threads)
                if n_threads == 1:
                    exact[k] = [d for d, _ in got]
                ms = 1000 * np.asarray(secs)
                import numba

                numba.set_num_threads(n_threads)
                ranges = index.search_parts(queries[0][0])  # what InvertedIndex.search did (these queries all read alike)
                rows.append([layout, f"exact, {n_threads} thread(s), {ranges} document range(s)", k, 1.0 if n_threads == 1 else
                             round(float(np.mean([recall_at(exact[k][i], got[i][0], k) for i in range(len(queries))])), 4),
                             round(float(np.percentile(ms, 50)), 2), round(float(np.percentile(ms, 99)), 2)])
            for n_parts in parts:  # more document ranges than threads: each range's accumulators fit a smaller cache
                import numba

                numba.set_num_threads(threads)
                got, secs = timed(lambda t, w, k=k, p=n_parts, ix=index: search_in_parts(ix, t, w, k, p), queries, rounds)
                ms = 1000 * np.asarray(secs)
                rows.append([layout, f"exact, {n_parts} document ranges over {threads} threads", k,
                             round(float(np.mean([recall_at(exact[k][i], got[i][0], k) for i in range(len(queries))])), 4),
                             round(float(np.percentile(ms, 50)), 2), round(float(np.percentile(ms, 99)), 2)])
        layouts[layout]["peak_rss_bytes"] = peak_rss_bytes()
        del index
    write_table(
        results,
        f"Real-shaped vectors at {n_docs:,} documents: the exact search, 8-bit impacts and bit-packed (issue 53)",
        "python -m experiments.real_vectors " + " ".join(argv),
        f"{n_docs:,} generated documents shaped like the {real.n_docs:,}-document real index of this study's corpus (each of "
        f"{info['tokens_per_doc']} tokens a document drawn in proportion to its real document frequency, weights drawn from the real "
        f"weights: benchmarks/synthetic.py fitted_shard), generated, merged and quantised in {info['generate_merge_quantise_s']} s, "
        f"memory-mapped; searched with {len(queries)} real queries (the anchors encoded by the LLM as the Retriever searches the sparse "
        f"channel). Each query's fastest of {rounds} passes, one query at a time; recall@k against the one-thread exact search of the "
        f"same layout. Load average {load_start} at the start, {load_avg()} at the end.",
        ["layout", "search", "k", "recall@k", "p50 ms", "p99 ms"],
        rows,
        details={"fitted": info, "layouts": layouts, "real_docs": real.n_docs},
    )
    shutil.rmtree(fitted_dir, ignore_errors=True)


def peak_rss_bytes() -> int:
    """This process's peak resident set size so far (Linux reports KiB; memory-mapped pages included)."""
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m experiments.real_vectors", description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="step", required=True)
    c = sub.add_parser("corpus", help="write the corpus and queries from the pairs")
    c.add_argument("--pairs", type=Path, required=True)
    c.add_argument("--docs", type=int, required=True)
    c.add_argument("--out", type=Path, required=True)
    m = sub.add_parser("measure", help="distributions, then the engine, Seismic and BMP on the built index")
    m.add_argument("--out", type=Path, required=True, help="the folder of step 1 (its index/ built by step 2)")
    m.add_argument("--results", type=Path, required=True)
    m.add_argument("--queries", type=int, default=300)
    m.add_argument("--rounds", type=int, default=2)
    m.add_argument("--seismic-postings", type=int, default=4000, help="Seismic's n_postings (its lists are cut to this length)")
    f = sub.add_parser("fitted", help="a larger generated corpus shaped like the real index, searched with the real queries")
    f.add_argument("--out", type=Path, required=True, help="the folder of step 1 (its index/ built by step 2)")
    f.add_argument("--docs", type=int, required=True)
    f.add_argument("--results", type=Path, required=True)
    f.add_argument("--queries", type=int, default=300)
    f.add_argument("--rounds", type=int, default=2)
    f.add_argument("--parts", default="", help="also the split search into each of these numbers of document ranges (comma-separated)")
    args = ap.parse_args(argv)
    if args.step == "fitted":
        measure_fitted(args.out, args.results, args.docs, args.queries, args.rounds, argv if argv is not None else sys.argv[1:],
                       tuple(int(x) for x in args.parts.split(",") if x))
        print(f"wrote {args.results}", file=sys.stderr)
    elif args.step == "corpus":
        info = write_corpus(args.pairs, args.docs, args.out)
        print(json.dumps(info), file=sys.stderr)
    else:
        measure(args.out, args.results, args.queries, args.rounds, args.seismic_postings, argv if argv is not None else sys.argv[1:])
        print(f"wrote {args.results}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    raise SystemExit(main())
