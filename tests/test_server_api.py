"""``serve``'s API beyond one page of hits: pagination (offset, total), field selection, the typed
OpenAPI schema and its bearer scheme, /docs offline, GET's validation, per-query took_ms in
batches, and concurrent requests grouped into shared encoder forwards (retriever/server/batching.py)."""
from __future__ import annotations

import threading

import pytest
from conftest import build_tiny_model, tiny_identity, toy_docs, write_corpus

pytest.importorskip("fastapi", reason="the serve extra is not installed: pip install '.[serve]'")
from fastapi.testclient import TestClient

from embedder.encoder import Embedder, EmbedderConfig
from indexer.build import build_index
from retriever.retriever import Retriever
from retriever.server.app import create_app
from retriever.server.config import ServerConfig
from retriever.server.documents import Documents
from retriever.server.schema import DEFAULT_FIELDS, HIT_FIELDS

QUERY = "cat and dog near the river"


@pytest.fixture(scope="module")
def served(tmp_path_factory, tiny_tokenizer):
    root = tmp_path_factory.mktemp("api")
    embedder = Embedder(build_tiny_model(tiny_tokenizer, 0), tiny_tokenizer, EmbedderConfig(max_length=64, batch_size=4), identity=tiny_identity(0))
    build_index(write_corpus(root / "corpus", toy_docs(60), "beir"), root / "index", embedder, top_k=16, dense=True, lexical="words", progress=False)
    retriever = Retriever.load(root / "index", embedder=embedder)
    documents, note = Documents.for_index(root / "index", retriever.manifest, retriever.doc_ids)
    return retriever, documents, note


def client_for(served, **limits) -> TestClient:
    retriever, documents, note = served
    return TestClient(create_app(retriever, ServerConfig(**limits), documents, note))


@pytest.fixture(scope="module")
def client(served):
    with client_for(served, max_window=200) as c:
        yield c


@pytest.mark.parametrize("mode", ["hybrid", "sparse", "bm25", "dense"])
def test_pages_follow_one_another_and_total_says_what_it_counts(client, served, mode):
    whole = client.post("/search", json={"query": QUERY, "k": 30, "mode": mode}).json()
    pages = [client.post("/search", json={"query": QUERY, "k": 10, "offset": o, "mode": mode}).json() for o in (0, 10, 20)]
    assert [h["id"] for p in pages for h in p["hits"]] == [h["id"] for h in whole["hits"]]
    assert [h["rank"] for p in pages for h in p["hits"]] == list(range(1, len(whole["hits"]) + 1))
    assert [h["score"] for p in pages for h in p["hits"]] == pytest.approx([h["score"] for h in whole["hits"]])
    assert pages[1]["hits"][0]["matched"] == pytest.approx(whole["hits"][10]["matched"])  # explained as in the whole list
    assert {p["total"] for p in pages} == {whole["total"]} and pages[1]["offset"] == 10
    total, relation = whole["total"], whole["total_relation"]
    if mode == "hybrid":
        assert relation == "pool" and len(whole["hits"]) <= total <= 60
    elif mode == "dense":
        assert (total, relation) == (60, "eq")  # every document has a dense score
    else:  # the documents sharing a token or a term with the query
        assert relation == "eq" and 0 < total <= 60
        assert len(client.post("/search", json={"query": QUERY, "k": 100, "mode": mode}).json()["hits"]) == total
    beyond = client.post("/search", json={"query": QUERY, "k": 10, "offset": total, "mode": mode}).json()
    assert beyond["hits"] == [] and beyond["total"] == total


def test_offset_limits_and_get_with_offset(client):
    for offset, message in ((-1, "offset must be between 0 and"), (191, "offset must be between 0 and 200 - k = 190")):
        res = client.post("/search", json={"query": QUERY, "k": 10, "offset": offset})
        assert res.status_code == 422 and message in res.json()["detail"]
    got = client.get("/search", params={"q": QUERY, "k": 5, "offset": 5}).json()
    assert got["hits"] == client.post("/search", json={"query": QUERY, "k": 5, "offset": 5}).json()["hits"]
    assert client.get("/info").json()["limits"]["max_window"] == 200


def test_fields_choose_what_a_hit_carries(client, served):
    default = client.post("/search", json={"query": QUERY, "k": 10}).json()
    assert all(tuple(h) == DEFAULT_FIELDS for h in default["hits"])
    everything = client.post("/search", json={"query": QUERY, "k": 10, "fields": ["all"]}).json()
    assert all(tuple(h) == HIT_FIELDS for h in everything["hits"])
    want = served[0].search(QUERY, k=10)
    assert [h["matched_ids"] for h in everything["hits"]] == [{str(t): pytest.approx(v) for t, v in w.matched_ids.items()} for w in want]
    light = client.post("/search", json={"query": QUERY, "k": 10, "fields": ["id", "score", "title"]}).json()
    assert all(set(h) == {"id", "score", "title"} for h in light["hits"])
    assert [h["id"] for h in light["hits"]] == [h["id"] for h in default["hits"]]
    assert light["hits"][0]["score"] == pytest.approx(default["hits"][0]["score"])
    got = client.get("/search", params={"q": QUERY, "fields": "id,snippet"}).json()
    assert all(set(h) == {"id", "snippet"} and h["snippet"] for h in got["hits"])
    res = client.post("/search", json={"query": QUERY, "fields": ["id", "telepathy"]})
    assert res.status_code == 422 and "fields.1" in res.json()["detail"]
    res = client.get("/search", params={"q": QUERY, "fields": "id,telepathy"})
    assert res.status_code == 422 and "fields.1" in res.json()["detail"]
    sizes = {name: len(client.post("/search", json={"query": QUERY, "k": 10, **extra}).content)
             for name, extra in (("all", {"fields": ["all"]}), ("default", {}), ("light", {"fields": ["id", "score", "title"]}))}
    assert sizes["light"] < sizes["default"] < sizes["all"], sizes


