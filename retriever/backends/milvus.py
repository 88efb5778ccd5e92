"""Milvus backend: the sparse, dense and bm25 channels answered by a Milvus collection.

The collection is written by :func:`indexer.exports.milvus.export_milvus` (``build-index
--export-milvus URI``). ``uri`` is a Milvus Lite file (embedded, the same server code) or a
server address (``http://host:19530``): nothing else changes. The collection's primary key
is the index's doc number, so hits need no mapping; explanations (matched tokens) read the
index's own postings, which hold the very weights the collection holds.

Hybrid search is fused by the Retriever like every other backend's (min-max or RRF,
retriever/fusion.py), from each channel's top FUSION_DEPTH. :meth:`MilvusBackend.hybrid`
instead hands the per-channel requests to Milvus's own rankers (``WeightedRanker`` /
``RRFRanker``, ``Retriever(fusion={"method": "milvus-weighted" | "milvus-rrf", ...})``); how
their rankings differ from ours is measured in BENCHMARKS.md ("Milvus backend").
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from indexer.channels import CHANNEL_SPECS, spec
from indexer.dense import normalise
from indexer.exports.milvus import check_export_matches, connect, default_collection, read_export_info
from indexer.manifest import IndexFormatError, Manifest

MILVUS_FUSION_METHODS = ("milvus-weighted", "milvus-rrf")
_FIELDS = {s.mode: s.milvus_field for s in CHANNEL_SPECS if s.milvus}  # channel -> collection field (the channel table's rows)


class MilvusBackend:
    """Search the Milvus collection exported from the index at ``index_dir``.

    ``search_params``: per-field Milvus search parameters for approximate indexes, e.g.
    ``{"dense": {"ef": 128}}``; exact indexes need none.
    """

    name = "milvus"
    explains_hits = False  # the collection holds the index's weights unchanged: its postings explain hits

    def __init__(
        self, index_dir: str | Path, manifest: Manifest, uri: str, collection: str | None = None, search_params: dict | None = None
    ) -> None:
        self.index_dir, self.uri = Path(index_dir), uri
        self.collection = collection or default_collection(self.index_dir)
        self.client = connect(uri)
        self.info = read_export_info(self.client, self.collection, uri)
        check_export_matches(self.info, self.index_dir, uri)
        if self.info.get("n_docs") != manifest.n_docs:
            raise IndexFormatError(f"{uri}: collection {self.collection!r} holds {self.info.get('n_docs')} documents, the index {manifest.n_docs}")
        self.channels = tuple(c for c in self.info["channels"] if c in _FIELDS)
        self.search_params = search_params or {}
        self.client.load_collection(self.collection)

    def _request_data(self, channel: str, query: Any) -> Any:
        if spec(channel).query_kind == "sparse":  # ids and weights
            ids, weights = query
            vec: dict[int, float] = {}
            for t, w in zip(np.asarray(ids).tolist(), np.asarray(weights, np.float32).tolist()):
                vec[int(t)] = vec.get(int(t), 0.0) + float(w)  # a repeated token adds up, as in the Numba kernel
            return {t: w for t, w in vec.items() if w != 0.0}
        return normalise(np.asarray(query, np.float32)[None, :])[0].tolist()  # as DenseIndex does: cosine

    def _params(self, channel: str) -> dict:
        return {"metric_type": "IP", "params": dict(self.search_params.get(channel, {}))}

    def _search(self, channel: str, data: Any, k: int) -> tuple[np.ndarray, np.ndarray]:
        if channel not in self.channels:
            raise ValueError(f"{self.uri}: collection {self.collection!r} has no {channel!r} channel (it has {list(self.channels)})")
        docs = np.full(k, -1, np.int64)
        scores = np.full(k, -np.inf, np.float32)
        if isinstance(data, dict) and not data:
            return docs, scores  # no known query token: no hits, as the Numba index answers
        hits = self.client.search(
            self.collection, data=[data], anns_field=_FIELDS[channel], limit=int(k), search_params=self._params(channel), output_fields=["id"]
        )[0]
        for i, h in enumerate(hits):
            docs[i], scores[i] = int(h["id"]), float(h["distance"])
        return docs, scores

    # ------------------------------------------------------------------ the Backend interface
    def search_sparse(self, channel: str, ids: np.ndarray, weights: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
        return self._search(channel, self._request_data(channel, (ids, weights)), k)

    def search_dense(self, channel: str, vector: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
        return self._search(channel, self._request_data(channel, vector), k)

    def contributions(self, channel: str, ids: np.ndarray, doc: int) -> np.ndarray:
        raise NotImplementedError("explanations are read from the index's own postings (Routed falls back to them)")

    # ------------------------------------------------------------------ Milvus's own fusion
    def hybrid(
        self, queries: dict[str, Any], weights: dict[str, float], k: int, method: str, depth: int, rrf_k: int = 60, norm_score: bool = True
    ) -> tuple[np.ndarray, np.ndarray]:
        """Fuse inside Milvus: one ``hybrid_search`` with a request per channel (``queries``:
        channel -> (ids, weights) for sparse channels, a vector for dense ones), each taking its
        top ``depth``, then ``WeightedRanker(weights, norm_score=norm_score)`` or ``RRFRanker(rrf_k)``.

        How that differs from our min-max (retriever/fusion.py): with ``norm_score`` (pymilvus's
        default) Milvus maps every IP score s to 0.5 + arctan(s)/pi, per score, not per list.
        Our sparse scores (sums of IDF x logit, in the thousands) sit where arctan is flat, and
        the dense cosines (0.7-0.9) and BM25 scores (units to tens) keep only a few hundredths of
        [0, 1] over a top-100 (benchmarks/milvus_rankers.py measures it per collection), so a
        document's fused score is mostly the sum of the weights of the channels that returned it.
        Without ``norm_score`` raw scores are summed and the sparse channel's scale dominates.
        RRF uses ranks only."""
        from pymilvus import AnnSearchRequest, RRFRanker, WeightedRanker

        if method not in MILVUS_FUSION_METHODS:
            raise ValueError(f"method must be one of {MILVUS_FUSION_METHODS}, not {method!r}")
        used = [c for c in queries if weights.get(c, 0) > 0]
        reqs, ws = [], []
        for c in used:
            data = self._request_data(c, queries[c])
            if isinstance(data, dict) and not data:
                continue
            reqs.append(AnnSearchRequest([data], _FIELDS[c], self._params(c), int(depth)))
            ws.append(float(weights[c]))
        docs = np.full(k, -1, np.int64)
        scores = np.full(k, -np.inf, np.float32)
        if not reqs:
            return docs, scores
        ranker = WeightedRanker(*ws, norm_score=norm_score) if method == "milvus-weighted" else RRFRanker(rrf_k)
        hits = self.client.hybrid_search(self.collection, reqs, ranker, limit=int(k), output_fields=["id"])[0]
        for i, h in enumerate(hits):
            docs[i], scores[i] = int(h["id"]), float(h["distance"])
        return docs, scores

    def close(self) -> None:
        self.client.close()
