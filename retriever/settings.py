"""One settings value for a search (issue 69): :class:`SearchSettings`, what the caller asks, and
:func:`resolve_settings`, the one function that turns it and the index into what a
:class:`~retriever.retriever.Retriever` searches with (:class:`ResolvedSettings`), saying why it
chose each value (``search-index --explain-settings`` and ``/info`` show it).

Every choice a search makes from the index and the caller is made here, in this order:

- the profile (retriever/profiles.py, one table with the build profiles: indexer/profile_table.py):
  "auto" (the default) is the first profile whose channels the index holds whole, else none; a
  profile named is fitted to the index (its fallback where it lacks the profile's channels);
  None: no profile;
- the query encoder: "none" where no channel of the index reads the LLM's query state; else the
  caller's; else the profile's; else "auto" (a distilled student beside the adapter, else the LLM);
- the fusion: the caller's; else the profile's, calibrated on the index's corpus where its
  manifest records a calibration of the profile's pair, else its fixed setting; else the default
  for the index's channels (retriever/fusion.py ``default_fusion``);
- feedback, sparse pruning and the backend: the caller's, else none (exact, numba).
"""
from __future__ import annotations

import dataclasses
import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from indexer.channels import CHANNEL_SPECS, LLM_STATE
from indexer.manifest import MANIFEST, IndexFormatError, Manifest
from retriever.feedback import Feedback
from retriever.fusion import Fusion, default_fusion
from retriever.profiles import Profile, auto_profile, fit_profile, get_profile, profile_fusion
from retriever.pruning import SparsePruning
from retriever.query import DEFAULT_EXPANSION_M
from retriever.query_cache import DEFAULT_QUERY_CACHE_SIZE
from retriever.query_encoding import DEFAULT_QUERY_WEIGHTING

if TYPE_CHECKING:
    from embedder.query_encoder import DistilledQueryEncoder


@dataclass(frozen=True)
class SearchSettings:
    """How to search an index, as the caller asks: None (and "auto") leave the choice to
    :func:`resolve_settings`. ``Retriever.load(path, settings, **overrides)`` and ``Retriever(...)``
    take one; an override is any field by name (``profile="best"``), a typo a TypeError."""

    profile: str | Profile | None = "auto"  # "fast", "best", "auto" (the index's), None (no profile)
    # what encodes queries for the LLM's channels: "auto", "llm", "distilled", "none", a student's directory or a loaded one
    query_encoder: str | os.PathLike[str] | DistilledQueryEncoder | None = None
    fusion: dict | Fusion | None = None  # the hybrid setting (None: the profile's, else the channels' default)
    feedback: Feedback | None = None  # expand the sparse query from the first pass's documents (retriever/feedback.py)
    sparse_pruning: SparsePruning | str | tuple | None = None  # the aligned tokens searched pruned (retriever/pruning.py)
    backend: str = "numba"  # who answers the channels: "numba", "lucene", "milvus" (retriever/backends)
    lucene_index: str | os.PathLike[str] | None = None  # backend "lucene": the Pyserini export
    milvus_uri: str | os.PathLike[str] | None = None  # backend "milvus": a Milvus Lite file or a server address
    milvus_collection: str | None = None
    milvus_search_params: dict | None = field(default=None, hash=False)
    expansion_m: int = DEFAULT_EXPANSION_M  # aligned tokens added to each query
    literal: str = "both"  # the query's own tokens: "space", "bare" or "both"
    query_weighting: str = DEFAULT_QUERY_WEIGHTING  # "idf" or "one"
    query_cache_size: int = DEFAULT_QUERY_CACHE_SIZE  # encoded queries kept (LRU; 0: none)
    mmap: bool = True  # postings memory-mapped
    device: str | None = None  # where queries are encoded (None: chosen for this machine)
    dtype: str = "auto"  # the query encoder's precision (embedder/hardware.py)
    runtime: str = "auto"  # the query encoder's runtime (embedder/hardware.py)

    def with_overrides(self, **overrides: Any) -> SearchSettings:
        """These settings with ``overrides`` (fields by name); TypeError naming the fields for another name."""
        unknown = sorted(set(overrides) - {f.name for f in dataclasses.fields(self)})
        if unknown:
            raise TypeError(f"unknown search setting(s) {', '.join(unknown)} (SearchSettings: {', '.join(f.name for f in dataclasses.fields(self))})")
        return dataclasses.replace(self, **overrides) if overrides else self

    def backend_options(self) -> dict[str, Any]:
        """What ``open_backend`` takes beside the backend's name."""
        return {"lucene_index": self.lucene_index, "milvus_uri": self.milvus_uri, "milvus_collection": self.milvus_collection,
                "milvus_search_params": self.milvus_search_params}


@dataclass(frozen=True)
class ResolvedSettings:
    """:class:`SearchSettings` as they apply to one index: every value chosen, and why (:attr:`why`)."""

    asked: SearchSettings
    profile: Profile | None
    query_encoder: str | os.PathLike[str] | DistilledQueryEncoder
    fusion: Fusion
    feedback: Feedback | None
    sparse_pruning: SparsePruning | None
    why: Mapping[str, str] = field(hash=False)
    warnings: tuple[str, ...] = ()  # what the caller should hear (a profile whose channels the index lacks)

    def explain(self) -> dict[str, dict[str, Any]]:
        """{setting: {"value", "why"}} of each choice, JSON-ready (``/info``'s ``settings``)."""
        values = {"profile": self.profile.name if self.profile is not None else None, "query_encoder": _name(self.query_encoder),
                  "fusion": self.fusion.as_dict(), "feedback": self.feedback.to_dict() if self.feedback is not None else None,
                  "sparse_pruning": self.sparse_pruning.to_dict() if self.sparse_pruning is not None else None,
                  "backend": self.asked.backend}
        return {k: {"value": v, "why": self.why[k]} for k, v in values.items()}

    def lines(self) -> list[str]:
        """:meth:`explain` as lines of text (``search-index --explain-settings``)."""
        return [f"{k}: {e['value']!r} - {e['why']}" for k, e in self.explain().items()]


