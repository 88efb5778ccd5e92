"""``Retriever``: the Python entry point. Load an index, search it with text queries.

Modes: each channel of the index (a row of indexer/channels.py), searched alone, and "hybrid",
their fusion. The Retriever is a facade over pieces, each a module of its own: retriever/settings.py
(:class:`SearchSettings` and the one function that resolves them), query_encoding.py (who encodes
queries), channel_search.py (each channel's search), fusion.py and hybrid.py (the fused search),
explain.py (what matched), filters.py (metadata filters), contract.py (argument checks). Here:
opening the index and the models, modes, pages, and the views with another fusion.
"""
from __future__ import annotations

import copy
import dataclasses
import logging
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from embedder.encoder import Embedder
from embedder.tokenization import TokenizerOnly
from indexer import channels as channel_table
from indexer.channels import CHANNEL_SPECS, ENCODER_EMBEDDING, LLM_STATE, encoders_by_mode, spec
from indexer.inverted_index import InvertedIndex
from indexer.lexical import make_analyzer
from indexer.manifest import Manifest
from indexer.reader import OpenedIndex, open_index
from retriever.backends import Backend, open_backend
from retriever.channel_search import ChannelSearch
from retriever.contract import Delegate, check_k, check_queries, utf8_safe
from retriever.explain import HitExplainer
from retriever.feedback import Feedback, FeedbackExpander
from retriever.filters import MetadataFilters, stored_metadata
from retriever.fusion import DEFAULT_FUSION, DEFAULT_FUSION_WITH_ENCODER, Fusion
from retriever.hit import Hit
from retriever.hybrid import FUSION_DEPTH, HybridSearch
from retriever.query import EncodedQuery
from retriever.query_encoding import (
    DEFAULT_QUERY_WEIGHTING,
    QUERY_WEIGHTINGS,
    QueryEncoding,
    check_query_weighting,
    load_query_embedder,
    sentence_models,
)
from retriever.settings import ResolvedSettings, SearchSettings, resolve_settings

if TYPE_CHECKING:  # typing.Self is 3.11+; annotations are not evaluated at run time (__future__)
    from typing_extensions import Self


log = logging.getLogger(__name__)
# every channel of the table (indexer/channels.py), in its order, then their fusion
MODES: tuple[str, ...] = channel_table.MODES + ("hybrid",)
# channels whose queries the backbone LLM (or its distilled student) encodes: those that need its query state
LLM_MODES: tuple[str, ...] = tuple(s.mode for s in channel_table.with_need(LLM_STATE))
# channels whose query is the LLM state alone: a model-free query (query_encoder "none") cannot search them
MODEL_ONLY_MODES: tuple[str, ...] = tuple(s.mode for s in CHANNEL_SPECS if s.query_needs == {LLM_STATE})
_QUERY_NEEDS: dict[str, frozenset[str]] = {s.mode: s.query_needs for s in CHANNEL_SPECS}

__all__ = [
    "DEFAULT_FUSION", "DEFAULT_FUSION_WITH_ENCODER", "DEFAULT_QUERY_WEIGHTING", "FUSION_DEPTH", "LLM_MODES", "MODEL_ONLY_MODES", "MODES",
    "QUERY_WEIGHTINGS", "Hit", "Retriever", "SearchSettings", "check_k", "check_queries",
]


def _no_aligned_tokens():
    raise ValueError("this index holds no aligned tokens (built without the sparse channel): nothing to feed back")


