"""4-bit impacts (format 6): the aligned-token codes stored two a byte.

The reference is the same index with its 16-level codes one a byte (format 3-5): the kernels must
return the same documents with the same scores, bit for bit, whatever the doc-number layout.
"""
from __future__ import annotations

import json
import shutil

import numpy as np
import pytest
from conftest import toy_docs, write_corpus
from test_kernels import random_index, random_query

from indexer import kernels
from indexer.build import build_index
from indexer.codec import PostingsCodec
from indexer.compact import compact_copy, main
from indexer.corpus import document_from_object
from indexer.inverted_index import InvertedIndex
from indexer.manifest import (
    MANIFEST,
    NIBBLE_FORMAT_VERSION,
    RANGE_FORMAT_VERSION,
    STREAM_FORMAT_VERSION,
    UINT4_IMPACTS,
    IndexFormatError,
    Manifest,
)
from indexer.reader import open_index
from indexer.updates import update_index
from indexer.verify import verify
from retriever.retriever import Retriever

LAYOUTS = ("int32", "packed", "ranges")
_CODEC_LAYOUT = {"int32": "int32", "packed": "stream", "ranges": "range16"}


def _layout(index: InvertedIndex, layout: str) -> InvertedIndex:
    return index.pack() if layout == "packed" else index.split_ranges() if layout == "ranges" else index


