"""Documents added, replaced and deleted in place (indexer/updates.py, issue 52): the updated
index is the index a full build of the final corpus gives, channel by channel (BM25 included),
for every query; a crash leaves the last generation; the stored documents round-trip.
"""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from conftest import save_tiny_sentence_encoder, toy_docs, write_corpus

from indexer.build import build_index
from indexer.corpus import CorpusError, CorpusSpec, document_from_object
from indexer.manifest import Manifest
from indexer.reader import open_index
from indexer.stored_documents import StoredDocuments
from indexer.updates import UpdateError, update_index
from indexer.verify import verify
from retriever.retriever import Retriever

pytest.importorskip("sentence_transformers")

QUERIES = ["cat and dog near the river", "computer memory", "game", "a puzzle for the team", "snow", "river bank money"]
MODES = ("sparse", "dense", "bm25", "encoder", "hybrid")


@pytest.fixture(scope="module")
def encoder(tmp_path_factory):
    from embedder.sentence_encoder import SentenceEncoder

    return SentenceEncoder.load(save_tiny_sentence_encoder(tmp_path_factory.mktemp("tiny-st"), seed=0))


def build(corpus: Path, index: Path, embedder, encoder) -> None:
    build_index(corpus, index, embedder, top_k=16, dense=True, lexical="words", encoder=encoder, progress=False)


def as_documents(docs: list[dict]) -> list:
    return [document_from_object(d, "test", i) for i, d in enumerate(docs, start=1)]


def changes() -> tuple[list[dict], list[dict], list[str], list[dict]]:
    """(initial corpus, documents to add (3 replacing, 10 new), ids to delete, final corpus)."""
    docs = toy_docs(43, seed=3)
    initial, fresh = docs[:30], docs[30:]
    replaced = [{**initial[i], "text": fresh[j]["text"] + " replaced", "genre": "edited"} for j, i in enumerate((2, 11, 20))]
    deleted = [initial[i]["_id"] for i in (0, 5, 29)] + ["no-such-id"]
    add = replaced + fresh[3:]
    gone = set(deleted) | {d["_id"] for d in replaced}
    final = [d for d in initial if d["_id"] not in gone] + add
    return initial, add, deleted, final


def assert_same_search(updated: Path, rebuilt: Path, embedder) -> None:
    a = Retriever.load(updated, embedder=embedder, query_encoder="llm")
    b = Retriever.load(rebuilt, embedder=embedder, query_encoder="llm")
    assert a.doc_ids == b.doc_ids
    for mode in MODES:
        for query in QUERIES:
            got, want = a.search(query, k=10, mode=mode), b.search(query, k=10, mode=mode)
            assert [h.doc_id for h in got] == [h.doc_id for h in want], (mode, query)
            np.testing.assert_allclose([h.score for h in got], [h.score for h in want], atol=1e-5, err_msg=f"{mode}: {query}")


def test_update_equals_a_rebuild_of_the_final_corpus(tmp_path, tiny_embedder, encoder):
    initial, add, deleted, final = changes()
    build(write_corpus(tmp_path / "a", initial, "beir"), tmp_path / "index", tiny_embedder, encoder)
    report = update_index(tmp_path / "index", add=as_documents(add), delete=deleted, embedder=tiny_embedder, encoder=encoder, progress=False)
    assert (report.added, report.replaced, report.deleted, report.not_found) == (10, 3, 3, ["no-such-id"])
    assert report.n_docs == len(final) == 37 and report.generation == ".index.gen-000002"
    build(write_corpus(tmp_path / "b", final, "beir"), tmp_path / "rebuilt", tiny_embedder, encoder)
    assert verify(tmp_path / "index").ok
    assert_same_search(tmp_path / "index", tmp_path / "rebuilt", tiny_embedder)


