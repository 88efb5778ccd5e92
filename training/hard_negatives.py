"""BM25 hard negatives mined inside each pairs source, from the pairs' own texts (issue 30).

For each anchor, the negative is the best BM25 hit among the *same source's* positives that
is not one of its own positives (nor the anchor's text): a passage that shares the anchor's
words but answers something else, harder than a random in-batch positive. Nothing outside the
loaded pairs is searched, so evaluation texts never enter (the pairs were already filtered
against the held-out texts by :func:`training.pairs.load_pairs`).

BM25 is this project's own (indexer/lexical.py: Lucene's formula, k1 0.9, b 0.4, the "words"
analyser with Porter stemming, numba kernels), the very scorer of the lexical channel that the
hybrid fuses with: negatives are then hard for the BM25 the embedder must complement. bm25s
would add a dependency to compute the same ranking.

Mined negatives are cached per source file, keyed by the file's SHA-256, the loaded pairs'
texts (sampling and held-out drops change them) and the settings, so each is mined once.
"""

from __future__ import annotations

import hashlib
import io
import json
import logging
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from embedder.util import file_sha256, write_bytes_atomic
from training.objectives.contrastive import text_key
from training.pairs import PairSet, PairSource

log = logging.getLogger(__name__)

MINER_VERSION = 1
DEFAULT_DEPTH = 16  # hits read per anchor; the first that is not its own positive is taken


def mine_bm25(anchors: Sequence[str], positives: Sequence[str], depth: int = DEFAULT_DEPTH, k1: float = 0.9, b: float = 0.4) -> np.ndarray:
    """For pair i, the index j of the pair whose positive is anchor i's BM25 hard negative; -1 if none.

    The candidates are the distinct positive texts (case and punctuation ignored). A candidate is
    never one of the positives of any pair with anchor i's text (a question with several answers
    keeps all of them as positives) nor the anchor's own text.
    """
    from indexer.lexical import BM25Index, WordAnalyzer

    if len(anchors) != len(positives):
        raise ValueError(f"{len(anchors)} anchors but {len(positives)} positives")
    p_keys = [text_key(t) for t in positives]
    a_keys = [text_key(t) for t in anchors]
    doc_of_key: dict[str, int] = {}
    doc_pair: list[int] = []  # the first pair whose positive is the document
    for j, k in enumerate(p_keys):
        if k not in doc_of_key:
            doc_of_key[k] = len(doc_pair)
            doc_pair.append(j)
    own: dict[str, set[int]] = {}
    for a, p in zip(a_keys, p_keys):
        own.setdefault(a, set()).add(doc_of_key[p])
    analyze = WordAnalyzer()
    index = BM25Index.build((positives[j] for j in doc_pair), analyze, k1, b)
    queries = [index.encode_query(analyze(t))[:2] for t in anchors]
    docs, scores = index.postings.batch_search(queries, k=depth + 1)
    out = np.full(len(anchors), -1, np.int64)
    for i, (hits, hit_scores) in enumerate(zip(docs, scores)):
        banned = own[a_keys[i]] | ({doc_of_key[a_keys[i]]} if a_keys[i] in doc_of_key else set())
        for d, s in zip(hits, hit_scores):
            if d >= 0 and np.isfinite(s) and s > 0 and int(d) not in banned:
                out[i] = doc_pair[int(d)]
                break
    return out


def _source_key(pairs: PairSet, source: PairSource, depth: int) -> str:
    h = hashlib.sha256()
    path = Path(source.path)
    h.update(json.dumps({"file": file_sha256(path) if path.is_file() else None, "depth": depth, "k1": 0.9, "b": 0.4,
                         "analyzer": "words", "version": MINER_VERSION}, sort_keys=True).encode())
    for rows in (source.anchor, source.positive):
        for r in rows:
            h.update(pairs.texts[r].encode())
            h.update(b"\0")
    return h.hexdigest()[:16]


def source_negatives(pairs: PairSet, source: PairSource, cache_dir: Path | None = None, depth: int = DEFAULT_DEPTH) -> np.ndarray:
    """Rows of ``pairs.texts`` of each pair's mined negative (-1 = none found), through the cache."""
    cache = Path(cache_dir) / f"{Path(source.path).stem}-{_source_key(pairs, source, depth)}.npy" if cache_dir else None
    hit = cache is not None and cache.exists()
    if hit:
        partner = np.load(cache)
        if partner.shape != (len(source),):
            raise ValueError(f"{cache}: {partner.shape} mined negatives for {len(source)} pairs; delete the file")
    else:
        partner = mine_bm25([pairs.texts[r] for r in source.anchor], [pairs.texts[r] for r in source.positive], depth)
        if cache is not None:
            buf = io.BytesIO()
            np.save(buf, partner)
            write_bytes_atomic(cache, buf.getvalue())
    found = partner >= 0
    log.info("BM25 negatives %s: %d of %d pairs%s", source.name, int(found.sum()), len(source), " (cached)" if hit else "")
    return np.where(found, source.positive[np.maximum(partner, 0)], -1)


def attach_bm25_negatives(pairs: PairSet, cache_dir: Path | None = None, depth: int = DEFAULT_DEPTH) -> None:
    """Set every source's ``mined`` rows (the contrastive step adds them as extra negatives)."""
    for source in pairs.sources:
        source.mined = source_negatives(pairs, source, cache_dir, depth)
