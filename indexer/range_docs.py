"""Doc numbers of posting lists as 16-bit offsets within ranges of 65,536 documents (issue 53; format 5).

The documents are cut into ranges of :data:`RANGE` (65,536) consecutive doc numbers. A posting
keeps only its doc number's low 16 bits (``postings_low.npy``, uint16); which range it lies in
follows from ``postings_rangestart.npy`` (uint32, one row per posting list, n_ranges + 1 columns):
row t holds, for each range r, how many of list t's postings come before range r (so column 0 is
0 and the last column is the list's length). The postings stay where the unpacked index has them
(token-major, doc numbers ascending within a list), so the 8-bit impact codes, ``postings_indptr``
and everything that reads a list by token are unchanged; only the doc numbers shrink, from 4 bytes
a posting to 2 (plus 4 bytes a list and range: 3 bytes a document at 10M documents and 49,152 lists).

Why ranges rather than deltas (format 4, indexer/packed_docs.py): a posting decodes with one
16-bit load and no arithmetic carried from the posting before, so the scoring loop is format 3's;
and the search is split by range anyway (indexer/kernels.py: a range's accumulators, 65,536 x 5
bytes, stay in a core's L2 cache), so the table that cuts each list by range is the split's binary
searches done once, at build. Format 4 is smaller (about 1 byte a doc number on aligned-token lists)
but about twice as slow a posting; format 5 is the one that fits ten million synthetic 512-token
documents in 24 GB (3 bytes a posting with the impact code: 15.4 GB), and it scans 1.4x faster than
format 3 (a million synthetic documents: benchmarks/results/scale/one-million-format-5.json).

Search (:meth:`RangeDocs.search`: indexer/term_at_a_time.py's driver, its windows the ranges, with
:func:`_scan`): every range is scored into accumulators of its own (the two ways of
indexer/kernels.py: a touched list or one pass, chosen for the whole query) and keeps its top k;
the ranges' lists are merged. Ranges run in parallel over Numba's threads with ``parallel`` True,
one after another otherwise. Each document is scored by one range with its query tokens added in
the same order as the int32 layout's search, so the ranking and the scores are format 3's, bit for
bit (tests/test_range_docs.py). With quantised impacts only (a compact index; 8 or 4 bits).
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numba as nb
import numpy as np

from indexer import term_at_a_time
from indexer.diskspace import save_npy
from indexer.doc_numbers import DocLayout, DocNumbers
from indexer.errors import IndexFormatError
from indexer.integrity import load_npy
from indexer.kernels import SCAN_WHOLE_FROM, code_at

NAME = "range16"  # the codec's name (indexer/codec.py)
RANGE_BITS = 16
RANGE = 1 << RANGE_BITS
FILES = ("rangestart", "low")  # postings_<name>.npy
_DTYPES = {"rangestart": "uint32", "low": "uint16"}


def n_ranges(n_docs: int) -> int:
    """Ranges of :data:`RANGE` documents that ``n_docs`` documents need (at least one)."""
    return max(1, -(-int(n_docs) // RANGE))


# --------------------------------------------------------------------- layout
@nb.njit(cache=True)
def _split(indptr, docs, starts, low):
    for t in range(indptr.shape[0] - 1):
        a, b = indptr[t], indptr[t + 1]
        r = 0
        for p in range(a, b):
            d = docs[p]
            while (d >> RANGE_BITS) > r:
                r += 1
                starts[t, r] = p - a
            low[p] = d & (RANGE - 1)
        for r2 in range(r + 1, starts.shape[1]):
            starts[t, r2] = b - a


@nb.njit(cache=True)
def decode_into(indptr, starts, low, out):
    """Every posting's doc number (int32) into ``out``."""
    for t in range(indptr.shape[0] - 1):
        a = indptr[t]
        for r in range(starts.shape[1] - 1):
            for p in range(a + starts[t, r], a + starts[t, r + 1]):
                out[p] = (r << RANGE_BITS) + np.int64(low[p])


@nb.njit(cache=True)
def _first_bad(indptr, starts, low, n_docs):
    """(list, posting, what) of the first inconsistency, or (-1, -1, 0): what 1: a row of the
    range table that does not rise from 0 to the list's length; 2: a doc number outside
    0..n_docs-1 or not above the one before it in its list."""
    n_r = starts.shape[1] - 1
    for t in range(indptr.shape[0] - 1):
        a, b = indptr[t], indptr[t + 1]
        if starts[t, 0] != 0 or starts[t, n_r] != b - a:
            return t, np.int64(-1), 1
        for r in range(n_r):
            if starts[t, r + 1] < starts[t, r]:
                return t, np.int64(-1), 1
        prev = np.int64(-1)
        for r in range(n_r):
            for p in range(a + starts[t, r], a + starts[t, r + 1]):
                d = (np.int64(r) << RANGE_BITS) + np.int64(low[p])
                if d <= prev or d >= n_docs:
                    return t, p, 2
                prev = d
    return np.int64(-1), np.int64(-1), 0