def test_nibbles_pack_two_codes_a_byte_and_unpack_them():
    rng = np.random.default_rng(0)
    for n in (0, 1, 2, 7, 1000):
        codes = rng.integers(0, 16, n).astype(np.uint8)
        packed = kernels.pack_nibbles(codes)
        assert packed.dtype == np.uint8 and packed.shape == ((n + 1) // 2,)
        np.testing.assert_array_equal(kernels.unpack_nibbles(packed, n), codes)
        view = packed.view(kernels.NIBBLES)
        assert [kernels.code_at(view, p) for p in range(n)] == codes.tolist()
    assert kernels.pack_nibbles(np.array([1, 2], np.uint8)).tolist() == [0x21]  # posting 0 in the low half
    with pytest.raises(ValueError, match="does not fit half a byte"):
        kernels.pack_nibbles(np.array([3, 16], np.uint8))


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("seed", range(12))
def test_nibble_kernels_score_as_the_same_codes_one_a_byte(seed, layout):
    rng = np.random.default_rng(seed)
    index = random_index(rng, "float")
    bytes8 = _layout(index.quantise(per_list=seed % 3 != 0, levels=16), layout)
    bytes4 = bytes8.to_nibbles()
    assert bytes4.nibbles and not bytes8.nibbles and bytes4.weights.nbytes == (int(index.indptr[-1]) + 1) // 2
    queries = [random_query(rng, index.vocab_size, "float") for _ in range(4)]
    for k in (1, 5, 100):
        for tokens, w in queries:
            for got, want in zip(bytes4.search(tokens, w, k), bytes8.search(tokens, w, k)):
                np.testing.assert_array_equal(got, want)
            doc = int(rng.integers(0, index.n_docs))
            np.testing.assert_array_equal(bytes4.contributions(tokens, doc), bytes8.contributions(tokens, doc))
        for got, want in zip(bytes4.batch_search(queries, k), bytes8.batch_search(queries, k)):
            np.testing.assert_array_equal(got, want)
    tokens, w = queries[0]
    t = np.asarray(tokens, np.int64)
    args = (bytes8.scale, bytes8.offset, t, w, index.n_docs, 5)
    if layout == "int32":  # one query split across document ranges
        split = [x.numbers.search(x.indptr, x.weights, *args, 3) for x in (bytes4, bytes8)]
    elif layout == "packed":
        split = [x.packed.search_split(x.indptr, x.weights, *args, 3) for x in (bytes4, bytes8)]
    else:
        split = [x.ranges.search(x.indptr, x.weights, *args, parallel=True) for x in (bytes4, bytes8)]
    for got, want in zip(*split):
        np.testing.assert_array_equal(got, want)
    np.testing.assert_array_equal(bytes4.float_weights(), bytes8.float_weights())


@pytest.mark.parametrize("layout", LAYOUTS)
def test_nibbles_save_and_load_as_they_were(tmp_path, layout):
    rng = np.random.default_rng(3)
    index = _layout(random_index(rng, "float").quantise(levels=16), layout).to_nibbles()
    index.save(tmp_path)
    assert np.load(tmp_path / "postings_weights.npy").dtype == np.uint8
    got = InvertedIndex.load(tmp_path, index.n_docs, codec=PostingsCodec.named(_CODEC_LAYOUT[layout], 4))
    assert got.nibbles
    np.testing.assert_array_equal(np.asarray(got.weights), index.weights)
    np.testing.assert_array_equal(got.float_weights(), index.float_weights())
    np.testing.assert_array_equal(got.doc_numbers(), index.doc_numbers())
    # read as one code a byte, the file is too short for its postings: refused by name
    with pytest.raises(IndexFormatError, match="postings_weights.npy"):
        InvertedIndex.load(tmp_path, index.n_docs, codec=PostingsCodec.named(_CODEC_LAYOUT[layout], 8))


def test_nibble_saved_equals_to_nibbles_in_memory(tmp_path):
    rng = np.random.default_rng(4)
    index = random_index(rng, "float").quantise(levels=16)
    index.save(tmp_path)
    InvertedIndex.nibble_saved(tmp_path)
    got = InvertedIndex.load(tmp_path, index.n_docs, codec=PostingsCodec.named("int32", 4))
    np.testing.assert_array_equal(np.asarray(got.weights), index.to_nibbles().weights)
    with pytest.raises(ValueError, match="at most 16 levels"):
        index.to_nibbles().to_nibbles()


# ------------------------------------------------------------------ indexes
@pytest.fixture(scope="module")
def encoder(tmp_path_factory):
    from conftest import save_tiny_sentence_encoder

    from embedder.sentence_encoder import SentenceEncoder

    return SentenceEncoder.load(save_tiny_sentence_encoder(tmp_path_factory.mktemp("tiny-st"), seed=0))


@pytest.fixture
def plain(tmp_path, tiny_embedder, encoder):
    corpus = write_corpus(tmp_path / "c", toy_docs(40, seed=3), "beir")
    build_index(corpus, tmp_path / "plain", tiny_embedder, top_k=16, lexical="words", encoder=encoder, progress=False)
    return tmp_path / "plain"


def _hits(index, embedder, mode: str) -> list[list[tuple[str, float]]]:
    queries = ["cat and dog near the river", "computer memory", "game", "snow"]
    with Retriever.load(index, embedder=embedder, query_encoder="llm", profile=None) as r:
        return [[(h.doc_id, float(h.score)) for h in hits] for hits in r.batch_search(queries, k=10, mode=mode)]


@pytest.mark.parametrize("doc_ids", ["int32", "packed", "range16"])
def test_a_4_bit_copy_is_format_6_half_the_code_bytes_and_ranks_as_16_levels_a_byte(plain, tiny_embedder, tmp_path, doc_ids):
    layout = {"pack_doc_ids": doc_ids == "packed", "range_doc_ids": doc_ids == "range16"}
    m4 = compact_copy(plain, tmp_path / "u4", impact_bits=4, **layout)
    m8 = compact_copy(plain, tmp_path / "l16", impact_levels=16, **layout)
    version = STREAM_FORMAT_VERSION if doc_ids == "packed" else NIBBLE_FORMAT_VERSION  # bit-packed doc numbers: format 7, either width
    assert m4.format_version == version and m4.record("sparse")["impacts"] == UINT4_IMPACTS and "levels" not in m4.record("sparse")
    assert m4.record("lexical")["impacts"] == "uint8" and m4.compact and m4.build["compacted"]["impact_bits"] == 4
    assert m4.record("sparse").get("doc_ids") == m8.record("sparse").get("doc_ids")
    u4, l16 = (tmp_path / "u4").resolve(), (tmp_path / "l16").resolve()
    nnz = int(np.load(u4 / "postings_indptr.npy")[-1])
    assert np.load(u4 / "postings_weights.npy").shape == ((nnz + 1) // 2,) and np.load(l16 / "postings_weights.npy").shape == (nnz,)
    assert verify(tmp_path / "u4").ok, verify(tmp_path / "u4").problems
    for mode in ("sparse", "hybrid"):
        assert _hits(tmp_path / "u4", tiny_embedder, mode) == _hits(tmp_path / "l16", tiny_embedder, mode), mode


def test_a_4_bit_index_stays_4_bit_through_an_update(plain, tiny_embedder, encoder, tmp_path):
    compact_copy(plain, tmp_path / "u4", impact_bits=4, range_doc_ids=True)
    added = [document_from_object(d, "test", i) for i, d in enumerate(toy_docs(46, seed=9)[40:], start=1)]
    update_index(tmp_path / "u4", add=added, embedder=tiny_embedder, encoder=encoder, progress=False)
    m = Manifest.read((tmp_path / "u4").resolve())
    assert m.n_docs == 46 and m.format_version == NIBBLE_FORMAT_VERSION and m.record("sparse")["impacts"] == UINT4_IMPACTS and m.ranged
    assert verify(tmp_path / "u4").ok, verify(tmp_path / "u4").problems
    opened = open_index(tmp_path / "u4")
    try:
        sparse = opened.channels["sparse"]
        assert sparse.nibbles and sparse.weights.shape == ((int(sparse.indptr[-1]) + 1) // 2,)
    finally:
        opened.close()
    assert all(_hits(tmp_path / "u4", tiny_embedder, "sparse"))


def test_build_index_writes_4_bit_impacts(tmp_path, tiny_embedder, encoder):
    corpus = write_corpus(tmp_path / "c", toy_docs(30, seed=5), "beir")
    m = build_index(corpus, tmp_path / "u4", tiny_embedder, top_k=16, lexical="words", compact=True, doc_ids="bitstream-128",
                    impact_bits=4, progress=False)
    assert m.format_version == STREAM_FORMAT_VERSION and m.record("sparse")["impacts"] == UINT4_IMPACTS and m.packed
    assert m.record("lexical")["impacts"] == "uint8" and verify(tmp_path / "u4").ok
    build_index(corpus, tmp_path / "plain", tiny_embedder, top_k=16, lexical="words", progress=False)
    compact_copy(tmp_path / "plain", tmp_path / "copy", impact_bits=4, pack_doc_ids=True)
    built, copied = (tmp_path / "u4").resolve(), (tmp_path / "copy").resolve()
    for rel in ("postings_weights.npy", "postings_packed.npy", "postings_scale.npy", "lexical/postings_weights.npy"):
        assert (built / rel).read_bytes() == (copied / rel).read_bytes(), rel  # a build writes what a copy writes
    with pytest.raises(ValueError, match="go with a compact index"):
        build_index(corpus, tmp_path / "bad", tiny_embedder, top_k=16, impact_bits=4, progress=False)
    with pytest.raises(ValueError, match="impact bits"):
        build_index(corpus, tmp_path / "bad", tiny_embedder, top_k=16, compact=True, impact_bits=2, progress=False)


def test_the_compact_command_takes_impact_bits(plain, tmp_path):
    assert main([str(plain), str(tmp_path / "u4"), "--impact-bits", "4", "--range-doc-ids"]) == 0
    m = Manifest.read((tmp_path / "u4").resolve())
    assert m.format_version == NIBBLE_FORMAT_VERSION and m.ranged
    assert main([str(plain), str(tmp_path / "bad"), "--impact-bits", "4", "--impact-levels", "32"]) == 2


def test_format_6_and_4_bit_impacts_must_agree(plain, tmp_path, monkeypatch):
    compact_copy(plain, tmp_path / "u4", impact_bits=4)
    compact_copy(plain, tmp_path / "u8", range_doc_ids=True)
    for i, (src, change, says) in enumerate([
        ("u8", lambda d: d["channels"]["sparse"].update(impacts="uint4"), "4-bit impacts are format 6"),
        ("u4", lambda d: d.update(format_version=RANGE_FORMAT_VERSION), "4-bit impacts are format 6"),
        ("u4", lambda d: d["channels"]["sparse"].update(impacts="uint8"), "format 6 needs them"),
        ("u4", lambda d: d["channels"]["lexical"].update(impacts="uint4"), "lexical.impacts"),
        ("u4", lambda d: d["channels"]["sparse"].update(levels=32), "sparse.levels"),
    ]):
        index = tmp_path / f"bad-{i}"
        shutil.copytree((tmp_path / src).resolve(), index)
        data = json.loads((index / MANIFEST).read_text())
        change(data)
        (index / MANIFEST).write_text(json.dumps(data))
        with pytest.raises(IndexFormatError, match=says):
            Manifest.read(index)
    from indexer import manifest

    monkeypatch.setattr(manifest, "READABLE_VERSIONS", (1, 2, 3, 4, 5))  # a reader from before format 6
    with pytest.raises(IndexFormatError, match="index format 6"):
        Manifest.read((tmp_path / "u4").resolve())
