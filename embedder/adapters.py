"""LoRA adapters on top of a backbone: the one shipped with the package, or one on disk.

``default`` means the adapter shipped for the backbone under ``embedder/adapters/<model>/``
(written by ``train-text2token``); where none is shipped yet, ``default`` is the raw backbone.
"""
from __future__ import annotations

import json
from pathlib import Path

from embedder.models import ModelNotAvailable, _weights_sha256

SHIPPED_DIR = Path(__file__).parent / "adapters"


def shipped_adapter(model_name: str) -> Path | None:
    """The adapter shipped with the package for a registered backbone, if any."""
    path = SHIPPED_DIR / model_name
    return path if (path / "adapter_config.json").exists() else None


def resolve_adapter(adapter: str | Path | None, model_name: str) -> Path | None:
    """Map ``default`` / ``none`` / a directory to an adapter directory or None."""
    if adapter is None or str(adapter) == "none":
        return None
    if str(adapter) == "default":
        return shipped_adapter(model_name)
    path = Path(adapter).expanduser()
    if not (path / "adapter_config.json").exists():
        raise ModelNotAvailable(f"{path}: not a LoRA adapter directory (no adapter_config.json)")
    return path.resolve()


# The record a trainer writes beside the LoRA weights (training/adapter_io.py), first match wins.
RECORD_FILES = ("llm2comp.json", "text2token.json")
# The embedding settings an adapter's record fixes (indexing keeps its own max_length / batch size).
RECORDED_SETTINGS = ("prompt", "pooling", "attention", "memory_tokens")


def adapter_record(path: Path | None) -> dict | None:
    """The training record of an adapter directory, or None (no adapter, or a foreign one)."""
    if path is None:
        return None
    for name in RECORD_FILES:
        f = Path(path) / name
        if f.exists():
            try:
                return json.loads(f.read_text())
            except json.JSONDecodeError as exc:
                raise ValueError(f"{f}: line {exc.lineno}: not valid JSON ({exc.msg})") from None
    return None


def adapter_embedding(path: Path | None) -> dict:
    """The prompt / pooling / attention / memory tokens an adapter was trained with ({} if unknown)."""
    rec = adapter_record(path) or {}
    emb = rec.get("embedding") or {}
    return {k: emb[k] for k in RECORDED_SETTINGS if k in emb}


def adapter_identity(path: Path | None) -> dict[str, str] | None:
    """What an index records about the adapter it was built with."""
    if path is None:
        return None
    return {"path": str(path), "sha256": _weights_sha256(path)}
