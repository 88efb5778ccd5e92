"""Multi-vector documents: a document longer than one segment is encoded as several segments.

A segment is a fixed-length window of the document's own tokens (the embedder's
``max_length``, 256 by default), each encoded in the prompt template like any text. Segment 0
is the document text itself: the embedder truncates it to exactly the first window, so its
embedding is the single-vector embedding (and an embedding cache of single-vector runs serves
it). Later windows are decoded back to text; a decode/re-encode round trip of byte-level BPE can
merge a token or two at the window edges, which changes no window's content.

The channels combine a document's segments as BTMR combines token groups:

* sparse: the aligned-token logits of a document are each token's maximum over its segments
  (:func:`max_over_segments`: the top-K of that maximum lies within the union of the segments'
  top-K lists, so merging the per-segment lists is exact);
* dense: one vector per segment in FAISS, a row -> document map, and a document scores as its
  best segment (indexer/dense.py).
"""
from __future__ import annotations

from collections.abc import Sequence

import numpy as np


def split_segments(embedder, texts: Sequence[str], max_segments: int | None = None) -> tuple[list[str], np.ndarray]:
    """(segment texts, document number of each segment) for ``texts``, documents in order.

    ``max_segments`` caps the segments of one document (None: the whole document is read).
    """
    length = embedder.config.max_length
    if max_segments is not None and max_segments < 1:
        raise ValueError(f"max_segments must be positive, not {max_segments}")
    tok = embedder.tokenizer
    ids = tok([embedder.normalise(t) for t in texts], add_special_tokens=False)["input_ids"] if texts else []
    segs: list[str] = []
    owner: list[int] = []
    for d, (text, row) in enumerate(zip(texts, ids)):
        n = max(1, -(-len(row) // length))
        if max_segments is not None:
            n = min(n, max_segments)
        segs.append(text)  # window 0: the embedder's own truncation of the full text
        owner.append(d)
        for j in range(1, n):
            segs.append(tok.decode(row[j * length : (j + 1) * length]))
            owner.append(d)
    return segs, np.asarray(owner, np.int64)


def max_over_segments(tokens: np.ndarray, weights: np.ndarray, owner: np.ndarray, n_docs: int, k: int) -> tuple[np.ndarray, np.ndarray]:
    """Per-document top-``k`` (ids, weights) of the per-token maximum over each document's segments.

    ``tokens``/``weights``: (n_segments, k) top-k lists of the segments (best first);
    ``owner``: the document number of each segment (0..n_docs-1, every document present).
    Returns (n_docs, k) arrays, best first (ties: lower token id first).
    """
    if tokens.shape != weights.shape or len(tokens) != len(owner):
        raise ValueError("tokens, weights and owner must describe the same segments")
    out_t = np.zeros((n_docs, k), np.int32)
    out_w = np.zeros((n_docs, k), np.float32)
    counts = np.bincount(owner, minlength=n_docs)
    if (counts == 0).any():
        raise ValueError(f"document {int(np.flatnonzero(counts == 0)[0])} has no segment")
    order = np.argsort(owner, kind="stable")
    starts = np.r_[0, np.cumsum(counts)]
    for d in range(n_docs):
        rows = order[starts[d] : starts[d + 1]]
        if len(rows) == 1:
            out_t[d], out_w[d] = tokens[rows[0], :k], weights[rows[0], :k]
            continue
        t = tokens[rows].ravel()
        w = weights[rows].ravel()
        # max per token id: sort by (id, -weight) and keep each id's first entry
        o = np.lexsort((-w, t))
        t, w = t[o], w[o]
        first = np.r_[True, t[1:] != t[:-1]]
        t, w = t[first], w[first]
        best = np.lexsort((t, -w))[:k]
        out_t[d, : len(best)], out_w[d, : len(best)] = t[best], w[best]
    return out_t, out_w


def best_per_document(rows: np.ndarray, scores: np.ndarray, row_doc: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """Collapse ranked segment hits (n_q, r) to each document's best segment: (docs, scores) (n_q, k), -1 padded."""
    docs_out = np.full((len(rows), k), -1, np.int64)
    scores_out = np.zeros((len(rows), k), np.float32)
    for q in range(len(rows)):
        seen: set[int] = set()
        j = 0
        for r, s in zip(rows[q], scores[q]):
            if r < 0:
                break
            d = int(row_doc[r])
            if d in seen:
                continue  # a lower-ranked segment of a document already placed
            seen.add(d)
            docs_out[q, j], scores_out[q, j] = d, s
            j += 1
            if j == k:
                break
    return docs_out, scores_out


__all__ = ["best_per_document", "max_over_segments", "split_segments"]
