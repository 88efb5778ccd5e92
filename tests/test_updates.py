"""Documents added, replaced and deleted in place (indexer/updates.py, issue 52): the updated
index is the index a full build of the final corpus gives, channel by channel (BM25 included),
for every query; a crash leaves the last generation; the stored documents round-trip.
"""
from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from conftest import REPO, format_4_copy, save_tiny_sentence_encoder, toy_docs, write_corpus

from indexer.build import build_index
from indexer.compact import compact_copy
from indexer.corpus import CorpusError, CorpusSpec, document_from_object
from indexer.manifest import (
    BITPACKED_DOC_IDS,
    BITSTREAM_DOC_IDS,
    PACKED_FORMAT_VERSION,
    RANGE_DOC_IDS,
    RANGE_FORMAT_VERSION,
    STREAM_FORMAT_VERSION,
    Manifest,
)
from indexer.reader import open_index
from indexer.stored_documents import StoredDocuments
from indexer.updates import UpdateError, update_index
from indexer.verify import verify
from retriever.retriever import Retriever

pytest.importorskip("sentence_transformers")

QUERIES = ["cat and dog near the river", "computer memory", "game", "a puzzle for the team", "snow", "river bank money"]
MODES = ("sparse", "dense", "bm25", "encoder", "hybrid")
ENV = {**os.environ, "PYTHONPATH": str(REPO), "HF_HUB_OFFLINE": "1"}


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
    # no profile: one fixed fusion for both (a profile's is calibrated on each index's corpus, and an update
    # carries its index's calibration forward while a rebuild reads its own: indexer/calibration_channels.py)
    a = Retriever.load(updated, embedder=embedder, query_encoder="llm", profile=None)
    b = Retriever.load(rebuilt, embedder=embedder, query_encoder="llm", profile=None)
    assert a.doc_ids == b.doc_ids
    for mode in MODES:
        for query in QUERIES:
            got, want = a.search(query, k=10, mode=mode), b.search(query, k=10, mode=mode)
            np.testing.assert_allclose([h.score for h in got], [h.score for h in want], atol=1e-5, err_msg=f"{mode}: {query}")
            # The same ranking, but for near ties: an update encodes its documents in other batches than a rebuild, and
            # on AVX-512 kernels that moves a score in its 7th digit (0.92911911 vs 0.92911917), enough to swap two docs.
            want_score = {h.doc_id: h.score for h in want}
            for i, (g, w) in enumerate(zip(got, want)):
                if g.doc_id != w.doc_id:
                    assert g.doc_id in want_score and abs(want_score[g.doc_id] - w.score) <= 1e-5, (mode, query, i, g.doc_id, w.doc_id)


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
        assert up.manifest.record("lexical") == re.manifest.record("lexical")
        assert up.manifest.documents == re.manifest.documents
    finally:
        up.close()
        re.close()


def test_both_encoder_channels_update_as_a_rebuild(tmp_path, tiny_embedder, encoder):
    """An index with the second encoder channel (the best point's): each channel's added vectors
    come from its own model, loaded from the manifest where the caller gives none."""
    from embedder.sentence_encoder import SentenceEncoder

    encoder2 = SentenceEncoder.load(save_tiny_sentence_encoder(tmp_path / "st2", seed=1))
    initial, add, deleted, final = changes()
    both = {"top_k": 16, "lexical": "words", "encoder": encoder, "channels": {"encoder2": encoder2}, "progress": False}
    build_index(write_corpus(tmp_path / "a", initial, "beir"), tmp_path / "index", tiny_embedder, **both)
    update_index(tmp_path / "index", add=as_documents(add), delete=deleted, embedder=tiny_embedder, encoder=encoder, progress=False)
    build_index(write_corpus(tmp_path / "b", final, "beir"), tmp_path / "rebuilt", tiny_embedder, **both)
    up, re = open_index(tmp_path / "index"), open_index(tmp_path / "rebuilt")
    try:
        assert up.doc_ids == re.doc_ids and up.manifest.record("encoder2") == re.manifest.record("encoder2")
        vectors = {}
        for mode in ("encoder", "encoder2"):
            x, y = (c.index.reconstruct_n(0, c.index.ntotal) for c in (up.channels[mode], re.channels[mode]))
            np.testing.assert_allclose(x, y, atol=1e-5)
            vectors[mode] = x
        assert not np.allclose(vectors["encoder"], vectors["encoder2"])  # two models, two sets of vectors
    finally:
        up.close()
        re.close()
    assert verify(tmp_path / "index").ok


