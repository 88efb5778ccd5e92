"""Which channels an index holds: each build profile's set, and ``--channels LIST``.

``build-index --profile NAME`` (indexer/build_profiles.py) builds the channels the search
operating point of that name reads (retriever/profiles.py):

- ``fast`` (the default): BM25 on words + the MiniLM encoder, and no LLM at all (issue 71: the
  aligned tokens added +0.037 to -0.013 nDCG@10 to ``fast`` over the five shared collections,
  losing on two, while the LLM's pass over the documents was most of the build: 3-4x BM25 +
  MiniLM's build time). ``fast`` fuses BM25 and MiniLM as calibrated on the corpus
  (indexer/calibration.py);
- ``best``: BM25 + all-mpnet-base-v2 as the second encoder channel ("encoder2"), no LLM either
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

from indexer.channels import CHANNEL_SPECS, LLM_EMBEDDINGS, LLM_TOKENS, LM_HEAD, MODES
from indexer.channels import spec as channel_spec

CHANNELS = MODES  # every channel, in the table's order (indexer/channels.py)
LLM_BUILD_NEEDS = frozenset({LLM_TOKENS, LLM_EMBEDDINGS, LM_HEAD})  # what only the LLM's weights give a build
DEFAULT_ENCODER = channel_spec("encoder").default
DEFAULT_ENCODER2 = channel_spec("encoder2").default
DEFAULT_ANALYZER = channel_spec("bm25").default
WITH_BOTH_ENCODERS = ("bm25", "encoder", "encoder2")
# each build profile's channels with both encoders installed (tests/test_build_profiles.py checks
# them against the channels each search profile weighs: the retriever sits above the indexer)
PROFILE_CHANNELS = {"fast": ("bm25", "encoder"), "best": ("bm25", "encoder2"), "both": WITH_BOTH_ENCODERS}
DEFAULT_PROFILE = "fast"
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
        resolve_encoder(name or DEFAULT_ENCODER)
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
    if "encoder2" in wanted and not encoder_available(DEFAULT_ENCODER2):
        return WITH_ENCODER  # best's fallback setting reads the LLM's dense channel and MiniLM
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


def resolve(channels: str | None, dense: bool = False, embedfilter_tau: int | None = None, lexical: str | None = None,
            encoder: str | None = None, encoder2: str | None = None, profile: str = DEFAULT_PROFILE) -> tuple[tuple[str, ...], dict, bool]:
    """(channels, build_index options, whether they are the default set) from the command line:
    ``channels`` (``--channels LIST``) and the older per-channel flags, which add their channel
    and set its option (``--lexical tokens``, ``--encoder NAME``, ``--encoder2 NAME``, ``--embedfilter TAU``); the
    flags alone add theirs to the aligned-token channel (as they always did). With neither,
    :func:`default_channels` of ``profile``."""
    flags = {"dense": dense or None, "embedfilter_tau": embedfilter_tau, "lexical": lexical, "encoder": encoder, "encoder2": encoder2}
    named = [s.mode for s in CHANNEL_SPECS if flags.get(s.option) is not None]
    if channels is None and not named:
        chosen, default = default_channels(profile), True
    else:
        listed = parse_channels(channels) if channels is not None else tuple(s.mode for s in CHANNEL_SPECS if s.required)
        chosen, default = tuple(c for c in CHANNELS if c in listed or c in named), False
    return chosen, build_options(chosen, encoder, lexical, embedfilter_tau, encoder2), default


def build_options(channels: tuple[str, ...], encoder: str | None = None, lexical: str | None = None, embedfilter_tau: int | None = None,
                  encoder2: str | None = None) -> dict:
    """Keyword arguments of ``indexer.build.build_index`` for a channel set (the encoder by name):
    ``encoder`` / ``encoder2`` / ``lexical`` / ``embedfilter_tau`` override the defaults of their channel (each
    channel's ``option`` and ``default`` in indexer/channels.py)."""
    given = {"encoder": encoder, "encoder2": encoder2, "lexical": lexical, "embedfilter_tau": embedfilter_tau}
    # the encoders' defaults as this module names them (where a packager, or a test, points them)
    defaults = {"encoder": DEFAULT_ENCODER, "encoder2": DEFAULT_ENCODER2}
    options: dict = {"dense": "dense" in channels}  # build_index's dense is a bool, False where not built
    for s in CHANNEL_SPECS:
        if s.option is not None and s.mode in channels:
            options[s.option] = given.get(s.option) or defaults.get(s.option) or s.default_setting()
    return options


def describe(channels: tuple[str, ...], options: dict) -> str:
    """One line for the build's output: ``channels: sparse, bm25 (words), encoder (minilm)``."""
    detail = {s.mode: options.get(s.option) for s in CHANNEL_SPECS if s.option is not None}
    return "channels: " + ", ".join(f"{c} ({detail[c]})" if detail.get(c) and detail[c] is not True else c for c in channels)


def needs_llm(channels) -> bool:
    """Whether building ``channels`` (modes) runs the LLM: the aligned tokens, its dense channels."""
    return any(s.build_needs & LLM_BUILD_NEEDS for s in CHANNEL_SPECS if s.mode in channels)
