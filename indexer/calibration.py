"""Self-calibrating fusion: how much each channel deserves on *this* corpus, measured without labels.

A fusion weight chosen on a handful of test collections transfers badly: on the five shared
collections MiniLM alone scores 0.99-1.18x BM25, so every fixed setting chosen there leans on the
encoder, and on collections where the encoder is 0.82-0.95x BM25 the same setting loses to plain
BM25 + MiniLM. The weight has to be read off the corpus being indexed. Here it is read with
*pseudo-queries* (inverse cloze, Lee et al. 2019): a sentence is held out of a sampled document,
and each channel is asked to find the document it came from, the document scored *without* that
sentence (so that the exact words of the query are not a free match for BM25). Every fusion
setting of a small grid (min-max or max-normalised weighted sums over the channels, the methods
of retriever/fusion.py) is then scored by where it ranks the source documents (nDCG@10 with one
relevant document), and the best setting is the corpus's fusion. No qrels are read, ever.

The module is pure numpy over two small protocols, so that the same code calibrates an index's
own channels (:mod:`indexer.calibration_channels`, at build and update time) and any channel a
study puts beside them (another encoder, a damaged analyser).
"""
from __future__ import annotations

import itertools
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Protocol

import numpy as np

CALIBRATION_VERSION = 2  # 2: the fusion completes its candidates' scores (retriever/fusion.py "complete")
DEFAULT_QUERIES = 512  # pseudo-queries drawn (fewer where the corpus has fewer usable documents)
DEFAULT_SEED = 0
DEPTH = 100  # each channel's list depth, as the hybrid search fuses (retriever/hybrid.py FUSION_DEPTH)
COMPLETION_DEPTH = 1000  # how deep each list is read for the candidates' scores (retriever/fusion.py)
COMPLETE = True  # calibrated fusions complete their candidates' scores
METHODS = ("minmax", "max")
GRID_STEP = 0.1
# the selection rule (:func:`select`), chosen by experiments/calibration.py leaving each collection out
METHOD: str | None = None  # None: the best of either method
SHIFT = 0.1
MIN_QUERIES = 20  # below this the estimate is noise: the caller keeps its fixed setting
# a held-out sentence is a query of this many words; the rest of its document keeps at least REST_WORDS
QUERY_WORDS = (4, 48)
REST_WORDS = 12
SPAN_WORDS = 16  # the longest span held out of a text without sentences (a third of its words, at least QUERY_WORDS[0])
_SENTENCE_END = re.compile(r"(?<=[.!?])\s+|\n+")


class CalibrationChannel(Protocol):
    """One channel as calibration asks it: its top documents for queries over the whole corpus,
    and the score it would give each query against a text (a document with its sentence held out)."""

    name: str

    def search(self, queries: Sequence[str], depth: int) -> list[tuple[np.ndarray, np.ndarray]]:
        """Per query, (doc numbers, scores) best first; -1 pads a short list."""
        ...

    def score(self, queries: Sequence[str], texts: Sequence[str]) -> np.ndarray:
        """The score of ``queries[i]`` against ``texts[i]``, in the units of :meth:`search`."""
        ...


@dataclass(frozen=True)
class PseudoQuery:
    doc: int  # the source document's number
    query: str  # a sentence held out of it
    rest: str  # the document without that sentence


def sentences(text: str) -> list[str]:
    """``text`` cut after sentence ends and at line breaks (titles are lines of their own)."""
    return [s.strip() for s in _SENTENCE_END.split(text) if s.strip()]


def pseudo_queries(texts: Sequence[str], n: int = DEFAULT_QUERIES, seed: int = DEFAULT_SEED) -> list[PseudoQuery]:
    """Up to ``n`` pseudo-queries, one per sampled document (reproducible from ``seed``): a
    sentence of QUERY_WORDS words held out of a document that keeps at least REST_WORDS words
    (:func:`_hold_out`)."""
    rng = np.random.default_rng(seed)
    out: list[PseudoQuery] = []
    for d in rng.permutation(len(texts)).tolist():
        held = _hold_out(texts[d], rng)
        if held is not None:
            out.append(PseudoQuery(d, *held))
            if len(out) == n:
                break
    return out


