"""``python -m retriever.cli_lucene queries``: the query side of the Pyserini export.

Encodes queries with the index's model (the Retriever's query encoding, expansion included)
and writes them as Pyserini impact topics beside the documents that ``build-index
--export-pyserini`` or ``python -m indexer.cli_lucene docs`` exported. A command of its own
because the Lucene backend (retriever/backends/lucene.py) sits below the Retriever.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

from indexer.corpus import CorpusError, read_queries
from indexer.exports.lucene import (
    LUCENE_DIR,
    QUERIES_JSONL,
    QUERIES_TSV,
    check_export_matches,
    export_queries,
    read_export,
    read_token_map,
)
from indexer.manifest import IndexFormatError


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m retriever.cli_lucene", description="Encode queries with an index's model and write them as Pyserini impact topics.")
    sub = p.add_subparsers(dest="what", required=True)
    q = sub.add_parser("queries", help="encode queries and write them as Pyserini impact topics")
    q.add_argument("--index", required=True, type=Path, help="index directory (its model encodes the queries)")
    q.add_argument("--export", required=True, type=Path, help="export directory made by build-index --export-pyserini")
    q.add_argument("--queries", required=True, type=Path, help="BEIR queries.jsonl ({'_id', 'text'} lines)")
    q.add_argument("--expansion-m", type=int, default=None, help="expansion tokens per query (default: the engine's)")
    q.add_argument("--query-scale", type=float, default=None, help="query weight scale (default: the export's)")
    return p


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    from retriever.retriever import Retriever  # loads torch: after the arguments are read

    try:
        kw = {"expansion_m": args.expansion_m} if args.expansion_m is not None else {}
        retriever = Retriever.load(args.index, **kw)
        info = read_export(args.export)
        check_export_matches(info, args.index)
        scale = args.query_scale if args.query_scale is not None else info["quantisation"]["query_scale"]
        queries = read_queries(args.queries)
        encoded = retriever.encode(list(queries.values()))
        stats = export_queries(
            ((qid, e.text, e.tokens, e.weights) for qid, e in zip(queries, encoded)), read_token_map(args.export), args.export, scale
        )
    except (IndexFormatError, CorpusError, ValueError, OSError) as exc:
        print(f"lucene queries: error: {exc}", file=sys.stderr)
        return 2
    print(f"wrote {stats['queries']} queries to {args.export / QUERIES_TSV} and {QUERIES_JSONL}; search them with:\n"
          f"  python -m pyserini.search.lucene --index {args.export / LUCENE_DIR} --topics {args.export / QUERIES_TSV} "
          f"--impact --min-idf -1 --hits 100 --output run.trec")
    return 0


if __name__ == "__main__":
    sys.exit(main())
