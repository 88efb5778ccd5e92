"""The aligned-token inverted index: CSR postings per vocabulary token, memory-mappable."""
from __future__ import annotations

import functools
import os
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import numba
import numpy as np

from indexer import kernels
from indexer.codec import FLOAT32, PostingsCodec, doc_layout
from indexer.diskspace import allocate_npy, save_npy
from indexer.doc_numbers import DocNumbers
from indexer.int32_docs import Int32Docs
from indexer.integrity import check_csr, load_npy
from indexer.packed_docs import BLOCKS, STREAM, PackedDocs
from indexer.range_docs import NAME as RANGE16
from indexer.range_docs import RangeDocs

_FILES = ("indptr", "docs", "weights")
# 8-bit impacts (indexer/compact.py): the weights file holds uint8 codes and these two float32
# files, one entry per posting list, map them back: weight = offset[t] + scale[t] * code
_QUANTISED_FILES = ("scale", "offset")
UINT8 = "uint8"  # the weights file's element type with 8-bit impacts (the manifest records "impacts": "uint8")
# the codes a list's [min, max] is spread over: all 256 by default; fewer (16: 4-bit impacts' precision,
# measured in experiments/compact_index.py) are recorded as the channel's "levels"
IMPACT_LEVELS = 256
# batch_search runs a parallel kernel: one thread at a time (Numba's workqueue layer, used where neither
# TBB nor OpenMP is installed, aborts the process when two threads enter one at once)
_PARALLEL_KERNEL = threading.Lock()
# From this many postings on, one query's search is split by document range over Numba's threads
# (term_at_a_time.search_split: the same ranking, bit for bit). Served, a search follows a query
# encoder's forward, which leaves Numba's threads asleep: on 2 cores, each search after a MiniLM
# forward (benchmarks/results/scale/split-search.json; synthetic 512-token documents, the one-pass
# kernels), queries reading 21k and 42k postings were 0.83x and 0.91x as fast split, 120k-240k
# postings 1.35-1.6x, 0.55M-3.1M 1.67-1.78x; and the forward after a split search was no slower.
SPLIT_MIN_POSTINGS = 65_536
# The ranges are also kept small enough that their accumulators (4 bytes of score and 1
# of flag a document) fill at most 5/8 of a core's L2 cache: L2 bytes / 8 documents a range, on one
# thread too. On 1,000,000 real-shaped documents (a 2 MiB L2; benchmarks/results/scale/real-shaped-1m.json),
# 4 ranges took 3.94 ms a query on 2 threads where 2 took 4.85 (8: 3.99), and 7.95 ms on one thread
# where one range had taken 15.4 (the same study at f059ce7).
L2_FALLBACK_BYTES = 1 << 20
CPU_CACHES = Path("/sys/devices/system/cpu/cpu0/cache")


