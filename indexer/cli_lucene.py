"""``python -m indexer.cli_lucene docs``: export an index as a Pyserini impact index (indexer/exports/lucene.py).

The same export as ``build-index --export-pyserini``, for an index that is already built. The
query side (encoding queries needs the Retriever) is ``python -m retriever.cli_lucene queries``.
"""
from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path

from indexer.exports.lucene import DOC_SCALE, QUERY_SCALE, ExportError, describe, export_pyserini
from indexer.manifest import IndexFormatError


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m indexer.cli_lucene",
        description="Export an aligned-token index as a Pyserini impact index (JsonVectorCollection -> Lucene).",
    )
    sub = p.add_subparsers(dest="what", required=True)
    d = sub.add_parser("docs", help="export an index's document vectors and build the Lucene impact index")
    d.add_argument("--index", required=True, type=Path, help="index directory made by build-index")
    d.add_argument("--out", required=True, type=Path, help="export directory to create")
    d.add_argument("--scale", type=float, default=DOC_SCALE, help=f"document weight scale (default {DOC_SCALE:g})")
    d.add_argument("--query-scale", type=float, default=QUERY_SCALE, help=f"query weight scale searches use (default {QUERY_SCALE:g})")
    d.add_argument("--threads", type=int, default=1, help="Lucene indexing threads (1 keeps Lucene's doc order = index order)")
    d.add_argument("--no-lucene", action="store_true", help="write the JsonVectorCollection only")
    d.add_argument("--overwrite", action="store_true")
    d.add_argument("--quiet", action="store_true")
    return p


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(message)s")
    try:
        info = export_pyserini(args.index, args.out, scale=args.scale, query_scale=args.query_scale, build_lucene=not args.no_lucene,
                               threads=args.threads, overwrite=args.overwrite, progress=not args.quiet)
        print(describe(info, args.out))
        return 0
    except (IndexFormatError, ExportError, FileExistsError, ValueError, OSError) as exc:
        print(f"export-pyserini: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
