"""How faithful a distilled query state must be for the default hybrid to match LLM queries.

    python -m experiments.state_faithfulness --index-dir runs/indexes --data shared \
        --student distilled --alphas 0,0.25,0.5,0.75,0.9,1 --out benchmarks/results/state-faithfulness.json

A student's pooled query state h_s approximates the LLM's h (cosine ~0.85 on the evaluation
queries), and beside BM25 and MiniLM its expansion adds nothing measurable while the LLM's adds
+0.007 nDCG@10 (training/README.md, "Query-encoder distillation"). Where between the two does the
hybrid cross issue 28's bar (within 0.005 of LLM queries on the mean, 0.01 per collection)? This
study moves the student's states towards the LLM's along the great circle's chord between their
directions, h = |h_l| ((1 - a) h_s / |h_s| + a h_l / |h_l|) / |...| for each query (directions, since
the student is trained on the cosine alone and its norm is arbitrary: mixing raw states would let
the larger one dominate), builds
each query from h exactly as a distilled query is built (``Retriever.encode_states``: literal
tokens plus W_lm h's top-M, IDF-weighted, h the dense query, MiniLM for the encoder channel), and
scores the default hybrid. Each a gives a cosine to h_l (reported as a distribution) and an
nDCG@10, so the table reads as the faithfulness a student would need. Mixing shrinks a student's
error along its own direction; a better-trained student's errors may lie elsewhere, so the
curve is a guide, not a guarantee. For scale, the table also gives the cosine of each query's
h_l to the mean h_l of the collection's other queries: what a student that ignored its query
would score.
"""

from __future__ import annotations

import argparse
import sys
import time

import numpy as np

import benchmarks  # noqa: F401  (cache locations before ranx / numba load)
from benchmarks.loco import default_indexes, index_study_arguments
from benchmarks.metrics import per_query_ndcg, quantiles
from benchmarks.tables import study_command, write_table
from embedder.util import set_threads
from retriever.retriever import Retriever


def _ndcg(r: Retriever, encoded: list, qrels: dict, qids: list[str], depth: int = 100) -> dict[str, float]:
    hits = r.search_encoded(encoded, k=depth, mode="hybrid", explain=False)
    return per_query_ndcg({q: qrels[q] for q in qids}, {q: {h.doc_id: h.score for h in hs} for q, hs in zip(qids, hits)})