# --------------------------------------------------------------------- search (quantised impacts)
def _scan(postings, indptr, t, lo, hi, buf, codes, qa, qb, scores, seen, touched, n_touched, flags, whole):
    """List ``t``'s postings in range ``lo >> RANGE_BITS`` (the driver's windows are the ranges:
    ``[lo, hi)`` is one) to the range's accumulators (indexer/term_at_a_time.py): one run, read
    from the range table, its 16-bit offsets the accumulators' indices as they are."""
    starts, low = postings[1], postings[2]
    r = lo >> RANGE_BITS
    a = indptr[t] + starts[t, r]
    return term_at_a_time.add_postings(low, a, 0, codes, a, indptr[t] + starts[t, r + 1] - a, qa, qb, scores, seen, touched, n_touched, flags, whole)


TAG = term_at_a_time.register(NAME, _scan, __file__, window_bits=RANGE_BITS, positive_pass=True)


@nb.njit(cache=True)
def find(indptr, starts, low, t, doc):
    """The posting of ``doc`` in list ``t``, or -1: a binary search in the list's part in doc's range."""
    r = doc >> RANGE_BITS
    if doc < 0 or r >= starts.shape[1] - 1:
        return np.int64(-1)
    a, b = indptr[t] + starts[t, r], indptr[t] + starts[t, r + 1]
    want = doc & (RANGE - 1)
    p = a + np.searchsorted(low[a:b], want)
    if p < b and low[p] == want:
        return np.int64(p)
    return np.int64(-1)


# --------------------------------------------------------------------- the arrays
@dataclass
class RangeDocs(DocNumbers):
    """The range-blocked doc numbers of a CSR index (``indptr`` is the index's)."""

    starts: np.ndarray  # uint32 (n_lists, n_ranges + 1)
    low: np.ndarray  # uint16 (nnz,)
    layout = NAME

    @classmethod
    def split(cls, indptr: np.ndarray, docs: np.ndarray, n_docs: int, low: np.ndarray | None = None) -> RangeDocs:
        """Cut ``docs`` (ascending within each list of ``indptr``, as the index stores them);
        ``low``: where the 16-bit offsets go (a memory map, say), else a new array."""
        indptr = np.asarray(indptr, np.int64)
        if int(indptr[-1]) and (int(np.min(docs)) < 0 or int(np.max(docs)) >= n_docs):
            raise ValueError(f"doc numbers outside 0..{n_docs - 1}")
        starts = np.zeros((indptr.shape[0] - 1, n_ranges(n_docs) + 1), np.uint32)
        low = np.empty(docs.shape[0], np.uint16) if low is None else low
        _split(indptr, docs, starts, low)
        return cls(starts, low)

    def decode(self, indptr: np.ndarray) -> np.ndarray:
        """Every doc number (int32, nnz), as the unpacked index stores them."""
        out = np.empty(int(indptr[-1]), np.int32)
        decode_into(np.asarray(indptr, np.int64), self.starts, self.low, out)
        return out

    @property
    def nbytes(self) -> int:
        return int(self.starts.nbytes + self.low.nbytes)

    def save(self, directory: Path, prefix: str = "postings_") -> None:
        for name, a in zip(FILES, (self.starts, self.low)):
            save_npy(Path(directory) / f"{prefix}{name}.npy", a)

    @classmethod
    def load(cls, directory: Path, indptr: np.ndarray, n_docs: int, mmap: bool = True, prefix: str = "postings_") -> RangeDocs:
        """Open and check (before any kernel reads them): the table's shape against ``indptr``
        (already checked) and ``n_docs``, each row rising from 0 to its list's length, and every
        doc number in 0..n_docs-1 and ascending within its list; IndexFormatError naming the file otherwise."""
        f = {name: Path(directory) / f"{prefix}{name}.npy" for name in FILES}
        starts = load_npy(f["rangestart"], _DTYPES["rangestart"], 2, mmap=False)
        low = load_npy(f["low"], _DTYPES["low"], 1, mmap=mmap)
        indptr = np.asarray(indptr, np.int64)
        want = (indptr.shape[0] - 1, n_ranges(n_docs) + 1)
        if starts.shape != want:
            raise IndexFormatError(f"{f['rangestart']}: shape {starts.shape}, {want[0]} posting lists over {n_docs} documents need {want}")
        if low.shape[0] != int(indptr[-1]):
            raise IndexFormatError(f"{f['low']}: {low.shape[0]} doc numbers, the posting lists hold {int(indptr[-1])}")
        t, p, what = _first_bad(indptr, starts, low, n_docs)
        if what == 1:
            raise IndexFormatError(f"{f['rangestart']}: row {int(t)} does not rise from 0 to its posting list's length {int(indptr[t + 1] - indptr[t])}")
        if what == 2:
            raise IndexFormatError(f"{f['low']}: posting {int(p)} of list {int(t)} has a doc number outside 0..{n_docs - 1} "
                                   "or not above the one before it")
        return cls(np.ascontiguousarray(starts), low)

    @property
    def postings(self) -> tuple:
        return (TAG, self.starts, self.low)

    def search(self, indptr, codes, scale, offset, q_tokens, q_weights, n_docs, k, parts: int = 1, parallel: bool = False,
               whole_from: float = SCAN_WHOLE_FROM):
        """``parts`` > 1 (or ``parallel``): the ranges spread over Numba's threads (however many parts)."""
        return term_at_a_time.search(self.postings, indptr, codes, scale, offset, q_tokens, q_weights, n_docs, k, parts, parallel, whole_from)

    def find(self, indptr, t: int, doc: int) -> int:
        return int(find(indptr, self.starts, self.low, t, doc))

    def add_dropped(self, indptr, codes, scale, offset, cands, tokens, q_weights, scores) -> None:
        added = np.zeros(cands.shape[0], np.float32)
        _add_dropped(np.asarray(indptr, np.int64), self.starts, self.low, codes, scale, offset, np.asarray(cands, np.int32), tokens, q_weights, added)
        scores += added


