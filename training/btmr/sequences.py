"""BTMR sequences (btmr-multiple-tokens §3.2): segments, <BMT> groups, the group attention mask, the forward pass.

A text is cut into fixed-length segments of its own tokens. Each segment becomes a *unit*:
the prompt template around the segment (as the engine embeds any text), followed by a group of
``k`` <BMT> tokens. Units are concatenated into one sequence.

Attention (the paper's Figure 2): a token of unit j sees the tokens of unit j before it
(causal) and the <BMT> group of unit j-1, nothing else. Information therefore flows from one
segment to the next only through the groups, and the last group goes from fine (local) to
coarse (global) content.

:func:`forward_states` gives the group states and the LM loss on the segment tokens (Eq. 3,
each predicted from the previous group and the unit so far); the contrastive loss over group
prefixes is training/objectives/matryoshka.py. The layout's settings are
:class:`~training.btmr.recipe.BTMRConfig`.

Pairs come from the corpus itself: the first and the second half of one document (no queries,
judgments or labels).
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from training.btmr.recipe import BTMRConfig

# Special tokens of SmolLM2's tokenizer that text never produces (code-corpus markers); the
# first present one carries <BMT>, so no vocabulary resize and every runtime reads it as an id.
BMT_CANDIDATES = ("<empty_output>", "<jupyter_output>", "<reponame>", "<gh_stars>")


def pick_bmt_token(tokenizer) -> int:
    """The id of a special token that no text produces, to carry <BMT>."""
    vocab = tokenizer.get_vocab()
    for tok in BMT_CANDIDATES:
        if tok in vocab:
            return int(vocab[tok])
    raise ValueError(f"the tokenizer has none of the reserved tokens {BMT_CANDIDATES}; pass bmt_token_id explicitly")


@dataclass
class Packed:
    """One BTMR sequence: ids, unit number and role of each position."""

    ids: list[int]
    unit: list[int]  # unit number of each position
    is_bmt: list[bool]
    is_text: list[bool]  # segment tokens (the LM loss predicts these)
    groups: list[list[int]]  # positions of each unit's <BMT> group


def pack(prefix: Sequence[int], segments: Sequence[Sequence[int]], suffix: Sequence[int], cfg: BTMRConfig) -> Packed:
    """Units ``prefix + segment + suffix + <BMT>*k`` concatenated."""
    p = Packed([], [], [], [], [])
    for u, seg in enumerate(segments):
        for part, text in ((prefix, False), (seg, True), (suffix, False)):
            p.ids.extend(part)
            p.unit.extend([u] * len(part))
            p.is_bmt.extend([False] * len(part))
            p.is_text.extend([text] * len(part))
        start = len(p.ids)
        p.ids.extend([cfg.bmt_token_id] * cfg.group_size)
        p.unit.extend([u] * cfg.group_size)
        p.is_bmt.extend([True] * cfg.group_size)
        p.is_text.extend([False] * cfg.group_size)
        p.groups.append(list(range(start, start + cfg.group_size)))
    return p


def group_attention_mask(unit: Sequence[int], is_bmt: Sequence[bool]) -> torch.Tensor:
    """(L, L) bool, True where query position i may attend key position j.

    j <= i, and j is in i's own unit, or j is a <BMT> token of the unit just before i's.
    """
    u = torch.as_tensor(list(unit))
    b = torch.as_tensor(list(is_bmt), dtype=torch.bool)
    n = len(u)
    causal = torch.ones(n, n, dtype=torch.bool).tril()
    same = u[:, None] == u[None, :]
    prev_group = (u[None, :] == u[:, None] - 1) & b[None, :]
    return causal & (same | prev_group)


def batch_inputs(packs: Sequence[Packed], pad_id: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(ids (B, L), additive 4D mask (B, 1, L, L) float32, text-token mask (B, L)), right-padded.

    Padded positions attend only to themselves (a row with no allowed key would be NaN) and are
    never read.
    """
    n = max(len(p.ids) for p in packs)
    ids = torch.full((len(packs), n), pad_id, dtype=torch.long)
    allowed = torch.eye(n, dtype=torch.bool).repeat(len(packs), 1, 1)
    text = torch.zeros(len(packs), n, dtype=torch.bool)
    for i, p in enumerate(packs):
        m = len(p.ids)
        ids[i, :m] = torch.as_tensor(p.ids)
        allowed[i, :m, :m] = group_attention_mask(p.unit, p.is_bmt)
        text[i, :m] = torch.as_tensor(p.is_text)
    mask = torch.zeros(allowed.shape, dtype=torch.float32).masked_fill(~allowed, torch.finfo(torch.float32).min)
    return ids, mask[:, None], text


def forward_states(lm, bmt_vector: torch.Tensor, packs: Sequence[Packed], pad_id: int, cfg: BTMRConfig) -> tuple[torch.Tensor, torch.Tensor]:
    """(group states (B, U, k, d), LM loss) of a batch of packed sequences with equal unit counts.

    The <BMT> input embedding is ``bmt_vector`` (a trainable parameter), placed at the group
    positions of the frozen token-embedding output.
    """
    ids, mask, text = batch_inputs(packs, pad_id)
    emb = lm.get_input_embeddings()(ids)
    is_bmt = ids == cfg.bmt_token_id
    emb = torch.where(is_bmt[..., None], bmt_vector.to(emb.dtype).expand_as(emb), emb)
    out = lm(inputs_embeds=emb, attention_mask=mask, output_hidden_states=True)
    hidden = out.hidden_states[-1]
    # LM loss: position t predicts token t+1 wherever t+1 is a segment token
    logits = out.logits[:, :-1].float()
    target = ids[:, 1:].masked_fill(~text[:, 1:], -100)
    lm_loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), target.reshape(-1), ignore_index=-100)
    units = len(packs[0].groups)
    if any(len(p.groups) != units for p in packs):
        raise ValueError("every sequence of a batch must hold the same number of units")
    pos = torch.as_tensor([p.groups for p in packs])  # (B, U, k)
    states = hidden[torch.arange(len(packs))[:, None, None], pos]
    return states, lm_loss


def document_pairs(token_rows: Sequence[Sequence[int]], cfg: BTMRConfig) -> list[tuple[list[list[int]], list[list[int]]]]:
    """(anchor segments, positive segments) of every document long enough for two halves of
    ``units_per_side`` segments each: the first half's segments against the second half's."""
    need = 2 * cfg.units_per_side * cfg.segment_length
    L, U = cfg.segment_length, cfg.units_per_side
    out = []
    for row in token_rows:
        if len(row) < need:
            continue
        half = len(row) // 2
        a = [list(row[j * L : (j + 1) * L]) for j in range(U)]
        p = [list(row[half + j * L : half + (j + 1) * L]) for j in range(U)]
        out.append((a, p))
    return out


__all__ = ["BMT_CANDIDATES", "Packed", "batch_inputs", "document_pairs", "forward_states", "group_attention_mask", "pack", "pick_bmt_token"]
