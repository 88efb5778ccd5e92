"""The channels calibration asks (indexer/calibration.py): BM25 and sentence-encoder embeddings,
over an index's own files or over arrays a study holds.

Each answers the two questions of :class:`~indexer.calibration.CalibrationChannel`: its top
documents for a query, and the score it would give the query against a text that is not in the
index (a document with a sentence held out), in the same units.
"""
from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np

from indexer.lexical import BM25Index

AVGDL_SAMPLE = 4096  # documents analysed to estimate the mean document length (not stored by the index)


class LexicalChannel:
    """BM25 (indexer/lexical.py): its posting lists searched as the index searches them; a held-out
    text scored by Lucene's formula with the index's k1, b, document frequencies and mean length."""

    def __init__(self, name: str, bm25: BM25Index, analyze: Callable[[str], list[str]], texts: Sequence[str], seed: int = 0) -> None:
        self.name, self.bm25, self.analyze = name, bm25, analyze
        n = bm25.postings.n_docs
        df = np.diff(np.asarray(bm25.postings.indptr)).astype(np.float64)
        self.idf = np.log(1.0 + (n - df + 0.5) / (df + 0.5))
        sample = np.random.default_rng(seed).permutation(len(texts))[:AVGDL_SAMPLE]
        self.avgdl = max(float(np.mean([len(analyze(texts[i])) for i in sample])) if len(sample) else 1.0, 1e-9)

    def _query(self, text: str) -> tuple[np.ndarray, np.ndarray]:
        ids, weights, _ = self.bm25.encode_query(self.analyze(text))
        return ids, weights

    def search(self, queries: Sequence[str], depth: int) -> list[tuple[np.ndarray, np.ndarray]]:
        out = []
        for q in queries:
            ids, weights = self._query(q)
            out.append(self.bm25.postings.search(ids, weights, depth) if ids.size else (np.full(depth, -1), np.zeros(depth)))
        return out

    def score(self, queries: Sequence[str], texts: Sequence[str]) -> np.ndarray:
        k1, b = self.bm25.k1, self.bm25.b
        out = np.zeros(len(queries))
        for i, (q, text) in enumerate(zip(queries, texts)):
            ids, weights = self._query(q)
            terms = self.analyze(text)
            tf = Counter(self.bm25.vocab[t] for t in terms if t in self.bm25.vocab)
            norm = k1 * (1.0 - b + b * len(terms) / self.avgdl)
            out[i] = sum(w * self.idf[t] * tf[t] / (tf[t] + norm) for t, w in zip(ids.tolist(), weights.tolist()) if tf.get(t))
        return out


class EmbeddingChannel:
    """A dense channel: queries and texts embedded by ``encode`` (L2-normalised: inner product is
    cosine, as indexer/dense.py indexes them), documents found by ``search`` ((queries, depth) ->
    (doc numbers, scores) arrays, as DenseIndex.search answers)."""

    def __init__(self, name: str, encode: Callable[[list[str]], np.ndarray], search: Callable[[np.ndarray, int], tuple[np.ndarray, np.ndarray]]) -> None:
        self.name, self.encode, self._search = name, encode, search
        self._last: tuple[tuple[str, ...], np.ndarray] | None = None

    def _embed(self, texts: Sequence[str]) -> np.ndarray:
        key = tuple(texts)
        if self._last is None or self._last[0] != key:  # the queries are embedded once for search and score
            x = np.asarray(self.encode(list(texts)), np.float32)
            self._last = (key, x / np.maximum(np.linalg.norm(x, axis=1, keepdims=True), 1e-12))
        return self._last[1]

    def search(self, queries: Sequence[str], depth: int) -> list[tuple[np.ndarray, np.ndarray]]:
        docs, scores = self._search(self._embed(queries), depth)
        return list(zip(docs, scores))

    def score(self, queries: Sequence[str], texts: Sequence[str]) -> np.ndarray:
        q = self._embed(queries)
        t = np.asarray(self.encode(list(texts)), np.float32)
        t /= np.maximum(np.linalg.norm(t, axis=1, keepdims=True), 1e-12)
        return (q * t).sum(axis=1)


def exact_search(doc_vectors: np.ndarray) -> Callable[[np.ndarray, int], tuple[np.ndarray, np.ndarray]]:
    """Exact inner-product search over ``doc_vectors`` (rows L2-normalised here), for a channel
    held as an array rather than an index."""
    x = np.asarray(doc_vectors, np.float32)
    x = x / np.maximum(np.linalg.norm(x, axis=1, keepdims=True), 1e-12)

    def search(q: np.ndarray, depth: int) -> tuple[np.ndarray, np.ndarray]:
        s = q @ x.T
        depth = min(depth, x.shape[0])
        top = np.argpartition(-s, depth - 1, axis=1)[:, :depth]
        order = np.argsort(-np.take_along_axis(s, top, 1), axis=1, kind="stable")
        docs = np.take_along_axis(top, order, 1)
        return docs, np.take_along_axis(s, docs, 1)

    return search


