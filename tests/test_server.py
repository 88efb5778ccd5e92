"""``serve``: the HTTP API over one warm Retriever (FastAPI TestClient, tiny model, toy corpus)."""
from __future__ import annotations

import json
import threading
import time
from pathlib import Path

import pytest
from conftest import build_tiny_model, tiny_identity, toy_docs, write_corpus
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

pytest.importorskip("fastapi", reason="the serve extra is not installed: pip install '.[serve]'")
from fastapi.testclient import TestClient

from embedder.encoder import Embedder, EmbedderConfig
from indexer.build import build_index
from retriever.retriever import MODES, Retriever
from retriever.server.app import create_app
from retriever.server.config import ServerConfig
from retriever.server.documents import Documents

QUERIES = ["cat and dog near the river", "computer memory", "a puzzle for the team"]


@pytest.fixture(scope="module")
def served(tmp_path_factory, tiny_tokenizer):
    """A sparse + dense + BM25 index of the toy corpus, its Retriever and documents (module-scoped)."""
    root = tmp_path_factory.mktemp("served")
    embedder = Embedder(build_tiny_model(tiny_tokenizer, 0), tiny_tokenizer, EmbedderConfig(max_length=64, batch_size=4), identity=tiny_identity(0))
    corpus = write_corpus(root / "corpus", toy_docs(40), "beir")
    build_index(corpus, root / "index", embedder, top_k=16, dense=True, lexical="words", progress=False)
    retriever = Retriever.load(root / "index", embedder=embedder)
    documents, note = Documents.for_index(root / "index", retriever.manifest, retriever.doc_ids)
    assert documents is not None, note
    return retriever, documents, note


def client_for(served, **limits) -> TestClient:
    retriever, documents, note = served
    return TestClient(create_app(retriever, ServerConfig(**limits), documents, note))


@pytest.fixture(scope="module")
def client(served):
    with client_for(served, max_k=50) as c:
        yield c


def test_healthz_and_info(client, served):
    retriever = served[0]
    generation = Path(retriever.generation.path).name
    assert client.get("/healthz").json() == {"status": "ok", "documents": 40, "generation": generation}
    info = client.get("/info").json()
    assert info["generation"] == generation and info["loaded_at"].endswith("Z") and info["reload"]["follows_index"] is False
    assert info["documents"] == 40 and info["channels"] == ["sparse", "dense", "bm25"]
    assert info["default_mode"] == "hybrid" and info["fusion"] == retriever.fusion
    assert info["model"]["name"] == "tiny-0" and info["limits"]["max_k"] == 50 and info["limits"]["auth"] is False
    assert info["runtime"]["queries"] is not None and "snippets from" in info["snippets"]
    assert info["query_encoder"] == retriever.query_encoder and info["feedback"] is None and info["sparse_pruning"] is None
    assert info["profile"] == (retriever.profile.name if retriever.profile is not None else None)
    assert client.get("/openapi.json").json()["paths"].keys() >= {"/search", "/search/batch", "/info", "/healthz"}
    assert client.get("/docs").status_code == 200


def test_search_returns_the_retrievers_hits_explained(client, served):
    retriever, documents, _ = served
    for q in QUERIES:
        body = client.post("/search", json={"query": q, "k": 5}).json()
        want = retriever.search(q, k=5)
        assert body["mode"] == "hybrid" and [h["id"] for h in body["hits"]] == [h.doc_id for h in want]
        for h, w in zip(body["hits"], want):
            assert h["score"] == pytest.approx(w.score) and h["channels"] == pytest.approx(w.channels)
            assert sum(h["channels"].values()) == pytest.approx(h["score"])
            assert h["matched"] == pytest.approx(w.matched_tokens)
            assert h["snippet"] and h["snippet"].strip("…") in documents.texts[h["id"]]
            assert all(word.lower() in documents.texts[h["id"]].lower() for word in h["highlight"] if word in h["snippet"])
            assert h["title"] == documents.titles[h["id"]]
    sparse = client.post("/search", json={"query": QUERIES[0], "k": 3, "mode": "sparse"}).json()
    assert sparse["mode"] == "sparse" and [h["id"] for h in sparse["hits"]] == [h.doc_id for h in retriever.search(QUERIES[0], k=3, mode="sparse")]
    assert client.get("/search", params={"q": QUERIES[0], "k": 3, "mode": "sparse"}).json()["hits"] == sparse["hits"]
    assert client.post("/search", json={"query": "   ", "k": 3}).json()["hits"] == []


