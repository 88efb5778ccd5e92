"""``verify-index``: check every file of an index (or of a Pyserini export) and say what is wrong.

The checks are indexer/verify.py's. Exit status: 0 clean, 1 damaged, 2 not an index (or a
usage error); every problem is one line, never a traceback.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

from indexer.verify import NotAnIndex, verify


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="verify-index", description=__doc__.split("\n")[0])
    p.add_argument("path", type=Path, help="index directory (or Pyserini export directory)")
    return p


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    try:
        report = verify(args.path)
    except NotAnIndex as exc:
        print(f"verify-index: error: {exc}", file=sys.stderr)
        return 2
    for line in report.problems:
        print(line)
    for line in report.notes:
        print(f"note: {line}")
    if report.ok:
        print(f"{args.path}: ok ({report.kind}, {report.n_files} files checksummed)")
        return 0
    print(f"{args.path}: {len(report.problems)} problem(s)", file=sys.stderr)
    return 1


if __name__ == "__main__":
    sys.exit(main())
