"""The Text2Token loss (Eq. 11): KL(P_target || softmax(W_lm h)) with W_lm frozen.

Targets arrive sparse (top-n entries + a ``rest`` mass spread uniformly over the other
tokens, see :mod:`training.target_cache`); the KL is computed exactly for that
distribution without building it densely:

  KL = Σ_top p log p + rest log(rest / m) - Σ_top p log q - (rest / m) Σ_{other} log q,

with m = V - n_valid and Σ_{other} log q = Σ_all log q - Σ_top log q.
"""

from __future__ import annotations

import torch


def sparse_kl(logits: torch.Tensor, ids: torch.Tensor, probs: torch.Tensor, rest: torch.Tensor) -> torch.Tensor:
    """Per-text KL(P || softmax(logits)), shape (B,), float32.

    logits: (B, V) token scores s = W_lm h; ids: (B, n) long, -1 = padding;
    probs: (B, n) target mass of those ids; rest: (B,) mass on every other token, uniform.
    """
    logq = torch.log_softmax(logits.float(), dim=-1)
    valid = ids >= 0
    safe = ids.clamp(min=0)
    logq_top = logq.gather(1, safe) * valid
    p = probs.float() * valid
    n_other = logits.shape[1] - valid.sum(1)
    rest = rest.float()
    bg = torch.where(n_other > 0, rest / n_other.clamp(min=1), torch.zeros_like(rest))
    ent_top = torch.where(p > 0, p * torch.log(torch.where(p > 0, p, torch.ones_like(p))), torch.zeros_like(p)).sum(1)
    ent_bg = torch.where(bg > 0, rest * torch.log(torch.where(bg > 0, bg, torch.ones_like(bg))), torch.zeros_like(bg))
    cross_top = -(p * logq_top).sum(1)
    cross_bg = -bg * (logq.sum(1) - logq_top.sum(1))
    return ent_top + ent_bg + cross_top + cross_bg


def text2token_loss(embedder, h: torch.Tensor, ids: torch.Tensor, probs: torch.Tensor, rest: torch.Tensor) -> torch.Tensor:
    """Per-text Eq. 11 loss for pooled embeddings ``h`` read through the frozen LM head."""
    w = embedder.causal_lm.get_output_embeddings().weight  # frozen: LoRA only touches q/v
    return sparse_kl(h.float() @ w.float().T, ids, probs, rest)
