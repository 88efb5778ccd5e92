"""The postings codec (indexer/codec.py): every registered doc layout, at every impact width it
takes, end to end (encode, save, load, search, look up, build, verify, update, export), against
the int32 layout, the reference. Parametrised over the registry: a layout registered there is
covered here without a line of this file changing."""
from __future__ import annotations

import json
import shutil

import numpy as np
import pytest
from conftest import reseal, toy_docs, write_corpus
from test_kernels import random_index, random_query

from indexer.build import build_index
from indexer.codec import DOC_LAYOUTS, INT32, PostingsCodec
from indexer.corpus import document_from_object
from indexer.errors import IndexFormatError
from indexer.exports.lucene import export_pyserini
from indexer.inverted_index import InvertedIndex
from indexer.layout import MANIFEST
from indexer.manifest import Manifest
from indexer.query_pruning import rescore
from indexer.reader import open_index
from indexer.updates import update_index
from indexer.verify import verify
from retriever.retriever import Retriever

# (layout, impact bits): every registered layout at 8 and 4 bits, and at 32 where it holds float32 weights
CASES = [(name, bits) for name, layout in DOC_LAYOUTS.items() for bits in ((32,) if layout.float_weights else ()) + (8, 4)]
QUERIES = ["cat and dog near the river", "computer memory", "game", "a puzzle for the team", "snow"]


def _ids(case) -> str:
    return f"{case[0]}-{case[1]}"


def _weights(index: InvertedIndex, bits: int) -> InvertedIndex:
    return index if bits == 32 else index.quantise(levels=16).to_nibbles() if bits == 4 else index.quantise()


