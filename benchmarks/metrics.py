"""Effectiveness with ranx: metrics and paired significance tests (TREC run files: benchmarks/runs.py);
and :func:`quantiles`, how the studies summarise a per-query distribution.

ranx compiles its metrics with Numba on first call (40-60 s cold on 2 cores); with
``NUMBA_CACHE_DIR`` persistent (see :mod:`benchmarks`) later runs only load the cache.
:func:`warm_up` pays that cost on a toy example so that it is measured on its own.
"""
from __future__ import annotations

import math
import time
import warnings
from collections.abc import Mapping

import numpy as np

import benchmarks  # noqa: F401  (cache locations before ranx / ir_datasets / numba load)
from benchmarks.runs import Qrels, Run

NO_HIT = "\x00no-hit"  # placeholder doc id that no qrels can name


def metric_names(depth: int) -> list[str]:
    """The reported metrics, as ranx names. MAP is cut at the run depth."""
    return ["ndcg@10", "recall@100", "mrr@10", f"map@{depth}"]


def _ranx():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        import ranx
    return ranx


def warm_up(depth: int = 100) -> float:
    """Compile (or load from cache) ranx's kernels on a toy example; returns the seconds."""
    t0 = time.perf_counter()
    ranx = _ranx()
    qrels = ranx.Qrels({"q1": {"d1": 1, "d2": 2}, "q2": {"d3": 1}})
    a = ranx.Run({"q1": {"d1": 0.5, "d2": 0.9, "d4": 0.1}, "q2": {"d3": 0.2, "d1": 0.3}}, name="a")
    b = ranx.Run({"q1": {"d1": 0.9, "d2": 0.5}, "q2": {"d3": 0.4}}, name="b")
    with warnings.catch_warnings():  # ranx's kernels warn about an unsafe uint64 cast
        warnings.simplefilter("ignore")
        ranx.evaluate(qrels, a, metric_names(depth), make_comparable=True)
        ranx.compare(qrels, [a, b], metric_names(depth), max_p=0.05, make_comparable=True)
    return time.perf_counter() - t0


def evaluate_run(qrels: Qrels, run: Run, metrics: list[str]) -> dict[str, float]:
    """Mean of each metric over the judged queries (a query missing from the run scores 0)."""
    ranx = _ranx()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        scores = ranx.evaluate(ranx.Qrels(qrels), ranx.Run(_complete(run, qrels)), metrics, make_comparable=True)
    if isinstance(scores, float) or not isinstance(scores, Mapping):
        scores = {metrics[0]: scores}
    return {m: round(float(v), 6) for m, v in scores.items()}


def per_query_ndcg(qrels: Qrels, run: Run) -> dict[str, float]:
    """{query id: nDCG@10} for every judged query (a query with no hits scores 0), e.g. for paired
    tests or choosing a setting on some collections and scoring it on another."""
    ranx = _ranx()
    run = {q: run.get(q) or {NO_HIT: 0.0} for q in qrels}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        scores = ranx.evaluate(ranx.Qrels(qrels), ranx.Run(run), "ndcg@10", return_mean=False, make_comparable=True)
    return {q: round(float(v), 6) for q, v in zip(sorted(qrels), scores)}  # ranx orders queries by id


def compare_runs(qrels: Qrels, runs: Mapping[str, Run], metrics: list[str], max_p: float = 0.05, stat_test: str = "student") -> dict:
    """Paired significance tests between every pair of systems (ranx.compare).

    Returns {"stat_test", "max_p", "metrics", "systems", "p_values": {a: {b: {metric: p}}}}.
    A p-value is None where it is undefined (identical per-query scores).
    """
    ranx = _ranx()
    rx_runs = [ranx.Run(_complete(run, qrels), name=name) for name, run in runs.items()]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        report = ranx.compare(ranx.Qrels(qrels), rx_runs, metrics, max_p=max_p, stat_test=stat_test, make_comparable=True)
    d = report.to_dict()
    p_values = {
        a: {b: {m: _clean_p(p) for m, p in per.items()} for b, per in d[a]["comparisons"].items()} for a in d["model_names"]
    }
    return {"stat_test": d["stat_test"], "max_p": max_p, "metrics": list(metrics), "systems": list(d["model_names"]), "p_values": p_values}


def _clean_p(p) -> float | None:
    p = float(p)
    return None if math.isnan(p) else round(p, 6)


def _complete(run: Run, qrels: Qrels) -> Run:
    # Every judged query present (possibly empty): ranx then scores a missing answer as 0
    # instead of silently averaging over fewer queries.
    out = {q: dict(run.get(q, {})) for q in qrels} | {q: v for q, v in run.items() if q not in qrels}
    if out and not any(out.values()):
        # ranx cannot build a run without a single hit; one unjudged placeholder hit
        # changes no metric (it is not relevant) and keeps the all-zero answer computable.
        out[next(iter(out))] = {NO_HIT: 0.0}
    return out


def quantiles(v: np.ndarray) -> dict[str, float]:
    """q05 / q25 / q50 / q75 / q95 and the mean, rounded."""
    return {**{f"q{q:02d}": round(float(np.percentile(v, q)), 4) for q in (5, 25, 50, 75, 95)}, "mean": round(float(np.mean(v)), 4)}
