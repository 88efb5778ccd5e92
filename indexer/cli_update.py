"""``update-index``: add, replace or delete documents of a built index in place.

Only the added documents are encoded; the index is written again from what it holds and
published as its next generation in one step (indexer/updates.py): a search running meanwhile
answers from the generation it holds, a crash leaves the last one, and running the same
command again completes it. A running ``serve`` picks the new generation up by itself.

    update-index --index idx --add new_or_changed.jsonl --delete old-id --delete-file gone.txt
"""
from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path

from embedder.models import ModelNotAvailable
from indexer.corpus import FORMATS, CorpusError, CorpusSpec
from indexer.errors import IndexFormatError
from indexer.shards import BuildInProgress
from indexer.updates import MAX_DOCUMENT_BYTES, UpdateError, UpdateReport, read_delete_ids, update_index


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="update-index", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--index", required=True, type=Path, help="the index to update (built by build-index)")
    p.add_argument("--add", type=Path, metavar="CORPUS",
                   help="documents to add, as build-index reads them (BEIR folder, .jsonl, .tsv); an id already indexed is replaced")
    p.add_argument("--delete", action="append", default=[], metavar="ID", help="an id to delete (repeatable)")
    p.add_argument("--delete-file", type=Path, metavar="FILE",
                   help="ids to delete, one per line, each exactly as written (only the line end, \\n or \\r\\n, is removed; blank lines are skipped)")
    p.add_argument("--max-document-bytes", type=int, default=MAX_DOCUMENT_BYTES, metavar="N",
                   help=f"refuse an added document whose stored form (id, title, text, metadata as one JSON line) is larger (default {MAX_DOCUMENT_BYTES})")
    p.add_argument("--format", choices=FORMATS, help="--add's format (guessed from the path)")
    p.add_argument("--id-field", help="JSONL id field (default _id, then id)")
    p.add_argument("--text-field", help="JSONL text field (default text, then contents)")
    p.add_argument("--title-field", default="title", help="JSONL title field ('' for none)")
    p.add_argument("--recalibrate", action="store_true",
                   help="read the fusion calibration again off the corpus (by default an update does so once a tenth of the "
                        "documents it was read off have changed; indexer/calibration.py)")
    p.add_argument("--quiet", action="store_true", help="no progress bars")
    return p


def _shown(doc_id: str, most: int = 60) -> str:
    """An id quoted (a leading or trailing space shows), cut short where it is long."""
    text = repr(doc_id)
    return text if len(text) <= most else f"{text[:most - 5]}...{text[-1]} ({len(doc_id)} characters)"


def describe(index: Path, r: UpdateReport) -> str:
    missing = f" ({len(r.not_found)} not indexed: {', '.join(map(_shown, r.not_found[:5]))}{', ...' if len(r.not_found) > 5 else ''})" if r.not_found else ""
    if not r.published:
        return f"nothing to update in {index}: 0 added, 0 replaced, 0 deleted{missing}; nothing published ({r.n_docs} documents, still {r.generation})"
    return (f"updated {index}: {r.added} added, {r.replaced} replaced, {r.deleted} deleted{missing}; {r.n_docs} documents now, "
            f"published as {r.generation} in {r.seconds:.1f} s (encoding {r.encode_seconds:.1f} s, writing {r.merge_seconds:.1f} s)")


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(message)s")
    if args.add is None and not args.delete and args.delete_file is None:
        print("update-index: error: nothing to do: give --add, --delete or --delete-file", file=sys.stderr)
        return 2
    try:
        delete = list(args.delete) + (read_delete_ids(args.delete_file) if args.delete_file else [])
        add = list(CorpusSpec(args.add, args.format, args.id_field, args.text_field, args.title_field or None)) if args.add else []
        report = update_index(args.index, add=add, delete=delete, progress=not args.quiet, max_document_bytes=args.max_document_bytes,
                              recalibrate=args.recalibrate)
    except (CorpusError, UpdateError, IndexFormatError, ModelNotAvailable, BuildInProgress, OSError, ValueError) as exc:
        print(f"update-index: error: {exc}", file=sys.stderr)
        return 2
    print(describe(args.index, report))
    return 0


if __name__ == "__main__":
    sys.exit(main())
