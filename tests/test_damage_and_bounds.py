"""Damage is never laundered into a clean generation, and nothing reads forever (issue 68).

One adversarial case per failure the issue found, on the tiny model:

1. an update (Python, CLI, HTTP) or a compact copy of a damaged generation is refused naming the
   file, before any encoding, and publishes nothing;
2. ``update-index --delete-file`` and ``verify-index`` refuse a device, a FIFO or a directory at
   once (never an endless read);
3. a filter nested 1000 levels deep is one line (exit 2, 422);
4. a filter bound of the wrong type, NaN and Infinity are refused naming the field (typed schema
   recorded in the manifest; inferred for an index without it);
5. metadata that strict JSON cannot hold (1e400, NaN) is refused naming the document and field;
6. ids in ``--delete-file`` are kept exactly as written;
7. an update that changes nothing publishes nothing; a document over the size limit is refused
   before encoding; a write being encoded does not hold the write lock;
8. ``build-index --channels bm25`` builds BM25 alone and runs no LLM.
"""
from __future__ import annotations

import json
import os
import re
import shutil
import threading
import time
from pathlib import Path

import pytest
from conftest import toy_docs, write_corpus

from embedder.encoder import Embedder
from indexer import cli as build_cli
from indexer import cli_update, verify_cli
from indexer.compact import compact_copy
from indexer.corpus import CorpusError, CorpusSpec, Document, document_from_object
from indexer.manifest import IndexFormatError, Manifest
from indexer.stored_documents import StoredDocuments
from indexer.updates import prepare_update, publish_update, read_delete_ids, update_index
from indexer.verify import verify
from retriever import cli as search_cli
from retriever.filters import loads_filter, parse_filter
from retriever.retriever import Retriever

NESTED = '{"a":' * 1000 + "1" + "}" * 1000


def tagged(n: int = 20) -> list[dict]:
    docs = toy_docs(n, seed=11)
    for i, d in enumerate(docs):
        d["year"] = 1990 + i
        d["lang"] = "en" if i % 2 else "de"
        d["flag"] = i % 3 == 0
    return docs


@pytest.fixture(scope="module")
def pristine(tmp_path_factory, tiny_model_dir) -> Path:
    """A float32 tiny-model index (sparse, dense, BM25) of 20 tagged documents, built by the command
    line (so that update-index and search-index load its model); cases work on copies."""
    root = tmp_path_factory.mktemp("damage")
    corpus = write_corpus(root / "corpus", tagged(), "beir")
    argv = ["--corpus", str(corpus), "--index", str(root / "index"), "--model", str(tiny_model_dir), "--adapter", "none",
            "--top-k", "8", "--channels", "sparse,dense,bm25", "--no-compact", "--quiet"]  # fmt: skip
    assert build_cli.main(argv) == 0
    return root / "index"


@pytest.fixture
def index(pristine, tmp_path) -> Path:
    """A copy of the pristine index, as a link to its generation (the layout a build writes)."""
    gen = tmp_path / ".index.gen-000001"
    shutil.copytree(Path(pristine).resolve(), gen)
    os.symlink(gen.name, tmp_path / "index")
    return tmp_path / "index"


class NoModel:
    """An embedder that fails the test when anything but its (absent) tokenizer is read: nothing may be encoded."""

    tokenizer = None

    def __getattr__(self, name):
        raise AssertionError(f"the embedder was used ({name}) before the update was refused")


def generations(index: Path) -> list[str]:
    return sorted(p.name for p in index.parent.iterdir() if p.name.startswith(".index.gen-"))


def one_line(err: str, command: str) -> str:
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith(f"{command}: error: ") and "Traceback" not in err, err
    return lines[0]


def flip(path: Path, at: int | None = None) -> None:
    data = bytearray(path.read_bytes())
    at = len(data) // 2 if at is None else at
    data[at] ^= 0x01
    path.write_bytes(bytes(data))


