"""Bounded, regular reads: every index file is opened as a regular file of a known size.

A file replaced by a FIFO would hang a reader in ``open`` or ``read``; by a link to
``/dev/zero`` it would be read forever; by a directory it raises IsADirectoryError. Index
files are therefore opened non-blocking, checked with ``fstat`` to be regular (after links)
and no larger than their limit, and only then read, from that same descriptor. Headers that
declare a size (``.npy``, FAISS) are checked against the file's size before anything of that
size is allocated (indexer/integrity.py, indexer/dense.py).
"""
from __future__ import annotations

import os
import stat
from pathlib import Path
from typing import BinaryIO

from indexer.errors import IndexFormatError

# A manifest is a few kilobytes; this bound only stops a replaced or runaway file being read whole.
MAX_MANIFEST_BYTES = 16 << 20

_KINDS = {
    stat.S_IFDIR: "a directory",
    stat.S_IFIFO: "a FIFO",
    stat.S_IFCHR: "a character device",
    stat.S_IFBLK: "a block device",
    stat.S_IFSOCK: "a socket",
}


def open_regular(path: str | os.PathLike[str], limit: int | None = None) -> BinaryIO:
    """Open ``path`` for reading: a regular file of at most ``limit`` bytes, or IndexFormatError."""
    path = Path(path)
    try:
        # O_NONBLOCK: opening a FIFO with no writer returns at once instead of waiting for one
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except FileNotFoundError:
        raise IndexFormatError(f"{path}: missing") from None
    except OSError as exc:
        raise IndexFormatError(f"{path}: unreadable ({exc.strerror or exc})") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise IndexFormatError(f"{path}: not a regular file ({_KINDS.get(stat.S_IFMT(st.st_mode), 'special file')})")
        if limit is not None and st.st_size > limit:
            raise IndexFormatError(f"{path}: {st.st_size} bytes, more than the {limit} it may hold")
        os.set_blocking(fd, True)
        return os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise


def read_regular(path: str | os.PathLike[str], limit: int | None = None) -> bytes:
    """The whole content of a regular file of at most ``limit`` bytes (IndexFormatError otherwise)."""
    with open_regular(path, limit) as f:
        try:
            data = f.read() if limit is None else f.read(limit + 1)
        except OSError as exc:
            raise IndexFormatError(f"{path}: unreadable ({exc.strerror or exc})") from None
    if limit is not None and len(data) > limit:
        raise IndexFormatError(f"{path}: more than the {limit} bytes it may hold")
    return data
