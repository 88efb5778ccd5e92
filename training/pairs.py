"""Supervised pairs for the contrastive stage: TSV files of anchor, positive[, negative].

The layout is ../shared/data/pairs' (header ``anchor<TAB>positive[<TAB>negative]``, no
quoting); a user's own pairs in that layout train the same way. Each file is one *source*:
the trainer draws every batch from a single source, because in a mixed batch the negatives
come from other domains and are trivially easy (E5, GTE).

Texts are stored once (:attr:`PairSet.texts`) and pairs refer to them by row, so that a
text shared by several pairs is encoded, targeted and masked as one text.
"""

from __future__ import annotations

import csv
import hashlib
import logging
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from training.objectives.contrastive import text_key

log = logging.getLogger(__name__)

csv.field_size_limit(1 << 30)


class PairsFileError(ValueError):
    """A pairs file that cannot be read; the message names the file, line and field."""


@dataclass
class PairSource:
    """The pairs of one file, as rows of :attr:`PairSet.texts` (negative -1 = none)."""

    name: str
    path: str
    anchor: np.ndarray
    positive: np.ndarray
    negative: np.ndarray
    # rows of mined hard negatives (training/hard_negatives.py), -1 = none; None = not mined
    mined: np.ndarray | None = None

    def __len__(self) -> int:
        return len(self.anchor)

    @property
    def has_negatives(self) -> bool:
        return bool((self.negative >= 0).any())


@dataclass
class PairSet:
    """Every text once, and each source's pairs as row indices into it."""

    texts: list[str] = field(default_factory=list)
    sources: list[PairSource] = field(default_factory=list)
    dropped: dict[str, int] = field(default_factory=dict)  # source -> pairs dropped as held-out overlap
    _rows: dict[str, int] = field(default_factory=dict, repr=False)

    def row(self, text: str) -> int:
        i = self._rows.get(text)
        if i is None:
            i = self._rows[text] = len(self.texts)
            self.texts.append(text)
        return i

    def fingerprint(self) -> str:
        h = hashlib.sha256()
        for s in self.sources:
            h.update(s.name.encode())
            for a in (s.anchor, s.positive, s.negative):
                h.update(np.ascontiguousarray(a, dtype=np.int64).tobytes())
        for t in self.texts:
            h.update(t.encode())
            h.update(b"\0")
        return h.hexdigest()[:16]

    def describe(self) -> dict:
        return {
            "sources": [
                {"name": s.name, "path": s.path, "pairs": len(s), "hard_negatives": int((s.negative >= 0).sum())} for s in self.sources
            ],
            "texts": len(self.texts),
            "dropped_overlapping_holdout": dict(self.dropped),
        }


def read_pairs_file(path: Path) -> list[tuple[str, str, str | None]]:
    """(anchor, positive, negative or None) per row; a clear error for a malformed file."""
    path = Path(path)
    if not path.is_file():
        raise PairsFileError(f"{path}: no such pairs file")
    rows: list[tuple[str, str, str | None]] = []
    with path.open(encoding="utf-8", newline="") as f:
        reader = csv.reader(f, delimiter="\t", quoting=csv.QUOTE_NONE)
        try:
            header = next(reader)
        except StopIteration:
            raise PairsFileError(f"{path}: empty file (expected a header anchor<TAB>positive[<TAB>negative])") from None
        header = [h.strip().lower() for h in header]
        if header[:2] != ["anchor", "positive"] or header[2:] not in ([], ["negative"]):
            raise PairsFileError(f"{path}, line 1: header must be anchor<TAB>positive[<TAB>negative], got {header}")
        width = len(header)
        for lineno, rec in enumerate(reader, start=2):
            if len(rec) != width:
                raise PairsFileError(f"{path}, line {lineno}: {len(rec)} fields, the header has {width}")
            for name, value in zip(header, rec):
                if not value.strip():
                    raise PairsFileError(f"{path}, line {lineno}: field {name!r} is empty")
            rows.append((rec[0], rec[1], rec[2] if width == 3 else None))
    if not rows:
        raise PairsFileError(f"{path}: no pairs after the header")
    return rows


