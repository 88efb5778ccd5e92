"""The HTTP face of one warm :class:`~retriever.retriever.Retriever` (FastAPI).

Routes: ``POST /search``, ``POST /search/batch``, ``GET /info``, ``GET /healthz``, the page at
``/`` (static files of this package) and the OpenAPI docs at ``/docs``. Every error is JSON
``{"detail": message}`` with a 4xx status: the search contract's errors (bad k, unknown mode, a
mode the index lacks) keep the Retriever's own message. A query must be valid Unicode text (a
lone surrogate, which JSON's ``\\ud800`` escapes can spell, is refused with 422 naming the field),
and every JSON answer escapes what cannot be written as UTF-8. The server never writes the index.
The connection layer (deadlines, the bound on connections): retriever/server/protocol.py.
"""
from __future__ import annotations

import json
import secrets
import time
from collections import OrderedDict
from importlib import resources
from typing import Annotated, Any, Literal

import anyio
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import FileResponse, JSONResponse
from fastapi.staticfiles import StaticFiles
from pydantic import AfterValidator, BaseModel, ConfigDict, Field, StrictFloat, StrictInt, StrictStr
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException as StarletteHTTPException

from retriever.retriever import MODES, Hit, Retriever
from retriever.server.config import ServerConfig
from retriever.server.documents import Documents, display_words

PUBLIC_PATHS = ("/", "/healthz", "/favicon.ico")  # no data: open even with an API key
STATIC_PREFIX = "/static/"
FUSION_CACHE = 16  # Retriever views with a request's own fusion, kept for reuse


class SafeJSONResponse(JSONResponse):
    """JSON in UTF-8; with ``\\uXXXX`` escapes instead where a string holds a lone surrogate
    (an echo of a client's text: Starlette's own render fails on one, answering 500)."""

    def render(self, content: Any) -> bytes:
        try:
            return super().render(content)
        except UnicodeEncodeError:
            return json.dumps(content, ensure_ascii=True, allow_nan=False, separators=(",", ":")).encode("ascii")


def finite_weight(value: float) -> float:
    """A fusion weight as a float: refused (422 naming it) where it is beyond float's range."""
    try:
        weight = float(value)
    except OverflowError:
        raise ValueError("number out of range (a weight must be a finite number >= 0)") from None
    if not (weight >= 0 and weight < float("inf")):
        raise ValueError("a weight must be a finite number >= 0")
    return weight


def unicode_text(value: str) -> str:
    """Refuse a lone surrogate (no tokenizer encodes one, and no UTF-8 answer could echo it)."""
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise ValueError(f"lone surrogate U+{ord(value[exc.start]):04X} at character {exc.start + 1} (not valid Unicode text)") from None
    return value


Weight = Annotated[StrictFloat | StrictInt, AfterValidator(finite_weight)]
Text = Annotated[StrictStr, AfterValidator(unicode_text)]


class Fusion(BaseModel):
    """A hybrid setting for one request (default: the index's)."""

    model_config = ConfigDict(extra="forbid")
    method: Literal["minmax", "rrf"] = "minmax"
    weights: dict[StrictStr, Weight] = Field(description="channel -> weight (>= 0)")
    rrf_k: StrictInt = Field(60, ge=1, le=10_000)


class SearchRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")
    query: Text = Field(description="the query text (blank: no hits)")
    k: StrictInt = Field(10, description="hits wanted, 1..max_k (see /info)")
    mode: StrictStr | None = Field(None, description=f"one of {', '.join(MODES)} the index has; default hybrid (see /info)")
    fusion: Fusion | None = None


class BatchRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")
    queries: list[Text] = Field(description="queries, at most max_batch (see /info)")
    k: StrictInt = 10
    mode: StrictStr | None = None
    fusion: Fusion | None = None