def _name(query_encoder: Any) -> str:
    return query_encoder if isinstance(query_encoder, str) else getattr(query_encoder, "name", None) or str(query_encoder)


def resolve_settings(settings: SearchSettings | None, manifest: Manifest, channels: Iterable[str], index_dir: str | os.PathLike[str] = "",
                     fusion: dict | Fusion | None = None) -> ResolvedSettings:
    """The one place a search's settings are chosen (the module docstring's rules): ``settings`` as
    asked, for the index of ``manifest`` whose opened channels are ``channels`` (modes).
    ``fusion``: another fusion than the settings' (``Retriever.with_fusion``). ValueError for a
    profile, fusion or pruning that is not one; IndexFormatError for a damaged calibration record."""
    asked = settings if settings is not None else SearchSettings()
    held = list(channels)
    why: dict[str, str] = {}
    warnings: list[str] = []
    profile: Profile | None = None
    if asked.profile == "auto":
        name = auto_profile(held)
        profile = get_profile(name) if name is not None else None
        why["profile"] = (f"auto: {name}, the first profile whose channels ({', '.join(profile.channels)}) the index holds" if profile is not None
                          else "auto: none, the index holds no profile's channels whole (searched as it was built to be)")
    elif asked.profile is None:
        why["profile"] = "none asked"
    else:
        wanted = get_profile(asked.profile)
        profile = fit_profile(wanted, held)
        lacking = sorted(set(wanted.channels) - set(held))
        why["profile"] = "asked" if profile is wanted else f"asked; the index lacks {', '.join(lacking)}: its fallback ({profile.summary})"
        if lacking:
            still = sorted(set(profile.channels) - set(held))
            searched = "" if profile is wanted else (f"; searching its fallback ({profile.summary})" + (f", without {', '.join(still)}" if still else ""))
            warnings.append(f"{index_dir}: profile {wanted.name!r} weighs channel(s) {', '.join(lacking)} this index lacks{searched}; "
                            f"build-index --profile {wanted.name} (or both) builds them")
    if not any(s.record(manifest) is not None for s in CHANNEL_SPECS if LLM_STATE in s.query_needs):
        # no channel of the index reads the LLM's query state (BM25, the sentence encoders): no model encodes queries
        query_encoder, why["query_encoder"] = "none", "no channel of the index reads the LLM's query state: no model encodes queries"
    elif asked.query_encoder is not None:
        query_encoder, why["query_encoder"] = asked.query_encoder, "asked"
    elif profile is not None:
        query_encoder, why["query_encoder"] = profile.query_encoder, f"the {profile.name} profile's"
    else:
        query_encoder, why["query_encoder"] = "auto", "no profile: a distilled student beside the adapter where one exists, else the LLM"
    fusion = asked.fusion if fusion is None else fusion
    if fusion is not None:
        chosen, why["fusion"] = Fusion.of(fusion), "given by the caller"
    elif profile is not None:
        setting, why["fusion"] = profile_fusion(profile, manifest.calibration)
        try:
            chosen = Fusion.of(setting)
        except ValueError as exc:  # a calibration record damaged by hand: say where, rather than fail later
            raise IndexFormatError(f"{Path(index_dir) / MANIFEST}: field 'calibration': {exc}") from None
    else:
        chosen = default_fusion([s.mode for s in CHANNEL_SPECS if s.record(manifest) is not None])
        why["fusion"] = "the default for the index's channels (no profile)"
    if asked.feedback is not None and not isinstance(asked.feedback, Feedback):
        raise TypeError(f"feedback must be a retriever.feedback.Feedback or None, got {type(asked.feedback).__name__}")
    why["feedback"] = "asked" if asked.feedback is not None else "none asked"
    pruning = _pruning(asked.sparse_pruning)
    why["sparse_pruning"] = "asked" if pruning is not None else "none asked: exact"
    why["backend"] = "asked" if asked.backend != "numba" else "the default: this index's own files"
    return ResolvedSettings(asked, profile, query_encoder, chosen, asked.feedback, pruning, why, tuple(warnings))


def _pruning(setting: object) -> SparsePruning | None:
    """``sparse_pruning`` as a SparsePruning (a "KEEP,DEPTH" string or a (keep, depth) pair is read as one), or None."""
    if setting is None or isinstance(setting, SparsePruning):
        return setting
    if isinstance(setting, str):
        return SparsePruning.parse(setting)
    if isinstance(setting, (tuple, list)) and len(setting) == 2:
        return SparsePruning(*setting)
    raise TypeError(f"sparse_pruning must be a retriever.pruning.SparsePruning, 'KEEP,DEPTH' or (keep, depth), got {setting!r}")


__all__ = ["ResolvedSettings", "SearchSettings", "resolve_settings"]
