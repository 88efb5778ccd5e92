"""``Retriever``: the Python entry point. Load an index, search it with text queries."""
from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Sequence

import numpy as np

from embedder.encoder import Embedder, EmbedderConfig
from indexer.build import DOC_IDS
from indexer.dense import DenseIndex
from indexer.inverted_index import InvertedIndex
from indexer.manifest import IndexFormatError, Manifest
from retriever.query import DEFAULT_EXPANSION_M, EncodedQuery, encode_queries

MODES = ("sparse", "dense")


@dataclass
class Hit:
    """One search result. ``matched_tokens`` maps each matched token to its contribution
    to the score (empty for dense hits), largest first."""

    doc_id: str
    score: float
    matched_tokens: dict[str, float] = field(default_factory=dict)


class Retriever:
    """Searches an index built by ``build-index``.

    >>> r = Retriever.load("my-index")             # doctest: +SKIP
    >>> r.search("how do parrots get sick?", k=5)  # doctest: +SKIP
    """

    def __init__(
        self,
        index_dir: Path,
        manifest: Manifest,
        embedder: Embedder,
        expansion_m: int = DEFAULT_EXPANSION_M,
        literal: str = "both",
        mmap: bool = True,
    ) -> None:
        self.index_dir = Path(index_dir)
        self.manifest = manifest
        self.embedder = embedder
        self.expansion_m = expansion_m
        self.literal = literal
        self.doc_ids: list[str] = json.loads((self.index_dir / DOC_IDS).read_text(encoding="utf-8"))
        if len(self.doc_ids) != manifest.n_docs:
            raise IndexFormatError(f"{self.index_dir / DOC_IDS}: {len(self.doc_ids)} ids, manifest says {manifest.n_docs}")
        self.sparse = InvertedIndex.load(self.index_dir, manifest.n_docs, mmap=mmap)
        self.dense = DenseIndex.load(self.index_dir) if manifest.dense else None

    @classmethod
    def load(
        cls,
        index_dir: str | os.PathLike[str],
        model: str | None = None,
        embedder: Embedder | None = None,
        device: str | None = None,
        **kwargs,
    ) -> "Retriever":
        """Open an index and load the embedder its manifest names (or check the given one).

        ``model``: when given, must be the model the index was built with (by name or path);
        an index built with another model or adapter is refused.
        """
        index_dir = Path(index_dir)
        manifest = Manifest.read(index_dir)
        if embedder is None:
            config = EmbedderConfig(**manifest.embedding)
            adapter = (manifest.adapter or {}).get("path", "none")
            embedder = Embedder.load(model or manifest.model["name"], adapter=adapter, config=config, device=device)
        manifest.check_model(embedder.identity, embedder.adapter)
        return cls(index_dir, manifest, embedder, **kwargs)

    # ------------------------------------------------------------------ search
    def encode(self, queries: Sequence[str]) -> list[EncodedQuery]:
        """Encode queries once (e.g. to time search alone, or to reuse across modes)."""
        return encode_queries(self.embedder, queries, self.expansion_m, self.literal)

    def search(self, query: str, k: int = 10, mode: str = "sparse") -> list[Hit]:
        """Top-k hits for one query."""
        return self.batch_search([query], k=k, mode=mode)[0]

    def batch_search(self, queries: Sequence[str], k: int = 10, mode: str = "sparse") -> list[list[Hit]]:
        """Top-k hits for each query."""
        return self.search_encoded(self.encode(queries), k=k, mode=mode)

    def search_encoded(self, encoded: Sequence[EncodedQuery], k: int = 10, mode: str = "sparse") -> list[list[Hit]]:
        """Search pre-encoded queries (see :meth:`encode`)."""
        if mode not in MODES:
            raise ValueError(f"mode must be one of {MODES}, not {mode!r}")
        if mode == "dense":
            return self._dense(encoded, k)
        docs, scores = self.sparse.batch_search([(q.tokens, q.weights) for q in encoded], k)
        return [self._explain(q, d, s) for q, d, s in zip(encoded, docs, scores)]

    def _dense(self, encoded: Sequence[EncodedQuery], k: int) -> list[list[Hit]]:
        if self.dense is None:
            raise ValueError(f"{self.index_dir}: no dense vectors stored (build with --dense)")
        docs, scores = self.dense.search(np.stack([q.embedding for q in encoded]), k)
        return [[Hit(self.doc_ids[d], float(s)) for d, s in zip(row_d, row_s) if d >= 0] for row_d, row_s in zip(docs, scores)]

    def _explain(self, q: EncodedQuery, docs: np.ndarray, scores: np.ndarray) -> list[Hit]:
        hits = []
        for d, s in zip(docs, scores):
            if d < 0:
                break
            contrib = self.sparse.contributions(q.tokens, int(d)) * q.weights
            nz = np.flatnonzero(contrib)
            nz = nz[np.argsort(-contrib[nz], kind="stable")]
            names = self.embedder.token_strings(q.tokens[nz])
            hits.append(Hit(self.doc_ids[d], float(s), {n: float(contrib[j]) for n, j in zip(names, nz)}))
        return hits
