"""The operating points, build and search in one table (issue 69).

Each :class:`Profile` says what ``build-index --profile NAME`` builds (its channels, the compact
layout: indexer/build_profiles.py) and how ``search-index --profile NAME`` searches (who encodes
queries, the hybrid's fusion, the corpus calibration it reads: retriever/profiles.py); ``both`` is
a build profile alone: the channels of its ``parts`` in one index, either searched at load time.
The table sits below the indexer and the retriever, so both read it (the retriever sits above).
Why each point is what it is: retriever/profiles.py and indexer/channel_set.py.
"""
from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class Profile:
    """An operating point: who encodes queries for the LLM channels, and the hybrid's fusion
    (search); its channels and compact layout (build)."""

    name: str
    query_encoder: str  # Retriever query_encoder: "none" or "llm"
    fusion: dict = field(hash=False)
    summary: str = ""
    # what the point is on an index that lacks this setting's channels but holds the fallback's
    fallback: Profile | None = field(default=None, hash=False)
    # the pair of the index's calibration (indexer/calibration_channels.py) whose fusion replaces
    # ``fusion`` where the index records one ("bm25+encoder"); None: always ``fusion``
    calibrated: str | None = None
    doc_ids: str = "range16"  # build-index --doc-ids of a compact build for it
    impact_bits: int = 8  # build-index --impact-bits of a compact build for it
    build_summary: str = ""

    @property
    def channels(self) -> tuple[str, ...]:
        """The channels its fusion weighs (what ``build-index`` must build for it)."""
        return tuple(c for c, w in self.fusion["weights"].items() if w > 0)


PROFILES: dict[str, Profile] = {
    "fast": Profile(
        "fast", "none",
        {"method": "minmax", "weights": {"bm25": 0.5, "encoder": 0.5}},
        "no LLM at all: BM25 + MiniLM, weighed as calibrated on the corpus",
        calibrated="bm25+encoder", doc_ids="bitpacked", impact_bits=4,
        build_summary="what search's fast profile reads (BM25 + MiniLM, no LLM), as small as measured: "
                      "8-bit BM25 impacts, bit-packed doc numbers",
    ),
    "best": Profile(
        "best", "none",
        {"method": "minmax", "weights": {"bm25": 0.5, "encoder2": 0.5}},
        "no LLM at all: BM25 + mpnet (the second encoder channel), weighed as calibrated on the corpus",
        fallback=Profile(
            "best", "llm",
            {"method": "minmax", "weights": {"bm25": 0.3, "encoder": 0.4, "sparse": 0.2, "dense": 0.1}},
            "the LLM encodes the query: BM25 + MiniLM + its aligned tokens + the LLM's dense channel (an index without encoder2)",
        ),
        calibrated="bm25+encoder2",
        build_summary="what search's best profile reads (BM25 + mpnet, no LLM): 8-bit impacts, range16 doc numbers",
    ),
}  # fmt: skip
PROFILE_NAMES = tuple(PROFILES)  # the search profiles
DEFAULT_PROFILE = "fast"
# build profiles that are several search profiles' channels in one index, laid out as the last of them
BOTH: dict[str, tuple[str, ...]] = {"both": ("fast", "best")}
BOTH_SUMMARY = "both profiles' channels in one index (the profile chosen at search time): 8-bit impacts, range16 doc numbers"
BUILD_PROFILE_NAMES = PROFILE_NAMES + tuple(BOTH)


def profile_channels(name: str) -> tuple[str, ...]:
    """The channels the build profile ``name`` builds where every encoder is installed, in fusion order."""
    if name in BOTH:
        return tuple(dict.fromkeys(c for part in BOTH[name] for c in PROFILES[part].channels))
    return PROFILES[name].channels


# each build profile's channels with every encoder installed
PROFILE_CHANNELS: dict[str, tuple[str, ...]] = {name: profile_channels(name) for name in BUILD_PROFILE_NAMES}

__all__ = ["BOTH", "BUILD_PROFILE_NAMES", "DEFAULT_PROFILE", "PROFILES", "PROFILE_CHANNELS", "PROFILE_NAMES", "Profile", "profile_channels"]
