"""Small utilities every layer shares: atomic file writes, weights hashes, thread caps.

At the bottom of the import layers (embedder/ imports nothing of this project's above it), so that
the indexer, the retriever, training and the benchmarks all write, hash and cap threads one way.
"""
from __future__ import annotations

import hashlib
import json
import os
import tempfile
from pathlib import Path

WEIGHT_SUFFIXES = (".safetensors", ".bin")


# ------------------------------------------------------------------ atomic writes
def write_bytes_atomic(path: str | os.PathLike[str], data: bytes) -> Path:
    """Write ``data`` to ``path`` so that a reader sees the old file or the whole new one, never
    a part: a temporary file beside it, flushed to disk (fsync), then renamed into place."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, 0o644)  # mkstemp's 0600 would hide a results or manifest file from other users
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path


def write_text_atomic(path: str | os.PathLike[str], text: str) -> Path:
    """:func:`write_bytes_atomic` for UTF-8 text."""
    return write_bytes_atomic(path, text.encode("utf-8"))


def write_json_atomic(
    path: str | os.PathLike[str], obj, *, indent: int = 2, sort_keys: bool = False, ensure_ascii: bool = False, newline: bool = False
) -> Path:
    """Write ``obj`` as JSON, atomically (:func:`write_bytes_atomic`). The layout options exist
    because files already written (manifests, caches, results) keep their exact bytes."""
    text = json.dumps(obj, indent=indent, sort_keys=sort_keys, ensure_ascii=ensure_ascii)
    return write_text_atomic(path, text + "\n" if newline else text)


# ------------------------------------------------------------------ hashes
def file_sha256(path: str | os.PathLike[str]) -> str:
    """SHA-256 of a file, streamed."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def weights_sha256(model_dir: str | os.PathLike[str], *, recursive: bool = False, missing: type[Exception] = FileNotFoundError) -> str:
    """SHA-256 identifying the weights of a model directory, so that an index records exactly
    which weights produced it.

    Two layouts, both kept because indexes and results already record their hashes:
    ``recursive=False`` (a backbone or LoRA adapter): the weight files at the top of the folder,
    ``*.safetensors`` then ``*.bin``, each sorted, hashed as the sequence of their hex digests;
    ``recursive=True`` (a sentence-transformers folder, whose modules keep weights in subfolders):
    every weight file below it, sorted by path, each hashed with its relative path.
    Raises ``missing`` (e.g. ``ModelNotAvailable``) when the folder holds no weight file.
    """
    model_dir = Path(model_dir)
    h = hashlib.sha256()
    if recursive:
        files = sorted(p for p in model_dir.rglob("*") if p.is_file() and p.suffix in WEIGHT_SUFFIXES)
        for f in files:
            h.update(f"{f.relative_to(model_dir).as_posix()}\0{file_sha256(f)}\n".encode())
    else:
        files = [f for suffix in WEIGHT_SUFFIXES for f in sorted(model_dir.glob(f"*{suffix}"))]
        for f in files:
            h.update(file_sha256(f).encode())
    if not files:
        raise missing(f"{model_dir}: no *.safetensors or *.bin weight files")
    return h.hexdigest()


# ------------------------------------------------------------------ thread caps
def set_threads(n: int | None) -> None:
    """Cap the compute threads of torch and FAISS at ``n`` (no-op for None or 0): e.g. 1 on a
    machine shared with other jobs, where two threads on two busy cores run slower than one.
    Call it again after ``Embedder.load``, which sizes torch's pool for all cores."""
    if not n:
        return
    try:
        import torch

        torch.set_num_threads(n)
    except ImportError:
        pass
    try:
        import faiss

        faiss.omp_set_num_threads(n)
    except ImportError:
        pass


__all__ = ["file_sha256", "set_threads", "weights_sha256", "write_bytes_atomic", "write_json_atomic", "write_text_atomic"]