def damage(gen: Path, rel: str) -> None:
    """One kind of damage to ``rel`` that keeps its size (so only a checksum can see it)."""
    path = gen / rel
    if rel == "manifest.json":  # a setting's digit: k1 0.9 -> 0.8 would change every BM25 ranking
        text = path.read_text()
        assert '"k1": 0.9' in text
        path.write_text(text.replace('"k1": 0.9', '"k1": 0.8'))
    elif rel == "documents.jsonl":  # a letter of a stored text: BM25 would be recomputed from it
        data = path.read_bytes()
        at = data.index(b'"text":"') + 9
        path.write_bytes(data[:at] + bytes([data[at] ^ 0x02]) + data[at + 1:])
    else:
        flip(path)


DAMAGED = ["manifest.json", "documents.jsonl", "doc_ids.json", "postings_weights.npy", "dense.faiss", "lexical/postings_weights.npy"]


# ============================================================ 1. damage is never carried forward
@pytest.mark.parametrize("rel", DAMAGED)
def test_an_update_refuses_a_damaged_generation_by_name_before_encoding(index, rel):
    damage(index.resolve(), rel)
    assert not verify(index).ok
    before = generations(index)
    name = rel.split("/")[-1]
    with pytest.raises(IndexFormatError, match=rf"{name}: .*the index is damaged, so nothing was encoded, updated or published"):
        update_index(index, add=[Document("new-1", "cat and dog")], embedder=NoModel(), progress=False)
    with pytest.raises(IndexFormatError, match=rf"{name}: .*the index is damaged, so nothing was updated or published"):
        update_index(index, delete=[tagged()[0]["_id"]], progress=False)
    assert generations(index) == before and os.readlink(index) == ".index.gen-000001"  # nothing published
    assert not verify(index).ok  # still damaged, never resealed


def test_update_index_cli_names_the_damaged_file_and_exits_2(index, tmp_path, capsys):
    damage(index.resolve(), "manifest.json")
    add = write_corpus(tmp_path / "add", [{"_id": "n1", "title": "", "text": "cat"}], "jsonl")
    assert cli_update.main(["--index", str(index), "--add", str(add), "--quiet"]) == 2
    line = one_line(capsys.readouterr().err, "update-index")
    assert "manifest.json: xxh3_64 checksum" in line and "nothing was encoded, updated or published" in line
    assert generations(index) == [".index.gen-000001"]


def test_a_compact_copy_refuses_a_damaged_index(index, tmp_path):
    damage(index.resolve(), "documents.jsonl")
    with pytest.raises(IndexFormatError, match=r"documents.jsonl: .*no copy was written"):
        compact_copy(index, tmp_path / "compact")
    assert not os.path.lexists(tmp_path / "compact")


def test_a_compact_copy_carries_only_recorded_files(index, tmp_path):
    (index.resolve() / "planted.bin").write_bytes(b"not the index's")
    compact_copy(index, tmp_path / "compact")
    assert not (tmp_path / "compact" / "planted.bin").exists() and verify(tmp_path / "compact").ok


# ============================================================ 2. bounded reads
@pytest.mark.parametrize("special", ["/dev/zero", "fifo", "directory"])
def test_a_delete_file_that_is_no_regular_file_is_refused_at_once(index, tmp_path, capsys, special):
    path = Path(special)
    if special == "fifo":
        path = tmp_path / "ids.fifo"
        os.mkfifo(path)
    elif special == "directory":
        path = tmp_path
    t0 = time.monotonic()
    assert cli_update.main(["--index", str(index), "--delete-file", str(path), "--quiet"]) == 2
    assert time.monotonic() - t0 < 10
    assert "not a regular file" in one_line(capsys.readouterr().err, "update-index")
    assert generations(index) == [".index.gen-000001"]


