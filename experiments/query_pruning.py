"""Query pruning (indexer/query_pruning.py) against the exact aligned-token search: tokens and postings
kept, recall against the exact top-k, nDCG@10, and the time a query takes (issue 53, item 3):
``python -m experiments.query_pruning --data ../shared/data/adi --data ../shared/data/cisi
--data ../shared/data/cranfield --data ../shared/data/medline --data ../shared/data/npl
--out benchmarks/results/query-pruning/query-pruning.json``.

Each setting is a ``keep_mass`` (the share of the query's total value the kept tokens cover; 1 is
the exact query, the reference) and a token value: ``weight`` (the token's IDF query weight: its
share of the weight mass) or ``bound`` (that weight times its posting list's largest weight: an
upper bound of what it can add to any score); and each of them again with ``+rescore``: the
pruned query's top 100 rescored exactly with the tokens it dropped (indexer.query_pruning.rescore),
then cut to the top-k.

1. Real indexes and queries: each collection's float32 default index already built by
   ``experiments.compact_index`` under ``--index-root/<collection>/float32``, opened at the
   ``best`` profile; the collection's test queries encoded once by the LLM (literal tokens plus the
   top-128 aligned tokens, IDF-weighted, as the Retriever searches them), then the sparse channel
   searched to depth 100 with the exact query and with every pruned one
   (``Retriever.search_channel``): recall@10 and recall@100 against the exact top-10 / top-100,
   nDCG@10 with ranx, and the share of the query's tokens and of its postings kept (postings are
   what a query costs: every kept token's whole list is scanned).
2. Speed: a synthetic corpus (:func:`synthetic_index`; its own generator, not scale.py's) whose
   document weights are drawn from the real indexes' weights and whose queries' tokens are drawn so
   that their posting-list lengths (as a share of the corpus) follow the real queries' (pooled over
   the collections of part 1): one query at a time (``InvertedIndex.search``, a single-threaded
   Numba kernel), k=10, float32 and 8-bit impacts (the default build's), every setting timed on
   every query in a shuffled order, ``--rounds`` times, the fastest of each query kept; p50/p99 ms
   and recall@10 against the exact search of the same index.
"""
from __future__ import annotations

import argparse
import dataclasses
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
from tqdm.auto import tqdm

from benchmarks.datasets import load_beir_folder
from benchmarks.metrics import evaluate_run
from benchmarks.provenance import load_avg, machine_info
from benchmarks.tables import study_command, write_table
from indexer.inverted_index import InvertedIndex
from indexer.query_pruning import kept_positions, list_max_weights, rescore, token_values

KEEP_MASSES = (1.0, 0.999, 0.995, 0.99, 0.98, 0.95, 0.9, 0.8)
# a token's value: its query weight alone, or times its posting list's largest weight (an upper bound of its contribution)
VALUES = ("weight", "bound")
DEPTH = 100  # the real part's run depth (recall@100, nDCG@10 from the same run)
RESCORE_DEPTH = 100  # "+rescore": the pruned query's top-100 rescored with the dropped tokens (indexer.query_pruning.rescore)
VOCAB = 49152  # SmolLM2's vocabulary, the default backbone's
DOC_TOKENS = 512  # aligned tokens per document, the default build's top_k

Setting = tuple[str, float, bool]  # (value, keep_mass, rescore)
Search = Callable[[np.ndarray, np.ndarray, int], tuple[np.ndarray, np.ndarray]]


def settings(keep_masses: tuple[float, ...]) -> list[Setting]:
    """Every setting: the exact query first, then each value at each keep_mass < 1, without and with rescoring."""
    return [("exact", 1.0, False)] + [(value, km, rs) for rs in (False, True) for value in VALUES for km in keep_masses if km < 1.0]


def setting_label(setting: Setting) -> str:
    return setting[0] + ("+rescore" if setting[2] else "")


def setting_name(setting: Setting) -> str:
    value, keep_mass, rs = setting
    return "exact" if value == "exact" else f"{value}{'+rescore' if rs else ''}@{keep_mass:g}"


