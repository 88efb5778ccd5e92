"""LLM2Comp compression pre-training: the continuation task with knowledge distillation (CTKD, §3).

A document is cut into a text x and its continuation c. The encoder (backbone + LoRA) reads
``x + m_1..m_n`` (memory slots, embedder/memory.py); the final states at the memory positions
replace x as a soft prefix for a *frozen* decoder (the same backbone, adapter switched off,
causal). The loss is the KL divergence between the frozen model's next-token distributions
over c given the real text (teacher) and given the memory (student):

    L = mean_j KL( P(· | x, c_<j) || P(· | M(x), c_<j) ),   j = 1..|c|

Details the paper leaves out, as in the authors' public code: the cut falls at a random
position leaving at least ~10 tokens on each side; the decoder's input is
[special prefix] + memory states + continuation; the KL is averaged over continuation positions,
then over texts.
"""
from __future__ import annotations

from collections.abc import Sequence
from contextlib import contextmanager

import numpy as np
import torch
import torch.nn.functional as F

from embedder.encoder import Embedder, set_bidirectional
from embedder.memory import memory_states


def cut_for_continuation(
    ids: Sequence[int], rng: np.random.Generator, max_text: int, continuation: int, min_text: int, min_continuation: int
) -> tuple[list[int], list[int]] | None:
    """(text ids, continuation ids) cut at a random position; None if the document is too short.

    The text keeps ``min_text``..``max_text`` tokens, the continuation the next
    ``min_continuation``..``continuation`` tokens.
    """
    n = len(ids)
    if n < min_text + min_continuation:
        return None
    hi = min(max_text, n - min_continuation)
    site = int(rng.integers(min_text, hi + 1))
    return list(ids[:site]), list(ids[site : site + continuation])


@contextmanager
def frozen_decoder(embedder: Embedder):
    """The backbone as the frozen decoder: adapter off, causal attention, no dropout changes.

    Restores the encoder's attention afterwards (the encoder may be bidirectional).
    """
    model = embedder.model
    bidirectional = embedder.config.attention == "bidirectional"
    set_bidirectional(embedder.causal_lm, False)
    try:
        if hasattr(model, "disable_adapter"):
            with model.disable_adapter():
                yield embedder.causal_lm
        else:  # no LoRA attached (tests of the loss alone)
            yield embedder.causal_lm
    finally:
        set_bidirectional(embedder.causal_lm, bidirectional)


def _right_pad(rows: Sequence[Sequence[int]], pad: int) -> tuple[torch.Tensor, torch.Tensor]:
    width = max(len(r) for r in rows)
    ids = torch.full((len(rows), width), pad, dtype=torch.long)
    mask = torch.zeros((len(rows), width), dtype=torch.long)
    for i, r in enumerate(rows):
        ids[i, : len(r)] = torch.as_tensor(list(r), dtype=torch.long)
        mask[i, : len(r)] = 1
    return ids, mask


def encode_memory(embedder: Embedder, texts_ids: Sequence[Sequence[int]]) -> torch.Tensor:
    """Final hidden states (B, n, d) at the memory positions of already tokenised texts (with grad)."""
    rows = embedder.wrap_ids(texts_ids)
    ids, mask = _right_pad(rows, embedder._pad_id)
    lengths = mask.sum(1)
    dev = embedder.device
    hidden = embedder.body()(input_ids=ids.to(dev), attention_mask=mask.to(dev)).last_hidden_state
    return memory_states(hidden, lengths.to(dev), embedder.memory.n)


def _log_probs_at(lm: torch.nn.Module, hidden: torch.Tensor, rows: torch.Tensor, cols: torch.Tensor) -> torch.Tensor:
    # The LM head only where a prediction is distilled: (B, c, V) instead of (B, length, V).
    return F.log_softmax(lm.get_output_embeddings()(hidden[rows, cols]).float(), dim=-1)


def ctkd_loss(embedder: Embedder, pairs: Sequence[tuple[Sequence[int], Sequence[int]]]) -> torch.Tensor:
    """Per-text CTKD loss (B,) of (text ids, continuation ids) pairs; gradients reach LoRA and memory."""
    if embedder.memory is None:
        raise ValueError("CTKD needs an embedder with memory tokens (pooling 'memory')")
    dev = embedder.device
    special = list(embedder._prefix[: len(embedder._special_prefix())])  # e.g. Llama's BOS
    texts = [list(t) for t, _ in pairs]
    conts = [list(c) for _, c in pairs]
    c_len = torch.tensor([len(c) for c in conts])
    width = int(c_len.max())
    rows = torch.arange(len(pairs)).unsqueeze(1)
    j = torch.arange(width).unsqueeze(0)
    valid = (j < c_len.unsqueeze(1)).to(dev)  # (B, width): real continuation positions

    states = encode_memory(embedder, texts)  # (B, n, d), grad
    n = states.shape[1]
    with frozen_decoder(embedder) as lm:
        body = lm.get_base_model() if hasattr(lm, "get_base_model") else lm
        with torch.no_grad():
            ids, mask = _right_pad([special + t + c for t, c in zip(texts, conts)], embedder._pad_id)
            hidden = body.model(input_ids=ids.to(dev), attention_mask=mask.to(dev)).last_hidden_state
            # position of the token that predicts c_j: the last text token, then c_1 .. c_{j-1}
            start = torch.tensor([len(special) + len(t) - 1 for t in texts]).unsqueeze(1)
            cols = (start + j).clamp(max=ids.shape[1] - 1)
            teacher = _log_probs_at(body, hidden, rows.to(dev), cols.to(dev))
        table = body.get_input_embeddings()
        seqs, lengths = [], []
        for b in range(len(pairs)):
            parts = [table(torch.tensor(special, dtype=torch.long, device=dev))] if special else []
            parts += [states[b], table(torch.tensor(conts[b], dtype=torch.long, device=dev))]
            seqs.append(torch.cat(parts))
            lengths.append(seqs[-1].shape[0])
        embeds = torch.nn.utils.rnn.pad_sequence(seqs, batch_first=True)
        smask = (torch.arange(embeds.shape[1]).unsqueeze(0) < torch.tensor(lengths).unsqueeze(1)).long().to(dev)
        hidden = body.model(inputs_embeds=embeds, attention_mask=smask).last_hidden_state
        cols = (len(special) + n - 1 + j).clamp(max=embeds.shape[1] - 1)
        student = _log_probs_at(body, hidden, rows.to(dev), cols.to(dev))
    kl = (teacher.exp() * (teacher - student)).sum(-1)  # (B, width)
    return (kl * valid).sum(1) / valid.sum(1)


__all__ = ["ctkd_loss", "cut_for_continuation", "encode_memory", "frozen_decoder"]
