"""``search-index``: query an index built by ``build-index`` from the shell."""
from __future__ import annotations

import argparse
import io
import json
import logging
import sys
from dataclasses import asdict
from pathlib import Path

from embedder.hardware import DTYPES
from embedder.models import ModelNotAvailable
from indexer.manifest import IndexFormatError
from retriever.backends import BACKENDS
from retriever.filters import loads_filter
from retriever.options import add_query_side_arguments
from retriever.query import DEFAULT_EXPANSION_M
from retriever.quiet import quiet_libraries
from retriever.retriever import DEFAULT_QUERY_WEIGHTING, MODES, QUERY_WEIGHTINGS, Retriever, check_k


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="search-index", description=__doc__)
    p.add_argument("--index", required=True, type=Path)
    p.add_argument("queries", nargs="*", help="queries (default: one per line on standard input)")
    p.add_argument("-k", type=int, default=10, help="hits per query")
    p.add_argument("--mode", choices=MODES, help="default: hybrid where the index has channels to fuse (build-index's default), else its one channel")
    p.add_argument("--expansion-m", type=int, default=DEFAULT_EXPANSION_M, help="aligned tokens added to each query")
    p.add_argument("--query-weighting", choices=QUERY_WEIGHTINGS, default=DEFAULT_QUERY_WEIGHTING, help="weight of each query token")
    p.add_argument("--model", help="must match the index's model; default: the one in its manifest")
    p.add_argument("--encoder", help="must match the index's encoder channel; default: the one in its manifest (e.g. its model directory moved)")
    p.add_argument("--where", metavar="JSON",
                   help='metadata filter, e.g. \'{"lang": "en", "year": {"gte": 2000}}\' (fields the index stores; see docs/command-line.md)')
    p.add_argument("--tokens", type=int, default=5, help="matched words shown per hit (text output)")
    p.add_argument(
        "--json", action="store_true",
        help="one JSON object per query on standard output (hits with matched words, raw token ids and BM25 terms, channel shares)",
    )
    p.add_argument("--explain-settings", action="store_true",
                   help="say (on standard error) each search setting chosen for this index (profile, query encoder, fusion, feedback, "
                   "pruning, backend) and why")
    p.add_argument("--verify", action="store_true", help="compare every index file with its recorded checksum first")
    p.add_argument("--dtype", choices=DTYPES, default="auto", help="query encoder precision (default auto: chosen for this machine)")
    p.add_argument("--runtime", choices=("auto", "torch", "openvino"), default="auto", help="how the query encoder runs (default auto)")
    add_query_side_arguments(p)
    p.add_argument("--backend", choices=BACKENDS, default="numba", help="who answers the channels (default numba: the index's own files)")
    p.add_argument("--milvus-uri", help="--backend milvus: the Milvus Lite file or server address given to build-index --export-milvus")
    p.add_argument("--milvus-collection", help="--backend milvus: collection name (default: at_<index directory name>)")
    p.add_argument("--lucene-index", type=Path, help="--backend lucene: the export directory of build-index --export-pyserini")
    return p


def _stdin_queries() -> list[str]:
    """One query per non-empty line of standard input.

    Read in stdin's encoding, bytes it cannot decode kept as lone surrogates (whatever
    PYTHONIOENCODING says), as Python keeps them in command-line arguments. A stream that was
    already read from (an embedding host, a fork server) cannot be reconfigured: it is read as is.
    """
    stream = sys.stdin
    if hasattr(stream, "reconfigure"):
        try:
            stream.reconfigure(errors="surrogateescape")
        except (io.UnsupportedOperation, ValueError):
            pass
    return [line.strip() for line in stream if line.strip()]


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(message)s")
    # a query with undecodable bytes (kept as lone surrogates) is echoed escaped, not a traceback
    if hasattr(sys.stdout, "reconfigure"):
        sys.stdout.reconfigure(errors="backslashreplace")
    queries = args.queries or _stdin_queries()
    try:
        check_k(args.k)  # before seconds of model loading
        where = loads_filter(args.where) if args.where is not None else None  # one line, exit 2: not JSON, nested too deeply
        extra = {}
        if args.encoder:
            from embedder.sentence_encoder import SentenceEncoder

            extra["encoders"] = {"encoder": SentenceEncoder.load(args.encoder)}
        with quiet_libraries():  # progress bars and warnings of model loading: not a query's output
            retriever = Retriever.load(
                args.index, model=args.model, expansion_m=args.expansion_m, query_weighting=args.query_weighting, verify=args.verify,
                dtype=args.dtype, runtime=args.runtime, backend=args.backend, lucene_index=args.lucene_index, milvus_uri=args.milvus_uri,
                milvus_collection=args.milvus_collection, query_encoder=args.query_encoder, profile=args.profile, feedback=args.feedback,
                sparse_pruning=args.sparse_pruning, **extra
            )
            if args.explain_settings:
                for line in retriever.settings.lines():
                    print(f"search-index: settings: {line}", file=sys.stderr)
            mode = args.mode or retriever.default_mode
            if args.mode is None and mode != "hybrid":  # an index without channels to fuse: say what was chosen
                print(f"search-index: {retriever.describe_mode(mode)}", file=sys.stderr)
            elif mode == "hybrid" and not args.json:  # which weights, and why these (calibrated on this corpus, or fixed)
                print(f"search-index: {retriever.describe_mode(mode)}; fusion: {retriever.fusion_source}", file=sys.stderr)
            results = retriever.batch_search(queries, k=args.k, mode=mode, where=where)
    except (IndexFormatError, ModelNotAvailable, ValueError, OSError) as exc:
        print(f"search-index: error: {exc}", file=sys.stderr)
        return 2
    for q, hits in zip(queries, results):
        if args.json:
            print(json.dumps({"query": q, "mode": mode, "hits": [asdict(h) for h in hits]}, ensure_ascii=False))
            continue
        print(f"query: {q}")
        for rank, h in enumerate(hits, 1):
            print(f"  {rank:2d}. {h.doc_id:<20} {h.score:9.3f}  {format_explanation(h, args.tokens)}")
    return 0


def format_explanation(hit, n_words: int = 5) -> str:
    """A hit's matched words (with their contributions) and, for hybrid hits, each channel's
    share of the score, on one line."""
    words = ", ".join(f"{t} {w:.1f}" if abs(w) >= 1 else f"{t} {w:.2g}" for t, w in list(hit.matched_tokens.items())[:n_words])
    shares = " ".join(f"{c} {v:.2f}" for c, v in sorted(hit.channels.items(), key=lambda cv: -cv[1]))
    return "  ".join(part for part in (words, f"[{shares}]" if shares else "") if part)


if __name__ == "__main__":
    sys.exit(main())
