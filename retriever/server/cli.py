"""``serve INDEX``: search an index over HTTP, with a search page at ``/``."""
from __future__ import annotations

import argparse
import logging
import os
import sys
from pathlib import Path

from embedder.hardware import DTYPES
from embedder.models import ModelNotAvailable
from indexer.corpus import CorpusError
from indexer.manifest import IndexFormatError
from retriever.options import add_query_side_arguments
from retriever.quiet import quiet_libraries
from retriever.server.config import API_KEY_ENV, ServerConfig

DEFAULT_PORT = 8000


def parser() -> argparse.ArgumentParser:
    d = ServerConfig()
    p = argparse.ArgumentParser(prog="serve", description=__doc__)
    p.add_argument("index", type=Path, help="index directory built by build-index")
    p.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1: this machine only; 0.0.0.0 exposes it, use --api-key then)")
    p.add_argument("--port", type=int, default=DEFAULT_PORT)
    p.add_argument("--api-key", help=f"require 'Authorization: Bearer KEY' on every route but /healthz and the page (default: ${API_KEY_ENV} if set)")
    p.add_argument("--corpus", type=Path, help="where the documents are, for titles and snippets (default: the corpus the manifest names)")
    p.add_argument("--max-concurrency", type=int, default=d.max_concurrency, help="searches at once; others queue")
    p.add_argument("--queue-timeout", type=float, default=d.queue_timeout_s, help="seconds a request may queue before 503 + Retry-After")
    p.add_argument("--max-k", type=int, default=d.max_k)
    p.add_argument("--max-query-chars", type=int, default=d.max_query_chars)
    p.add_argument("--max-batch", type=int, default=d.max_batch, help="queries per /search/batch request")
    p.add_argument("--max-body-bytes", type=int, default=d.max_body_bytes)
    p.add_argument("--dtype", choices=DTYPES, default="auto", help="query encoder precision (default auto)")
    p.add_argument("--runtime", choices=("auto", "torch", "openvino"), default="auto", help="how the query encoder runs (default auto)")
    add_query_side_arguments(p)
    p.add_argument("--log-level", default="warning", choices=("critical", "error", "warning", "info", "debug"))
    return p


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(message)s")
    try:
        config = ServerConfig(
            max_concurrency=args.max_concurrency, queue_timeout_s=args.queue_timeout, max_body_bytes=args.max_body_bytes,
            max_query_chars=args.max_query_chars, max_k=args.max_k, max_batch=args.max_batch,
            api_key=args.api_key or os.environ.get(API_KEY_ENV) or None,
        )
        import uvicorn

        from retriever.retriever import Retriever
        from retriever.server.app import create_app
        from retriever.server.documents import Documents

        with quiet_libraries():
            retriever = Retriever.load(args.index, dtype=args.dtype, runtime=args.runtime, query_encoder=args.query_encoder, feedback=args.feedback)
        documents, note = Documents.for_index(args.index, retriever.manifest, retriever.doc_ids, args.corpus)
    except (IndexFormatError, ModelNotAvailable, CorpusError, ValueError, OSError, ImportError) as exc:
        print(f"serve: error: {exc}", file=sys.stderr)
        return 2
    app = create_app(retriever, config, documents, note)
    where = f"http://{args.host}:{args.port}"
    print(f"serve: {args.index}: {retriever.manifest.n_docs} documents, {retriever.describe_mode()}; {note}", file=sys.stderr)
    print(f"serve: search page {where}/  API docs {where}/docs" + ("  (API key required)" if config.api_key else ""), file=sys.stderr)
    uvicorn.run(app, host=args.host, port=args.port, log_level=args.log_level)
    return 0


if __name__ == "__main__":
    sys.exit(main())
