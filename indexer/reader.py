"""Opening an index for reading: one generation, resolved once, held, every file checked.

What ``Retriever.load`` and ``verify-index`` read is one generation of the index
(indexer/generations.py): the manifest, the doc ids and every channel come from the
directory held, never from a path resolved again later, so a rebuild publishing meanwhile
can never mix two indexes. An old-layout index (files directly in the directory) is checked
after loading to still be the directory at that path; if a build replaced it during the
load, the load starts again on what replaced it.
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from indexer.generations import Generation, dangling, open_generation
from indexer.integrity import check_doc_ids, check_files
from indexer.manifest import DOC_IDS, IndexFormatError, Manifest
from indexer.verify import open_channels


@dataclass
class OpenedIndex:
    """An index opened from one held generation; :meth:`close` lets the generation go."""

    generation: Generation
    manifest: Manifest
    doc_ids: list[str]
    channels: dict[str, Any]

    @property
    def path(self) -> Path:
        """The directory its files were read from."""
        return self.generation.path

    def close(self) -> None:
        self.generation.close()


def hold(index_dir: str | os.PathLike[str]) -> Generation:
    """:func:`open_generation`, with a path that is no index directory as an IndexFormatError."""
    try:
        return open_generation(index_dir)
    except FileNotFoundError as exc:
        if dangling(index_dir) is not None:  # the link is there, what it names is not
            raise IndexFormatError(f"{index_dir}: {exc.strerror}") from None
        raise IndexFormatError(f"{index_dir}: not an index (no such directory)") from None
    except NotADirectoryError:
        raise IndexFormatError(f"{index_dir}: not an index (not a directory)") from None
    except OSError as exc:
        raise IndexFormatError(f"{index_dir}: {exc.strerror or exc}") from None


def as_given(message: str, held: Path, index_dir: str | os.PathLike[str]) -> str:
    """``message`` naming files by the path the user gave rather than the generation held
    (``index/postings_docs.npy``, not ``.index.gen-000003/postings_docs.npy``)."""
    return message.replace(str(held), os.fspath(index_dir)) if str(held) != os.fspath(index_dir) else message


def open_index(index_dir: str | os.PathLike[str], verify: bool = False, mmap: bool = True, attempts: int = 5) -> OpenedIndex:
    """Hold one generation of ``index_dir`` and open everything in it, checked (sizes always,
    checksums too with ``verify``); IndexFormatError naming the file otherwise."""
    for _ in range(attempts):
        gen = hold(index_dir)
        try:
            manifest = Manifest.read(gen.path)
            check_files(gen.path, manifest, checksums=verify)
            limit = ((manifest.files or {}).get(DOC_IDS) or {}).get("size")
            doc_ids = check_doc_ids(gen.path / DOC_IDS, manifest.n_docs, limit)
            channels = open_channels(gen.path, manifest, mmap=mmap)
        except IndexFormatError as exc:
            if gen.moved():  # an old-layout index replaced while it was read: read what replaced it
                gen.close()
                continue
            gen.close()
            raise IndexFormatError(as_given(str(exc), gen.path, index_dir)) from None
        except BaseException:
            gen.close()
            raise
        if gen.moved():
            gen.close()
            continue
        return OpenedIndex(gen, manifest, doc_ids, channels)
    raise IndexFormatError(f"{index_dir}: replaced {attempts} times while being loaded; try again")


def verify_generation(index_dir: str | os.PathLike[str], opened: OpenedIndex, consequence: str = "nothing was written") -> None:
    """Refuse to carry a damaged generation forward (an update, a compact copy): every file its manifest
    records is compared with its checksum, and the manifest with its own, as ``verify-index`` does; the
    first problem is raised as an IndexFormatError naming the file and saying ``consequence``. An index
    built before checksums existed is checked for structure only (what ``open_index`` did)."""
    try:
        check_files(opened.path, opened.manifest, checksums=True)
    except IndexFormatError as exc:
        raise IndexFormatError(f"{as_given(str(exc), opened.path, index_dir)}; the index is damaged, so {consequence} "
                               f"(verify-index {os.fspath(index_dir)} lists every problem; rebuild it)") from None
