"""Which channels an index holds: each build profile's set, and ``--channels LIST``.

``build-index --profile NAME`` (indexer/build_profiles.py) builds the channels the search
operating point of that name reads (retriever/profiles.py):

- ``fast`` (the default): BM25 on words + the MiniLM encoder, and no LLM at all (issue 71: the
  aligned tokens added +0.037 to -0.013 nDCG@10 to ``fast`` over the five shared collections,
  losing on two, while the LLM's pass over the documents was most of the build: 3-4x BM25 +
  MiniLM's build time). ``fast`` fuses BM25 and MiniLM as calibrated on the corpus
  (indexer/calibration.py);
- ``best``: BM25 + all-mpnet-base-v2 as the second encoder channel, no LLM either
  (the aligned tokens added +0.024 to -0.010 beside them, losing on npl); ``best`` fuses BM25
  and mpnet as calibrated. mpnet reads every document at ~1/5 of MiniLM's speed;
- ``both``: the channels of both, so that one index serves either (``--profile`` at load time,
  no rebuild). The aligned tokens (the LLM) are built where ``--channels`` names them.

Neither point reads the LLM's dense channel, so it is built only where a point falls back to it
(``--dense`` or ``--channels`` adds it): where mpnet is not installed, ``best`` and ``both`` hold
aligned tokens + the LLM dense channel + BM25 + MiniLM (``best`` then adds the LLM's query
expansion and its dense channel to ``fast``: BENCHMARKS.md, "Operating points"); without the
encoder extra, every profile holds aligned tokens + dense + BM25 on words (LOCO 0.522,
benchmarks/results/contrastive-long/fusion_cv.json), searched as before (no profile applies).

The aligned-token channel ("sparse") is in every profile's set; ``--channels LIST`` builds exactly
the channels it names (``--channels bm25``: BM25 alone), and the LLM is loaded only where a channel
built needs it (sparse, dense, dense-ef; BM25 on ``tokens`` reads its tokenizer alone).
"""
from __future__ import annotations

import importlib.util
from collections.abc import Iterable, Mapping
from typing import Any

from indexer.channels import CHANNEL_SPECS, LLM_EMBEDDINGS, LLM_TOKENS, LM_HEAD, MODES, sentence_encoder_specs
from indexer.channels import spec as channel_spec
from indexer.profile_table import DEFAULT_PROFILE, PROFILE_CHANNELS

CHANNELS = MODES  # every channel, in the table's order (indexer/channels.py)
LLM_BUILD_NEEDS = frozenset({LLM_TOKENS, LLM_EMBEDDINGS, LM_HEAD})  # what only the LLM's weights give a build
DEFAULT_ANALYZER = channel_spec("bm25").default
# the sentence encoders' default settings, by mode (where a packager, or a test, points them: a test
# sets DEFAULT_SETTINGS["encoder"] to a tiny model's directory)
DEFAULT_SETTINGS: dict[str, Any] = {s.mode: s.default for s in sentence_encoder_specs()}
ENCODER = "encoder"  # MiniLM's channel: the one every profile but the no-encoder fallback holds
WITH_ENCODER = ("sparse", "dense", "bm25", "encoder")
WITHOUT_ENCODER = ("sparse", "dense", "bm25")


def encoder_available(name: str | None = None) -> bool:
    """Whether the encoder ``name`` (default: MiniLM) can be loaded here: sentence-transformers
    importable and the packaged model installed (the ``encoder`` extra; mpnet: its zip parts)."""
    if importlib.util.find_spec("sentence_transformers") is None:
        return False
    from embedder.models import ModelNotAvailable
    from embedder.sentence_encoder import resolve_encoder

    try:
        resolve_encoder(name or DEFAULT_SETTINGS[ENCODER])
    except ModelNotAvailable:
        return False
    return True


