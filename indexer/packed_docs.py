"""Doc numbers of posting lists delta-coded and bit-packed in blocks (issue 53, item 2; format 4).

Each posting list is cut into blocks of :data:`BLOCK` (128) postings. A block stores its first
doc number whole (``postings_blockfirst.npy``, int32) and the gaps of the others minus one
(doc numbers ascend strictly, so a gap is >= 1) at one bit width, the width of its largest
gap - 1 (``postings_blockwidth.npy``, uint8, 0..32), packed little-endian into 32-bit words
(``postings_packed.npy``, uint32; each block starts on a word; two zero words of padding at
the end, so a decoder may always read two words). Nothing else is stored: the first block of
each list follows from ``postings_indptr`` (ceil(length / 128) blocks per list) and the first
word of each block from the widths and sizes; both are computed at load (:class:`PackedDocs`).

Why bit-packing rather than Stream VByte: Stream VByte's speed comes from one SIMD byte
shuffle per four integers (``pshufb``), which Numba cannot emit; scalar, it is a branchy
length-byte decode per integer. A fixed width per block decodes each gap with the same
branch-free shift and mask of two 32-bit words (no data-dependent branch, no table), which
LLVM keeps in registers inside the scoring loop, and on the short, dense gaps of aligned-token
lists it is also the smaller of the two (a byte at least per integer in Stream VByte, plus two
bits of control).

The search kernels (:func:`search_one`, :func:`search_many`) decode block by block inside the
scoring loop (each block's gaps into a 128-entry buffer, summed, then scored): no posting list
is decompressed to a temporary array; :func:`search_one_split` splits one query's documents into
ranges over Numba's threads, each range decoding only the blocks that can hold its documents
(found by binary search over the blocks' first doc numbers), as the unpacked index's split
search does (indexer/kernels.py). With quantised impacts only (a compact index; 8 or 4 bits): the codes stay
at their posting positions in ``postings_weights.npy``. Not yet as fast as int32 doc numbers:
on 50k synthetic Zipfian documents x 256 tokens, 80-token queries, 2 contended cores, 4.4 ms a
query against 2.2 ms (one run, indicative only); 1.01 bytes a posting against 4.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numba as nb
import numpy as np

from indexer.diskspace import save_npy
from indexer.errors import IndexFormatError
from indexer.integrity import load_npy
from indexer.kernels import SCAN_WHOLE_FROM, _merge_parts, _range_bounds, accumulator_plan, code_at, ranked, scan_postings

BLOCK = 128
FILES = ("blockfirst", "blockwidth", "packed")  # postings_<name>.npy
_DTYPES = {"blockfirst": "int32", "blockwidth": "uint8", "packed": "uint32"}
PAD_WORDS = 2
MAX_WIDTH = 32


# --------------------------------------------------------------------- layout
@nb.njit(cache=True)
def list_blocks(indptr):
    """First block of each posting list (int64, n_lists + 1): ceil(length / BLOCK) blocks a list."""
    n = indptr.shape[0] - 1
    out = np.zeros(n + 1, np.int64)
    for t in range(n):
        length = indptr[t + 1] - indptr[t]
        out[t + 1] = out[t] + (length + BLOCK - 1) // BLOCK
    return out


@nb.njit(cache=True)
def block_words(indptr, list_block, width):
    """First word of each block (int64, n_blocks + 1): ceil((size - 1) * width / 32) words a block."""
    out = np.zeros(list_block[-1] + 1, np.int64)
    for t in range(indptr.shape[0] - 1):
        a, b = indptr[t], indptr[t + 1]
        blk = list_block[t]
        for s in range(a, b, BLOCK):
            size = min(s + BLOCK, b) - s
            out[blk + 1] = out[blk] + ((size - 1) * np.int64(width[blk]) + 31) // 32
            blk += 1
    return out


@nb.njit(cache=True)
def _widths(indptr, docs, list_block, first, width):
    for t in range(indptr.shape[0] - 1):
        a, b = indptr[t], indptr[t + 1]
        blk = list_block[t]
        for s in range(a, b, BLOCK):
            e = min(s + BLOCK, b)
            first[blk] = docs[s]
            m = np.int64(0)
            for p in range(s + 1, e):
                m |= np.int64(docs[p]) - np.int64(docs[p - 1]) - 1  # negative (top bit set) where not ascending
            w = 0
            while m > 0:
                w += 1
                m >>= 1
            width[blk] = w if m == 0 else 255  # 255: not ascending (PackedDocs.pack refuses it)
            blk += 1


@nb.njit(cache=True)
def _fill(indptr, docs, list_block, width, block_word, words):
    for t in range(indptr.shape[0] - 1):
        a, b = indptr[t], indptr[t + 1]
        blk = list_block[t]
        for s in range(a, b, BLOCK):
            e = min(s + BLOCK, b)
            w = np.int64(width[blk])
            base = block_word[blk]
            for p in range(s + 1, e):
                g = np.uint64(np.int64(docs[p]) - np.int64(docs[p - 1]) - 1)
                bitpos = (p - s - 1) * w
                wi = base + (bitpos >> 5)
                sh = np.uint64(bitpos & 31)
                both = g << sh
                words[wi] |= np.uint32(both & np.uint64(0xFFFFFFFF))
                words[wi + 1] |= np.uint32(both >> np.uint64(32))
            blk += 1


@nb.njit(cache=True, inline="always")
def _gap(words, base, i, w, mask):
    """Gap - 1 number ``i`` (0-based) of a block whose words start at ``base``."""
    bitpos = i * w
    wi = base + (bitpos >> 5)
    pair = np.uint64(words[wi]) | (np.uint64(words[wi + 1]) << np.uint64(32))
    return np.int64((pair >> np.uint64(bitpos & 31)) & mask)


@nb.njit(cache=True, inline="always")
def _mask(w):
    return (np.uint64(1) << np.uint64(w)) - np.uint64(1)


@nb.njit(cache=True, inline="always")
def _block_docs(words, base, first_doc, w, size, buf):
    """A block's ``size`` doc numbers into ``buf``: its gaps decoded (independent of each other), then summed."""
    mask = _mask(w)
    buf[0] = first_doc
    for i in range(1, size):
        buf[i] = _gap(words, base, i - 1, w, mask) + 1
    for i in range(1, size):
        buf[i] += buf[i - 1]


