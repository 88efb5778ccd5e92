"""``serve`` follows its index: a new generation (a rebuild, an update) is answered within 5 s,
under load, with no failed request; a damaged one leaves the old one serving (retriever/server/live.py)."""
from __future__ import annotations

import os
import shutil
import threading
import time
from pathlib import Path

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
from retriever.server.live import reload_with_models

NEW_DOC = {"_id": "zebra-1", "title": "zebra stripes", "text": "zebra zebra stripes on the savanna grass zebra"}


def search_ids(client: TestClient, query: str) -> list[str]:
    res = client.post("/search", json={"query": query, "k": 5, "fields": ["id"]})
    assert res.status_code == 200, res.text
    return [h["id"] for h in res.json()["hits"]]


def test_a_new_generation_is_served_within_5_s_under_load_and_a_damaged_one_is_refused(tmp_path, tiny_tokenizer):
    embedder = Embedder(build_tiny_model(tiny_tokenizer, 0), tiny_tokenizer, EmbedderConfig(max_length=64, batch_size=4), identity=tiny_identity(0))
    first = write_corpus(tmp_path / "first", toy_docs(30), "beir")
    index = tmp_path / "index"
    build_index(first, index, embedder, top_k=16, dense=True, lexical="words", progress=False)
    retriever = Retriever.load(index, embedder=embedder)

    def documents_for(r: Retriever):
        return Documents.for_index(index, r.manifest, r.doc_ids)

    # the models of the served Retriever are reused (a load by name alone would look for "tiny-0" and fail)
    loader = lambda previous: reload_with_models(previous, lambda **models: Retriever.load(index, **models))
    documents, note = documents_for(retriever)
    app = create_app(retriever, ServerConfig(), documents, note, loader=loader, documents_for=documents_for)
    old_generation = Path(retriever.generation.path)
    with TestClient(app) as client:
        assert client.get("/healthz").json()["generation"] == old_generation.name
        assert "zebra-1" not in search_ids(client, "zebra stripes")
        failures: list[str] = []
        answered = [0]
        stop = threading.Event()

        def search_in_a_loop() -> None:
            while not stop.is_set():
                res = client.post("/search", json={"query": "zebra stripes on the grass", "k": 3})
                answered[0] += 1
                if res.status_code != 200:
                    failures.append(f"{res.status_code} {res.text}")

        searcher = threading.Thread(target=search_in_a_loop)
        searcher.start()
        try:
            # a damaged generation, published by hand: refused, the old one keeps answering
            damaged = tmp_path / ".index.gen-000050"
            shutil.copytree(old_generation, damaged)
            victim = next(p for p in sorted(damaged.iterdir()) if p.is_file() and p.name != "manifest.json" and p.stat().st_size > 64)
            with open(victim, "r+b") as f:
                f.truncate(victim.stat().st_size // 2)
            link = tmp_path / ".index.tmp-link"
            os.symlink(damaged.name, link)
            os.replace(link, index)
            deadline = time.monotonic() + 5
            while (failed := client.get("/info").json()["reload"]["failed"]) is None and time.monotonic() < deadline:
                time.sleep(0.1)
            assert failed is not None and failed["generation"] == damaged.name, failed
            info = client.get("/info").json()
            assert info["generation"] == old_generation.name and info["documents"] == 30

            # a rebuild with a new document: answered within 5 s of its publish
            second = write_corpus(tmp_path / "second", toy_docs(30) + [NEW_DOC], "beir")
            build_index(second, index, embedder, top_k=16, dense=True, lexical="words", progress=False, overwrite=True)
            published = time.monotonic()
            new_generation = Path(os.path.realpath(index)).name
            while time.monotonic() - published < 5 and client.get("/healthz").json()["generation"] != new_generation:
                time.sleep(0.05)
            took = time.monotonic() - published
            assert took < 5, f"the new generation was not served within 5 s ({took:.1f} s)"
            time.sleep(0.3)  # searches go on on the new generation
        finally:
            stop.set()
            searcher.join(30)
        assert not failures, failures[:3]
        assert answered[0] > 3
        info = client.get("/info").json()
        assert info["generation"] == new_generation and info["documents"] == 31 and info["reload"]["reloads"] == 1
        assert info["reload"]["failed"] is None
        body = client.post("/search", json={"query": "zebra stripes", "k": 5}).json()
        assert body["generation"] == new_generation and body["hits"][0]["id"] == "zebra-1"
        assert body["hits"][0]["title"] == "zebra stripes" and "zebra" in body["hits"][0]["snippet"]  # the snippets were reloaded too
    # the old generation was let go once no request used it: the next build could remove it
    assert retriever.generation.fd is None


def test_without_a_loader_the_retriever_is_served_as_it_is(tmp_path, tiny_tokenizer):
    embedder = Embedder(build_tiny_model(tiny_tokenizer, 0), tiny_tokenizer, EmbedderConfig(max_length=64, batch_size=4), identity=tiny_identity(0))
    index = tmp_path / "index"
    build_index(write_corpus(tmp_path / "c", toy_docs(12), "beir"), index, embedder, top_k=16, progress=False)
    retriever = Retriever.load(index, embedder=embedder)
    with TestClient(create_app(retriever, ServerConfig())) as client:
        build_index(write_corpus(tmp_path / "d", toy_docs(14), "beir"), index, embedder, top_k=16, progress=False, overwrite=True)
        time.sleep(1.5)
        info = client.get("/info").json()
        assert info["documents"] == 12 and info["reload"] == {"follows_index": False, "poll_s": None, "reloads": 0, "failed": None}
