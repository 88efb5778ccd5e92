"""Range-blocked doc numbers (indexer/range_docs.py, format 5): lossless against the compact index
they come from (the same top-k ids and scores, bit for bit, every way of ranking), and checked at load."""
from __future__ import annotations

import numba
import numpy as np
import pytest

from indexer import kernels, range_docs
from indexer.codec import PostingsCodec
from indexer.inverted_index import InvertedIndex, quantise_weights
from indexer.manifest import RANGE_DOC_IDS, RANGE_FORMAT_VERSION, IndexFormatError, Manifest
from indexer.range_docs import RANGE, RangeDocs, n_ranges

RANGE16 = PostingsCodec.named("range16", 8)


def random_index(seed: int, n_docs: int, vocab: int = 60, density: float = 0.02, negative: bool = False) -> InvertedIndex:
    """A compact index whose lists cross range boundaries (and leave some ranges empty)."""
    rng = np.random.default_rng(seed)
    lists = []
    for t in range(vocab):
        n = int(rng.integers(0, int(density * n_docs) + 2)) if t % 7 else 0  # every 7th list empty
        lists.append(np.sort(rng.choice(n_docs, min(n, n_docs), replace=False)).astype(np.int32))
    lists[1] = np.array([0, RANGE - 1, RANGE, n_docs - 1], np.int32)[: 4 if n_docs > RANGE else 1]  # the boundaries
    indptr = np.concatenate([[0], np.cumsum([len(x) for x in lists])]).astype(np.int64)
    docs = np.concatenate(lists).astype(np.int32)
    weights = rng.gamma(2.0, 1.0, docs.shape[0]).astype(np.float32) + (-1.5 if negative else 0.5)
    codes, scale, offset = quantise_weights(indptr, weights)
    return InvertedIndex(indptr, docs, codes, n_docs, scale, offset)


def queries(seed: int, vocab: int, n: int = 12, negative: bool = False) -> list[tuple[np.ndarray, np.ndarray]]:
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(n):
        m = int(rng.integers(1, 25))
        toks = rng.choice(vocab + 3, m, replace=False).astype(np.int64) - 1  # -1 and ids past the vocabulary too
        w = rng.uniform(0.1, 2.0, m).astype(np.float32) * (rng.choice([-1, 1], m) if negative else 1)
        out.append((toks, w.astype(np.float32)))
    return out


def test_split_round_trips_and_sizes():
    idx = random_index(0, 3 * RANGE + 123)
    rd = RangeDocs.split(idx.indptr, idx.docs, idx.n_docs)
    assert rd.starts.shape == (idx.vocab_size, n_ranges(idx.n_docs) + 1) == (60, 5)
    assert np.array_equal(rd.decode(idx.indptr), idx.docs)
    assert rd.low.dtype == np.uint16 and rd.nbytes == rd.low.nbytes + rd.starts.nbytes
    assert n_ranges(0) == 1 and n_ranges(RANGE) == 1 and n_ranges(RANGE + 1) == 2
    with pytest.raises(ValueError, match="outside"):
        RangeDocs.split(idx.indptr, idx.docs, int(idx.docs.max()))


@pytest.mark.parametrize("negative", [False, True])
@pytest.mark.parametrize("n_docs", [50, RANGE, 2 * RANGE + 7])
def test_search_is_the_compact_search_bit_for_bit(n_docs, negative):
    idx = random_index(n_docs, n_docs, negative=negative)
    ranged = idx.split_ranges()
    assert ranged.docs is None and ranged.ranges is not None
    cases = 0
    qs = queries(n_docs + 1, idx.vocab_size, negative=negative)
    for q_tokens, q_weights in qs:
        positive = kernels.positive_query(idx.indptr, idx.scale, idx.offset, q_tokens, q_weights)
        cases += positive
        for k in (1, 10, 10**6):
            for whole_from in (0.0, np.inf):  # one pass over every range, or a touched list in each
                want = idx.numbers.search(idx.indptr, idx.weights, idx.scale, idx.offset, q_tokens, q_weights, n_docs, k, whole_from=whole_from)
                for parallel in (False, True):
                    got = ranged.ranges.search(idx.indptr, idx.weights, idx.scale, idx.offset, q_tokens, q_weights, n_docs, k, parallel=parallel,
                                               whole_from=whole_from)
                    assert np.array_equal(got[0], want[0]) and np.array_equal(got[1], want[1])
            got = ranged.search(q_tokens, q_weights, k)
            want = idx.search(q_tokens, q_weights, k)
            assert np.array_equal(got[0], want[0]) and np.array_equal(got[1], want[1])
    # the positive path (no flags) ran for every query where the weights allow it, and not for all where they do not
    assert cases == len(qs) if not negative else cases < len(qs)


