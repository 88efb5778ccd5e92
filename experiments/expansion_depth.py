"""How many aligned tokens a query should be expanded with, for each query encoder.

    python -m experiments.expansion_depth --index-dir runs/indexes --data shared \
        --m 0,16,32,64,96,128 --out benchmarks/results/expansion-depth.json

A query's sparse side is its own tokens plus the top-M tokens of W_lm h (retriever/query.py), each
weighted by its IDF, whoever computed h. The LLM's top-M is its own; a distilled student's shares
about half of the LLM's top 128 (training/README.md, "Query-encoder distillation"), so its deeper
expansion tokens are more often ones the LLM would not have chosen. This study reads the default
indexes ``beir-eval --index-dir DIR`` built (``DIR/default/NAME/aligned-tokens``), and for each
query encoder (the LLM and the student kept beside the index's adapter) and each M scores the
sparse channel alone and the default hybrid (the Retriever's default fusion) by nDCG@10.

Choosing M on the same collections it is scored on would flatter it, so the table also says which
M each encoder would get **leaving one collection out**: for every collection, the M with the best
mean hybrid nDCG@10 over the other collections, and that M's score on the one left out.
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

import benchmarks  # noqa: F401  (cache locations before ranx / numba load)
from benchmarks.loco import default_indexes, index_study_arguments, leave_one_out
from benchmarks.metrics import per_query_ndcg, quantiles
from benchmarks.tables import study_command, write_table
from embedder.util import set_threads
from retriever.retriever import Retriever

MODES = ("sparse", "hybrid")


def scores_by_m(r: Retriever, queries: dict[str, str], qrels: dict, ms: list[int], depth: int = 100) -> dict[int, dict[str, dict[str, float]]]:
    """{M: {mode: {query id: nDCG@10}}} for the Retriever's query encoder, M by M."""
    qids = [q for q in queries if q in qrels and queries[q].strip()]
    out: dict[int, dict[str, dict[str, float]]] = {}
    for m in ms:
        r.expansion_m = m
        r.query_cache.clear()  # encoded queries hold the previous M's expansion
        out[m] = {}
        for mode in MODES:
            hits = r.batch_search([queries[q] for q in qids], k=depth, mode=mode)
            run = {q: {h.doc_id: h.score for h in hs} for q, hs in zip(qids, hits)}
            out[m][mode] = per_query_ndcg({q: qrels[q] for q in qids}, run)
    return out


def agreement(student: np.ndarray, llm: np.ndarray, embedder, ms: list[int]) -> dict:
    """How close the student's query states are to the LLM's, as distributions over the queries:
    cosine, and the overlap of their top-M expansion sets at each M (both taken by the fp32 LM head)."""
    cos = np.sum(student * llm, 1) / (np.linalg.norm(student, axis=1) * np.linalg.norm(llm, axis=1))
    top_s, _ = embedder.top_tokens(student, max(ms))
    top_l, _ = embedder.top_tokens(llm, max(ms))
    out = {"n": len(cos), "cosine": quantiles(cos)}
    for m in ms:
        out[f"top{m}_overlap"] = quantiles(np.array([len(set(a[:m].tolist()) & set(b[:m].tolist())) / m for a, b in zip(top_s, top_l)]))
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    index_study_arguments(p)
    p.add_argument("--m", default="0,16,32,64,96,128", help="expansion depths M to score (comma-separated)")
    p.add_argument("--query-encoders", default="llm,distilled",
                   help="comma-separated: llm, distilled (the student beside the adapter), or a student's folder (default llm,distilled)")
    args = p.parse_args(argv)
    if args.threads:
        set_threads(args.threads)
    ms = sorted({int(x) for x in args.m.split(",")})
    choices = args.query_encoders.split(",")
    if "llm" not in choices:
        raise SystemExit("--query-encoders: llm is the reference the students are compared with; name it")
    label = {c: c if c in ("llm", "distilled") else Path(c).name for c in choices}
    per_query: dict[str, dict[str, dict]] = {label[c]: {} for c in choices}
    embedder, names, encoders, states = None, [], {}, {label[c]: [] for c in choices}
    for ds, index in default_indexes(args.index_dir, args.data):
        names.append(ds.name)
        queries = ds.queries
        for choice in choices:
            enc = label[choice]
            t0 = time.perf_counter()
            r = Retriever.load(index, embedder=embedder, query_encoder=choice, query_cache_size=len(queries) + 1)
            embedder = r.embedder  # one LLM for every index: they name the same model and adapter
            encoders[enc] = r.query_encoder if enc in ("llm", "distilled") else f"{r.query_encoder} ({enc})"
            per_query[enc][ds.name] = scores_by_m(r, queries, ds.qrels, ms)
            states[enc] += [q.embedding for q in r.encode([t for t in queries.values() if t.strip()], "sparse")]
            r.close()
            line = ", ".join(f"M={m} {np.mean(list(per_query[enc][ds.name][m]['hybrid'].values())):.4f}" for m in ms)
            print(f"{ds.name} {r.query_encoder}: hybrid {line} ({time.perf_counter() - t0:.0f} s)", file=sys.stderr)

    def mean(enc: str, name: str, m: int, mode: str) -> float:
        return float(np.mean(list(per_query[enc][name][m][mode].values())))

    rows = []
    for enc in per_query:
        for m in ms:
            sparse = [mean(enc, n, m, "sparse") for n in names]
            hybrid = [mean(enc, n, m, "hybrid") for n in names]
            rows.append([encoders[enc], m, "hybrid", *[round(v, 4) for v in hybrid], round(float(np.mean(hybrid)), 4)])
            rows.append([encoders[enc], m, "sparse", *[round(v, 4) for v in sparse], round(float(np.mean(sparse)), 4)])
        if len(names) < 2:
            continue  # nothing to leave one out of
        loo = leave_one_out({n: {m: mean(enc, n, m, "hybrid") for m in ms} for n in names})
        held = [loo[n][1] for n in names]
        rows.append([encoders[enc], "held out: " + "/".join(str(loo[n][0]) for n in names), "hybrid",
                     *[round(v, 4) for v in held], round(float(np.mean(held)), 4)])  # fmt: skip
    faithful = {enc: agreement(np.stack(states[enc]), np.stack(states["llm"]), embedder, [m for m in ms if m > 0]) for enc in per_query if enc != "llm"}
    print(f"students against LLM queries: {faithful}", file=sys.stderr)
    write_table(
        args.out,
        title="Query expansion depth M per query encoder (LLM queries against the distilled student), default indexes",
        command=study_command("experiments.expansion_depth", argv),
        description=(
            "nDCG@10 of the sparse channel alone and of the default hybrid (the Retriever's default fusion) with the query "
            "expanded by its top-M aligned tokens, M by M, on the default indexes beir-eval built; 'held out' rows: for each "
            "collection the M whose mean hybrid nDCG@10 is best on the other collections (listed in collection order), scored "
            "on the one left out."
        ),
        columns=["query encoder", "M", "mode", *names, "mean"],
        rows=rows,
        details={"per_query_ndcg@10": per_query, "m": ms, "students_vs_llm_on_these_queries": faithful},
    )
    print(f"wrote {args.out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