class ApiError(Exception):
    """An error answered as ``{"detail": message}`` with ``status``."""

    def __init__(self, status: int, message: str, headers: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.status, self.message, self.headers = status, message, headers or {}


def create_app(retriever: Retriever, config: ServerConfig | None = None, documents: Documents | None = None,
               documents_note: str = "") -> FastAPI:
    """The application over ``retriever`` (loaded and warm), within ``config``'s limits."""
    config = config or ServerConfig()
    app = FastAPI(
        title="aligned-tokens search", version="1", default_response_class=SafeJSONResponse,
        description="Hybrid search over one index: aligned tokens, BM25, dense and encoder channels, fused; every hit explained.",
    )
    gate = anyio.Semaphore(config.max_concurrency)
    views: OrderedDict[str, Retriever] = OrderedDict()
    started = time.time()

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
        if length is not None and (len(length.lstrip("0")) > 18 or int(length) > config.max_body_bytes):
            return SafeJSONResponse({"detail": f"request body larger than {config.max_body_bytes} bytes"}, status_code=413)
        path = request.url.path
        if config.api_key is not None and path not in PUBLIC_PATHS and not path.startswith(STATIC_PREFIX):
            scheme, _, token = request.headers.get("authorization", "").partition(" ")
            if scheme.lower() != "bearer" or not secrets.compare_digest(token.strip().encode(), config.api_key.encode()):
                return SafeJSONResponse({"detail": "missing or wrong API key (Authorization: Bearer KEY)"}, status_code=401,
                                    headers={"WWW-Authenticate": "Bearer"})
        return await call_next(request)

    def view(fusion: Fusion | None) -> Retriever:
        """The retriever, or a shallow view of it with the request's fusion (same channels and model)."""
        if fusion is None:
            return retriever
        channels = [m for m in retriever.modes if m != "hybrid"]
        unknown = sorted(set(fusion.weights) - set(channels))
        if unknown:
            raise ApiError(422, f"fusion.weights: channel(s) {', '.join(unknown)} not in this index (channels: {', '.join(channels)})")
        if not any(w > 0 for w in fusion.weights.values()):  # each is finite and >= 0 (Weight)
            raise ApiError(422, "fusion.weights: each weight must be a finite number >= 0, at least one > 0")
        setting = {"method": fusion.method, "weights": {c: float(w) for c, w in fusion.weights.items()}, "rrf_k": fusion.rrf_k}
        key = json.dumps(setting, sort_keys=True)
        if key not in views:
            try:  # shares channels, model and caches; only the fusion differs, checked as the Retriever checks it
                views[key] = retriever.with_fusion(setting)
            except ValueError as exc:
                raise ApiError(422, f"fusion: {exc}") from None
            while len(views) > FUSION_CACHE:
                views.popitem(last=False)
        views.move_to_end(key)
        return views[key]

    def check(queries: list[str], k: int, mode: str | None, r: Retriever, fusion: Fusion | None = None) -> str:
        """The mode to search in, after the limits: the request's, hybrid when it gives a fusion,
        else the index's default."""
        if not 1 <= k <= config.max_k:
            got = str(k) if abs(k) < 10**20 else f"a number of {len(str(abs(k)))} digits"
            raise ApiError(422, f"k must be between 1 and {config.max_k}, got {got}")
        for i, q in enumerate(queries):
            if len(q) > config.max_query_chars:
                where = "query" if len(queries) == 1 else f"queries[{i}]"
                raise ApiError(422, f"{where} has {len(q)} characters; at most {config.max_query_chars}")
        mode = mode or ("hybrid" if fusion is not None else r.default_mode)
        if mode not in MODES:
            raise ApiError(422, f"mode must be one of {MODES}, not {mode!r}")
        return mode

    async def run(r: Retriever, queries: list[str], k: int, mode: str) -> tuple[list[list[Hit]], float]:
        """Search within the concurrency limit: queue, or 503 after the timeout. Returns the hits
        and the seconds the search itself took (queueing excluded)."""
        with anyio.move_on_after(config.queue_timeout_s) as waited:
            await gate.acquire()
        if waited.cancelled_caught:
            raise ApiError(503, f"busy: {config.max_concurrency} search(es) running and the queue did not move for "
                                f"{config.queue_timeout_s:g} s", {"Retry-After": str(max(1, round(config.queue_timeout_s)))})
        try:
            t0 = time.perf_counter()
            hits = await run_in_threadpool(r.batch_search, queries, k, mode)
            return hits, time.perf_counter() - t0
        except (ValueError, TypeError) as exc:  # the search contract: the Retriever's own message
            raise ApiError(422, str(exc)) from None
        finally:
            gate.release()

    def render(query: str, mode: str, hits: list[Hit], seconds: float) -> dict:
        out = []
        for rank, h in enumerate(hits, 1):
            words = display_words(h.matched_tokens)
            out.append({
                "rank": rank, "id": h.doc_id, "score": h.score,
                "title": documents.titles.get(h.doc_id) if documents else None,
                "snippet": documents.snippet(h.doc_id, words) if documents else None,
                "channels": h.channels, "matched": h.matched_tokens, "highlight": words,
                "matched_ids": {str(t): v for t, v in h.matched_ids.items()}, "matched_terms": h.matched_terms,
            })
        # took_ms: the search itself (encoding, channels, fusion, explanations), not queueing or HTTP
        return {"query": query, "mode": mode, "took_ms": round(seconds * 1000, 3), "hits": out}

    @app.post("/search", summary="Top-k hits for one query, explained")
    async def search(body: SearchRequest) -> dict[str, Any]:
        r = view(body.fusion)
        mode = check([body.query], body.k, body.mode, r, body.fusion)
        (hits,), seconds = await run(r, [body.query], body.k, mode)
        return render(body.query, mode, hits, seconds)

    @app.get("/search", summary="The same as POST /search, as a link: /search?q=...&k=10&mode=hybrid")
    async def search_get(q: str, k: int = 10, mode: str | None = None) -> dict[str, Any]:
        mode = check([q], k, mode, retriever)
        (hits,), seconds = await run(retriever, [q], k, mode)
        return render(q, mode, hits, seconds)

    @app.post("/search/batch", summary="Top-k hits for each of several queries")
    async def search_batch(body: BatchRequest) -> dict[str, Any]:
        if len(body.queries) > config.max_batch:
            raise ApiError(422, f"queries: {len(body.queries)} given; at most {config.max_batch}")
        r = view(body.fusion)
        mode = check(body.queries, body.k, body.mode, r, body.fusion)
        results, seconds = await run(r, body.queries, body.k, mode) if body.queries else ([], 0.0)
        return {"mode": mode, "took_ms": round(seconds * 1000, 3), "results": [render(q, mode, h, 0.0) for q, h in zip(body.queries, results)]}

    @app.get("/healthz", summary="Liveness: the index is loaded")
    async def healthz() -> dict[str, Any]:
        return {"status": "ok", "documents": retriever.manifest.n_docs}

    @app.get("/info", summary="What this server searches: channels, model, adapter, runtime, documents, limits")
    async def info() -> dict[str, Any]:
        m = retriever.manifest
        embedder = retriever.embedder
        return {
            "index": str(retriever.index_dir), "documents": m.n_docs,
            "channels": [c for c in retriever.modes if c != "hybrid"], "modes": retriever.modes,
            "default_mode": retriever.default_mode, "fusion": retriever.fusion, "describe": retriever.describe_mode(),
            "model": m.model, "adapter": m.adapter, "encoder": (m.encoder or {}).get("name"), "lexical": m.lexical,
            "runtime": {"queries": embedder.runtime_info() if embedder is not None else None, "documents": m.runtime},
            "query_encoder": getattr(retriever, "query_encoder", None),
            "profile": retriever.profile.name if getattr(retriever, "profile", None) is not None else None,
            "feedback": retriever.feedback.to_dict() if getattr(retriever, "feedback", None) is not None else None,
            "backend": retriever.backend, "snippets": documents_note, "limits": config.public(), "uptime_s": round(time.time() - started, 1),
        }

    static = resources.files("retriever.server") / "static"

    @app.get("/", include_in_schema=False)
    async def page() -> FileResponse:
        return FileResponse(str(static / "index.html"), media_type="text/html")

    app.mount("/static", StaticFiles(directory=str(static)), name="static")
    return app


def validation_message(errors: list[dict]) -> str:
    """One line from pydantic's errors: ``body.k: Input should be a valid integer; ...``."""
    parts = []
    for e in errors[:5]:
        where = ".".join(str(x) for x in e.get("loc", ()) if x != "body") or "body"
        parts.append(f"{where}: {str(e.get('msg', 'invalid')).removeprefix('Value error, ')}")
    more = f" (and {len(errors) - 5} more)" if len(errors) > 5 else ""
    return "; ".join(parts) + more
