"""What a server allows: limits on work and input, and who may ask."""
from __future__ import annotations

from dataclasses import dataclass

API_KEY_ENV = "ALIGNED_TOKENS_API_KEY"  # the bearer token, when not given with --api-key
DEFAULT_MAX_CONNECTIONS = 512  # lowered by serve to fit the open-files limit (ulimit -n)
BACKLOG = 128  # the listen queue, and the most connections asyncio accepts in one go
MAX_TIMEOUT_S = 3600.0
DEFAULT_MAX_CONCURRENCY = 2  # search lanes (retriever/server/batching.py): measured in BENCHMARKS.md ("Serving")


@dataclass(frozen=True)
class ServerConfig:
    """Limits of one server (every one checked before any model work).

    ``max_concurrency``: search groups running at once (retriever/server/batching.py: the
    requests waiting when a group starts share its encoder forward); further requests queue,
    and one still queued after ``queue_timeout_s`` gets 503 with ``Retry-After``. ``max_body_bytes``: request bodies larger are refused (413) before
    they are parsed. ``max_query_chars``, ``max_k``, ``max_batch``: larger values are refused
    (422) with a message; ``max_window``: the deepest rank a page reaches (``offset + k``;
    beyond: 422). ``api_key``: when set, every route but ``/healthz`` and the page's
    static files needs ``Authorization: Bearer <api_key>``.

    Connections (retriever/server/protocol.py): at most ``max_connections`` open (a request on
    one beyond gets 503); a request head must arrive within ``header_timeout_s`` and its body
    within ``body_timeout_s`` (else 408 and the connection is closed); an idle keep-alive
    connection is closed after ``keep_alive_timeout_s``.
    """

    max_concurrency: int = DEFAULT_MAX_CONCURRENCY
    queue_timeout_s: float = 10.0
    max_body_bytes: int = 64 * 1024
    max_query_chars: int = 2000
    max_k: int = 100
    max_window: int = 1000
    max_batch: int = 32
    api_key: str | None = None
    max_connections: int = DEFAULT_MAX_CONNECTIONS
    header_timeout_s: float = 10.0
    body_timeout_s: float = 10.0
    keep_alive_timeout_s: float = 5.0
    # serve --writable: POST /documents and DELETE /documents/{id} change the index (retriever/server/writes.py)
    writable: bool = False
    max_write_bytes: int = 16 * 1024 * 1024  # a POST /documents body (documents are larger than queries)
    max_write_documents: int = 10_000  # documents plus ids in one update
    # an added document's stored form (id, title, text, metadata as one JSON line) at most: indexer.updates.MAX_DOCUMENT_BYTES
    max_document_bytes: int = 1 << 20

    def __post_init__(self) -> None:
        for name in ("max_concurrency", "max_body_bytes", "max_query_chars", "max_k", "max_window", "max_batch", "max_connections",
                     "max_write_bytes", "max_write_documents", "max_document_bytes"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be at least 1, got {getattr(self, name)}")
        for name in ("queue_timeout_s", "header_timeout_s", "body_timeout_s", "keep_alive_timeout_s"):
            value = getattr(self, name)
            if not 0 < value <= MAX_TIMEOUT_S:  # also refuses NaN
                raise ValueError(f"{name} must be a number of seconds in (0, {MAX_TIMEOUT_S}], got {value}")
        if self.api_key is not None and not self.api_key.strip():
            raise ValueError("api_key is empty")
        if self.max_window < self.max_k:
            raise ValueError(f"max_window ({self.max_window}) must be at least max_k ({self.max_k})")

    def public(self) -> dict:
        """The limits as /info shows them (never the key)."""
        return {
            "max_concurrency": self.max_concurrency, "queue_timeout_s": self.queue_timeout_s, "max_body_bytes": self.max_body_bytes,
            "max_query_chars": self.max_query_chars, "max_k": self.max_k, "max_window": self.max_window, "max_batch": self.max_batch, "auth": self.api_key is not None,
            "max_connections": self.max_connections, "header_timeout_s": self.header_timeout_s, "body_timeout_s": self.body_timeout_s,
            "keep_alive_timeout_s": self.keep_alive_timeout_s, "writable": self.writable,
            **({"max_write_bytes": self.max_write_bytes, "max_write_documents": self.max_write_documents,
                "max_document_bytes": self.max_document_bytes} if self.writable else {}),
        }
