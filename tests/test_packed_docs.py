"""Bit-packed doc numbers (indexer/packed_docs.py; the stream of format 7, the blocks of format 4):
lossless against the compact index they come from (the same top-k ids and scores, bit for bit),
checked at load, and verified; format 4 indexes still read."""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
from conftest import build_every_channel, format_4_copy, reseal

from indexer.codec import PostingsCodec
from indexer.compact import compact_copy
from indexer.inverted_index import InvertedIndex, quantise_weights
from indexer.manifest import (
    BITPACKED_DOC_IDS,
    BITSTREAM_DOC_IDS,
    COMPACT_FORMAT_VERSION,
    MANIFEST,
    PACKED_FORMAT_VERSION,
    STREAM_FORMAT_VERSION,
    IndexFormatError,
    Manifest,
)
from indexer.packed_docs import BLOCK, PackedDocs
from indexer.reader import open_index
from indexer.verify import verify

N_DOCS = 2**31 - 1  # the largest doc number an int32 holds + 1: gaps of 31 bits


def edge_lists(rng: np.random.Generator) -> list[np.ndarray]:
    """Posting lists of the shapes the block layout must get right."""
    def sample(n: int, high: int) -> np.ndarray:
        return np.sort(rng.choice(high, n, replace=False)).astype(np.int32)

    return [
        np.zeros(0, np.int32),  # empty
        np.array([7], np.int32),  # one posting
        np.array([N_DOCS - 1], np.int32),  # one posting, the last doc number
        sample(BLOCK, 10**6),  # exactly a block
        sample(BLOCK + 1, 10**6),  # a block plus one
        sample(2 * BLOCK - 1, 10**6),
        sample(3 * BLOCK, 3 * BLOCK),  # consecutive: width 0
        np.array([0, N_DOCS - 1], np.int32),  # the largest gap
        np.array([0, 1, 2, N_DOCS - 2, N_DOCS - 1], np.int32),
        np.concatenate([np.arange(BLOCK, dtype=np.int32), [N_DOCS - 1]]).astype(np.int32),  # a wide block of one gap
        np.zeros(0, np.int32),
        sample(1000, 2**30) + 2**30,  # wide gaps in every block
        sample(5 * BLOCK + 17, 10**5),
    ]


def index_of(lists: list[np.ndarray], n_docs: int, seed: int) -> InvertedIndex:
    rng = np.random.default_rng(seed)
    indptr = np.concatenate([[0], np.cumsum([len(x) for x in lists])]).astype(np.int64)
    docs = np.concatenate(lists).astype(np.int32)
    weights = rng.gamma(2.0, 1.0, docs.shape[0]).astype(np.float32)
    codes, scale, offset = quantise_weights(indptr, weights)
    return InvertedIndex(indptr, docs, codes, n_docs, scale, offset)


def random_lists(rng: np.random.Generator, n_lists: int, n_docs: int) -> list[np.ndarray]:
    lengths = np.minimum(rng.zipf(1.3, n_lists), n_docs)
    lengths[rng.random(n_lists) < 0.1] = 0
    return [np.sort(rng.choice(n_docs, int(n), replace=False)).astype(np.int32) for n in lengths]


def assert_same_search(plain: InvertedIndex, packed: InvertedIndex, queries: list[tuple[np.ndarray, np.ndarray]], k: int) -> None:
    for tokens, weights in queries:
        want, got = plain.search(tokens, weights, k), packed.search(tokens, weights, k)
        np.testing.assert_array_equal(got[0], want[0])
        np.testing.assert_array_equal(got[1], want[1])  # bit for bit: the same sums in the same order
    want, got = plain.batch_search(queries, k), packed.batch_search(queries, k)
    np.testing.assert_array_equal(got[0], want[0])
    np.testing.assert_array_equal(got[1], want[1])


