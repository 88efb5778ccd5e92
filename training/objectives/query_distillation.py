"""The query-encoder distillation objective (issue 28): a student's state h_s pulled to the teacher's h_t.

Two terms, per example: ``1 - cos(h_s, h_t)`` (the dense channel reads the direction of h), and
``kl_weight`` times KL(teacher || student) of the LM-head distributions over the teacher's
top-``kl_top`` tokens (the aligned-token expansion is the top-M of those logits: their order
matters, and the KL also fixes the scale of h_s, which the cosine leaves free).
"""
from __future__ import annotations

import torch


def kl_over_top(student_logits: torch.Tensor, teacher_logits: torch.Tensor, top: int, temperature: float = 1.0) -> torch.Tensor:
    """KL(teacher || student) per example, of the LM-head distributions restricted to the teacher's top tokens."""
    idx = torch.topk(teacher_logits, min(top, teacher_logits.shape[-1]), dim=-1).indices
    t = torch.log_softmax(teacher_logits.gather(-1, idx) / temperature, dim=-1)
    s = torch.log_softmax(student_logits.gather(-1, idx) / temperature, dim=-1)
    return torch.sum(t.exp() * (t - s), dim=-1)


def query_distillation_loss(
    student_h: torch.Tensor, teacher_h: torch.Tensor, lm_head: torch.Tensor, *, kl_weight: float = 1.0, kl_top: int = 256,
    temperature: float = 1.0,
) -> torch.Tensor:
    """Losses (B,) of student states (B, d) against teacher states (B, d); ``lm_head`` (V, d) is the frozen W_lm."""
    loss = 1 - torch.nn.functional.cosine_similarity(student_h, teacher_h, dim=-1)
    if kl_weight:
        w = lm_head.to(student_h.dtype)
        loss = loss + kl_weight * kl_over_top(student_h @ w.T, teacher_h @ w.T, kl_top, temperature)
    return loss


__all__ = ["query_distillation_loss", "kl_over_top"]