def test_search_with_a_fusion_of_its_own(client, served):
    retriever = served[0]
    fusion = {"method": "minmax", "weights": {"sparse": 1.0, "bm25": 0}}
    body = client.post("/search", json={"query": QUERIES[1], "k": 5, "fusion": fusion}).json()
    alone = Retriever.load(retriever.index_dir, embedder=retriever.embedder, fusion={**fusion, "rrf_k": 60}).search(QUERIES[1], k=5, mode="hybrid")
    assert [h["id"] for h in body["hits"]] == [h.doc_id for h in alone]
    assert all(set(h["channels"]) == {"sparse"} for h in body["hits"])
    assert client.post("/search", json={"query": QUERIES[1], "k": 5}).json()["hits"][0]["channels"].keys() > {"sparse"}  # default untouched


def test_batch(client, served):
    body = client.post("/search/batch", json={"queries": QUERIES + [""], "k": 4}).json()
    assert [r["query"] for r in body["results"]] == QUERIES + [""] and body["results"][-1]["hits"] == []
    for r, hits in zip(body["results"], served[0].batch_search(QUERIES, k=4)):
        assert [h["id"] for h in r["hits"]] == [h.doc_id for h in hits]
    assert client.post("/search/batch", json={"queries": [], "k": 4}).json()["results"] == []


@pytest.mark.parametrize("body, status, message", [
    ({"query": "cat", "k": 0}, 422, "k must be between 1 and 50, got 0"),
    ({"query": "cat", "k": 10**12}, 422, "k must be between 1 and 50"),
    ({"query": "cat", "k": "10"}, 422, "k: Input should be a valid integer"),
    ({"query": "cat", "k": True}, 422, "k: Input should be a valid integer"),
    ({"query": 42}, 422, "query: Input should be a valid string"),
    ({}, 422, "query: Field required"),
    ({"query": "cat", "mode": "telepathy"}, 422, "mode must be one of"),
    ({"query": "cat", "mode": "encoder"}, 422, "mode 'encoder' needs an index built with --encoder"),  # the Retriever's own message
    ({"query": "cat", "extra": 1}, 422, "extra: Extra inputs are not permitted"),
    ({"query": "x" * 2001}, 422, "query has 2001 characters; at most 2000"),
    ({"query": "cat", "fusion": {"weights": {"telepathy": 1}}}, 422, "channel(s) telepathy not in this index"),
    ({"query": "cat", "fusion": {"weights": {"sparse": 0}}}, 422, "at least one > 0"),
    ({"query": "cat", "fusion": {"method": "borda", "weights": {"sparse": 1}}}, 422, "fusion.method"),
])
def test_bad_requests_get_a_4xx_with_a_message(client, body, status, message):
    res = client.post("/search", json=body)
    assert res.status_code == status and message in res.json()["detail"], res.json()


def test_body_limits(client):
    res = client.post("/search", content=json.dumps({"query": "x" * 1_000_000}), headers={"Content-Type": "application/json"})
    assert res.status_code == 413 and "larger than 65536 bytes" in res.json()["detail"]
    res = client.post("/search", content=b"{not json", headers={"Content-Type": "application/json"})
    assert res.status_code == 422 and "JSON" in res.json()["detail"]
    res = client.post("/search", content=b"", headers={"Content-Type": "application/json"})
    assert res.status_code == 422 and res.json()["detail"]
    many = client.post("/search/batch", json={"queries": ["cat"] * 33})
    assert many.status_code == 422 and "33 given; at most 32" in many.json()["detail"]
    assert client.get("/nowhere").status_code == 404 and client.get("/nowhere").json()["detail"]


