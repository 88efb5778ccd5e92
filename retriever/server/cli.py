"""``serve INDEX``: search an index over HTTP, with a search page at ``/``."""
from __future__ import annotations

import argparse
import logging
import os
import sys
from pathlib import Path

from embedder.hardware import DTYPES
from embedder.models import ModelNotAvailable
from indexer.corpus import CorpusError, CorpusSpec
from indexer.manifest import IndexFormatError
from retriever.options import add_query_side_arguments
from retriever.quiet import quiet_libraries
from retriever.server.config import API_KEY_ENV, BACKLOG, DEFAULT_MAX_CONNECTIONS, ServerConfig

DEFAULT_PORT = 8000
LOOPBACK = ("127.0.0.1", "localhost", "::1")
RESERVED_FILES = 64 + 2 * BACKLOG  # open files beside the bound: accepted or closing at once, the index, model and corpus


def parser() -> argparse.ArgumentParser:
    d = ServerConfig()
    p = argparse.ArgumentParser(prog="serve", description=__doc__)
    p.add_argument("index", type=Path, help="index directory built by build-index")
    p.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1: this machine only; 0.0.0.0 exposes it, use --api-key then)")
    p.add_argument("--port", type=int, default=DEFAULT_PORT, help=f"port to listen on, 1-65535, or 0 for any free one (default {DEFAULT_PORT})")
    p.add_argument("--api-key", help=f"require 'Authorization: Bearer KEY' on every route but /healthz and the page (default: ${API_KEY_ENV} if set)")
    p.add_argument("--corpus", type=Path, help="where the documents are, for titles and snippets (default: the corpus the manifest names)")
    p.add_argument("--max-concurrency", type=int, default=d.max_concurrency,
                   help=f"search groups at once (default {d.max_concurrency}); the requests waiting when one starts share its encoder forward")
    p.add_argument("--queue-timeout", type=float, default=d.queue_timeout_s, help="seconds a request may queue before 503 + Retry-After")
    p.add_argument("--max-k", type=int, default=d.max_k, help=f"hits per request at most (default {d.max_k})")
    p.add_argument("--max-window", type=int, default=d.max_window,
                   help=f"the deepest rank a page reaches, offset + k (default {d.max_window})")
    p.add_argument("--no-reload", action="store_true",
                   help="serve the generation loaded at start for ever (default: follow the index, picking up a rebuild or an update within seconds)")
    p.add_argument("--writable", action="store_true",
                   help="also serve POST /documents (add, replace, delete) and DELETE /documents/{id}, updating the index in place; "
                   "needs --api-key (or its variable) unless bound to this machine only")
    p.add_argument("--max-document-bytes", type=int, default=d.max_document_bytes, metavar="N",
                   help="--writable: refuse (422) an added document whose stored form (id, title, text and metadata as one JSON line) "
                   f"is larger (default {d.max_document_bytes})")
    p.add_argument("--max-query-chars", type=int, default=d.max_query_chars)
    p.add_argument("--max-batch", type=int, default=d.max_batch, help="queries per /search/batch request")
    p.add_argument("--max-body-bytes", type=int, default=d.max_body_bytes)
    p.add_argument("--max-connections", type=int, help="open connections; beyond, the one waiting longest for a request is closed, "
                   f"or where all are inside a request the new one gets 503 (default {d.max_connections}, fewer where ulimit -n allows fewer)")
    p.add_argument("--header-timeout", type=float, default=d.header_timeout_s, metavar="SECONDS",
                   help="a request's head (request line and headers) must arrive within this; else 408 and the connection is closed")
    p.add_argument("--body-timeout", type=float, default=d.body_timeout_s, metavar="SECONDS",
                   help="a request's body must arrive within this after its head; else 408 and the connection is closed")
    p.add_argument("--keep-alive-timeout", type=float, default=d.keep_alive_timeout_s, metavar="SECONDS",
                   help="an idle keep-alive connection is closed after this")
    p.add_argument("--dtype", choices=DTYPES, default="auto", help="query encoder precision (default auto)")
    p.add_argument("--runtime", choices=("auto", "torch", "openvino"), default="auto", help="how the query encoder runs (default auto)")
    add_query_side_arguments(p)
    p.add_argument("--log-level", default="warning", choices=("critical", "error", "warning", "info", "debug"))
    return p


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(message)s")
    sock = None
    try:
        # every option is checked, and the port bound, before the model loads
        config = ServerConfig(
            max_concurrency=args.max_concurrency, queue_timeout_s=args.queue_timeout, max_body_bytes=args.max_body_bytes,
            max_query_chars=args.max_query_chars, max_k=args.max_k, max_window=args.max_window, max_batch=args.max_batch, api_key=api_key(args.api_key),
            max_connections=max_connections(args.max_connections), header_timeout_s=args.header_timeout,
            body_timeout_s=args.body_timeout, keep_alive_timeout_s=args.keep_alive_timeout, writable=args.writable,
            max_document_bytes=args.max_document_bytes,
        )
        if args.writable and args.no_reload:
            raise ValueError("--writable with --no-reload: the server would never answer from what it writes; drop one")
        if args.writable and config.api_key is None and args.host not in LOOPBACK:
            raise ValueError(f"--writable on {args.host}: anyone who reaches the port could change the index; give --api-key "
                             f"(or ${API_KEY_ENV}), or bind 127.0.0.1")
        if not 0 <= args.port <= 65535:
            raise ValueError(f"--port must be between 1 and 65535 (0: any free port), not {args.port}")
        if not args.index.is_dir():
            raise ValueError(f"{args.index}: no index there (not a directory)")
        if args.corpus is not None:
            CorpusSpec(args.corpus)  # exists, has a format, is a regular file (a FIFO would hang the read)
        from retriever.server.protocol import bind

        sock = bind(args.host, args.port)
        import uvicorn

        from retriever.retriever import Retriever
        from retriever.server.app import create_app
        from retriever.server.documents import Documents
        from retriever.server.live import reload_with_models
        from retriever.server.protocol import uvicorn_config

        def load(**models) -> Retriever:
            with quiet_libraries():
                return Retriever.load(args.index, dtype=args.dtype, runtime=args.runtime, query_encoder=args.query_encoder,
                                      profile=args.profile, feedback=args.feedback,
                                      sparse_pruning=args.sparse_pruning, **models)

        def documents_for(r: Retriever) -> tuple[Documents | None, str]:
            return Documents.for_index(args.index, r.manifest, r.doc_ids, args.corpus)

        retriever = load()
        documents, note = documents_for(retriever)
    except (IndexFormatError, ModelNotAvailable, CorpusError, ValueError, OSError, ImportError) as exc:
        if sock is not None:
            sock.close()
        print(f"serve: error: {exc}", file=sys.stderr)
        return 2
    # a new generation of the index (a rebuild, an update) is loaded with the same options, reusing the models where it names the same
    reload = None if args.no_reload else (lambda previous: reload_with_models(previous, load))
    app = create_app(retriever, config, documents, note, loader=reload, documents_for=documents_for)
    port = sock.getsockname()[1]
    where = f"http://{args.host if ':' not in args.host else f'[{args.host}]'}:{port}"
    print(f"serve: {args.index}: {retriever.manifest.n_docs} documents, {retriever.describe_mode()}; {note}", file=sys.stderr)
    print(f"serve: search page {where}/  API docs {where}/docs" + ("  (API key required)" if config.api_key else ""), file=sys.stderr, flush=True)
    uvicorn.Server(uvicorn_config(app, config, args.host, port, args.log_level)).run(sockets=[sock])
    return 0


