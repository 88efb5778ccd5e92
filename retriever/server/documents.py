"""Titles and snippets for hits: from the documents the index stores, else from its corpus.

An index stores its documents (indexer/stored_documents.py); one built before that did not,
and then the corpus the index's manifest names is read (or the one given to ``serve --corpus``).
Where it cannot be read (moved, deleted), the server still answers, with ids and scores only,
and /info says why there are no snippets.
"""
from __future__ import annotations

import io
import json
import os
import re
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from indexer.corpus import CorpusError, CorpusSpec, join_title, open_corpus_file
from indexer.manifest import IndexFormatError, Manifest
from indexer.stored_documents import StoredDocuments

SNIPPET_CHARS = 280
LEAD_CHARS = 60  # text kept before the first matched word


@dataclass
class Documents:
    """Each indexed document's title (or None) and text (title included, as it was embedded)."""

    titles: dict[str, str | None]
    texts: dict[str, str]
    source: str

    @classmethod
    def from_corpus(cls, path: Path, fmt: str | None, doc_ids: Iterable[str]) -> Documents:
        """Read the corpus at ``path``; keep the documents of ``doc_ids``. CorpusError / OSError
        when it cannot be read."""
        wanted = set(doc_ids)
        spec = CorpusSpec(Path(path), fmt)
        texts = {d.doc_id: d.text for d in spec if d.doc_id in wanted}
        titles: dict[str, str | None] = dict.fromkeys(texts)
        if spec.fmt in ("beir", "jsonl"):  # CorpusSpec joins title and text; the title alone is read here
            with io.TextIOWrapper(open_corpus_file(spec.file), encoding="utf-8") as f:
                for line in f:
                    obj = json.loads(line) if line.strip() else None
                    if isinstance(obj, dict):
                        doc_id = str(obj.get("_id", obj.get("id")))
                        if doc_id in titles and isinstance(obj.get("title"), str) and obj["title"].strip():
                            titles[doc_id] = obj["title"].strip()
        return cls(titles, texts, str(spec.file))

    @classmethod
    def for_index(cls, index_dir: Path, manifest: Manifest, doc_ids: list[str], corpus: Path | None = None) -> tuple[Documents | None, str]:
        """The index's documents and a note for /info: from ``corpus`` when given, else from
        the path its manifest records (as given to build-index: absolute, or relative to the
        directory it was built from, tried from here and from beside the index)."""
        if corpus is None and manifest.documents is not None:
            docs = cls.from_index(index_dir, manifest, doc_ids)
            if docs is not None:
                return docs, f"snippets from the documents the index stores ({len(docs.texts)} documents)"
        recorded = manifest.corpus.get("path")
        candidates = [Path(corpus)] if corpus else [Path(recorded), Path(index_dir).parent / recorded] if recorded else []
        if not candidates:
            return None, "no snippets: the manifest names no corpus (serve --corpus PATH)"
        problems = []
        for path in candidates:
            try:
                docs = cls.from_corpus(path, None if corpus else manifest.corpus.get("format"), doc_ids)
            except (CorpusError, OSError, ValueError) as exc:
                problems.append(str(exc))
                continue
            return docs, f"snippets from {docs.source} ({len(docs.texts)} of {len(doc_ids)} documents)"
        return None, "no snippets: " + "; ".join(dict.fromkeys(problems)) + " (serve --corpus PATH)"

    @classmethod
    def from_index(cls, index_dir: Path, manifest: Manifest, doc_ids: list[str]) -> Documents | None:
        """The documents the index stores (indexer/stored_documents.py); None where they cannot
        be read or are not those of ``doc_ids`` (the index was replaced meanwhile)."""
        try:
            stored = StoredDocuments.open(Path(os.path.realpath(index_dir)), manifest.n_docs)
            records = [stored.record(i) for i in range(len(stored))]
        except (IndexFormatError, OSError):
            return None
        if [r["_id"] for r in records] != list(doc_ids):
            return None
        texts = {r["_id"]: join_title(r.get("title"), r["text"]) for r in records}
        titles = {r["_id"]: (r.get("title") or "").strip() or None for r in records}
        return cls(titles, texts, str(stored.path))

    def snippet(self, doc_id: str, words: Iterable[str]) -> str | None:
        """About :data:`SNIPPET_CHARS` of the text, starting a little before the first matched
        word (the start of the text when none is found)."""
        text = self.texts.get(doc_id)
        if text is None:
            return None
        start = first_match(text, words)
        start = 0 if start is None else max(0, text.rfind(" ", 0, max(0, start - LEAD_CHARS)) + 1)
        end = start + SNIPPET_CHARS
        if end < len(text):
            cut = text.rfind(" ", start, end)
            end = cut if cut > start else end
        return ("…" if start else "") + text[start:end] + ("…" if end < len(text) else "")


def first_match(text: str, words: Iterable[str]) -> int | None:
    """Offset of the earliest occurrence of any of ``words`` at a word start (case-insensitive)."""
    spelled = sorted({w for w in words if w}, key=len, reverse=True)
    if not spelled:
        return None
    m = re.search(r"(?<!\w)(?:" + "|".join(re.escape(w) for w in spelled) + ")", text, re.IGNORECASE)
    return m.start() if m else None


def display_words(matched: Iterable[str]) -> list[str]:
    """The words of ``Hit.matched_tokens`` worth highlighting: channel prefixes removed;
    fragments (``…ellig``, ``Schu…``: parts of words) and grouped symbols left out."""
    out = []
    for key in matched:
        word = key.split(":", 1)[1] if key.startswith("bm25:") else key
        if word and "…" not in word and not word.startswith("(") and word.lower() not in (w.lower() for w in out):
            out.append(word)
    return out