def run_bounded(fn, seconds: float = 60):
    """``fn()`` in a thread; fail (rather than hang the suite) when it has not returned in ``seconds``."""
    out: dict = {}

    def target():
        try:
            out["value"] = fn()
        except BaseException as exc:  # noqa: BLE001 - handed to the test
            out["error"] = exc

    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    thread.join(seconds)
    assert not thread.is_alive(), f"still reading after {seconds} s"
    if "error" in out:
        raise out["error"]
    return out["value"]


@pytest.mark.parametrize("rel", ["documents.jsonl", "documents_offsets.npy", "doc_ids.json", "postings_docs.npy", "dense.faiss",
                                 "lexical/postings_indptr.npy", "manifest.json"])
@pytest.mark.parametrize("kind", ["dev-zero", "fifo"])
def test_verify_index_never_reads_a_special_file_forever(index, capsys, rel, kind):
    path = index.resolve() / rel
    path.unlink()
    if kind == "dev-zero":
        os.symlink("/dev/zero", path)
    else:
        os.mkfifo(path)
    code = run_bounded(lambda: verify_cli.main([str(index)]))
    captured = capsys.readouterr()
    assert code == 1, captured  # damaged (the manifest too: it is there, not a regular file)
    assert "not a regular file" in captured.out + captured.err and "Traceback" not in captured.err


def test_stored_documents_are_read_bounded(index):
    gen = index.resolve()
    (gen / "documents.jsonl").unlink()
    os.symlink("/dev/zero", gen / "documents.jsonl")
    with pytest.raises(IndexFormatError, match="documents.jsonl: not a regular file"):
        run_bounded(lambda: StoredDocuments.open(gen, 20))
    (gen / "documents.jsonl").unlink()
    (gen / "documents.jsonl").write_bytes(b"x" * 10_000_000)  # longer than its offsets say: refused, not read whole
    with pytest.raises(IndexFormatError, match="documents.jsonl: 10000000 bytes, more than the"):
        StoredDocuments.open(gen, 20)


# ============================================================ 3-4. filters: depth, types, NaN
def test_a_deeply_nested_filter_is_one_line_and_exit_2(index, capsys):
    assert search_cli.main(["--index", str(index), "--where", NESTED, "--mode", "bm25", "cat"]) == 2
    assert "nested more than 32 levels deep" in one_line(capsys.readouterr().err, "search-index")
    with pytest.raises(ValueError, match="nested more than 3 levels deep"):
        parse_filter(json.loads('{"a":' * 200 + "1" + "}" * 200), ["a"])  # parsed elsewhere (a request body): its depth refused
    with pytest.raises(ValueError, match="nested more than 32"):
        loads_filter("[" * 100_000)


@pytest.mark.parametrize("where, words", [
    ({"year": {"gte": "abc"}}, "filter field 'year': gte 'abc' is a string, but the field holds numbers"),
    ({"year": "1999"}, "filter field 'year': value '1999' is a string, but the field holds numbers"),
    ({"year": True}, "filter field 'year': value True is a boolean, but the field holds numbers"),
    ({"lang": {"lt": 5}}, "filter field 'lang': lt 5 is a number, but the field holds strings"),
    ({"flag": 1}, "filter field 'flag': value 1 is a number, but the field holds booleans"),
    ({"flag": {"gte": True}}, "filter field 'flag': gte needs a number or a string"),
    ({"year": float("nan")}, "filter field 'year': value nan is not a finite number"),
    ({"year": [1995, float("inf")]}, "filter field 'year': value inf is not a finite number"),
    ({"year": {"lte": float("-inf")}}, "filter field 'year': lte -inf is not a finite number"),
    ({"year": {"gte": float("nan")}}, "filter field 'year': gte nan is not a finite number"),
])
def test_wrong_typed_and_non_finite_filters_are_refused_naming_the_field(index, where, words):
    with Retriever.load(index, query_encoder="llm", warm=False) as r:
        assert r.manifest.documents["metadata_types"] == {"flag": ["boolean"], "lang": ["string"], "year": ["number"]}
        with pytest.raises(ValueError) as err:
            r.search("cat", mode="bm25", where=where)
        assert str(err.value).startswith(words), str(err.value)
        passing = {i for i, d in enumerate(tagged()) if d["year"] >= 2000 and d["lang"] == "en" and not d["flag"]}
        assert set(r.filter_mask({"year": {"gte": 2000}, "lang": "en", "flag": False}).nonzero()[0]) == passing != set()


