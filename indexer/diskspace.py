"""Index files written with their space reserved first: a full disk is an error, never a signal.

A memory map over a sparse file gets its blocks only when a page is first written; on a full
disk that write is a SIGBUS that kills the build without a word. Every index file is
therefore given its full size with ``posix_fallocate`` before a byte of it is written, and
ENOSPC anywhere becomes :class:`NoSpaceError`, which names the file and what it needed.
"""
from __future__ import annotations

import errno
import os
from pathlib import Path
from typing import Any

import numpy as np


class NoSpaceError(OSError):
    """The disk is full: ``no space left on device writing PATH (needs N MB)``."""

    def __init__(self, path: str | os.PathLike[str], needed: int | None) -> None:
        need = f" (needs {max(needed / 1e6, 0.1):.1f} MB)" if needed is not None else ""
        self.message = f"no space left on device writing {path}{need}"
        super().__init__(errno.ENOSPC, self.message)
        self.filename = os.fspath(path)
        self.needed = needed

    def __str__(self) -> str:  # OSError's own form would be "[Errno 28] ...: 'PATH'"
        return self.message

    def __reduce__(self):
        return (NoSpaceError, (self.filename, self.needed))


def reserve(fd: int, path: Path, size: int) -> None:
    """Allocate ``size`` bytes of the open file ``fd`` (``path``, for the message)."""
    if size <= 0:
        return
    try:
        os.posix_fallocate(fd, 0, size)
    except OSError as exc:
        if exc.errno == errno.ENOSPC:
            raise NoSpaceError(path, size) from None
        if exc.errno not in (errno.EOPNOTSUPP, errno.EINVAL, errno.ENOSYS):
            raise
        # a file system without fallocate: the plain writes that follow report ENOSPC themselves


def write_bytes(path: Path, data: bytes | memoryview) -> None:
    """Write ``data`` to ``path`` (created or truncated), its space reserved first."""
    path = Path(path)
    try:
        with open(path, "wb") as f:
            reserve(f.fileno(), path, len(data))
            f.write(data)
    except NoSpaceError:
        raise
    except OSError as exc:
        if exc.errno == errno.ENOSPC:
            raise NoSpaceError(path, len(data)) from None
        raise


def save_npy(path: Path, array: np.ndarray) -> None:
    """``np.save`` with the file's space reserved first (never pickles)."""
    path = Path(path)
    array = np.asanyarray(array)
    header = _npy_header(array.dtype, array.shape)
    try:
        with open(path, "wb") as f:
            reserve(f.fileno(), path, len(header) + array.nbytes)
            f.write(header)
            f.write(np.ascontiguousarray(array).data)
    except NoSpaceError:
        raise
    except OSError as exc:
        if exc.errno == errno.ENOSPC:
            raise NoSpaceError(path, len(header) + array.nbytes) from None
        raise


def allocate_npy(path: Path, dtype: Any, shape: tuple[int, ...]) -> np.memmap:
    """A writable memory map over a new ``.npy`` file whose every block is allocated first, so
    that writes through the map cannot fault on a full disk."""
    path = Path(path)
    dtype = np.dtype(dtype)
    header = _npy_header(dtype, shape)
    size = len(header) + int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
    try:
        with open(path, "wb") as f:
            f.write(header)
            reserve(f.fileno(), path, size)
            f.truncate(size)
    except NoSpaceError:
        raise
    except OSError as exc:
        if exc.errno == errno.ENOSPC:
            raise NoSpaceError(path, size) from None
        raise
    if size == len(header):
        return np.zeros(shape, dtype)  # np.memmap cannot map zero bytes; nothing to write anyway
    return np.memmap(path, dtype=dtype, mode="r+", offset=len(header), shape=shape)


def _npy_header(dtype: np.dtype, shape: tuple[int, ...]) -> bytes:
    import io

    buf = io.BytesIO()
    d = {"descr": np.lib.format.dtype_to_descr(np.dtype(dtype)), "fortran_order": False, "shape": tuple(shape)}
    np.lib.format.write_array_header_1_0(buf, d) if _fits_v1(d) else np.lib.format.write_array_header_2_0(buf, d)
    return buf.getvalue()


def _fits_v1(d: dict) -> bool:
    # the 1.0 header holds at most 65535 bytes; anything this project writes fits
    return len(repr(d)) < 60000
