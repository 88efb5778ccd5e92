"""Operating points: two ways to search, chosen when an index is loaded. ``build-index --profile``
builds the channels of one (``fast``, the default, or ``best``) or of both in one index
(``both``: either chosen at load time, no rebuild); indexer/build_profiles.py.

- ``fast`` (the default): BM25 + MiniLM, no LLM at all, neither to index nor to search.
- ``best``: BM25 + the stronger, ~5x costlier all-mpnet-base-v2 (the second encoder channel),
  no LLM either. The query's own tokens in the aligned-token index (0.1 beside them
  until issue 71) added +0.024 to -0.010 nDCG@10, losing on npl, for the LLM's pass over every
  document. On an index without mpnet, ``best`` is what it was before: the LLM encodes the
  query, and the hybrid adds its aligned tokens and its dense channel to BM25 and MiniLM.

Each point weighs its BM25 + encoder pair as that index's own corpus says (issue 71): at build
time, and again when an update has changed a tenth of the documents, indexer/calibration.py holds
a sentence out of a few hundred documents, asks each channel to find the document it came from,
and keeps the min-max or max-normalised weights that find them best (then a tenth more to the
encoder: held-out sentences share their document's exact words, so they overrate BM25). The
manifest records the choice and the evidence; :func:`profile_fusion` reads it, and
``search-index`` and ``/info`` say which fusion was used and why. A corpus too small to
calibrate (fewer than 20 sentences to hold out) or an index built before calibration is searched
with the profile's fixed setting.

Why: a fixed setting chosen on the five shared collections leant on the encoder (max-normalised,
encoder 0.6), since MiniLM scores 0.99-1.18x BM25 there; on collections where it scores
0.82-0.95x BM25 the same setting lost to plain BM25 + MiniLM by up to 0.038 nDCG@10. Measured over
5 collections x 3 encoders x 2 BM25 analysers (benchmarks/results/calibration), the calibrated
weights move toward BM25 where the encoder is weak and toward the encoder where it is strong;
see docs/calibration.md for what they gain and where they still miss.
"""
from __future__ import annotations

from collections.abc import Iterable

from indexer.profile_table import DEFAULT_PROFILE, PROFILE_NAMES, PROFILES, Profile  # the one table, build and search

__all__ = ["DEFAULT_PROFILE", "PROFILES", "PROFILE_NAMES", "Profile", "auto_profile", "fit_profile", "get_profile", "profile_arg",
           "profile_fusion"]


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
    channel of the profile kept at its fixed weight (none today); else the profile's fixed setting."""
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
        completed = "; each candidate scored by every channel (completed)" if fusion.get("complete") else ""
        return fusion, (f"calibrated on this corpus when indexed: {record.get('n_queries')} sentences held out of its documents, "
                        f"found by each channel alone at nDCG@10 {alone}{kept}{completed}")
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
