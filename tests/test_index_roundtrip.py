"""Index directories: what build_index writes is what Retriever.load reads back."""
from __future__ import annotations

import json
import os
from datetime import datetime

import numpy as np
import pytest

from indexer.build import DOC_IDS, build_index
from indexer.dense import DENSE_FILE
from indexer.inverted_index import InvertedIndex
from indexer.manifest import FORMAT_VERSION, MANIFEST, IndexFormatError, Manifest
from indexer.stored_documents import DOCUMENTS_FILE, OFFSETS_FILE
from retriever.retriever import Retriever

POSTINGS = ("postings_indptr.npy", "postings_docs.npy", "postings_weights.npy")


def corpus_texts(docs: list[dict[str, str]]) -> list[str]:
    return [f"{d['title']} {d['text']}" for d in docs]


def test_inverted_index_save_load(tmp_path):
    rng = np.random.default_rng(0)
    tokens = np.stack([rng.choice(50, 6, replace=False) for _ in range(20)]).astype(np.int32)
    index = InvertedIndex.from_forward(tokens, rng.normal(size=(20, 6)).astype(np.float32), 50)
    index.save(tmp_path)
    for mmap in (True, False):
        loaded = InvertedIndex.load(tmp_path, n_docs=20, mmap=mmap)
        assert isinstance(loaded.docs, np.memmap) == mmap
        for name in ("indptr", "docs", "weights"):
            a, b = getattr(index, name), getattr(loaded, name)
            assert a.dtype == b.dtype
            np.testing.assert_array_equal(a, b)
        q = np.array([1, 2, 3, 40, 2], np.int64)
        for got, want in zip(loaded.search(q, None, 8), index.search(q, None, 8)):
            np.testing.assert_array_equal(got, want)


def test_manifest_fields(toy_corpus, tiny_embedder):
    index_dir = toy_corpus.parent / "index"
    m = build_index(toy_corpus, index_dir, tiny_embedder, top_k=16, progress=False)
    assert Manifest.read(index_dir) == m
    assert m.format_version == FORMAT_VERSION
    assert m.model == tiny_embedder.identity and m.adapter is None
    assert m.embedding == tiny_embedder.config.to_dict()
    # the postings codec (indexer/codec.py): int32 doc numbers, float32 weights
    assert m.record("sparse") == {"top_k": 16, "vocab_size": tiny_embedder.vocab_size, "weight": "logit", "doc_layout": "int32", "impact_bits": 32}
    assert m.n_docs == 40 and m.record("dense") is None
    assert m.corpus == {"path": str(toy_corpus), "format": "beir", "n_empty_skipped": 0}
    for key in ("seconds", "encode_seconds", "docs_per_s", "tokens_per_s", "n_tokens"):
        assert m.build[key] > 0, key
    assert datetime.fromisoformat(m.created).tzinfo is not None
    names = {p.name for p in index_dir.iterdir()}
    assert names == {MANIFEST, DOC_IDS, *POSTINGS, DOCUMENTS_FILE, OFFSETS_FILE}
    assert m.documents == {"file": DOCUMENTS_FILE, "n_docs": 40, "metadata_fields": [], "metadata_types": {}}
    # nothing but the index is left beside it: its one generation (the link's target)
    assert sorted(p.name for p in index_dir.parent.iterdir() if p.name.startswith(".")) == [".index.gen-000001"]
    assert os.readlink(index_dir) == ".index.gen-000001"


def test_top_k_is_capped_by_the_vocabulary(toy_corpus, tiny_embedder):
    m = build_index(toy_corpus, toy_corpus.parent / "index", tiny_embedder, top_k=100_000, progress=False)
    assert m.record("sparse")["top_k"] == tiny_embedder.vocab_size


