"""``verify-index``: check every file of an index (or of a Pyserini export) and say what is wrong.

Three layers, cheapest first, as Lucene's CheckIndex does:
1. the manifest parses, has the fields the loaders need, and matches its own checksum;
2. every recorded file exists with its recorded size and checksum;
3. every channel opens with its structural checks (the ones ``Retriever.load`` always runs).

Each channel is opened through :data:`CHANNELS`, its row's reader in the channel table
(indexer/channels.py), the same the Retriever opens channels with, so a new channel (one row there)
is validated on load and verified here alike.
The command line is indexer/verify_cli.py (``verify-index``): exit status 0 clean, 1 damaged,
2 not an index.
"""
from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from indexer.channels import ANALYZERS, CHANNEL_SPECS
from indexer.generations import dangling, open_generation
from indexer.integrity import (
    check_doc_ids,
    checksum_problems,
    manifest_checksum_problem,
    read_json,
    size_problems,
)
from indexer.manifest import DOC_IDS, MANIFEST, IndexFormatError, Manifest
from indexer.stored_documents import StoredDocuments

# indexer.exports.lucene.EXPORT_MANIFEST; not imported from there, which would pull in torch
EXPORT_MANIFEST = "export.json"

# A channel opener loads one channel of an index, checked against the manifest, or returns None
# when the manifest says the index was built without it. It raises IndexFormatError.
ChannelOpener = Callable[[Path, Manifest, bool], Any]

# keyed by search mode: each row of the channel table (indexer/channels.py) opened by its reader
CHANNELS: dict[str, ChannelOpener] = {s.mode: s.open for s in CHANNEL_SPECS}


def open_channels(index_dir: Path, manifest: Manifest, mmap: bool = True) -> dict[str, Any]:
    """Every channel the index holds, opened and checked: ``{mode: channel}``."""
    opened = {name: opener(Path(index_dir), manifest, mmap) for name, opener in CHANNELS.items()}
    return {name: ch for name, ch in opened.items() if ch is not None}


@dataclass
class Report:
    """What :func:`verify` found: ``problems`` (damage, one line each) and ``notes``."""

    path: Path
    kind: str  # "index" or "export"
    problems: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    n_files: int = 0

    @property
    def ok(self) -> bool:
        return not self.problems


class NotAnIndex(IndexFormatError):
    """The path is neither an index nor a Pyserini export."""


def verify(path: str | Path) -> Report:
    """Check everything under ``path`` (an index directory or a Pyserini export). An index is
    checked in the generation ``path`` points at when called (indexer/generations.py), held
    for the whole check, so that a build publishing meanwhile does not make a healthy index
    look damaged."""
    path = Path(path)
    if (missing := dangling(path)) is not None:
        raise NotAnIndex(f"{path}: the index is dangling: its generation {missing} is missing; rebuild it with --overwrite")
    if not path.is_dir():
        raise NotAnIndex(f"{path}: not a directory")
    try:
        gen = open_generation(path)
    except OSError as exc:
        raise NotAnIndex(f"{path}: {exc.strerror or exc}") from None
    with gen:
        if os.path.lexists(gen.path / MANIFEST):
            report = verify_index(gen.path)
            # files named by the path given, not the generation held
            given = (lambda m: m.replace(str(gen.path), str(path))) if str(gen.path) != str(path) else (lambda m: m)
            report.problems = [given(p) for p in report.problems]
            report.notes = [given(n) for n in report.notes]
            report.path = path
            return report
    if os.path.lexists(path / EXPORT_MANIFEST):
        return verify_export(path)
    raise NotAnIndex(f"{path}: not an index (no {MANIFEST}) nor a Pyserini export (no {EXPORT_MANIFEST})")


def verify_index(index_dir: Path) -> Report:
    report = Report(Path(index_dir), "index")
    try:
        manifest = Manifest.read(index_dir)
        problem = manifest_checksum_problem(index_dir)
    except IndexFormatError as exc:
        report.problems.append(str(exc))
        return report  # without a manifest nothing else can be checked against anything
    if problem:
        report.problems.append(problem)
    if manifest.checksum is None:
        report.notes.append(f"{index_dir / MANIFEST}: no checksum of its own recorded")
    if manifest.files is None:
        report.notes.append(f"{index_dir}: no checksums recorded (built before checksums existed); structure checked only")
    else:
        report.n_files = len(manifest.files)
        report.problems += _file_problems(Path(index_dir), manifest.files)
    # a file whose size or checksum is wrong is said once: its structural problems (a flipped byte
    # that no longer decodes, say) would name it again, on a second line, for the same damage
    damaged = {p.split(": ", 1)[0] for p in report.problems}
    limit = ((manifest.files or {}).get(DOC_IDS) or {}).get("size")  # read no more than recorded (the size check said where it differs)
    checks: dict[str, Callable[[], Any]] = {DOC_IDS: lambda: check_doc_ids(Path(index_dir) / DOC_IDS, manifest.n_docs, limit)}
    checks.update({name: (lambda o=opener: o(Path(index_dir), manifest, True)) for name, opener in CHANNELS.items()})
    checks["documents"] = lambda: check_stored_documents(Path(index_dir), manifest)
    for check in checks.values():
        try:
            check()
        except IndexFormatError as exc:
            if str(exc) not in report.problems and str(exc).split(": ", 1)[0] not in damaged:
                report.problems.append(str(exc))
    return report


def check_stored_documents(index_dir: Path, manifest: Manifest) -> None:
    """The stored documents parse, one per document, in the order of the doc ids
    (indexer/stored_documents.py); IndexFormatError naming the line otherwise."""
    if manifest.documents is None:
        return
    stored = StoredDocuments.open(index_dir, manifest.n_docs)
    ids = check_doc_ids(index_dir / DOC_IDS, manifest.n_docs, ((manifest.files or {}).get(DOC_IDS) or {}).get("size"))
    for i, doc_id in enumerate(ids):
        if stored.record(i)["_id"] != doc_id:
            raise IndexFormatError(f"{stored.path}:{i + 1}: id {stored.record(i)['_id']!r}, {DOC_IDS} has {doc_id!r} there")


def verify_export(export_dir: Path) -> Report:
    """A Pyserini export: its ``export.json`` records the size and checksum of every file."""
    report = Report(Path(export_dir), "export")
    try:
        info = read_json(Path(export_dir) / EXPORT_MANIFEST)
    except IndexFormatError as exc:
        report.problems.append(str(exc))
        return report
    files = info.get("files") if isinstance(info, dict) else None
    if not isinstance(info, dict):
        report.problems.append(f"{Path(export_dir) / EXPORT_MANIFEST}: not a JSON object")
    elif files is None:
        report.notes.append(f"{export_dir}: no checksums recorded (exported before checksums existed)")
    else:
        report.n_files = len(files)
        report.problems += _file_problems(Path(export_dir), files)
    return report


def _file_problems(directory: Path, files: dict[str, dict]) -> list[str]:
    """Size problems, then checksum problems of the files whose size is right (one line per file)."""
    damaged = size_problems(directory, files)
    sized = {rel: rec for rel, rec in files.items() if (directory / rel).is_file() and (directory / rel).stat().st_size == rec.get("size")}
    return damaged + checksum_problems(directory, sized)


__all__ = ["ANALYZERS", "CHANNELS", "EXPORT_MANIFEST", "ChannelOpener", "NotAnIndex", "Report", "check_stored_documents", "open_channels", "verify",
           "verify_export", "verify_index"]
