"""The HTTP face of a warm :class:`~retriever.retriever.Retriever` (FastAPI), following its index.

Routes: ``POST /search``, ``GET /search``, ``POST /search/batch``, ``GET /info``, ``GET /healthz``,
the page at ``/`` (static files of this package) and the OpenAPI docs at ``/docs`` and ``/redoc``
(their scripts served from the fastapi-offline package: no network needed). Every error is JSON
``{"detail": message}`` with a 4xx status: the search contract's errors (bad k, unknown mode, a
mode the index lacks) keep the Retriever's own message. A query must be valid Unicode text (a
lone surrogate, which JSON's ``\\ud800`` escapes can spell, is refused with 422 naming the field),
and every JSON answer escapes what cannot be written as UTF-8. The server never writes the index.
Types: retriever/server/schema.py. A new generation of the index is picked up while serving:
retriever/server/live.py. Concurrent searches share encoder forwards: retriever/server/batching.py.
The connection layer (deadlines, the bound on connections): retriever/server/protocol.py.
"""
from __future__ import annotations

import asyncio
import contextlib
import importlib.util
import json
import secrets
import time
from collections.abc import Callable
from importlib import resources
from pathlib import Path
from typing import Annotated, Any

from fastapi import FastAPI, Query, Request
from fastapi.exceptions import RequestValidationError
from fastapi.openapi.utils import get_openapi
from fastapi.responses import FileResponse, JSONResponse
from fastapi.staticfiles import StaticFiles
from pydantic import ValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException

from indexer.channels import CHANNEL_SPECS
from retriever.filters import loads_filter
from retriever.fusion import Fusion as FusionSetting  # the value type; schema.Fusion is the request body
from retriever.retriever import MODES, Retriever
from retriever.server.batching import FORWARD_QUERIES, Batcher, Busy, Job, Result
from retriever.server.config import ServerConfig
from retriever.server.documents import Documents, display_words
from retriever.server.live import POLL_S, LiveIndex, RetrieverLoader, Served
from retriever.server.schema import (
    ERRORS,
    EXPLAINED,
    BatchRequest,
    BatchResponse,
    ErrorOut,
    Fusion,
    Health,
    Info,
    SearchQuery,
    SearchRequest,
    SearchResponse,
    chosen_fields,
    split_fields,
)

PUBLIC_PATHS = ("/", "/healthz", "/favicon.ico", "/docs", "/redoc")  # no data: open even with an API key
STATIC_PREFIX = "/static/"
DOCS_ASSETS = "/static/docs-assets"  # Swagger UI and ReDoc scripts (the fastapi-offline package)
FUSION_CACHE = 16  # Retriever views with a request's own fusion, kept for reuse


class SafeJSONResponse(JSONResponse):
    """JSON in UTF-8; with ``\\uXXXX`` escapes instead where a string holds a lone surrogate
    (an echo of a client's text: Starlette's own render fails on one, answering 500)."""

    def render(self, content: Any) -> bytes:
        try:
            return super().render(content)
        except UnicodeEncodeError:
            return json.dumps(content, ensure_ascii=True, allow_nan=False, separators=(",", ":")).encode("ascii")