@pytest.mark.parametrize("encoded", ["packed", "blocks", "ranged"])
def test_an_encoded_index_updates_as_its_int32_compact_copy(tmp_path, tiny_embedder, encoder, encoded):
    """Format 7 (bit-packed doc numbers) stays format 7 through an update, format 4 (packed in
    blocks, as builds before format 7 wrote them) format 4, format 5 (range-blocked) format 5, and
    each ranks exactly as the same update of the format-3 copy (int32 doc numbers) of the same index."""
    initial, add, deleted, _ = changes()
    build(write_corpus(tmp_path / "a", initial, "beir"), tmp_path / "plain", tiny_embedder, encoder)
    compact_copy(tmp_path / "plain", tmp_path / "compact")
    if encoded == "blocks":
        format_4_copy(tmp_path / "compact", tmp_path / "packed")
    else:
        compact_copy(tmp_path / "plain", tmp_path / "packed", pack_doc_ids=encoded == "packed", range_doc_ids=encoded == "ranged")
    for name in ("compact", "packed"):
        report = update_index(tmp_path / name, add=as_documents(add), delete=deleted, embedder=tiny_embedder, encoder=encoder, progress=False)
        assert (report.added, report.replaced, report.deleted, report.n_docs) == (10, 3, 3, 37), name
    m = Manifest.read((tmp_path / "packed").resolve())
    version, doc_ids, files = {"packed": (STREAM_FORMAT_VERSION, BITSTREAM_DOC_IDS, "postings_blockskip.npy"),
                               "blocks": (PACKED_FORMAT_VERSION, BITPACKED_DOC_IDS, "postings_blockfirst.npy"),
                               "ranged": (RANGE_FORMAT_VERSION, RANGE_DOC_IDS, "postings_low.npy")}[encoded]
    assert m.format_version == version and getattr(m, "ranged" if encoded == "ranged" else "packed") and m.compact
    assert m.record("sparse")["doc_ids"] == m.record("lexical")["doc_ids"] == doc_ids and m.build["updates"] == 1
    d = (tmp_path / "packed").resolve()
    assert not (d / "postings_docs.npy").exists() and not (d / "lexical" / "postings_docs.npy").exists()
    assert {files, f"lexical/{files}"} <= set(m.files)
    report = verify(tmp_path / "packed")
    assert report.ok, report.problems
    assert "doc_ids" not in Manifest.read((tmp_path / "compact").resolve()).record("sparse")  # the format-3 copy stays unpacked
    a, b = open_index(tmp_path / "compact"), open_index(tmp_path / "packed")
    try:
        assert a.doc_ids == b.doc_ids
        for x, y in ((a.channels["sparse"], b.channels["sparse"]), (a.channels["bm25"].postings, b.channels["bm25"].postings)):
            coded = y.ranges if encoded == "ranged" else y.packed
            assert x.packed is None and x.ranges is None and coded is not None and y.docs is None
            np.testing.assert_array_equal(y.indptr, x.indptr)
            np.testing.assert_array_equal(y.doc_numbers(), x.docs)
            np.testing.assert_array_equal(y.weights, x.weights)
    finally:
        a.close()
        b.close()
    with (Retriever.load(tmp_path / "compact", embedder=tiny_embedder, query_encoder="llm") as x,
          Retriever.load(tmp_path / "packed", embedder=tiny_embedder, query_encoder="llm") as y):
        for mode in MODES:
            want = [[(h.doc_id, h.score) for h in hits] for hits in x.batch_search(QUERIES, k=10, mode=mode)]
            assert [[(h.doc_id, h.score) for h in hits] for hits in y.batch_search(QUERIES, k=10, mode=mode)] == want, mode
            assert any(want), mode
            for query in QUERIES:  # one query at a time too (the single-query kernel)
                assert [(h.doc_id, h.score) for h in y.search(query, k=10, mode=mode)] == [(h.doc_id, h.score) for h in x.search(query, k=10, mode=mode)]


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
    m = Manifest.read(gen)
    m.documents = None
    m.write(gen)
    with pytest.raises(UpdateError, match="rebuild it once"):
        update_index(tmp_path / "index", delete=["x"], progress=False)