@nb.njit(cache=True)
def _add_dropped(indptr, starts, low, codes, scale, offset, cands, tokens, q_weights, scores):
    """``scores[i] += q_weight * weight`` for each of ``tokens`` that document ``cands[i]`` holds
    (indexer/query_pruning.py's rescoring; 8-bit impacts): each lookup a binary search in the part
    of the token's list that lies in the candidate's range."""
    n_lists = indptr.shape[0] - 1
    for j in range(tokens.shape[0]):
        t = tokens[j]
        if t < 0 or t >= n_lists:
            continue
        for i in range(cands.shape[0]):
            p = find(indptr, starts, low, t, np.int64(cands[i]))
            if p >= 0:
                scores[i] += q_weights[j] * (offset[t] + scale[t] * np.float32(code_at(codes, p)))


def split_saved(directory: Path, n_docs: int) -> None:
    """Turn a saved ``postings_docs.npy`` (beside its ``postings_indptr.npy``) into the range files, and
    remove it. Both doc-number files are memory-mapped: memory is the range table, whatever the size."""
    from indexer.diskspace import allocate_npy

    directory = Path(directory)
    indptr = load_npy(directory / "postings_indptr.npy", "int64", 1, mmap=False)
    docs = load_npy(directory / "postings_docs.npy", "int32", 1, mmap=True)
    low = allocate_npy(directory / "postings_low.npy", np.uint16, (docs.shape[0],))
    out = RangeDocs.split(indptr, docs, n_docs, low)
    if isinstance(low, np.memmap):
        low.flush()
    save_npy(directory / "postings_rangestart.npy", out.starts)
    del docs, low, out
    (directory / "postings_docs.npy").unlink()




# --------------------------------------------------------------------- writing without the int32 doc numbers
@nb.njit(cache=True)
def _count(tok, wts, base, counts, lo, hi):
    """Postings per (range, token) of one shard (documents base, base + 1, ...), and each token's weight range."""
    for i in range(tok.shape[0]):
        r = (base + i) >> RANGE_BITS
        for j in range(tok.shape[1]):
            t = tok[i, j]
            counts[r, t] += 1
            w = wts[i, j]
            lo[t] = min(lo[t], w)
            hi[t] = max(hi[t], w)