def kept(tokens: np.ndarray, weights: np.ndarray, setting: Setting, list_max: np.ndarray) -> np.ndarray:
    """Positions of the tokens a setting keeps (all for the exact query)."""
    value, keep_mass, _ = setting
    if value == "exact":
        return np.arange(len(tokens), dtype=np.int64)
    return kept_positions(token_values(tokens, weights, list_max if value == "bound" else None), keep_mass)


def search_setting(search: Search, index: InvertedIndex, tokens: np.ndarray, weights: np.ndarray, keep: np.ndarray, rescored: bool,
                   k: int) -> tuple[np.ndarray, np.ndarray]:
    """Top-``k`` of the query pruned to ``keep``; ``rescored``: its top-:data:`RESCORE_DEPTH` rescored
    exactly with the dropped tokens. ``search(tokens, weights, k)``: the channel's search."""
    if not rescored:
        return search(tokens[keep], weights[keep], k)
    docs, scores = search(tokens[keep], weights[keep], max(k, RESCORE_DEPTH))
    dropped = np.ones(len(tokens), bool)
    dropped[keep] = False
    return rescore(index, docs, scores, tokens[dropped], weights[dropped], k)


def recall(exact: np.ndarray, got: np.ndarray, k: int) -> float:
    """Share of the exact top-k (padding -1 left out) found in ``got``'s top-k; 1 where the exact one is empty."""
    truth = {int(d) for d in exact[:k] if d >= 0}
    if not truth:
        return 1.0
    return len(truth & {int(d) for d in got[:k] if d >= 0}) / len(truth)


def summarise(kept: list[float], postings: list[float], r10: list[float], r100: list[float] | None = None) -> dict:
    out = {"tokens_kept": round(float(np.mean(kept)), 4), "postings_kept": round(float(np.mean(postings)), 4),
           "recall@10": round(float(np.mean(r10)), 4), "recall@10_min": round(float(np.min(r10)), 4),
           "queries_recall@10_1": round(float(np.mean(np.asarray(r10) >= 1.0)), 4)}
    if r100 is not None:
        out["recall@100"] = round(float(np.mean(r100)), 4)
    return out


# ------------------------------------------------------------------------------ part 1: real indexes
def measure_collection(data: Path, index_dir: Path, keep_masses: tuple[float, ...], embedder=None) -> tuple[dict, dict]:
    """One collection's figures per setting, and what part 2 borrows from it (the embedder, the query
    tokens' posting-list shares, a sample of the index's weights)."""
    from retriever.retriever import Retriever

    ds = load_beir_folder(data)
    qids = list(ds.queries)
    out: dict = {"n_queries": len(qids)}
    with Retriever.load(index_dir, profile="best", warm=False, embedder=embedder) as r:
        t0 = time.perf_counter()
        encoded = r.encode([ds.queries[q] for q in qids], "sparse")
        out["encode_s"] = round(time.perf_counter() - t0, 1)
        index = r.sparse
        out["n_docs"] = index.n_docs
        list_max = list_max_weights(index)
        df = np.diff(np.asarray(index.indptr))
        out["query_tokens"] = round(float(np.mean([len(q.tokens) for q in encoded])), 1)
        out["query_postings_per_doc"] = round(float(np.mean([df[q.tokens].sum() for q in encoded])) / index.n_docs, 2)
        exact = [r.search_channel(q, "sparse", DEPTH) for q in encoded]
        for setting in tqdm(settings(keep_masses), desc=f"{data.name}: settings", unit="setting", leave=False):
            kept_share, postings, r10, r100, run = [], [], [], [], {}
            for qid, q, (ex_docs, ex_scores) in zip(qids, encoded, exact):
                keep = kept(q.tokens, q.weights, setting, list_max)

                def search(tokens, weights, k, q=q, keep=keep):
                    small = dataclasses.replace(q, tokens=tokens, weights=weights, n_literal=int(np.sum(keep < q.n_literal)))
                    return r.search_channel(small, "sparse", k)

                docs, scores = (ex_docs, ex_scores) if setting[0] == "exact" else search_setting(search, index, q.tokens, q.weights, keep, setting[2], DEPTH)
                total = float(df[q.tokens].sum())
                kept_share.append(len(keep) / max(len(q.tokens), 1))
                postings.append(float(df[q.tokens[keep]].sum()) / total if total else 1.0)
                r10.append(recall(ex_docs, docs, 10))
                r100.append(recall(ex_docs, docs, DEPTH))
                run[qid] = {r.doc_ids[d]: float(s) for d, s in zip(docs, scores) if d >= 0}
            out[setting_name(setting)] = {**summarise(kept_share, postings, r10, r100), "ndcg@10": evaluate_run(ds.qrels, run, ["ndcg@10"])["ndcg@10"]}
        ref = out["exact"]["ndcg@10"]
        for cell in out.values():
            if isinstance(cell, dict):
                cell["ndcg@10_delta"] = round(cell["ndcg@10"] - ref, 4)
        rng = np.random.default_rng(0)
        weights = np.asarray(index.float_weights())
        borrowed = {
            "embedder": r.embedder,
            "df_fractions": np.concatenate([df[q.tokens] / index.n_docs for q in encoded]),
            "weights": weights[rng.choice(weights.shape[0], min(weights.shape[0], 200_000), replace=False)],
            "query_tokens": [len(q.tokens) for q in encoded],
        }
    return out, borrowed


