"""Memory tokens (LLM2Comp §3): learned input vectors appended after the text, pooled on the way out.

An LLM2Comp embedder reads ``text + m_1 .. m_n`` and its embedding is the mean of the final
hidden states at the n memory positions (pooling ``memory``). The memory vectors are *inputs*
only: they live beside the vocabulary, not in it, so the tokenizer, the input embedding table
and the LM head (which reads the aligned tokens) stay exactly the backbone's.

To let every path (plain torch, the torch runtime, the OpenVINO export) take plain token ids,
memory slot k is addressed by the id ``vocab_size + k``: :class:`MemoryBody` looks ids up in
the vocabulary table with the memory rows appended. The ids never reach the LM head.

On disk the vectors sit in the adapter directory as ``memory_tokens.safetensors`` (fp32,
tensor ``memory``), next to the LoRA weights they were trained with, so
``Embedder.load(model, adapter=DIR)`` reproduces the embedder and the adapter's hash covers them.
"""
from __future__ import annotations

import os
import tempfile
from pathlib import Path

import torch
import torch.nn.functional as F

MEMORY_FILE = "memory_tokens.safetensors"
MEMORY_KEY = "memory"


class MemoryTokens(torch.nn.Module):
    """n learned vectors of the backbone's width (a trainable parameter)."""

    def __init__(self, vectors: torch.Tensor) -> None:
        super().__init__()
        if vectors.ndim != 2 or vectors.shape[0] < 1:
            raise ValueError(f"memory vectors must be (n >= 1, d), got {tuple(vectors.shape)}")
        self.vectors = torch.nn.Parameter(vectors.detach().float().clone())

    @property
    def n(self) -> int:
        return int(self.vectors.shape[0])

    @classmethod
    def initial(cls, input_embeddings: torch.Tensor, n: int, seed: int) -> MemoryTokens:
        """n vectors drawn around the vocabulary's mean row, with the rows' per-dimension spread.

        Distinct vectors (not n copies of one), so that the slots can specialise from step one;
        typical scale, so that the frozen network reads them like ordinary token inputs.
        """
        w = input_embeddings.detach().float()
        g = torch.Generator().manual_seed(int(seed))
        noise = torch.randn(n, w.shape[1], generator=g)
        return cls(w.mean(0, keepdim=True) + noise * w.std(0, keepdim=True))

    def save(self, directory: Path) -> Path:
        """Write ``memory_tokens.safetensors`` into ``directory`` (temporary name, then renamed)."""
        from safetensors.torch import save_file

        directory = Path(directory)
        fd, tmp = tempfile.mkstemp(dir=directory, prefix=f".{MEMORY_FILE}.")
        os.close(fd)
        try:
            save_file({MEMORY_KEY: self.vectors.detach().float().contiguous().cpu()}, tmp, metadata={"format": "pt"})
            os.chmod(tmp, 0o644)
            os.replace(tmp, directory / MEMORY_FILE)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
        return directory / MEMORY_FILE

    @classmethod
    def load(cls, directory: Path) -> MemoryTokens | None:
        """The memory vectors saved in an adapter directory, or None when it has none."""
        from safetensors import safe_open

        path = Path(directory) / MEMORY_FILE
        if not path.exists():
            return None
        with safe_open(str(path), "pt") as f:
            if MEMORY_KEY not in f.keys():  # noqa: SIM118 (safe_open is not iterable)
                raise ValueError(f"{path}: no tensor named {MEMORY_KEY!r} (found {list(f.keys())})")
            return cls(f.get_tensor(MEMORY_KEY))


class MemoryBody(torch.nn.Module):
    """A decoder body (``model.model``) that also reads memory-slot ids ``vocab + k``.

    Same call and output as the body (``input_ids``, ``attention_mask`` -> an output with
    ``last_hidden_state``), so that the runtimes wrap it as they wrap the body.
    """

    def __init__(self, body: torch.nn.Module, memory: MemoryTokens) -> None:
        super().__init__()
        self.body = body
        self.memory = memory

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None, use_cache: bool = False, **kw):
        table = self.body.get_input_embeddings().weight
        # One lookup in [vocabulary; memory]: traceable (OpenVINO) and differentiable into the memory.
        embeds = F.embedding(input_ids, torch.cat([table, self.memory.vectors.to(table.dtype)], 0))
        return self.body(inputs_embeds=embeds, attention_mask=attention_mask, use_cache=use_cache, **kw)


def memory_ids(vocab_size: int, n: int) -> list[int]:
    """The ids that address the n memory slots (appended after a text's prompt ids)."""
    return list(range(vocab_size, vocab_size + n))


def pool_memory(hidden: torch.Tensor, lengths, n: int) -> torch.Tensor:
    """Mean of the final hidden states at the last ``n`` real positions of each right-padded row."""
    lengths = torch.as_tensor(lengths, device=hidden.device)
    offsets = torch.arange(n, device=hidden.device)
    pos = (lengths - n).unsqueeze(1) + offsets  # (B, n)
    rows = torch.arange(hidden.shape[0], device=hidden.device).unsqueeze(1)
    return hidden[rows, pos].float().mean(1)


def memory_states(hidden: torch.Tensor, lengths, n: int) -> torch.Tensor:
    """The final hidden states (B, n, d) at the memory positions (the soft prefix of CTKD)."""
    lengths = torch.as_tensor(lengths, device=hidden.device)
    pos = (lengths - n).unsqueeze(1) + torch.arange(n, device=hidden.device)
    rows = torch.arange(hidden.shape[0], device=hidden.device).unsqueeze(1)
    return hidden[rows, pos]


__all__ = ["MEMORY_FILE", "MemoryBody", "MemoryTokens", "memory_ids", "memory_states", "pool_memory"]
