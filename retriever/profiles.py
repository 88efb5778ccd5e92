"""Operating points: two ways to search, chosen when an index is loaded. ``build-index --profile``
builds the channels of one (``fast``, the default, or ``best``) or of both in one index
(``both``: either chosen at load time, no rebuild); indexer/build_profiles.py.

- ``fast`` (the default): no LLM forward per query. The sparse channel searches the query's own
  tokens (``query_encoder="none"``: the LLM's tokenizer alone is loaded), beside BM25 and the
  MiniLM encoder channel. Measured: the distilled student's expansion adds nothing held out
  beside BM25 and MiniLM (BENCHMARKS.md, "expansion-depth"), and costs a model load and ~7 ms
  a query.
- ``best``: the same fusion over the stronger, ~5x costlier all-mpnet-base-v2 in the second
  encoder channel ("encoder2", which ``build-index --profile best`` or ``both`` builds where
  mpnet is installed), still with no LLM forward per query. Held out, it beat BM25 + mpnet fused (the
  higher anchor a user would pick) by +0.014 (0.5707 vs 0.5571; 4 of 5 collections, npl -0.008;
  every fold chose this setting), while adding the LLM's query expansion and dense channel to it
  gave 0.5689: beside mpnet, the LLM reading the query added nothing on these collections
  (benchmarks/results/operating-points-mpnet-channel.json).
  On an index without the second encoder (built before it, or where mpnet is not installed),
  ``best`` is what it was before: the LLM encodes the query, and the hybrid adds its aligned
  tokens and its dense channel to BM25 and MiniLM (held out +0.002 over ``fast``).

Each point's fusion is what the ``mean`` rule of benchmarks/studies/operating_points.py picks
from the five shared collections over min-max and max-normalised weights (retriever/fusion.py):
the setting best on the mean. Judged leaving each collection out (the rule applied to four, the
fifth scored), ``fast`` took the same setting in every fold for each of three adapters
(contrastive-v2, chunk-0019, v4) and scored +0.011 over BM25 + MiniLM fused (B+M) for each,
above it on 4 or 5 of 5 collections; min-max weights under the ``margin`` rule that chose the
previous ``fast`` gave -0.001 to +0.006 (benchmarks/results/operating-points-max.json;
BENCHMARKS.md, "Operating points"). Dividing each list by its top score instead of stretching it
to [0, 1] lets a channel whose top documents stand out weigh more on that query. ``fast`` pays
in deep recall: its Recall@100 is MiniLM's (0.762 against B+M's 0.780 over the five), since
nearly every document the encoder retrieved outscores one it did not once the lists are divided
by their tops.
"""
from __future__ import annotations

from collections.abc import Iterable
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
    # what the point is on an index that lacks this setting's channels but holds the fallback's
    fallback: Profile | None = field(default=None, hash=False)
    # the pair of the index's calibration (indexer/calibration_channels.py) whose fusion replaces
    # ``fusion`` where the index records one ("bm25+encoder"); None: always ``fusion``
    calibrated: str | None = None

    @property
    def channels(self) -> tuple[str, ...]:
        """The channels its fusion weighs (what ``build-index`` must build for it)."""
        return tuple(c for c, w in self.fusion["weights"].items() if w > 0)


PROFILES: dict[str, Profile] = {
    "fast": Profile(
        "fast", "none",
        {"method": "minmax", "weights": {"bm25": 0.5, "encoder": 0.5}},
        "no LLM at all: BM25 + MiniLM, weighed as calibrated on the corpus",
        calibrated="bm25+encoder",
    ),
    "best": Profile(
        "best", "none",
        {"method": "max", "weights": {"bm25": 0.3, "encoder2": 0.6, "sparse": 0.1}},
        "no LLM forward per query: BM25 + mpnet (the second encoder channel), weighed as calibrated on the corpus, "
        "+ the query's own tokens in the aligned-token index",
        fallback=Profile(
            "best", "llm",
            {"method": "minmax", "weights": {"bm25": 0.3, "encoder": 0.4, "sparse": 0.2, "dense": 0.1}},
            "the LLM encodes the query: BM25 + MiniLM + its aligned tokens + the LLM's dense channel (an index without encoder2)",
        ),
        calibrated="bm25+encoder2",
    ),
}  # fmt: skip