class _StoredTexts:
    """The stored documents' embedded texts, read by number on demand (a corpus is never held)."""

    def __init__(self, stored) -> None:
        self.stored = stored

    def __len__(self) -> int:
        return len(self.stored)

    def __getitem__(self, number: int) -> str:
        return self.stored.document(int(number)).text


def pair_key(encoder_mode: str) -> str:
    """The manifest's name of the calibrated pair BM25 + ``encoder_mode``: ``"bm25+encoder"``."""
    return f"bm25+{encoder_mode}"


def calibrate_index(directory: Path, manifest, encoders: dict | None = None, tokenizer=None, n: int | None = None,
                    seed: int | None = None) -> dict | None:
    """The ``calibration`` record of the index in ``directory`` (indexer/calibration.py): for BM25
    paired with each sentence-encoder channel it holds, the fusion read off its own stored
    documents, ``{"version", "pairs": {"bm25+encoder": Calibration.to_dict(), ...}, "skipped"?}``;
    None where the index holds no BM25 or no encoder channel, or no stored documents.
    ``encoders``: {mode: SentenceEncoder} already loaded (a build's); the others are loaded from
    the manifest's records. ``tokenizer``: the backbone's, for a "tokens" analyser."""
    from indexer import calibration as cal
    from indexer.channels import sentence_encoder_specs, spec
    from indexer.lexical import make_analyzer
    from indexer.stored_documents import StoredDocuments

    encoder_rows = [s for s in sentence_encoder_specs() if s.record(manifest)]
    bm25 = spec("bm25")
    if bm25.record(manifest) is None or not encoder_rows or not manifest.documents:
        return None
    n = cal.DEFAULT_QUERIES if n is None else n
    seed = cal.DEFAULT_SEED if seed is None else seed
    texts = _StoredTexts(StoredDocuments.open(Path(directory), manifest.n_docs))
    analyze = make_analyzer(bm25.record(manifest)["analyzer"], tokenizer)
    lexical = LexicalChannel("bm25", bm25.open(Path(directory), manifest), analyze, texts, seed)
    pqs = cal.pseudo_queries(texts, n, seed)
    record: dict = {"version": cal.CALIBRATION_VERSION, "n_docs": manifest.n_docs, "pairs": {}}
    if len(pqs) < cal.MIN_QUERIES:
        record["skipped"] = f"{len(pqs)} pseudo-queries drawn from {manifest.n_docs} documents (at least {cal.MIN_QUERIES} needed)"
        return record
    for row in encoder_rows:
        encoder = (encoders or {}).get(row.mode) or row.load_encoder(manifest)
        dense = row.open(Path(directory), manifest)
        channel = EmbeddingChannel(row.mode, encoder.encode, dense.search)
        record["pairs"][pair_key(row.mode)] = cal.choose([lexical, channel], pqs, seed=seed).to_dict()
    return record


def record_calibration(directory: Path, manifest, encoders: dict | None = None, tokenizer=None):
    """``manifest`` with the index's calibration (:func:`calibrate_index`) recorded and written
    to ``directory`` (a staged index, before it is published), its seconds in ``build``; the
    manifest unchanged where the index has nothing to calibrate."""
    import time

    t0 = time.perf_counter()
    record = calibrate_index(directory, manifest, encoders, tokenizer)
    if record is None:
        return manifest
    manifest.calibration = record
    took = time.perf_counter() - t0
    # part of the build: its seconds (and the throughput beir-eval reports from them) count it
    manifest.build = {**manifest.build, "calibration_seconds": round(took, 3),
                      "seconds": round(float(manifest.build.get("seconds", 0.0)) + took, 3)}
    manifest.write(Path(directory))
    return manifest


RECALIBRATE_SHARE = 0.1  # an update recalibrates once this share of the documents calibrated on has changed


def stale(manifest, changed: int) -> bool:
    """Whether an update changing ``changed`` documents (added + replaced + deleted) should
    calibrate again: no calibration yet, or the documents changed since the last one would pass
    :data:`RECALIBRATE_SHARE` of those it was read off."""
    old = manifest.calibration
    if not isinstance(old, dict) or not old.get("pairs"):
        return True
    return int(old.get("changed_since", 0)) + changed > RECALIBRATE_SHARE * int(old.get("n_docs", manifest.n_docs))


def carried(manifest, changed: int) -> dict | None:
    """``manifest``'s calibration carried into an update's generation, ``changed`` more documents
    counted against it (None where there was none)."""
    old = manifest.calibration
    if not isinstance(old, dict):
        return None
    return {**old, "changed_since": int(old.get("changed_since", 0)) + changed}
