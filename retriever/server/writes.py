"""The write endpoints of ``serve --writable``: documents added, replaced and deleted over HTTP.

``POST /documents {"documents": [...], "delete": [...]}`` is one update of the index
(indexer/updates.py): the added documents are checked (at most ``serve --max-document-bytes`` each,
strict JSON metadata: 422) and encoded with the models the index names, one write's documents at a
time and without the write lock; then, under the lock, the generation it starts from is verified
(a damaged one: 409 naming the file, nothing published), the index is written again as its next
generation and published; the server then loads that generation at once (retriever/server/live.py)
and answers with what was done and the generation it serves. An update that changes nothing (ids
that are not indexed to delete) publishes nothing (``"published": false``). ``DELETE
/documents/{id}`` deletes one. Updates publish one at a time (others wait); a build or update of the
same index by another process is refused (409), as is an index that cannot be updated in place.
Searches keep answering throughout, from the generation they started on.

The models that encode added documents are the served ones where the served Retriever runs the
LLM (e.g. query_encoder llm); the profiles run no LLM forward for queries, so the LLM is loaded in
the background when the server starts, and kept.
"""
from __future__ import annotations

import asyncio
import logging
import threading
from typing import Any

from fastapi import FastAPI

from embedder.encoder import Embedder
from embedder.models import ModelNotAvailable
from indexer.channels import sentence_encoder_specs
from indexer.corpus import CorpusError, document_from_object
from indexer.errors import IndexFormatError
from indexer.shards import BuildInProgress
from indexer.updates import PreparedUpdate, UpdateError, check_added, load_models, prepare_update, publish_update
from retriever.server.config import ServerConfig
from retriever.server.live import LiveIndex
from retriever.server.schema import ERRORS, DocumentsRequest, ErrorOut, UpdateOut

log = logging.getLogger("uvicorn.error")

WRITE_ERRORS = {**ERRORS, 409: {"model": ErrorOut, "description": "the index cannot be updated now or in place (the detail says why)"}}


def add_write_routes(app: FastAPI, live: LiveIndex, config: ServerConfig, api_error: type[Exception]) -> None:
    """Mount POST /documents and DELETE /documents/{doc_id} on ``app``; ``api_error(status,
    message)`` is the application's error (answered as ``{"detail": message}``)."""
    lock = asyncio.Lock()  # publishing: one update at a time
    encoding = asyncio.Lock()  # encoding added documents: one write's at a time (the models are shared), never under ``lock``
    models: dict[str, tuple[Any, Any]] = {}  # the models of the index's manifest, loaded once
    loading = threading.Lock()

    def writer_models():
        r = live.current.retriever
        m = r.manifest
        key = repr((m.model, m.adapter, m.embedding, *(s.record(m) for s in sentence_encoder_specs())))
        if isinstance(r.embedder, Embedder):  # the served LLM (and encoders) encode documents as they encode queries
            return load_models(m, r.embedder, r.sentence_encoders)
        with loading:
            if key not in models:
                models.clear()
                models[key] = load_models(m)
            return models[key]

    def warm() -> None:
        try:
            embedder, encoders = writer_models()
            if embedder is not None:  # None: the index's channels need no LLM
                embedder.embed(["warm up the document encoder"])  # a runtime compiles on its first forward
            for encoder in encoders.values():
                encoder.encode(["warm up the document encoder"])
        except Exception as exc:  # noqa: BLE001 - the first write loads them again and answers the error
            log.warning("loading the models that encode written documents failed: %s", exc)

    # loaded now, beside the serving, so that the first write does not wait seconds for the LLM
    threading.Thread(target=warm, name="writer-models", daemon=True).start()

    def prepare(documents: list[dict], delete: list[str]) -> PreparedUpdate:
        added = [document_from_object(obj, "documents", i) for i, obj in enumerate(documents, start=1)]
        # checked before the models are asked for: a document too large, metadata that is not JSON
        check_added(added, config.max_document_bytes)
        embedder, encoders = writer_models() if added else (None, {})
        return prepare_update(live.index_dir, add=added, delete=delete, embedder=embedder, encoders=encoders,
                              progress=False, max_document_bytes=config.max_document_bytes)

    async def update(documents: list[dict], delete: list[str]) -> dict:
        if len(documents) + len(delete) > config.max_write_documents:
            raise api_error(422, f"{len(documents)} documents and {len(delete)} ids given; at most {config.max_write_documents} in one update")
        if not documents and not delete:
            raise api_error(422, "nothing to do: give documents, delete, or both")
        try:
            # encoded first, one write at a time, without the write lock: a write being encoded never holds up
            # another one's publish (nor a delete, which encodes nothing)
            if documents:
                async with encoding:
                    prepared = await asyncio.to_thread(prepare, documents, delete)
            else:
                prepared = await asyncio.to_thread(prepare, documents, delete)
            async with lock:  # then published one at a time
                report = await asyncio.to_thread(publish_update, prepared)
                if report.published:
                    await live.check()  # serve what was just published, before answering
        except (CorpusError, TypeError) as exc:
            raise api_error(422, str(exc)) from None
        except (UpdateError, BuildInProgress) as exc:
            raise api_error(409, str(exc)) from None
        except (IndexFormatError, ModelNotAvailable) as exc:
            raise api_error(409, f"the index cannot be updated: {exc}") from None
        return {"added": report.added, "replaced": report.replaced, "deleted": report.deleted, "not_found": report.not_found,
                "documents": report.n_docs, "generation": report.generation, "serving": live.current.generation,
                "seconds": report.seconds, "encode_seconds": report.encode_seconds, "published": report.published}

    @app.post("/documents", summary="Add or replace documents and delete ids, as one update (serve --writable)",
              response_model=UpdateOut, responses=WRITE_ERRORS)
    async def post_documents(body: DocumentsRequest) -> dict[str, Any]:
        return await update(body.documents, list(body.delete))

    @app.delete("/documents/{doc_id}", summary="Delete one document (serve --writable)", response_model=UpdateOut, responses=WRITE_ERRORS)
    async def delete_document(doc_id: str) -> dict[str, Any]:
        return await update([], [doc_id])
