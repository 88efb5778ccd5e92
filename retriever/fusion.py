"""Fusing ranked lists from several channels (aligned-token sparse, dense, lexical BM25), and
:class:`Fusion`, the one checked value every caller (library, CLIs, server) hands the Retriever.

Three methods, matching ranx.fuse so that weights tuned with ranx apply here unchanged:
- "minmax": per query and channel, scores are min-max normalised over that channel's
  retrieved list, then summed with channel weights (ranx: norm="min-max", method="wsum").
  A document a channel did not retrieve gets 0 from it.
- "max": the same weighted sum, each list divided by its largest score (ranx: norm="max").
  Min-max stretches every list to [0, 1] whatever its shape; dividing by the top keeps how far
  the top stands above the rest, so a channel whose top documents stand out counts for more on
  that query than one whose list is flat (a per-query weight read from the scores, no labels).
  It needs scores that are positive at the top: a list whose largest score is not positive is
  min-max normalised instead (ranx would divide by 1e-9).
- "rrf": reciprocal rank fusion, sum of 1 / (k + rank) (ranx: method="rrf", default k=60).

*Completed* scores (a fusion with ``"complete": true``, as calibration records it): the channels
answer deeper (:data:`COMPLETION_DEPTH`) than the fusion reads (``depth``, the hybrid's
FUSION_DEPTH), the candidates and each list's normalisation still come from the first ``depth``
documents, but a candidate that a channel ranked below its first ``depth`` gets its real score
from that channel (normalised the same way, so below 0 for min-max) instead of 0; below the deep
list too, the deep list's last score (its bound) or, for a list that ended early (no more
matching documents), 0. Why: with 0, a document that BM25 ranks 1st and the encoder 101st loses
to one the encoder ranks 100th and BM25 never found; measured over 5 collections x 3 encoders
(benchmarks/results/calibration/NOTES.md), completion lifts Recall@100 by up to 0.05 where the
channels disagree most (NPL) and nDCG@10 by about 0.005.
"""
from __future__ import annotations

import copy
import math
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from indexer.calibration import channel_values
from indexer.channels import MODES, mode_of, sentence_encoder_specs

METHODS = ("minmax", "max", "rrf")
COMPLETION_DEPTH = 1000  # how deep each channel answers for a completed fusion


@dataclass
class FusedDoc:
    doc: int
    score: float
    contributions: dict[str, float]  # channel -> its weighted, normalised share of `score`


def _minmax(scores: np.ndarray) -> np.ndarray:
    lo, hi = float(scores.min()), float(scores.max())
    return (scores - lo) / (hi - lo) if hi > lo else np.ones_like(scores)


def _max(scores: np.ndarray) -> np.ndarray:
    hi = float(scores.max())
    return scores / hi if hi > 0 else _minmax(scores)


def fuse(
    channels: dict[str, tuple[np.ndarray, np.ndarray]],
    weights: dict[str, float],
    k: int,
    method: str = "minmax",
    rrf_k: int = 60,
    depth: int | None = None,
) -> list[FusedDoc]:
    """Fuse one query's per-channel (doc numbers, scores) lists (best first, -1 = padding).
    ``depth``: fuse the first ``depth`` of each list with scores completed from the rest of it
    (see the module's docstring); None: every document listed, 0 where a list lacks it."""
    if method not in METHODS:
        raise ValueError(f"method must be one of {METHODS}, not {method!r}")
    used = {}
    for name, (docs, scores) in channels.items():
        w = float(weights.get(name, 0.0))
        docs, scores = np.asarray(docs), np.asarray(scores, np.float64)
        keep = docs >= 0
        if w != 0.0 and keep.any():
            used[name] = (w, docs[keep], scores[keep], bool(keep.all()))
    if depth is not None and method != "rrf":
        return _fuse_completed(used, k, method, depth)
    total: dict[int, float] = {}
    parts: dict[int, dict[str, float]] = {}
    for name, (w, docs, scores, _) in used.items():
        if depth is not None:
            docs, scores = docs[:depth], scores[:depth]
        if method == "minmax":
            values = w * _minmax(scores)
        elif method == "max":
            values = w * _max(scores)
        else:
            values = w / (rrf_k + np.arange(1, docs.size + 1))
        for d, v in zip(docs.tolist(), values.tolist()):
            total[d] = total.get(d, 0.0) + v
            parts.setdefault(d, {})[name] = v
    ranked = sorted(total.items(), key=lambda kv: (-kv[1], kv[0]))[:k]
    return [FusedDoc(d, s, parts[d]) for d, s in ranked]


