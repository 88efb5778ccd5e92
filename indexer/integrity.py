"""What stands between a file on disk and a Numba kernel: checksums and checked loaders.

Lucene's model: every file can be verified on its own (here: size + checksum recorded in the
manifest at build time), opening an index checks the cheap parts (sizes, structure), and a
full check reads every byte (``verify-index``, ``Retriever.load(verify=True)``).

Every failure is an :class:`IndexFormatError` whose message starts with the file's path and
says what is wrong, so that a command line can print it as one line.
"""
from __future__ import annotations

import json
import math
import os
import stat
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

from indexer.checksums import CHECKSUM, file_checksum
from indexer.errors import IndexFormatError
from indexer.layout import MANIFEST
from indexer.regular_files import MAX_MANIFEST_BYTES, open_regular, read_regular

# Arrays are scanned in blocks so that checking a large memory-mapped index never materialises
# a full-size temporary (np.diff / isfinite of 500M postings would allocate gigabytes).
_SCAN = 1 << 24


def record_files(directory: Path, exclude: tuple[str, ...] = (MANIFEST,)) -> dict[str, dict]:
    """``{relative path: {"size", CHECKSUM}}`` of every file under ``directory`` (recursively),
    except the top-level names in ``exclude`` (the manifest that will hold the record)."""
    directory = Path(directory)
    out: dict[str, dict] = {}
    for path in sorted(p for p in directory.rglob("*") if p.is_file()):
        rel = path.relative_to(directory).as_posix()
        if rel in exclude:
            continue
        out[rel] = {"size": path.stat().st_size, CHECKSUM: file_checksum(path)}
    return out


def size_problems(directory: Path, files: dict[str, dict]) -> list[str]:
    """Recorded files that are missing or whose size differs from the record (one stat each)."""
    problems = []
    for rel, rec in files.items():
        path = Path(directory) / rel
        try:
            st = path.stat()
        except FileNotFoundError:
            problems.append(f"{path}: missing (recorded in {MANIFEST})")
            continue
        except OSError as exc:
            problems.append(f"{path}: unreadable ({exc.strerror})")
            continue
        size = st.st_size
        if not stat.S_ISREG(st.st_mode):
            problems.append(f"{path}: not a regular file (recorded in {MANIFEST} as one of {rec.get('size')} bytes)")
        elif size != rec.get("size"):
            problems.append(f"{path}: {size} bytes, {MANIFEST} records {rec.get('size')} (truncated or overwritten)")
    return problems


def checksum_problems(directory: Path, files: dict[str, dict]) -> list[str]:
    """Recorded files whose content differs from the record (reads every byte)."""
    problems = []
    for rel, rec in files.items():
        path = Path(directory) / rel
        if CHECKSUM not in rec:
            problems.append(f"{path}: no {CHECKSUM} checksum recorded in {MANIFEST}")
            continue
        try:
            got = file_checksum(path)
        except OSError as exc:
            problems.append(f"{path}: unreadable ({exc.strerror or exc})")
            continue
        except IndexFormatError as exc:  # not a regular file (replaced since its size was checked)
            problems.append(str(exc))
            continue
        if got != rec[CHECKSUM]:
            problems.append(f"{path}: {CHECKSUM} checksum {got}, {MANIFEST} records {rec[CHECKSUM]} (content changed)")
    return problems


# ------------------------------------------------------------------ checked loaders
def load_npy(path: Path, dtype: str, ndim: int, mmap: bool = True, limit: int | None = None) -> np.ndarray:
    """A ``.npy`` file, read without unpickling from one regular file (indexer/regular_files.py)
    of at most ``limit`` bytes; every failure is an IndexFormatError naming the file. The
    header's dtype, number of dimensions and size (shape x item size) are checked against what
    is expected and against the file's size before anything is mapped or allocated."""
    with open_regular(path, limit) as f:
        size = os.fstat(f.fileno()).st_size
        try:
            version = np.lib.format.read_magic(f)
            if version == (1, 0):
                shape, fortran, got = np.lib.format.read_array_header_1_0(f)
            elif version == (2, 0):
                shape, fortran, got = np.lib.format.read_array_header_2_0(f)
            else:
                raise ValueError(f"format version {version}")
        except Exception as exc:  # noqa: BLE001 - a damaged header can raise nearly anything; none may escape as a traceback
            raise IndexFormatError(f"{path}: unreadable .npy ({type(exc).__name__}: {exc})") from None
        if got.hasobject:
            raise IndexFormatError(f"{path}: holds Python objects (a pickle), which are never loaded")
        if got != np.dtype(dtype) or len(shape) != ndim:
            raise IndexFormatError(f"{path}: {got} array of {len(shape)} dimension(s), expected {np.dtype(dtype)} of {ndim}")
        offset = f.tell()
        count = math.prod(shape)
        if offset + count * got.itemsize != size:
            raise IndexFormatError(f"{path}: header declares shape {shape} ({offset + count * got.itemsize} bytes), the file holds {size} bytes")
        order = "F" if fortran else "C"
        if count == 0:
            return np.zeros(shape, got, order=order)
        try:
            if mmap:
                return np.memmap(f, dtype=got, mode="r", offset=offset, shape=shape, order=order)
            return np.fromfile(f, dtype=got, count=count).reshape(shape, order=order)
        except (OSError, ValueError) as exc:
            raise IndexFormatError(f"{path}: unreadable .npy ({type(exc).__name__}: {exc})") from None