def _hold_out(text: str, rng: np.random.Generator) -> tuple[str, str] | None:
    """(a sentence of ``text``, the rest), or None where it has no usable sentence. A text without
    sentence ends (some collections strip punctuation) gives a third of its words as the query (at
    most SPAN_WORDS), a contiguous span at a random place."""
    parts = sentences(text)
    if len(parts) >= 2:
        usable = [i for i, s in enumerate(parts) if QUERY_WORDS[0] <= len(s.split()) <= QUERY_WORDS[1]]
        if not usable:
            return None
        i = usable[int(rng.integers(len(usable)))]
        query, rest = parts[i], " ".join(parts[:i] + parts[i + 1:])
    else:
        words = text.split()
        span = min(max(len(words) // 3, QUERY_WORDS[0]), SPAN_WORDS)
        if len(words) < span + REST_WORDS:
            return None
        at = int(rng.integers(len(words) - span + 1))
        query, rest = " ".join(words[at:at + span]), " ".join(words[:at] + words[at + span:])
    return (query, rest) if len(rest.split()) >= REST_WORDS else None


def held_out_lists(channel: CalibrationChannel, pqs: Sequence[PseudoQuery], depth: int = DEPTH) -> list[tuple[np.ndarray, np.ndarray]]:
    """``channel``'s list for each pseudo-query, with its source document scored as the rest of
    its text: taken out where the full document was found, put back where the rest scores into
    the top ``depth`` (COMPLETION_DEPTH for a completed fusion, which reads the first DEPTH)."""
    lists = channel.search([p.query for p in pqs], depth + 1)
    own = np.asarray(channel.score([p.query for p in pqs], [p.rest for p in pqs]), np.float64)
    out = []
    for p, (docs, scores), s in zip(pqs, lists, own):
        docs, scores = np.asarray(docs), np.asarray(scores, np.float64)
        keep = (docs >= 0) & (docs != p.doc)
        docs, scores = docs[keep][:depth], scores[keep][:depth]
        if len(docs) < depth or s > scores[-1]:
            at = int(np.searchsorted(-scores, -s, side="right"))
            docs = np.insert(docs, at, p.doc)[:depth]
            scores = np.insert(scores, at, s)[:depth]
        out.append((docs, scores))
    return out


@dataclass(frozen=True)
class Setting:
    """One fusion setting of the grid: a method of retriever/fusion.py and a weight per channel."""

    method: str
    weights: tuple[float, ...]

    def as_fusion(self, channels: Sequence[str], complete: bool = COMPLETE) -> dict:
        """The setting as a Retriever fusion dict (retriever/fusion.py: ``{"method", "weights"}``,
        and ``"complete": true`` where it completes its candidates' scores)."""
        fusion = {"method": self.method, "weights": {c: w for c, w in zip(channels, self.weights) if w > 0}}
        return {**fusion, "complete": True} if complete else fusion


def grid(n_channels: int, step: float = GRID_STEP, methods: Sequence[str] = METHODS) -> list[Setting]:
    """Every method of ``methods`` with weights on the simplex of ``step``, one channel alone included."""
    units = round(1 / step)
    combos = [c for c in itertools.product(range(units + 1), repeat=n_channels) if sum(c) == units]
    return [Setting(m, tuple(round(u * step, 10) for u in c)) for m in methods for c in combos]


def _normalised(scores: np.ndarray, method: str) -> np.ndarray:
    """retriever/fusion.py's normalisation of one list (min-max, or divided by its top score)."""
    if scores.size == 0:
        return scores
    hi, lo = float(scores.max()), float(scores.min())
    if method == "max" and hi > 0:
        return scores / hi
    return (scores - lo) / (hi - lo) if hi > lo else np.ones_like(scores)


def source_ranks(lists: Sequence[Sequence[tuple[np.ndarray, np.ndarray]]], pqs: Sequence[PseudoQuery], settings: Sequence[Setting],
                 depth: int | None = DEPTH) -> np.ndarray:
    """(settings, queries) rank (1 = first) of each pseudo-query's source document in the fused
    list, as retriever/fusion.py fuses (ties go to the smaller doc number); 0 where no channel
    found it. ``depth``: the candidates are each list's first ``depth`` documents, scored by every
    channel from its whole (deeper) list, as a completed fusion does; None: every listed document,
    0 from a list that lacks it."""
    ranks = np.zeros((len(settings), len(pqs)), np.int64)
    methods = {s.method for s in settings}
    for j, p in enumerate(pqs):
        per_channel = [(np.asarray(ch[j][0]), np.asarray(ch[j][1], np.float64)) for ch in lists]
        per_channel = [(d[d >= 0], s[d >= 0], bool((d >= 0).all())) for d, s in per_channel]
        tops = [d if depth is None else d[:depth] for d, _, _ in per_channel]
        union = np.unique(np.concatenate(tops)) if tops else np.zeros(0, np.int64)
        if p.doc not in union:
            continue
        src = int(np.searchsorted(union, p.doc))
        listed = np.zeros((len(lists), union.size), bool)  # which channel's fused part holds each document
        for c, top in enumerate(tops):
            listed[c, np.searchsorted(union, top)] = True
        by_method = {m: np.vstack([channel_values(d, s, full, union, m, depth) for d, s, full in per_channel]) for m in methods}
        for i, s in enumerate(settings):
            weights = np.asarray(s.weights)
            fused = weights @ by_method[s.method]
            present = listed[weights > 0].any(axis=0)  # a channel weighted 0 is not read at all
            if not present[src]:
                continue
            ahead = (present & (fused > fused[src])).sum() + (present & (fused == fused[src]) & (union < p.doc)).sum()
            ranks[i, j] = 1 + ahead
    return ranks


def channel_values(docs: np.ndarray, scores: np.ndarray, full: bool, union: np.ndarray, method: str, depth: int | None) -> np.ndarray:
    """One channel's normalised value for each document of ``union`` (sorted), the one rule of
    calibration and of retriever/fusion.py's completed fusion: normalised over the list's first
    ``depth`` (all of it for None); where ``depth`` is given, a document below that gets its own
    score from the rest of the list, and one below the whole list the list's last score where it
    is ``full`` (cut at its depth), else 0 (it ended early: the rest match nothing); for None, 0."""
    out = np.zeros(union.size)
    if docs.size == 0:
        return out
    top = scores if depth is None else scores[:depth]
    if depth is None:
        out[np.searchsorted(union, docs)] = _normalised(top, method)
        return out
    hi, lo = float(top.max()), float(top.min())
    order = np.argsort(docs, kind="stable")
    at = np.minimum(np.searchsorted(docs[order], union), docs.size - 1)
    found = docs[order][at] == union
    raw = np.where(found, scores[order][at], float(scores[-1]) if full else 0.0)
    if method == "max" and hi > 0:
        return raw / hi
    return (raw - lo) / (hi - lo) if hi > lo else np.where(raw >= hi, 1.0, 0.0)


def ndcg_at_10(ranks: np.ndarray) -> np.ndarray:
    """nDCG@10 with one relevant document at each rank (0: not found)."""
    return np.where((ranks >= 1) & (ranks <= 10), 1.0 / np.log2(np.maximum(ranks, 1) + 1), 0.0)


@dataclass
class Calibration:
    """What calibration chose and the evidence: each setting's pseudo-query nDCG@10."""

    channels: tuple[str, ...]
    fusion: dict
    n_queries: int
    seed: int
    scores: dict[str, float] = field(default_factory=dict)  # the best settings' mean pseudo nDCG@10, by label
    alone: dict[str, float] = field(default_factory=dict)  # each channel alone
    version: int = CALIBRATION_VERSION

    def to_dict(self) -> dict:
        return {
            "version": self.version, "channels": list(self.channels), "fusion": self.fusion, "n_queries": self.n_queries,
            "seed": self.seed, "pseudo_ndcg10": self.scores, "alone": self.alone,
        }  # fmt: skip

    def why(self) -> str:
        """One line: what was chosen and on what evidence."""
        alone = ", ".join(f"{c} {v:.3f}" for c, v in self.alone.items())
        best = next(iter(self.scores.values()), float("nan"))
        return (f"calibrated on this corpus: {self.n_queries} held-out sentences (seed {self.seed}) found by each channel alone "
                f"({alone}, nDCG@10) and fused ({best:.3f} at the chosen setting)")


def label(setting: Setting, channels: Sequence[str]) -> str:
    used = ", ".join(f"{c} {w:g}" for c, w in zip(channels, setting.weights) if w > 0)
    return f"{setting.method}({used})"


def select(scores: np.ndarray, settings: Sequence[Setting], method: str | None = METHOD, shift: float = SHIFT) -> int:
    """The index in ``settings`` of the corpus's fusion, from each setting's pseudo-query nDCG@10
    ``scores``: the best of ``method``'s settings (None: of every setting; among equals the first), its first channel's
    (BM25's) weight then moved ``shift`` to the second (the encoder), each kept at least one grid step.

    Why the shift: a held-out sentence shares its document's exact words (its morphology, its
    names), which a query written by someone else does not, so pseudo-queries overrate BM25
    against the encoder by about one grid step: measured over 5 collections x 3 encoders x 2 BM25
    analysers (experiments/calibration.py), the pseudo-best weight is BM25-heavier than the
    qrels' best by a roughly constant amount, whatever the encoder."""
    candidates = [i for i, s in enumerate(settings) if method is None or s.method == method] or list(range(len(settings)))
    best = max(candidates, key=lambda i: (scores[i], -i))
    weights = list(settings[best].weights)
    if len(weights) == 2:
        # a hybrid keeps both channels: one alone is never the answer (no oracle of the study was one)
        weights[0] = float(np.clip(round(weights[0] - shift, 10), GRID_STEP, 1 - GRID_STEP))
        weights[1] = round(1 - weights[0], 10)
        target = [i for i in candidates if settings[i].method == settings[best].method and np.allclose(settings[i].weights, weights)]
        if target:
            return target[0]
    return best


def choose(channels: Sequence[CalibrationChannel], pqs: Sequence[PseudoQuery], settings: Sequence[Setting] | None = None,
           depth: int = DEPTH, seed: int = DEFAULT_SEED, with_ranks: bool = False, complete: bool = COMPLETE) -> Calibration | tuple[Calibration, np.ndarray]:
    """The corpus's fusion over ``channels`` (the lexical one first): every setting of ``settings``
    (default :func:`grid`) scored by where it ranks the pseudo-queries' sources (mean nDCG@10),
    one chosen by :func:`select`. ``with_ranks``: also the (settings, pseudo-queries) ranks
    (:func:`source_ranks`), for a study judging other rules."""
    names = tuple(c.name for c in channels)
    settings = list(settings) if settings is not None else grid(len(channels))
    lists = [held_out_lists(c, pqs, max(COMPLETION_DEPTH, depth) if complete else depth) for c in channels]
    ranks = source_ranks(lists, pqs, settings, depth if complete else None)
    scores = ndcg_at_10(ranks).mean(axis=1)
    picked = select(scores, settings)
    order = np.argsort(-scores, kind="stable")
    single = [Setting("minmax", tuple(1.0 if i == c else 0.0 for i in range(len(names)))) for c in range(len(names))]
    alone = ndcg_at_10(source_ranks(lists, pqs, single, depth if complete else None)).mean(axis=1)
    chosen = Calibration(
        names, settings[picked].as_fusion(names, complete), len(pqs), seed,
        {label(settings[i], names): round(float(scores[i]), 4) for i in [picked, *[j for j in order[:4].tolist() if j != picked]]},
        {n: round(float(v), 4) for n, v in zip(names, alone)},
    )  # fmt: skip
    return (chosen, ranks) if with_ranks else chosen


def calibrate(channels: Sequence[CalibrationChannel], texts: Sequence[str], n: int = DEFAULT_QUERIES, seed: int = DEFAULT_SEED,
              settings: Sequence[Setting] | None = None) -> Calibration | None:
    """The corpus ``texts``' fusion over ``channels`` (:func:`choose` on :func:`pseudo_queries`);
    None where fewer than MIN_QUERIES pseudo-queries can be drawn (too few documents, or texts
    of one sentence): the caller keeps its fixed setting and says so."""
    pqs = pseudo_queries(texts, n, seed)
    if len(pqs) < MIN_QUERIES or len(channels) < 2:
        return None
    return choose(channels, pqs, settings, seed=seed)
