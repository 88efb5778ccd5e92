"""Query side of aligned-token retrieval (text-is-worth-several-tokens Eq. 16).

A query becomes its literal tokens T_q united with the top-M aligned tokens of its
embedding; every token weighs 1, so a document's score is the sum of its own weights over
the matched tokens.
"""
from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np

from embedder.encoder import Embedder
from embedder.tokenization import TextTokens

# Chosen by the M sweep in BENCHMARKS.md (a settled study: git show ed91196:benchmarks/studies/sweep_sparse.py, raw backbone, K=512, IDF
# query weights): mean nDCG@10 over cisi and medline 0.339 at M=64, 0.356 at 128, 0.356 at 256;
# 128 costs half the postings of 256. Tuned on those two collections' queries: their reported
# numbers are optimistic by that much, adi/cranfield/npl are untouched by the choice.
DEFAULT_EXPANSION_M = 128


@dataclass
class EncodedQuery:
    text: str
    tokens: np.ndarray  # int64 token ids, literal first, then expansion
    weights: np.ndarray  # float32, one per token
    n_literal: int  # how many of `tokens` are the query's own tokens
    embedding: np.ndarray  # pooled embedding h (float32, d); empty when the LLM was not run
    # the embedding of each sentence-encoder channel's model, by mode; those it was encoded for
    encoder_embeddings: dict[str, np.ndarray] = field(default_factory=dict)
    query_encoder: str = ""  # who produced ``embedding``: "llm" or "distilled:NAME" ("" when nothing did)

    @property
    def encoder_embedding(self) -> np.ndarray | None:
        """The encoder channel's (mode "encoder") embedding of the query; None: not encoded for it."""
        return self.encoder_embeddings.get("encoder")

    @classmethod
    def text_only(cls, text: str) -> EncodedQuery:
        """A query for channels that read only its text (BM25): no LLM call."""
        return cls(text, np.zeros(0, np.int64), np.zeros(0, np.float32), 0, np.zeros(0, np.float32))


def literal_ids(embedder: TextTokens, text: str, forms: str) -> list[int]:
    """The query's own tokens. ``forms``: "space" (word-initial forms, ``Ġgame``), "bare"
    (each word tokenised alone, ``game``), or "both"."""
    if forms not in ("space", "bare", "both"):
        raise ValueError("forms must be 'space', 'bare' or 'both'")
    text = embedder.normalise(text)
    # one call to the tokenizer for both forms (as Embedder.literal_token_ids reads the text, then each word)
    pieces = ([" " + text.strip()] if forms in ("space", "both") else []) + (text.split() if forms in ("bare", "both") else [])
    special = embedder.special_ids
    return list(dict.fromkeys(i for row in embedder.token_ids(pieces) for i in row if i not in special))


def encode_queries(
    embedder: Embedder, queries: Sequence[str], m: int = DEFAULT_EXPANSION_M, literal: str = "both"
) -> list[EncodedQuery]:
    """Encode queries into weighted token sets (and keep their embeddings for dense search).

    Queries are read with the embedder's query template (``EmbedderConfig.query_prompt``, the
    document template when none is set); the index's documents were read with ``prompt``.
    """
    return queries_from_states(embedder, queries, embedder.embed(list(queries), role="query"), m, literal, "llm")


def literal_queries(embedder: TextTokens, queries: Sequence[str], literal: str = "both") -> list[EncodedQuery]:
    """Queries of their own tokens alone, no model run (``query_encoder="none"``): no expansion,
    no embedding (the dense channels cannot be searched with them)."""
    out = []
    for q in queries:
        toks = np.asarray(literal_ids(embedder, q, literal), np.int64)
        out.append(EncodedQuery(q, toks, np.ones(len(toks), np.float32), len(toks), np.zeros(0, np.float32), query_encoder="none"))
    return out


def queries_from_states(
    embedder: Embedder, queries: Sequence[str], h: np.ndarray, m: int = DEFAULT_EXPANSION_M, literal: str = "both",
    query_encoder: str = "llm", top_tokens: Callable[[np.ndarray, int], tuple[np.ndarray, np.ndarray]] | None = None,
) -> list[EncodedQuery]:
    """Queries from their pooled states ``h`` (n, d), whoever computed them (the LLM or a
    distilled student, embedder/query_encoder.py): literal tokens plus the top-M of W_lm h
    (``top_tokens``: how W_lm h's top tokens are taken; default ``embedder.top_tokens``, fp32)."""
    top_ids, _ = (top_tokens or embedder.top_tokens)(h, m) if m > 0 else (np.zeros((len(queries), 0), np.int32), None)
    out = []
    for i, q in enumerate(queries):
        lit = literal_ids(embedder, q, literal)
        toks = list(dict.fromkeys(lit + top_ids[i].tolist()))
        out.append(EncodedQuery(q, np.asarray(toks, np.int64), np.ones(len(toks), np.float32), len(lit), h[i], query_encoder=query_encoder))
    return out