# ------------------------------------------------------------------------------ part 2: synthetic speed
def synthetic_index(n_docs: int, doc_tokens: int, vocab: int, zipf_s: float, weight_pool: np.ndarray, seed: int) -> InvertedIndex:
    """A synthetic aligned-token index, built straight as postings (no forward vectors, no sort).

    Token ids are ranked by a random permutation of the vocabulary; the token of rank r is in each
    document independently with probability ``min(1, c / r**zipf_s)``, ``c`` chosen so that a
    document holds ``doc_tokens`` tokens on average (frequent tokens saturate: in every document,
    as the real aligned tokens' most frequent ones nearly are). A posting list's doc numbers are
    drawn by geometric gaps (each document independently, ascending by construction); its weights
    are drawn from ``weight_pool`` (the real indexes' weights). Documents hold ``doc_tokens`` tokens
    on average, not exactly."""
    rng = np.random.default_rng(seed)
    base = 1.0 / np.arange(1, vocab + 1, dtype=np.float64) ** zipf_s
    lo, hi = 0.0, float(doc_tokens) / base[-1]
    for _ in range(100):  # bisection: sum of min(1, c * base) = doc_tokens
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if np.minimum(1.0, mid * base).sum() < doc_tokens else (lo, mid)
    prob = np.minimum(1.0, hi * base)
    token_of_rank = rng.permutation(vocab)
    lists: list[np.ndarray | None] = [None] * vocab
    for rank in tqdm(range(vocab), desc="synthetic postings", unit="list", leave=False, mininterval=2):
        p = prob[rank]
        if p >= 1.0:
            docs = np.arange(n_docs, dtype=np.int32)
        else:
            mean = n_docs * p
            pos = np.cumsum(rng.geometric(p, int(mean + 6 * np.sqrt(mean) + 16))) - 1
            while pos[-1] < n_docs:
                pos = np.concatenate([pos, pos[-1] + np.cumsum(rng.geometric(p, int(6 * np.sqrt(mean) + 16)))])
            docs = pos[pos < n_docs].astype(np.int32)
        lists[token_of_rank[rank]] = docs
    counts = np.array([len(d) for d in lists], np.int64)
    indptr = np.zeros(vocab + 1, np.int64)
    np.cumsum(counts, out=indptr[1:])
    docs = np.concatenate(lists)
    del lists
    weights = np.asarray(weight_pool, np.float32)[rng.integers(0, len(weight_pool), docs.shape[0])]
    return InvertedIndex(indptr, docs, weights, n_docs)


