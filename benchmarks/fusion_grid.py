"""Fusion settings over stored channel runs: the grid, a fused run, per-query scores.

Shared by the fusion studies (experiments/fusion_cv.py, operating_points.py): fusion is per
query (min-max normalisation and reciprocal ranks only look at the query's own lists), so a
setting's per-query nDCG@10 is computed once from the channels' TREC runs, by ranx, and a
protocol that chooses settings is a choice among rows of a (settings, queries) matrix.
"""
from __future__ import annotations

import itertools
from dataclasses import dataclass

import numpy as np

RRF_KS = (10, 30, 60, 100)
METRIC = "ndcg@10"
RECALL = "recall@100"


@dataclass(frozen=True)
class Setting:
    method: str  # "minmax", "max" (weighted sums of normalised scores) or "rrf"
    weights: tuple[float, ...]  # one per channel (rrf: 0 or 1 = channel left out or used)
    k: int = 60  # rrf constant

    def label(self, channels: list[str]) -> str:
        used = ", ".join(f"{c} {w:g}" for c, w in zip(channels, self.weights) if w > 0)
        return f"{self.method}({used})" + (f" k={self.k}" if self.method == "rrf" else "")

    def to_dict(self, channels: list[str]) -> dict:
        d = {"method": self.method, "weights": dict(zip(channels, self.weights))}
        if self.method == "rrf":
            d["rrf_k"] = self.k
        return d


WEIGHTED = ("minmax", "max")  # the weighted-sum methods, by how each list is normalised
NORMS = {"minmax": "min-max", "max": "max"}  # ranx's name of each one's normalisation


def settings_grid(n_channels: int, step: float = 0.1, methods: tuple[str, ...] = ("minmax", "rrf")) -> list[Setting]:
    """For each weighted method of ``methods``, weights on the simplex (step ``step``, at least
    two channels used); for "rrf", every subset of at least two channels, each k in RRF_KS."""
    unknown = set(methods) - {*WEIGHTED, "rrf"}
    if unknown:
        raise ValueError(f"fusion methods {sorted(unknown)}: expected some of {(*WEIGHTED, 'rrf')}")
    units = round(1 / step)
    out = []
    for method in (m for m in methods if m in WEIGHTED):
        for combo in itertools.product(range(units + 1), repeat=n_channels):
            if sum(combo) == units and sum(c > 0 for c in combo) >= 2:
                out.append(Setting(method, tuple(round(c * step, 10) for c in combo)))
    if "rrf" in methods:
        for mask in itertools.product((0.0, 1.0), repeat=n_channels):
            if sum(mask) >= 2:
                out.extend(Setting("rrf", mask, k) for k in RRF_KS)
    return out


def fused_run(runs: list, setting: Setting):
    """The ranx fusion of one collection's channel runs under ``setting``."""
    from ranx import fuse

    used = [(r, w) for r, w in zip(runs, setting.weights) if w > 0]
    if setting.method in NORMS:
        return fuse(runs=[r for r, _ in used], norm=NORMS[setting.method], method="wsum", params={"weights": [w for _, w in used]})
    return fuse(runs=[r for r, _ in used], method="rrf", params={"k": setting.k})


def per_query(qrels, run, query_ids: list[str], metric: str = METRIC) -> np.ndarray:
    """``metric`` (nDCG@10 by default) of each query of ``query_ids``, in that order (0 for a
    query the run does not answer).

    ranx returns per-query scores in its own (sorted) query order, not the run's, so they are
    read back by query id from ``Run.scores``."""
    from ranx import Qrels, Run, evaluate

    judged = qrels.to_dict() if hasattr(qrels, "to_dict") else qrels
    hits = run.to_dict() if hasattr(run, "to_dict") else run
    answered = {q: hits[q] for q in query_ids if hits.get(q)}
    scores = dict.fromkeys(query_ids, 0.0)
    if answered:
        r = Run(answered)
        evaluate(Qrels({q: judged[q] for q in answered}), r, metric, save_results_in_run=True)
        scores.update({q: float(v) for q, v in r.scores[metric].items()})
    return np.asarray([scores[q] for q in query_ids], np.float64)
