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


def teacher_top_tokens(teacher_h: torch.Tensor, lm_head: torch.Tensor, top: int, chunk: int = 512) -> torch.Tensor:
    """The teacher's top-``top`` LM-head token ids (N, top): computed once per text, not per step
    (a full W_lm h product costs 2 * V * d flops a text)."""
    top = min(top, lm_head.shape[0])
    w = lm_head.detach().float()
    with torch.no_grad():
        return torch.cat([torch.topk(teacher_h[i : i + chunk].float() @ w.T, top, dim=-1).indices for i in range(0, len(teacher_h), chunk)])


def query_distillation_loss(
    student_h: torch.Tensor, teacher_h: torch.Tensor, lm_head: torch.Tensor, *, kl_weight: float = 1.0, kl_top: int = 256,
    temperature: float = 1.0, teacher_top: torch.Tensor | None = None,
) -> torch.Tensor:
    """Losses (B,) of student states (B, d) against teacher states (B, d); ``lm_head`` (V, d) is the
    frozen W_lm. ``teacher_top`` (B, kl_top): the teacher's top token ids, if already known
    (:func:`teacher_top_tokens`); only those rows of W_lm are then multiplied."""
    loss = 1 - torch.nn.functional.cosine_similarity(student_h, teacher_h, dim=-1)
    if kl_weight:
        idx = teacher_top if teacher_top is not None else teacher_top_tokens(teacher_h, lm_head, kl_top)
        rows = lm_head.detach().to(student_h.dtype)[idx]  # (B, k, d)
        s = torch.log_softmax(torch.einsum("bd,bkd->bk", student_h, rows) / temperature, dim=-1)
        t = torch.log_softmax(torch.einsum("bd,bkd->bk", teacher_h, rows) / temperature, dim=-1)
        loss = loss + kl_weight * torch.sum(t.exp() * (t - s), dim=-1)
    return loss


__all__ = ["kl_over_top", "query_distillation_loss", "teacher_top_tokens"]
