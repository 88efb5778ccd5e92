"""Doc numbers of posting lists delta-coded and bit-packed in blocks (issue 53, item 2; formats 4 and 7).

Each posting list is cut into blocks of :data:`BLOCK` (128) postings. A block's doc numbers after
its first are stored as their gaps minus one (doc numbers ascend strictly, so a gap is >= 1) at
one bit width, the width of its largest gap - 1 (``postings_blockwidth.npy``, uint8, 0..32),
packed little-endian into 32-bit words (``postings_packed.npy``, uint32, with two zero words of
padding at the end, so a decoder may always read two words). Two layouts:

- **stream** (format 7, ``"doc_ids": "bitstream-128"``, what is written now): the blocks lie end
  to end on bit boundaries. Word 0 holds ``F``, the bits of a list's first doc number (enough for
  the largest doc number); each list starts with its first doc number in ``F`` bits, then its
  blocks' gaps. The first doc numbers of a list's later blocks, which a split search and a lookup
  reach by binary search, are ``postings_blockskip.npy`` (int32, one per block that is not its
  list's first). On the shared collections' short lists (adi: 2.9 postings a list) this is what
  made bit-packing pay: a whole int32 for each block's first doc number, and each block on a word,
  cost more than the gaps.
- **blocks** (format 4, and format 6's ``bitpacked-128``; read, and written where an update
  extends such an index): each block starts on a word, and every block's first doc number is
  stored whole (``postings_blockfirst.npy``, int32).

Nothing else is stored: the first block of each list follows from ``postings_indptr``
(ceil(length / 128) blocks per list), and at load both layouts become the same arrays in memory
(each block's first doc number, and the bit where its gaps start: :class:`PackedDocs`), which
the kernels read.

Why bit-packing rather than Stream VByte: Stream VByte's speed comes from one SIMD byte
shuffle per four integers (``pshufb``), which Numba cannot emit; scalar, it is a branchy
length-byte decode per integer. A fixed width per block decodes each gap with the same
branch-free shift and mask of two 32-bit words (no data-dependent branch, no table), which
LLVM keeps in registers inside the scoring loop, and on the short, dense gaps of aligned-token
lists it is also the smaller of the two (a byte at least per integer in Stream VByte, plus two
bits of control).

The search is indexer/term_at_a_time.py's driver with :func:`_scan`, which decodes block by block
inside the scoring loop (each block's gaps into a 128-entry buffer, summed, then scored): no posting
list is decompressed to a temporary array; a split search (one query's documents cut into ranges
over Numba's threads) decodes in each range only the blocks that can hold its documents (found by
binary search over the blocks' first doc numbers). With quantised impacts only (a compact index; 8 or 4 bits): the codes stay
at their posting positions in ``postings_weights.npy``. Not yet as fast as int32 doc numbers:
on 50k synthetic Zipfian documents x 256 tokens, 80-token queries, 2 contended cores, 4.4 ms a
query against 2.2 ms (one run, indicative only); 1.01 bytes a posting against 4.
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

BLOCK = 128
FILES = ("blockfirst", "blockwidth", "packed")  # postings_<name>.npy of the blocks layout (format 4)
STREAM_FILES = ("blockskip", "blockwidth", "packed")  # ... of the stream layout (format 7)
_DTYPES = {"blockfirst": "int32", "blockskip": "int32", "blockwidth": "uint8", "packed": "uint32"}
STREAM_START = 32  # bits: word 0 of a stream holds the bits of the lists' first doc numbers
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
def block_bits(indptr, list_block, width):
    """Blocks layout: the first bit of each block's gaps (int64, n_blocks + 1; each block starts on
    a word: ceil((size - 1) * width / 32) words a block)."""
    out = np.zeros(list_block[-1] + 1, np.int64)
    for t in range(indptr.shape[0] - 1):
        a, b = indptr[t], indptr[t + 1]
        blk = list_block[t]
        for s in range(a, b, BLOCK):
            size = min(s + BLOCK, b) - s
            out[blk + 1] = out[blk] + ((size - 1) * np.int64(width[blk]) + 31) // 32 * 32
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


@nb.njit(cache=True, inline="always")
def _put(words, bitpos, value):
    """``value`` (< 2**32) into the words at bit ``bitpos``."""
    wi = bitpos >> 5
    both = np.uint64(value) << np.uint64(bitpos & 31)
    words[wi] |= np.uint32(both & np.uint64(0xFFFFFFFF))
    words[wi + 1] |= np.uint32(both >> np.uint64(32))


@nb.njit(cache=True)
def _fill(indptr, docs, list_block, width, block_bit, words):
    """Every block's gaps - 1 at its bit (both layouts); the stream's first doc numbers are put by the caller."""
    for t in range(indptr.shape[0] - 1):
        a, b = indptr[t], indptr[t + 1]
        blk = list_block[t]
        for s in range(a, b, BLOCK):
            e = min(s + BLOCK, b)
            w = np.int64(width[blk])
            base = block_bit[blk]
            for p in range(s + 1, e):
                _put(words, base + (p - s - 1) * w, np.int64(docs[p]) - np.int64(docs[p - 1]) - 1)
            blk += 1


@nb.njit(cache=True)
def stream_bits(indptr, list_block, width, first_bits):
    """Stream layout: the first bit of each block's gaps (int64, n_blocks + 1; the last entry the
    stream's end), from the widths alone (written and read the same way)."""
    out = np.zeros(list_block[-1] + 1, np.int64)
    pos = np.int64(STREAM_START)
    for t in range(indptr.shape[0] - 1):
        a, b = indptr[t], indptr[t + 1]
        blk = list_block[t]
        for s in range(a, b, BLOCK):
            if s == a:
                pos += first_bits
            out[blk] = pos
            pos += (min(s + BLOCK, b) - s - 1) * np.int64(width[blk])
            blk += 1
    out[list_block[-1]] = pos
    return out


