"""The one term-at-a-time driver (indexer/term_at_a_time.py): every registered doc layout, at every
impact width it takes, gives the brute-force ranking bit for bit (the same documents, the same
float32 scores, ties to the lower doc number), whichever way the accumulators are ranked, one query
or many, in one piece or split; and a layout defined outside the package plugs in with its module
alone (a scan and a registration)."""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest

from indexer import kernels, term_at_a_time
from indexer.codec import DOC_LAYOUTS, IMPACT_WIDTHS
from indexer.doc_numbers import DocNumbers
from indexer.inverted_index import InvertedIndex
from indexer.range_docs import RANGE


def random_lists(rng: np.random.Generator, n_lists: int, n_docs: int) -> list[np.ndarray]:
    """Posting lists of every kind: empty, one posting, every document, long ones across blocks of 128."""
    out = [np.zeros(0, np.int32), np.arange(n_docs, dtype=np.int32)]
    for _ in range(n_lists):
        size = int(rng.choice([0, 1, 3, 40, 200, 700]))
        out.append(np.sort(rng.choice(n_docs, min(size, n_docs), replace=False)).astype(np.int32))
    return out


def random_index(rng: np.random.Generator, n_docs: int, n_lists: int = 30) -> InvertedIndex:
    """float32 weights that are small integers and halves (many exact ties), negative ones too."""
    lists = random_lists(rng, n_lists, n_docs)
    indptr = np.concatenate([[0], np.cumsum([len(x) for x in lists])]).astype(np.int64)
    docs = np.concatenate(lists).astype(np.int32)
    weights = (rng.integers(-2, 9, docs.shape[0]) / 2).astype(np.float32)
    weights[weights == 0] = 1.0
    return InvertedIndex(indptr, docs, weights, n_docs)


def with_width(index: InvertedIndex, bits: int) -> InvertedIndex:
    if bits == 32:
        return index
    q = index.quantise(levels=16 if bits == 4 else 256)
    return q.to_nibbles() if bits == 4 else q


def brute_force(index: InvertedIndex, tokens: np.ndarray, weights: np.ndarray, k: int):
    """Every posting of every query token added to its document in query order, in float32 as the
    driver does (``q * w``; quantised: ``(q * scale) * code + q * offset``); then all touched
    documents sorted by score, ties to the lower doc number."""
    docs = index.doc_numbers()
    codes = kernels.unpack_nibbles(index.weights, docs.shape[0]) if index.nibbles else index.weights
    scores = np.zeros(index.n_docs, np.float32)
    touched = np.zeros(index.n_docs, bool)
    for t, q in zip(tokens, weights):
        if not 0 <= t < index.vocab_size:
            continue
        s = slice(index.indptr[t], index.indptr[t + 1])
        if index.quantised:
            add = np.float32(q * index.scale[t]) * codes[s].astype(np.float32) + np.float32(q * index.offset[t])
        else:
            add = np.float32(q) * codes[s]
        scores[docs[s]] += add.astype(np.float32)
        touched[docs[s]] = True
    cand = np.flatnonzero(touched)
    order = np.lexsort((cand, -scores[cand]))[:k]
    return cand[order].astype(np.int32), scores[cand[order]]


def queries(rng: np.random.Generator, vocab: int, n: int = 12) -> list[tuple[np.ndarray, np.ndarray]]:
    out = [(np.zeros(0, np.int64), np.zeros(0, np.float32)), (np.array([0, -1, vocab + 3], np.int64), np.ones(3, np.float32))]
    for i in range(n):
        m = int(rng.integers(1, 12))
        tokens = rng.integers(-1, vocab + 1, m).astype(np.int64)
        tokens[0] = 1  # every document: a query whose plan is the one pass
        if m > 2:
            tokens[2] = tokens[1]  # a duplicate token
        w = (rng.integers(1, 5, m) / 2).astype(np.float32)
        if i % 3 == 2:
            w[-1] = -w[-1]  # a negative weight: no positive-query shortcut
        out.append((tokens, w))
    return out


def layouts_and_widths():
    for name, layout in DOC_LAYOUTS.items():
        for bits in IMPACT_WIDTHS:
            if bits == 32 and not layout.float_weights:
                continue
            yield name, bits