def test_wrong_typed_filter_is_exit_2_from_search_index(index, capsys):
    for where in ('{"year": {"gte": "abc"}}', '{"year": NaN}', '{"year": {"lt": Infinity}}', '{"year": 1e400}'):
        assert search_cli.main(["--index", str(index), "--where", where, "--mode", "bm25", "cat"]) == 2
        assert "filter field 'year'" in one_line(capsys.readouterr().err, "search-index")


def test_a_field_of_several_types_takes_no_range_and_an_old_manifest_infers_the_types(index):
    update_index(index, add=[document_from_object({"_id": "odd", "text": "cat", "year": "nineteen"}, "test", 1)], progress=False)
    m = Manifest.read(index)
    assert m.documents["metadata_types"]["year"] == ["number", "string"]  # recomputed by the update
    with Retriever.load(index, query_encoder="llm", warm=False) as r:
        with pytest.raises(ValueError, match="filter field 'year': a range needs a field of one type"):
            r.search("cat", mode="bm25", where={"year": {"gte": "abc"}})  # never the document whose year is 'nineteen'
        assert [h.doc_id for h in r.search("cat", mode="bm25", where={"year": "nineteen"})] == ["odd"]
    # an index written before the types were recorded: inferred from its stored documents on the first filter
    gen = index.resolve()
    m = Manifest.read(gen)
    del m.documents["metadata_types"]
    m.write(gen)
    with Retriever.load(index, query_encoder="llm", warm=False) as r:
        with pytest.raises(ValueError, match="filter field 'lang': gte 3 is a number, but the field holds strings"):
            r.search("cat", mode="bm25", where={"lang": {"gte": 3}})
        assert r.filters.types["year"] == ["number", "string"]


# ============================================================ 5. strict JSON in the stored documents
@pytest.mark.parametrize("line, field", [
    ('{"_id": "a", "text": "cat", "year": 1e400}', "year"),
    ('{"_id": "a", "text": "cat", "year": NaN}', "year"),
    ('{"_id": "a", "text": "cat", "metadata": {"w": [1, -Infinity]}}', "w[1]"),
    ('{"_id": "a", "text": "cat", "deep": {"x": {"y": Infinity}}}', "deep.x.y"),
])
def test_metadata_that_is_not_strict_json_is_refused_naming_document_and_field(tmp_path, index, line, field):
    corpus = tmp_path / "c.jsonl"
    corpus.write_text(line + "\n")
    with pytest.raises(CorpusError, match=rf"c.jsonl:1: field '{re.escape(field)}': document 'a': .* is not a finite number"):
        list(CorpusSpec(corpus))
    with pytest.raises(CorpusError, match=rf"field '{re.escape(field)}': document 'a'"):
        update_index(index, add=[Document("a", "cat", metadata=json.loads(line).get("metadata") or
                                          {k: v for k, v in json.loads(line).items() if k not in ("_id", "text")})],
                     embedder=NoModel(), progress=False)
    assert generations(index) == [".index.gen-000001"]


def test_stored_documents_are_strict_json(index):
    update_index(index, add=[document_from_object({"_id": "big", "text": "cat", "n": 1e308, "tiny": 5e-324}, "t", 1)], progress=False)

    def refuse(word):
        raise ValueError(f"not strict JSON: {word}")

    for raw in (index.resolve() / "documents.jsonl").read_text().splitlines():
        json.loads(raw, parse_constant=refuse)