@nb.njit(cache=True)
def _put_firsts(indptr, list_block, block_bit, first, first_bits, words, skip):
    """Stream layout: each list's first doc number just before its first block's gaps, the others into ``skip``."""
    k = 0
    for t in range(indptr.shape[0] - 1):
        a, b = list_block[t], list_block[t + 1]
        if a == b:
            continue
        _put(words, block_bit[a] - first_bits, np.int64(first[a]))
        for blk in range(a + 1, b):
            skip[k] = first[blk]
            k += 1


@nb.njit(cache=True)
def _read_firsts(list_block, block_bit, first_bits, words, skip, first):
    """Stream layout: every block's first doc number into ``first``, as :func:`_put_firsts` put them
    (the words' length already checked against the stream's end)."""
    mask = _mask(np.int64(first_bits))
    k = 0
    for t in range(list_block.shape[0] - 1):
        a, b = list_block[t], list_block[t + 1]
        if a == b:
            continue
        first[a] = np.int32(_gap(words, block_bit[a] - first_bits, 0, np.int64(first_bits), mask))
        for blk in range(a + 1, b):
            first[blk] = skip[k]
            k += 1


@nb.njit(cache=True, inline="always")
def _gap(words, base, i, w, mask):
    """Gap - 1 number ``i`` (0-based) of a block whose gaps start at bit ``base``."""
    bitpos = base + i * w
    wi = bitpos >> 5
    pair = np.uint64(words[wi]) | (np.uint64(words[wi + 1]) << np.uint64(32))
    return np.int64((pair >> np.uint64(bitpos & 31)) & mask)


@nb.njit(cache=True, inline="always")
def _mask(w):
    return (np.uint64(1) << np.uint64(w)) - np.uint64(1)


@nb.njit(cache=True, inline="always")
def _block_docs(words, base, first_doc, w, size, buf):
    """A block's ``size`` doc numbers into ``buf`` (its gaps from bit ``base``): its gaps decoded
    (independent of each other), then summed."""
    mask = _mask(w)
    buf[0] = first_doc
    for i in range(1, size):
        buf[i] = _gap(words, base, i - 1, w, mask) + 1
    for i in range(1, size):
        buf[i] += buf[i - 1]


@nb.njit(cache=True)
def decode_into(indptr, list_block, block_bit, first, width, words, out):
    """Every doc number, in posting order, into ``out`` (int32, nnz)."""
    for t in range(indptr.shape[0] - 1):
        a, b = indptr[t], indptr[t + 1]
        blk = list_block[t]
        for s in range(a, b, BLOCK):
            e = min(s + BLOCK, b)
            w = np.int64(width[blk])
            mask = _mask(w)
            base = block_bit[blk]
            d = np.int64(first[blk])
            out[s] = d
            for p in range(s + 1, e):
                d += _gap(words, base, p - s - 1, w, mask) + 1
                out[p] = d
            blk += 1


