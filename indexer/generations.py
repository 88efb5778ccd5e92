"""Index generations: one atomic publish, readers that hold what they opened, one build per target.

Lucene's commit point, in a directory listing. A build writes a complete, immutable generation
``.NAME.gen-NNNNNN`` beside the target and publishes it with one atomic step: ``NAME`` is a
symbolic link to the current generation, replaced by ``rename(2)`` of a new link over it
(``renameat2(RENAME_EXCHANGE)`` when ``NAME`` is still a directory of the old layout, or a
file). There is no instant at which ``NAME`` is missing or points at half an index.

A reader (:func:`open_generation`) resolves ``NAME`` once, opens the generation directory and
holds a shared ``flock`` on it for as long as it uses the index; every file is then read
from that generation. A build removes an old generation only when it can take the lock
exclusively (:func:`retire`): a generation in use stays on disk until its last reader lets
go, and the next build sweeps it. Removal renames the generation away first, under the
exclusive lock, so a reader that resolved it just before can tell (:meth:`Generation.moved`)
and resolves again. Old-layout indexes (files directly in ``NAME``) load as they did; a
reader checks after loading that ``NAME`` is still the directory it read.

One build per target (:func:`build_lock`): an exclusive ``flock`` on ``.NAME.lock`` from the
first byte a build writes to its publish; a second build of the same target is refused.

Ownership: a build of ``NAME`` only ever removes what ``NAME`` created, the directories named
``.NAME.gen-*`` beside it, and never one that another link in the same directory points at.
So a copied (``cp -a``), linked (``ln -s``) or moved index rebuilt in place gets a generation of
its own and leaves the one it pointed at alone. Generation numbers are never reused while any
trace of them (a directory, the link's text, a trash directory) is left.
"""
from __future__ import annotations

import contextlib
import ctypes
import errno
import fcntl
import glob
import logging
import os
import re
import shutil
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from indexer.shards import BuildInProgress

if TYPE_CHECKING:  # typing.Self is 3.11+; annotations are not evaluated at run time (__future__)
    from typing_extensions import Self

log = logging.getLogger(__name__)

_GEN = re.compile(r"^gen-(\d{6})$")
_RENAME_NOREPLACE = 1
_RENAME_EXCHANGE = 2
_AT_FDCWD = -100


def generation_path(target: Path, number: int) -> Path:
    return Path(target).parent / f".{Path(target).name}.gen-{number:06d}"


def _prefixed(target: Path, kind: str) -> list[Path]:
    """Siblings ``.NAME.KIND-*`` of ``target``."""
    target = Path(target)
    return sorted(target.parent.glob(f".{glob.escape(target.name)}.{kind}-*"))


def current_generation(target: Path) -> Path | None:
    """The generation directory ``target`` points at, or None (absent, old layout, a file)."""
    target = Path(target)
    if not target.is_symlink():
        return None
    return Path(os.path.realpath(target))


# a generation's number at the end of its directory, its trash, a link's text or a legacy link
_TRACE = re.compile(r"gen-(?:legacy-\d+-)?(\d{6})$")


def _next_number(target: Path) -> int:
    """One more than any generation number ``target`` has left a trace of: generation
    directories, what its link names (even a missing generation's), legacy links and trash
    of interrupted removals. A number in use anywhere is never handed out again."""
    target = Path(target)
    names = [p.name for p in _prefixed(target, "gen") + _prefixed(target, "trash")]
    if target.is_symlink():
        names.append(os.readlink(target))
    numbers = [int(m.group(1)) for name in names if (m := _TRACE.search(name))]
    return max(numbers, default=0) + 1


def owns(target: Path, path: Path) -> bool:
    """Did ``target``'s builds create ``path``? Only its own ``.NAME.gen-*`` siblings count:
    what a copied or linked ``target`` points at belongs to another index."""
    target, path = Path(target), Path(path)
    prefix = f".{target.name}.gen-"
    return path.name.startswith(prefix) and os.path.realpath(path.parent) == os.path.realpath(target.parent)


