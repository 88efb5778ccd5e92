"""Pseudo-relevance feedback on the aligned-token channel: a query expanded from the documents that
the hybrid's other channels rank first, with no model on the query path.

The index already holds every document's top-K aligned tokens (the LLM's expansion of the
document, text-is-worth-several-tokens Eq. 15). In a hybrid, BM25 and the sentence encoder answer
before the sparse channel needs its query; the aligned tokens their top few documents share are
the feedback: each document's weights are divided by its largest (so one long document does not
outvote the others), averaged over the documents, and the best ``tokens`` of them that the query
does not already hold are added to its sparse side, each weighing ``weight`` times its IDF (the
query's own tokens weigh their IDF). This is RM3's idea (Lavrenko and Croft's relevance model,
interpolated with the query) over aligned tokens instead of words.

Measured on the five shared collections (training/README.md, "Feedback from the first pass"):
with LLM queries, +0.004 nDCG@10 held out; with distilled or model-free queries, no setting chosen
on the other collections helps the one left out. So it is off unless asked for.
"""
from __future__ import annotations

import dataclasses
import math
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from retriever.query import EncodedQuery


@dataclass(frozen=True)
class Feedback:
    """How the sparse query is expanded from the first pass: ``docs`` documents read, ``tokens``
    aligned tokens taken from them, each weighing ``weight`` times its IDF. The defaults are the
    setting chosen for LLM queries leaving each shared collection out (every fold chose it)."""

    docs: int = 3
    tokens: int = 128
    weight: float = 0.25

    def __post_init__(self) -> None:
        for name in ("docs", "tokens"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
                raise ValueError(f"feedback {name}: expected a positive integer, got {value!r}")
        if isinstance(self.weight, bool) or not isinstance(self.weight, (int, float)) or not math.isfinite(self.weight) or self.weight <= 0:
            raise ValueError(f"feedback weight: expected a finite number > 0, got {self.weight!r}")

    @classmethod
    def parse(cls, text: str) -> Feedback:
        """``DOCS,TOKENS,WEIGHT`` as the command lines take it (``3,128,0.25``)."""
        parts = text.split(",")
        if len(parts) != 3:
            raise ValueError(f"feedback {text!r}: expected DOCS,TOKENS,WEIGHT (e.g. 3,128,0.25)")
        try:
            docs, tokens, weight = int(parts[0]), int(parts[1]), float(parts[2])
        except ValueError:
            raise ValueError(f"feedback {text!r}: expected DOCS,TOKENS,WEIGHT (e.g. 3,128,0.25)") from None
        return cls(docs, tokens, weight)

    def to_dict(self) -> dict:
        return {"docs": self.docs, "tokens": self.tokens, "weight": self.weight}


class DocumentTokens:
    """Each document's aligned tokens, document-major and divided by the document's largest weight
    (the inverted index is token-major). Built from the postings on first use: it holds as many
    entries as the sparse index itself."""

    def __init__(self, by_doc) -> None:
        """``by_doc``: documents x tokens (scipy CSR), as ``InvertedIndex.doc_vectors`` gives it."""
        # aligned-token weights are logits, positive in the top-K of a trained model; the absolute value
        # keeps the order of a document's tokens whatever their sign
        largest = np.asarray(abs(by_doc).max(axis=1).todense()).ravel().astype(np.float32)
        largest[largest == 0] = 1.0
        self.indptr = by_doc.indptr
        self.tokens = by_doc.indices
        self.weights = (by_doc.data / np.repeat(largest, np.diff(by_doc.indptr))).astype(np.float32)
        self.vocab_size = by_doc.shape[1]

    def expansion(self, docs: np.ndarray, exclude: np.ndarray, n: int) -> tuple[np.ndarray, np.ndarray]:
        """The ``n`` tokens with the largest mean normalised weight over ``docs`` (document numbers;
        a document without the token adds 0), among the tokens they hold with a nonzero weight,
        ``exclude`` left out, and those means: (ids int64, means float32), best first."""
        docs = np.asarray(docs, np.int64)
        if docs.size == 0:
            return np.zeros(0, np.int64), np.zeros(0, np.float32)
        rows = [slice(self.indptr[d], self.indptr[d + 1]) for d in docs.tolist()]
        ids = np.concatenate([self.tokens[r] for r in rows])
        weights = np.concatenate([self.weights[r] for r in rows])
        mean = np.bincount(ids, weights=weights, minlength=self.vocab_size) / docs.size
        held = np.zeros(self.vocab_size, bool)
        held[ids[weights != 0]] = True
        held[np.asarray(exclude, np.int64)] = False
        candidates = np.flatnonzero(held)
        n = min(n, candidates.size)
        if n == 0:
            return np.zeros(0, np.int64), np.zeros(0, np.float32)
        top = candidates[np.argpartition(-mean[candidates], n - 1)[:n]]
        top = top[np.argsort(-mean[top], kind="stable")]
        return top.astype(np.int64), mean[top].astype(np.float32)


def feedback_arg(text: str) -> Feedback:
    """``--feedback DOCS,TOKENS,WEIGHT`` for argparse (a bad value is a usage error naming the flag)."""
    import argparse

    try:
        return Feedback.parse(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


class FeedbackExpander:
    """The index side of feedback: its documents' aligned tokens (:class:`DocumentTokens`, built
    on first use and once for a Retriever and its fusion views) and how a query is expanded
    from a first pass's top documents."""

    def __init__(self, doc_vectors: Callable[[], Any], weights_of: Callable[[np.ndarray], np.ndarray]) -> None:
        """``doc_vectors``: gives the documents x tokens matrix (``InvertedIndex.doc_vectors``);
        ``weights_of``: the weight each added token's feedback weight multiplies (its IDF, or 1)."""
        self._doc_vectors = doc_vectors
        self._weights_of = weights_of
        self._lock = threading.Lock()  # the document tokens are large: built once
        self._document_tokens: DocumentTokens | None = None

    @property
    def document_tokens(self) -> DocumentTokens:
        with self._lock:
            if self._document_tokens is None:
                self._document_tokens = DocumentTokens(self._doc_vectors())
            return self._document_tokens

    def expand(self, q: EncodedQuery, docs: np.ndarray, setting: Feedback) -> EncodedQuery:
        """``q`` with the ``setting.tokens`` aligned tokens that weigh most in ``docs`` (document
        numbers) added to its sparse side, each weighing ``setting.weight`` times its weight."""
        ids, _ = self.document_tokens.expansion(docs, q.tokens, setting.tokens)
        added = setting.weight * self._weights_of(ids)
        return dataclasses.replace(q, tokens=np.concatenate([q.tokens, ids]), weights=np.concatenate([q.weights, added]).astype(np.float32))