@pytest.mark.parametrize(("layout", "bits"), list(layouts_and_widths()))
@pytest.mark.parametrize("n_docs", [1, 300, RANGE + 700])
def test_every_layout_and_width_gives_the_brute_force_ranking(layout, bits, n_docs):
    rng = np.random.default_rng(n_docs + bits)
    index = with_width(random_index(rng, n_docs, 8 if n_docs > RANGE else 30), bits)
    coded = index.with_layout(layout)
    assert coded.doc_layout == DOC_LAYOUTS[layout].name and coded.impact_bits == bits
    args = (coded.indptr, coded.weights, coded.scale, coded.offset)
    qs = queries(rng, index.vocab_size)
    for k in (0, 1, 10, n_docs + 5):
        for tokens, w in qs:
            want = brute_force(index, tokens, w, k)
            got = [coded.search(tokens, w, k)]
            for whole_from in (0.0, np.inf):  # the one pass over every accumulator, or the touched list, forced
                got.append(coded.numbers.search(*args, tokens, w, n_docs, k, whole_from=whole_from))
                for parts in (2, 3):  # split over threads, windows crossing blocks
                    got.append(term_at_a_time.search(coded.numbers.postings, *args, tokens, w, n_docs, k, parts, True, whole_from))
            for d, s in got:
                np.testing.assert_array_equal(d, want[0])
                np.testing.assert_array_equal(s, want[1])
        docs, scores = coded.batch_search(qs, k)
        for i, (tokens, w) in enumerate(qs):
            want = brute_force(index, tokens, w, k)
            n = want[0].shape[0]
            np.testing.assert_array_equal(docs[i, :n], want[0])
            np.testing.assert_array_equal(scores[i, :n], want[1])
            assert np.all(docs[i, n:] == -1) and np.all(np.isneginf(scores[i, n:]))


# ---------------------------------------------------------------- a layout from outside the package
def _scan_reversed(postings, indptr, t, lo, hi, buf, codes, qa, qb, scores, seen, touched, n_touched, flags, whole):
    """A toy layout: each list's doc numbers stored as ``n_docs - 1 - doc`` (descending), int64."""
    flipped, top = postings[1], postings[2]
    for p in range(indptr[t], indptr[t + 1]):
        d = top - flipped[p]
        if lo <= d < hi:
            buf[0] = d
            n_touched = term_at_a_time.add_postings(buf, 0, lo, codes, p, 1, qa, qb, scores, seen, touched, n_touched, flags, whole)
    return n_touched


REVERSED = term_at_a_time.register("test-reversed", _scan_reversed, __file__, scratch=1)


@dataclass
class ReversedDocs(DocNumbers):
    flipped: np.ndarray
    top: int
    layout = "test-reversed"

    @property
    def postings(self) -> tuple:
        return (REVERSED, self.flipped, np.int64(self.top))

    def decode(self, indptr: np.ndarray) -> np.ndarray:
        return (self.top - self.flipped).astype(np.int32)


def test_a_layout_is_its_scan_and_a_registration():
    rng = np.random.default_rng(3)
    for bits in IMPACT_WIDTHS:
        index = with_width(random_index(rng, 500), bits)
        toy = InvertedIndex(index.indptr, ReversedDocs(index.n_docs - 1 - index.docs.astype(np.int64), index.n_docs - 1), index.weights,
                            index.n_docs, index.scale, index.offset)
        qs = queries(rng, index.vocab_size)
        for tokens, w in qs:
            for parts in (1, 3):
                got = toy.numbers.search(toy.indptr, toy.weights, toy.scale, toy.offset, tokens, w, toy.n_docs, 10, parts)
                want = brute_force(index, tokens, w, 10)
                np.testing.assert_array_equal(got[0], want[0])
                np.testing.assert_array_equal(got[1], want[1])
        for got, want in zip(toy.batch_search(qs, 7), index.batch_search(qs, 7)):
            np.testing.assert_array_equal(got, want)


def test_the_tag_names_the_layout_and_its_source():
    """A scan's module edited is a new tag: the driver's cached kernels are not reused for it."""
    field = next(iter(REVERSED.dtype.fields))
    assert REVERSED.shape == (0,) and field.startswith("test-reversed:") and len(field.split(":")[1]) == 16
    other = term_at_a_time.register("test-reversed", _scan_reversed, Path(__file__).with_name("conftest.py"), scratch=1)
    assert other.dtype != REVERSED.dtype