def test_positive_query_needs_every_read_posting_positive():
    idx = random_index(3, 1000)
    toks = np.array([4, 5], np.int64)  # two non-empty lists
    assert np.all(np.diff(idx.indptr)[toks] > 0)
    assert kernels.positive_query(idx.indptr, idx.scale, idx.offset, toks, np.array([1.0, 0.5], np.float32))
    assert not kernels.positive_query(idx.indptr, idx.scale, idx.offset, toks, np.array([1.0, -0.5], np.float32))
    offset = idx.offset.copy()
    offset[5] = 0.0  # a posting at the list's lowest level would add 0: a touched document of score 0
    assert not kernels.positive_query(idx.indptr, idx.scale, offset, toks, np.array([1.0, 0.5], np.float32))
    # an empty list or an unknown token reads no posting, whatever its weight
    assert kernels.positive_query(idx.indptr, idx.scale, idx.offset, np.array([0, 4, -1], np.int64), np.array([-1.0, 1.0, -1.0], np.float32))


def test_batch_search_and_lookups_match_the_compact_index():
    idx = random_index(5, 2 * RANGE + 99)
    ranged = idx.split_ranges()
    qs = queries(6, idx.vocab_size)
    numba.set_num_threads(min(2, numba.config.NUMBA_NUM_THREADS))
    got, want = ranged.batch_search(qs, 7), idx.batch_search(qs, 7)
    assert np.array_equal(got[0], want[0]) and np.array_equal(got[1], want[1])
    rng = np.random.default_rng(1)
    for doc in [0, RANGE - 1, RANGE, idx.n_docs - 1, *rng.integers(0, idx.n_docs, 20)]:
        toks = np.arange(-1, idx.vocab_size + 1, dtype=np.int64)
        assert np.array_equal(ranged.contributions(toks, int(doc)), idx.contributions(toks, int(doc)))
    assert ranged.ranges.find(ranged.indptr, 1, -1) == -1 and ranged.ranges.find(ranged.indptr, 1, 10 * RANGE) == -1
    assert np.array_equal(ranged.doc_numbers(), idx.docs)
    assert ranged.nbytes < idx.nbytes


def test_saved_and_loaded_then_checked(tmp_path):
    idx = random_index(7, RANGE + 500)
    ranged = idx.split_ranges()
    ranged.save(tmp_path)
    assert not (tmp_path / "postings_docs.npy").exists()
    back = InvertedIndex.load(tmp_path, idx.n_docs, codec=RANGE16)
    assert np.array_equal(back.doc_numbers(), idx.docs)
    q = queries(8, idx.vocab_size, 1)[0]
    assert all(np.array_equal(a, b) for a, b in zip(back.search(*q), idx.search(*q)))
    # in place from format 3 files, as compact_copy does
    plain = tmp_path / "plain"
    plain.mkdir()
    idx.save(plain)
    InvertedIndex.encode_saved(plain, "range16", idx.n_docs)
    assert sorted(p.name for p in plain.iterdir()) == sorted(p.name for p in tmp_path.glob("postings_*"))
    assert np.array_equal(InvertedIndex.load(plain, idx.n_docs, codec=RANGE16).doc_numbers(), idx.docs)
    with pytest.raises(ValueError, match="quantised"):
        PostingsCodec.named("range16", 32)  # range-blocked doc numbers go with quantised impacts
    with pytest.raises(ValueError, match="8-bit"):
        idx.float_weights() is not None and InvertedIndex(idx.indptr, idx.docs, idx.float_weights(), idx.n_docs).split_ranges()


