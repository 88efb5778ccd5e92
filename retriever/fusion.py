"""Fusing ranked lists from several channels (aligned-token sparse, dense, lexical BM25).

Two methods, matching ranx.fuse so that weights tuned with ranx apply here unchanged:
- "minmax": per query and channel, scores are min-max normalised over that channel's
  retrieved list, then summed with channel weights (ranx: norm="min-max", method="wsum").
  A document a channel did not retrieve gets 0 from it.
- "rrf": reciprocal rank fusion, sum of 1 / (k + rank) (ranx: method="rrf", default k=60).
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from indexer.channels import MODES

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


# the channels a fusion may weigh (every row of the channel table, indexer/channels.py), and the
# methods the Milvus backend fuses itself (retriever/backends/milvus.py)
CHANNELS = MODES
ENGINE_METHODS = ("milvus-weighted", "milvus-rrf")
_KEYS = ("method", "weights", "rrf_k", "norm_score")


def check_fusion(fusion: object) -> dict:
    """A fusion setting as the Retriever takes it, or ValueError naming the bad key: ``method``
    one of :data:`METHODS` or :data:`ENGINE_METHODS`, ``weights`` {channel: finite number >= 0},
    ``rrf_k`` a finite number > 0, ``norm_score`` a bool. Checked once, when the Retriever is
    made, rather than failing (or silently ranking by document number) at search time."""
    if not isinstance(fusion, dict):
        raise ValueError(f"fusion setting: expected a dict with keys {_KEYS}, got {type(fusion).__name__}")  # noqa: TRY004 - check_fusion's contract is ValueError for any bad setting (tests/test_odd_inputs.py, the CLIs catch it)
    for key in fusion:
        if key not in _KEYS:
            raise ValueError(f"fusion setting {key!r}: unknown key (known: {', '.join(_KEYS)})")
    method = fusion.get("method", "minmax")
    if method not in METHODS + ENGINE_METHODS:
        raise ValueError(f"fusion setting 'method': {method!r} is not one of {METHODS + ENGINE_METHODS}")
    weights = fusion.get("weights")
    if not isinstance(weights, dict):
        raise ValueError(f"fusion setting 'weights': expected a dict of channel -> weight, got {type(weights).__name__}")  # noqa: TRY004 - check_fusion's contract is ValueError for any bad setting (tests/test_odd_inputs.py, the CLIs catch it)
    for name, w in weights.items():
        if name not in CHANNELS:
            raise ValueError(f"fusion setting 'weights.{name}': unknown channel (known: {', '.join(CHANNELS)})")
        if not _number(w) or not math.isfinite(w) or w < 0:
            raise ValueError(f"fusion setting 'weights.{name}': {w!r} is not a finite number >= 0")
    if "rrf_k" in fusion and not (_number(fusion["rrf_k"]) and math.isfinite(fusion["rrf_k"]) and fusion["rrf_k"] > 0):
        raise ValueError(f"fusion setting 'rrf_k': {fusion['rrf_k']!r} is not a finite number > 0")
    if "norm_score" in fusion and not isinstance(fusion["norm_score"], bool):
        raise ValueError(f"fusion setting 'norm_score': {fusion['norm_score']!r} is not a bool")
    return fusion


def _number(x: object) -> bool:
    return isinstance(x, (int, float, np.integer, np.floating)) and not isinstance(x, bool)
