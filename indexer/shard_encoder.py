"""Encoding one shard of a build: the unit every executor runs (this process, ``--workers``
processes, Ray actors) and the same function in each, so every executor builds the same index.

A shard is ``ShardPlan.shard_size`` consecutive documents of the corpus (``chunks``); encoding
it gives the arrays and the JSON that indexer/shards.py commits. ``EmbedderSpec`` says how a
worker that is not this process loads the build's embedder again.
"""
from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np
import torch

from embedder.encoder import Embedder
from indexer.corpus import Document
from indexer.segments import max_over_segments, split_segments

if TYPE_CHECKING:
    from embedder.sentence_encoder import SentenceEncoder


def chunks(docs: Iterable[Document], size: int) -> Iterator[list[Document]]:
    """Consecutive lists of ``size`` documents (the last one shorter): the shards of a corpus."""
    chunk: list[Document] = []
    for d in docs:
        chunk.append(d)
        if len(chunk) == size:
            yield chunk
            chunk = []
    if chunk:
        yield chunk


@dataclass(frozen=True)
class EmbedderSpec:
    """How a worker process loads the build's embedder (and sentence encoders) again: the
    arguments of ``Embedder.load`` (and ``SentenceEncoder.load``: ``encoders`` maps the shards'
    array of each sentence-encoder channel to the encoder's name). ``build-index --workers N``
    makes one."""

    model: str
    adapter: str | None = "default"
    config: dict = field(default_factory=dict)
    device: str | None = None
    dtype: str = "auto"
    runtime: str | None = "auto"
    encoders: dict[str, str] = field(default_factory=dict)
    llm: bool = True  # False: no channel built needs the LLM; its tokenizer alone is loaded (no weights)

    def load(self) -> tuple[Embedder, dict[str, SentenceEncoder]]:
        from embedder.encoder import EmbedderConfig

        if self.llm:
            embedder = Embedder.load(self.model, adapter=self.adapter, config=EmbedderConfig(**self.config), device=self.device, dtype=self.dtype,
                                     runtime=self.runtime)
        else:
            from embedder.tokenization import TokenizerOnly

            embedder = TokenizerOnly.load(self.model, self.adapter, EmbedderConfig(**self.config))
        encoders = {}
        if self.encoders:
            from embedder.sentence_encoder import SentenceEncoder

            encoders = {array: SentenceEncoder.load(name, device=self.device) for array, name in self.encoders.items()}
        return embedder, encoders


@dataclass(frozen=True)
class ShardPlan:
    """What each shard holds: K tokens per document, the embeddings or not, documents per
    shard, and the segment windows (None: one vector per document; 0: every window; n: at most n)."""

    k: int
    keep_embeddings: bool
    shard_size: int
    windows: int | None = None
    tokens: bool = True  # the aligned tokens (the sparse channel); with no embeddings kept either, the LLM does not run

    @property
    def llm(self) -> bool:
        """Whether the LLM reads the documents (for their aligned tokens or their embeddings)."""
        return self.tokens or self.keep_embeddings


def encode_shard(
    chunk: list[Document], embedder: Embedder, encoders: Mapping[str, SentenceEncoder], plan: ShardPlan,
    encoded: Callable[[int], None] | None = None,
) -> tuple[dict[str, np.ndarray], dict]:
    """One shard's arrays and JSON (doc ids, tokens, seconds). ``encoders``: the sentence
    encoders of the build's encoder channels, by the array their embeddings are kept in.

    With segments, ``tokens``/``weights`` are already per document (max over its windows),
    ``embeddings`` has one row per window and ``row_docs`` the shard-local document of each.
    ``encoded(n)`` is told of each batch's documents as the LLM finishes them (a progress bar
    that moves within a shard); with segments, of the whole shard at the end.
    """
    texts = [d.text for d in chunk]
    if not plan.llm:  # no channel built needs the LLM: only the sentence encoders read the documents
        return _encode_without_llm(chunk, texts, embedder, encoders, encoded)
    units, owner = split_segments(embedder, texts, plan.windows or None) if plan.windows is not None else (texts, None)
    k = plan.k
    tok = np.zeros((len(units), k), np.int32)
    wts = np.zeros((len(units), k), np.float32)
    emb = np.zeros((len(units), embedder.dim), np.float32) if plan.keep_embeddings else None
    n_tokens = 0
    t0 = time.perf_counter()
    with torch.inference_mode():
        # the document template; the manifest records the query template for the Retriever
        for pos, h, ntok in embedder.iter_batches(units, role="document"):
            tok[pos], wts[pos] = embedder.top_tokens(h, k)
            if emb is not None:
                emb[pos] = h.cpu().numpy()
            n_tokens += ntok
            if encoded is not None and owner is None:
                encoded(len(pos))
    if encoded is not None and owner is not None:
        encoded(len(chunk))
    arrays = {"tokens": tok, "weights": wts}
    if owner is not None:
        arrays["tokens"], arrays["weights"] = max_over_segments(tok, wts, owner, len(texts), k)
        arrays["row_docs"] = owner
    if not plan.tokens:  # the LLM ran for its embeddings only
        del arrays["tokens"], arrays["weights"]
    if emb is not None:
        arrays["embeddings"] = emb
    info = embedder.runtime_info()
    meta = {
        "ids": [d.doc_id for d in chunk], "n_tokens": n_tokens, "encode_seconds": time.perf_counter() - t0,
        "runtime": f"{info['name']} {info['dtype']}",  # per shard: a worker may have had to fall back
    }
    if owner is None:  # documents the LLM read only the start of (their text beyond max_length tokens)
        meta["n_cut"] = count_cut(embedder, texts)
    if encoders:
        t0 = time.perf_counter()
        for array, encoder in encoders.items():
            arrays[array] = encoder.encode(texts)
        meta["encoder_seconds"] = time.perf_counter() - t0
    return arrays, meta


def _encode_without_llm(chunk: list[Document], texts: list[str], embedder, encoders: Mapping[str, SentenceEncoder],
                        encoded: Callable[[int], None] | None) -> tuple[dict[str, np.ndarray], dict]:
    """A shard of a build whose channels need no LLM (BM25, the sentence encoders): their arrays alone."""
    t0 = time.perf_counter()
    arrays = {array: encoder.encode(texts) for array, encoder in encoders.items()}
    if encoded is not None:
        encoded(len(chunk))
    info = embedder.runtime_info() if embedder is not None else {"name": "none", "dtype": None}
    meta = {"ids": [d.doc_id for d in chunk], "n_tokens": 0, "encode_seconds": 0.0, "runtime": f"{info['name']} {info['dtype']}"}
    if encoders:
        meta["encoder_seconds"] = time.perf_counter() - t0
    return arrays, meta


def count_cut(embedder: Embedder, texts: list[str]) -> int:
    """How many of ``texts`` are longer than the embedder's ``max_length`` tokens (so cut)."""
    tokenizer = getattr(embedder, "tokenizer", None)
    if tokenizer is None or not texts:
        return 0
    limit = embedder.config.max_length
    lengths = tokenizer([embedder.normalise(t) for t in texts], add_special_tokens=False, truncation=True, max_length=limit + 1,
                        return_length=True)["length"]
    return int(sum(n > limit for n in lengths))


__all__ = ["EmbedderSpec", "ShardPlan", "chunks", "count_cut", "encode_shard"]
