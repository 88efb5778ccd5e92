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
from collections.abc import Callable
from pathlib import Path

import torch

from embedder.adapters import adapter_embedding, adapter_record
from embedder.encoder import EmbedderConfig

RECORD = "text2token.json"
WEIGHTS = "adapter_model.safetensors"


def save_adapter(
    peft_model, directory: Path, record: dict, record_name: str = RECORD, extra: Callable[[Path], None] | None = None
) -> Path:
    """Write the LoRA weights (bf16), the peft config and the record (``text2token.json``) into ``directory``.

    extra: writes the objective's own files into the folder before it is renamed into place
    (LLM2Comp's memory vectors, BTMR's <BMT> embedding), so that they appear with the rest.
    """
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
        (tmp / record_name).write_text(json.dumps(record, indent=2, sort_keys=True, default=str))
        if extra is not None:
            extra(tmp)
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
    """The training record (Text2Token or LLM2Comp) of an adapter directory, or None for a foreign adapter."""
    return adapter_record(Path(directory))


def embedding_config_for(
    directory: Path | None, max_length: int | None = None, batch_size: int | None = None
) -> EmbedderConfig | None:
    """The prompt / query prompt / pooling / attention an adapter was trained with (None: use the defaults).

    ``max_length`` and ``batch_size`` are not taken from training (indexing keeps longer texts).
    """
    if directory is None or read_record(directory) is None:
        return None
    base = EmbedderConfig()
    return EmbedderConfig(
        **adapter_embedding(Path(directory)),
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