def pointed_at_by_others(target: Path, path: Path) -> list[Path]:
    """The other links beside ``target`` that resolve to ``path`` (copies of the index made
    with ``cp -a`` or ``ln -s`` in the same directory): while any exists, ``path`` stays."""
    target, real = Path(target), os.path.realpath(path)
    others = []
    with contextlib.suppress(OSError):
        for entry in os.scandir(target.parent):
            if entry.name == target.name or not entry.is_symlink() or entry.name.startswith(f".{target.name}.gen-"):
                continue
            if os.path.realpath(entry.path) == real:
                others.append(Path(entry.path))
    return others


def dangling(target: Path) -> str | None:
    """What ``target``'s link names when that is missing (a generation removed by hand), else None."""
    target = Path(target)
    if target.is_symlink() and not os.path.exists(target):
        return os.readlink(target)
    return None


# ------------------------------------------------------------------ readers
@dataclass
class Generation:
    """One generation of an index, held open (a shared lock) until :meth:`close`."""

    path: Path  # the directory whose files are read (a generation, or an old-layout index)
    fd: int | None

    def moved(self) -> bool:
        """Is ``path`` no longer the directory held? (An old-layout index replaced by a build,
        or a generation retired before the lock was taken.)"""
        try:
            st = os.stat(self.path)
        except OSError:
            return True
        if self.fd is None:
            return True
        held = os.fstat(self.fd)
        return (st.st_dev, st.st_ino) != (held.st_dev, held.st_ino)

    def close(self) -> None:
        if self.fd is not None:
            os.close(self.fd)  # releases the shared lock
            self.fd = None

    def __del__(self) -> None:  # a Retriever dropped without close() still lets its generation go
        self.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def open_generation(index_dir: str | os.PathLike[str], attempts: int = 50) -> Generation:
    """Resolve ``index_dir`` once and hold what it points at (a shared lock on the directory).

    Raises FileNotFoundError / NotADirectoryError when there is no directory to hold.
    """
    index_dir = Path(index_dir)
    for _ in range(attempts):
        real = Path(os.path.realpath(index_dir))
        try:
            fd = os.open(real, os.O_RDONLY | os.O_DIRECTORY)
        except FileNotFoundError:
            if not os.path.lexists(index_dir):
                raise
            if Path(os.path.realpath(index_dir)) == real and (missing := dangling(index_dir)) is not None:
                # the link still names what is not there: not a race with a publish, a lost generation
                raise FileNotFoundError(
                    errno.ENOENT, f"the index is dangling: its generation {missing} is missing; rebuild it with --overwrite", str(index_dir)
                ) from None
            continue  # a generation retired between resolving and opening: resolve again
        # blocks only while a build is retiring this very generation (then it has moved)
        fcntl.flock(fd, fcntl.LOCK_SH)
        gen = Generation(real, fd)
        if not gen.moved():
            return gen
        gen.close()
    raise OSError(errno.EAGAIN, f"{index_dir}: the index kept changing while being opened ({attempts} attempts)")


# ------------------------------------------------------------------ builders
@contextlib.contextmanager
def build_lock(target: Path) -> Iterator[None]:
    """Hold ``.NAME.lock`` exclusively for the whole build; refuse when another build holds it.

    The holder removes the file when done (a killed build leaves it, unlocked, for the next
    one to reuse). Removal is safe because a build that locked a file checks that it is still
    the one at the path: a file unlinked by its holder meanwhile is dropped and the path
    opened again, so two builds never hold two different files.
    """
    target = Path(target)
    target.parent.mkdir(parents=True, exist_ok=True)
    path = target.parent / f".{target.name}.lock"
    while True:
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 32, 0).decode("ascii", "replace").strip() or "?"
            os.close(fd)
            raise BuildInProgress(f"{target}: another build of this index is running (pid {holder}); wait for it to finish") from None
        try:
            same = os.path.samestat(os.fstat(fd), os.stat(path))
        except FileNotFoundError:
            same = False
        if same:
            break
        os.close(fd)  # its holder removed it after we opened it: lock the one at the path now
    try:
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        yield
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)  # still locked: whoever opens it next finds it gone and retries
        os.close(fd)


