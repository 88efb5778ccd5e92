"""Feedback from the first pass (retriever/feedback.py), per query encoder, with its setting chosen
leaving one collection out:

    python -m experiments.feedback --index-dir runs/indexes --data shared \
        --query-encoders llm,distilled,none --out benchmarks/results/feedback.json

For each query encoder (the LLM, the distilled student, none: the query's own tokens) and each
setting of a small grid (documents read x tokens taken x their weight), the default hybrid of the
default indexes ``beir-eval --index-dir DIR`` built (``DIR/default/NAME/aligned-tokens``) is scored
by nDCG@10, and against no feedback. A setting chosen on the collections it is scored on would
flatter it, so the table's "held out" row scores each collection with the setting best on the other
collections (mean nDCG@10), and says how often feedback beat none there, query by query (a paired
t-test over all queries pooled: the mean row weighs collections equally, the test weighs queries).
"""
from __future__ import annotations

import argparse
import itertools
import sys
import time
from pathlib import Path

import numpy as np

import benchmarks  # noqa: F401  (cache locations before ranx / numba load)
from benchmarks.loco import default_indexes, index_study_arguments, leave_one_out, paired_p
from benchmarks.metrics import per_query_ndcg
from benchmarks.tables import study_command, write_table
from embedder.util import set_threads
from retriever.feedback import Feedback
from retriever.retriever import Retriever

NONE = "off"  # the grid's setting without feedback


def setting_name(fb: Feedback | None) -> str:
    return NONE if fb is None else f"{fb.docs}/{fb.tokens}/{fb.weight:g}"


def grid(docs: list[int], tokens: list[int], weights: list[float]) -> list[Feedback | None]:
    """No feedback first, then every combination."""
    return [None] + [Feedback(d, t, w) for d, t, w in itertools.product(docs, tokens, weights)]


def scores_by_setting(r: Retriever, queries: dict[str, str], qrels: dict, settings: list[Feedback | None], depth: int = 100) -> dict[str, dict[str, float]]:
    """{setting: {query id: nDCG@10}} of the Retriever's default hybrid, the queries encoded once."""
    qids = [q for q in queries if q in qrels and queries[q].strip()]
    encoded = r.encode([queries[q] for q in qids], "hybrid")
    out = {}
    for fb in settings:
        r.feedback = fb
        hits = r.search_encoded(encoded, k=depth, mode="hybrid", explain=False)
        out[setting_name(fb)] = per_query_ndcg({q: qrels[q] for q in qids}, {q: {h.doc_id: h.score for h in hs} for q, hs in zip(qids, hits)})
    r.feedback = None
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    index_study_arguments(p)
    p.add_argument("--query-encoders", default="llm,distilled,none", help="comma-separated: llm, distilled, none, or a student's folder")
    p.add_argument("--docs", default="1,2,3,5,10", help="documents read (comma-separated)")
    p.add_argument("--tokens", default="32,64,128", help="tokens taken (comma-separated)")
    p.add_argument("--weights", default="0.25,0.5,1", help="their weight, times their IDF (comma-separated)")
    args = p.parse_args(argv)
    if args.threads:
        set_threads(args.threads)
    settings = grid([int(x) for x in args.docs.split(",")], [int(x) for x in args.tokens.split(",")], [float(x) for x in args.weights.split(",")])
    choices = args.query_encoders.split(",")
    label = {c: c if c in ("llm", "distilled", "none") else Path(c).name for c in choices}
    per_query: dict[str, dict[str, dict]] = {label[c]: {} for c in choices}
    encoders: dict[str, str] = {}
    embedder, names = None, []
    for ds, index in default_indexes(args.index_dir, args.data):
        names.append(ds.name)
        for choice in choices:
            t0 = time.perf_counter()
            r = Retriever.load(index, embedder=embedder, query_encoder=choice, query_cache_size=0)
            embedder = r.embedder  # one LLM for every index: they name the same model and adapter
            encoders[label[choice]] = r.query_encoder
            per_query[label[choice]][ds.name] = scores_by_setting(r, ds.queries, ds.qrels, settings)
            r.close()
            off = np.mean(list(per_query[label[choice]][ds.name][NONE].values()))
            print(f"{ds.name} {r.query_encoder}: no feedback {off:.4f} ({time.perf_counter() - t0:.0f} s)", file=sys.stderr)

    def mean(enc: str, name: str, s: str) -> float:
        return float(np.mean(list(per_query[enc][name][s].values())))

    rows, chosen = [], {}
    for enc in per_query:
        off = [mean(enc, n, NONE) for n in names]
        rows.append([encoders[enc], "no feedback", *[round(v, 4) for v in off], round(float(np.mean(off)), 4), "", ""])
        best = max((setting_name(s) for s in settings), key=lambda s: np.mean([mean(enc, n, s) for n in names]))
        on = [mean(enc, n, best) for n in names]
        pooled = [v for n in names for v in per_query[enc][n][best].values()], [v for n in names for v in per_query[enc][n][NONE].values()]
        rows.append([encoders[enc], f"best on all: {best}", *[round(v, 4) for v in on], round(float(np.mean(on)), 4),
                     sum(a > b for a, b in zip(on, off)), round(paired_p(*pooled), 4)])  # fmt: skip
        if len(names) > 1:
            order = [setting_name(x) for x in settings]
            loo = leave_one_out({n: {s: mean(enc, n, s) for s in order} for n in names}, order)
            held = [loo[n][1] for n in names]
            pooled = ([v for n in names for v in per_query[enc][n][loo[n][0]].values()], [v for n in names for v in per_query[enc][n][NONE].values()])
            rows.append([encoders[enc], "held out: " + " ".join(loo[n][0] for n in names), *[round(v, 4) for v in held],
                         round(float(np.mean(held)), 4), sum(a > b for a, b in zip(held, off)), round(paired_p(*pooled), 4)])  # fmt: skip
            chosen[enc] = {n: loo[n][0] for n in names}
    write_table(
        args.out,
        title="Feedback from the first pass per query encoder (default hybrid, default indexes), settings chosen leaving one collection out",
        command=study_command("experiments.feedback", argv),
        description=(
            "nDCG@10 of the default hybrid (the Retriever's default fusion) with the sparse query expanded from the first "
            "pass's top documents (retriever/feedback.py), setting DOCS/TOKENS/WEIGHT; 'best on all': the grid's setting "
            "best on the mean (in-sample); 'held out': each collection scored with the setting best on the others (listed "
            "in collection order). 'wins': collections where feedback beat no feedback; 'p': paired t-test against no "
            "feedback over all queries pooled."
        ),
        columns=["query encoder", "setting", *names, "mean", "wins", "p"],
        rows=rows,
        details={"per_query_ndcg@10": per_query, "grid": [setting_name(s) for s in settings], "held_out_choice": chosen},
    )
    print(f"wrote {args.out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