@nb.njit(cache=True)
def decode_into(indptr, list_block, block_word, first, width, words, out):
    """Every doc number, in posting order, into ``out`` (int32, nnz)."""
    for t in range(indptr.shape[0] - 1):
        a, b = indptr[t], indptr[t + 1]
        blk = list_block[t]
        for s in range(a, b, BLOCK):
            e = min(s + BLOCK, b)
            w = np.int64(width[blk])
            mask = _mask(w)
            base = block_word[blk]
            d = np.int64(first[blk])
            out[s] = d
            for p in range(s + 1, e):
                d += _gap(words, base, p - s - 1, w, mask) + 1
                out[p] = d
            blk += 1


@nb.njit(cache=True)
def _first_bad(indptr, list_block, block_word, first, width, words, n_docs):
    """(posting, doc number, block or -1) of the first doc number outside 0..n_docs-1 or not above
    the one before it in its list (the block where it is a block's first, stored whole; -1 where
    it was decoded from the gaps); (-1, 0, -1) when every one is fine. Widths must be <= 32 already."""
    for t in range(indptr.shape[0] - 1):
        a, b = indptr[t], indptr[t + 1]
        blk = list_block[t]
        prev = np.int64(-1)
        for s in range(a, b, BLOCK):
            e = min(s + BLOCK, b)
            w = np.int64(width[blk])
            mask = _mask(w)
            base = block_word[blk]
            d = np.int64(first[blk])
            if d <= prev or d < 0 or d >= n_docs:
                return s, d, np.int64(blk)
            for p in range(s + 1, e):
                d += _gap(words, base, p - s - 1, w, mask) + 1
                if d >= n_docs:
                    return p, d, np.int64(-1)
            prev = d
            blk += 1
    return np.int64(-1), np.int64(0), np.int64(-1)