def load_pairs(
    paths: Sequence[str | Path],
    max_per_source: int | None = None,
    seed: int = 0,
    holdout: Iterable[str] = (),
) -> PairSet:
    """Read pairs files into one :class:`PairSet` (one source per file).

    max_per_source: keep a seeded sample of that many pairs of each file (the CPU recipe sees
    a few thousand pairs in all, and every kept text costs a target). holdout: evaluation texts
    (queries, STS sentences); a pair with any text equal to one of them, case and punctuation
    ignored, is dropped and counted, so that training never sees an evaluation text.
    """
    banned = {text_key(t) for t in holdout}
    out = PairSet()
    names = set()
    for p in paths:
        p = Path(p)
        name = p.stem
        while name in names:
            name += "'"
        names.add(name)
        rows = read_pairs_file(p)
        if max_per_source is not None and max_per_source < len(rows):
            keep = np.sort(np.random.default_rng([seed, len(rows), 0x9A12]).choice(len(rows), size=max_per_source, replace=False))
            rows = [rows[i] for i in keep]
        a, b, n = [], [], []
        dropped = 0
        for anchor, pos, neg in rows:
            if banned and any(text_key(t) in banned for t in (anchor, pos, neg) if t is not None):
                dropped += 1
                continue
            a.append(out.row(anchor))
            b.append(out.row(pos))
            n.append(out.row(neg) if neg is not None else -1)
        out.dropped[name] = dropped
        if not a:
            raise PairsFileError(f"{p}: every pair overlaps the held-out evaluation texts")
        out.sources.append(PairSource(name, str(p), np.array(a, np.int64), np.array(b, np.int64), np.array(n, np.int64)))
        log.info("pairs %s: %d kept, %d dropped as held-out overlap", name, len(a), dropped)
    return out


def pair_batches(sources: Sequence[PairSource], steps: int, batch_size: int, seed: int, stage: int) -> list[tuple[int, np.ndarray]]:
    """(source index, pair indices) for each of ``steps`` batches; a pure function of its arguments.

    Each source is reshuffled epoch after epoch and cut into full batches; batches are drawn
    from sources in proportion to their sizes, so each source is seen at its natural rate and
    no batch mixes sources.
    """
    if steps <= 0:
        return []
    if not sources:
        raise ValueError("a pairs stage needs at least one pairs file")
    rng = np.random.default_rng([seed, stage, 0xC0E])
    sizes = np.array([len(s) for s in sources], dtype=np.float64)
    pick = rng.choice(len(sources), size=steps, p=sizes / sizes.sum())
    queues: list[list[np.ndarray]] = [[] for _ in sources]
    out = []
    for s in pick:
        if not queues[s]:
            n = len(sources[s])
            if n < batch_size:
                raise ValueError(f"pairs source {sources[s].name} has {n} pairs, fewer than one batch ({batch_size})")
            perm = rng.permutation(n)
            queues[s] = [perm[i : i + batch_size] for i in range(0, n - batch_size + 1, batch_size)][::-1]
        out.append((int(s), queues[s].pop()))
    return out


def holdout_texts(paths: Sequence[str | Path]) -> list[str]:
    """Evaluation texts to keep out of training: BEIR folders' queries, STS TSV sentences, or text files."""
    texts: list[str] = []
    for p in paths:
        p = Path(p)
        if p.is_dir() and (p / "queries.jsonl").exists():
            import json

            with (p / "queries.jsonl").open(encoding="utf-8") as f:
                texts.extend(json.loads(line)["text"] for line in f if line.strip())
        elif p.is_dir():
            for tsv in sorted(p.glob("*.tsv")):
                texts.extend(_tsv_sentences(tsv))
        elif p.suffix == ".tsv":
            texts.extend(_tsv_sentences(p))
        elif p.is_file():
            texts.extend(line.strip() for line in p.open(encoding="utf-8") if line.strip())
        else:
            raise PairsFileError(f"{p}: held-out path is neither a BEIR folder, a folder of TSV files nor a file")
    return texts


def _tsv_sentences(path: Path) -> list[str]:
    with path.open(encoding="utf-8", newline="") as f:
        reader = csv.DictReader(f, delimiter="\t", quoting=csv.QUOTE_NONE)
        cols = [c for c in (reader.fieldnames or []) if c and c.lower() in ("sentence1", "sentence2", "text", "query")]
        return [row[c] for row in reader for c in cols if row.get(c)]
