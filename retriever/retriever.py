"""``Retriever``: the Python entry point. Load an index, search it with text queries.

Modes (channels of one index directory, rows of indexer/channels.py):
- "sparse": aligned tokens (text-is-worth-several-tokens Eq. 15-16), Numba inverted index;
- "dense": cosine over the pooled embeddings (FAISS; needs ``--dense``);
- "dense-ef": cosine over EmbedFilter-projected embeddings (needs ``--embedfilter TAU``);
- "bm25": the lexical channel, BM25 on this engine's own index (needs ``--lexical``);
- "encoder": cosine over an external sentence-transformers encoder's embeddings (needs ``--encoder``);
- "hybrid": fusion of the channels present (see retriever/fusion.py).

The Retriever is a facade over a few pieces, each a module of its own:
- :class:`~retriever.query_encoding.QueryEncoding`: who encodes queries (the LLM, its distilled
  student, or no model), the IDF weighting and the query cache;
- :class:`~retriever.channel_search.ChannelSearch`: each channel's search, as its table row says;
- :class:`~retriever.fusion.Fusion` and :class:`~retriever.hybrid.HybridSearch`: the hybrid
  setting and the fused search (with feedback, retriever/feedback.py);
- :class:`~retriever.explain.HitExplainer`: what matched, as words;
- :class:`~retriever.filters.MetadataFilters`: metadata filters and their masks.
Here: opening the index and the models, the search contract (argument checks, modes, pages) and
the views with another fusion.
"""
from __future__ import annotations

import copy
import functools
import logging
import os
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from embedder.encoder import Embedder, EmbedderConfig
from embedder.tokenization import TokenizerOnly
from indexer import channels as channel_table
from indexer.channels import CHANNEL_SPECS, ENCODER_EMBEDDING, LLM_STATE, sentence_encoder_specs, spec
from indexer.generations import Generation
from indexer.inverted_index import InvertedIndex
from indexer.lexical import BM25Index, make_analyzer
from indexer.manifest import MANIFEST, IndexFormatError, Manifest
from indexer.reader import OpenedIndex, open_index
from indexer.stored_documents import StoredDocuments
from retriever.backends import Backend, open_backend
from retriever.channel_search import ChannelSearch
from retriever.explain import HitExplainer, TokenExplainer
from retriever.feedback import DocumentTokens, Feedback, FeedbackExpander
from retriever.filters import MetadataFilters
from retriever.fusion import DEFAULT_FUSION, DEFAULT_FUSION_WITH_ENCODER, Fusion, default_fusion
from retriever.hit import Hit
from retriever.hybrid import FUSION_DEPTH, HybridSearch
from retriever.profiles import Profile, auto_profile, fit_profile, get_profile, profile_fusion
from retriever.pruning import SparsePruning
from retriever.query import DEFAULT_EXPANSION_M, EncodedQuery
from retriever.query_cache import DEFAULT_QUERY_CACHE_SIZE, QueryCache
from retriever.query_encoding import DEFAULT_QUERY_WEIGHTING, QUERY_WEIGHTINGS, QueryEncoding, check_query_weighting

if TYPE_CHECKING:  # typing.Self is 3.11+; annotations are not evaluated at run time (__future__)
    from typing_extensions import Self

    from embedder.query_encoder import DistilledQueryEncoder, LMHead

log = logging.getLogger(__name__)
# every channel of the table (indexer/channels.py), in its order, then their fusion
MODES: tuple[str, ...] = channel_table.MODES + ("hybrid",)
# channels whose queries the backbone LLM (or its distilled student) encodes: those that need its query state
LLM_MODES: tuple[str, ...] = tuple(s.mode for s in channel_table.with_need(LLM_STATE))
# channels whose query is the LLM state alone: a model-free query (query_encoder "none") has nothing
# to search them with (the aligned-token channel still has the query's literal tokens)
MODEL_ONLY_MODES: tuple[str, ...] = tuple(s.mode for s in CHANNEL_SPECS if s.query_needs == {LLM_STATE})
_QUERY_NEEDS: dict[str, frozenset[str]] = {s.mode: s.query_needs for s in CHANNEL_SPECS}

__all__ = [
    "DEFAULT_FUSION", "DEFAULT_FUSION_WITH_ENCODER", "DEFAULT_QUERY_WEIGHTING", "FUSION_DEPTH", "LLM_MODES", "MODEL_ONLY_MODES", "MODES",
    "QUERY_WEIGHTINGS", "Hit", "Retriever", "check_k", "check_queries",
]