def _overlap(r: Retriever, a: np.ndarray, b: np.ndarray, m: int) -> np.ndarray:
    """Per query, the share of b's top-m LM-head tokens among a's."""
    top_a, _ = r.embedder.top_tokens(a, m)
    top_b, _ = r.embedder.top_tokens(b, m)
    return np.array([len(set(x.tolist()) & set(y.tolist())) / m for x, y in zip(top_a, top_b)])


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="state_faithfulness", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    index_study_arguments(p)
    p.add_argument("--student", default="distilled", help="the student: distilled (beside the adapter) or a student's folder")
    p.add_argument("--alphas", default="0,0.25,0.5,0.75,0.9,1", help="weights a of the LLM's state in the mix (comma-separated)")
    args = p.parse_args(argv)
    if args.threads:
        set_threads(args.threads)
    alphas = sorted({float(a) for a in args.alphas.split(",")})
    if any(not 0.0 <= a <= 1.0 for a in alphas):
        raise SystemExit("--alphas: each weight lies in [0, 1]")
    names: list[str] = []
    per_query: dict[str, dict[str, dict[str, float]]] = {str(a): {} for a in [*alphas, "llm"]}
    cosines: dict[float, list[np.ndarray]] = {a: [] for a in alphas}
    overlaps: dict[float, list[np.ndarray]] = {a: [] for a in alphas}
    embedder, student_name, m = None, "", 0
    baseline: list[np.ndarray] = []  # cos(h_l, the mean h_l of the other queries)
    for ds, index in default_indexes(args.index_dir, args.data):
        names.append(ds.name)
        t0 = time.perf_counter()
        qids = [q for q in ds.queries if q in ds.qrels and ds.queries[q].strip()]
        texts = [ds.queries[q] for q in qids]
        llm = Retriever.load(index, embedder=embedder, query_encoder="llm", query_cache_size=0)
        embedder = llm.embedder  # one LLM for every index: they name the same model and adapter
        encoded = llm.encode(texts)
        h_llm = np.stack([q.embedding for q in encoded])
        per_query["llm"][ds.name] = _ndcg(llm, encoded, ds.qrels, qids)
        llm.close()
        student = Retriever.load(index, embedder=embedder, query_encoder=args.student, query_cache_size=0)
        student_name, m = student.query_encoder, student.expansion_m
        h_s = np.stack([q.embedding for q in student.encode(texts, "sparse")])
        unit_s = h_s / np.linalg.norm(h_s, axis=1, keepdims=True)
        norm_l = np.linalg.norm(h_llm, axis=1, keepdims=True)
        others = (h_llm.sum(0, keepdims=True) - h_llm) / max(1, len(h_llm) - 1)  # the mean of the other queries' states
        baseline.append(np.sum(others * h_llm, 1) / (np.linalg.norm(others, axis=1) * norm_l[:, 0]))
        for a in alphas:
            mix = (1.0 - a) * unit_s + a * h_llm / norm_l
            h = (norm_l * mix / np.linalg.norm(mix, axis=1, keepdims=True)).astype(np.float32)
            per_query[str(a)][ds.name] = _ndcg(student, student.encode_states(texts, h, f"mix:{a}"), ds.qrels, qids)
            cosines[a].append(np.sum(h * h_llm, 1) / (np.linalg.norm(h, axis=1) * np.linalg.norm(h_llm, axis=1)))
            overlaps[a].append(_overlap(student, h, h_llm, m))
        student.close()
        line = ", ".join(f"a={a:g} {np.mean(list(per_query[str(a)][ds.name].values())):.4f}" for a in alphas)
        print(f"{ds.name}: LLM {np.mean(list(per_query['llm'][ds.name].values())):.4f}; {line} ({time.perf_counter() - t0:.0f} s)", file=sys.stderr)

    def mean(key: str, name: str) -> float:
        return float(np.mean(list(per_query[key][name].values())))

    def pooled(key: str) -> np.ndarray:
        return np.concatenate([[per_query[key][n][q] for q in sorted(per_query[key][n])] for n in names])

    from scipy import stats

    rows = []
    ref = [mean("llm", n) for n in names]
    rows.append(["LLM queries", "1", "", "", *[round(v, 4) for v in ref], round(float(np.mean(ref)), 4), "", ""])
    base = np.concatenate(baseline)
    rows.append(["the mean of the other queries' h_LLM (not scored)", f"{base.mean():.4f} ({np.percentile(base, 5):.4f})", "", "", *[""] * len(names), "", "", ""])
    for a in alphas:
        scores = [mean(str(a), n) for n in names]
        cos, ov = np.concatenate(cosines[a]), np.concatenate(overlaps[a])
        worst = min(s - r for s, r in zip(scores, ref))
        p_value = float(stats.ttest_rel(pooled(str(a)), pooled("llm")).pvalue) if a < 1 else float("nan")
        rows.append([
            f"mix a={a:g}", f"{cos.mean():.4f} ({np.percentile(cos, 5):.4f})", f"{ov.mean():.3f}", round(float(np.mean(scores)) - float(np.mean(ref)), 4),
            *[round(v, 4) for v in scores], round(float(np.mean(scores)), 4), round(worst, 4), round(p_value, 3),
        ])  # fmt: skip
    write_table(
        args.out,
        title=f"What a query state's faithfulness is worth: the default hybrid with {student_name}'s states moved towards the LLM's",
        command=study_command("experiments.state_faithfulness", argv),
        description=(
            "h: the direction (1 - a) h_student / |h_student| + a h_LLM / |h_LLM| at h_LLM's norm, per query, built into a query as a distilled query is (literal tokens, top-M of W_lm h, "
            f"M = {m}, IDF weights; h the dense query; MiniLM the encoder channel), scored by the default hybrid's nDCG@10. cosine: "
            "mean (q05) of cos(h, h_LLM) over the queries; overlap: mean share of the LLM's top-M tokens in h's; worst: the "
            "largest per-collection drop against LLM queries; p: paired t-test over the pooled queries against LLM queries."
        ),
        columns=["states", "cosine to h_LLM", f"top-{m} overlap", "mean - LLM", *names, "mean", "worst", "p"],
        rows=rows,
        details={
            "per_query_ndcg@10": per_query,
            "cosine": {str(a): quantiles(np.concatenate(cosines[a])) for a in alphas},
            "cosine_of_the_other_queries_mean_state": quantiles(base),
            f"top{m}_overlap": {str(a): quantiles(np.concatenate(overlaps[a])) for a in alphas},
            "student": student_name,
        },
    )
    print(f"wrote {args.out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