class Retriever:
    """Searches an index built by ``build-index``: ``Retriever.load("my-index").search("how do parrots get sick?", k=5)``.
    Each channel of the index is held under its row's ``attribute`` (indexer/channels.py: ``sparse``,
    ``dense``, ``lexical``...; None where not built); :attr:`settings` says what it searches with, and why."""

    sparse: InvertedIndex | None  # the aligned-token channel; lexical: BM25 (mode "bm25"); ... (None: not built)

    def __init__(self, index_dir: str | os.PathLike[str], manifest: Manifest, embedder: Embedder | TokenizerOnly,
                 settings: SearchSettings | None = None, *, encoders: Mapping[str, Any] | None = None, opened: OpenedIndex | None = None,
                 **overrides: Any) -> None:
        """Over an index whose ``manifest`` is read and ``embedder`` loaded (:meth:`load` does both).
        ``settings`` (:class:`SearchSettings`, fields overridden by name: ``profile="best"``) are
        resolved against the index once (:attr:`settings`). ``encoders``: the encoder channels'
        sentence models by channel, if loaded (else the manifest's, each loaded when the hybrid
        weighs it or on its channel's first query); other ones are refused. ``opened``: the index
        opened and checked (indexer/reader.py: its generation held until :meth:`close`)."""
        asked = (settings or SearchSettings()).with_overrides(**overrides)
        check_query_weighting(asked.query_weighting)
        opened = opened if opened is not None else open_index(index_dir, mmap=asked.mmap)
        channels = opened.channels
        self.index_dir, self.manifest, self.embedder, self.generation = Path(index_dir), manifest, embedder, opened.generation
        self.settings: ResolvedSettings = resolve_settings(asked, manifest, channels, index_dir)
        self.profile = self.settings.profile
        self.doc_ids: list[str] = opened.doc_ids  # every channel is checked against the manifest on opening
        for s in CHANNEL_SPECS:  # None where the index was built without it
            setattr(self, s.attribute, channels.get(s.mode))
        self.backend = asked.backend  # its name, as recorded in benchmark results
        self.sparse_pruning = self.settings.sparse_pruning
        self.engine: Backend = open_backend(asked.backend, self.index_dir, manifest, channels, sparse_pruning=self.sparse_pruning,
                                            **asked.backend_options())
        if self.sparse is not None:  # smoothed IDF of each token among the documents' aligned tokens
            df = np.diff(np.asarray(self.sparse.indptr))
            self.token_idf = np.log((manifest.n_docs + 1) / (df + 1)).astype(np.float32)
        else:  # no aligned tokens: no query weighs its tokens by them
            self.token_idf = np.ones(int(embedder.vocab_size), np.float32)
        lexical = manifest.record("bm25")
        analyze = make_analyzer(lexical["analyzer"], embedder.tokenizer) if lexical else None
        given, deferred = sentence_models(manifest, encoders_by_mode(None, encoders), self.fusion, getattr(embedder, "device", None))
        # the pieces; a fusion view (with_fusion) shares them all, and with them what each builds on first use
        self.queries = QueryEncoding(embedder, self.settings.query_encoder, self.token_idf, given, deferred, asked.expansion_m, asked.literal,
                                     asked.query_weighting, asked.query_cache_size)
        held = {s.mode: getattr(self, s.attribute) for s in CHANNEL_SPECS if getattr(self, s.attribute) is not None}
        self.channel_search = ChannelSearch(self.engine, held, analyze, len(self.doc_ids))
        doc_vectors = self.sparse.doc_vectors if self.sparse is not None else _no_aligned_tokens
        self.hybrid = HybridSearch(self.channel_search, FeedbackExpander(doc_vectors, self.queries.expansion_weights))
        self.explanations = HitExplainer(embedder.tokenizer, self.channel_search, self.doc_ids)
        held_path = self.generation.path if self.generation is not None else self.index_dir
        self.filters = MetadataFilters((manifest.documents or {}).get("metadata_fields", []), lambda: stored_metadata(held_path, manifest),
                                       (manifest.documents or {}).get("metadata_types"))
        self.feedback = self.settings.feedback
        self._holds_generation = True  # False in a fusion view: the Retriever it was made from holds it
        self._check_query_side()

    # ------------------------------------------------------------------ the pieces' state, delegated (read-only but expansion_m)
    model_free = Delegate("queries.model_free", 'No model encodes queries (query_encoder "none"): the sparse channel reads their own tokens.')
    query_encoder = Delegate("queries.name", 'What encodes queries for the LLM channels: "llm", "distilled:NAME" or "none".')
    student = Delegate("queries.student", "The distilled query encoder (None: the LLM, or no model, encodes queries).")
    student_encoder = Delegate("queries.student_encoder", "The sentence encoder the distilled student reads (None without a student).")
    student_head = Delegate("queries.student_head", "The LM head that expands distilled query states, made on first use.")
    query_cache = Delegate("queries.cache", "Encoded queries kept (LRU), shared with this Retriever's fusion views.")
    expansion_m = Delegate("queries.expansion_m", "Aligned tokens added to each query (settable: cached queries keep theirs).", settable=True)
    literal = Delegate("queries.literal", 'Which forms of the query\'s own tokens it holds: "space", "bare" or "both".')
    query_weighting = Delegate("queries.query_weighting", 'How query tokens weigh: "idf" or "one".')
    explainer = Delegate("explanations.words", "Spells matched tokens as words (built on first use).")
    document_tokens = Delegate("hybrid.expander.document_tokens", "The index's aligned tokens, document by document (feedback; built on first use).")
    metadata = Delegate("filters.metadata", "Each document's stored metadata (None where it has none), by doc number (read on first use).")

    @property
    def sentence_encoders(self) -> dict[str, Any]:
        """The sentence models of the index's encoder channels loaded so far, by mode (one the hybrid
        does not weigh is loaded on its first query); :attr:`encoder`: the ``encoder`` channel's."""
        return dict(self.queries.encoders)

    @property
    def encoder(self) -> Any:
        return self.queries.encoders.get("encoder")

    def filter_mask(self, where: dict | None) -> np.ndarray | None:
        """The documents a metadata filter lets through (None: no filter); ValueError for a bad one."""
        return self.filters.mask(where)

    # ------------------------------------------------------------------ fusion
    @property
    def fusion(self) -> Fusion:
        """The hybrid setting (:class:`Fusion`: checked, frozen)."""
        return self.settings.fusion

    @fusion.setter
    def fusion(self, setting: dict | Fusion) -> None:
        """Assigning one checks it as the constructor does (a bad one is a ValueError)."""
        fusion = Fusion.of(setting)
        self.settings = dataclasses.replace(self.settings, fusion=fusion, why={**self.settings.why, "fusion": "given by the caller"})

    def with_fusion(self, fusion: dict | Fusion | None) -> Retriever:
        """A view of this Retriever searching "hybrid" with another ``fusion``, checked as the
        constructor checks one (None: the profile's, else the channels' default). It shares all
        else, nothing reloaded or copied, and holds no generation (its :meth:`close` does nothing)."""
        other = copy.copy(self)  # a shallow copy: the same pieces, channels, models and caches
        other.settings = self._resolve(fusion)
        other._check_query_side()
        other._holds_generation = False
        return other

    def _resolve(self, fusion: dict | Fusion | None) -> ResolvedSettings:
        """This Retriever's settings resolved again with ``fusion`` in place of the asked one."""
        held = [s.mode for s in CHANNEL_SPECS if getattr(self, s.attribute) is not None]
        return resolve_settings(dataclasses.replace(self.settings.asked, fusion=fusion), self.manifest, held, self.index_dir)

    @property
    def fusion_source(self) -> str:
        """Why the hybrid fuses as it does: given by the caller, calibrated on this corpus when
        the index was built (its profile's pair), the profile's fixed setting, or the default."""
        unasked = self._resolve(None)
        return unasked.why["fusion"] if unasked.fusion == self.fusion else "given by the caller"

    def _check_query_side(self) -> None:
        """Refuse now what a search would fail on: a weighed channel a model-free query cannot search, feedback where Milvus fuses."""
        if self.feedback is not None and not isinstance(self.feedback, Feedback):
            raise TypeError(f"feedback must be a retriever.feedback.Feedback or None, got {type(self.feedback).__name__}")
        fusion = self.fusion
        if self.model_free:
            weighed = [s.mode for s in map(spec, MODEL_ONLY_MODES) if fusion.weight(s.mode) > 0 and getattr(self, s.attribute) is not None]
            if weighed:
                raise ValueError(
                    f"query_encoder 'none' gives the {' and '.join(weighed)} channel no query, and the hybrid weighs it "
                    f"({', '.join(f'{c} {fusion.weight(c):g}' for c in weighed)}): give it weight 0 (fusion) or use another query encoder"
                )
        if self.feedback is not None and fusion.in_engine:
            raise ValueError(f"feedback: the fusion method {fusion.method!r} fuses inside Milvus, which takes no feedback")

    def with_feedback(self, q: EncodedQuery, first_pass: dict[str, tuple[np.ndarray, np.ndarray]]) -> EncodedQuery:
        """``q``'s sparse side expanded from the top :attr:`feedback` documents of ``first_pass`` ({channel: (docs, scores)})."""
        if self.feedback is None:
            raise ValueError("with_feedback: this Retriever has no feedback setting")
        return self.hybrid.with_feedback(q, first_pass, self.fusion, self.feedback)

    # ------------------------------------------------------------------ opening
    @classmethod
    def load(cls, index_dir: str | os.PathLike[str], settings: SearchSettings | None = None, *, model: str | None = None,
             embedder: Embedder | TokenizerOnly | None = None, encoders: Mapping[str, Any] | None = None, verify: bool = False,
             warm: bool = True, **overrides: Any) -> Retriever:
        """Open an index and load the embedder its manifest names (or check the given one).
        ``settings``: :class:`SearchSettings`, fields overridden by name (``profile="best"``; an
        unknown name is a TypeError); by default the profile the index was built for, its fusion as
        calibrated on its corpus. Query encoder "none" loads the LLM's tokenizer alone. ``model``:
        must be the index's model (name or path). ``embedder``/``encoders``: models already loaded
        (checked). Files are checked for size and channels for structure; ``verify``: every
        checksum too. Damage raises IndexFormatError naming the file. ``warm``: :meth:`warm_up`."""
        asked = (settings or SearchSettings()).with_overrides(**overrides)
        index_dir = Path(index_dir)
        # one generation of the index, held while this Retriever lives (indexer/reader.py), every
        # file opened and checked before spending seconds on the model
        opened = open_index(index_dir, verify=verify, mmap=asked.mmap)
        try:
            manifest = opened.manifest
            resolved = resolve_settings(asked, manifest, opened.channels, index_dir)
            for warning in resolved.warnings:
                log.warning("%s", warning)
            if embedder is None:
                embedder = load_query_embedder(index_dir, manifest, model, resolved.query_encoder, asked)
            manifest.check_model(embedder.identity, embedder.adapter)
            retriever = cls(index_dir, manifest, embedder, asked, encoders=encoders, opened=opened)
            if warm:
                retriever.warm_up()
            return retriever
        except BaseException:
            opened.close()
            raise

    def close(self) -> None:
        """Let go of the index generation held (a build may then remove it once replaced); what is mapped still searches."""
        if self.generation is not None and self._holds_generation:
            self.generation.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def warm_up(self) -> None:
        """Pay every first-call cost now (runtime compilation, Numba, FAISS, vocabulary spellings); an
        encoder channel the hybrid does not weigh keeps its model unloaded until its first query."""
        query = "warm up the encoder"
        for mode in self.modes:
            # hybrid is its channels plus NumPy fusion: nothing of its own to warm
            if mode != "hybrid" and mode not in self.queries.deferred_modes:
                self.search(query, k=1, mode=mode)
        if self.embedder is not None:
            self.embedder.token_strings([0])
            self.explainer.piece(0)
        if self.feedback is not None:
            self.document_tokens  # noqa: B018 - built here, not in the first query

    # ------------------------------------------------------------------ modes
    @property
    def modes(self) -> list[str]:
        """The modes this index supports."""
        # a channel the index holds, unless its query is the LLM state alone and no model encodes queries
        have = {s.mode for s in CHANNEL_SPECS if getattr(self, s.attribute) is not None and not (self.model_free and s.mode in MODEL_ONLY_MODES)}
        return [m for m in MODES if m == "hybrid" or m in have]

    @property
    def default_mode(self) -> str:
        """A search's mode without one: "hybrid" where the index holds two or more of the fusion's
        channels; else its one channel (fusing one would only rescale its scores)."""
        fused = self.channels_of("hybrid")
        return "hybrid" if len(fused) >= 2 else (fused[0] if fused else next(m for m in self.modes if m != "hybrid"))

    def describe_mode(self, mode: str | None = None) -> str:
        """One line saying which mode (and for hybrid, which channels and weights) a search uses."""
        mode = mode or self.default_mode
        if mode != "hybrid":
            why = "" if len(self.modes) > 2 or mode != self.default_mode else " (the index has no other channel to fuse)"
            return f"mode {mode}{why}"
        weights = self.fusion["weights"]
        parts = ", ".join(f"{c} {weights[c]:g}" for c in self.channels_of("hybrid"))
        fb = self.feedback
        more = f"; sparse query fed back from the first {fb.docs} documents ({fb.tokens} tokens x {fb.weight:g})" if fb is not None else ""
        point = f"profile {self.profile.name}, " if self.profile is not None else ""
        return f"{point}mode hybrid: {self.fusion.get('method', 'minmax')}({parts}), queries encoded by {self.query_encoder}{more}"

    # ------------------------------------------------------------------ search
    def channels_of(self, mode: str | None = None) -> list[str]:
        """The channels a search in ``mode`` reads: hybrid's are those of the index with a
        positive fusion weight; ``None``: every channel of the index."""
        held = [m for m in self.modes if m != "hybrid"]
        if mode is None:
            return held
        if mode == "hybrid":
            return self.fusion.channels(held)
        return [mode]

    def encode(self, queries: Sequence[str], mode: str | None = None) -> list[EncodedQuery]:
        """Encode queries once (to time search alone, or reuse across modes): only what ``mode``'s
        channels need (their rows' query needs: a bm25 + encoder hybrid never runs the LLM); None:
        what every channel of the index needs. Kept in :attr:`query_cache`."""
        channels = self.channels_of(mode)
        wanted = {need for c in channels for need in _QUERY_NEEDS.get(c, ())}  # the query needs of its channels
        return self.queries.encode(queries, llm=LLM_STATE in wanted, encoders=[c for c in channels if ENCODER_EMBEDDING in _QUERY_NEEDS.get(c, ())])

    def encode_states(self, queries: Sequence[str], h: np.ndarray, name: str) -> list[EncodedQuery]:
        """Queries whose pooled states ``h`` (n, d) were computed elsewhere (``name``: what produced
        them), built as a distilled query is; for studies of what a query state is worth; not cached."""
        return self.queries.encode_states(queries, h, name)

    def search(self, query: str, k: int = 10, mode: str | None = None, where: dict | None = None) -> list[Hit]:
        """Top-k hits for one query, best first. The contract (also :meth:`batch_search`'s and
        ``search-index``'s): ``query`` a str (TypeError), a blank one has no hits; ``k`` a positive
        int and ``mode`` one of :attr:`modes` (ValueError; default :attr:`default_mode`); ``where``
        a metadata filter (retriever/filters.py: ``{"year": {"gte": 2000}}``), a bad one a ValueError."""
        if not isinstance(query, str):
            raise TypeError(f"query must be a str, got {type(query).__name__}")
        return self.batch_search([query], k=k, mode=mode, where=where)[0]

    def batch_search(self, queries: Sequence[str], k: int = 10, mode: str | None = None, where: dict | None = None) -> list[list[Hit]]:
        """Top-k hits for each query (see :meth:`search` for the contract)."""
        queries = check_queries(queries)
        k = check_k(k)
        mode = self.default_mode if mode is None else mode
        self._check_mode(mode)
        self.filter_mask(where)  # a bad filter before seconds of encoding
        asked = [i for i, q in enumerate(queries) if q.strip()]  # a blank query matches nothing
        texts = [utf8_safe(queries[i]) for i in asked]
        if not texts:
            return [[] for _ in queries]
        encoded = self.encode(texts, mode)
        results: list[list[Hit]] = [[] for _ in queries]
        for i, hits in zip(asked, self.search_encoded(encoded, k=k, mode=mode, where=where)):
            results[i] = hits
        return results

    def search_encoded(
        self, encoded: Sequence[EncodedQuery], k: int = 10, mode: str | None = None, explain: bool = True, where: dict | None = None,
        offset: int = 0,
    ) -> list[list[Hit]]:
        """Search queries encoded for ``mode`` (:meth:`encode`). ``explain=False``: no matched tokens
        (costlier than the search). ``offset``: ranks ``offset + 1 .. k`` only (a page)."""
        if not isinstance(offset, int) or isinstance(offset, bool) or offset < 0:
            raise ValueError(f"offset must be an integer >= 0, not {offset!r}")
        k = check_k(k)
        mode = self.default_mode if mode is None else mode
        self._check_mode(mode)
        mask = self.filter_mask(where)
        # no channel needs more than every document: FAISS would allocate k slots per query
        k = min(k, len(self.doc_ids))
        results = [self._search_one(q, mode, k, mask, offset, explain) if q.text.strip() else [] for q in encoded]
        for q, hits in zip(encoded, results):
            for hit in hits:
                hit.query_encoder = q.query_encoder
        return results

    def _search_one(self, q: EncodedQuery, mode: str, k: int, mask: np.ndarray | None, offset: int, explain: bool) -> list[Hit]:
        """One encoded query's hits of ranks ``offset + 1 .. k`` in ``mode``."""
        if mode != "hybrid":
            docs, scores = self.channel_search.search(q, mode, k, mask)
            return [self.explanations.hit(q, mode, int(d), s, explain) for d, s in zip(docs[offset:], scores[offset:]) if d >= 0]
        used = self.channels_of("hybrid")  # channels the index lacks are skipped
        if not used:
            raise ValueError(f"{self.index_dir}: none of the fusion's channels {sorted(self.fusion.weights)} is in this index (modes {self.modes})")
        if self.fusion.in_engine:
            if mask is not None:
                raise ValueError(f"metadata filters are not supported with the {self.fusion.method} fusion (fused inside Milvus)")
            if not hasattr(self.engine, "hybrid"):
                raise ValueError(f"fusion method {self.fusion.method!r} needs backend='milvus', not {self.backend!r}")
        q, fused = self.hybrid.search(q, self.fusion, used, k, mask, self.feedback)
        return [self.explanations.hit(q, "hybrid", f.doc, f.score, explain, used, f.contributions) for f in fused[offset:]]

    def _check_mode(self, mode: str) -> None:
        if mode not in MODES:
            raise ValueError(f"mode must be one of {MODES}, not {mode!r}")
        if mode not in self.modes:
            row = spec(mode)
            if self.model_free and getattr(self, row.attribute) is not None:  # held, but its query is the LLM state alone
                raise ValueError(
                    f"mode {mode!r}: query_encoder 'none' gives queries no embedding to search it with; use another query encoder "
                    "(query_encoder 'llm' or 'auto')"
                )
            raise ValueError(f"{self.index_dir}: mode {mode!r} needs an index built with {row.flag}")

    def search_channel(self, q: EncodedQuery, mode: str, k: int, where: dict | None = None) -> tuple[np.ndarray, np.ndarray]:
        """One channel's top-``k`` doc numbers and scores for an encoded query, best first, -1 padded."""
        if mode == "hybrid":
            raise ValueError("search_channel searches one channel; for hybrid use search_encoded")
        self._check_mode(mode)
        return self.channel_search.search(q, mode, check_k(k), self.filter_mask(where))
