"""TREC run files: the one writer and the one reader of this package's runs.

A run is {query id: {doc id: score}}; a file holds one line per hit, ``qid Q0 docid rank score tag``,
best first, plain or gzip-compressed (``.gz``).
"""
from __future__ import annotations

import gzip
import os
from pathlib import Path

Run = dict[str, dict[str, float]]  # query id -> doc id -> score
Qrels = dict[str, dict[str, int]]  # query id -> doc id -> relevance


def write_trec(run: Run, path: Path, tag: str) -> Path:
    """Write a run in TREC format (``qid Q0 docid rank score tag``), best first.

    A ``.gz`` suffix writes it gzip-compressed. Written beside then renamed into place.
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(tmp, "wt", encoding="utf-8") as f:
        for qid in sorted(run, key=_natural):
            ranked = sorted(run[qid].items(), key=lambda kv: (-kv[1], kv[0]))
            for rank, (did, score) in enumerate(ranked, start=1):
                f.write(f"{qid} Q0 {did} {rank} {score:.9g} {tag}\n")  # .9g: float32 round-trips
    os.replace(tmp, path)
    return path


def read_trec(path: str | os.PathLike[str]) -> Run:
    """Read a TREC run file (plain or .gz): {query id: {doc id: score}}, each query's documents in file order.

    A line without the six fields, or with a score that is not a number, is a ValueError naming
    the file and line.
    """
    path = Path(path)
    opener = gzip.open if path.suffix == ".gz" else open
    run: Run = {}
    with opener(path, "rt", encoding="utf-8") as f:
        for lineno, line in enumerate(f, start=1):
            parts = line.split()
            if not parts:
                continue
            if len(parts) != 6:
                raise ValueError(f"{path}:{lineno}: expected 6 fields (qid Q0 doc rank score tag), got {len(parts)}")
            try:
                run.setdefault(parts[0], {})[parts[2]] = float(parts[4])
            except ValueError:
                raise ValueError(f"{path}:{lineno}: field 'score': not a number: {parts[4]!r}") from None
    return run


def _natural(qid: str):
    return (0, int(qid), "") if qid.isdigit() else (1, 0, qid)