@functools.lru_cache(maxsize=4)
def range_docs(caches: Path = CPU_CACHES) -> int:
    """Documents a range of one query's split search holds at most: this CPU's per-core L2 cache
    size (Linux sysfs ``caches``; :data:`L2_FALLBACK_BYTES` where it cannot be read) over 8 bytes."""
    l2 = L2_FALLBACK_BYTES
    for level in sorted(caches.glob("index*")):
        try:
            if (level / "level").read_text().strip() == "2" and (level / "type").read_text().strip() in ("Unified", "Data"):
                l2 = _cache_bytes((level / "size").read_text())
        except (OSError, ValueError):
            continue
    return max(1, l2 // 8)


def _cache_bytes(size: str) -> int:
    """sysfs cache size ("2048K", "1M", "512") in bytes."""
    size = size.strip().upper()
    units = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    return int(size[:-1]) * units[size[-1]] if size[-1:] in units else int(size)


@dataclass
class InvertedIndex:
    """Postings of token t: the doc numbers of postings ``indptr[t]:indptr[t+1]`` with ``weights``.

    The doc numbers are :attr:`numbers`, a :class:`indexer.doc_numbers.DocNumbers` in one of the
    codec's layouts (indexer/codec.py: int32, the bit-packed stream, 16-bit offsets within ranges,
    ...); the index calls it for every search, lookup and save without knowing which. Given as an
    int32 array, they are the int32 layout (:attr:`docs` gives that array back).

    The weights are the codec's impact width (:attr:`impact_bits`): float32 (32); with 8-bit
    impacts (``scale`` and ``offset`` given), uint8 codes, posting p of list t weighing
    ``offset[t] + scale[t] * weights[p]`` (:meth:`float_weights`); with 4-bit impacts two codes a
    byte, as an int8 view (:data:`indexer.kernels.NIBBLES`; :func:`indexer.kernels.code_at` reads
    posting p's). Every layout but int32 goes with quantised impacts only."""

    indptr: np.ndarray  # int64, (vocab_size + 1,)
    numbers: DocNumbers  # the doc numbers, ascending within each posting list (an int32 array: the int32 layout)
    weights: np.ndarray  # float32, (nnz,); uint8 codes when quantised
    n_docs: int
    scale: np.ndarray | None = None  # float32, (vocab_size,): quantised impacts only
    offset: np.ndarray | None = None  # float32, (vocab_size,)

    def __post_init__(self) -> None:
        if not isinstance(self.numbers, DocNumbers):
            self.numbers = Int32Docs(self.numbers)

    @property
    def docs(self) -> np.ndarray | None:
        """The int32 doc numbers where that is the layout, else None (:meth:`doc_numbers` decodes any)."""
        return self.numbers.docs if isinstance(self.numbers, Int32Docs) else None

    @property
    def doc_layout(self) -> str:
        """The codec's name of the doc numbers' layout (indexer/codec.py)."""
        return self.numbers.layout

    @property
    def codec(self) -> PostingsCodec:
        return PostingsCodec.named(self.doc_layout, self.impact_bits)

    @property
    def packed(self) -> PackedDocs | None:
        """The doc numbers where bit-packed (indexer/packed_docs.py), else None."""
        return self.numbers if isinstance(self.numbers, PackedDocs) else None

    @property
    def ranges(self) -> RangeDocs | None:
        """The doc numbers where range-blocked (indexer/range_docs.py), else None."""
        return self.numbers if isinstance(self.numbers, RangeDocs) else None

    @property
    def quantised(self) -> bool:
        return self.scale is not None

    @property
    def nibbles(self) -> bool:
        """4-bit impacts: ``weights`` is a :data:`indexer.kernels.NIBBLES` view of two codes a byte."""
        return self.weights.dtype == kernels.NIBBLES

    @property
    def impact_bits(self) -> int:
        """The codec's impact width: 32 (float32), 8 or 4."""
        return 32 if not self.quantised else 4 if self.nibbles else 8

    def to_nibbles(self) -> InvertedIndex:
        """This index (impacts quantised to at most 16 levels) with its codes stored two a byte (format 6)."""
        if not self.quantised or self.nibbles:
            raise ValueError("4-bit impacts come from 8-bit codes of at most 16 levels")
        packed = kernels.pack_nibbles(self.weights).view(kernels.NIBBLES)
        return InvertedIndex(self.indptr, self.numbers, packed, self.n_docs, self.scale, self.offset)

    def doc_numbers(self) -> np.ndarray:
        """Every posting's doc number (int32; decoded whole where the layout codes them)."""
        return self.numbers.decode(self.indptr)

    def with_layout(self, layout: str) -> InvertedIndex:
        """This index with its doc numbers in ``layout`` (a name indexer/codec.py's ``doc_layout``
        takes); every layout but int32 goes with quantised impacts."""
        target = doc_layout(layout)
        if target.name == self.doc_layout:
            return self
        if not self.quantised and not target.float_weights:
            raise ValueError(f"doc layout {target.name!r} goes with quantised impacts (a compact index)")
        return InvertedIndex(self.indptr, target.encode(self.indptr, self.doc_numbers(), self.n_docs), self.weights, self.n_docs,
                             self.scale, self.offset)

    def pack(self, stream: bool = True) -> InvertedIndex:
        """This index (8-bit impacts) with its doc numbers bit-packed (indexer/packed_docs.py; ``stream``:
        the stream layout of format 7, else blocks on words, format 4)."""
        if not self.quantised:
            raise ValueError("packed doc numbers go with 8-bit impacts (a compact index)")
        if self.packed is not None:
            return self
        return self.with_layout(STREAM if stream else BLOCKS)

    def split_ranges(self) -> InvertedIndex:
        """This index (8-bit impacts) with its doc numbers range-blocked (indexer/range_docs.py)."""
        if not self.quantised:
            raise ValueError("range-blocked doc numbers go with 8-bit impacts (a compact index)")
        return self.with_layout(RANGE16)

    def float_weights(self) -> np.ndarray:
        """Every posting's weight as float32 (dequantised where quantised)."""
        if not self.quantised:
            return self.weights
        return kernels.dequantise(self.indptr, self.weights, self.scale, self.offset)

    def quantise(self, per_list: bool = True, levels: int = IMPACT_LEVELS) -> InvertedIndex:
        """This index with 8-bit impacts (see indexer/compact.py); ``per_list`` False: one scale for all lists;
        ``levels``: how many of the 256 codes a list's [min, max] is spread over (fewer: coarser weights, same bytes)."""
        codes, scale, offset = quantise_weights(self.indptr, np.asarray(self.float_weights(), np.float32), per_list, levels)
        return InvertedIndex(self.indptr, self.numbers, codes, self.n_docs, scale, offset)

    @property
    def vocab_size(self) -> int:
        return int(self.indptr.shape[0] - 1)

    @property
    def nbytes(self) -> int:
        extra = self.scale.nbytes + self.offset.nbytes if self.quantised else 0
        return int(self.indptr.nbytes + self.numbers.nbytes + self.weights.nbytes + extra)

    @classmethod
    def from_forward(cls, token_ids: np.ndarray, weights: np.ndarray, vocab_size: int) -> InvertedIndex:
        """Invert per-document top-K vectors (rows = documents in order) into postings.

        A stable sort by token keeps the doc numbers ascending inside each posting list,
        which :func:`kernels.contributions` relies on.
        """
        n_docs, k = token_ids.shape
        flat_t = token_ids.reshape(-1).astype(np.int64)
        if flat_t.size and (flat_t.min() < 0 or flat_t.max() >= vocab_size):
            raise ValueError("token id outside the vocabulary")
        order = np.argsort(flat_t, kind="stable")
        docs = (order // max(k, 1)).astype(np.int32)
        indptr = np.zeros(vocab_size + 1, dtype=np.int64)
        np.cumsum(np.bincount(flat_t, minlength=vocab_size), out=indptr[1:])
        return cls(indptr, docs, weights.reshape(-1)[order].astype(np.float32), n_docs)

    @staticmethod
    def write_from_shards(shards: Callable[[], Iterator[tuple[np.ndarray, np.ndarray]]], vocab_size: int, directory: Path) -> int:
        """Invert per-shard top-K arrays straight into the saved posting files, with memory
        bounded by one shard (the outputs are memory-mapped, their space reserved first); returns the number of documents.

        ``shards()`` yields (token ids (n, K), weights (n, K)) per shard in document order; it is
        called twice (counting, then placing). The files are byte for byte those of
        ``from_forward(all rows).save(directory)``: within a shard a stable sort by token keeps
        doc numbers ascending, and shards come in document order.
        """
        counts = np.zeros(vocab_size, np.int64)
        n_docs = 0
        for tok, _ in shards():
            flat = tok.reshape(-1).astype(np.int64)
            if flat.size and (flat.min() < 0 or flat.max() >= vocab_size):
                raise ValueError("token id outside the vocabulary")
            counts += np.bincount(flat, minlength=vocab_size)
            n_docs += tok.shape[0]
        indptr = np.zeros(vocab_size + 1, np.int64)
        np.cumsum(counts, out=indptr[1:])
        nnz = int(indptr[-1])
        save_npy(directory / "postings_indptr.npy", indptr)
        # every block allocated before the maps are written: a full disk is an error, not SIGBUS
        docs = allocate_npy(directory / "postings_docs.npy", np.int32, (nnz,))
        weights = allocate_npy(directory / "postings_weights.npy", np.float32, (nnz,))
        cursor = indptr[:-1].copy()  # next free slot of each posting list
        base = 0
        for tok, wts in shards():
            n, k = tok.shape
            flat = tok.reshape(-1).astype(np.int64)
            order = np.argsort(flat, kind="stable")
            sorted_t = flat[order]
            here = np.bincount(flat, minlength=vocab_size)
            first = np.cumsum(here) - here  # where each token's run starts in sorted_t
            dest = cursor[sorted_t] + (np.arange(sorted_t.size) - first[sorted_t])
            docs[dest] = (base + order // max(k, 1)).astype(np.int32)
            weights[dest] = wts.reshape(-1)[order].astype(np.float32)
            cursor += here
            base += n
        for out in (docs, weights):
            if isinstance(out, np.memmap):
                out.flush()
        del docs, weights
        return n_docs

    def save(self, directory: Path) -> None:
        for name in _FILES + (_QUANTISED_FILES if self.quantised else ()):
            if name == "docs":
                self.numbers.save(directory)
                continue
            value = getattr(self, name)
            save_npy(directory / f"postings_{name}.npy", value.view(np.uint8) if name == "weights" and self.nibbles else value)

    @staticmethod
    def encode_saved(directory: Path, layout: str, n_docs: int) -> None:
        """Turn saved postings' ``postings_docs.npy`` into ``layout``'s files in place (indexer/codec.py)."""
        doc_layout(layout).encode_saved(Path(directory), n_docs)

    @staticmethod
    def nibble_saved(directory: Path) -> None:
        """Turn saved 8-bit codes of at most 16 levels (``postings_weights.npy``) into 4-bit impacts,
        two a byte, in place (written to a temporary file, then renamed over it)."""
        directory = Path(directory)
        src, tmp = directory / "postings_weights.npy", directory / ".postings_weights.u4.npy"
        codes = load_npy(src, UINT8, 1, mmap=True)
        packed = allocate_npy(tmp, np.uint8, ((codes.shape[0] + 1) // 2,))
        for s in _blocks(codes.shape[0]):  # blocks of an even size: each starts on a byte
            packed[s.start // 2 : (s.stop + 1) // 2] = kernels.pack_nibbles(codes[s])
        if isinstance(packed, np.memmap):
            packed.flush()
        del codes, packed
        os.replace(tmp, src)

    @staticmethod
    def quantise_saved(directory: Path, per_list: bool = True, levels: int = IMPACT_LEVELS) -> None:
        """Turn saved float32 postings into 8-bit impacts in place: the weights file becomes
        uint8 codes, and the scale and offset files are written beside it. The weights are read
        through a memory map and the codes written through one (memory: the vocabulary's two arrays)."""
        directory = Path(directory)
        indptr = load_npy(directory / "postings_indptr.npy", "int64", 1, mmap=False)
        src = directory / "postings_weights.npy"
        weights = load_npy(src, "float32", 1, mmap=True)
        tmp = directory / ".postings_weights.u8.npy"
        codes = allocate_npy(tmp, np.uint8, (weights.shape[0],))
        scale = np.zeros(indptr.shape[0] - 1, np.float32)
        offset = np.zeros(indptr.shape[0] - 1, np.float32)
        _quantise_into(indptr, weights, codes, scale, offset, per_list, levels)
        if isinstance(codes, np.memmap):
            codes.flush()
        del codes, weights
        os.replace(tmp, src)
        save_npy(directory / "postings_scale.npy", scale)
        save_npy(directory / "postings_offset.npy", offset)

    @classmethod
    def load(cls, directory: Path, n_docs: int, mmap: bool = True, n_lists: int | None = None, positive: bool = False,
             codec: PostingsCodec = FLOAT32) -> InvertedIndex:
        """Open saved postings stored as ``codec`` says (indexer/codec.py: what the channel's manifest
        record names, :meth:`PostingsCodec.of_record`), checked (indexer/integrity.py and the
        layout's own loader) before any kernel can read them: an out-of-range doc number or offset
        would make the kernels read or write out of bounds. ``n_lists``: the number of posting
        lists expected (vocabulary size); ``positive``: weights must be > 0 (BM25)."""
        directory = Path(directory)
        layout, quantised, nibbles = codec.doc_layout, codec.quantised, codec.nibbles
        dtypes = {"indptr": "int64", "docs": "int32", "weights": UINT8 if quantised else "float32", "scale": "float32", "offset": "float32"}
        names = tuple(n for n in _FILES if layout.csr or n != "docs") + (_QUANTISED_FILES if quantised else ())
        # the small per-list arrays are read whole: every query reads them
        arrays = {name: load_npy(directory / f"postings_{name}.npy", dtypes[name], 1, mmap and name not in _QUANTISED_FILES) for name in names}
        check_csr(directory, "postings_", arrays["indptr"], arrays.get("docs"), arrays["weights"], n_docs, n_lists, positive,
                  arrays.get("scale"), arrays.get("offset"), nibbles)
        if nibbles:
            arrays["weights"] = arrays["weights"].view(kernels.NIBBLES)
        numbers = layout.encode(arrays["indptr"], arrays["docs"], n_docs) if layout.csr else layout.load(directory, arrays["indptr"], n_docs, mmap)
        return cls(arrays["indptr"], numbers, arrays["weights"], n_docs, arrays.get("scale"), arrays.get("offset"))

    def search(self, q_tokens: np.ndarray, q_weights: np.ndarray | None = None, k: int = 10) -> tuple[np.ndarray, np.ndarray]:
        """Top-k (doc numbers, scores) of one query, best first."""
        q_tokens = np.asarray(q_tokens, dtype=np.int64)
        q_weights = np.ones(len(q_tokens), np.float32) if q_weights is None else np.asarray(q_weights, np.float32)
        parts = self.search_parts(q_tokens)
        if parts > 1:  # split over Numba's threads: the same ranking, bit for bit
            with _PARALLEL_KERNEL:
                return self.numbers.search(self.indptr, self.weights, self.scale, self.offset, q_tokens, q_weights, self.n_docs, k, parts)
        return self.numbers.search(self.indptr, self.weights, self.scale, self.offset, q_tokens, q_weights, self.n_docs, k)

    def search_parts(self, q_tokens: np.ndarray | None = None) -> int:
        """Document ranges a query's search is split into: 1 where it reads fewer than
        :data:`SPLIT_MIN_POSTINGS` postings (``q_tokens`` None: a query reading every list), else
        Numba's thread count, or more where ranges of :func:`range_docs` documents need more."""
        postings = int(self.indptr[-1]) if q_tokens is None else kernels.query_postings(self.indptr, np.asarray(q_tokens, np.int64))
        if postings < SPLIT_MIN_POSTINGS:
            return 1
        return max(1, min(numba.get_num_threads(), self.n_docs), -(-self.n_docs // range_docs()))

    def batch_search(self, queries: list[tuple[np.ndarray, np.ndarray]], k: int = 10) -> tuple[np.ndarray, np.ndarray]:
        """Top-k of many (tokens, weights) queries in parallel; padded with -1 / -inf."""
        lengths = np.array([len(t) for t, _ in queries], dtype=np.int64)
        q_indptr = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
        q_tokens = np.concatenate([np.asarray(t, np.int64) for t, _ in queries]) if queries else np.zeros(0, np.int64)
        q_weights = np.concatenate([np.asarray(w, np.float32) for _, w in queries]) if queries else np.zeros(0, np.float32)
        with _PARALLEL_KERNEL:
            return self.numbers.search_many(self.indptr, self.weights, self.scale, self.offset, q_indptr, q_tokens, q_weights, self.n_docs, k)

    def contributions(self, q_tokens: np.ndarray, doc: int) -> np.ndarray:
        """The document's weight for each query token (0 where the document lacks it)."""
        return self.numbers.contributions(self.indptr, self.weights, self.scale, self.offset, np.asarray(q_tokens, np.int64), doc)

    def doc_vectors(self):
        """Documents x tokens sparse matrix (scipy CSR), e.g. for export."""
        import scipy.sparse as sp

        return sp.csr_matrix((self.float_weights(), self.doc_numbers(), self.indptr), shape=(self.vocab_size, self.n_docs)).T.tocsr()


def quantise_weights(indptr: np.ndarray, weights: np.ndarray, per_list: bool = True,
                     levels: int = IMPACT_LEVELS) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(uint8 codes, scale, offset) of float32 ``weights`` in CSR lists ``indptr``: per list
    (:func:`kernels.quantise_lists`) or, ``per_list`` False, one affine map for all of them;
    each map spreads the weights over ``levels`` codes (2 to 256)."""
    codes = np.empty(weights.shape[0], np.uint8)
    scale = np.zeros(indptr.shape[0] - 1, np.float32)
    offset = np.zeros(indptr.shape[0] - 1, np.float32)
    _quantise_into(indptr, weights, codes, scale, offset, per_list, levels)
    return codes, scale, offset


def check_levels(levels: int) -> int:
    """``levels`` if it is a count of impact levels a uint8 code can hold (2 to 256), else ValueError."""
    if isinstance(levels, bool) or not isinstance(levels, (int, np.integer)) or not 2 <= levels <= IMPACT_LEVELS:
        raise ValueError(f"impact levels must be an integer from 2 to {IMPACT_LEVELS}, not {levels!r}")
    return int(levels)


def _quantise_into(indptr, weights, codes, scale, offset, per_list: bool, levels: int = IMPACT_LEVELS) -> None:
    levels = check_levels(levels)
    if per_list:
        kernels.quantise_lists(np.asarray(indptr, np.int64), weights, codes, scale, offset, levels)
        return
    if weights.shape[0] == 0:
        return
    lo = min(float(np.min(weights[s])) for s in _blocks(weights.shape[0]))
    hi = max(float(np.max(weights[s])) for s in _blocks(weights.shape[0]))
    step = np.float32((hi - lo) / (levels - 1))
    scale[:], offset[:] = step, np.float32(lo)
    # one list of everything: the same rounding as the per-list kernel
    whole = np.array([0, 0], np.int64)
    s1, o1 = np.zeros(1, np.float32), np.zeros(1, np.float32)
    for s in _blocks(weights.shape[0]):
        block = np.concatenate([np.asarray(weights[s], np.float32), np.array([lo, hi], np.float32)])
        out = np.empty(block.shape[0], np.uint8)
        whole[1] = block.shape[0]
        kernels.quantise_lists(whole, block, out, s1, o1, levels)
        codes[s] = out[:-2]


def _blocks(n: int, size: int = 1 << 24) -> Iterator[slice]:
    for start in range(0, n, size):
        yield slice(start, min(start + size, n))