@pytest.mark.parametrize("params, message", [
    ({"q": "cat", "kk": 3}, "kk: Extra inputs are not permitted"),
    ({"q": "cat", "k": "many"}, "k: Input should be a valid integer"),
    ({"k": 3}, "q: Field required"),
    ({"q": "cat", "k": 0}, "k must be between 1 and 100, got 0"),
    ({"q": "cat", "mode": "telepathy"}, "mode must be one of"),
])
def test_get_validates_as_post_does(client, params, message):
    res = client.get("/search", params=params)
    assert res.status_code == 422 and message in res.json()["detail"], res.json()


def test_batch_results_carry_their_own_took_ms_and_pages(client):
    body = client.post("/search/batch", json={"queries": [QUERY, "computer memory", ""], "k": 3, "offset": 2}).json()
    assert all(r["took_ms"] > 0 for r in body["results"][:2]) and body["results"][2]["took_ms"] == 0
    assert body["took_ms"] >= max(r["took_ms"] for r in body["results"][:2]) * 0.5
    one = client.post("/search", json={"query": QUERY, "k": 3, "offset": 2}).json()
    assert [h["id"] for h in body["results"][0]["hits"]] == [h["id"] for h in one["hits"]]
    assert body["results"][0]["hits"][0]["rank"] == 3 and body["generation"] == one["generation"]


def test_openapi_is_typed_and_docs_render_offline(served):
    with client_for(served) as c:
        schema = c.get("/openapi.json").json()
        assert "securitySchemes" not in schema.get("components", {})
        search = schema["paths"]["/search"]["post"]["responses"]
        assert search["200"]["content"]["application/json"]["schema"]["$ref"].endswith("/SearchResponse")
        assert search["422"]["content"]["application/json"]["schema"]["$ref"].endswith("/ErrorOut")
        for path, model in (("/search/batch", "BatchResponse"), ("/info", "Info"), ("/healthz", "Health")):
            method = "post" if path == "/search/batch" else "get"
            assert schema["paths"][path][method]["responses"]["200"]["content"]["application/json"]["schema"]["$ref"].endswith(model)
        props = schema["components"]["schemas"]["SearchResponse"]["properties"]
        assert {"total", "total_relation", "offset", "generation", "took_ms"} <= set(props)
        get_params = {p["name"] for p in schema["paths"]["/search"]["get"]["parameters"]}
        assert get_params == {"q", "k", "offset", "mode", "fields", "filter"}
        page = c.get("/docs").text
        assert "/static/docs-assets/swagger-ui-bundle.js" in page and "cdn" not in page.lower()
        for asset in ("swagger-ui-bundle.js", "swagger-ui.css", "redoc.standalone.js"):
            res = c.get(f"/static/docs-assets/{asset}")
            assert res.status_code == 200 and len(res.content) > 10_000, asset
        assert "redoc.standalone.js" in c.get("/redoc").text
    with client_for(served, api_key="s3cret") as c:
        assert c.get("/docs").status_code == 200 and c.get("/static/docs-assets/swagger-ui-bundle.js").status_code == 200
        assert c.get("/openapi.json").status_code == 401
        schema = c.get("/openapi.json", headers={"Authorization": "Bearer s3cret"}).json()
        assert schema["components"]["securitySchemes"]["bearer"] == {
            "type": "http", "scheme": "bearer", "description": "serve --api-key KEY: Authorization: Bearer KEY"}
        assert schema["paths"]["/search"]["post"]["security"] == [{"bearer": []}]
        assert "security" not in schema["paths"]["/healthz"]["get"]


def test_concurrent_requests_share_forwards_and_get_their_own_answers(served):
    retriever = served[0]
    queries = [f"{w} near the river" for w in ("cat", "dog", "computer", "memory", "puzzle", "team", "snow", "mountain")] * 3
    want = {q: [h.doc_id for h in retriever.search(q, k=4)] for q in set(queries)}
    with client_for(served, max_concurrency=1) as c:
        got: dict[int, list[str]] = {}
        barrier = threading.Barrier(len(queries))

        def ask(i: int) -> None:
            barrier.wait(10)
            res = c.post("/search", json={"query": queries[i], "k": 4, "fields": ["id"]})
            got[i] = [h["id"] for h in res.json()["hits"]] if res.status_code == 200 else [res.text]

        threads = [threading.Thread(target=ask, args=(i,)) for i in range(len(queries))]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        assert all(got[i] == want[q] for i, q in enumerate(queries)), got
        batching = c.get("/info").json()["batching"]
        assert batching["groups"] < len(queries) and batching["mean_requests_per_group"] > 1, batching