def synthetic_queries(index: InvertedIndex, n: int, tokens: int, df_fractions: np.ndarray | None, seed: int) -> list[tuple[np.ndarray, np.ndarray]]:
    """``n`` queries of ``tokens`` distinct tokens, IDF-weighted as the Retriever weighs them
    (log((N + 1) / (df + 1))). A token is drawn with a probability that makes the queries' posting
    lists, as shares of the corpus (df / N), follow ``df_fractions`` (the real queries' tokens, on
    24 log-spaced bins; a real token in no document counts in the lowest bin); without
    ``df_fractions``, log-uniform between 1/1000 and 1."""
    rng = np.random.default_rng(seed)
    df = np.diff(np.asarray(index.indptr))
    share = df / index.n_docs
    edges = np.logspace(np.log10(1.0 / index.n_docs), 0.0, 25)
    bin_of = lambda x: np.clip(np.searchsorted(edges, x, side="right") - 1, 0, len(edges) - 2)
    if df_fractions is None:
        df_fractions = 10.0 ** rng.uniform(-3.0, 0.0, 100_000)
    wanted = np.bincount(bin_of(np.asarray(df_fractions)), minlength=len(edges) - 1) / len(df_fractions)
    present = np.bincount(bin_of(share[df > 0]), minlength=len(edges) - 1)
    p = np.where(df > 0, wanted[bin_of(share)] / np.maximum(present[bin_of(share)], 1), 0.0)
    p /= p.sum()
    tokens = min(tokens, int(np.count_nonzero(p)))
    idf = np.log((index.n_docs + 1) / (df + 1)).astype(np.float32)
    out = []
    for _ in range(n):
        toks = rng.choice(len(df), tokens, replace=False, p=p).astype(np.int64)
        out.append((toks, idf[toks]))
    return out


def time_settings(index: InvertedIndex, queries: list[tuple[np.ndarray, np.ndarray]], keep_masses: tuple[float, ...], rounds: int, k: int, seed: int) -> dict:
    """Per setting: tokens and postings kept, recall@``k`` against the exact search, and p50/p99 ms a
    query, pruning (and rescoring) included: each query's fastest of ``rounds``, the settings of a
    query timed back to back in a shuffled order. ``prune_us``: the pruning alone, µs a query."""
    list_max = list_max_weights(index)
    df = np.diff(np.asarray(index.indptr))
    all_settings = settings(keep_masses)
    keeps: dict[str, list[np.ndarray]] = {}
    prune_us: dict[str, float] = {}
    for setting in all_settings:
        t0 = time.perf_counter()
        keeps[setting_name(setting)] = [kept(t, w, setting, list_max) for t, w in queries]
        prune_us[setting_name(setting)] = round(1e6 * (time.perf_counter() - t0) / len(queries), 1)
    for t, w in queries[:3]:
        index.search(t, w, k)  # compiled (or loaded from Numba's cache) and the lists paged in
        rescore(index, *index.search(t, w, RESCORE_DEPTH), t[:2], w[:2], k)
    rng = np.random.default_rng(seed)
    best = {setting_name(st): np.full(len(queries), np.inf) for st in all_settings}
    results: dict[str, list] = {setting_name(st): [None] * len(queries) for st in all_settings}
    for _ in tqdm(range(rounds), desc="timing rounds", unit="round", leave=False):
        for i in tqdm(range(len(queries)), desc="queries", unit="query", leave=False, mininterval=2):
            t, w = queries[i]
            for j in rng.permutation(len(all_settings)):
                setting = all_settings[j]
                name = setting_name(setting)
                t0 = time.perf_counter()
                keep = kept(t, w, setting, list_max) if setting[0] != "exact" else None
                docs, _ = index.search(t, w, k) if keep is None else search_setting(index.search, index, t, w, keep, setting[2], k)
                best[name][i] = min(best[name][i], time.perf_counter() - t0)
                results[name][i] = docs
    out = {}
    for setting in all_settings:
        name = setting_name(setting)
        share = [len(keep) / len(q[0]) for keep, q in zip(keeps[name], queries)]
        postings = [float(df[q[0][keep]].sum()) / float(df[q[0]].sum()) for keep, q in zip(keeps[name], queries)]
        r10 = [recall(ex, got, k) for ex, got in zip(results["exact"], results[name])]
        ms = 1000 * best[name]
        out[name] = {**summarise(share, postings, r10), "p50_ms": round(float(np.percentile(ms, 50)), 3),
                     "p99_ms": round(float(np.percentile(ms, 99)), 3), "mean_ms": round(float(ms.mean()), 3), "prune_us": prune_us[name]}
    for cell in out.values():
        cell["p50_speedup"] = round(out["exact"]["p50_ms"] / cell["p50_ms"], 2)
    # where the time goes: p50 ~ fixed + per_postings * (postings kept), fitted over the settings without rescoring
    plain = [setting_name(st) for st in all_settings if not st[2]]
    slope, fixed = np.polyfit([out[n]["postings_kept"] for n in plain], [out[n]["p50_ms"] for n in plain], 1)
    out["fit"] = {"fixed_ms": round(float(fixed), 3), "ms_for_all_postings": round(float(slope), 3)}
    return out


