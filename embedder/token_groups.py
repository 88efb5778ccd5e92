"""Several token states per text: the features of token-level matryoshka classification (BTMR).

One forward pass of a text gives a hidden state at every position. This module reads the
states of the last ``k`` positions of each encoded sequence, in the engine's fast path (the
runtime :meth:`Embedder.iter_batches` uses: OpenVINO or torch, prompt prefix cached).

Two sources of the ``k`` states, one function:

* an untrained embedder (raw backbone, Text2Token): the last ``k`` positions of the prompt
  template, *last first*, so that state 0 is exactly the engine's pooled token and prefix 1
  is the single pooled token;
* a BTMR adapter (``btmr.json`` in the adapter folder, written by training/btmr/trainer.py):
  ``k`` <BMT> tokens are appended after the prompt and read in order, first <BMT> first
  (the paper's evaluation: one token group appended at the end of the input).

Prefix ``i`` of a text is the concatenation of its states ``0..i-1`` (the paper's b^{1:i}).
"""
from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from embedder.encoder import Embedder

BTMR_CONFIG = "btmr.json"
BTMR_TOKEN_FILE = "btmr_token.safetensors"  # the learned <BMT> input embedding (one row)


@dataclass(frozen=True)
class GroupSpec:
    """Which ``k`` positions of a sequence are read: template tail (``append_ids`` empty) or an appended group."""

    k: int
    append_ids: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        if self.k < 1:
            raise ValueError(f"k must be at least 1, not {self.k}")
        if self.append_ids and len(self.append_ids) != self.k:
            raise ValueError(f"an appended group must hold k={self.k} tokens, not {len(self.append_ids)}")

    def to_dict(self) -> dict:
        return {"k": self.k, "append_ids": list(self.append_ids), "order": "appended group in order" if self.append_ids else "template tail, last first"}


def btmr_config(adapter_dir: str | Path | None) -> dict | None:
    """The BTMR settings recorded with an adapter (``btmr.json``), or None for other adapters."""
    if adapter_dir is None:
        return None
    path = Path(adapter_dir) / BTMR_CONFIG
    if not path.exists():
        return None
    try:
        cfg = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as exc:
        raise ValueError(f"{path}:{exc.lineno}: malformed JSON ({exc.msg})") from None
    for key in ("bmt_token_id", "group_size", "segment_length"):
        if not isinstance(cfg.get(key), int):
            raise ValueError(f"{path}: field {key!r}: expected an integer")  # noqa: TRY004 - a malformed file is bad input: ValueError naming file and field, which the CLIs catch
    return cfg


def install_bmt_embedding(embedder: Embedder, adapter_dir: str | Path) -> GroupSpec:
    """Write the learned <BMT> input embedding into the embedder's token table; return the group spec.

    BTMR reuses a special token id the tokenizer never produces from text (recorded in
    btmr.json), so no vocabulary resize is needed and every runtime (OpenVINO export
    included) reads it as an ordinary id. Must run before the first :meth:`Embedder.embed`:
    the runtime snapshots the weights. With tied input/output embeddings the LM-head row of
    that id changes too; text never produces the id, so no aligned-token list is affected
    beyond that one never-seen token's logit.
    """
    from safetensors.torch import load_file

    cfg = btmr_config(adapter_dir)
    if cfg is None:
        raise ValueError(f"{adapter_dir}: not a BTMR adapter (no {BTMR_CONFIG})")
    if embedder._runtime is not None:
        raise RuntimeError("install the <BMT> embedding before the embedder's runtime is built (first embed)")
    path = Path(adapter_dir) / BTMR_TOKEN_FILE
    row = load_file(str(path))["bmt"]
    table = embedder.causal_lm.get_input_embeddings().weight
    if row.shape != (table.shape[1],):
        raise ValueError(f"{path}: field 'bmt': shape {tuple(row.shape)}, the model's embeddings are {table.shape[1]}-d")
    with torch.no_grad():
        table[cfg["bmt_token_id"]] = row.to(table.dtype)
    return GroupSpec(cfg["group_size"], (cfg["bmt_token_id"],) * cfg["group_size"])


def group_states(embedder: Embedder, texts: Sequence[str], spec: GroupSpec, batch_size: int | None = None) -> np.ndarray:
    """(n, k, d) float32 hidden states of each text's ``k`` read positions (see the module doc).

    Texts are batched longest first (little padding), as :meth:`Embedder.iter_batches` does.
    """
    n = len(texts)
    out = np.zeros((n, spec.k, embedder.dim), np.float32)
    if not n:
        return out
    rows = [ids + list(spec.append_ids) for ids in embedder.prompt_ids(texts)]
    if min(len(r) for r in rows) < spec.k:
        raise ValueError(f"a prompt shorter than k={spec.k} tokens: use a longer template or a smaller k")
    order = np.argsort([-len(r) for r in rows], kind="stable")
    bs = batch_size or embedder.config.batch_size
    rt = embedder.runtime()
    skip = rt.prefix_len if rt is not None else 0
    with torch.inference_mode():
        for start in range(0, n, bs):
            pos = order[start : start + bs]
            ids, mask, lengths = embedder._pad([rows[i][skip:] for i in pos])
            if rt is not None:
                hidden = rt.hidden(ids, mask)
            else:
                body = embedder.causal_lm.base_model
                hidden = body(input_ids=torch.from_numpy(ids).to(embedder.device), attention_mask=torch.from_numpy(mask).to(embedder.device)).last_hidden_state
            hidden = hidden.float().cpu()
            # positions of the k read tokens; the tail is read last-first, an appended group in order
            offs = np.arange(spec.k)
            idx = (lengths[:, None] - spec.k + offs[None, :]) if spec.append_ids else (lengths[:, None] - 1 - offs[None, :])
            out[pos] = hidden[torch.arange(len(pos))[:, None], torch.from_numpy(idx)].numpy()
    return out


def prefix_features(states: np.ndarray, i: int) -> np.ndarray:
    """The prefix-``i`` feature of each text: its first ``i`` states concatenated, (n, i*d)."""
    if not 1 <= i <= states.shape[1]:
        raise ValueError(f"prefix {i} out of range 1..{states.shape[1]}")
    return states[:, :i].reshape(len(states), -1)


__all__ = ["BTMR_CONFIG", "BTMR_TOKEN_FILE", "GroupSpec", "btmr_config", "group_states", "install_bmt_embedding", "prefix_features"]