def default_channels(profile: str = DEFAULT_PROFILE) -> tuple[str, ...]:
    """The channels ``build-index --profile PROFILE`` builds when none are named, given which
    encoders are installed here (the module docstring's fallbacks)."""
    if profile not in PROFILE_CHANNELS:
        raise ValueError(f"profile must be one of {', '.join(PROFILE_CHANNELS)}, not {profile!r}")
    if not encoder_available():
        return WITHOUT_ENCODER
    wanted = PROFILE_CHANNELS[profile]
    # another encoder than MiniLM not installed: best's fallback setting reads the LLM's dense channel and MiniLM
    if any(not encoder_available(DEFAULT_SETTINGS[s.mode]) for s in sentence_encoder_specs(wanted) if s.mode != ENCODER):
        return WITH_ENCODER
    return wanted


def parse_channels(text: str) -> tuple[str, ...]:
    """``"sparse,bm25,encoder"`` as a tuple in :data:`CHANNELS` order: exactly the channels named
    (``bm25`` alone builds BM25 alone, and no LLM runs for it); ValueError naming the unknown
    channel otherwise."""
    names = [c.strip() for c in text.split(",") if c.strip()]
    unknown = [c for c in names if c not in CHANNELS]
    if unknown or not names:
        problem = f"unknown channel {unknown[0]!r}" if unknown else "no channel named"
        raise ValueError(f"--channels {text!r}: {problem} (choose from {', '.join(CHANNELS)})")
    return tuple(s.mode for s in CHANNEL_SPECS if s.mode in names)


def resolve(channels: str | None, given: Mapping[str, Any] | None = None, profile: str = DEFAULT_PROFILE) -> tuple[tuple[str, ...], dict, bool]:
    """(channels, each channel's setting {mode: setting} as ``build_index(channels=...)`` takes it,
    whether they are the default set) from the command line: ``channels`` (``--channels LIST``) and
    ``given``, the per-channel flags' settings by mode (:func:`indexer.channels.flag_settings`:
    ``--lexical tokens``, ``--encoder NAME``, ``--embedfilter TAU``...), each of which adds its
    channel and sets its setting; the flags alone add theirs to the aligned-token channel (as they
    always did). With neither, :func:`default_channels` of ``profile``."""
    given = _by_mode(given)
    named = [s.mode for s in CHANNEL_SPECS if s.mode in given]
    if channels is None and not named:
        chosen, default = default_channels(profile), True
    else:
        listed = parse_channels(channels) if channels is not None else tuple(s.mode for s in CHANNEL_SPECS if s.required)
        chosen, default = tuple(c for c in CHANNELS if c in listed or c in named), False
    return chosen, channel_settings(chosen, given), default


def _by_mode(given: Mapping[str, Any] | None) -> dict[str, Any]:
    return {channel_spec(name).mode: value for name, value in (given or {}).items() if value not in (None, False)}


def channel_settings(channels: Iterable[str], given: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """``build_index(channels=...)`` for a channel set (the aligned tokens aside: ``sparse``): each
    channel's setting ``given`` (by any of its names), else its default (:data:`DEFAULT_SETTINGS`,
    else its row's, indexer/channels.py); sentence encoders by name."""
    given, channels = _by_mode(given), set(channels)
    return {s.mode: given.get(s.mode) or DEFAULT_SETTINGS.get(s.mode) or s.default_setting()
            for s in CHANNEL_SPECS if not s.required and s.mode in channels}


def build_options(channels: tuple[str, ...], given: Mapping[str, Any] | None = None) -> dict:
    """:func:`channel_settings` keyed by each row's ``option`` (``dense`` a bool, False where not
    built): the older keyword shape, which the studies in experiments/ read."""
    settings = channel_settings(channels, given)
    return {"dense": "dense" in channels} | {spec_of.option: settings[spec_of.mode] for spec_of in CHANNEL_SPECS if spec_of.mode in settings}


def describe(channels: tuple[str, ...], settings: dict) -> str:
    """One line for the build's output: ``channels: sparse, bm25 (words), encoder (minilm)``."""
    return "channels: " + ", ".join(f"{c} ({settings[c]})" if settings.get(c) and settings[c] is not True else c for c in channels)


def needs_llm(channels) -> bool:
    """Whether building ``channels`` (modes) runs the LLM: the aligned tokens, its dense channels."""
    return any(s.build_needs & LLM_BUILD_NEEDS for s in CHANNEL_SPECS if s.mode in channels)