# --------------------------------------------------------------------- search (quantised impacts)
@nb.njit(cache=True)
def search_one(indptr, list_block, block_word, first, width, words, codes, scale, offset, q_tokens, q_weights, n_docs, k,
               whole_from=SCAN_WHOLE_FROM):
    """:func:`indexer.kernels.search_one_u8` with the doc numbers decoded block by block in the
    scoring loop: the same sums in the same order, so the same top-k ids and scores."""
    whole, room = accumulator_plan(indptr, q_tokens, n_docs, whole_from)
    scores = np.zeros(n_docs, dtype=np.float32)
    seen = np.zeros(n_docs, dtype=np.bool_)
    touched = np.empty(room, dtype=np.int32)
    buf = np.empty(BLOCK, dtype=np.int64)  # one block's doc numbers: the gaps decoded (independent), then summed
    n_touched = 0
    for j in range(q_tokens.shape[0]):
        t = q_tokens[j]
        if t < 0 or t >= indptr.shape[0] - 1:
            continue
        qa = q_weights[j] * scale[t]
        qb = q_weights[j] * offset[t]
        a, b = indptr[t], indptr[t + 1]
        blk = list_block[t]
        for s in range(a, b, BLOCK):
            size = min(s + BLOCK, b) - s
            _block_docs(words, block_word[blk], first[blk], np.int64(width[blk]), size, buf)
            n_touched = scan_postings(buf, 0, codes, s, size, qa, qb, scores, seen, touched, n_touched, True, whole)
            blk += 1
    return ranked(scores, seen, touched, n_touched, k, whole)


@nb.njit(cache=True, parallel=True)
def search_many(indptr, list_block, block_word, first, width, words, codes, scale, offset, q_indptr, q_tokens, q_weights, n_docs, k):
    """:func:`search_one` of many queries (CSR-packed), padded with doc -1 and score -inf."""
    n_q = q_indptr.shape[0] - 1
    out_d = np.full((n_q, k), -1, dtype=np.int32)
    out_s = np.full((n_q, k), -np.inf, dtype=np.float32)
    for i in nb.prange(n_q):
        a, b = q_indptr[i], q_indptr[i + 1]
        top_d, top_s = search_one(indptr, list_block, block_word, first, width, words, codes, scale, offset, q_tokens[a:b], q_weights[a:b],
                                  n_docs, k)
        out_d[i, : top_d.shape[0]] = top_d
        out_s[i, : top_s.shape[0]] = top_s
    return out_d, out_s


@nb.njit(cache=True, inline="always")
def _first_block_from(list_block, first, t, lo):
    """The first block of list ``t`` that can hold doc numbers >= ``lo``: the last whose first doc
    number is <= lo (a binary search over the blocks' first doc numbers), or the list's first."""
    a, b = list_block[t], list_block[t + 1]
    if a == b or first[a] >= lo:
        return a
    while b - a > 1:
        mid = (a + b) // 2
        if first[mid] <= lo:
            a = mid
        else:
            b = mid
    return a


