"""Training texts from corpora: any corpus the indexer reads (BEIR folder, JSONL, TSV).

Text2Token is unsupervised: only documents are read, never queries or relevance judgments.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np

from indexer.corpus import CorpusSpec


def corpus_texts(
    paths: Sequence[str | Path], fmt: str | None = None, max_texts: int | None = None, seed: int = 0
) -> tuple[list[str], dict]:
    """Document texts of one or more corpora, concatenated (the corpus D of Eq. 12).

    max_texts: keep a seeded random sample of that many (in corpus order). Returns the texts
    and a description for the adapter's record.
    """
    texts: list[str] = []
    described = []
    for p in paths:
        spec = CorpusSpec(Path(p), fmt)
        before = len(texts)
        texts.extend(doc.text for doc in spec)
        described.append(spec.describe() | {"n_docs": len(texts) - before})
    n_all = len(texts)
    if max_texts is not None and max_texts < n_all:
        keep = np.sort(np.random.default_rng([seed, 0x7E47]).choice(n_all, size=max_texts, replace=False))
        texts = [texts[i] for i in keep]
    return texts, {"corpora": described, "n_available": n_all, "max_texts": max_texts}
