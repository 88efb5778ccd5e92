"""The trained embedder on disk: a peft LoRA adapter directory plus its Text2Token record.

Layout (loadable by ``Embedder.load(model, adapter=DIR)``, ``build-index --adapter DIR`` and
``Retriever``): ``adapter_config.json`` (peft), ``adapter_model.safetensors`` (LoRA weights in
bfloat16: ~1.8 MB for smollm2-135m at r=16) and ``text2token.json`` (recipe, embedding
config, backbone identity, corpus, target statistics, final loss). The directory is built
under a temporary name and renamed into place.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path

import torch

from embedder.encoder import EmbedderConfig

RECORD = "text2token.json"
WEIGHTS = "adapter_model.safetensors"


def save_adapter(peft_model, directory: Path, record: dict) -> Path:
    """Write the LoRA weights (bf16), the peft config and ``text2token.json`` into ``directory``."""
    from peft import get_peft_model_state_dict
    from safetensors.torch import save_file

    directory = Path(directory)
    directory.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=directory.parent, prefix=f".{directory.name}."))
    try:
        state = get_peft_model_state_dict(peft_model, save_embedding_layers=False)
        save_file(
            {k: v.detach().to(torch.bfloat16).contiguous().cpu() for k, v in state.items()},
            str(tmp / WEIGHTS),
            metadata={"format": "pt"},
        )
        peft_model.peft_config["default"].save_pretrained(str(tmp))
        (tmp / RECORD).write_text(json.dumps(record, indent=2, sort_keys=True, default=str))
        make_readable(tmp)
        if directory.exists():
            old = directory.with_name(f".{directory.name}.old")
            shutil.rmtree(old, ignore_errors=True)
            directory.rename(old)
            tmp.rename(directory)
            shutil.rmtree(old, ignore_errors=True)
        else:
            tmp.rename(directory)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return directory


def make_readable(folder: Path) -> None:
    """mkdtemp/mkstemp create owner-only entries; an adapter is meant to be shared and shipped."""
    os.chmod(folder, 0o755)
    for f in Path(folder).iterdir():
        os.chmod(f, 0o644)


def read_record(directory: Path) -> dict | None:
    """The Text2Token record of an adapter directory, or None for a foreign adapter."""
    path = Path(directory) / RECORD
    return json.loads(path.read_text()) if path.exists() else None


def embedding_config_for(
    directory: Path | None, max_length: int | None = None, batch_size: int | None = None
) -> EmbedderConfig | None:
    """The prompt / pooling / attention an adapter was trained with (None: use the defaults).

    ``max_length`` and ``batch_size`` are not taken from training (indexing keeps longer texts).
    """
    if directory is None:
        return None
    rec = read_record(directory)
    if rec is None:
        return None
    emb = rec.get("embedding", {})
    base = EmbedderConfig()
    return EmbedderConfig(
        prompt=emb.get("prompt", base.prompt),
        pooling=emb.get("pooling", base.pooling),
        attention=emb.get("attention", base.attention),
        max_length=max_length or base.max_length,
        batch_size=batch_size or base.batch_size,
    )


def round_lora_to_bf16(peft_model) -> None:
    """Round the trainable LoRA weights to bfloat16 in place, as they will be stored.

    After this, the in-memory model and one loaded from the saved adapter hold the same weights.
    """
    with torch.no_grad():
        for p in peft_model.parameters():
            if p.requires_grad:
                p.copy_(p.to(torch.bfloat16).to(p.dtype))