def measure_synthetic(args, borrowed: list[dict]) -> dict:
    pool = np.concatenate([b["weights"] for b in borrowed]) if borrowed else np.random.default_rng(args.seed).lognormal(np.log(10.0), 0.23, 200_000)
    df_fractions = np.concatenate([b["df_fractions"] for b in borrowed]) if borrowed else None
    tokens = round(float(np.mean([n for b in borrowed for n in b["query_tokens"]]))) if borrowed and not args.query_tokens else (args.query_tokens or 160)
    t0 = time.perf_counter()
    index = synthetic_index(args.synthetic_docs, DOC_TOKENS, VOCAB, args.zipf_s, pool, args.seed)
    out: dict = {"docs": args.synthetic_docs, "doc_tokens_mean": round(index.docs.shape[0] / index.n_docs, 1), "zipf_s": args.zipf_s,
                 "postings": int(index.docs.shape[0]), "generate_s": round(time.perf_counter() - t0, 1), "queries": args.synthetic_queries,
                 "query_tokens": tokens, "k": 10, "rounds": args.rounds,
                 "weights_from": "the real indexes' weights" if borrowed else "lognormal(log 10, 0.23)",
                 "query_df_from": "the real queries' tokens" if borrowed else "log-uniform 1e-3..1"}
    queries = synthetic_queries(index, args.synthetic_queries, tokens, df_fractions, args.seed + 1)
    df = np.diff(index.indptr)
    out["query_postings_per_doc"] = round(float(np.mean([df[t].sum() for t, _ in queries])) / index.n_docs, 2)
    out["float32"] = time_settings(index, queries, args.keep_mass, args.rounds, 10, args.seed + 2)
    index = index.quantise()
    out["uint8"] = time_settings(index, queries, args.keep_mass, args.rounds, 10, args.seed + 3)
    return out


# ------------------------------------------------------------------------------ the table
COLUMNS = ["part", "collection / impacts", "value", "keep_mass", "tokens kept", "postings kept", "recall@10 vs exact",
           "recall@100 vs exact", "nDCG@10 (vs exact)", "p50 ms", "p99 ms", "p50 speed-up"]


