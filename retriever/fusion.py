"""Fusing ranked lists from several channels (aligned-token sparse, dense, lexical BM25).

Two methods, matching ranx.fuse so that weights tuned with ranx apply here unchanged:
- "minmax": per query and channel, scores are min-max normalised over that channel's
  retrieved list, then summed with channel weights (ranx: norm="min-max", method="wsum").
  A document a channel did not retrieve gets 0 from it.
- "rrf": reciprocal rank fusion, sum of 1 / (k + rank) (ranx: method="rrf", default k=60).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

METHODS = ("minmax", "rrf")


@dataclass
class FusedDoc:
    doc: int
    score: float
    contributions: dict[str, float]  # channel -> its weighted, normalised share of `score`


def _minmax(scores: np.ndarray) -> np.ndarray:
    lo, hi = float(scores.min()), float(scores.max())
    return (scores - lo) / (hi - lo) if hi > lo else np.ones_like(scores)


def fuse(
    channels: dict[str, tuple[np.ndarray, np.ndarray]],
    weights: dict[str, float],
    k: int,
    method: str = "minmax",
    rrf_k: int = 60,
) -> list[FusedDoc]:
    """Fuse one query's per-channel (doc numbers, scores) lists (best first, -1 = padding)."""
    if method not in METHODS:
        raise ValueError(f"method must be one of {METHODS}, not {method!r}")
    total: dict[int, float] = {}
    parts: dict[int, dict[str, float]] = {}
    for name, (docs, scores) in channels.items():
        w = float(weights.get(name, 0.0))
        keep = np.asarray(docs) >= 0
        docs, scores = np.asarray(docs)[keep], np.asarray(scores, np.float64)[keep]
        if w == 0.0 or docs.size == 0:
            continue
        if method == "minmax":
            values = w * _minmax(scores)
        else:
            values = w / (rrf_k + np.arange(1, docs.size + 1))
        for d, v in zip(docs.tolist(), values.tolist()):
            total[d] = total.get(d, 0.0) + v
            parts.setdefault(d, {})[name] = v
    ranked = sorted(total.items(), key=lambda kv: (-kv[1], kv[0]))[:k]
    return [FusedDoc(d, s, parts[d]) for d, s in ranked]