# ============================================================ 6. ids exactly as given
def test_delete_file_ids_are_kept_exactly(tmp_path, tiny_model_dir, capsys):
    docs = [{"_id": " lead", "text": "cat"}, {"_id": "trail ", "text": "dog"}, {"_id": "tab\tin", "text": "fish"},
            {"_id": "plain", "text": "bird"}, {"_id": "keep", "text": "lion"}]
    corpus = write_corpus(tmp_path / "c", [{**d, "title": ""} for d in docs], "beir")
    argv = ["--corpus", str(corpus), "--index", str(tmp_path / "index"), "--model", str(tiny_model_dir), "--adapter", "none",
            "--top-k", "8", "--channels", "sparse,bm25", "--quiet"]  # fmt: skip
    assert build_cli.main(argv) == 0
    ids = tmp_path / "ids.txt"
    ids.write_bytes(b" lead\r\ntrail \n\n   \ntab\tin\nplain")
    assert read_delete_ids(ids) == [" lead", "trail ", "tab\tin", "plain"]
    capsys.readouterr()
    assert cli_update.main(["--index", str(tmp_path / "index"), "--delete-file", str(ids), "--quiet"]) == 0
    assert "4 deleted" in capsys.readouterr().out
    with Retriever.load(tmp_path / "index", query_encoder="llm", warm=False) as r:
        assert r.doc_ids == ["keep"]
    ids.write_bytes(b"keep \n")  # not "keep": reported, nothing deleted
    assert cli_update.main(["--index", str(tmp_path / "index"), "--delete-file", str(ids), "--quiet"]) == 0
    assert "(1 not indexed: 'keep ')" in capsys.readouterr().out


# ============================================================ 7. no-op updates, document size, the lock
def test_an_update_that_changes_nothing_publishes_nothing(index, capsys):
    report = update_index(index, delete=["no-such-id", " no-such-id"], progress=False)
    assert not report.published and report.not_found == ["no-such-id", " no-such-id"] and report.generation == ".index.gen-000001"
    assert cli_update.main(["--index", str(index), "--delete", "nope", "--quiet"]) == 0
    assert capsys.readouterr().out.startswith(f"nothing to update in {index}: 0 added, 0 replaced, 0 deleted (1 not indexed: 'nope'); nothing published")
    assert generations(index) == [".index.gen-000001"]


def test_a_document_over_the_size_limit_is_refused_before_encoding(index):
    big = Document("big", "cat " * 300_000)  # 1.2 MB of text, over the 1 MiB default
    with pytest.raises(CorpusError, match=r"added documents:1: document 'big' is \d+ bytes stored .* more than the 1048576"):
        update_index(index, add=[big], embedder=NoModel(), progress=False)
    with pytest.raises(CorpusError, match="more than the 100 a document may hold"):
        update_index(index, add=[Document("small", "cat " * 30)], embedder=NoModel(), progress=False, max_document_bytes=100)
    assert generations(index) == [".index.gen-000001"]


def test_an_update_encoded_meanwhile_loses_nothing(index):
    prepared = prepare_update(index, add=[Document("n1", "cat and dog")], progress=False)
    update_index(index, delete=[tagged()[0]["_id"]], progress=False)  # published while n1 was "being encoded"
    report = publish_update(prepared)
    assert (report.added, report.n_docs) == (1, 20)
    with Retriever.load(index, query_encoder="llm", warm=False) as r:
        assert "n1" in r.doc_ids and tagged()[0]["_id"] not in r.doc_ids