def rows_of(real: dict, synthetic: dict | None, keep_masses: tuple[float, ...]) -> list[list]:
    rows = []
    for coll, r in real.items():
        for setting in settings(keep_masses):
            c = r[setting_name(setting)]
            ndcg = f"{c['ndcg@10']:.4f}" + ("" if setting[0] == "exact" else f" ({c['ndcg@10_delta']:+.4f})")
            rows.append(["real", coll, setting_label(setting), setting[1], c["tokens_kept"], c["postings_kept"], c["recall@10"], c["recall@100"], ndcg, "–", "–", "–"])
    for impacts in ("float32", "uint8"):
        for setting in settings(keep_masses) if synthetic else ():
            c = synthetic[impacts][setting_name(setting)]
            rows.append([f"synthetic {synthetic['docs'] // 1000}k docs", impacts, setting_label(setting), setting[1], c["tokens_kept"], c["postings_kept"], c["recall@10"], "–", "–",
                         c["p50_ms"], c["p99_ms"], c["p50_speedup"]])
    return rows


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m experiments.query_pruning", description=__doc__.split("\n")[0])
    p.add_argument("--data", type=Path, action="append", default=[], help="a BEIR folder whose float32 index is under --index-root; repeatable")
    p.add_argument("--index-root", type=Path, default=Path(".cache/compact-study"), help="<collection>/float32 under it (experiments.compact_index)")
    p.add_argument("--keep-mass", type=lambda s: tuple(float(x) for x in s.split(",")), default=KEEP_MASSES, help="comma-separated shares; 1 is the exact query")
    p.add_argument("--synthetic-docs", type=int, default=200_000, help="documents of the synthetic speed corpus (0: skip it)")
    p.add_argument("--synthetic-queries", type=int, default=200)
    p.add_argument("--query-tokens", type=int, default=0, help="tokens per synthetic query (0: the real queries' mean, else 160)")
    p.add_argument("--zipf-s", type=float, default=1.0, help="Zipf exponent of the synthetic token frequencies")
    p.add_argument("--rounds", type=int, default=3, help="timings of every (query, setting); the fastest is kept")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", type=Path, required=True, help="the table's JSON file")
    args = p.parse_args(argv)
    if 1.0 not in args.keep_mass:
        args.keep_mass = (1.0, *args.keep_mass)
    command = study_command("experiments.query_pruning", argv)
    load_start = load_avg()
    real: dict = {}
    borrowed: list[dict] = []
    embedder = None
    for data in tqdm(args.data, desc="collections", unit="collection"):
        real[data.name], got = measure_collection(data, args.index_root / data.name / "float32", args.keep_mass, embedder)
        embedder = got.pop("embedder")
        borrowed.append(got)
    synthetic = measure_synthetic(args, borrowed) if args.synthetic_docs else None
    load_end = load_avg()
    machine = machine_info()
    description = (
        "Query pruning (indexer/query_pruning.py) against the exact aligned-token search. A setting keeps the fewest highest-value "
        "query tokens whose values cover keep_mass of the query's total value (1: the exact query, the reference); value 'weight': "
        "the token's IDF query weight (its share of the weight mass); 'bound': that weight times its posting list's largest weight "
        "(an upper bound of its contribution to any score; a token in no document is worth 0). '+rescore': the pruned query's top 100 "
        "rescored exactly with the dropped tokens (indexer.query_pruning.rescore: a binary search per candidate and dropped token), "
        "then cut to the top-k (so its recall@100 is the pruned query's). Tokens kept and postings kept: mean "
        "shares per query (postings are what a query costs). Real: each collection's float32 default index (smollm2-135m, default "
        "adapter, profile best), the test queries encoded by the LLM (literal + top-128 aligned tokens, IDF-weighted), the sparse "
        "channel to depth 100; recall@k = share of the exact query's top-k found by the pruned one; nDCG@10 with ranx, in brackets "
        "pruned - exact. Synthetic: "
        + (f"{synthetic['docs']:,} documents of ~{synthetic['doc_tokens_mean']:.0f} Zipfian tokens (s={synthetic['zipf_s']}, built as "
           f"postings by the study's own generator), weights from {synthetic['weights_from']}, {synthetic['queries']} queries of "
           f"{synthetic['query_tokens']} IDF-weighted tokens whose posting-list lengths follow {synthetic['query_df_from']} "
           f"({synthetic['query_postings_per_doc']} postings a query per document); one query at a time (single-threaded Numba "
           f"kernel), k=10, each query's fastest of {synthetic['rounds']} rounds with the settings shuffled; recall@10 against the "
           "same index's exact search; speed-up = exact p50 / pruned p50 (pruning and rescoring included). A line fitted to p50 against "
           f"the postings kept (float32) puts {synthetic['float32']['fit']['fixed_ms']} ms of the exact {synthetic['float32']['exact']['p50_ms']} "
           "ms in costs that do not shrink with the postings (presumably the kernel's work per touched document, the top-k selection and "
           "the resets: while a kept token is in most documents, nearly every document is touched). " if synthetic else "not run. ")
        + f"Timings are indicative: {machine.get('cores')} CPU cores shared with other jobs (load average {load_start} at the start, "
        f"{load_end} at the end); the postings kept are the load-free measure of the work saved."
    )
    details = {"real": real, "synthetic": synthetic, "load_avg_start": load_start, "load_avg_end": load_end,
               "keep_masses": list(args.keep_mass), "values": list(VALUES)}
    write_table(args.out, "Query pruning: tokens, postings, recall and speed against the exact aligned-token search (issue 53, item 3)",
                command, description, COLUMNS, rows_of(real, synthetic, args.keep_mass), details=details)
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
