"""Operating points: one index, two ways to search it, chosen when it is loaded (no rebuild).

- ``fast`` (the default): no LLM forward per query. The sparse channel searches the query's own
  tokens (``query_encoder="none"``: the LLM's tokenizer alone is loaded), beside BM25 and the
  MiniLM encoder channel. Measured: the distilled student's expansion adds nothing held out
  beside BM25 and MiniLM (BENCHMARKS.md, "expansion-depth"), and costs a model load and ~7 ms
  a query.
- ``best``: the LLM encodes the query (its pooled embedding), and the hybrid adds the LLM
  dense channel to BM25 and MiniLM: the LLM is worth its cost where it reads the query.

Each point's fusion weights are what the ``margin`` rule of benchmarks/studies/operating_points.py
picks from the five shared collections: the setting whose worst collection is least below BM25 +
MiniLM fused (what a user would build instead), then the best mean. Judged leaving each collection
out, that rule kept the worst collection within 0.0024 (fast) and 0.0073 (best) of B+M, where the
in-sample ``mean`` rule that chose the previous default fell 0.0127 / 0.0109 below it
(benchmarks/results/operating-points-contrastive-v2.json; BENCHMARKS.md, "Operating points").
Channels an index lacks are skipped, as for any fusion.
"""
from __future__ import annotations

from dataclasses import dataclass, field

PROFILE_NAMES = ("fast", "best")
DEFAULT_PROFILE = "fast"


@dataclass(frozen=True)
class Profile:
    """An operating point: who encodes queries for the LLM channels, and the hybrid's fusion."""

    name: str
    query_encoder: str  # Retriever query_encoder: "none" or "llm"
    fusion: dict = field(hash=False)
    summary: str = ""

    @property
    def channels(self) -> tuple[str, ...]:
        """The channels its fusion weighs (what ``build-index`` must build for it)."""
        return tuple(c for c, w in self.fusion["weights"].items() if w > 0)


PROFILES: dict[str, Profile] = {
    "fast": Profile(
        "fast", "none",
        {"method": "minmax", "weights": {"bm25": 0.4, "encoder": 0.4, "sparse": 0.2}},
        "no LLM forward per query: BM25 + MiniLM + the query's own tokens in the aligned-token index",
    ),
    "best": Profile(
        "best", "llm",
        {"method": "minmax", "weights": {"bm25": 0.4, "encoder": 0.5, "dense": 0.1}},
        "the LLM encodes the query: BM25 + MiniLM + the LLM's dense channel",
    ),
}  # fmt: skip


def get_profile(name: str | Profile) -> Profile:
    """The profile called ``name``; ValueError naming the choices otherwise."""
    if isinstance(name, Profile):
        return name
    if name not in PROFILES:
        raise ValueError(f"profile must be one of {', '.join(PROFILE_NAMES)}, not {name!r}")
    return PROFILES[name]


def profile_arg(text: str) -> str:
    """argparse type of ``--profile``: the name ("auto" too: Retriever.load's default), checked."""
    import argparse

    if text == "auto":
        return text
    try:
        return get_profile(text).name
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
