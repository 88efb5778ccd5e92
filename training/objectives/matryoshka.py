"""The matryoshka contrastive objective of BTMR (btmr-multiple-tokens Eq. 4-6, 8-9).

For every prefix length i = 1..k of a <BMT> group and every pair (unit of the anchor, unit of
the positive), the concatenated first i group states of the anchor against the positive's:
InfoNCE with in-batch negatives through the project's one contrastive loss
(training/objectives/contrastive.py ``pair_loss``), averaged over prefixes and unit pairs.
``matryoshka=False`` keeps only i = k (the paper's ablation, Eq. 8-9). The group states come
from training/btmr/sequences.py ``forward_states``.
"""
from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

import torch

from training.objectives.contrastive import pair_loss


class MatryoshkaSettings(Protocol):
    """What the objective reads of its settings (training.btmr.recipe.BTMRConfig has it)."""

    temperature: float  # InfoNCE τ (the paper's pre-training value: 0.02)
    matryoshka: bool  # every prefix of the group, or only the whole group


def matryoshka_contrastive(anchor: torch.Tensor, positive: torch.Tensor, cfg: MatryoshkaSettings, anchor_texts: Sequence[str] | None = None, positive_texts: Sequence[str] | None = None) -> torch.Tensor:
    """Eq. 4-6: InfoNCE of group prefixes b^{1:i} over every (anchor unit, positive unit) pair, averaged.

    anchor, positive: (B, U, k, d) group states.
    """
    b, ua, k, _ = anchor.shape
    up = positive.shape[1]
    prefixes = range(1, k + 1) if cfg.matryoshka else (k,)
    total, n = anchor.new_zeros(()), 0
    for i in prefixes:
        for a in range(ua):
            for p in range(up):
                loss = pair_loss(anchor[:, a, :i].reshape(b, -1), positive[:, p, :i].reshape(b, -1), cfg.temperature, anchor_texts=anchor_texts, positive_texts=positive_texts)
                total = total + loss.mean()
                n += 1
    return total / n


__all__ = ["MatryoshkaSettings", "matryoshka_contrastive"]
