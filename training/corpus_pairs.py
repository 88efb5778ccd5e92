"""Positive pairs cut from a user's own documents, for the unsupervised contrastive stages.

Never from queries or relevance judgments: only the corpus text. Two kinds, as token ids:

- two spans of one document (they share a topic, rarely a phrase), and
- a sentence and its whole document (the document "answers" its own sentence).

Dropout views (SimCSE) need no source: the same ids twice, two dropout masks.
Every cut is a pure function of the document and a NumPy generator, so that a stage's
batches depend only on (seed, stage, step) and a resumed run sees the same pairs.
"""
from __future__ import annotations

import re
from collections.abc import Sequence

import numpy as np

_SENTENCE_END = re.compile(r"(?<=[.!?])\s+")


def split_sentences(text: str, min_chars: int = 20) -> list[str]:
    """Sentences of a text (split after . ! ?), those shorter than ``min_chars`` dropped."""
    return [s.strip() for s in _SENTENCE_END.split(text) if len(s.strip()) >= min_chars]


def two_spans(ids: Sequence[int], rng: np.random.Generator, span_min: int, span_max: int) -> tuple[list[int], list[int]] | None:
    """Two token spans of one document, each of ``span_min``..``span_max`` tokens, not overlapping
    where the document is long enough (else they overlap as little as it allows); None when the
    document is shorter than two minimal spans."""
    n = len(ids)
    if n < 2 * span_min:
        return None
    la = int(rng.integers(span_min, min(span_max, n - span_min) + 1))
    lb = int(rng.integers(span_min, min(span_max, n - la) + 1))
    # the first span lies before the second: choose the gap and the start
    room = n - la - lb
    start_a = int(rng.integers(0, room + 1))
    start_b = start_a + la + int(rng.integers(0, room - start_a + 1))
    a, b = list(ids[start_a : start_a + la]), list(ids[start_b : start_b + lb])
    return (a, b) if rng.random() < 0.5 else (b, a)  # neither side is always the earlier text


def sentence_and_document(text: str, rng: np.random.Generator, min_chars: int = 20) -> tuple[str, str] | None:
    """One sentence of a text and the text itself; None when it has fewer than two sentences."""
    sents = split_sentences(text, min_chars)
    if len(sents) < 2:
        return None
    return sents[int(rng.integers(len(sents)))], text


__all__ = ["sentence_and_document", "split_sentences", "two_spans"]
