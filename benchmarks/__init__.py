"""Benchmarks of the engine against what a user would use instead (BM25, a small dense model).

Importing this package first sets cache locations that must be decided before ``numba``,
``ranx`` or ``ir_datasets`` are imported:

* ``IR_DATASETS_HOME``: ir_datasets (also imported by ranx) creates ~60 folders in its home
  at import time; by default that home is ``~/.ir_datasets``.
* ``NUMBA_CACHE_DIR``: ranx and the index kernels compile with Numba on first call (ranx
  cold: 40-60 s); a persistent cache makes later runs load the machine code instead.

Both default to ``<repo>/.cache/...`` in a source checkout, else to
``$XDG_CACHE_HOME/aligned-tokens/...``; values already in the environment are kept.
"""
from __future__ import annotations

import os
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]


def cache_root() -> Path:
    """Where benchmark caches live: the checkout's ``.cache`` or the user's XDG cache."""
    if (REPO_ROOT / "setup.cfg").exists() and os.access(REPO_ROOT, os.W_OK):
        return REPO_ROOT / ".cache"
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "aligned-tokens"


def _configure_environment() -> None:
    root = cache_root()
    os.environ.setdefault("IR_DATASETS_HOME", str(root / "ir_datasets"))
    os.environ.setdefault("NUMBA_CACHE_DIR", str(root / "numba"))
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


_configure_environment()