# ============================================================ the same over HTTP
@pytest.fixture
def client_for():
    pytest.importorskip("fastapi", reason="the serve extra is not installed: pip install '.[serve]'")
    from fastapi.testclient import TestClient

    from retriever.server.app import create_app
    from retriever.server.config import ServerConfig
    from retriever.server.documents import Documents
    from retriever.server.live import reload_with_models

    def make(index: Path, **limits):
        retriever = Retriever.load(index, query_encoder="llm")
        documents_for = lambda r: Documents.for_index(index, r.manifest, r.doc_ids)
        loader = lambda previous: reload_with_models(previous, lambda **models: Retriever.load(index, query_encoder="llm", **models))
        documents, note = documents_for(retriever)
        app = create_app(retriever, ServerConfig(writable=True, **limits), documents, note, loader=loader, documents_for=documents_for, poll_s=60)
        return TestClient(app, raise_server_exceptions=False)

    return make


def test_http_writes_refuse_damage_and_hostile_values(index, client_for):
    with client_for(index, max_document_bytes=2000) as client:
        res = client.delete("/documents/no-such-id")
        assert res.status_code == 200 and res.json()["published"] is False and res.json()["generation"] == ".index.gen-000001"
        res = client.post("/documents", json={"documents": [{"_id": "n", "text": "cat " * 600}]})
        assert res.status_code == 422 and "more than the 2000 a document may hold" in res.json()["detail"], res.text
        body = '{"documents": [{"_id": "n", "text": "cat", "year": 1e400}]}'
        res = client.post("/documents", content=body, headers={"Content-Type": "application/json"})
        assert res.status_code == 422 and "field 'year': document 'n': inf is not a finite number" in res.json()["detail"], res.text
        for where, words in (('{"year": {"gte": "abc"}}', "filter field 'year': gte 'abc' is a string"), ('{"year": NaN}', "not a finite"),
                             (NESTED, "nested more than 32 levels deep")):
            res = client.get("/search", params={"q": "cat", "filter": where})
            assert res.status_code == 422 and words in res.json()["detail"], res.text
            res = client.post("/search", content=f'{{"query": "cat", "filter": {where}}}', headers={"Content-Type": "application/json"})
            assert res.status_code in (400, 422) and "Traceback" not in res.text, res.text
        damage(index.resolve(), "documents.jsonl")
        res = client.post("/documents", json={"delete": [tagged()[1]["_id"]]})
        assert res.status_code == 409 and "documents.jsonl: xxh3_64 checksum" in res.json()["detail"], res.text
        assert client.get("/healthz").json()["generation"] == ".index.gen-000001"
    assert generations(index) == [".index.gen-000001"]


def test_http_a_write_being_encoded_does_not_hold_the_write_lock(index, client_for, monkeypatch):
    from indexer import updates

    inside, release = threading.Event(), threading.Event()
    encode = updates._encode

    def slow_encode(*args, **kwargs):
        inside.set()
        assert release.wait(60)
        return encode(*args, **kwargs)

    monkeypatch.setattr(updates, "_encode", slow_encode)
    with client_for(index) as client:
        result: dict = {}
        adder = threading.Thread(target=lambda: result.setdefault("add", client.post("/documents", json={"documents": [{"_id": "n1", "text": "cat"}]})))
        adder.start()
        assert inside.wait(60)
        res = client.delete(f"/documents/{tagged()[0]['_id']}")  # while n1 is being encoded
        assert res.status_code == 200 and res.json()["published"] and res.json()["documents"] == 19, res.text
        release.set()
        adder.join(60)
        assert result["add"].status_code == 200 and result["add"].json()["documents"] == 20, result["add"].text
        assert client.get("/healthz").json()["documents"] == 20