# ============================================================ the CLI, and kill -9 during an update
def update_cli(index: Path, *args: str) -> subprocess.Popen:
    argv = [sys.executable, "-m", "indexer.cli_update", "--index", str(index), "--quiet", *args]
    return subprocess.Popen(argv, cwd=REPO, env=ENV, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def test_update_index_cli_adds_deletes_and_reports(tmp_path, tiny_model_dir):
    docs = toy_docs(20)
    corpus = write_corpus(tmp_path / "c", docs[:14], "beir")
    build_cli = [sys.executable, "-m", "indexer.cli", "--corpus", str(corpus), "--index", str(tmp_path / "index"), "--model", str(tiny_model_dir),
                 "--adapter", "none", "--top-k", "8", "--channels", "sparse,bm25", "--quiet"]  # fmt: skip
    subprocess.run(build_cli, cwd=REPO, env=ENV, check=True, capture_output=True, timeout=300)
    add = write_corpus(tmp_path / "add", docs[14:], "jsonl")
    (tmp_path / "gone.txt").write_text(f"{docs[0]['_id']}\n\n{docs[1]['_id']}\n")
    out, err = update_cli(tmp_path / "index", "--add", str(add), "--delete", docs[2]["_id"], "--delete", "nope",
                          "--delete-file", str(tmp_path / "gone.txt")).communicate(timeout=300)  # fmt: skip
    assert "Traceback" not in err and out.startswith(f"updated {tmp_path / 'index'}: 6 added, 0 replaced, 3 deleted (1 not indexed: 'nope'); 17 documents now"), (out, err)
    assert Manifest.read(tmp_path / "index").n_docs == 17
    proc = update_cli(tmp_path / "index", "--add", str(tmp_path / "missing.jsonl"))
    _, err = proc.communicate(timeout=300)
    assert proc.returncode == 2 and len(err.strip().splitlines()) == 1 and "missing.jsonl" in err, err
    proc = update_cli(tmp_path / "index")
    _, err = proc.communicate(timeout=300)
    assert proc.returncode == 2 and "nothing to do" in err


def test_kill_9_during_an_update_leaves_the_last_generation_and_a_rerun_completes(tmp_path, tiny_model_dir):
    docs = toy_docs(400, seed=5)
    corpus = write_corpus(tmp_path / "c", docs[:100], "beir")
    build_cli = [sys.executable, "-m", "indexer.cli", "--corpus", str(corpus), "--index", str(tmp_path / "index"), "--model", str(tiny_model_dir),
                 "--adapter", "none", "--top-k", "8", "--channels", "sparse,dense,bm25", "--quiet"]  # fmt: skip
    subprocess.run(build_cli, cwd=REPO, env=ENV, check=True, capture_output=True, timeout=300)
    add = write_corpus(tmp_path / "add", docs[100:], "beir")
    rng = random.Random(0)
    kills = 0
    for _ in range(6):
        proc = update_cli(tmp_path / "index", "--add", str(add), "--delete", docs[0]["_id"])
        time.sleep(rng.uniform(0.2, 4.0))  # model loading, encoding, writing or publishing
        if proc.poll() is None:
            proc.send_signal(signal.SIGKILL)
            kills += 1
        proc.communicate(timeout=300)
        assert verify(tmp_path / "index").ok  # whatever was published last, whole
        n = Manifest.read(tmp_path / "index").n_docs
        assert n in (100, 399), n  # the old generation, or the update (a completed one: 99 + 300)
    out, err = update_cli(tmp_path / "index", "--add", str(add), "--delete", docs[0]["_id"]).communicate(timeout=300)
    assert "Traceback" not in err and "399 documents now" in out, (out, err)
    with Retriever.load(tmp_path / "index", query_encoder="llm", warm=False) as r:
        assert len(r.doc_ids) == 399 and r.doc_ids[-1] == docs[-1]["_id"]
    assert kills >= 1  # at least one update really died on the way
    left = [p.name for p in tmp_path.iterdir() if p.name.startswith(".index.") and p.name not in (os.readlink(tmp_path / "index"), ".index.lock")]
    assert left == [], left  # the rerun swept what the killed ones left


# ============================================================ metadata filters
def tagged_docs() -> list[dict]:
    docs = toy_docs(40, seed=7)
    for i, d in enumerate(docs):
        d["lang"] = "en" if i % 3 else "de"
        d["year"] = 1990 + i
        d["tags"] = ["even"] if i % 2 == 0 else ["odd", "x"]
    return docs


@pytest.mark.parametrize("mode", ["sparse", "bm25", "hybrid"])
def test_a_filter_returns_the_best_passing_documents_of_each_channel(tmp_path, tiny_embedder, mode):
    docs = tagged_docs()
    build_index(write_corpus(tmp_path / "c", docs, "beir"), tmp_path / "index", tiny_embedder, top_k=16, lexical="words", dense=True, progress=False)
    r = Retriever.load(tmp_path / "index", embedder=tiny_embedder, query_encoder="llm")
    by_id = {d["_id"]: d for d in docs}
    where = {"lang": "de", "year": {"gte": 1995}}
    passing = {d["_id"] for d in docs if d["lang"] == "de" and d["year"] >= 1995}
    for query in QUERIES:
        hits = r.search(query, k=5, mode=mode, where=where)
        assert hits and {h.doc_id for h in hits} <= passing, (query, [by_id[h.doc_id]["lang"] for h in hits])
        if mode != "hybrid":  # a channel's order among the passing documents is its unfiltered order
            everything = [h.doc_id for h in r.search(query, k=40, mode=mode) if h.doc_id in passing]
            assert [h.doc_id for h in hits] == everything[:5]
    assert {h.doc_id for h in r.search("game", k=40, mode=mode, where={"tags": "odd"})} <= {d["_id"] for d in docs if "odd" in d["tags"]}
    assert len(r.search("cat", k=3, mode="sparse", where={"lang": ["de", "en"]})) == 3


def test_bad_filters_name_the_field(tmp_path, tiny_embedder):
    build_index(write_corpus(tmp_path / "c", tagged_docs(), "beir"), tmp_path / "index", tiny_embedder, top_k=8, progress=False)
    r = Retriever.load(tmp_path / "index", embedder=tiny_embedder, query_encoder="llm")
    with pytest.raises(ValueError, match=r"filter field 'colour' is not a metadata field of this index \(fields: lang, tags, year\)"):
        r.search("cat", where={"colour": "red"})
    with pytest.raises(ValueError, match="filter field 'year': expected a value"):
        r.search("cat", where={"year": {"between": [1, 2]}})
    with pytest.raises(ValueError, match="filter field 'year': gte nan is not a finite number"):
        r.search("cat", where={"year": {"gte": float("nan")}})
    with pytest.raises(ValueError, match="gte needs a number or a string"):
        r.search("cat", where={"year": {"gte": None}})
    assert r.search("cat", where={"year": 3000}) == []


def test_verify_index_reads_the_stored_documents(tmp_path, tiny_embedder):
    docs = toy_docs(5)
    build_index(write_corpus(tmp_path / "c", docs, "beir"), tmp_path / "index", tiny_embedder, top_k=8, progress=False)
    stored = Path(tmp_path / "index").resolve() / "documents.jsonl"
    first = docs[0]["_id"]
    stored.write_bytes(stored.read_bytes().replace(first.encode(), first[::-1].encode(), 1))  # same length: sizes still agree
    problems = verify(tmp_path / "index").problems
    assert any("documents.jsonl:1: id" in p and repr(first) in p for p in problems), problems
    assert any("documents.jsonl" in p and "checksum" in p for p in problems), problems


def test_a_folder_of_text_files_builds_and_updates(tmp_path, tiny_embedder):
    folder = tmp_path / "pages"
    folder.mkdir()
    for i, d in enumerate(toy_docs(8)):
        (folder / f"page-{i}.txt").write_text(f"{d['title']}\n{d['text']}\n", encoding="utf-8")
    build_index(folder, tmp_path / "index", tiny_embedder, top_k=8, lexical="words", progress=False)
    m = Manifest.read(tmp_path / "index")
    assert m.corpus["format"] == "files" and m.n_docs == 8
    (folder / "page-0.txt").write_text("zebra stripes on the savanna", encoding="utf-8")
    changed = tmp_path / "changed"
    changed.mkdir()
    (changed / "page-0.txt").write_text("zebra stripes on the savanna", encoding="utf-8")
    report = update_index(tmp_path / "index", add=list(CorpusSpec(changed)), embedder=tiny_embedder, progress=False)
    assert (report.added, report.replaced) == (0, 1)
    r = Retriever.load(tmp_path / "index", embedder=tiny_embedder, query_encoder="llm")
    assert r.search("zebra savanna", k=1, mode="bm25")[0].doc_id == "page-0.txt"


def test_the_build_counts_the_documents_it_cut(tmp_path, make_embedder):
    embedder = make_embedder(max_length=12)
    docs = toy_docs(20)
    build_index(write_corpus(tmp_path / "c", docs, "beir"), tmp_path / "index", embedder, top_k=8, progress=False)
    lengths = [len(embedder.tokenizer(embedder.normalise(f"{d['title']} {d['text']}"), add_special_tokens=False)["input_ids"]) for d in docs]
    assert Manifest.read(tmp_path / "index").build["documents_cut"] == sum(n > 12 for n in lengths) > 0


@pytest.mark.parametrize("mode", ["sparse", "bm25", "hybrid"])
def test_a_page_is_the_ranks_of_the_full_list(tmp_path, tiny_embedder, mode):
    build_index(write_corpus(tmp_path / "c", toy_docs(30), "beir"), tmp_path / "index", tiny_embedder, top_k=16, lexical="words", dense=True, progress=False)
    r = Retriever.load(tmp_path / "index", embedder=tiny_embedder, query_encoder="llm")
    encoded = r.encode(["cat and dog near the river"], mode)
    full = r.search_encoded(encoded, k=15, mode=mode)[0]
    page = r.search_encoded(encoded, k=15, mode=mode, offset=10)[0]
    assert [(h.doc_id, h.score) for h in page] == [(h.doc_id, h.score) for h in full[10:]]
    with pytest.raises(ValueError, match="offset must be an integer >= 0"):
        r.search_encoded(encoded, k=5, mode=mode, offset=-1)
