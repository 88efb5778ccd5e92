"""Latency statistics and stopwatches for single-process, one-query-at-a-time timing."""
from __future__ import annotations

import time
from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:  # typing.Self is 3.11+; annotations are not evaluated at run time (__future__)
    from typing_extensions import Self


def latency_stats(seconds: Sequence[float]) -> dict[str, float | int]:
    """p50/p95/mean latency in milliseconds and queries per second of sequential calls.

    QPS is the number of queries over their summed latency: one process, one query at a
    time, no batching (what a single interactive user sees).
    """
    s = np.asarray(seconds, dtype=np.float64)
    if s.size == 0:
        return {"n": 0, "p50_ms": float("nan"), "p95_ms": float("nan"), "mean_ms": float("nan"), "qps": float("nan")}
    return {
        "n": int(s.size),
        "p50_ms": round(float(np.percentile(s, 50)) * 1e3, 4),
        "p95_ms": round(float(np.percentile(s, 95)) * 1e3, 4),
        "mean_ms": round(float(s.mean()) * 1e3, 4),
        "qps": round(float(s.size / max(s.sum(), 1e-12)), 2),
    }


class Stopwatch:
    """``with Stopwatch() as sw: ...`` then ``sw.seconds``."""

    def __enter__(self) -> Self:
        self.seconds = 0.0
        self._t0 = time.perf_counter()
        return self

    def __exit__(self, *exc) -> None:
        self.seconds = time.perf_counter() - self._t0