@nb.njit(cache=True)
def _first_bad(indptr, list_block, block_bit, first, width, words, n_docs):
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
            base = block_bit[blk]
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


def _scan(postings, indptr, t, lo, hi, buf, codes, qa, qb, scores, seen, touched, n_touched, flags, whole):
    """List ``t``'s postings with doc numbers in ``[lo, hi)`` to the window's accumulators
    (indexer/term_at_a_time.py), a block at a time: only the blocks that can hold them (found from
    the blocks' first doc numbers), each decoded into ``buf`` relative to ``lo`` (its gaps decoded,
    independent of each other, then summed), its run in the window found by binary search where
    the block crosses the window's edge. No list is decompressed to a temporary array."""
    list_block, block_bit, first, width, words = postings[1], postings[2], postings[3], postings[4], postings[5]
    end = indptr[t + 1]
    blk = _first_block_from(list_block, first, t, lo)
    size_hi = hi - lo
    while blk < list_block[t + 1] and first[blk] < hi:
        s = indptr[t] + (blk - list_block[t]) * BLOCK
        size = min(s + BLOCK, end) - s
        _block_docs(words, block_bit[blk], np.int64(first[blk]) - lo, np.int64(width[blk]), size, buf)
        m0, m1 = 0, size
        if buf[0] < 0:  # a block that starts before the window
            m0 = np.searchsorted(buf[:size], 0)
        if buf[size - 1] >= size_hi:  # ... or ends after it
            m1 = np.searchsorted(buf[:size], size_hi)
        n_touched = term_at_a_time.add_postings(buf, m0, 0, codes, s + m0, m1 - m0, qa, qb, scores, seen, touched, n_touched, flags, whole)
        blk += 1
    return n_touched


TAG = term_at_a_time.register("packed", _scan, __file__, scratch=BLOCK)  # both layouts: the same arrays in memory


@nb.njit(cache=True)
def find(indptr, list_block, block_bit, first, width, words, t, doc):
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
        d += _gap(words, block_bit[blk], p - s - 1, w, mask) + 1
        if d == doc:
            return p
        if d > doc:
            return -1
    return -1