def _fuse_completed(used: dict[str, tuple[float, np.ndarray, np.ndarray, bool]], k: int, method: str, depth: int) -> list[FusedDoc]:
    """:func:`fuse` with completed scores: candidates from each list's first ``depth``, each
    scored by every channel (its deep list, else that list's bound)."""
    if not used:
        return []
    candidates = np.unique(np.concatenate([docs[:depth] for _, docs, _, _ in used.values()]))
    total = np.zeros(candidates.size)
    parts: dict[str, np.ndarray] = {}
    for name, (w, docs, scores, full) in used.items():
        values = channel_values(docs, scores, full, candidates, method, depth)
        parts[name] = w * values
        total += parts[name]
    ranked = np.lexsort((candidates, -total))[:k]
    return [FusedDoc(int(candidates[i]), float(total[i]), {n: float(v[i]) for n, v in parts.items()}) for i in ranked]


# the channels a fusion may weigh (every row of the channel table, indexer/channels.py), and the
# methods the Milvus backend fuses itself (retriever/backends/milvus.py)
CHANNELS = MODES
ENGINE_METHODS = ("milvus-weighted", "milvus-rrf")
_KEYS = ("method", "weights", "rrf_k", "norm_score", "complete")


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
    for key in ("norm_score", "complete"):
        if key in fusion and not isinstance(fusion[key], bool):
            raise ValueError(f"fusion setting {key!r}: {fusion[key]!r} is not a bool")
    return fusion


def _number(x: object) -> bool:
    return isinstance(x, (int, float, np.integer, np.floating)) and not isinstance(x, bool)


class Fusion(Mapping[str, Any]):
    """A hybrid setting, checked once (:func:`check_fusion`) and never changed afterwards.

    It reads as the dict it was made from (``fusion["weights"]``, ``dict(fusion)``; equal to
    that dict), so settings written to results files and sent by the server keep their shape;
    :meth:`as_dict` gives a copy for JSON. Its fields: ``method``, ``weights``, ``rrf_k``,
    ``norm_score`` (the last two at ranx's and Milvus's defaults where not given).
    """

    __slots__ = ("_setting",)

    def __init__(self, setting: Mapping[str, Any]) -> None:
        if isinstance(setting, Fusion):
            setting = setting.as_dict()
        # a private deep copy: the caller's dict may change later, this value may not
        self._setting: dict[str, Any] = copy.deepcopy(check_fusion(setting))

    @classmethod
    def of(cls, setting: Fusion | Mapping[str, Any]) -> Fusion:
        """``setting`` as a Fusion (itself where it is one), or ValueError naming the bad key."""
        return setting if isinstance(setting, Fusion) else cls(setting)

    @property
    def method(self) -> str:
        return self._setting.get("method", "minmax")

    @property
    def weights(self) -> dict[str, float]:
        """{channel: weight}, a copy."""
        return dict(self._setting["weights"])

    @property
    def rrf_k(self) -> float:
        return self._setting.get("rrf_k", 60)

    @property
    def norm_score(self) -> bool:
        return self._setting.get("norm_score", True)

    @property
    def complete(self) -> bool:
        """Whether candidates get completed scores (module docstring; not for "rrf" or the in-engine methods)."""
        return bool(self._setting.get("complete", False)) and self.method in ("minmax", "max")

    @property
    def in_engine(self) -> bool:
        """Fused inside the backend (Milvus's rankers, :data:`ENGINE_METHODS`), not here."""
        return self.method in ENGINE_METHODS

    def weight(self, channel: str) -> float:
        return float(self._setting["weights"].get(channel, 0))

    def channels(self, held: Sequence[str]) -> list[str]:
        """The channels of ``held`` this fusion reads (a positive weight), in ``held``'s order."""
        return [c for c in held if self.weight(c) > 0]

    def fuse(self, lists: dict[str, tuple[np.ndarray, np.ndarray]], k: int, depth: int | None = None) -> list[FusedDoc]:
        """One query's per-channel (doc numbers, scores) lists fused into its top ``k``
        (:func:`fuse`); ``depth``: the lists' depth the fusion reads where they were asked
        :data:`COMPLETION_DEPTH` deep for a completed fusion (ignored by one that is not)."""
        return fuse(lists, self._setting["weights"], k, self.method, self.rrf_k, depth if self.complete else None)

    def as_dict(self) -> dict[str, Any]:
        """The setting as a plain dict (a copy), as it was given."""
        return copy.deepcopy(self._setting)

    def __getitem__(self, key: str) -> Any:
        return copy.deepcopy(self._setting[key])  # a copy: no caller can change this value through it

    def __iter__(self) -> Iterator[str]:
        return iter(self._setting)

    def __len__(self) -> int:
        return len(self._setting)

    def __repr__(self) -> str:
        return f"Fusion({self._setting!r})"


