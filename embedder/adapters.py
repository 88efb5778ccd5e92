"""LoRA adapters on top of a backbone: those shipped with the package, or one on disk.

Shipped adapters live under ``embedder/adapters/<name>/`` (written by ``train-text2token``)
and are named on the command line by that name (``--adapter smollm2-135m-text2token``).
``default`` is the one :data:`DEFAULT_ADAPTERS` names for the backbone; where none is, it
is the raw backbone (as ``none`` always is).
"""
from __future__ import annotations

import json
from pathlib import Path

from embedder.models import ModelNotAvailable
from embedder.util import weights_sha256

SHIPPED_DIR = Path(__file__).parent / "adapters"


# The adapter ``default`` means, per registered backbone. smollm2-135m: Text2Token then 360 steps
# of supervised contrastive (smollm2-135m-contrastive-v2, training/README.md). Measured on the shared
# collections (benchmarks/results/embedders.json), mean nDCG@10 sparse / dense / hybrid with BM25
# (held-out weights) and STS-B Spearman: Text2Token alone 0.295 / 0.304 / 0.483, 0.681; the first
# contrastive adapter (40 steps, smollm2-135m-contrastive, still shipped so that indexes built
# with it load) 0.411 / 0.407 / 0.512, 0.759; this one 0.430 / 0.456 / 0.522, 0.786.
# smollm2-135m-contrastive-v3 and -v4 are this adapter after 2,400 and 3,300 of epoch 1's 3,577 batches of all the
# pairs (training/epoch1/chunk-0019, chunk-0022). v4 is the default since 2026-11-28, released by retrieval (issue 51's
# rule): sparse + dense + BM25 held out 0.5220 -> 0.5320, every collection up but cranfield (-0.008); alone sparse
# 0.449 vs 0.430, dense 0.473 vs 0.456, the query's own tokens 0.372 vs 0.345 (benchmarks/results/release-chunk22/NOTES.md).
# No query student is distilled from v4 yet: query_encoder "auto" reads queries with the LLM on its indexes
# (the operating points never use a student). contrastive-v2 ships on, with its student, for indexes built with it.
DEFAULT_ADAPTERS = {"smollm2-135m": "smollm2-135m-contrastive-v4"}


def shipped_adapters() -> list[str]:
    """Names of the adapters shipped with the package."""
    return sorted(p.parent.name for p in SHIPPED_DIR.glob("*/adapter_config.json"))


def shipped_adapter(model_name: str) -> Path | None:
    """The default adapter shipped for a registered backbone, if any."""
    name = DEFAULT_ADAPTERS.get(model_name)
    path = SHIPPED_DIR / name if name else None
    return path if path is not None and (path / "adapter_config.json").exists() else None


def resolve_adapter(adapter: str | Path | None, model_name: str) -> Path | None:
    """Map ``default`` / ``none`` / a shipped adapter's name / a directory to an adapter directory or None."""
    if adapter is None or str(adapter) == "none":
        return None
    if str(adapter) == "default":
        return shipped_adapter(model_name)
    if str(adapter) in shipped_adapters() and not Path(adapter).exists():
        path = (SHIPPED_DIR / str(adapter)).resolve()
        trained_on = ((adapter_record(path) or {}).get("backbone") or {}).get("name")
        if trained_on is not None and trained_on != model_name:
            raise ModelNotAvailable(f"shipped adapter {adapter} was trained on {trained_on}, not on {model_name}")
        return path
    path = Path(adapter).expanduser()
    if not (path / "adapter_config.json").exists():
        raise ModelNotAvailable(
            f"{path}: not a LoRA adapter directory (no adapter_config.json) nor a shipped adapter ({', '.join(shipped_adapters())})"
        )
    return path.resolve()


def locate_adapter(record: dict | None) -> str | Path:
    """The adapter an index's manifest records (``{"path", "sha256"}``), where it is now: its
    path if that still holds an adapter, else the shipped adapter with the same weights (an index
    built from a source checkout or a worktree that is gone, searched from an installed package);
    "none" for an index built without one. An adapter found nowhere raises ModelNotAvailable
    naming its path and hash, instead of a query-time failure."""
    if not record:
        return "none"
    path = Path(record.get("path") or "")
    if (path / "adapter_config.json").exists():
        return path
    wanted = record.get("sha256")
    for name in shipped_adapters():
        if wanted and weights_sha256(SHIPPED_DIR / name, missing=ModelNotAvailable) == wanted:
            return SHIPPED_DIR / name
    raise ModelNotAvailable(
        f"the index was built with the adapter {str(path)!r} (weights sha256 {str(wanted)[:12]}), which is no longer there, "
        f"and no shipped adapter has those weights ({', '.join(shipped_adapters()) or 'none shipped'})"
    )


# The record a trainer writes beside the LoRA weights (training/adapter_io.py), first match wins.
RECORD_FILES = ("llm2comp.json", "text2token.json")
# The embedding settings an adapter's record fixes (indexing keeps its own max_length / batch size).
# query_prompt: recorded only by runs trained with a query template (training/trainer.py), so
# that an asymmetric adapter reads queries with it wherever it is loaded.
RECORDED_SETTINGS = ("prompt", "query_prompt", "pooling", "attention", "memory_tokens")


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
    """The prompt / query prompt / pooling / attention / memory tokens an adapter was trained with ({} if unknown)."""
    rec = adapter_record(path) or {}
    emb = rec.get("embedding") or {}
    return {k: emb[k] for k in RECORDED_SETTINGS if k in emb}


def adapter_identity(path: Path | None) -> dict[str, str] | None:
    """What an index records about the adapter it was built with."""
    if path is None:
        return None
    return {"path": str(path), "sha256": weights_sha256(path, missing=ModelNotAvailable)}
