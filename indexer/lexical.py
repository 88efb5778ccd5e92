"""The lexical channel: BM25 computed by this engine's own inverted index (no JVM).

BM25 fits the same kernel as aligned tokens: a document's weight for a term is its full
BM25 term score, precomputed at index time, and a query term weighs its count in the query;
the sum over matched terms is then exactly BM25. Scoring follows Lucene's BM25Similarity
(what Pyserini uses): idf = ln(1 + (N - df + 0.5) / (df + 0.5)), tf part
tf / (tf + k1 (1 - b + b dl / avgdl)), with Anserini's defaults k1 = 0.9, b = 0.4.

Two analysers: "words" (Lucene's English analyser in spirit: lowercase, Unicode word
tokens, Lucene's English stop words, Porter stemming via PyStemmer) and "tokens" (the
backbone's own tokenizer, lowercased input).
"""
from __future__ import annotations

import json
import re
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from indexer.codec import FLOAT32, PostingsCodec
from indexer.diskspace import write_bytes
from indexer.errors import IndexFormatError
from indexer.integrity import is_finite_number, read_json
from indexer.inverted_index import InvertedIndex

# org.apache.lucene.analysis.en.EnglishAnalyzer.ENGLISH_STOP_WORDS_SET
LUCENE_STOPWORDS = frozenset(
    ["a", "an", "and", "are", "as", "at", "be", "but", "by", "for", "if", "in", "into", "is", "it", "no", "not", "of", "on", "or", "such", "that", "the", "their", "then", "there", "these", "they", "this", "to", "was", "will", "with"]
)
# a word, with an apostrophe inside it kept (don't, cat's), as Lucene's StandardTokenizer does
_WORD = re.compile(r"\w+(?:'\w+)*", re.UNICODE)
LEXICAL_DIR = "lexical"
BM25_FILE = "bm25.json"


class WordAnalyzer:
    """lowercase -> words -> drop a trailing possessive 's, stop words -> Porter stem
    (words of one or two letters are left unstemmed, as Lucene's PorterStemmer does)."""

    name = "words"

    def __init__(self) -> None:
        import Stemmer

        self._stem = Stemmer.Stemmer("porter").stemWord

    def __call__(self, text: str) -> list[str]:
        out = []
        for w in _WORD.findall(text.lower()):
            w = w.removesuffix("'s")
            if w and w not in LUCENE_STOPWORDS:
                out.append(self._stem(w) if len(w) > 2 else w)
        return out


class BackboneTokenAnalyzer:
    """The backbone tokenizer's sub-word tokens of the lowercased text."""

    name = "tokens"

    def __init__(self, tokenizer) -> None:
        self.tokenizer = tokenizer

    def __call__(self, text: str) -> list[str]:
        return self.tokenizer.tokenize(" " + text.lower())


