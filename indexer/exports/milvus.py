"""Export an index into a Milvus collection: the serving engine beyond one machine.

One row per document: ``id`` (the index's doc number, INT64 primary key), ``doc_id``
(VARCHAR), and a field per exported channel (the channel table's rows with ``milvus``,
indexer/channels.py, named by ``milvus_field``): ``sparse`` (its aligned-token vector, token id -> logit, SPARSE_FLOAT_VECTOR),
``dense`` (its normalised pooled embedding, FLOAT_VECTOR, when the index has the dense
channel) and ``bm25`` (its BM25 term weights, term id -> the weight the lexical postings
hold, when the index has the lexical channel). Inner product over those fields is exactly
what the Numba and FAISS indexes compute, so Milvus answers sparse, dense and bm25 searches
with the same scores (retriever/backends/milvus.py).

The same code talks to Milvus Lite (``uri`` = a local path, the default in tests) and to a
Milvus server (``uri`` = ``http://host:19530``): only the URI changes.

Writing is all-or-nothing: rows go into ``<name>__building`` and the collection is renamed to
``<name>`` only when every row is in and flushed; an export killed half-way leaves only the
``__building`` collection, which the next export drops. What the export holds (format
version, model, document-id checksum, channels, index settings) is stored as the collection
property ``aligned_tokens_export`` (JSON), so a reader can refuse a collection made from
another index.

Index settings: ``exact=True`` (the default) is SPARSE_INVERTED_INDEX with TAAT_NAIVE and no
dropped postings, and a FLAT dense index: the same top-k as the Numba/FAISS index up to
ties. ``exact=False`` asks for approximate indexes: sparse DAAT_MAXSCORE (a Milvus server's
WAND-family algorithm) and HNSW (M=32, efConstruction=200) for dense. Milvus Lite 3.2 builds
HNSW but accepts and ignores the sparse algorithm (its index description keeps no
parameters): its sparse search stays exact.
"""
from __future__ import annotations

import contextlib
import json
import logging
import os
import re
import time
from collections.abc import Iterator
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import numpy as np
from tqdm.auto import tqdm

from embedder.util import file_sha256
from indexer.channels import CHANNEL_SPECS, SPARSE, ChannelSpec
from indexer.integrity import check_doc_ids
from indexer.manifest import DOC_IDS, IndexFormatError, Manifest

EXPORT_FORMAT = "aligned-tokens-milvus"
EXPORT_VERSION = 1
EXPORT_PROPERTY = "aligned_tokens_export"
BUILDING_SUFFIX = "__building"
MAX_DOC_ID_CHARS = 1024  # VARCHAR max_length for doc ids; longer ids are refused, not cut
DEFAULT_BATCH = 1000
HNSW_PARAMS = {"M": 32, "efConstruction": 200}


class MilvusExportError(RuntimeError):
    """The export could not be written (Milvus missing, refused, or an existing collection)."""


def default_collection(index_dir: str | Path) -> str:
    """The collection name used when none is given: ``at_`` + the index directory's name,
    with every character Milvus does not allow in a name (letters, digits, _) replaced by _."""
    # the name as given, made absolute but not resolved: an index is a link to its current
    # generation (.NAME.gen-N, indexer/generations.py), whose name changes with every rebuild
    return "at_" + re.sub(r"[^A-Za-z0-9_]", "_", Path(os.path.abspath(index_dir)).name)


def connect(uri: str):
    """A ``pymilvus.MilvusClient`` for ``uri`` (a Milvus Lite path or a server address)."""
    try:
        from pymilvus import MilvusClient
    except ImportError as exc:
        raise MilvusExportError("pymilvus is not installed: pip install 'pymilvus[milvus-lite]' (or pip install -e '.[milvus]')") from exc
    if "://" not in uri:
        Path(uri).parent.mkdir(parents=True, exist_ok=True)  # Milvus Lite creates the file, not its folder
    return MilvusClient(uri)


@contextlib.contextmanager
def _quiet_lite_server() -> Iterator[None]:
    """pymilvus asks the server for a timestamp while waiting for an index; Milvus Lite's
    embedded gRPC server does not implement that call and logs a traceback at ERROR level
    for it (the wait then proceeds without it). Nothing is wrong: keep that log quiet."""
    log = logging.getLogger("grpc._server")
    level = log.level
    log.setLevel(logging.CRITICAL)
    try:
        yield
    finally:
        log.setLevel(level)