def test_every_channel_matches_a_rebuild(tmp_path, tiny_embedder, encoder):
    initial, add, deleted, final = changes()
    build(write_corpus(tmp_path / "a", initial, "beir"), tmp_path / "index", tiny_embedder, encoder)
    update_index(tmp_path / "index", add=as_documents(add), delete=deleted, embedder=tiny_embedder, encoder=encoder, progress=False)
    build(write_corpus(tmp_path / "b", final, "beir"), tmp_path / "rebuilt", tiny_embedder, encoder)
    up, re = open_index(tmp_path / "index"), open_index(tmp_path / "rebuilt")
    try:
        assert up.doc_ids == re.doc_ids
        for x, y in ((up.channels["sparse"], re.channels["sparse"]), (up.channels["bm25"].postings, re.channels["bm25"].postings)):
            np.testing.assert_array_equal(x.indptr, y.indptr)
            np.testing.assert_array_equal(x.docs, y.docs)
            np.testing.assert_allclose(x.weights, y.weights, atol=1e-5)
        for mode in ("dense", "encoder"):
            x, y = (c.index.reconstruct_n(0, c.index.ntotal) for c in (up.channels[mode], re.channels[mode]))
            np.testing.assert_allclose(x, y, atol=1e-5)
        assert up.manifest.lexical == re.manifest.lexical
        assert up.manifest.documents == re.manifest.documents
    finally:
        up.close()
        re.close()


def test_stored_documents_round_trip_with_metadata(tmp_path, tiny_embedder):
    docs = [{"_id": "a", "title": "Cats", "text": "cat and dog", "lang": "en", "metadata": {"year": 1999}},
            {"_id": "b", "text": "computer memory", "tags": ["x", "y"]}]
    build_index(write_corpus(tmp_path / "c", docs, "beir"), tmp_path / "index", tiny_embedder, top_k=8, progress=False)
    m = Manifest.read(tmp_path / "index")
    assert m.documents["metadata_fields"] == ["lang", "tags", "year"]
    stored = StoredDocuments.open(tmp_path / "index", m.n_docs)
    assert stored.record(0) == {"_id": "a", "title": "Cats", "text": "cat and dog", "metadata": {"year": 1999, "lang": "en"}}
    assert stored.record(1) == {"_id": "b", "text": "computer memory", "metadata": {"tags": ["x", "y"]}}
    assert [d.text for d in stored] == [d.text for d in CorpusSpec(tmp_path / "c" / "beir")]


def test_delete_only_needs_no_model_and_readers_keep_their_generation(tmp_path, tiny_embedder):
    docs = toy_docs(12)
    build_index(write_corpus(tmp_path / "c", docs, "beir"), tmp_path / "index", tiny_embedder, top_k=8, lexical="words", progress=False)
    reader = Retriever.load(tmp_path / "index", embedder=tiny_embedder, query_encoder="llm")
    before = reader.search("cat", k=12, mode="bm25")
    update_index(tmp_path / "index", delete=[docs[0]["_id"], docs[1]["_id"]], progress=False)  # no embedder given: none loaded
    assert [h.doc_id for h in reader.search("cat", k=12, mode="bm25")] == [h.doc_id for h in before]  # the held generation
    after = Retriever.load(tmp_path / "index", embedder=tiny_embedder, query_encoder="llm")
    assert len(after.doc_ids) == 10 and docs[0]["_id"] not in after.doc_ids
    reader.close()


def test_bad_updates_are_refused_before_anything_is_written(tmp_path, tiny_embedder):
    docs = toy_docs(6)
    build_index(write_corpus(tmp_path / "c", docs, "beir"), tmp_path / "index", tiny_embedder, top_k=8, progress=False)
    twice = as_documents([{"_id": "n1", "text": "cat"}, {"_id": "n1", "text": "dog"}])
    with pytest.raises(CorpusError, match="duplicate id 'n1'"):
        update_index(tmp_path / "index", add=twice, embedder=tiny_embedder, progress=False)
    with pytest.raises(CorpusError, match="request:1: field 'text/contents': missing text"):
        document_from_object({"_id": "x"}, "request", 1)
    with pytest.raises(UpdateError, match="every document"):
        update_index(tmp_path / "index", delete=[d["_id"] for d in docs], progress=False)
    assert Path(tmp_path / "index").resolve().name == ".index.gen-000001"  # nothing published


def test_an_index_without_stored_documents_says_to_rebuild(tmp_path, tiny_embedder):
    build_index(write_corpus(tmp_path / "c", toy_docs(6), "beir"), tmp_path / "index", tiny_embedder, top_k=8, progress=False)
    gen = Path(tmp_path / "index").resolve()
    data = json.loads((gen / "manifest.json").read_text())
    data["documents"] = None
    data.pop("checksum")
    Manifest(**data).write(gen)
    with pytest.raises(UpdateError, match="rebuild it once"):
        update_index(tmp_path / "index", delete=["x"], progress=False)