def _fsync_tree(directory: Path) -> None:
    """Every file and directory of a staged generation on disk before it is published."""
    for root, dirs, files in os.walk(directory):
        for name in files:
            _fsync(os.path.join(root, name), 0)
        _fsync(root, os.O_DIRECTORY)


def _fsync_dir(directory: Path) -> None:
    """The publishing rename on disk."""
    _fsync(directory, os.O_DIRECTORY)


def _fsync(path: str | os.PathLike[str], flags: int) -> None:
    fd = os.open(path, os.O_RDONLY | flags)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _renameat2(a: Path, b: Path, flags: int) -> None:
    fn = getattr(ctypes.CDLL(None, use_errno=True), "renameat2", None)
    if fn is None:
        raise OSError(errno.ENOSYS, "renameat2 is not available")
    if fn(_AT_FDCWD, os.fsencode(a), _AT_FDCWD, os.fsencode(b), flags) != 0:
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err), str(a), None, str(b))


def rename_exchange(a: Path, b: Path) -> None:
    """Swap two paths in one step (Linux ``renameat2(RENAME_EXCHANGE)``); OSError where the
    platform or file system cannot (EINVAL, ENOSYS)."""
    _renameat2(a, b, _RENAME_EXCHANGE)


def rename_noreplace(a: Path, b: Path) -> None:
    """Rename ``a`` to ``b`` only if ``b`` does not exist, in one step (``RENAME_NOREPLACE``):
    FileExistsError otherwise. Where the platform cannot, checks first (a small window)."""
    try:
        _renameat2(a, b, _RENAME_NOREPLACE)
    except OSError as exc:
        if exc.errno == errno.EEXIST:
            raise FileExistsError(errno.EEXIST, "exists", str(b)) from None
        if exc.errno not in (errno.EINVAL, errno.ENOSYS, errno.ENOTSUP):
            raise
        if os.path.lexists(b):
            raise FileExistsError(errno.EEXIST, "exists", str(b)) from None
        os.replace(a, b)


def _point(target: Path, link: Path, overwrite: bool) -> Path | None:
    """Make ``target`` the symbolic link ``link`` in one step; returns where what ``target``
    held before now is (to be retired), or None."""
    if not overwrite or not os.path.lexists(target):
        try:
            rename_noreplace(link, target)  # never over an index that appeared meanwhile
        except FileExistsError:
            if not overwrite:
                raise FileExistsError(f"{target} appeared during the build; pass overwrite=True (--overwrite) to replace it") from None
        else:
            return None
    if target.is_symlink():
        old = current_generation(target)
        os.replace(link, target)  # one rename: readers see the old link or the new one
        # a copied or linked index points at another index's generation: never ours to remove
        return old if old is not None and owns(target, old) else None
    # an old-layout directory or a file: swap it with the link, then it is at the link's name
    try:
        rename_exchange(link, target)
    except OSError as exc:
        if exc.errno not in (errno.EINVAL, errno.ENOSYS, errno.ENOTSUP):
            raise
        # no RENAME_EXCHANGE on this file system: two renames, with an instant without target
        log.warning("%s: the file system cannot exchange paths atomically; replacing with two renames", target)
        aside = target.parent / f".{target.name}.gen-legacy-{os.getpid()}"
        os.replace(target, aside)
        os.replace(link, target)
        return aside
    return link


def publish(staged: Path, target: Path, overwrite: bool) -> Path:
    """Publish the complete directory ``staged`` as ``target``'s next generation; returns it.

    Steps: fsync the staged files; rename it to ``.NAME.gen-N`` (:func:`stage`); make a link
    to it; put the link at ``target`` (one rename or exchange); retire the generation replaced
    and sweep what earlier, interrupted builds left (:func:`publish_staged`). A failure before
    the link is at ``target`` leaves the old index published; after it, the new one.
    """
    return publish_staged(stage(staged, target), target, overwrite)