def _no_aligned_tokens():
    raise ValueError("this index holds no aligned tokens (built without the sparse channel): nothing to feed back")


class Retriever:
    """Searches an index built by ``build-index``.

    >>> r = Retriever.load("my-index")             # doctest: +SKIP
    >>> r.search("how do parrots get sick?", k=5)  # doctest: +SKIP

    Each channel of the index is held under its row's ``attribute`` (indexer/channels.py), None
    where the index was built without it: ``sparse``, ``dense``, ``dense_ef``, ``lexical`` (BM25),
    ``encoder_index`` (``encoder`` is the sentence model that encodes its queries).
    """

    sparse: InvertedIndex | None  # the aligned-token channel (None: built without it, build-index --channels bm25)
    lexical: BM25Index | None  # BM25 (mode "bm25"), whose query is analysed by its analyser

    def __init__(
        self,
        index_dir: Path,
        manifest: Manifest,
        embedder: Embedder | TokenizerOnly,
        expansion_m: int = DEFAULT_EXPANSION_M,
        literal: str = "both",
        query_weighting: str = DEFAULT_QUERY_WEIGHTING,
        fusion: dict | Fusion | None = None,
        mmap: bool = True,
        backend: str = "numba",
        lucene_index: str | os.PathLike[str] | None = None,
        milvus_uri: str | os.PathLike[str] | None = None,
        milvus_collection: str | None = None,
        milvus_search_params: dict | None = None,
        encoder=None,
        encoder2=None,
        doc_ids: list[str] | None = None,
        channels: dict[str, Any] | None = None,
        generation: Generation | None = None,
        query_encoder: str | os.PathLike[str] | DistilledQueryEncoder | None = None,
        query_cache_size: int = DEFAULT_QUERY_CACHE_SIZE,
        feedback: Feedback | None = None,
        profile: str | Profile | None = None,
        sparse_pruning: SparsePruning | None = None,
    ) -> None:
        """``backend``: who answers the channels (retriever/backends/__init__.py): "numba" (this
        index's own files), "lucene" (sparse search goes to the Pyserini/Lucene impact export at
        ``lucene_index``, ``build-index --export-pyserini``; scores in the same units, integer
        scores / scales, see retriever/backends/lucene.py) or "milvus" (sparse, dense and bm25
        go to the Milvus collection at ``milvus_uri``, a Milvus Lite file or a server address,
        ``build-index --export-milvus``; ``milvus_collection`` when not the export's default
        name, ``milvus_search_params`` for an approximate index, see retriever/backends/milvus.py).
        ``encoder``/``encoder2``: the sentence-transformers encoders of the index's encoder channels
        (embedder/sentence_encoder.py), if already loaded; by default the ones its manifest names
        are loaded. Other ones are refused.
        ``fusion``: the hybrid setting (a dict, checked into a :class:`Fusion`); default
        DEFAULT_FUSION, or DEFAULT_FUSION_WITH_ENCODER for an index with the encoder channel.
        ``doc_ids``, ``channels``: already opened and checked (:meth:`load` does so before
        loading the model); opened here otherwise, from one held generation of the index.
        ``generation``: the generation they were read from (indexer/generations.py), held until
        :meth:`close`.
        ``query_encoder``: what encodes queries for the LLM channels (retriever/query_encoding.py):
        "llm" (the embedder itself), "distilled" (the student kept beside the index's adapter;
        an error where there is none), "auto" (that student where one exists, else the LLM), a
        student's directory, or a loaded :class:`DistilledQueryEncoder`. A student distilled from
        another model or adapter is refused. "none": no model at all, the sparse channel searches
        the query's own tokens (with ``feedback``, also those of the first pass's documents); the
        dense channels then have no query, so a fusion that weighs them is refused.
        ``query_cache_size``: encoded queries kept (LRU, thread-safe; 0: none).
        ``feedback``: in hybrid searches, expand the sparse query from the top documents of the
        other channels (retriever/feedback.py); None: no feedback.
        ``profile``: an operating point (retriever/profiles.py: "fast" or "best"); it gives
        ``query_encoder`` and ``fusion`` where they are not given. None: ``query_encoder`` "llm"
        and the fusion above.
        ``sparse_pruning``: search the aligned-token channel pruned (retriever/pruning.py: a
        :class:`SparsePruning`, numba backend only): faster on large indexes, not exact. None: exact."""
        check_query_weighting(query_weighting)
        if channels is None or doc_ids is None:
            opened = open_index(index_dir, mmap=mmap)
            doc_ids, channels, generation = opened.doc_ids, opened.channels, opened.generation
        self.generation = generation
        self.index_dir = Path(index_dir)
        self.manifest = manifest
        self.embedder = embedder
        self.profile = fit_profile(profile, channels) if profile is not None else None
        if query_encoder is None:
            query_encoder = self.profile.query_encoder if self.profile is not None else "llm"
        self.fusion = self._fusion_setting(fusion)
        # every channel is checked against the manifest on opening, before any array reaches a kernel
        self.doc_ids: list[str] = doc_ids
        # each channel opened under its row's attribute (sparse, dense, dense_ef, lexical, encoder_index);
        # None where the index was built without it (the aligned tokens too: build-index --channels bm25).
        for s in CHANNEL_SPECS:
            setattr(self, s.attribute, channels.get(s.mode))
        self.backend = backend  # its name, as recorded in benchmark results
        self.sparse_pruning = _pruning(sparse_pruning)
        self.engine: Backend = open_backend(
            backend, self.index_dir, manifest, channels, lucene_index=lucene_index, milvus_uri=milvus_uri,
            milvus_collection=milvus_collection, milvus_search_params=milvus_search_params,
            sparse_pruning=self.sparse_pruning,
        )
        if self.sparse is not None:
            df = np.diff(np.asarray(self.sparse.indptr))
            # smoothed IDF of each token among the documents' aligned tokens
            self.token_idf = np.log((manifest.n_docs + 1) / (df + 1)).astype(np.float32)
        else:  # no aligned tokens: no query weighs its tokens by them
            self.token_idf = np.ones(int(embedder.vocab_size), np.float32)
        analyze = make_analyzer(manifest.lexical["analyzer"], embedder.tokenizer) if manifest.lexical else None
        given = {"encoder": encoder, "encoder2": encoder2}
        deferred = {}
        for s in sentence_encoder_specs():
            info = s.record(manifest)
            if info and given[s.mode] is None:
                loader = functools.partial(s.load_encoder, manifest, getattr(embedder, "device", None))
                if self.fusion.weight(s.mode) > 0:
                    given[s.mode] = loader()
                else:  # a channel the hybrid does not weigh: its model is loaded on its first query
                    deferred[s.mode] = loader
                continue
            manifest.check_encoder(given[s.mode].identity if given[s.mode] is not None else None, s.manifest_key)
        # the pieces; a fusion view (with_fusion) shares them all, and with them what each builds on first use
        self.queries = QueryEncoding(embedder, query_encoder, self.token_idf, given, deferred, expansion_m, literal, query_weighting,
                                     query_cache_size)
        held = {s.mode: getattr(self, s.attribute) for s in CHANNEL_SPECS if getattr(self, s.attribute) is not None}
        self.channel_search = ChannelSearch(self.engine, held, analyze, len(doc_ids))
        doc_vectors = self.sparse.doc_vectors if self.sparse is not None else _no_aligned_tokens
        self.hybrid = HybridSearch(self.channel_search, FeedbackExpander(doc_vectors, self.queries.expansion_weights))
        self.explanations = HitExplainer(embedder.tokenizer, self.channel_search, doc_ids)
        self.filters = MetadataFilters((manifest.documents or {}).get("metadata_fields", []), self._read_metadata,
                                       (manifest.documents or {}).get("metadata_types"))
        self.feedback = feedback
        self._holds_generation = True  # False in a fusion view: the Retriever it was made from holds it
        self._check_query_side()

    # ------------------------------------------------------------------ the query side, delegated
    @property
    def model_free(self) -> bool:
        """No model encodes queries (query_encoder "none"): the sparse channel reads their own tokens."""
        return self.queries.model_free

    @property
    def query_encoder(self) -> str:
        """The name of what encodes queries for the LLM channels: "llm", "distilled:NAME" or "none"."""
        return self.queries.name

    @property
    def student(self) -> DistilledQueryEncoder | None:
        """The distilled query encoder (None: the LLM, or no model, encodes queries)."""
        return self.queries.student

    @property
    def student_encoder(self):
        """The sentence encoder the distilled student reads (None without a student)."""
        return self.queries.student_encoder

    @property
    def sentence_encoders(self) -> dict[str, Any]:
        """The sentence models of the index's encoder channels loaded so far, by mode ("encoder",
        "encoder2"); one the hybrid does not weigh is loaded on its first query."""
        return dict(self.queries.encoders)

    @property
    def encoder(self) -> Any:
        """The encoder channel's sentence model (None: not held, or not loaded yet)."""
        return self.queries.encoders.get("encoder")

    @property
    def encoder2(self) -> Any:
        """The second encoder channel's sentence model (None: not held, or not loaded yet)."""
        return self.queries.encoders.get("encoder2")

    @property
    def student_head(self) -> LMHead:
        """The LM head that expands distilled query states (embedder.query_encoder.LMHead), made on first use."""
        return self.queries.student_head

    @property
    def query_cache(self) -> QueryCache:
        """Encoded queries kept (LRU), shared with this Retriever's fusion views."""
        return self.queries.cache

    @property
    def expansion_m(self) -> int:
        """Aligned tokens added to each query (top-M of its state's LM-head logits)."""
        return self.queries.expansion_m

    @expansion_m.setter
    def expansion_m(self, m: int) -> None:
        """Changes M for this Retriever and its fusion views; queries already cached keep theirs (clear :attr:`query_cache`)."""
        self.queries.expansion_m = m

    @property
    def literal(self) -> str:
        """Which forms of the query's own tokens it holds: "space", "bare" or "both"."""
        return self.queries.literal

    @property
    def query_weighting(self) -> str:
        """How query tokens weigh: "idf" or "one"."""
        return self.queries.query_weighting

    @property
    def explainer(self) -> TokenExplainer:
        """Spells matched tokens as words (built on first use: it decodes vocabulary entries)."""
        return self.explanations.words

    @property
    def document_tokens(self) -> DocumentTokens:
        """The index's aligned tokens, document by document (for feedback; built on first use)."""
        return self.hybrid.expander.document_tokens

    @property
    def metadata(self) -> list[dict | None]:
        """Each document's stored metadata (None where it has none), by doc number (read on first use)."""
        return self.filters.metadata

    def _read_metadata(self) -> list[dict | None]:
        if self.manifest.documents is None:
            return [None] * len(self.doc_ids)
        held = self.generation.path if self.generation is not None else self.index_dir
        stored = StoredDocuments.open(held, self.manifest.n_docs)
        return [stored.record(i).get("metadata") for i in range(len(stored))]

    def filter_mask(self, where: dict | None) -> np.ndarray | None:
        """The documents a metadata filter lets through (None: no filter); ValueError for a bad one."""
        return self.filters.mask(where)

    # ------------------------------------------------------------------ fusion
    @property
    def fusion(self) -> Fusion:
        """The hybrid setting (:class:`Fusion`: checked, frozen)."""
        return self._fusion

    @fusion.setter
    def fusion(self, setting: dict | Fusion) -> None:
        """Assigning a setting checks it as the constructor does (a dict becomes a :class:`Fusion`,
        a bad one is a ValueError), so no unchecked setting reaches a search; :meth:`with_fusion`
        gives a view with another fusion and leaves this Retriever's alone."""
        self._fusion = Fusion.of(setting)

    def with_fusion(self, fusion: dict | Fusion | None) -> Retriever:
        """This Retriever searching "hybrid" with another ``fusion`` setting (see ``__init__``).

        The setting is checked exactly as ``Retriever(fusion=...)`` and ``Retriever.load(fusion=...)``
        check it (:class:`Fusion`, then the query-side checks against this Retriever's query
        encoder and feedback): a bad one raises the same ValueError, with the same message.
        None: the fusion the constructor gives where none is given (the profile's, else the default
        for the index's channels).

        The result is a view: it shares everything else with this Retriever, nothing reloaded or
        copied: the index's channels and backend, the models and the query encoder, the query
        cache, the metadata masks and what is built on first use (explanations' vocabulary,
        feedback's document tokens, the distilled queries' LM head, the metadata). This
        Retriever's own fusion is unchanged. The view holds no index generation of its own: its
        :meth:`close` does nothing, this Retriever's lets the generation go for both."""
        other = copy.copy(self)  # a shallow copy: the same pieces, channels, models and caches
        other.fusion = self._fusion_setting(fusion)
        other._check_query_side()
        other._holds_generation = False
        return other

    def _fusion_setting(self, fusion: dict | Fusion | None) -> Fusion:
        """The hybrid setting for a ``fusion`` argument (``__init__``, :meth:`with_fusion`): checked,
        or where None the profile's, else the default for the index's channels."""
        return self._fusion_and_source(fusion)[0]

    def _fusion_and_source(self, fusion: dict | Fusion | None) -> tuple[Fusion, str]:
        """:meth:`_fusion_setting` and where it came from (the caller, the profile's calibration
        on this corpus or its fixed setting, the channels' default), as :attr:`fusion_source` says."""
        if fusion is not None:
            return Fusion.of(fusion), "given by the caller"
        if self.profile is not None:
            setting, why = profile_fusion(self.profile, self.manifest.calibration)
            try:
                return Fusion.of(setting), why
            except ValueError as exc:  # a calibration record damaged by hand: say where, rather than fail later
                raise IndexFormatError(f"{self.index_dir / MANIFEST}: field 'calibration': {exc}") from None
        return default_fusion(bool(self.manifest.encoder)), "the default for the index's channels (no profile)"

    @property
    def fusion_source(self) -> str:
        """Why the hybrid fuses as it does: given by the caller, calibrated on this corpus when
        the index was built (its profile's pair), the profile's fixed setting, or the default."""
        fusion, why = self._fusion_and_source(None)
        return why if fusion == self.fusion else "given by the caller"

    def _check_query_side(self) -> None:
        """Refuse, when the Retriever is made, what a search would fail on later: a fusion that
        weighs a dense channel the model-free query cannot search, feedback where the engine fuses."""
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
        """``q`` with its sparse side expanded from the top :attr:`feedback` documents of
        ``first_pass`` ({channel: (doc numbers, scores)}, fused with the hybrid's weights; where it
        is empty, the sparse channel's own top documents)."""
        if self.feedback is None:
            raise ValueError("with_feedback: this Retriever has no feedback setting")
        return self.hybrid.with_feedback(q, first_pass, self.fusion, self.feedback)

    # ------------------------------------------------------------------ opening
    @classmethod
    def load(
        cls,
        index_dir: str | os.PathLike[str],
        model: str | None = None,
        embedder: Embedder | TokenizerOnly | None = None,
        device: str | None = None,
        verify: bool = False,
        warm: bool = True,
        dtype: str = "auto",
        runtime: str = "auto",
        query_encoder: str | os.PathLike[str] | DistilledQueryEncoder | None = None,
        profile: str | Profile | None = "auto",
        **kwargs,
    ) -> Retriever:
        """Open an index and load the embedder its manifest names (or check the given one).

        ``model``: when given, must be the model the index was built with (by name or path);
        an index built with another model or adapter is refused. Every file is checked for its
        recorded size and every channel for its structure; ``verify=True`` also compares every
        file with its recorded checksum (reads every byte). A damaged index raises
        IndexFormatError naming the file.

        ``warm``: run one query through every channel before returning (:meth:`warm_up`), so
        that the first real query costs what every later one does.
        ``dtype`` / ``runtime``: how queries are encoded (embedder/hardware.py; ``auto`` is
        chosen for this machine). They may differ from the documents' (the manifest's
        ``runtime``): BENCHMARKS.md measures what that costs.
        ``profile``: the operating point (retriever/profiles.py): "fast" (BM25 + MiniLM + the
        query's own tokens, no LLM forward per query) or "best" (the same over mpnet, the second
        encoder channel; on an index without it, the LLM encodes the query and the hybrid adds
        its dense channel); it sets ``query_encoder`` and ``fusion`` unless they are given. "auto" (the
        default): "fast" where the index holds fast's channels (what ``build-index`` builds by
        default), else no profile: an index built before, or with other channels, is searched as
        it was then. None: no profile (``query_encoder`` "auto", the fusion of its channels).
        ``query_encoder``: "auto" (a distilled student where one is kept beside the index's
        adapter, else the LLM), "llm", "distilled", "none", or a student's directory (see ``__init__``).
        With "none" only the LLM's tokenizer is loaded (embedder/tokenization.py: no weights, no
        runtime; ``dtype`` and ``runtime`` are unused).
        """
        index_dir = Path(index_dir)
        # one generation of the index, held while this Retriever lives (indexer/reader.py), every
        # file opened and checked before spending seconds on the model
        opened = open_index(index_dir, verify=verify, mmap=kwargs.get("mmap", True))
        if profile == "auto":
            # the default profile where the index holds its channels, else the one it was built for
            # (build-index --profile best holds no MiniLM), else none: an index of an earlier default,
            # searched as it was built to be
            profile = auto_profile(opened.channels)
        elif profile is not None:
            wanted = get_profile(profile)
            profile = fit_profile(wanted, opened.channels)
            lacking = sorted(set(wanted.channels) - set(opened.channels))
            if lacking:
                still = sorted(set(profile.channels) - set(opened.channels))
                searched = "" if profile is wanted else (f"; searching its fallback ({profile.summary})"
                                                         + (f", without {', '.join(still)}" if still else ""))
                log.warning("%s: profile %r weighs channel(s) %s this index lacks%s; build-index --profile %s (or both) builds them",
                            index_dir, wanted.name, ", ".join(lacking), searched, wanted.name)
        if profile is None and query_encoder is None:
            query_encoder = "auto"
        try:
            kwargs = {**kwargs, "query_encoder": query_encoder, "profile": profile}
            return cls._load_opened(opened, index_dir, model, embedder, device, warm, dtype, runtime, kwargs)
        except BaseException:
            opened.close()
            raise

    @classmethod
    def _load_opened(cls, opened: OpenedIndex, index_dir: Path, model, embedder, device, warm, dtype, runtime, kwargs) -> Retriever:
        manifest = opened.manifest
        kwargs["doc_ids"], kwargs["channels"], kwargs["generation"] = opened.doc_ids, opened.channels, opened.generation
        if not any(s.record(manifest) is not None for s in channel_table.with_need(LLM_STATE)):
            # no channel of the index reads the LLM's query state (BM25, the sentence encoders): no model encodes queries,
            # and the LLM's weights are never loaded (its tokenizer alone)
            kwargs["query_encoder"] = "none"
        if embedder is None:
            # indexes built before all-caps folding existed were built without it; the query
            # template is the manifest's too (none recorded: queries read the document template)
            try:
                config = EmbedderConfig(**{"fold_all_caps": False, **manifest.embedding})
            except (TypeError, ValueError) as exc:
                raise IndexFormatError(f"{index_dir / MANIFEST}: field 'embedding': {exc}") from None
            adapter = (manifest.adapter or {}).get("path", "none")
            profile = kwargs.get("profile")
            encoder_choice = kwargs.get("query_encoder") or (get_profile(profile).query_encoder if profile is not None else "llm")
            if encoder_choice == "none":
                # model-free queries read the LLM's tokenizer alone: its weights are never loaded
                embedder = TokenizerOnly.load(model or manifest.model["name"], adapter, config)
            else:
                embedder = Embedder.load(model or manifest.model["name"], adapter=adapter, config=config, device=device, dtype=dtype, runtime=runtime)
        manifest.check_model(embedder.identity, embedder.adapter)
        retriever = cls(index_dir, manifest, embedder, **kwargs)
        if warm:
            retriever.warm_up()
        return retriever

    def close(self) -> None:
        """Let go of the index generation this Retriever holds (a build may then remove it once
        it is replaced); searching afterwards still works from what is already mapped. A fusion view
        (:meth:`with_fusion`) holds none: closing it does nothing."""
        if self.generation is not None and self._holds_generation:
            self.generation.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def warm_up(self) -> None:
        """Pay every first-call cost now rather than in the first query: the encoder runtime's
        export/compilation and first allocation, the Numba kernels, FAISS, the vocabulary
        spellings that explanations use. An encoder channel the hybrid does not weigh keeps its
        model unloaded (seconds and memory, e.g. mpnet at the fast point) until its first query."""
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
        """The mode a search without one uses: "hybrid" where the index holds two or more of
        the fusion's channels (what ``build-index`` builds by default); otherwise the one
        channel there is (an index built with ``--channels sparse``, or before hybrid was
        the default): fusing one channel would only rescale its scores."""
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
        """Encode queries once (e.g. to time search alone, or to reuse across modes).

        ``mode``: encode only what that mode's channels need: a model runs for sparse, dense and
        dense-ef (the LLM, or the distilled student: :attr:`query_encoder`), the
        sentence-transformers encoder only for "encoder" and for the student (a bm25 + encoder
        hybrid never runs the LLM). ``None``: everything the index's channels need. Encoded
        queries are kept in :attr:`query_cache`."""
        channels = self.channels_of(mode)
        wanted = {need for c in channels for need in _QUERY_NEEDS.get(c, ())}  # the query needs of its channels
        return self.queries.encode(queries, llm=LLM_STATE in wanted, encoders=[c for c in channels if ENCODER_EMBEDDING in _QUERY_NEEDS.get(c, ())])

    def encode_states(self, queries: Sequence[str], h: np.ndarray, name: str) -> list[EncodedQuery]:
        """Queries whose pooled states ``h`` (n, d) were computed elsewhere, as a distilled query is
        built from its student's h: the literal tokens plus the top-M of W_lm h, weighted as this
        index weighs queries, with the encoder channel's embedding where the index has one. For
        studies of what a query state is worth (benchmarks/studies/state_faithfulness.py); not cached.
        ``name`` is what the queries' ``query_encoder`` says produced them."""
        return self.queries.encode_states(queries, h, name)

    def search(self, query: str, k: int = 10, mode: str | None = None, where: dict | None = None) -> list[Hit]:
        """Top-k hits for one query, best first.

        The contract (the same for :meth:`batch_search` and ``search-index``): ``query`` must be
        a str (TypeError); an empty or whitespace-only query has no hits; ``k`` must be a
        positive int (ValueError); ``mode`` one of :attr:`modes` (ValueError), by default
        :attr:`default_mode` (hybrid on an index with several channels). ``where``: a metadata
        filter (retriever/filters.py), e.g. ``{"lang": "en", "year": {"gte": 2000}}``; an
        unknown field or a malformed condition is a ValueError naming it.
        """
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
        texts = [_utf8_safe(queries[i]) for i in asked]
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
        """Search pre-encoded queries (see :meth:`encode`; encode with the same ``mode``).
        ``explain=False`` leaves ``Hit.matched_tokens`` empty (the per-hit token lookups cost
        more than the search). ``where``: a metadata filter, as in :meth:`search`. ``offset``:
        the hits of ranks ``offset + 1 .. k`` only (a page), the ones before never explained."""
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
        """One channel's top-``k`` for an encoded query (:meth:`encode` with that ``mode``): document
        numbers (into :attr:`doc_ids`) and scores, best first, -1 padded; no explanations.
        ``where``: a metadata filter, as in :meth:`search`."""
        if mode == "hybrid":
            raise ValueError("search_channel searches one channel; for hybrid use search_encoded")
        self._check_mode(mode)
        return self.channel_search.search(q, mode, check_k(k), self.filter_mask(where))