def _sparse_rows(indptr: np.ndarray, cols: np.ndarray, vals: np.ndarray, lo: int, hi: int) -> list[dict[int, float]]:
    """Rows lo..hi of a CSR matrix as {column: value} dicts (what pymilvus takes)."""
    out = []
    for r in range(lo, hi):
        a, b = int(indptr[r]), int(indptr[r + 1])
        out.append(dict(zip(cols[a:b].tolist(), vals[a:b].tolist())))
    return out


def _channel_vectors(row: ChannelSpec, index_dir: Path, manifest: Manifest) -> Any:
    """The channel ``row``'s document vectors, as its reader opens them (indexer/channels.py): a
    sparse channel's CSR doc vectors (indptr, indices, data), a dense channel's (normalised)
    vectors read back from its FAISS index; None where the index lacks it."""
    opened = row.open(index_dir, manifest)
    if opened is None:
        return None
    if row.query_kind == "sparse":
        return getattr(opened, "postings", opened).doc_vectors()  # BM25 keeps its postings under .postings
    try:
        return opened.index.reconstruct_n(0, opened.index.ntotal)
    except RuntimeError as exc:  # e.g. an IVF kind without direct map
        kind = (row.record(manifest) or {}).get("kind")
        raise MilvusExportError(f"{index_dir}: the {row.mode} index ({kind}) cannot give its vectors back: {exc}") from None


def _batches(n: int, size: int) -> Iterator[tuple[int, int]]:
    for lo in range(0, n, size):
        yield lo, min(n, lo + size)


def export_info(manifest: Manifest, index_dir: Path, channels: list[str], exact: bool) -> dict[str, Any]:
    """What the collection property records: enough to refuse a collection made from another index."""
    return {
        "format": EXPORT_FORMAT,
        "format_version": EXPORT_VERSION,
        "model": manifest.model,
        "adapter": manifest.adapter,
        "n_docs": manifest.n_docs,
        "doc_ids_sha256": file_sha256(index_dir / DOC_IDS),
        "channels": channels,
        "exact": exact,
        "lexical": manifest.record("bm25"),
        "created": datetime.now(timezone.utc).isoformat(timespec="seconds"),
    }


def export_milvus(
    index_dir: str | Path,
    uri: str,
    collection: str | None = None,
    exact: bool = True,
    batch_size: int = DEFAULT_BATCH,
    overwrite: bool = False,
    progress: bool = True,
) -> dict[str, Any]:
    """Write the index at ``index_dir`` into the Milvus collection ``collection`` at ``uri``.

    Returns what was recorded in the collection property plus timings. An existing collection
    of that name is refused unless ``overwrite``; it is replaced only once the new one is complete.
    """
    index_dir = Path(index_dir)
    manifest = Manifest.read(index_dir)
    if SPARSE.record(manifest) is None:
        raise MilvusExportError(f"{index_dir}: holds no aligned tokens (built without the sparse channel); the export's collection needs them")
    if batch_size < 1:
        raise ValueError(f"batch_size must be positive, not {batch_size}")
    name = collection or default_collection(index_dir)
    doc_ids = check_doc_ids(index_dir / DOC_IDS, manifest.n_docs)
    longest = max((len(d.encode("utf-8")) for d in doc_ids), default=0)
    if longest > MAX_DOC_ID_CHARS:
        raise MilvusExportError(f"{index_dir / DOC_IDS}: a document id is {longest} bytes long; Milvus VARCHAR here holds {MAX_DOC_ID_CHARS}")
    client = connect(uri)
    if client.has_collection(name) and not overwrite:
        raise MilvusExportError(f"{uri}: collection {name!r} exists; pass overwrite=True (--overwrite) to replace it")

    start = time.perf_counter()
    # each exported channel's vectors (the rows with ``milvus``), under its field
    vectors = {row.milvus_field: v for row in CHANNEL_SPECS if row.milvus for v in [_channel_vectors(row, index_dir, manifest)] if v is not None}
    kinds = {row.milvus_field: row.query_kind for row in CHANNEL_SPECS if row.milvus_field in vectors}
    channels = [row.mode for row in CHANNEL_SPECS if row.milvus_field in vectors]

    from pymilvus import DataType, MilvusClient

    schema = MilvusClient.create_schema(auto_id=False, enable_dynamic_field=False)
    schema.add_field("id", DataType.INT64, is_primary=True)
    schema.add_field("doc_id", DataType.VARCHAR, max_length=MAX_DOC_ID_CHARS)
    params = client.prepare_index_params()
    sparse_params = {"inverted_index_algo": "TAAT_NAIVE" if exact else "DAAT_MAXSCORE"}
    for field, kind in kinds.items():
        if kind == "sparse":
            schema.add_field(field, DataType.SPARSE_FLOAT_VECTOR)
            params.add_index(field, index_type="SPARSE_INVERTED_INDEX", metric_type="IP", params=sparse_params)
        else:
            schema.add_field(field, DataType.FLOAT_VECTOR, dim=int(vectors[field].shape[1]))
            params.add_index(field, index_type="FLAT" if exact else "HNSW", metric_type="IP", params={} if exact else HNSW_PARAMS)

    staging = name + BUILDING_SUFFIX
    if client.has_collection(staging):  # left by an export that died: never renamed, so never read
        client.drop_collection(staging)
    try:
        with _quiet_lite_server():
            client.create_collection(staging, schema=schema, index_params=params)
    except Exception as exc:  # noqa: BLE001 - pymilvus raises MilvusException with the server's reason, Milvus Lite also gRPC/OS errors
        raise MilvusExportError(f"{uri}: cannot create collection {staging!r}: {exc}") from None
    bar = tqdm(total=manifest.n_docs, unit="doc", desc=f"milvus {name}", disable=not progress)
    postings = 0
    for lo, hi in _batches(manifest.n_docs, batch_size):
        sparse_rows = {f: _sparse_rows(v.indptr, v.indices, v.data, lo, hi) for f, v in vectors.items() if kinds[f] == "sparse"}
        rows = []
        for j, doc in enumerate(range(lo, hi)):
            row: dict[str, Any] = {"id": doc, "doc_id": doc_ids[doc]}
            row |= {f: sparse_rows[f][j] if f in sparse_rows else v[doc] for f, v in vectors.items()}
            rows.append(row)
            postings += len(sparse_rows[SPARSE.milvus_field][j])
        client.insert(staging, rows)
        bar.update(hi - lo)
        bar.set_postfix(postings_per_s=f"{postings / max(time.perf_counter() - start, 1e-9):.0f}")
    bar.close()
    client.flush(staging)
    info = export_info(manifest, index_dir, channels, exact)
    info.update({"collection": name, "export_seconds": round(time.perf_counter() - start, 3), "postings": postings})
    client.alter_collection_properties(staging, properties={EXPORT_PROPERTY: json.dumps(info)})
    if client.has_collection(name):
        client.drop_collection(name)  # the only moment without a collection of that name
    client.rename_collection(staging, name)
    client.close()
    return info