@nb.njit(cache=True, parallel=True)
def search_one_split(indptr, list_block, block_word, first, width, words, codes, scale, offset, q_tokens, q_weights, n_docs, k, parts,
                     whole_from=SCAN_WHOLE_FROM):
    """:func:`search_one` with the documents split into ``parts`` ranges scored in parallel (as
    :func:`indexer.kernels.search_one_u8_split`): each part decodes only the blocks that can hold
    its documents (found from the blocks' first doc numbers; a block across a boundary is decoded
    by both parts, each keeping its own documents). Each document is scored by one part with its
    query tokens added in the same order, so the top-k ids and scores are search_one's."""
    whole, room = accumulator_plan(indptr, q_tokens, n_docs, whole_from)
    part_d = np.full((parts, k), -1, dtype=np.int32)
    part_s = np.full((parts, k), -np.inf, dtype=np.float32)
    for i in nb.prange(parts):
        lo, hi = _range_bounds(n_docs, parts, i)
        scores = np.zeros(hi - lo, dtype=np.float32)
        seen = np.zeros(hi - lo, dtype=np.bool_)
        touched = np.empty(min(room, hi - lo), dtype=np.int32)
        buf = np.empty(BLOCK, dtype=np.int64)
        n_touched = 0
        for j in range(q_tokens.shape[0]):
            t = q_tokens[j]
            if t < 0 or t >= indptr.shape[0] - 1:
                continue
            qa = q_weights[j] * scale[t]
            qb = q_weights[j] * offset[t]
            end = indptr[t + 1]
            blk = _first_block_from(list_block, first, t, lo)
            while blk < list_block[t + 1] and first[blk] < hi:
                s = indptr[t] + (blk - list_block[t]) * BLOCK
                size = min(s + BLOCK, end) - s
                _block_docs(words, block_word[blk], first[blk], np.int64(width[blk]), size, buf)
                for m in range(size):
                    d = buf[m]
                    if d < lo or d >= hi:
                        continue
                    d -= lo
                    if not whole and not seen[d]:
                        touched[n_touched] = d
                        n_touched += 1
                    seen[d] = True
                    scores[d] += qa * np.float32(code_at(codes, s + m)) + qb
                blk += 1
        top_d, top_s = ranked(scores, seen, touched, n_touched, k, whole)
        part_d[i, : top_d.shape[0]] = top_d + lo
        part_s[i, : top_s.shape[0]] = top_s
    return _merge_parts(part_d, part_s, k)


@nb.njit(cache=True)
def find(indptr, list_block, block_word, first, width, words, t, doc):
    """The posting of ``doc`` in list ``t``, or -1: a binary search over the blocks' first doc
    numbers, then one block decoded."""
    lo, hi = list_block[t], list_block[t + 1]
    if lo == hi or doc < first[lo]:
        return -1
    # the last block whose first doc number is <= doc
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if first[mid] <= doc:
            lo = mid
        else:
            hi = mid
    blk = lo
    s = indptr[t] + (blk - list_block[t]) * BLOCK
    e = min(s + BLOCK, indptr[t + 1])
    w = np.int64(width[blk])
    mask = _mask(w)
    d = np.int64(first[blk])
    if d == doc:
        return s
    for p in range(s + 1, e):
        d += _gap(words, block_word[blk], p - s - 1, w, mask) + 1
        if d == doc:
            return p
        if d > doc:
            return -1
    return -1