def api_key(given: str | None) -> str | None:
    """The key: ``--api-key``, else ``$ALIGNED_TOKENS_API_KEY``; None when neither is set. An empty
    or blank one is refused (ValueError): it would read as "no authentication"."""
    key, source = (given, "--api-key") if given is not None else (os.environ.get(API_KEY_ENV), f"${API_KEY_ENV}")
    if key is not None and not key.strip():
        leave = "leave --api-key out" if given is not None else f"unset {API_KEY_ENV}"
        raise ValueError(f"{source} is empty: give a key, or {leave} to serve without one (keep it on 127.0.0.1 then)")
    return key


def max_connections(given: int | None) -> int:
    """The bound on open connections: ``given`` or the default, within the open-files limit
    (raised to the hard limit where that is needed). Each connection holds a file; RESERVED_FILES
    more are kept for the index, the model and the corpus."""
    want = given if given is not None else DEFAULT_MAX_CONNECTIONS
    if want < 1:
        raise ValueError(f"--max-connections must be at least 1, not {want}")
    try:
        import resource

        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        needed = want + RESERVED_FILES
        if soft != resource.RLIM_INFINITY and soft < needed:
            raised = needed if hard == resource.RLIM_INFINITY else min(needed, hard)
            resource.setrlimit(resource.RLIMIT_NOFILE, (raised, hard))
            soft = raised
    except (ImportError, ValueError, OSError):
        return want
    if soft == resource.RLIM_INFINITY or soft >= needed:
        return want
    if given is not None or soft - RESERVED_FILES < 1:
        raise ValueError(f"--max-connections {want} needs {needed} open files; this process may open {soft} (ulimit -n)")
    return soft - RESERVED_FILES


if __name__ == "__main__":
    sys.exit(main())