@nb.njit(cache=True)
def _place(tok, wts, base, cursor, low, codes, scale, offset):
    """Each posting of one shard at its list's next free place in its range, its weight coded as
    :func:`indexer.kernels.quantise_lists` codes it (the same rounding, so the same codes)."""
    for i in range(tok.shape[0]):
        d = base + i
        r = d >> RANGE_BITS
        for j in range(tok.shape[1]):
            t = tok[i, j]
            p = cursor[t, r]
            cursor[t, r] = p + 1
            low[p] = d & (RANGE - 1)
            s = scale[t]
            if s > 0:
                c = np.rint((np.float64(wts[i, j]) - np.float64(offset[t])) / np.float64(s))
                codes[p] = np.uint8(min(max(c, 0.0), 255.0))
            else:
                codes[p] = np.uint8(0)


def write_from_shards(shards, vocab_size: int, directory: Path) -> int:
    """Invert per-shard top-K arrays straight into saved format-5 postings (8-bit impacts per list,
    range-blocked doc numbers), never holding more than one shard and the per-list tables in memory;
    returns the number of documents. ``shards()`` yields (token ids (n, K), weights (n, K)) per shard
    in document order and is called twice (counting, then placing), as
    :meth:`indexer.inverted_index.InvertedIndex.write_from_shards` does. The files are byte for byte
    those of ``InvertedIndex.from_forward(all rows).quantise().split_ranges().save(directory)``."""
    from indexer.diskspace import allocate_npy

    directory = Path(directory)
    counts = np.zeros((1, vocab_size), np.int64)  # postings per (range, token); rows doubled as ranges come
    lo = np.full(vocab_size, np.inf, np.float32)
    hi = np.full(vocab_size, -np.inf, np.float32)
    n_docs = 0
    for tok, wts in shards():
        tok = np.ascontiguousarray(tok, np.int32)
        if tok.size and (int(tok.min()) < 0 or int(tok.max()) >= vocab_size):
            raise ValueError("token id outside the vocabulary")
        need = n_ranges(n_docs + tok.shape[0])
        if need > counts.shape[0]:
            counts = np.concatenate([counts, np.zeros((max(need, 2 * counts.shape[0]) - counts.shape[0], vocab_size), np.int64)])
        _count(tok, np.ascontiguousarray(wts, np.float32), n_docs, counts, lo, hi)
        n_docs += tok.shape[0]
    counts = counts[: n_ranges(n_docs)].T  # (vocab, ranges)
    starts = np.zeros((vocab_size, counts.shape[1] + 1), np.int64)
    np.cumsum(counts, axis=1, out=starts[:, 1:])
    indptr = np.zeros(vocab_size + 1, np.int64)
    np.cumsum(starts[:, -1], out=indptr[1:])
    nonempty = starts[:, -1] > 0
    offset = np.where(nonempty, lo, 0).astype(np.float32)
    scale = np.where(nonempty, ((hi.astype(np.float64) - lo.astype(np.float64)) / 255.0).astype(np.float32), 0).astype(np.float32)
    nnz = int(indptr[-1])
    low = allocate_npy(directory / "postings_low.npy", np.uint16, (nnz,))
    codes = allocate_npy(directory / "postings_weights.npy", np.uint8, (nnz,))
    cursor = indptr[:-1, None] + starts[:, :-1]
    base = 0
    for tok, wts in shards():
        _place(np.ascontiguousarray(tok, np.int32), np.ascontiguousarray(wts, np.float32), base, cursor, low, codes, scale, offset)
        base += tok.shape[0]
    for out in (low, codes):
        if isinstance(out, np.memmap):
            out.flush()
    del low, codes
    save_npy(directory / "postings_indptr.npy", indptr)
    save_npy(directory / "postings_rangestart.npy", starts.astype(np.uint32))
    save_npy(directory / "postings_scale.npy", scale)
    save_npy(directory / "postings_offset.npy", offset)
    return n_docs


LAYOUT = DocLayout(
    name=NAME, files=FILES, load=lambda directory, indptr, n_docs, mmap=True: RangeDocs.load(Path(directory), indptr, n_docs, mmap),
    encode=lambda indptr, docs, n_docs: RangeDocs.split(indptr, docs, n_docs), encode_saved=lambda directory, n_docs: split_saved(directory, n_docs),
    doc_ids="range16-65536", format_version=5, option="range16",
    summary="16-bit offsets within ranges of 65,536 documents, 2 bytes a posting (format 5)",
)

__all__ = ["FILES", "LAYOUT", "NAME", "RANGE", "RANGE_BITS", "TAG", "RangeDocs", "decode_into", "find", "n_ranges", "split_saved", "write_from_shards"]