# --------------------------------------------------------------------- the arrays
@dataclass
class PackedDocs:
    """The packed doc numbers of a CSR index (``indptr`` is the index's)."""

    first: np.ndarray  # int32 (n_blocks,)
    width: np.ndarray  # uint8 (n_blocks,)
    words: np.ndarray  # uint32 (n_words + PAD_WORDS,)
    list_block: np.ndarray  # int64 (n_lists + 1,): computed
    block_word: np.ndarray  # int64 (n_blocks + 1,): computed

    @classmethod
    def pack(cls, indptr: np.ndarray, docs: np.ndarray) -> PackedDocs:
        """Pack ``docs`` (ascending within each list of ``indptr``, as the index stores them)."""
        indptr = np.asarray(indptr, np.int64)
        docs = np.asarray(docs, np.int32)
        list_block = list_blocks(indptr)
        n_blocks = int(list_block[-1])
        first = np.zeros(n_blocks, np.int32)
        width = np.zeros(n_blocks, np.uint8)
        _widths(indptr, docs, list_block, first, width)
        if n_blocks and int(width.max()) > MAX_WIDTH:
            raise ValueError("doc numbers not ascending within a posting list")
        block_word = block_words(indptr, list_block, width)
        words = np.zeros(int(block_word[-1]) + PAD_WORDS, np.uint32)
        _fill(indptr, docs, list_block, width, block_word, words)
        return cls(first, width, words, list_block, block_word)

    def decode(self, indptr: np.ndarray) -> np.ndarray:
        """Every doc number (int32, nnz), as the unpacked index stores them."""
        out = np.empty(int(indptr[-1]), np.int32)
        decode_into(np.asarray(indptr, np.int64), self.list_block, self.block_word, self.first, self.width, self.words, out)
        return out

    @property
    def nbytes(self) -> int:
        return int(self.first.nbytes + self.width.nbytes + self.words.nbytes)

    def save(self, directory: Path, prefix: str = "postings_") -> None:
        for name, a in zip(FILES, (self.first, self.width, self.words)):
            save_npy(Path(directory) / f"{prefix}{name}.npy", a)

    @classmethod
    def load(cls, directory: Path, indptr: np.ndarray, n_docs: int, mmap: bool = True, prefix: str = "postings_") -> PackedDocs:
        """Open and check (before any kernel reads them): block counts and widths against
        ``indptr`` (already checked), the words' length, and every decoded doc number in
        0..n_docs-1 and ascending within its list; IndexFormatError naming the file otherwise."""
        f = {name: Path(directory) / f"{prefix}{name}.npy" for name in FILES}
        arrays = {name: load_npy(f[name], _DTYPES[name], 1, mmap and name == "packed") for name in FILES}
        indptr = np.asarray(indptr, np.int64)
        list_block = list_blocks(indptr)
        n_blocks = int(list_block[-1])
        for name in ("blockfirst", "blockwidth"):
            if arrays[name].shape[0] != n_blocks:
                raise IndexFormatError(f"{f[name]}: {arrays[name].shape[0]} entries, the posting lists have {n_blocks} blocks of {BLOCK}")
        width = arrays["blockwidth"]
        if n_blocks and int(width.max()) > MAX_WIDTH:
            bad = int(np.argmax(width > MAX_WIDTH))
            raise IndexFormatError(f"{f['blockwidth']}: bit width {int(width[bad])} of block {bad} is over {MAX_WIDTH}")
        block_word = block_words(indptr, list_block, width)
        want = int(block_word[-1]) + PAD_WORDS
        if arrays["packed"].shape[0] != want:
            raise IndexFormatError(f"{f['packed']}: {arrays['packed'].shape[0]} words, the blocks' widths need {want}")
        out = cls(arrays["blockfirst"], width, arrays["packed"], list_block, block_word)
        at, doc, blk = _first_bad(indptr, list_block, block_word, out.first, width, out.words, n_docs)
        if at >= 0 and blk >= 0:
            raise IndexFormatError(f"{f['blockfirst']}: first doc number {int(doc)} of block {int(blk)} (posting {int(at)}) is outside "
                                   f"0..{n_docs - 1} or not above the block before it in its posting list")
        if at >= 0:
            raise IndexFormatError(f"{f['packed']}: doc number {int(doc)} decoded at posting {int(at)} is outside 0..{n_docs - 1} (undecodable)")
        return out

    def search(self, indptr, codes, scale, offset, q_tokens, q_weights, n_docs, k):
        return search_one(indptr, self.list_block, self.block_word, self.first, self.width, self.words, codes, scale, offset, q_tokens, q_weights,
                          n_docs, k)

    def search_split(self, indptr, codes, scale, offset, q_tokens, q_weights, n_docs, k, parts):
        return search_one_split(indptr, self.list_block, self.block_word, self.first, self.width, self.words, codes, scale, offset, q_tokens,
                                q_weights, n_docs, k, parts)

    def search_many(self, indptr, codes, scale, offset, q_indptr, q_tokens, q_weights, n_docs, k):
        return search_many(indptr, self.list_block, self.block_word, self.first, self.width, self.words, codes, scale, offset, q_indptr, q_tokens,
                           q_weights, n_docs, k)

    def find(self, indptr, t: int, doc: int) -> int:
        return int(find(indptr, self.list_block, self.block_word, self.first, self.width, self.words, t, doc))


def pack_saved(directory: Path) -> None:
    """Turn a saved ``postings_docs.npy`` (beside its ``postings_indptr.npy``) into the packed
    files, and remove it."""
    directory = Path(directory)
    indptr = load_npy(directory / "postings_indptr.npy", "int64", 1, mmap=False)
    docs = load_npy(directory / "postings_docs.npy", "int32", 1, mmap=True)
    PackedDocs.pack(indptr, docs).save(directory)
    del docs
    (directory / "postings_docs.npy").unlink()


__all__ = ["BLOCK", "FILES", "PackedDocs", "block_words", "decode_into", "find", "list_blocks", "pack_saved", "search_many", "search_one", "search_one_split"]