# ============================================================ 8. --channels builds exactly what it names
def test_channels_bm25_builds_bm25_alone_and_runs_no_llm(tmp_path, tiny_model_dir, monkeypatch, capsys):
    corpus = write_corpus(tmp_path / "c", tagged(), "beir")

    def no_llm(*args, **kwargs):
        raise AssertionError("the LLM was loaded for a BM25-only index")

    argv = ["--corpus", str(corpus), "--index", str(tmp_path / "bm25"), "--model", str(tiny_model_dir), "--adapter", "none",
            "--channels", "bm25", "--quiet"]  # fmt: skip
    monkeypatch.setattr(Embedder, "load", no_llm)
    assert build_cli.main(argv) == 0, capsys.readouterr().err
    m = Manifest.read(tmp_path / "bm25")
    assert m.record("lexical") is not None and m.record("sparse") is None and m.record("dense") is None and m.record("encoder") is None
    assert not list((tmp_path / "bm25").glob("postings_*")) and verify(tmp_path / "bm25").ok
    with Retriever.load(tmp_path / "bm25", warm=False) as r:
        assert r.default_mode == "bm25" and r.search("cat", k=3)[0].doc_id in {d["_id"] for d in tagged()}
    # an update of it encodes nothing with an LLM either
    update_index(tmp_path / "bm25", add=[Document("n1", "zebra zebra")], delete=[tagged()[0]["_id"]], embedder=NoModel(), progress=False)
    with Retriever.load(tmp_path / "bm25", warm=False) as r:
        assert r.search("zebra", k=1)[0].doc_id == "n1"


def test_channels_bm25_and_an_encoder_build_and_search_without_the_llm(tmp_path, tiny_model_dir, monkeypatch, capsys):
    pytest.importorskip("sentence_transformers")
    from conftest import save_tiny_sentence_encoder

    encoder = save_tiny_sentence_encoder(tmp_path / "st")
    corpus = write_corpus(tmp_path / "c", tagged(), "beir")

    def no_llm(*args, **kwargs):
        raise AssertionError("the LLM was loaded for an index of BM25 and a sentence encoder")

    monkeypatch.setattr(Embedder, "load", no_llm)
    argv = ["--corpus", str(corpus), "--index", str(tmp_path / "index"), "--model", str(tiny_model_dir), "--adapter", "none",
            "--channels", "bm25,encoder", "--encoder", str(encoder), "--quiet"]  # fmt: skip
    assert build_cli.main(argv) == 0, capsys.readouterr().err
    m = Manifest.read(tmp_path / "index")
    assert m.record("sparse") is None and m.record("lexical") is not None and m.record("encoder") is not None and m.record("dense") is None
    with Retriever.load(tmp_path / "index", warm=False) as r:
        assert r.default_mode == "hybrid" and set(r.channels_of("hybrid")) == {"bm25", "encoder"}
        assert len(r.search("cat and dog", k=3)) == 3
    update_index(tmp_path / "index", add=[Document("n1", "zebra lion")], embedder=NoModel(), progress=False)
    assert Manifest.read(tmp_path / "index").n_docs == 21 and verify(tmp_path / "index").ok


def test_channels_dense_alone_runs_the_llm_for_its_vectors_only(tmp_path, tiny_model_dir):
    corpus = write_corpus(tmp_path / "c", tagged(), "beir")
    argv = ["--corpus", str(corpus), "--index", str(tmp_path / "index"), "--model", str(tiny_model_dir), "--adapter", "none",
            "--channels", "dense", "--no-compact", "--quiet"]  # fmt: skip
    assert build_cli.main(argv) == 0
    m = Manifest.read(tmp_path / "index")
    assert m.record("sparse") is None and m.record("dense") is not None and not list((tmp_path / "index").glob("postings_*"))
    with Retriever.load(tmp_path / "index", query_encoder="llm", warm=False) as r:
        assert r.default_mode == "dense" and len(r.search("cat", k=3)) == 3
    update_index(tmp_path / "index", add=[Document("n1", "zebra lion")], progress=False)
    with Retriever.load(tmp_path / "index", query_encoder="llm", warm=False) as r:
        assert len(r.doc_ids) == 21
    assert verify(tmp_path / "index").ok
    compact_copy(tmp_path / "index", tmp_path / "compact")
    assert Manifest.read(tmp_path / "compact").record("dense")["kind"] == "SQ8" and verify(tmp_path / "compact").ok