def stage(staged: Path, target: Path) -> Path:
    """Make the complete directory ``staged`` durable and name it as ``target``'s next, not yet
    published, generation (call with :func:`build_lock` held); returns that generation."""
    staged, target = Path(staged), Path(target)
    _fsync_tree(staged)
    gen = generation_path(target, _next_number(target))
    os.rename(staged, gen)
    return gen


def publish_staged(gen: Path, target: Path, overwrite: bool) -> Path:
    """Point ``target`` at the staged generation ``gen`` in one step, then retire what it
    replaced and sweep; returns ``gen``. Called with no lock on ``gen`` held, so that readers
    of the new index never wait on the build's cleanup."""
    gen, target = Path(gen), Path(target)
    # the link is named like a generation, so that an old-layout directory exchanged into its
    # place is swept as one if it cannot be removed now (a reader holds it)
    link = target.parent / f".{target.name}.gen-legacy-{os.getpid()}-{gen.name.rsplit('-', 1)[-1]}"
    if os.path.lexists(link):
        _remove(link)
    os.symlink(gen.name, link)
    try:
        old = _point(target, link, overwrite)
    except FileExistsError:  # not published: nothing of this build stays beside the target
        _remove(link)
        _remove(gen)
        raise
    _fsync_dir(target.parent)
    if old is not None and os.path.realpath(old) != os.path.realpath(gen):
        retire(old, target)
    sweep(target)
    return gen


def _remove(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path, ignore_errors=True)
    else:
        path.unlink(missing_ok=True)


def retire(path: Path, target: Path) -> bool:
    """Remove an unpublished generation (or replaced old-layout index) unless a reader holds
    it; returns whether it was removed. Held ones stay for a later build's :func:`sweep`, and
    so do generations that another link beside ``target`` points at (a copy of the index)."""
    path = Path(path)
    if not owns(target, path):
        raise ValueError(f"{path} was not created by builds of {target}; refusing to remove it")
    if pointed_at_by_others(target, path):
        return False
    if not path.is_dir() or path.is_symlink():
        if os.path.lexists(path):
            path.unlink()
        return True
    try:
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    except FileNotFoundError:
        return True
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return False
        # renamed away first: a reader that resolved this path waits on the lock, then sees it moved;
        # a build killed mid-removal leaves a trash directory, never a half generation
        trash = target.parent / f".{target.name}.trash-{os.getpid()}-{path.name.lstrip('.')}"
        os.rename(path, trash)
        shutil.rmtree(trash, ignore_errors=True)
        return True
    finally:
        os.close(fd)


def _pid_of(name: str) -> int | None:
    m = re.search(r"-(\d+)(?:-|$)", name)
    return int(m.group(1)) if m else None


def sweep(target: Path) -> list[Path]:
    """Remove what earlier builds of ``target`` left (call with :func:`build_lock` held):
    generations not published and held by no reader, trash of interrupted removals, stray
    links, and ``.NAME.old-PID`` directories of the two-rename swap of earlier versions."""
    from indexer.staging import _pid_running

    target = Path(target)
    current = current_generation(target)
    removed = []
    for path in _prefixed(target, "gen"):
        if current is not None and path.resolve() == current:
            continue
        if path.is_symlink():
            path.unlink(missing_ok=True)
            removed.append(path)
        elif retire(path, target):
            removed.append(path)
    for path in _prefixed(target, "trash"):
        _remove(path)
        removed.append(path)
    for path in _prefixed(target, "old"):
        pid = _pid_of(path.name.rsplit(".old", 1)[-1])
        if pid is None or not _pid_running(pid) or pid == os.getpid():
            _remove(path)
            removed.append(path)
    return removed