@pytest.mark.parametrize("stream", [True, False])
def test_edge_lists_round_trip_and_search_exactly(tmp_path, stream):
    rng = np.random.default_rng(0)
    lists = edge_lists(rng)
    q8 = index_of(lists, N_DOCS, 0)
    packed = q8.pack(stream)
    assert packed.docs is None and packed.packed is not None and packed.packed.stream == stream
    np.testing.assert_array_equal(packed.doc_numbers(), q8.docs)
    assert int(packed.packed.width.max()) == 31  # a gap of 2**31 - 2 (+ 1)
    # saved, loaded and checked as an index is
    packed.save(tmp_path)
    assert not (tmp_path / "postings_docs.npy").exists()
    loaded = InvertedIndex.load(tmp_path, N_DOCS, codec=PostingsCodec.named("stream" if stream else "blocks", 8))
    assert loaded.packed.stream == stream and (tmp_path / "postings_blockskip.npy").exists() == stream
    np.testing.assert_array_equal(loaded.doc_numbers(), q8.docs)
    np.testing.assert_array_equal(loaded.packed.first, packed.packed.first)  # the stream's first doc numbers read back
    np.testing.assert_array_equal(loaded.packed.block_bit, packed.packed.block_bit)
    with pytest.raises(IndexFormatError, match="postings_blockskip.npy" if stream else "postings_blockfirst.npy"):
        InvertedIndex.load(tmp_path, N_DOCS, codec=PostingsCodec.named("blocks" if stream else "stream", 8))  # the manifest expects the other layout
    for t, lst in enumerate(lists):
        for d in lst[:: max(1, len(lst) // 40)]:
            p = loaded.packed.find(loaded.indptr, t, int(d))
            assert p >= 0 and q8.docs[p] == d
        absent = next(i for i in range(10**6) if i not in set(lst.tolist()))
        assert loaded.packed.find(loaded.indptr, t, absent) == -1
    tokens = np.arange(len(lists), dtype=np.int64)
    np.testing.assert_array_equal(loaded.contributions(tokens, 0), q8.contributions(tokens, 0))
    np.testing.assert_array_equal(loaded.contributions(tokens, N_DOCS - 1), q8.contributions(tokens, N_DOCS - 1))


@pytest.mark.parametrize("seed, stream", [(1, True), (2, True), (3, False)])
def test_random_lists_search_exactly_as_unpacked(seed, stream):
    rng = np.random.default_rng(seed)
    n_docs = int(rng.integers(300, 5000))
    lists = random_lists(rng, 200, n_docs) + [np.zeros(0, np.int32), np.arange(n_docs, dtype=np.int32)]
    q8 = index_of(lists, n_docs, seed)
    packed = q8.pack(stream)
    np.testing.assert_array_equal(packed.doc_numbers(), q8.docs)
    queries = []
    for _ in range(25):
        n = int(rng.integers(0, 40))
        tokens = rng.integers(-2, len(lists) + 2, n).astype(np.int64)  # out-of-range tokens are skipped
        queries.append((tokens, rng.random(n).astype(np.float32)))
    for k in (1, 10, 100):
        assert_same_search(q8, packed, queries, k)
    doc = int(rng.integers(n_docs))
    tokens = np.arange(len(lists), dtype=np.int64)
    np.testing.assert_array_equal(packed.contributions(tokens, doc), q8.contributions(tokens, doc))
    np.testing.assert_array_equal(packed.doc_vectors().toarray(), q8.doc_vectors().toarray())


@pytest.mark.parametrize("seed", [4, 5])
def test_one_query_split_by_document_range_is_the_packed_search_bit_for_bit(seed, monkeypatch):
    from indexer import inverted_index

    rng = np.random.default_rng(seed)
    n_docs = int(rng.integers(300, 5000))
    # long lists: blocks of 128 that straddle the parts' boundaries, and a list of every document
    lists = random_lists(rng, 200, n_docs) + [np.zeros(0, np.int32), np.arange(n_docs, dtype=np.int32),
                                               np.sort(rng.choice(n_docs, n_docs // 2, replace=False)).astype(np.int32)]
    packed = index_of(lists, n_docs, seed).pack()
    p = packed.packed
    for _ in range(25):
        n = int(rng.integers(0, 40))
        tokens = rng.integers(-2, len(lists) + 2, n).astype(np.int64)
        weights = rng.normal(size=n).astype(np.float32)  # negative weights too
        for k in (0, 1, 10, n_docs + 3):
            want = packed.search(tokens, weights, k)
            arrays = (packed.indptr, packed.weights, packed.scale, packed.offset)
            for parts in (1, 2, 3, 7, n_docs + 2):  # more parts than documents: empty ranges
                got = p.search_split(*arrays, tokens, weights, n_docs, k, parts)
                np.testing.assert_array_equal(got[0], want[0])
                np.testing.assert_array_equal(got[1], want[1])
            for whole_from in (0.0, np.inf):  # either way of ranking the accumulators, forced
                for got in (p.search(*arrays, tokens, weights, n_docs, k, whole_from=whole_from),
                            p.search(*arrays, tokens, weights, n_docs, k, 2, whole_from=whole_from)):
                    np.testing.assert_array_equal(got[0], want[0])
                    np.testing.assert_array_equal(got[1], want[1])
    # and through InvertedIndex.search once the index is over the threshold
    monkeypatch.setattr(inverted_index, "SPLIT_MIN_POSTINGS", 1)
    tokens = np.arange(len(lists), dtype=np.int64)
    weights = rng.random(len(lists)).astype(np.float32)
    want = index_of(lists, n_docs, seed).search(tokens, weights, 10)  # unpacked 8-bit impacts, split the same way
    got = packed.search(tokens, weights, 10)
    np.testing.assert_array_equal(got[0], want[0])
    np.testing.assert_array_equal(got[1], want[1])


def test_packing_needs_8_bit_impacts_and_ascending_docs():
    plain = InvertedIndex(np.array([0, 2], np.int64), np.array([3, 5], np.int32), np.ones(2, np.float32), 10)
    with pytest.raises(ValueError, match="8-bit impacts"):
        plain.pack()
    with pytest.raises(ValueError, match="not ascending"):
        PackedDocs.pack(np.array([0, 2], np.int64), np.array([5, 3], np.int32))


def test_the_stream_is_smaller_than_the_blocks_on_short_lists():
    # adi-like: 82 documents, lists of 1-5 postings; each block's int32 first doc number and its
    # word alignment are what the stream saves (and every doc number still reads back)
    rng = np.random.default_rng(7)
    lists = [np.sort(rng.choice(82, int(n), replace=False)).astype(np.int32) for n in rng.integers(1, 6, 3000)]
    q8 = index_of(lists, 82, 7)
    stream, blocks = q8.pack(True).packed, q8.pack(False).packed
    assert stream.nbytes < blocks.nbytes / 2
    assert int(stream.words[0]) == 7  # doc numbers up to 81: 7 bits each list's first
    assert stream.skip().shape[0] == 0  # no list has a second block
    np.testing.assert_array_equal(stream.decode(q8.indptr), q8.docs)


# ------------------------------------------------------------------ indexes
QUERIES = ["cat and dog near the river", "computer memory", "game", "a puzzle for the team", "snow", "river bank money"]


@pytest.fixture(scope="module")
def indexes(tmp_path_factory, tiny_tokenizer):
    """A plain tiny index and its compact copies: format 3 (int32 doc numbers), 7 (packed as a
    stream) and 4 (packed in blocks, as sessions before format 7 wrote it: format 3's postings
    packed in place)."""
    pytest.importorskip("sentence_transformers")
    root = tmp_path_factory.mktemp("packed")
    embedder = build_every_channel(root, tiny_tokenizer)
    compact_copy(root / "plain", root / "compact")
    m = compact_copy(root / "plain", root / "packed", pack_doc_ids=True)
    assert m.format_version == STREAM_FORMAT_VERSION
    format_4_copy(root / "compact", root / "blocks")
    return root, embedder


@pytest.mark.parametrize("name, version, doc_ids, head", [
    ("packed", STREAM_FORMAT_VERSION, BITSTREAM_DOC_IDS, "postings_blockskip.npy"),
    ("blocks", PACKED_FORMAT_VERSION, BITPACKED_DOC_IDS, "postings_blockfirst.npy"),
])
def test_a_packed_copy_is_its_format_and_verifies(indexes, name, version, doc_ids, head):
    root, _ = indexes
    m = Manifest.read((root / name).resolve())
    assert m.format_version == version and m.packed and m.compact and m.record("sparse")["doc_ids"] == m.record("lexical")["doc_ids"] == doc_ids
    assert Manifest.read((root / "compact").resolve()).format_version == COMPACT_FORMAT_VERSION
    d = (root / name).resolve()
    assert not (d / "postings_docs.npy").exists() and not (d / "lexical" / "postings_docs.npy").exists()
    for rel in (head, "postings_blockwidth.npy", "postings_packed.npy", "lexical/postings_packed.npy"):
        assert rel in m.files
    report = verify(root / name)
    assert report.ok, report.problems


@pytest.mark.parametrize("name", ["packed", "blocks"])
def test_a_packed_index_searches_exactly_as_the_compact_one(indexes, name):
    from retriever.retriever import Retriever

    root, embedder = indexes
    a, b = open_index(root / "compact"), open_index(root / name)
    try:
        for mode in ("sparse", "bm25"):
            x, y = a.channels[mode], b.channels[mode]
            x, y = (x.postings, y.postings) if mode == "bm25" else (x, y)
            assert y.packed is not None and y.docs is None and x.packed is None and y.packed.stream == (name == "packed")
            np.testing.assert_array_equal(y.doc_numbers(), x.docs)
    finally:
        a.close()
        b.close()
    for mode in ("sparse", "bm25", "hybrid"):
        runs = []
        for index in ("compact", name):
            with Retriever.load(root / index, embedder=embedder, query_encoder="llm", profile=None) as r:
                runs.append([[(h.doc_id, h.score) for h in hits] for hits in r.batch_search(QUERIES, k=10, mode=mode)])
        assert runs[0] == runs[1], mode
        assert any(runs[0]), mode


def _copy(indexes, tmp_path: Path, name: str, src: str = "packed") -> Path:
    index = tmp_path / name
    shutil.copytree((indexes[0] / src).resolve(), index)
    return index




def test_a_flipped_byte_is_one_line_of_verify(indexes, tmp_path):
    index = _copy(indexes, tmp_path, "flipped")
    data = bytearray((index / "postings_packed.npy").read_bytes())
    data[-4 * 3 - 4] ^= 0xFF  # a byte of the first word of the last block's gaps (two words of padding follow)
    (index / "postings_packed.npy").write_bytes(bytes(data))
    report = verify(index)
    assert not report.ok
    lines = [p for p in report.problems if "postings_packed.npy" in p]
    assert len(lines) == 1 and "checksum" in lines[0], report.problems


def _words_past_first(a: np.ndarray) -> np.ndarray:
    out = np.full_like(a, 0xFFFFFFFF)
    out[0] = a[0]  # the stream's first-doc width kept: the doc numbers are what is damaged
    return out


@pytest.mark.parametrize("src, rel, damage, says", [
    ("packed", "postings_packed.npy", _words_past_first, "outside|undecodable"),
    ("packed", "postings_packed.npy", lambda a: a[:-1], "words"),
    ("packed", "postings_packed.npy", lambda a: np.where(np.arange(a.size) == 0, 0, a).astype(np.uint32), "word 0"),
    ("packed", "postings_blockwidth.npy", lambda a: np.where(np.arange(a.size) == 0, 40, a).astype(np.uint8), "over 32"),
    ("packed", "postings_blockwidth.npy", lambda a: np.full_like(a, 32), "words"),
    ("packed", "lexical/postings_packed.npy", _words_past_first, "outside|undecodable"),
    ("blocks", "postings_packed.npy", lambda a: np.full_like(a, 0xFFFFFFFF), "undecodable"),
    ("blocks", "postings_packed.npy", lambda a: a[:-1], "words"),
    ("blocks", "postings_blockfirst.npy", lambda a: a[:-1], "blocks of 128"),
    ("blocks", "postings_blockfirst.npy", lambda a: np.full_like(a, -1), "outside"),
    ("blocks", "lexical/postings_packed.npy", lambda a: np.full_like(a, 0xFFFFFFFF), "undecodable"),
])  # fmt: skip
def test_structural_damage_is_refused_by_name(indexes, tmp_path, src, rel, damage, says):
    index = _copy(indexes, tmp_path, "damaged", src)
    np.save(index / rel, damage(np.load(index / rel)))
    reseal(index)  # only the structural checks can see it now
    with pytest.raises(IndexFormatError, match=says) as err:
        open_index(index)
    assert Path(rel).name in str(err.value)
    report = verify(index)
    assert not report.ok and any(Path(rel).name in p for p in report.problems)


def test_format_and_packed_doc_ids_must_agree(indexes, tmp_path):
    root, _ = indexes
    for name, src, change, says in (
        ("packed-as-3", "packed", lambda m: m.update(format_version=COMPACT_FORMAT_VERSION), "doc numbers in an index of format 3"),
        ("stream-as-4", "packed", lambda m: m.update(format_version=PACKED_FORMAT_VERSION), "doc numbers in an index of format 4"),
        ("blocks-as-7", "blocks", lambda m: m.update(format_version=STREAM_FORMAT_VERSION), "doc numbers in an index of format 7"),
        ("compact-as-4", "compact", lambda m: m.update(format_version=PACKED_FORMAT_VERSION), "format 4 needs 'bitpacked-128'"),
        ("compact-as-7", "compact", lambda m: m.update(format_version=STREAM_FORMAT_VERSION), "format 7 needs 'bitstream-128'"),
        ("unknown", "packed", lambda m: m["channels"]["sparse"].update(doc_ids="vbyte"), "'vbyte' is not one of"),
        ("no-impacts", "packed", lambda m: m["channels"]["lexical"].pop("impacts"), "without 8-bit impacts"),
    ):
        index = tmp_path / name
        shutil.copytree((root / src).resolve(), index)
        data = json.loads((index / MANIFEST).read_text())
        change(data)
        (index / MANIFEST).write_text(json.dumps(data))
        with pytest.raises(IndexFormatError, match=says):
            Manifest.read(index)


def test_a_reader_of_formats_1_to_3_refuses_a_packed_index(indexes, monkeypatch):
    from indexer import manifest

    monkeypatch.setattr(manifest, "READABLE_VERSIONS", (1, 2, 3))
    with pytest.raises(IndexFormatError, match="index format 4"):
        Manifest.read((indexes[0] / "blocks").resolve())
    monkeypatch.setattr(manifest, "READABLE_VERSIONS", (1, 2, 3, 4, 5, 6))  # a reader of session 18
    with pytest.raises(IndexFormatError, match="index format 7"):
        Manifest.read((indexes[0] / "packed").resolve())
    Manifest.read((indexes[0] / "compact").resolve())