def read_json(path: Path, limit: int | None = None) -> Any:
    """Parse a JSON file (a regular file of at most ``limit`` bytes); a missing, special or
    damaged file is an IndexFormatError naming it."""
    data = read_regular(path, limit)
    try:
        return json.loads(data.decode("utf-8"))
    except (ValueError, UnicodeDecodeError) as exc:  # JSONDecodeError is a ValueError
        raise IndexFormatError(f"{path}: unreadable JSON ({exc})") from None
    except RecursionError:
        raise IndexFormatError(f"{path}: unreadable JSON (nested too deeply)") from None


def _blocks(n: int) -> Iterator[slice]:
    for start in range(0, n, _SCAN):
        yield slice(start, min(start + _SCAN, n))


def check_csr(
    directory: Path,
    prefix: str,
    indptr: np.ndarray,
    docs: np.ndarray | None,
    weights: np.ndarray,
    n_docs: int,
    n_rows: int | None = None,
    positive: bool = False,
    scale: np.ndarray | None = None,
    offset: np.ndarray | None = None,
    nibbles: bool = False,
) -> None:
    """The invariants the scoring kernels index memory by, checked with vectorised NumPy.

    ``prefix``: file name prefix (``postings_``), for messages. ``n_rows``: the number of
    posting lists the manifest implies (vocabulary size). ``positive``: weights must be > 0.
    ``scale``/``offset``: 8-bit impacts (indexer/compact.py): ``weights`` holds uint8 codes (any
    value is valid) and these map them back per list, so they are what is checked: one entry
    per list, finite, scale >= 0 (and, ``positive``, offset > 0 for every non-empty list).
    ``nibbles``: 4-bit impacts, two codes a byte: ``weights`` holds half as many bytes as postings, rounded up.
    """
    f = {name: Path(directory) / f"{prefix}{name}.npy" for name in ("indptr", "docs", "weights", "scale", "offset")}
    if docs is None:  # doc numbers bit-packed (indexer/packed_docs.py checks them): the weights say how many postings
        f["docs"] = f["weights"]
    nnz = int(docs.shape[0]) if docs is not None else int(indptr[-1]) if nibbles and indptr.shape[0] else int(weights.shape[0])
    if indptr.shape[0] < 1:
        raise IndexFormatError(f"{f['indptr']}: empty (needs at least one entry)")
    if n_rows is not None and indptr.shape[0] != n_rows + 1:
        raise IndexFormatError(f"{f['indptr']}: {indptr.shape[0]} entries, the manifest implies {n_rows + 1} ({n_rows} posting lists)")
    if int(indptr[0]) != 0:
        raise IndexFormatError(f"{f['indptr']}: starts at {int(indptr[0])}, not 0")
    if int(indptr[-1]) != nnz:
        raise IndexFormatError(f"{f['indptr']}: ends at {int(indptr[-1])}, but {f['docs'].name} holds {nnz} postings")
    if weights.shape[0] != ((nnz + 1) // 2 if nibbles else nnz):
        what = f"{weights.shape[0]} bytes of 4-bit impacts" if nibbles else f"{weights.shape[0]} weights"
        raise IndexFormatError(f"{f['weights']}: {what} for {nnz} postings in {f['docs'].name}")
    for s in _blocks(indptr.shape[0] - 1):
        step = np.diff(indptr[s.start : s.stop + 1])
        if step.size and step.min() < 0:
            at = s.start + int(np.argmax(step < 0))
            raise IndexFormatError(f"{f['indptr']}: decreases at entry {at + 1} ({int(indptr[at])} -> {int(indptr[at + 1])})")
    quantised = scale is not None
    if quantised:
        _check_dequantisation(f, indptr, scale, offset, positive)
    # A posting list holds ascending doc numbers (kernels.contributions binary-searches it), so
    # docs may only fail to increase where a new list starts.
    for s in _blocks(nnz):
        if docs is not None:  # packed doc numbers: indexer/packed_docs.py checks them
            block = np.asarray(docs[s])
            if block.size and (int(block.min()) < 0 or int(block.max()) >= n_docs):
                bad = int(np.argmax((block < 0) | (block >= n_docs)))
                raise IndexFormatError(f"{f['docs']}: doc number {int(block[bad])} at {s.start + bad} is outside 0..{n_docs - 1}")
            step = np.diff(docs[s.start : min(s.stop + 1, nnz)])
            drop = np.flatnonzero(step <= 0) + s.start + 1
            at = np.minimum(np.searchsorted(indptr, drop), indptr.shape[0] - 1)
            drop = drop[np.asarray(indptr[at]) != drop]
            if drop.size:
                raise IndexFormatError(f"{f['docs']}: doc numbers not ascending within a posting list at {int(drop[0])}")
        if quantised:
            continue  # every uint8 code is a valid level; scale and offset were checked
        w = np.asarray(weights[s])
        ok = np.isfinite(w) & (w > 0) if positive else np.isfinite(w)
        if not ok.all():
            bad = int(np.argmin(ok))
            what = "positive and finite" if positive else "finite"
            raise IndexFormatError(f"{f['weights']}: weight {float(w[bad])} at {s.start + bad} is not {what}")


def _check_dequantisation(f: dict[str, Path], indptr: np.ndarray, scale: np.ndarray, offset: np.ndarray | None, positive: bool) -> None:
    n_lists = indptr.shape[0] - 1
    if offset is None:
        raise IndexFormatError(f"{f['offset']}: missing (8-bit impacts need a scale and an offset per list)")
    for name, a in (("scale", scale), ("offset", offset)):
        if a.shape[0] != n_lists:
            raise IndexFormatError(f"{f[name]}: {a.shape[0]} entries for {n_lists} posting lists")
        if not np.isfinite(a).all():
            bad = int(np.argmin(np.isfinite(a)))
            raise IndexFormatError(f"{f[name]}: value {float(a[bad])} of list {bad} is not finite")
    if scale.size and float(scale.min()) < 0:
        bad = int(np.argmin(scale))
        raise IndexFormatError(f"{f['scale']}: scale {float(scale[bad])} of list {bad} is negative")
    if positive:
        used = np.diff(indptr) > 0
        bad_lists = np.flatnonzero(used & ~(offset > 0))
        if bad_lists.size:
            raise IndexFormatError(f"{f['offset']}: offset {float(offset[bad_lists[0]])} of list {int(bad_lists[0])} is not positive (weights must be)")


def check_doc_ids(path: Path, n_docs: int, limit: int | None = None) -> list[str]:
    """Read and check ``doc_ids.json``: a list of ``n_docs`` distinct strings."""
    ids = read_json(path, limit)
    if not isinstance(ids, list) or not all(isinstance(d, str) for d in ids):
        raise IndexFormatError(f"{path}: not a JSON list of strings")
    if len(ids) != n_docs:
        raise IndexFormatError(f"{path}: {len(ids)} ids, manifest says {n_docs}")
    if len(set(ids)) != len(ids):
        seen: set[str] = set()
        dup = next(d for d in ids if d in seen or seen.add(d))
        raise IndexFormatError(f"{path}: id {dup!r} occurs more than once")
    return ids


def is_finite_number(x: Any) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


def manifest_checksum_problem(directory: Path) -> str | None:
    """Does ``manifest.json`` still hold what was written (its ``checksum`` field, over the
    canonical form of every other field)? None when it does or when no checksum is recorded."""
    from indexer.checksums import json_checksum

    path = Path(directory) / MANIFEST
    data = read_json(path, MAX_MANIFEST_BYTES)
    if not isinstance(data, dict) or data.get("checksum") is None:
        return None
    want = data.pop("checksum")
    got = json_checksum(data)
    if got != want:
        return f"{path}: {CHECKSUM} checksum {got} of its fields, it records {want} (edited or damaged)"
    return None


def check_files(directory: Path, manifest, checksums: bool = False) -> None:
    """Raise the first problem with the files the manifest records: sizes always (one stat per
    file), contents too when ``checksums`` (reads every byte)."""
    import logging

    files = manifest.files
    if files is None:
        if checksums:
            logging.getLogger(__name__).warning("%s: no checksums recorded (built before checksums existed); structure checked only", directory)
        return
    problems = size_problems(directory, files)
    if checksums and not problems:
        problems = [p for p in [manifest_checksum_problem(directory)] if p] + checksum_problems(directory, files)
    if problems:
        more = f" (and {len(problems) - 1} more: run verify-index {directory})" if len(problems) > 1 else ""
        raise IndexFormatError(problems[0] + more)