def get_profile(name: str | Profile) -> Profile:
    """The profile called ``name``; ValueError naming the choices otherwise."""
    if isinstance(name, Profile):
        return name
    if name not in PROFILES:
        raise ValueError(f"profile must be one of {', '.join(PROFILE_NAMES)}, not {name!r}")
    return PROFILES[name]


def fit_profile(name: str | Profile, channels: Iterable[str]) -> Profile:
    """The profile called ``name`` as it searches an index holding ``channels``: its own setting
    where the index holds every channel it weighs, else the first of its fallbacks that does;
    where none does, the setting whose held channels carry the most of its fusion weight (the
    caller says what is lacking)."""
    wanted = get_profile(name)
    held = set(channels)
    settings: list[Profile] = []
    candidate: Profile | None = wanted
    while candidate is not None:
        if set(candidate.channels) <= held:
            return candidate
        settings.append(candidate)
        candidate = candidate.fallback

    def held_weight(p: Profile) -> float:
        weights = p.fusion["weights"]
        return sum(w for c, w in weights.items() if c in held) / max(sum(weights.values()), 1e-12)

    return max(settings, key=held_weight)  # the first of equals: the profile's own


def auto_profile(channels: Iterable[str]) -> str | None:
    """The profile ``--profile auto`` searches an index holding ``channels`` at: the first (the
    default first) whose own setting it holds every channel of, so that an index built for
    ``best`` (``build-index --profile best``: no MiniLM) is searched at ``best``; None where none
    is held whole (an index of an earlier default, searched as it was built to be)."""
    held = set(channels)
    return next((name for name in PROFILE_NAMES if set(PROFILES[name].channels) <= held), None)


def profile_fusion(profile: Profile, calibration: dict | None) -> tuple[dict, str]:
    """The fusion ``profile`` searches an index with, and why: where the index's manifest records
    a calibration of the profile's pair (build-index and update-index write it,
    indexer/calibration.py), the pair weighed as calibrated on the index's own corpus and any other
    channel of the profile kept at its fixed weight (``best``'s aligned tokens, 0.1); else the
    profile's fixed setting."""
    if profile.calibrated is None:
        return profile.fusion, f"the {profile.name} profile's fixed setting"
    record = ((calibration or {}).get("pairs") or {}).get(profile.calibrated)
    if isinstance(record, dict) and isinstance(record.get("fusion"), dict) and isinstance(record["fusion"].get("weights"), dict):
        pair = set(profile.calibrated.split("+"))
        extra = {c: w for c, w in profile.fusion["weights"].items() if c not in pair}
        share = 1.0 - sum(extra.values())
        weights = {c: round(float(w) * share, 6) if isinstance(w, (int, float)) else w for c, w in record["fusion"]["weights"].items()}
        fusion = {**record["fusion"], "weights": {**weights, **extra}}
        alone = ", ".join(f"{c} {v:.3f}" for c, v in (record.get("alone") or {}).items())
        kept = f"; {', '.join(f'{c} {w:g}' for c, w in extra.items())} fixed" if extra else ""
        return fusion, (f"calibrated on this corpus when indexed: {record.get('n_queries')} sentences held out of its documents, "
                        f"found by each channel alone at nDCG@10 {alone}{kept}")
    why = (calibration or {}).get("skipped") or "the index records no calibration (built before it)"
    return profile.fusion, f"the {profile.name} profile's fixed setting: {why}"


def profile_arg(text: str) -> str:
    """argparse type of ``--profile``: the name ("auto" too: Retriever.load's default), checked."""
    import argparse

    if text == "auto":
        return text
    try:
        return get_profile(text).name
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