class ApiError(Exception):
    """An error answered as ``{"detail": message}`` with ``status``."""

    def __init__(self, status: int, message: str, headers: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.status, self.message, self.headers = status, message, headers or {}


def adapter_name(adapter: dict | None) -> dict | None:
    """The manifest's adapter as /info shows it: its name (the last part of its path) and hash, no local path."""
    if not adapter:
        return None
    path = str(adapter.get("path") or "")
    return {"name": Path(path.rstrip("/")).name or path, "sha256": adapter.get("sha256")}


def create_app(retriever: Retriever, config: ServerConfig | None = None, documents: Documents | None = None,
               documents_note: str = "", loader: RetrieverLoader | None = None,
               documents_for: Callable[[Retriever], tuple[Documents | None, str]] | None = None, poll_s: float = POLL_S) -> FastAPI:
    """The application over ``retriever`` (loaded and warm), within ``config``'s limits.

    ``loader``: given the Retriever serving now, loads the generation the index path points at
    (``serve`` passes one with its own options); with it the application polls the index path
    every ``poll_s`` seconds and swaps in a new generation (retriever/server/live.py), reading its
    snippets with ``documents_for``. Without it, ``retriever`` is served as it is."""
    config = config or ServerConfig()
    live = LiveIndex(Served(retriever, documents, documents_note), loader, documents_for, poll_s)
    batcher = Batcher(config.max_concurrency, FORWARD_QUERIES, config.queue_timeout_s)
    started = time.time()

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI):
        watcher = asyncio.get_running_loop().create_task(live.watch()) if loader is not None else None
        try:
            yield
        finally:
            if watcher is not None:
                watcher.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await watcher

    app = FastAPI(
        title="aligned-tokens search", version="2", default_response_class=SafeJSONResponse, lifespan=lifespan,
        docs_url=None, redoc_url=None,
        description="Hybrid search over one index: aligned tokens, BM25, dense and encoder channels, fused; every hit explained.",
    )
    app.state.live, app.state.batcher = live, batcher

    @app.exception_handler(ApiError)
    async def _api_error(request: Request, exc: ApiError) -> JSONResponse:
        return SafeJSONResponse({"detail": exc.message}, status_code=exc.status, headers=exc.headers)

    @app.exception_handler(RequestValidationError)
    async def _invalid(request: Request, exc: RequestValidationError) -> JSONResponse:
        return SafeJSONResponse({"detail": validation_message(exc.errors())}, status_code=422)

    @app.exception_handler(StarletteHTTPException)
    async def _http(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        return SafeJSONResponse({"detail": str(exc.detail)}, status_code=exc.status_code, headers=getattr(exc, "headers", None))

    @app.exception_handler(Exception)
    async def _bug(request: Request, exc: Exception) -> JSONResponse:  # logged by the server; the client gets JSON too
        return SafeJSONResponse({"detail": f"internal error ({type(exc).__name__}); the server log has the details"}, status_code=500)

    @app.middleware("http")
    async def _limits_and_access(request: Request, call_next):
        length = request.headers.get("content-length")
        if length is None and request.method == "POST":  # a chunked body could not be bounded before reading it
            return SafeJSONResponse({"detail": "a POST needs a Content-Length header"}, status_code=411)
        if length is not None and not (length.isascii() and length.isdigit()):  # (uvicorn's h11 refuses it first: 400)
            return SafeJSONResponse({"detail": f"malformed Content-Length {length[:40]!r}"}, status_code=400)
        path = request.url.path
        limit = config.max_write_bytes if config.writable and path == "/documents" else config.max_body_bytes
        if length is not None and (len(length.lstrip("0")) > 18 or int(length) > limit):
            return SafeJSONResponse({"detail": f"request body larger than {limit} bytes"}, status_code=413)
        if config.api_key is not None and path not in PUBLIC_PATHS and not path.startswith(STATIC_PREFIX):
            scheme, _, token = request.headers.get("authorization", "").partition(" ")
            if scheme.lower() != "bearer" or not secrets.compare_digest(token.strip().encode(), config.api_key.encode()):
                return SafeJSONResponse({"detail": "missing or wrong API key (Authorization: Bearer KEY)"}, status_code=401,
                                    headers={"WWW-Authenticate": "Bearer"})
        return await call_next(request)

    def view(served: Served, fusion: Fusion | None) -> Retriever:
        """The retriever, or a shallow view of it with the request's fusion (same channels and model)."""
        r = served.retriever
        if fusion is None:
            return r
        channels = [m for m in r.modes if m != "hybrid"]
        unknown = sorted(set(fusion.weights) - set(channels))
        if unknown:
            raise ApiError(422, f"fusion.weights: channel(s) {', '.join(unknown)} not in this index (channels: {', '.join(channels)})")
        if not any(w > 0 for w in fusion.weights.values()):  # each is finite and >= 0 (Weight)
            raise ApiError(422, "fusion.weights: each weight must be a finite number >= 0, at least one > 0")
        try:  # the one fusion value the library and the CLIs take, checked as they check it
            setting = FusionSetting({"method": fusion.method, "weights": {c: float(w) for c, w in fusion.weights.items()}, "rrf_k": fusion.rrf_k})
        except ValueError as exc:
            raise ApiError(422, f"fusion: {exc}") from None
        key = json.dumps(setting.as_dict(), sort_keys=True)
        views = served.views
        if key not in views:
            try:  # shares channels, model and caches; only the fusion differs, and the query-side checks are the Retriever's
                views[key] = r.with_fusion(setting)
            except ValueError as exc:
                raise ApiError(422, f"fusion: {exc}") from None
            while len(views) > FUSION_CACHE:
                views.popitem(last=False)
        views.move_to_end(key)
        return views[key]

    def check(queries: list[str], k: int, offset: int, mode: str | None, r: Retriever, fusion: Fusion | None = None) -> str:
        """The mode to search in, after the limits: the request's, hybrid when it gives a fusion,
        else the index's default."""
        if not 1 <= k <= config.max_k:
            got = str(k) if abs(k) < 10**20 else f"a number of {len(str(abs(k)))} digits"
            raise ApiError(422, f"k must be between 1 and {config.max_k}, got {got}")
        if not 0 <= offset <= config.max_window - k:
            got = str(offset) if abs(offset) < 10**20 else f"a number of {len(str(abs(offset)))} digits"
            raise ApiError(422, f"offset must be between 0 and {config.max_window} - k = {config.max_window - k}, got {got} "
                                f"(pages reach rank {config.max_window} at most)")
        for i, q in enumerate(queries):
            if len(q) > config.max_query_chars:
                where = "query" if len(queries) == 1 else f"queries[{i}]"
                raise ApiError(422, f"{where} has {len(q)} characters; at most {config.max_query_chars}")
        mode = mode or ("hybrid" if fusion is not None else r.default_mode)
        if mode not in MODES:
            raise ApiError(422, f"mode must be one of {MODES}, not {mode!r}")
        return mode

    def check_filter(r: Retriever, where: dict | None) -> dict | None:
        try:  # a bad field or condition before the queue and the encoding
            r.filter_mask(where)
        except ValueError as exc:
            raise ApiError(422, f"filter: {exc}") from None
        return where

    async def run(r: Retriever, queries: list[str], k: int, offset: int, mode: str, fields: tuple[str, ...], where: dict | None = None) -> list[Result]:
        """Search within the concurrency limit, in a group with other requests' queries
        (batching.py): queue, or 503 after the timeout."""
        try:
            return await batcher.submit(Job(r, mode, queries, k, offset, explain=bool(EXPLAINED & set(fields)), where=check_filter(r, where)))
        except Busy:
            raise ApiError(503, f"busy: {config.max_concurrency} search(es) running and the queue did not move for "
                                f"{config.queue_timeout_s:g} s", {"Retry-After": str(max(1, round(config.queue_timeout_s)))}) from None
        except (ValueError, TypeError) as exc:  # the search contract: the Retriever's own message
            raise ApiError(422, str(exc)) from None

    def render(served: Served, query: str, mode: str, k: int, offset: int, result: Result, fields: tuple[str, ...]) -> dict:
        documents = served.documents
        want = set(fields)
        out = []
        for rank, h in enumerate(result.hits, offset + 1):
            words = display_words(h.matched_tokens) if want & {"highlight", "snippet"} else []
            hit = {"rank": rank, "id": h.doc_id, "score": h.score}
            if "title" in want:
                hit["title"] = documents.titles.get(h.doc_id) if documents else None
            if "snippet" in want:
                hit["snippet"] = documents.snippet(h.doc_id, words) if documents else None
            if "channels" in want:
                hit["channels"] = h.channels
            if "highlight" in want:
                hit["highlight"] = words
            if "matched" in want:
                hit["matched"] = h.matched_tokens
            if "matched_ids" in want:
                hit["matched_ids"] = {str(t): v for t, v in h.matched_ids.items()}
            if "matched_terms" in want:
                hit["matched_terms"] = h.matched_terms
            out.append({f: hit[f] for f in fields})
        return {"query": query, "mode": mode, "offset": offset, "k": k, "total": result.total, "total_relation": result.relation,
                "took_ms": round(result.seconds * 1000, 3), "generation": served.generation, "hits": out}

    async def one(served: Served, query: str, k: int, offset: int, mode: str | None, fusion: Fusion | None, fields: list[str] | None,
                  where: dict | None = None) -> dict:
        r = view(served, fusion)
        mode = check([query], k, offset, mode, r, fusion)
        chosen = chosen_fields(fields)
        (result,) = await run(r, [query], k, offset, mode, chosen, where)
        return render(served, query, mode, k, offset, result, chosen)

    search_doc: dict[str, Any] = {"response_model": SearchResponse, "response_model_exclude_unset": True, "responses": ERRORS}

    @app.post("/search", summary="Top-k hits for one query, explained; offset for the next pages", **search_doc)
    async def search(body: SearchRequest) -> dict[str, Any]:
        with live.use() as served:
            return await one(served, body.query, body.k, body.offset, body.mode, body.fusion, body.fields, body.filter)

    @app.get("/search", summary="The same as POST /search, as a link: /search?q=...&k=10&offset=0&mode=hybrid&fields=id,score", **search_doc)
    async def search_get(params: Annotated[SearchQuery, Query()]) -> dict[str, Any]:
        try:  # checked as POST checks its "fields"
            fields = SearchRequest(query=params.q, fields=split_fields(params.fields)).fields
        except ValidationError as exc:
            raise ApiError(422, validation_message(exc.errors())) from None
        where = None
        if params.filter is not None:
            try:
                where = loads_filter(params.filter)
            except ValueError as exc:
                raise ApiError(422, str(exc)) from None
        with live.use() as served:
            return await one(served, params.q, params.k, params.offset, params.mode, None, fields, where)

    @app.post("/search/batch", summary="Top-k hits for each of several queries", response_model=BatchResponse,
              response_model_exclude_unset=True, responses=ERRORS)
    async def search_batch(body: BatchRequest) -> dict[str, Any]:
        if len(body.queries) > config.max_batch:
            raise ApiError(422, f"queries: {len(body.queries)} given; at most {config.max_batch}")
        with live.use() as served:
            r = view(served, body.fusion)
            mode = check(body.queries, body.k, body.offset, body.mode, r, body.fusion)
            chosen = chosen_fields(body.fields)
            t0 = time.perf_counter()
            results = await run(r, body.queries, body.k, body.offset, mode, chosen, body.filter) if body.queries else []
            return {"mode": mode, "took_ms": round((time.perf_counter() - t0) * 1000, 3), "generation": served.generation,
                    "results": [render(served, q, mode, body.k, body.offset, res, chosen) for q, res in zip(body.queries, results)]}

    @app.get("/healthz", summary="Liveness: the index is loaded; the generation served and its documents", response_model=Health)
    async def healthz() -> dict[str, Any]:
        served = live.current
        return {"status": "ok", "documents": served.retriever.manifest.n_docs, "generation": served.generation}

    @app.get("/info", summary="What this server searches: generation, channels, model, adapter, runtime, documents, limits",
             response_model=Info, responses={401: ERRORS[401]})
    async def info() -> dict[str, Any]:
        served = live.current
        r = served.retriever
        m = r.manifest
        embedder = r.embedder
        return {
            "index": str(r.index_dir), **served.describe(),
            "channels": [c for c in r.modes if c != "hybrid"], "modes": r.modes,
            "default_mode": r.default_mode, "fusion": r.fusion.as_dict(),
            "fusion_source": getattr(r, "fusion_source", None), "describe": r.describe_mode(),
            "settings": r.settings.explain() if getattr(r, "settings", None) is not None else None,
            "model": m.model, "adapter": adapter_name(m.adapter), **{s.manifest_key: s.info_value(m) for s in CHANNEL_SPECS if s.info is not None},
            "metadata_fields": (m.documents or {}).get("metadata_fields", []), "writable": config.writable,
            "runtime": {"queries": embedder.runtime_info() if embedder is not None else None, "documents": m.runtime},
            "query_encoder": getattr(r, "query_encoder", None),
            "profile": r.profile.name if getattr(r, "profile", None) is not None else None,
            "feedback": r.feedback.to_dict() if getattr(r, "feedback", None) is not None else None,
            "sparse_pruning": r.sparse_pruning.to_dict() if getattr(r, "sparse_pruning", None) is not None else None,
            "backend": r.backend, "snippets": served.note, "reload": live.describe(), "batching": batcher.describe(),
            "limits": config.public(), "uptime_s": round(time.time() - started, 1),
        }

    if config.writable:
        from retriever.server.writes import add_write_routes

        add_write_routes(app, live, config, ApiError)

    static = resources.files("retriever.server") / "static"

    @app.get("/", include_in_schema=False)
    async def page() -> FileResponse:
        return FileResponse(str(static / "index.html"), media_type="text/html")

    @app.get("/docs", include_in_schema=False)
    async def docs() -> FileResponse:
        return FileResponse(str(static / "docs.html"), media_type="text/html")

    @app.get("/redoc", include_in_schema=False)
    async def redoc() -> FileResponse:
        return FileResponse(str(static / "redoc.html"), media_type="text/html")

    def openapi() -> dict:
        """The schema, with the bearer scheme declared on every operation when a key is set."""
        if app.openapi_schema is None:
            schema = get_openapi(title=app.title, version=app.version, description=app.description, routes=app.routes)
            schema.setdefault("components", {}).setdefault("schemas", {})["ErrorOut"] = ErrorOut.model_json_schema()
            if config.api_key is not None:
                schema["components"]["securitySchemes"] = {"bearer": {
                    "type": "http", "scheme": "bearer", "description": "serve --api-key KEY: Authorization: Bearer KEY"}}
                for path, operations in schema.get("paths", {}).items():
                    if path not in PUBLIC_PATHS:
                        for operation in operations.values():
                            operation["security"] = [{"bearer": []}]
            app.openapi_schema = schema
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]
    assets = docs_assets()
    if assets is not None:
        app.mount(DOCS_ASSETS, StaticFiles(directory=assets), name="docs-assets")
    app.mount("/static", StaticFiles(directory=str(static)), name="static")
    return app


def docs_assets() -> str | None:
    """The folder of Swagger UI's and ReDoc's scripts (the fastapi-offline package), or None."""
    spec = importlib.util.find_spec("fastapi_offline")
    if spec is None or not spec.submodule_search_locations:
        return None
    folder = Path(next(iter(spec.submodule_search_locations))) / "static"
    return str(folder) if folder.is_dir() else None


def validation_message(errors: list[dict]) -> str:
    """One line from pydantic's errors: ``body.k: Input should be a valid integer; ...``."""
    parts = []
    for e in errors[:5]:
        where = ".".join(str(x) for x in e.get("loc", ()) if x != "body") or "body"
        parts.append(f"{where}: {str(e.get('msg', 'invalid')).removeprefix('Value error, ')}")
    more = f" (and {len(errors) - 5} more)" if len(errors) > 5 else ""
    return "; ".join(parts) + more