def test_api_key_guards_every_route_but_healthz_and_the_page(served):
    with client_for(served, api_key="s3cret") as c:
        assert c.get("/healthz").status_code == 200 and c.get("/").status_code == 200
        for method, path, body in (("post", "/search", {"query": "cat"}), ("get", "/info", None), ("get", "/openapi.json", None),
                                   ("post", "/search/batch", {"queries": ["cat"]})):
            call = getattr(c, method)
            kwargs = {"json": body} if body else {}
            assert call(path, **kwargs).status_code == 401
            assert call(path, headers={"Authorization": "Bearer wrong"}, **kwargs).status_code == 401
            res = call(path, headers={"Authorization": "Bearer s3cret"}, **kwargs)
            assert res.status_code == 200, (path, res.text)
        assert c.get("/info").headers["WWW-Authenticate"] == "Bearer"


def test_a_request_queued_past_the_timeout_gets_503_and_retry_after(served, monkeypatch):
    retriever = served[0]
    entered, release = threading.Event(), threading.Event()
    original = Retriever.encode

    def slow(self, queries, mode=None):
        entered.set()
        release.wait(10)
        return original(self, queries, mode)

    monkeypatch.setattr(Retriever, "encode", slow)
    with client_for(served, max_concurrency=1, queue_timeout_s=0.2) as c:
        first: dict = {}
        t = threading.Thread(target=lambda: first.setdefault("res", c.post("/search", json={"query": "cat", "k": 3})))
        t.start()
        assert entered.wait(10)
        t0 = time.monotonic()
        busy = c.post("/search", json={"query": "dog", "k": 3})
        assert busy.status_code == 503 and busy.headers["Retry-After"] == "1" and "busy" in busy.json()["detail"]
        assert time.monotonic() - t0 >= 0.2
        assert c.get("/healthz").status_code == 200  # not behind the queue
        release.set()
        t.join(10)
        assert first["res"].status_code == 200 and first["res"].json()["hits"]
        monkeypatch.setattr(Retriever, "encode", original)
        assert c.post("/search", json={"query": "dog", "k": 3}).status_code == 200  # the slot came back
    assert retriever.manifest.n_docs == 40


ODD_TEXT = st.text(st.sampled_from(["a", " ", "é", "\ud800", "\udfff", "\x00"]), max_size=8)  # lone surrogates too (issue 48)
JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.integers(-10**400, 10**400) | st.floats(allow_nan=False) | st.text(max_size=20) | ODD_TEXT,
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8), children, max_size=4),
    max_leaves=12,
)
FIELDS = st.fixed_dictionaries({}, optional={
    "query": JSON | st.text(max_size=60), "k": JSON | st.integers(-10**20, 10**20), "mode": JSON | st.sampled_from(MODES + ("bogus", "")),
    "fusion": JSON | st.fixed_dictionaries({"weights": st.dictionaries(st.sampled_from(["sparse", "bm25", "dense", "x"]), JSON)}),
    "queries": JSON | st.lists(st.text(max_size=20), max_size=40),
})


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(body=FIELDS | JSON, path=st.sampled_from(["/search", "/search/batch"]))
@example(body={"query": "x" * 1_000_000}, path="/search")
@example(body={"query": "cat", "k": 10**30}, path="/search")
@example(body={"query": "cat", "mode": "nonsense"}, path="/search")
@example(body=None, path="/search")
@example(body={"queries": ["x" * 5000]}, path="/search/batch")
@example(body={"query": "x \ud800 y"}, path="/search")
@example(body={"queries": ["cat", "\udfff"]}, path="/search/batch")
@example(body={"query": "cat", "fusion": {"weights": {"sparse": 10**400}}}, path="/search")
@example(body={"queries": ["cat"], "fusion": {"weights": {"\ud800": 1, "bm25": -10**400}}}, path="/search/batch")
def test_fuzzed_bodies_get_an_answer_or_a_4xx_with_a_message_and_the_server_keeps_answering(client, body, path):
    res = client.post(path, content=json.dumps(body), headers={"Content-Type": "application/json"})
    assert res.status_code == 200 or 400 <= res.status_code < 500, (res.status_code, res.text)
    if res.status_code != 200:
        detail = res.json()["detail"]
        assert isinstance(detail, str) and detail
    assert client.get("/healthz").status_code == 200