def test_loaded_arrays_equal_the_embedder_output(make_corpus, docs_factory, tiny_embedder):
    docs = docs_factory(40)
    corpus = make_corpus("beir", docs)
    index_dir = corpus.parent / "index"
    build_index(corpus, index_dir, tiny_embedder, top_k=16, progress=False)
    r = Retriever.load(index_dir, embedder=tiny_embedder)
    assert r.doc_ids == [d["_id"] for d in docs]
    ids, weights = tiny_embedder.top_tokens(tiny_embedder.embed(corpus_texts(docs)), 16)
    want = InvertedIndex.from_forward(ids, weights, tiny_embedder.vocab_size)
    for name in ("indptr", "docs", "weights"):
        np.testing.assert_array_equal(getattr(r.sparse, name), getattr(want, name))
    # each document's row holds exactly its own top-16 aligned tokens
    rows = r.sparse.doc_vectors()
    for i in range(len(docs)):
        row = rows.getrow(i)
        assert sorted(row.indices.tolist()) == sorted(ids[i].tolist())


@pytest.mark.parametrize("fmt", ["jsonl", "tsv"])
def test_all_formats_give_the_same_index(make_corpus, tiny_embedder, fmt):
    beir = make_corpus("beir")
    other = make_corpus(fmt)
    build_index(beir, beir.parent / "index", tiny_embedder, top_k=16, progress=False)
    m = build_index(other, other.parent / "index", tiny_embedder, top_k=16, progress=False)
    assert m.corpus["format"] == fmt
    a = Retriever.load(beir.parent / "index", embedder=tiny_embedder)
    b = Retriever.load(other.parent / "index", embedder=tiny_embedder)
    assert a.doc_ids == b.doc_ids
    for name in ("indptr", "docs", "weights"):
        np.testing.assert_array_equal(getattr(a.sparse, name), getattr(b.sparse, name))


def test_mmap_and_in_memory_loading_agree(toy_corpus, tiny_embedder):
    index_dir = toy_corpus.parent / "index"
    build_index(toy_corpus, index_dir, tiny_embedder, top_k=16, progress=False)
    mapped = Retriever.load(index_dir, embedder=tiny_embedder)  # mmap is the default
    in_ram = Retriever.load(index_dir, embedder=tiny_embedder, mmap=False)
    assert isinstance(mapped.sparse.weights, np.memmap)
    assert not isinstance(in_ram.sparse.weights, np.memmap)
    queries = ["cat and dog", "computer memory", "the"]
    assert mapped.batch_search(queries, k=5) == in_ram.batch_search(queries, k=5)


def test_overwrite_replaces_an_index(toy_corpus, tiny_embedder):
    index_dir = toy_corpus.parent / "index"
    build_index(toy_corpus, index_dir, tiny_embedder, top_k=16, progress=False)
    build_index(toy_corpus, index_dir, tiny_embedder, top_k=8, overwrite=True, progress=False)
    assert Manifest.read(index_dir).record("sparse")["top_k"] == 8
    assert len(Retriever.load(index_dir, embedder=tiny_embedder).sparse.docs) == 40 * 8
    # the replaced generation is removed (no reader holds it): the new one remains
    assert sorted(p.name for p in index_dir.parent.iterdir() if p.name.startswith(".")) == [".index.gen-000002"]


def test_manifest_tolerates_unknown_fields_but_not_missing_ones(toy_corpus, tiny_embedder):
    index_dir = toy_corpus.parent / "index"
    build_index(toy_corpus, index_dir, tiny_embedder, top_k=16, progress=False)
    data = json.loads((index_dir / MANIFEST).read_text())
    data["written_by_a_newer_minor_version"] = True
    (index_dir / MANIFEST).write_text(json.dumps(data))
    assert Manifest.read(index_dir).n_docs == 40
    del data["sparse"]
    (index_dir / MANIFEST).write_text(json.dumps(data))
    with pytest.raises(IndexFormatError, match="sparse"):
        Manifest.read(index_dir)


def test_manifest_written_atomically_is_readable_json(toy_corpus, tiny_embedder):
    index_dir = toy_corpus.parent / "index"
    build_index(toy_corpus, index_dir, tiny_embedder, top_k=16, dense=True, progress=False)
    data = json.loads((index_dir / MANIFEST).read_text(encoding="utf-8"))
    assert data["channels"]["dense"] == data["dense"] == {"kind": "Flat", "dim": 32, "normalised": True, "metric": "inner_product"}
    assert (index_dir / DENSE_FILE).exists()
    assert json.loads((index_dir / DOC_IDS).read_text(encoding="utf-8")) == Retriever.load(
        index_dir, embedder=tiny_embedder
    ).doc_ids