@pytest.mark.parametrize("damage, says", [
    ("low", "postings_low.npy: posting"),
    ("order", "postings_low.npy: posting"),
    ("row", "postings_rangestart.npy: row"),
    ("shape", "postings_rangestart.npy: shape"),
])
def test_damaged_files_are_refused_by_name(tmp_path, damage, says):
    idx = random_index(9, RANGE + 500)
    rd = RangeDocs.split(idx.indptr, idx.docs, idx.n_docs)
    starts, low = rd.starts.copy(), rd.low.copy()
    if damage == "low":
        low[int(idx.indptr[2]) - 1] = np.uint16(RANGE - 1)  # list 1's last doc number past n_docs
    elif damage == "order":
        low[int(idx.indptr[1]) + 1] = low[int(idx.indptr[1])]  # list 1's doc RANGE - 1 made 0 again: not ascending
    elif damage == "row":
        starts[4, 1] = starts[4, 2] + 1
    else:
        starts = starts[:, :1]
    RangeDocs(starts, low).save(tmp_path)
    for name in ("indptr", "weights", "scale", "offset"):
        np.save(tmp_path / f"postings_{name}.npy", getattr(idx, name))
    with pytest.raises(IndexFormatError, match=says):
        InvertedIndex.load(tmp_path, idx.n_docs, codec=RANGE16)


@pytest.mark.parametrize("shard", [1000, RANGE, 50_000])
def test_the_streaming_writer_writes_what_the_in_memory_path_saves(tmp_path, shard):
    rng = np.random.default_rng(shard)
    n, k, vocab = 2 * RANGE + 3000, 6, 40
    tokens = np.stack([rng.choice(vocab, k, replace=False) for _ in range(n)]).astype(np.int32)
    tokens[:, 0] = 3  # a list in every document: full ranges
    weights = rng.normal(5, 2, (n, k)).astype(np.float32)
    weights[tokens == 7] = 1.25  # a list of one value: scale 0

    def shards():
        for a in range(0, n, shard):
            yield tokens[a : a + shard], weights[a : a + shard]

    assert range_docs.write_from_shards(shards, vocab, tmp_path / "w" if (tmp_path / "w").mkdir() is None else None) == n
    (tmp_path / "m").mkdir()
    InvertedIndex.from_forward(tokens, weights, vocab).quantise().split_ranges().save(tmp_path / "m")
    names = sorted(p.name for p in (tmp_path / "m").iterdir())
    assert names == sorted(p.name for p in (tmp_path / "w").iterdir())
    for name in names:
        assert (tmp_path / "w" / name).read_bytes() == (tmp_path / "m" / name).read_bytes(), name
    with pytest.raises(ValueError, match="vocabulary"):
        range_docs.write_from_shards(lambda: iter([(tokens[:5] + vocab, weights[:5])]), vocab, tmp_path / "m")


# --------------------------------------------------------------------- a format-5 index, end to end
QUERIES = ["the cat sat on the mat", "dogs bark at night", "a quiet river"]


@pytest.fixture(scope="module")
def indexes(tmp_path_factory, tiny_tokenizer):
    """A plain tiny index and its compact copies: format 3 (int32 doc numbers) and 5 (range-blocked)."""
    pytest.importorskip("sentence_transformers")
    from conftest import build_every_channel

    from indexer.compact import compact_copy

    root = tmp_path_factory.mktemp("ranged")
    embedder = build_every_channel(root, tiny_tokenizer)
    compact_copy(root / "plain", root / "compact")
    m = compact_copy(root / "plain", root / "ranged", range_doc_ids=True)
    assert m.format_version == RANGE_FORMAT_VERSION
    with pytest.raises(ValueError, match="not both"):
        compact_copy(root / "plain", root / "both", pack_doc_ids=True, range_doc_ids=True)
    return root, embedder


