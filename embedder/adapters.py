"""LoRA adapters on top of a backbone: the one shipped with the package, or one on disk.

``default`` means the adapter shipped for the backbone under ``embedder/adapters/<model>/``
(written by ``train-text2token``); where none is shipped yet, ``default`` is the raw backbone.
"""
from __future__ import annotations

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


def adapter_identity(path: Path | None) -> dict[str, str] | None:
    """What an index records about the adapter it was built with."""
    if path is None:
        return None
    return {"path": str(path), "sha256": _weights_sha256(path)}
