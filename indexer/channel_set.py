"""Which channels an index holds: the default set, and ``--channels LIST``.

The default set holds every channel the two operating points search (retriever/profiles.py),
so that one index serves both (``--profile fast|best`` at load time, no rebuild):

- with the encoder extra installed (``pip install '.[encoder]'``, which ``make`` does) and
  all-mpnet-base-v2 too (``make`` installs it): aligned tokens + BM25 on words + the MiniLM
  encoder + the mpnet encoder as the second encoder channel. ``fast`` fuses BM25, MiniLM and the
  query's own tokens in the aligned-token index; ``best`` fuses BM25, mpnet and the query's own
  tokens. Neither reads the LLM's dense channel, so it is not built by default (issue 53: 576 bytes
  a document of a compact index that no profile searched; ``--dense`` or ``--channels`` adds it).
  mpnet reads every document once more at ~1/5 of MiniLM's speed;
- with MiniLM but not mpnet: aligned tokens + the LLM dense channel + BM25 + MiniLM; ``best``
  then adds the LLM's query expansion and its dense channel to ``fast`` (BENCHMARKS.md,
  "Operating points");
- without the encoder extra: aligned tokens + dense + BM25 on words (LOCO 0.522,
  benchmarks/results/contrastive-long/fusion_cv.json), searched as before (no profile applies).

The aligned-token channel ("sparse") is always built: it is the index's core (its postings
name the documents every other channel refers to).
"""
from __future__ import annotations

import importlib.util

from indexer.channels import CHANNEL_SPECS, MODES
from indexer.channels import spec as channel_spec

CHANNELS = MODES  # every channel, in the table's order (indexer/channels.py)
DEFAULT_ENCODER = channel_spec("encoder").default
DEFAULT_ENCODER2 = channel_spec("encoder2").default
DEFAULT_ANALYZER = channel_spec("bm25").default
WITH_BOTH_ENCODERS = ("sparse", "bm25", "encoder", "encoder2")
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


def default_channels() -> tuple[str, ...]:
    """The channels ``build-index`` builds when none are named (see the module docstring)."""
    if not encoder_available():
        return WITHOUT_ENCODER
    return WITH_BOTH_ENCODERS if encoder_available(DEFAULT_ENCODER2) else WITH_ENCODER


def parse_channels(text: str) -> tuple[str, ...]:
    """``"sparse,bm25,encoder"`` as a tuple in :data:`CHANNELS` order, sparse always included;
    ValueError naming the unknown channel otherwise."""
    names = [c.strip() for c in text.split(",") if c.strip()]
    unknown = [c for c in names if c not in CHANNELS]
    if unknown or not names:
        problem = f"unknown channel {unknown[0]!r}" if unknown else "no channel named"
        raise ValueError(f"--channels {text!r}: {problem} (choose from {', '.join(CHANNELS)})")
    return tuple(s.mode for s in CHANNEL_SPECS if s.mode in names or s.required)


def resolve(channels: str | None, dense: bool = False, embedfilter_tau: int | None = None, lexical: str | None = None,
            encoder: str | None = None, encoder2: str | None = None) -> tuple[tuple[str, ...], dict, bool]:
    """(channels, build_index options, whether they are the default set) from the command line:
    ``channels`` (``--channels LIST``) and the older per-channel flags, which add their channel
    and set its option (``--lexical tokens``, ``--encoder NAME``, ``--encoder2 NAME``, ``--embedfilter TAU``). With
    neither, :func:`default_channels`."""
    flags = {"dense": dense or None, "embedfilter_tau": embedfilter_tau, "lexical": lexical, "encoder": encoder, "encoder2": encoder2}
    named = [s.mode for s in CHANNEL_SPECS if flags.get(s.option) is not None]
    if channels is None and not named:
        chosen, default = default_channels(), True
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