def test_a_ranged_copy_is_format_5_verifies_and_searches_as_the_compact_one(indexes):
    from indexer.reader import open_index
    from indexer.verify import verify
    from retriever.retriever import Retriever

    root, embedder = indexes
    m = Manifest.read((root / "ranged").resolve())
    assert m.ranged and m.compact and not m.packed and m.record("sparse")["doc_ids"] == m.record("lexical")["doc_ids"] == RANGE_DOC_IDS
    d = (root / "ranged").resolve()
    assert not (d / "postings_docs.npy").exists() and not (d / "lexical" / "postings_docs.npy").exists()
    assert {"postings_low.npy", "postings_rangestart.npy", "lexical/postings_low.npy"} <= set(m.files)
    report = verify(root / "ranged")
    assert report.ok, report.problems
    a, b = open_index(root / "compact"), open_index(root / "ranged")
    try:
        for mode in ("sparse", "bm25"):
            x, y = a.channels[mode], b.channels[mode]
            x, y = (x.postings, y.postings) if mode == "bm25" else (x, y)
            assert y.ranges is not None and y.docs is None and x.ranges is None
            np.testing.assert_array_equal(y.doc_numbers(), x.docs)
    finally:
        a.close()
        b.close()
    for mode in ("sparse", "bm25", "hybrid"):
        runs = []
        for name in ("compact", "ranged"):
            with Retriever.load(root / name, embedder=embedder, query_encoder="llm", profile=None) as r:
                runs.append([[(h.doc_id, h.score) for h in hits] for hits in r.batch_search(QUERIES, k=10, mode=mode)])
        assert runs[0] == runs[1], mode
        assert any(runs[0]), mode


def test_format_and_range_doc_ids_must_agree(indexes, tmp_path):
    import json
    import shutil

    from indexer.manifest import COMPACT_FORMAT_VERSION, MANIFEST, PACKED_FORMAT_VERSION

    root, _ = indexes
    for name, src, change, says in (
        ("ranged-as-3", "ranged", lambda m: m.update(format_version=COMPACT_FORMAT_VERSION), "range-blocked doc numbers in an index of format 3"),
        ("ranged-as-4", "ranged", lambda m: m.update(format_version=PACKED_FORMAT_VERSION), "in an index of format 4"),
        ("compact-as-5", "compact", lambda m: m.update(format_version=RANGE_FORMAT_VERSION), "format 5 needs 'range16-65536'"),
        ("no-impacts", "ranged", lambda m: m["channels"]["lexical"].pop("impacts"), "range-blocked doc numbers without 8-bit impacts"),
    ):
        index = tmp_path / name
        shutil.copytree((root / src).resolve(), index)
        data = json.loads((index / MANIFEST).read_text())
        change(data)
        (index / MANIFEST).write_text(json.dumps(data))
        with pytest.raises(IndexFormatError, match=says):
            Manifest.read(index)


def test_a_reader_of_formats_1_to_4_refuses_a_ranged_index(indexes, monkeypatch):
    from indexer import manifest

    monkeypatch.setattr(manifest, "READABLE_VERSIONS", (1, 2, 3, 4))
    with pytest.raises(IndexFormatError, match="index format 5"):
        Manifest.read((indexes[0] / "ranged").resolve())
    Manifest.read((indexes[0] / "compact").resolve())


def test_a_compact_build_writes_format_5_as_the_compact_copy_does(indexes, tiny_tokenizer, tmp_path):
    from conftest import build_every_channel, toy_docs, write_corpus

    from indexer.build import build_index

    root, _ = indexes
    embedder = build_every_channel(tmp_path, tiny_tokenizer, "built", compact=True, doc_ids=RANGE_DOC_IDS)
    m = Manifest.read(tmp_path / "built")
    corpus = write_corpus(tmp_path / "c", toy_docs(40, seed=3), "beir")
    assert m.format_version == RANGE_FORMAT_VERSION and m.ranged and m.record("lexical")["doc_ids"] == RANGE_DOC_IDS
    built, copied = (tmp_path / "built").resolve(), (root / "ranged").resolve()
    for rel in ("postings_low.npy", "postings_rangestart.npy", "postings_weights.npy", "lexical/postings_low.npy"):
        assert (built / rel).read_bytes() == (copied / rel).read_bytes(), rel
    with pytest.raises(ValueError, match="compact"):
        build_index(corpus, tmp_path / "plain5", embedder, top_k=16, progress=False, doc_ids=RANGE_DOC_IDS)
    with pytest.raises(ValueError, match="doc_ids"):
        build_index(corpus, tmp_path / "bad", embedder, top_k=16, progress=False, compact=True, doc_ids="vbyte")
