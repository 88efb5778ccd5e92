"""``serve --writable``: documents added, replaced and deleted over HTTP, answered from the new
generation at once, the result equal to a rebuild of the final corpus; metadata filters in
/search (retriever/server/writes.py, issue 52)."""
from __future__ import annotations

import numpy as np
import pytest
from conftest import build_tiny_model, tiny_identity, toy_docs, write_corpus

pytest.importorskip("fastapi", reason="the serve extra is not installed: pip install '.[serve]'")
from fastapi.testclient import TestClient

from embedder.encoder import Embedder, EmbedderConfig
from indexer.build import build_index
from retriever.retriever import Retriever
from retriever.server import cli as serve_cli
from retriever.server.app import create_app
from retriever.server.config import ServerConfig
from retriever.server.documents import Documents
from retriever.server.live import reload_with_models

QUERIES = ["cat and dog near the river", "computer memory", "game", "zebra stripes", "snow"]


@pytest.fixture
def embedder(tiny_tokenizer):
    return Embedder(build_tiny_model(tiny_tokenizer, 0), tiny_tokenizer, EmbedderConfig(max_length=64, batch_size=4), identity=tiny_identity(0))


def writable_app(index, embedder, writable: bool = True):
    retriever = Retriever.load(index, embedder=embedder, query_encoder="llm")
    documents_for = lambda r: Documents.for_index(index, r.manifest, r.doc_ids)
    loader = lambda previous: reload_with_models(previous, lambda **models: Retriever.load(index, query_encoder="llm", **models))
    documents, note = documents_for(retriever)
    return create_app(retriever, ServerConfig(writable=writable), documents, note, loader=loader, documents_for=documents_for, poll_s=60)


def test_http_add_replace_delete_equals_a_rebuild_and_is_served_at_once(tmp_path, embedder):
    docs = toy_docs(30, seed=4)
    for i, d in enumerate(docs):
        d["lang"] = "en" if i % 2 else "fr"
    build_index(write_corpus(tmp_path / "a", docs[:24], "beir"), tmp_path / "index", embedder, top_k=16, dense=True, lexical="words", progress=False)
    replaced = {**docs[3], "text": "zebra stripes " + docs[3]["text"], "lang": "de"}
    added = [replaced, *docs[24:]]
    with TestClient(writable_app(tmp_path / "index", embedder)) as client:
        res = client.post("/documents", json={"documents": added, "delete": [docs[0]["_id"], "nope"]})
        assert res.status_code == 200, res.text
        out = res.json()
        assert (out["added"], out["replaced"], out["deleted"], out["not_found"], out["documents"]) == (6, 1, 1, ["nope"], 29)
        assert out["serving"] == out["generation"] == ".index.gen-000002"  # answered from the update at once
        info = client.get("/info").json()
        assert info["documents"] == 29 and info["metadata_fields"] == ["lang"] and info["writable"] is True
        hits = client.post("/search", json={"query": "zebra stripes", "k": 3, "fields": ["id", "title", "snippet"]}).json()["hits"]
        assert hits[0]["id"] == docs[3]["_id"] and "zebra stripes" in hits[0]["snippet"]  # the replaced text, from the index's store
        final = [d for d in docs[:24] if d["_id"] not in (docs[0]["_id"], docs[3]["_id"])] + added
        build_index(write_corpus(tmp_path / "b", final, "beir"), tmp_path / "rebuilt", embedder, top_k=16, dense=True, lexical="words", progress=False)
        rebuilt = Retriever.load(tmp_path / "rebuilt", embedder=embedder, query_encoder="llm")
        for mode in ("sparse", "dense", "bm25", "hybrid"):
            for q in QUERIES:
                got = client.post("/search", json={"query": q, "k": 10, "mode": mode, "fields": ["id", "score"]}).json()["hits"]
                want = rebuilt.search(q, k=10, mode=mode)
                assert [h["id"] for h in got] == [h.doc_id for h in want], (mode, q)
                np.testing.assert_allclose([h["score"] for h in got], [h.score for h in want], rtol=1e-6, atol=1e-5)
        res = client.delete(f"/documents/{docs[3]['_id']}")
        assert res.status_code == 200 and res.json()["documents"] == 28 and res.json()["serving"] == ".index.gen-000003"
        assert docs[3]["_id"] not in [h["id"] for h in client.get("/search", params={"q": "zebra stripes", "fields": "id"}).json()["hits"]]


def test_filters_over_http_and_bad_writes(tmp_path, embedder):
    docs = toy_docs(20, seed=2)
    for i, d in enumerate(docs):
        d["year"] = 2000 + i
    build_index(write_corpus(tmp_path / "a", docs, "beir"), tmp_path / "index", embedder, top_k=16, lexical="words", progress=False)
    with TestClient(writable_app(tmp_path / "index", embedder)) as client:
        res = client.post("/search", json={"query": "game", "k": 5, "filter": {"year": {"gte": 2015}}, "fields": ["id"]})
        assert res.status_code == 200, res.text
        assert {h["id"] for h in res.json()["hits"]} <= {d["_id"] for d in docs if d["year"] >= 2015}
        res = client.get("/search", params={"q": "game", "filter": '{"year": 2003}', "fields": "id"})
        assert res.status_code == 200 and [h["id"] for h in res.json()["hits"]] in ([], [docs[3]["_id"]])
        for body, status, words in (
            ({"query": "game", "filter": {"colour": "red"}}, 422, "filter field 'colour' is not a metadata field"),
            ({"query": "game", "filter": {"year": {"near": 3}}}, 422, "filter field 'year'"),
        ):
            res = client.post("/search", json=body)
            assert res.status_code == status and words in res.json()["detail"], res.text
        assert client.get("/search", params={"q": "game", "filter": "{year"}).status_code == 422
        res = client.post("/documents", json={"documents": [{"_id": "x1"}]})
        assert res.status_code == 422 and "documents:1: field 'text/contents': missing text field" in res.json()["detail"]
        res = client.post("/documents", json={"documents": [], "delete": []})
        assert res.status_code == 422 and "nothing to do" in res.json()["detail"]
        res = client.post("/documents", json={"delete": [d["_id"] for d in docs]})
        assert res.status_code == 409 and "every document" in res.json()["detail"]
        assert client.get("/healthz").json()["documents"] == 20  # nothing was published
    with TestClient(writable_app(tmp_path / "index", embedder, writable=False)) as client:
        assert client.post("/documents", json={"delete": ["x"]}).status_code in (404, 405)


@pytest.mark.parametrize("argv, words", [
    (["--writable", "--no-reload"], "--writable with --no-reload"),
    (["--writable", "--host", "0.0.0.0"], "--writable on 0.0.0.0: anyone who reaches the port could change the index"),
])
def test_serve_refuses_unsafe_writable_setups(tmp_path, capsys, monkeypatch, argv, words):
    monkeypatch.delenv("ALIGNED_TOKENS_API_KEY", raising=False)
    (tmp_path / "index").mkdir()
    assert serve_cli.main([str(tmp_path / "index"), "--port", "0", *argv]) == 2
    assert words in capsys.readouterr().err