def check_k(k: object) -> int:
    """``k`` as an int, or ValueError unless it is a positive integer (bools are not)."""
    if isinstance(k, bool) or not isinstance(k, (int, np.integer)) or k < 1:
        raise ValueError(f"k must be a positive integer, got {k!r}")
    return int(k)


def check_queries(queries: object) -> list[str]:
    """``queries`` as a list, or TypeError unless it is a sequence of str (a str alone is not:
    it would be searched character by character)."""
    if isinstance(queries, (str, bytes)) or not isinstance(queries, Sequence):
        raise TypeError(f"queries must be a sequence of str, got {type(queries).__name__}")
    for i, q in enumerate(queries):
        if not isinstance(q, str):
            raise TypeError(f"queries[{i}] must be a str, got {type(q).__name__}")
    return list(queries)


def _utf8_safe(text: str) -> str:
    """``text`` with lone surrogates (a str can hold them: undecodable command-line bytes
    arrive as such) replaced by U+FFFD, which tokenizers cannot encode otherwise."""
    try:
        text.encode("utf-8")
        return text
    except UnicodeEncodeError:
        return text.encode("utf-8", "surrogatepass").decode("utf-8", "replace")


def _pruning(setting: object) -> SparsePruning | None:
    """``sparse_pruning`` as a SparsePruning (a "KEEP,DEPTH" string or a (keep, depth) pair is read as one), or None."""
    if setting is None or isinstance(setting, SparsePruning):
        return setting
    if isinstance(setting, str):
        return SparsePruning.parse(setting)
    if isinstance(setting, (tuple, list)) and len(setting) == 2:
        return SparsePruning(*setting)
    raise TypeError(f"sparse_pruning must be a retriever.pruning.SparsePruning, 'KEEP,DEPTH' or (keep, depth), got {setting!r}")