@pytest.mark.parametrize("case", CASES, ids=_ids)
def test_every_layout_searches_as_int32_in_memory_and_saved(tmp_path, case):
    name, bits = case
    rng = np.random.default_rng(11)
    for trial in range(12):
        ref = _weights(random_index(rng, "float"), bits)
        coded = ref.with_layout(name)
        assert coded.doc_layout == name and coded.impact_bits == bits and coded.codec == PostingsCodec.named(name, bits)
        np.testing.assert_array_equal(coded.doc_numbers(), ref.docs)
        d = tmp_path / str(trial)
        d.mkdir()
        coded.save(d)
        assert sorted(p.name for p in d.iterdir()) == sorted(f"postings_{f}.npy" for f in ("indptr", "weights") + DOC_LAYOUTS[name].files
                                                            + (("scale", "offset") if bits < 32 else ()))
        loaded = InvertedIndex.load(d, ref.n_docs, codec=PostingsCodec.named(name, bits))
        assert loaded.nbytes == coded.nbytes
        np.testing.assert_array_equal(loaded.doc_numbers(), ref.docs)
        queries = [random_query(rng, ref.vocab_size, "float") for _ in range(6)]
        for index in (coded, loaded):
            for t, w in queries:
                want = ref.search(t, w, 7)
                for parts in (1, 3):
                    got = index.numbers.search(index.indptr, index.weights, index.scale, index.offset, t, w, index.n_docs, 7, parts)
                    np.testing.assert_array_equal(got[0], want[0])
                    np.testing.assert_array_equal(got[1], want[1])
                for doc in range(0, ref.n_docs, 5):
                    np.testing.assert_array_equal(index.contributions(t, doc), ref.contributions(t, doc))
                # query pruning's rescoring, through the layout (its own kernel, or the generic lookups: the
                # sum taken in another order, so equal up to float32 rounding)
                cand, scores = ref.search(t[: len(t) // 2], w[: len(t) // 2], 9)
                got_d, got_s = rescore(index, cand, scores, t[len(t) // 2 :], w[len(t) // 2 :], 5)
                want_d, want_s = rescore(ref, cand, scores, t[len(t) // 2 :], w[len(t) // 2 :], 5)
                np.testing.assert_allclose(got_s, want_s, rtol=1e-5, atol=1e-5)
                assert set(got_d[:-1].tolist()) <= set(want_d.tolist())
            many, want_many = index.batch_search(queries, 7), ref.batch_search(queries, 7)
            np.testing.assert_array_equal(many[0], want_many[0])
            np.testing.assert_array_equal(many[1], want_many[1])


def _build(corpus, out, embedder, name, bits, lexical: bool = True):
    return build_index(corpus, out, embedder, top_k=16, lexical="words" if lexical else None, compact=bits < 32,
                       doc_ids=None if name == INT32 else name, impact_bits=8 if bits == 32 else bits, progress=False)


def _hits(index, embedder, mode):
    with Retriever.load(index, embedder=embedder, query_encoder="llm") as r:
        many = [[(h.doc_id, h.score) for h in hits] for hits in r.batch_search(QUERIES, k=10, mode=mode)]
        one = [[(h.doc_id, h.score) for h in r.search(q, k=10, mode=mode)] for q in QUERIES]
    assert many == one and any(many), mode
    return many


@pytest.mark.parametrize("case", CASES, ids=_ids)
def test_every_layout_builds_verifies_searches_updates_and_exports_as_int32(tmp_path, tiny_embedder, case):
    name, bits = case
    docs = toy_docs(36, seed=5)
    corpus = write_corpus(tmp_path / "corpus", docs[:30], "beir")
    _build(corpus, tmp_path / "ref", tiny_embedder, INT32, bits)
    m = _build(corpus, tmp_path / "coded", tiny_embedder, name, bits)
    # each postings channel's record names its codec; BM25's impacts are 8-bit in a compact index
    assert (m.record("sparse")["doc_layout"], m.record("sparse")["impact_bits"]) == (name, bits)
    assert (m.record("lexical")["doc_layout"], m.record("lexical")["impact_bits"]) == (name, 32 if bits == 32 else 8)
    for sub in ("", "lexical"):
        assert not DOC_LAYOUTS[name].csr or (tmp_path / "coded" / sub / "postings_docs.npy").exists()
        assert all((tmp_path / "coded" / sub / f"postings_{f}.npy").exists() for f in DOC_LAYOUTS[name].files)
    for step in ("built", "updated"):
        report = verify(tmp_path / "coded")
        assert report.ok, report.problems
        a, b = open_index(tmp_path / "ref"), open_index(tmp_path / "coded")
        try:
            for x, y in ((a.channels["sparse"], b.channels["sparse"]), (a.channels["bm25"].postings, b.channels["bm25"].postings)):
                assert y.doc_layout == name and x.doc_layout == INT32
                np.testing.assert_array_equal(y.doc_numbers(), x.doc_numbers())
                np.testing.assert_array_equal(np.asarray(y.weights), np.asarray(x.weights))
        finally:
            a.close()
            b.close()
        for mode in ("sparse", "bm25"):
            assert _hits(tmp_path / "coded", tiny_embedder, mode) == _hits(tmp_path / "ref", tiny_embedder, mode), (step, mode)
        if step == "built":
            add = [document_from_object(d, "test", i) for i, d in enumerate(docs[30:], start=1)]
            for index in ("ref", "coded"):
                report = update_index(tmp_path / index, add=add, delete=[docs[0]["_id"], docs[7]["_id"]], embedder=tiny_embedder, progress=False)
                assert (report.added, report.deleted, report.n_docs) == (6, 2, 34)
            after = Manifest.read((tmp_path / "coded").resolve())
            assert (after.record("sparse")["doc_layout"], after.record("sparse")["impact_bits"], after.format_version) == (name, bits, m.format_version)
    # the Pyserini export reads the postings through the codec: the same collection, byte for byte
    tokens = [f"t{i}" for i in range(int(m.record("sparse")["vocab_size"]))]
    for index in ("ref", "coded"):
        export_pyserini(tmp_path / index, tmp_path / f"export-{index}", tokens=tokens, build_lucene=False, progress=False)
    got = sorted(p.relative_to(tmp_path / "export-coded") for p in (tmp_path / "export-coded").rglob("*.jsonl"))
    assert got and got == sorted(p.relative_to(tmp_path / "export-ref") for p in (tmp_path / "export-ref").rglob("*.jsonl"))
    for rel in got:
        assert (tmp_path / "export-coded" / rel).read_bytes() == (tmp_path / "export-ref" / rel).read_bytes()


def _edit_records(index, edit) -> None:
    d = index.resolve()
    data = json.loads((d / MANIFEST).read_text())
    for key in ("sparse", "lexical"):
        edit(data["channels"][key])
    (d / MANIFEST).write_text(json.dumps(data))
    reseal(d)


@pytest.mark.parametrize("name", [n for n, layout in DOC_LAYOUTS.items() if layout.doc_ids or layout.csr])
def test_records_written_before_the_codec_read_the_same(tmp_path, tiny_embedder, name):
    """A manifest of formats 1-7 names no codec (its records' doc_ids and impacts say how the
    postings are stored; the files are byte for byte what the codec writes): it opens and ranks
    as the same index with the codec's records."""
    corpus = write_corpus(tmp_path / "corpus", toy_docs(30, seed=6), "beir")
    _build(corpus, tmp_path / "new", tiny_embedder, name, 4)
    shutil.copytree((tmp_path / "new").resolve(), tmp_path / "old")
    _edit_records(tmp_path / "old", lambda r: (r.pop("doc_layout"), r.pop("impact_bits")))
    old = Manifest.read(tmp_path / "old")
    assert "doc_layout" not in old.record("sparse") and old.record("sparse")["impacts"] == "uint4" and old.record("sparse").get("doc_ids") == DOC_LAYOUTS[name].doc_ids
    assert verify(tmp_path / "old").ok
    for mode in ("sparse", "bm25"):
        assert _hits(tmp_path / "old", tiny_embedder, mode) == _hits(tmp_path / "new", tiny_embedder, mode)


def test_an_unknown_layout_is_refused_by_name(tmp_path, tiny_embedder):
    corpus = write_corpus(tmp_path / "corpus", toy_docs(20, seed=7), "beir")
    _build(corpus, tmp_path / "index", tiny_embedder, INT32, 8, lexical=False)

    def unknown(record):
        record["doc_layout"] = "elias-fano"

    _edit_one(tmp_path / "index", "sparse", unknown)
    with pytest.raises(IndexFormatError, match=r"manifest\.json: field 'sparse\.doc_layout': unknown doc layout 'elias-fano'"):
        open_index(tmp_path / "index")
    with pytest.raises(IndexFormatError, match=r"unknown doc layout 'elias-fano'"):
        PostingsCodec.of_record({"doc_layout": "elias-fano"})
    with pytest.raises(IndexFormatError, match=r"field 'lexical\.doc_ids': unknown doc layout 'delta-9'"):
        PostingsCodec.of_record({"doc_ids": "delta-9", "impacts": "uint8"}, tmp_path, "lexical")
    with pytest.raises(IndexFormatError, match=r"field 'sparse\.impact_bits'"):
        PostingsCodec.of_record({"doc_layout": "int32", "impact_bits": 8, "impacts": "uint4"})


def _edit_one(index, key, edit) -> None:
    d = index.resolve()
    data = json.loads((d / MANIFEST).read_text())
    edit(data["channels"][key])
    (d / MANIFEST).write_text(json.dumps(data))
    reseal(d)
