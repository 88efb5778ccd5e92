"""Pruned search of the aligned-token channel: an operating point for large indexes.

An LLM-expanded query reads every posting of ~80-200 tokens; its common tokens have the long lists
and the small IDF weights. :class:`SparsePruning` (``keep_mass``, ``depth``) makes the numba
backend answer the sparse channel with :func:`indexer.query_pruning.pruned_search`: the fewest
highest-weight tokens covering ``keep_mass`` of the query's weight, searched to ``depth``, those
candidates rescored exactly with the dropped tokens. Not exact: on ten million synthetic documents,
keep 0.95 / depth 100 read 46% of the postings, took 39.6 ms p50 where the exact search took 72.5,
and found 99.4% of the exact top 10 (benchmarks/results/scale/ten-million.json; docs/backends-and-scale.md).
Off by default: on small indexes the scan is cheap and pruning buys nothing.
"""
from __future__ import annotations

import argparse
from dataclasses import dataclass

from indexer.query_pruning import check_keep_mass


@dataclass(frozen=True)
class SparsePruning:
    """How the aligned-token channel is searched pruned (see the module)."""

    keep_mass: float = 0.95
    depth: int = 100

    def __post_init__(self) -> None:
        object.__setattr__(self, "keep_mass", check_keep_mass(self.keep_mass))
        if isinstance(self.depth, bool) or not isinstance(self.depth, int) or self.depth < 1:
            raise ValueError(f"sparse pruning depth must be a positive integer, not {self.depth!r}")

    @classmethod
    def parse(cls, text: str) -> SparsePruning:
        """``"KEEP,DEPTH"`` (e.g. ``"0.95,100"``), or ``"KEEP"`` with the default depth."""
        parts = [p.strip() for p in str(text).split(",")]
        if len(parts) not in (1, 2) or not all(parts):
            raise ValueError(f"sparse pruning is KEEP[,DEPTH] (e.g. 0.95,100), not {text!r}")
        try:
            keep = float(parts[0])
            depth = int(parts[1]) if len(parts) == 2 else cls.depth
        except ValueError:
            raise ValueError(f"sparse pruning is KEEP[,DEPTH] (e.g. 0.95,100), not {text!r}") from None
        return cls(keep, depth)

    def to_dict(self) -> dict:
        return {"keep_mass": self.keep_mass, "depth": self.depth}


def sparse_pruning_arg(text: str) -> SparsePruning:
    """``--sparse-pruning KEEP[,DEPTH]`` for argparse (a bad value is a usage error naming the flag)."""
    try:
        return SparsePruning.parse(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


__all__ = ["SparsePruning", "sparse_pruning_arg"]