# Hybrid default: per-query min-max normalisation, weighted sum, with the weights best by mean
# nDCG@10 over the five shared collections for the default adapter (benchmarks/fusion_cv.py: min-max
# weights on a 0.1 grid and RRF k in 10-100 over channel subsets). The weights follow the adapter:
# with Text2Token alone the choice was sparse 0.2, dense 0.2, bm25 0.6; with the stronger dense
# channel of smollm2-135m-contrastive-v2 it is sparse 0.1, dense 0.4, bm25 0.5
# (benchmarks/results/contrastive-long/fusion_cv.json). That choice is in-sample (mean 0.531);
# the held-out estimate is leave-one-collection-out, 0.522, above BM25 (0.458) on 4 of 5 collections,
# not on NPL (0.430 vs 0.437: the weights chosen on the other four give sparse 0.3, too much on
# NPL, where the sparse channel is weakest: 0.253 against BM25's 0.437). For smollm2-135m-contrastive-v4 (the
# default adapter since 2026-11-28) the same rule picks sparse 0.3, dense 0.2, bm25 0.5: held out 0.532, against
# 0.522 for v2 (benchmarks/results/release-chunk22-loco-sdb.json).
DEFAULT_FUSION = {"method": "minmax", "weights": {"sparse": 0.3, "dense": 0.2, "dense-ef": 0.0, "bm25": 0.5}}
# Default for an index that has the encoder channel (build-index --encoder): chosen by
# benchmarks/fusion_cv.py --subsets over bm25, encoder (all-MiniLM-L6-v2), sparse and dense of the
# default adapter (benchmarks/results/contrastive-long/fusion_encoder_subsets.json): the subset with
# the best leave-one-collection-out mean nDCG@10 is bm25+encoder+sparse, 0.554 against 0.535 for
# bm25+encoder (+0.020, p=0.007 over the pooled queries; better on 4 of 5 collections, -0.002 on
# cranfield), and this is its setting chosen on all five collections; every LOCO fold chose it too.
# Dense adds less beside the encoder (bm25+encoder+dense 0.547). Channels the index lacks are
# skipped, as for DEFAULT_FUSION.
DEFAULT_FUSION_WITH_ENCODER = {"method": "minmax", "weights": {"bm25": 0.4, "encoder": 0.4, "sparse": 0.2}}


def default_fusion(channels: Iterable[str] | bool) -> Fusion:
    """The hybrid setting of an index holding ``channels`` (modes) searched without one:
    DEFAULT_FUSION_WITH_ENCODER where it holds a sentence-encoder channel (the encoder's weight on
    the first of them it holds, in table order, where it lacks ``encoder``), else DEFAULT_FUSION.
    A bool (older callers) says whether it holds the ``encoder`` channel."""
    held = ({"encoder"} if channels else set()) if isinstance(channels, bool) else {mode_of(c) for c in channels}
    encoders = [s.mode for s in sentence_encoder_specs() if s.mode in held]
    if not encoders:
        return Fusion(DEFAULT_FUSION)
    weights = dict(DEFAULT_FUSION_WITH_ENCODER["weights"])
    if "encoder" not in held:
        weights[encoders[0]] = weights.pop("encoder")
    return Fusion({**DEFAULT_FUSION_WITH_ENCODER, "weights": weights})