# --------------------------------------------------------------------- the arrays
@dataclass
class PackedDocs(DocNumbers):
    """The packed doc numbers of a CSR index (``indptr`` is the index's), in either layout (the
    module docstring); in memory both are the same arrays."""

    first: np.ndarray  # int32 (n_blocks,): each block's first doc number (read from blockskip and the stream in a stream)
    width: np.ndarray  # uint8 (n_blocks,)
    words: np.ndarray  # uint32 (n_words + PAD_WORDS,)
    list_block: np.ndarray  # int64 (n_lists + 1,): computed
    block_bit: np.ndarray  # int64 (n_blocks + 1,): the bit where each block's gaps start; computed
    stream: bool = True  # the stream layout (format 7); False: blocks on words (format 4)

    @property
    def layout(self) -> str:  # type: ignore[override]
        return STREAM if self.stream else BLOCKS

    @classmethod
    def pack(cls, indptr: np.ndarray, docs: np.ndarray, stream: bool = True) -> PackedDocs:
        """Pack ``docs`` (ascending within each list of ``indptr``, as the index stores them), as a
        stream (format 7) or, ``stream=False``, in blocks on words (format 4)."""
        indptr = np.asarray(indptr, np.int64)
        docs = np.asarray(docs, np.int32)
        list_block = list_blocks(indptr)
        n_blocks = int(list_block[-1])
        first = np.zeros(n_blocks, np.int32)
        width = np.zeros(n_blocks, np.uint8)
        _widths(indptr, docs, list_block, first, width)
        if n_blocks and int(width.max()) > MAX_WIDTH:
            raise ValueError("doc numbers not ascending within a posting list")
        if not stream:
            block_bit = block_bits(indptr, list_block, width)
            words = np.zeros(int(block_bit[-1]) // 32 + PAD_WORDS, np.uint32)
            _fill(indptr, docs, list_block, width, block_bit, words)
            return cls(first, width, words, list_block, block_bit, stream=False)
        first_bits = max(1, int(first.max()).bit_length()) if n_blocks else 1
        block_bit = stream_bits(indptr, list_block, width, first_bits)
        words = np.zeros((int(block_bit[-1]) + 31) // 32 + PAD_WORDS, np.uint32)
        words[0] = first_bits
        _fill(indptr, docs, list_block, width, block_bit, words)
        skip = np.zeros(n_blocks - int(np.count_nonzero(np.diff(list_block))), np.int32)
        _put_firsts(indptr, list_block, block_bit, first, first_bits, words, skip)
        return cls(first, width, words, list_block, block_bit)

    def decode(self, indptr: np.ndarray) -> np.ndarray:
        """Every doc number (int32, nnz), as the unpacked index stores them."""
        out = np.empty(int(indptr[-1]), np.int32)
        decode_into(np.asarray(indptr, np.int64), self.list_block, self.block_bit, self.first, self.width, self.words, out)
        return out

    def skip(self) -> np.ndarray:
        """The stream's ``blockskip``: the first doc numbers of the blocks that are not their list's first."""
        later = np.ones(self.first.shape[0], bool)
        later[self.list_block[:-1][np.diff(self.list_block) > 0]] = False
        return np.ascontiguousarray(self.first[later])

    @property
    def nbytes(self) -> int:
        """Bytes on disk (in memory a stream also holds every block's first doc number)."""
        return int((self.skip().nbytes if self.stream else self.first.nbytes) + self.width.nbytes + self.words.nbytes)

    def save(self, directory: Path, prefix: str = "postings_") -> None:
        names, heads = (STREAM_FILES, self.skip()) if self.stream else (FILES, self.first)
        for name, a in zip(names, (heads, self.width, self.words)):
            save_npy(Path(directory) / f"{prefix}{name}.npy", a)

    @classmethod
    def load(cls, directory: Path, indptr: np.ndarray, n_docs: int, mmap: bool = True, prefix: str = "postings_") -> PackedDocs:
        """Open and check (before any kernel reads them) either layout, told by its files (a
        stream's ``blockskip``, blocks' ``blockfirst``; the manifest's record says which the
        reader expects: :attr:`stream`): block counts and widths against ``indptr`` (already
        checked), the words' length, and every decoded doc number in 0..n_docs-1 and ascending
        within its list; IndexFormatError naming the file otherwise."""
        stream = (Path(directory) / f"{prefix}blockskip.npy").exists()
        names = STREAM_FILES if stream else FILES
        f = {name: Path(directory) / f"{prefix}{name}.npy" for name in names}
        arrays = {name: load_npy(f[name], _DTYPES[name], 1, mmap and name == "packed") for name in names}
        indptr = np.asarray(indptr, np.int64)
        list_block = list_blocks(indptr)
        n_blocks = int(list_block[-1])
        heads = n_blocks - int(np.count_nonzero(np.diff(list_block))) if stream else n_blocks
        for name, want in ((names[0], heads), ("blockwidth", n_blocks)):
            if arrays[name].shape[0] != want:
                what = "blocks after their list's first" if stream and name == names[0] else "blocks"
                raise IndexFormatError(f"{f[name]}: {arrays[name].shape[0]} entries, the posting lists have {want} {what} of {BLOCK}")
        width = arrays["blockwidth"]
        if n_blocks and int(width.max()) > MAX_WIDTH:
            bad = int(np.argmax(width > MAX_WIDTH))
            raise IndexFormatError(f"{f['blockwidth']}: bit width {int(width[bad])} of block {bad} is over {MAX_WIDTH}")
        words = arrays["packed"]
        if stream:
            first_bits = int(words[0]) if words.shape[0] > PAD_WORDS else 0
            if not 1 <= first_bits <= MAX_WIDTH:
                raise IndexFormatError(f"{f['packed']}: word 0 says first doc numbers take {first_bits} bits (1 to {MAX_WIDTH})")
            block_bit = stream_bits(indptr, list_block, width, first_bits)
            want = (int(block_bit[-1]) + 31) // 32 + PAD_WORDS
        else:
            first = arrays["blockfirst"]
            block_bit = block_bits(indptr, list_block, width)
            want = int(block_bit[-1]) // 32 + PAD_WORDS
        if words.shape[0] != want:
            raise IndexFormatError(f"{f['packed']}: {words.shape[0]} words, the blocks' widths ({f['blockwidth'].name}) need {want}")
        if stream:  # read only now that the words hold the whole stream
            first = np.zeros(n_blocks, np.int32)
            _read_firsts(list_block, block_bit, first_bits, words, arrays["blockskip"], first)
        out = cls(first, width, words, list_block, block_bit, stream)
        at, doc, blk = _first_bad(indptr, list_block, block_bit, out.first, width, out.words, n_docs)
        if at >= 0 and blk >= 0:
            where = f["blockfirst"] if not stream else f["packed"] if blk in list_block[:-1] else f["blockskip"]
            raise IndexFormatError(f"{where}: first doc number {int(doc)} of block {int(blk)} (posting {int(at)}) is outside "
                                   f"0..{n_docs - 1} or not above the block before it in its posting list")
        if at >= 0:
            raise IndexFormatError(f"{f['packed']}: doc number {int(doc)} decoded at posting {int(at)} is outside 0..{n_docs - 1} (undecodable)")
        return out

    @property
    def postings(self) -> tuple:
        return (TAG, self.list_block, self.block_bit, self.first, self.width, self.words)

    def search_split(self, indptr, codes, scale, offset, q_tokens, q_weights, n_docs, k, parts):
        return term_at_a_time.search(self.postings, indptr, codes, scale, offset, q_tokens, q_weights, n_docs, k, parts, True)

    def find(self, indptr, t: int, doc: int) -> int:
        return int(find(indptr, self.list_block, self.block_bit, self.first, self.width, self.words, t, doc))


def pack_saved(directory: Path, stream: bool = True) -> None:
    """Turn a saved ``postings_docs.npy`` (beside its ``postings_indptr.npy``) into the packed
    files of either layout, and remove it."""
    directory = Path(directory)
    indptr = load_npy(directory / "postings_indptr.npy", "int64", 1, mmap=False)
    docs = load_npy(directory / "postings_docs.npy", "int32", 1, mmap=True)
    PackedDocs.pack(indptr, docs, stream).save(directory)
    del docs
    (directory / "postings_docs.npy").unlink()


STREAM, BLOCKS = "stream", "blocks"  # the codec's names (indexer/codec.py)
STREAM_LAYOUT = DocLayout(
    name=STREAM, files=STREAM_FILES, load=lambda directory, indptr, n_docs, mmap=True: _load_as(directory, indptr, n_docs, mmap, True),
    encode=lambda indptr, docs, n_docs: PackedDocs.pack(indptr, docs, True), encode_saved=lambda directory, n_docs: pack_saved(directory, True),
    doc_ids="bitstream-128", format_version=7, option="stream", aliases=("bitpacked",),
    summary="deltas bit-packed in blocks of 128 laid end to end, ~1 byte a posting (format 7)",
)
# format 4: read, and written again only where an update extends an index that has it (option None)
BLOCKS_LAYOUT = DocLayout(
    name=BLOCKS, files=FILES, load=lambda directory, indptr, n_docs, mmap=True: _load_as(directory, indptr, n_docs, mmap, False),
    encode=lambda indptr, docs, n_docs: PackedDocs.pack(indptr, docs, False), encode_saved=lambda directory, n_docs: pack_saved(directory, False),
    doc_ids="bitpacked-128", format_version=4, summary="deltas bit-packed in blocks of 128, each on a word (format 4; read and updated only)",
)


def _load_as(directory: Path, indptr: np.ndarray, n_docs: int, mmap: bool, stream: bool) -> PackedDocs:
    """:meth:`PackedDocs.load`, refused where the files are the other layout's."""
    out = PackedDocs.load(Path(directory), indptr, n_docs, mmap)
    if out.stream != stream:
        found, want = ("blockskip", "blockfirst") if out.stream else ("blockfirst", "blockskip")
        raise IndexFormatError(f"{Path(directory)}: postings_{found}.npy found, but the manifest records doc numbers whose layout "
                               f"keeps postings_{want}.npy")
    return out


__all__ = [
    "BLOCK",
    "BLOCKS",
    "BLOCKS_LAYOUT",
    "FILES",
    "STREAM",
    "STREAM_FILES",
    "STREAM_LAYOUT",
    "TAG",
    "PackedDocs",
    "block_bits",
    "decode_into",
    "find",
    "list_blocks",
    "pack_saved",
    "stream_bits",
]