def read_export_info(client, collection: str, uri: str = "") -> dict[str, Any]:
    """The export property of ``collection``, checked to be this engine's format and version."""
    if not client.has_collection(collection):
        raise IndexFormatError(f"{uri}: no collection {collection!r} (build-index --export-milvus {uri})")
    props = client.describe_collection(collection).get("properties") or {}
    raw = props.get(EXPORT_PROPERTY)
    if raw is None:
        raise IndexFormatError(f"{uri}: collection {collection!r} has no {EXPORT_PROPERTY} property: not written by this engine")
    try:
        info = json.loads(raw)
    except json.JSONDecodeError as exc:
        raise IndexFormatError(f"{uri}: collection {collection!r}: property {EXPORT_PROPERTY}: unreadable JSON ({exc})") from None
    if info.get("format") != EXPORT_FORMAT or info.get("format_version") != EXPORT_VERSION:
        raise IndexFormatError(
            f"{uri}: collection {collection!r}: format {info.get('format')!r} version {info.get('format_version')!r}, "
            f"this version reads {EXPORT_FORMAT!r} {EXPORT_VERSION}; export again"
        )
    return info


def check_export_matches(info: dict[str, Any], index_dir: Path, uri: str = "") -> None:
    """Refuse a collection made from another index (other documents or model)."""
    if info.get("doc_ids_sha256") != file_sha256(Path(index_dir) / DOC_IDS):
        raise IndexFormatError(f"{uri}: collection {info.get('collection')!r} was made from another index than {index_dir} (document ids differ)")
    manifest = Manifest.read(Path(index_dir))
    if (info.get("model") or {}).get("sha256") != manifest.model.get("sha256"):
        raise IndexFormatError(f"{uri}: collection {info.get('collection')!r} was made with another model than the index at {index_dir}")


def describe(info: dict[str, Any], uri: str) -> str:
    """One line summary of an export (for the command line)."""
    return (
        f"exported {info['n_docs']} documents ({info['postings']} aligned-token postings; channels {', '.join(info['channels'])}; "
        f"{'exact' if info['exact'] else 'approximate'} indexes) to Milvus collection {info['collection']!r} at {uri} "
        f"in {info['export_seconds']:.1f} s"
    )
