"""Committed shards of a build: what makes a build resumable and bounded in memory.

A build encodes its corpus in shards of ``shard_size`` documents (shard i = documents
i*shard_size .. (i+1)*shard_size-1 in corpus order). Each shard's arrays (aligned-token ids
and logits, embeddings when a dense channel needs them, encoder embeddings) and a small JSON
(its doc ids, token count, encode seconds) are written into a temporary directory and
renamed to ``shard-NNNNNN``: a shard directory that exists is complete. A build killed at
any moment (kill -9 included) and run again with the same command finds the committed shards
and encodes only the rest; the index is then merged from the shards (indexer/build.py).

Where: ``.NAME.shards-KEY`` beside the target, ``KEY`` a digest of everything that decides the
shards' content (the corpus file's content hash, model, adapter, embedding settings, K, channels,
shard size). Another command gets another directory; a shards directory whose key is not the
current build's and whose lock is free is left over from an abandoned command, and is swept.
The directory is ``flock``ed by the build that owns it, as staging directories are
(indexer/staging.py), so two builds of the same command cannot interleave.
"""
from __future__ import annotations

import fcntl
import glob
import hashlib
import json
import os
import re
import shutil
from pathlib import Path
from typing import Any

import numpy as np

from indexer.diskspace import save_npy, write_bytes

PURPOSE = "shards"
SHARD_META = "shard.json"
PARAMS_FILE = "build.json"
_SHARD = re.compile(r"^shard-(\d{6})$")


class BuildInProgress(RuntimeError):
    """Another process is building the same index with the same command."""


def build_key(params: dict[str, Any]) -> str:
    """A digest of the parameters that decide the shards' content."""
    return hashlib.sha256(json.dumps(params, sort_keys=True, default=str).encode("utf-8")).hexdigest()[:16]


def corpus_identity(file: Path) -> dict[str, Any]:
    """Which corpus, by content: an edited corpus must not resume from old shards, whatever its
    size and modification time say (an edit in place can keep both). The file is streamed
    through xxh3_64 (indexer/checksums.py) once before encoding: one sequential read of the
    corpus, at the disk's speed (the hash runs at ~13 GB/s)."""
    from indexer.checksums import CHECKSUM, file_checksum

    file = Path(file)
    if file.is_dir():  # a "files" corpus: every file's path, size and content
        from indexer.checksums import json_checksum
        from indexer.corpus import text_files

        listing = [[rel.as_posix(), (file / rel).stat().st_size, file_checksum(file / rel)] for rel in text_files(file)]
        return {"path": str(file.resolve()), "size": sum(size for _, size, _ in listing), CHECKSUM: json_checksum(listing)}
    return {"path": str(file.resolve()), "size": file.stat().st_size, CHECKSUM: file_checksum(file)}


def shards_path(target: Path, key: str) -> Path:
    return Path(target).parent / f".{Path(target).name}.{PURPOSE}-{key}"


def _locked_by_other(path: Path) -> bool:
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return True
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    finally:
        os.close(fd)
    return False


def sweep_other_builds(target: Path, keep: str) -> list[Path]:
    """Remove ``target``'s shards directories of other commands that no process holds."""
    removed = []
    for path in Path(target).parent.glob(f".{glob.escape(Path(target).name)}.{PURPOSE}-*"):
        if path.name.endswith(f"-{keep}") or not path.is_dir() or _locked_by_other(path):
            continue
        shutil.rmtree(path, ignore_errors=True)
        removed.append(path)
    return removed


class ShardStore:
    """The committed shards of one build command, locked for this process while open."""

    def __init__(self, target: Path, params: dict[str, Any]) -> None:
        self.key = build_key(params)
        self.path = shards_path(target, self.key)
        sweep_other_builds(target, self.key)
        self.path.mkdir(parents=True, exist_ok=True)
        self._fd = os.open(self.path, os.O_RDONLY)
        try:
            fcntl.flock(self._fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(self._fd)
            raise BuildInProgress(f"{target}: another process is building this index with the same command ({self.path})") from None
        params_file = self.path / PARAMS_FILE
        if not params_file.exists():
            _write_atomic(params_file, json.dumps(params, sort_keys=True, default=str, indent=1).encode("utf-8"))

    def committed(self) -> set[int]:
        """Numbers of the shards already committed."""
        return {int(m.group(1)) for p in self.path.iterdir() if (m := _SHARD.match(p.name)) and p.is_dir()}

    def shard_dir(self, number: int) -> Path:
        return self.path / f"shard-{number:06d}"

    def close(self, remove: bool) -> None:
        """Release the lock; ``remove``: delete the shards (the index is in place, or the build failed)."""
        if remove:
            shutil.rmtree(self.path, ignore_errors=True)  # still locked: nobody can be resuming from it
        os.close(self._fd)


def commit_shard(store_path: Path, number: int, arrays: dict[str, np.ndarray], meta: dict[str, Any]) -> None:
    """Write one shard into a temporary directory and rename it into place (atomic)."""
    final = Path(store_path) / f"shard-{number:06d}"
    tmp = Path(store_path) / f".shard-{number:06d}.tmp-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    for name, array in arrays.items():
        save_npy(tmp / f"{name}.npy", array)
        _fsync(tmp / f"{name}.npy")
    _write_atomic(tmp / SHARD_META, json.dumps(meta).encode("utf-8"))
    os.replace(tmp, final) if not final.exists() else shutil.rmtree(tmp)


def read_shard(store_path: Path, number: int, names: tuple[str, ...], mmap: bool = False) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
    """A committed shard's arrays (those in ``names``) and its JSON."""
    d = Path(store_path) / f"shard-{number:06d}"
    meta = json.loads((d / SHARD_META).read_text(encoding="utf-8"))
    arrays = {n: np.load(d / f"{n}.npy", mmap_mode="r" if mmap else None) for n in names}
    return arrays, meta


def _write_atomic(path: Path, data: bytes) -> None:
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    write_bytes(tmp, data)
    _fsync(tmp)
    os.replace(tmp, path)


def _fsync(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
