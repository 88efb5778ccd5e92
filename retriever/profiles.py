"""Operating points: one index, two ways to search it, chosen when it is loaded (no rebuild).

- ``fast`` (the default): no LLM forward per query. The sparse channel searches the query's own
  tokens (``query_encoder="none"``: the LLM's tokenizer alone is loaded), beside BM25 and the
  MiniLM encoder channel. Measured: the distilled student's expansion adds nothing held out
  beside BM25 and MiniLM (BENCHMARKS.md, "expansion-depth"), and costs a model load and ~7 ms
  a query.
- ``best``: the LLM encodes the query (its pooled embedding), and the hybrid adds the query's
  aligned tokens and the LLM dense channel to BM25 and MiniLM: the LLM is worth its cost where
  it reads the query.

Each point's fusion is what the ``mean`` rule of benchmarks/studies/operating_points.py picks
from the five shared collections over min-max and max-normalised weights (retriever/fusion.py):
the setting best on the mean. Judged leaving each collection out (the rule applied to four, the
fifth scored), ``fast`` took the same setting in every fold for each of three adapters
(contrastive-v2, chunk-0019, v4) and scored +0.011 over BM25 + MiniLM fused (B+M) for each,
above it on 4 or 5 of 5 collections; min-max weights under the ``margin`` rule that chose the
previous ``fast`` gave -0.001 to +0.006 (benchmarks/results/operating-points-max.json;
BENCHMARKS.md, "Operating points"). Dividing each list by its top score instead of stretching it
to [0, 1] lets a channel whose top documents stand out weigh more on that query. ``best``'s
folds disagree (the LLM channels add +0.002 over ``fast`` held out on these collections), so its
setting is less sure than ``fast``'s. ``fast`` pays in deep recall: its Recall@100 is MiniLM's
(0.762 against B+M's 0.780 over the five), since nearly every document the encoder retrieved
outscores one it did not once the lists are divided by their tops; ``best`` keeps 0.786.
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
        {"method": "max", "weights": {"bm25": 0.3, "encoder": 0.6, "sparse": 0.1}},
        "no LLM forward per query: BM25 + MiniLM + the query's own tokens in the aligned-token index",
    ),
    "best": Profile(
        "best", "llm",
        {"method": "minmax", "weights": {"bm25": 0.3, "encoder": 0.4, "sparse": 0.2, "dense": 0.1}},
        "the LLM encodes the query: BM25 + MiniLM + its aligned tokens + the LLM's dense channel",
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
