"""Semantic textual similarity: Spearman correlation of cosine similarities with gold scores.

Pairs files follow the STS-B layout: a header ``sentence1<TAB>sentence2<TAB>score`` and
one pair per line, read with ``csv.QUOTE_NONE`` (sentences contain bare quotes).
"""

from __future__ import annotations

import csv
import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np

REQUIRED = ("sentence1", "sentence2", "score")


class PairsError(ValueError):
    """A malformed pairs file; the message names the file, line and field."""


@dataclass(frozen=True)
class Pairs:
    left: list[str]
    right: list[str]
    scores: np.ndarray


def read_pairs(path: Path) -> Pairs:
    """Read an STS-B style TSV file (see module docstring)."""
    path = Path(path)
    if not path.exists():
        raise PairsError(f"{path}: no such file")
    left, right, scores = [], [], []
    with open(path, newline="", encoding="utf-8") as f:
        reader = csv.reader(f, delimiter="\t", quoting=csv.QUOTE_NONE)
        header = next(reader, None)
        if header is None:
            raise PairsError(f"{path}:1: empty file (expected a header {'/'.join(REQUIRED)})")
        col = {name.strip(): j for j, name in enumerate(header)}
        missing = [c for c in REQUIRED if c not in col]
        if missing:
            raise PairsError(f"{path}:1: header lacks column(s) {missing} (found {header})")
        for lineno, row in enumerate(reader, start=2):
            if not row or all(not c.strip() for c in row):
                continue
            if len(row) < len(header):
                raise PairsError(f"{path}:{lineno}: expected {len(header)} tab-separated fields, found {len(row)}")
            raw = row[col["score"]]
            try:
                score = float(raw)
            except ValueError:
                raise PairsError(f"{path}:{lineno}: field 'score': not a number: {raw!r}") from None
            if not math.isfinite(score):
                raise PairsError(f"{path}:{lineno}: field 'score': not finite: {raw!r}")
            for name in ("sentence1", "sentence2"):
                if not row[col[name]].strip():
                    raise PairsError(f"{path}:{lineno}: field {name!r}: empty sentence")
            left.append(row[col["sentence1"]])
            right.append(row[col["sentence2"]])
            scores.append(score)
    if not scores:
        raise PairsError(f"{path}: no pairs")
    return Pairs(left, right, np.asarray(scores, dtype=np.float64))


def unique_sentences(pairs: Pairs) -> list[str]:
    """Each sentence of the pairs once, in first-seen order (what gets embedded)."""
    return list(dict.fromkeys(pairs.left + pairs.right))


def sts_spearman(embedder, pairs: Pairs) -> dict:
    """Spearman ρ between cos(embed(s1), embed(s2)) and the gold scores; each sentence embedded once.

    STS is symmetric (neither sentence is a query), so both read the document template (``embed``'s
    default role), also with an asymmetric embedder's ``query_prompt``.
    """
    unique = unique_sentences(pairs)
    return spearman_of_embeddings(embedder.embed(unique), pairs)


def spearman_of_embeddings(emb: np.ndarray, pairs: Pairs) -> dict:
    """As :func:`sts_spearman`, from the embeddings of :func:`unique_sentences` (row i = sentence i)."""
    from scipy.stats import spearmanr

    unique = unique_sentences(pairs)
    where = {s: i for i, s in enumerate(unique)}
    emb = np.asarray(emb, dtype=np.float64)
    emb = emb / np.maximum(np.linalg.norm(emb, axis=1, keepdims=True), 1e-12)
    a = emb[[where[s] for s in pairs.left]]
    b = emb[[where[s] for s in pairs.right]]
    cos = (a * b).sum(1)
    rho = spearmanr(cos, pairs.scores).statistic
    return {"spearman": float(rho), "n_pairs": len(pairs.scores), "n_sentences": len(unique)}
