"""The documents an index stores: what makes it updatable, filterable and self-contained.

An index keeps each document as it was given (id, title, body, metadata), one JSON object per
line in doc-number order (``documents.jsonl``), with the byte offset of every line
(``documents_offsets.npy``, n + 1 int64) so that any document is read in one seek. This is
Lucene's stored fields, Elasticsearch's ``_source``: with it an update re-derives the
corpus-wide channels (BM25's idf and average length) from the index alone
(indexer/updates.py), the server shows snippets without the original corpus file, and hits
can be filtered by metadata. Indexes built before it existed still load and search; they
cannot be updated in place (the message says to rebuild).
"""
from __future__ import annotations

import json
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from indexer.corpus import CorpusError, Document, join_title, metadata_problem
from indexer.diskspace import save_npy, write_bytes
from indexer.errors import IndexFormatError
from indexer.integrity import load_npy
from indexer.regular_files import read_regular

DOCUMENTS_FILE = "documents.jsonl"
OFFSETS_FILE = "documents_offsets.npy"


def _record(doc: Document) -> dict:
    out: dict = {"_id": doc.doc_id}
    if doc.title:
        out["title"] = doc.title
    out["text"] = doc.body if doc.body is not None else doc.text
    if doc.metadata:
        out["metadata"] = doc.metadata
    return out


def stored_line(doc: Document, where: str | Path = "documents", number: int | None = None) -> bytes:
    """``doc`` as its line of ``documents.jsonl``: strict JSON (CorpusError naming ``where``, the
    document and the field where its metadata holds NaN, Infinity or anything else JSON cannot)."""
    problem = metadata_problem(doc.metadata)
    if problem is not None:
        raise CorpusError(where, number, problem[0], f"document {doc.doc_id!r}: {problem[1]}")
    try:
        return (json.dumps(_record(doc), ensure_ascii=False, separators=(",", ":"), allow_nan=False) + "\n").encode("utf-8")
    except (TypeError, ValueError, RecursionError, UnicodeEncodeError) as exc:  # what metadata_problem does not see (a lone surrogate)
        raise CorpusError(where, number, None, f"document {doc.doc_id!r}: cannot be stored as JSON ({type(exc).__name__}: {exc})") from None


# A metadata field's type, from the values the documents hold in it (a list's elements are its values;
# None is no value): filters (retriever/filters.py) check a condition's values against it.
KINDS = ("boolean", "number", "string", "object")


def value_kind(value: object) -> str | None:
    """The kind of one metadata value as :data:`KINDS` names it (None for null)."""
    if value is None:
        return None
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, (int, float)):
        return "number"
    if isinstance(value, str):
        return "string"
    return "object"  # an object, or a list within a list


def field_kinds(metadata: Iterable[dict | None]) -> dict[str, list[str]]:
    """``{field: sorted kinds of its values}`` over every document's metadata: the index's metadata
    schema (a field of one kind holds ``[kind]``; one of several, each; one of nulls only, ``[]``)."""
    kinds: dict[str, set[str]] = {}
    for m in metadata:
        for name, value in (m or {}).items():
            seen = kinds.setdefault(name, set())
            for v in value if isinstance(value, list) else (value,):
                kind = value_kind(v)
                if kind is not None:
                    seen.add(kind)
    return {name: sorted(seen) for name, seen in sorted(kinds.items())}


def write_documents(directory: Path, docs: Iterable[Document]) -> dict:
    """Write ``docs`` (in doc-number order) into ``directory``; returns the manifest's record:
    ``{"file", "n_docs", "metadata_fields", "metadata_types"}`` (the metadata fields any document has,
    sorted, and each one's kinds of values, :func:`field_kinds`). Every line is strict JSON
    (:func:`stored_line`)."""
    offsets = [0]
    parts: list[bytes] = []
    metadata: list[dict | None] = []
    for number, doc in enumerate(docs, start=1):
        line = stored_line(doc, "documents", number)
        parts.append(line)
        offsets.append(offsets[-1] + len(line))
        metadata.append(doc.metadata)
    write_bytes(Path(directory) / DOCUMENTS_FILE, b"".join(parts))
    save_npy(Path(directory) / OFFSETS_FILE, np.asarray(offsets, np.int64))
    types = field_kinds(metadata)
    return {"file": DOCUMENTS_FILE, "n_docs": len(offsets) - 1, "metadata_fields": sorted(types), "metadata_types": types}


@dataclass
class StoredDocuments:
    """Read access to an index's stored documents, by doc number."""

    path: Path
    offsets: np.ndarray
    data: bytes

    @classmethod
    def open(cls, directory: Path, n_docs: int) -> StoredDocuments:
        """The stored documents of the index in ``directory``; IndexFormatError naming the file
        when they are missing or do not match the index."""
        directory = Path(directory)
        path = directory / DOCUMENTS_FILE
        offsets = load_npy(directory / OFFSETS_FILE, "int64", 1, mmap=False)
        if len(offsets) != n_docs + 1:
            raise IndexFormatError(f"{directory / OFFSETS_FILE}: {len(offsets) - 1} documents, the index has {n_docs}")
        # a regular file of at most the size the offsets give it (a FIFO, a link to /dev/zero: an error at once)
        data = read_regular(path, max(int(offsets[-1]), 0))
        if offsets[0] != 0 or offsets[-1] != len(data) or np.any(np.diff(offsets) <= 0):
            raise IndexFormatError(f"{directory / OFFSETS_FILE}: offsets do not match {DOCUMENTS_FILE} ({len(data)} bytes)")
        return cls(path, offsets, data)

    def __len__(self) -> int:
        return len(self.offsets) - 1

    def record(self, number: int) -> dict:
        """Document ``number`` as stored: ``{"_id", "title"?, "text", "metadata"?}``."""
        raw = self.data[self.offsets[number]:self.offsets[number + 1]]
        try:
            obj = json.loads(raw)
        except (json.JSONDecodeError, UnicodeDecodeError, RecursionError):
            obj = None
        if not isinstance(obj, dict) or not isinstance(obj.get("_id"), str) or not isinstance(obj.get("text"), str):
            raise IndexFormatError(f"{self.path}:{number + 1}: not a stored document (damaged)")
        return obj

    def document(self, number: int) -> Document:
        """Document ``number`` as the corpus reader gave it (the same embedded text)."""
        obj = self.record(number)
        return Document(obj["_id"], join_title(obj.get("title"), obj["text"]), obj.get("title"), obj["text"], obj.get("metadata"))

    def __iter__(self) -> Iterator[Document]:
        return (self.document(i) for i in range(len(self)))


__all__ = ["DOCUMENTS_FILE", "KINDS", "OFFSETS_FILE", "StoredDocuments", "field_kinds", "stored_line", "value_kind", "write_documents"]