@dataclass
class BM25Index:
    """BM25 over a term vocabulary of its own, stored as an :class:`InvertedIndex`."""

    postings: InvertedIndex
    vocab: dict[str, int]
    k1: float
    b: float
    analyzer: str

    @classmethod
    def build(cls, texts: Iterable[str], analyze, k1: float = 0.9, b: float = 0.4) -> BM25Index:
        builder = BM25Builder(analyze, k1, b)
        for text in texts:
            builder.add(text)
        return builder.finish()

    def encode_query(self, terms: Sequence[str]) -> tuple[np.ndarray, np.ndarray, list[str]]:
        """Known query terms with their counts as weights (Lucene's bag-of-words boosts)."""
        counts = Counter(t for t in terms if t in self.vocab)
        names = list(counts)
        return (
            np.asarray([self.vocab[t] for t in names], np.int64),
            np.asarray([counts[t] for t in names], np.float32),
            names,
        )

    def save(self, directory: Path) -> None:
        directory.mkdir(parents=True, exist_ok=True)
        self.postings.save(directory)
        meta = {"k1": self.k1, "b": self.b, "analyzer": self.analyzer, "vocab": self.vocab}
        write_bytes(directory / BM25_FILE, json.dumps(meta, ensure_ascii=False).encode("utf-8"))

    @classmethod
    def load(cls, directory: Path, n_docs: int, n_terms: int | None = None, analyzer: str | None = None, codec: PostingsCodec = FLOAT32) -> BM25Index:
        """Open a saved BM25 index, checked: parameters in range, term ids exactly 0..n-1 (they
        index the posting lists), postings valid with positive weights. ``n_terms`` and
        ``analyzer``: what the manifest records; ``codec``: how the postings are stored (indexer/codec.py: what the manifest's record names)."""
        path = Path(directory) / BM25_FILE
        meta = read_json(path)
        if not isinstance(meta, dict) or not {"k1", "b", "analyzer", "vocab"} <= set(meta):
            raise IndexFormatError(f"{path}: needs an object with k1, b, analyzer and vocab")
        if not (is_finite_number(meta["k1"]) and meta["k1"] >= 0 and is_finite_number(meta["b"]) and 0 <= meta["b"] <= 1):
            raise IndexFormatError(f"{path}: k1 {meta['k1']!r} / b {meta['b']!r} out of range (k1 >= 0, 0 <= b <= 1)")
        if not isinstance(meta["analyzer"], str) or (analyzer is not None and meta["analyzer"] != analyzer):
            raise IndexFormatError(f"{path}: analyzer {meta['analyzer']!r}, the manifest records {analyzer!r}")
        vocab = meta["vocab"]
        if not isinstance(vocab, dict) or not all(isinstance(i, int) and not isinstance(i, bool) for i in vocab.values()):
            raise IndexFormatError(f"{path}: vocab is not an object of term -> integer id")
        if n_terms is not None and len(vocab) != n_terms:
            raise IndexFormatError(f"{path}: {len(vocab)} terms, the manifest records {n_terms}")
        ids = np.fromiter(vocab.values(), np.int64, len(vocab))
        if ids.size and (ids.min() < 0 or ids.max() >= len(vocab) or np.bincount(ids).max() > 1):
            raise IndexFormatError(f"{path}: term ids are not 0..{len(vocab) - 1}, each once")
        postings = InvertedIndex.load(directory, n_docs, n_lists=len(vocab), positive=True, codec=codec)
        return cls(postings, vocab, meta["k1"], meta["b"], meta["analyzer"])


class BM25Builder:
    """Accumulates term counts document by document (a corpus is streamed, never held)."""

    def __init__(self, analyze, k1: float = 0.9, b: float = 0.4) -> None:
        self.analyze, self.k1, self.b = analyze, k1, b
        self.vocab: dict[str, int] = {}
        self._docs: list[np.ndarray] = []
        self._terms: list[np.ndarray] = []
        self._tfs: list[np.ndarray] = []
        self._lengths: list[int] = []

    def add(self, text: str) -> None:
        terms = self.analyze(text)
        counts = Counter(terms)
        d = len(self._lengths)
        self._lengths.append(len(terms))
        self._docs.append(np.full(len(counts), d, np.int64))
        self._terms.append(np.fromiter((self.vocab.setdefault(t, len(self.vocab)) for t in counts), np.int64, len(counts)))
        self._tfs.append(np.fromiter(counts.values(), np.float64, len(counts)))

    def finish(self) -> BM25Index:
        n_docs, n_terms = len(self._lengths), len(self.vocab)
        cat = lambda xs, dt: np.concatenate(xs) if xs else np.zeros(0, dt)
        doc, term, tf = cat(self._docs, np.int64), cat(self._terms, np.int64), cat(self._tfs, np.float64)
        dl = np.asarray(self._lengths, np.float64)
        df = np.bincount(term, minlength=n_terms).astype(np.float64)
        idf = np.log(1.0 + (n_docs - df + 0.5) / (df + 0.5))
        norm = self.k1 * (1.0 - self.b + self.b * dl / max(float(dl.mean()) if n_docs else 1.0, 1e-9))
        weight = idf[term] * tf / (tf + norm[doc])
        order = np.lexsort((doc, term))  # by term, then doc: posting lists sorted by doc
        indptr = np.zeros(n_terms + 1, np.int64)
        np.cumsum(np.bincount(term, minlength=n_terms), out=indptr[1:])
        postings = InvertedIndex(indptr, doc[order].astype(np.int32), weight[order].astype(np.float32), n_docs)
        return BM25Index(postings, self.vocab, self.k1, self.b, getattr(self.analyze, "name", "custom"))


def make_analyzer(name: str, tokenizer=None):
    """"words" (stemmed words) or "tokens" (the backbone tokenizer's sub-words)."""
    if name == "words":
        return WordAnalyzer()
    if name == "tokens":
        if tokenizer is None:
            raise ValueError("the 'tokens' analyser needs the backbone tokenizer")
        return BackboneTokenAnalyzer(tokenizer)
    raise ValueError(f"unknown lexical analyser {name!r} (words, tokens)")
