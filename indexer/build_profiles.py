"""What ``build-index --profile fast|best|both`` writes: the channels an operating point searches,
and the compact layout that suits it (issue 53).

An index holds what its operating point (retriever/profiles.py) reads, in the smallest layout
that keeps that point's nDCG@10 within 0.003 of the float32 reference:

- ``fast`` (the default): BM25 + MiniLM, no LLM (issue 71; until then aligned tokens too, with
  4-bit impacts: 1.22-1.35 KB a document of postings and vectors on the five shared collections,
  benchmarks/results/compact-index/compact-index-profiles.json), bit-packed doc numbers. The
  price is the scan: bit-packed doc numbers decode at about twice int32's cost a posting (a
  million real-shaped documents: 6.64 ms on 2 cores against 3.94 for int32 doc numbers, which
  range16 scans 1.4x faster still; docs/backends-and-scale.md). ``--doc-ids range16`` buys it
  back for about a byte a posting; ten million documents want it (format 5: 39.6 ms p50 at
  recall@10 0.994 on ten million synthetic documents, 2 cores).
- ``best``: BM25 + mpnet, no LLM (issue 71; until then aligned tokens too), 8-bit impacts,
  16-bit range-blocked doc numbers (format 5).
- ``both``: the channels of both points in one index (``--profile`` chosen at search time, no
  rebuild), laid out as ``best``: 2.6-2.8 KB a document.

Each profile's channels, and what they fall back to where an encoder is not installed, are
indexer/channel_set.py's.
"""
from __future__ import annotations

from dataclasses import dataclass

from indexer.channel_set import default_channels
from indexer.profile_table import BOTH, BOTH_SUMMARY, BUILD_PROFILE_NAMES, DEFAULT_PROFILE, PROFILES


@dataclass(frozen=True)
class BuildProfile:
    """The compact layout ``build-index --profile NAME`` writes by default (its channels:
    :data:`indexer.profile_table.PROFILE_CHANNELS`): a view of the profile table's row."""

    name: str
    doc_ids: str  # build-index --doc-ids
    impact_bits: int  # build-index --impact-bits
    summary: str

    @property
    def channels(self) -> tuple[str, ...]:
        """Its channels here, given which encoders are installed."""
        return default_channels(self.name)


def _build_profile(name: str) -> BuildProfile:
    if name in BOTH:  # laid out as the last of its parts
        last = PROFILES[BOTH[name][-1]]
        return BuildProfile(name, last.doc_ids, last.impact_bits, BOTH_SUMMARY)
    p = PROFILES[name]
    return BuildProfile(name, p.doc_ids, p.impact_bits, p.build_summary)


BUILD_PROFILES: dict[str, BuildProfile] = {name: _build_profile(name) for name in BUILD_PROFILE_NAMES}
DEFAULT_BUILD_PROFILE = DEFAULT_PROFILE


def get_build_profile(name: str) -> BuildProfile:
    """The build profile called ``name``; ValueError naming the choices otherwise."""
    if name not in BUILD_PROFILES:
        raise ValueError(f"build profile must be one of {', '.join(BUILD_PROFILE_NAMES)}, not {name!r}")
    return BUILD_PROFILES[name]


__all__ = ["BUILD_PROFILES", "BUILD_PROFILE_NAMES", "DEFAULT_BUILD_PROFILE", "BuildProfile", "get_build_profile"]
