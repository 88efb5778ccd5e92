"""The contrastive objective shared by every stage that learns from pairs (InfoNCE).

One loss for all of them: supervised pairs from files (with hard negatives where a file has
them), two spans of one document, a sentence and its document, or two dropout views of one
text (SimCSE). What differs is only where the (anchor, positive[, negative]) texts come from;
the loss, the temperature and the false-negative masking are here.

  L_i = -log  exp(cos(a_i, p_i) / τ) / Σ_{c ∈ C_i} exp(cos(a_i, c) / τ)

C = every positive and every hard negative of the batch (in-batch negatives), minus the
candidates that are *the same text* as the anchor's own positive or as the anchor (a source
that repeats texts, e.g. one question with several answers, must not push a text away from
itself). ``symmetric`` adds the positive -> anchor direction (GTE's improved loss, reduced to
its in-batch part).

:class:`GradCache` (Gao et al. 2021, "Scaling Deep Contrastive Learning Batch Size under
Memory Limited Setup") makes the batch of the loss independent of the batch that fits one
forward pass: embed every chunk without a graph, take the loss and its gradient with respect
to the embeddings, then re-run each chunk with a graph and push that gradient through. The
result equals a full-batch backward (dropout included: each chunk's RNG state is replayed).
"""

from __future__ import annotations

import math
import re
import unicodedata
from collections.abc import Callable, Sequence

import torch
import torch.nn.functional as F

_PUNCT = re.compile(r"[\W_]+", re.UNICODE)


def text_key(text: str) -> str:
    """The identity under which two texts count as the same: case, punctuation and spacing ignored."""
    return " ".join(_PUNCT.sub(" ", unicodedata.normalize("NFKC", text).casefold()).split())


class Temperature(torch.nn.Module):
    """τ of InfoNCE: fixed, or learned through log τ (CLIP's parametrisation), clamped to [min, max]."""

    def __init__(self, init: float = 0.05, learn: bool = False, minimum: float = 0.01, maximum: float = 1.0) -> None:
        super().__init__()
        if not minimum <= init <= maximum:
            raise ValueError(f"temperature {init} outside [{minimum}, {maximum}]")
        self.learn = learn
        self.minimum, self.maximum = minimum, maximum
        log_t = torch.tensor(math.log(init), dtype=torch.float32)
        if learn:
            self.log_t = torch.nn.Parameter(log_t)
        else:
            self.register_buffer("log_t", log_t)

    def forward(self) -> torch.Tensor:
        return self.log_t.exp().clamp(self.minimum, self.maximum)

    @property
    def value(self) -> float:
        return float(self().detach())


def same_text_mask(anchor_keys: Sequence[str], candidate_keys: Sequence[str], positive_index: Sequence[int]) -> torch.Tensor:
    """(B, C) bool, True where candidate c must not count as a negative of anchor b.

    A candidate is masked when its text equals anchor b's text or its positive's text, unless it
    *is* that positive (the target column stays).
    """
    b, c = len(anchor_keys), len(candidate_keys)
    mask = torch.zeros(b, c, dtype=torch.bool)
    by_key: dict[str, list[int]] = {}
    for j, k in enumerate(candidate_keys):
        by_key.setdefault(k, []).append(j)
    for i in range(b):
        pos = int(positive_index[i])
        for k in {anchor_keys[i], candidate_keys[pos]}:
            for j in by_key.get(k, ()):
                if j != pos:
                    mask[i, j] = True
    return mask


def info_nce(
    anchors: torch.Tensor,
    candidates: torch.Tensor,
    positive_index: torch.Tensor,
    temperature: torch.Tensor | float,
    mask: torch.Tensor | None = None,
) -> torch.Tensor:
    """Per-anchor InfoNCE loss (B,) of cosine similarities; ``mask`` (B, C) True = not a negative."""
    if anchors.ndim != 2 or candidates.ndim != 2 or anchors.shape[1] != candidates.shape[1]:
        raise ValueError(f"anchors {tuple(anchors.shape)} and candidates {tuple(candidates.shape)} must be (B, d) and (C, d)")
    scores = F.normalize(anchors.float(), dim=-1) @ F.normalize(candidates.float(), dim=-1).T / temperature
    if mask is not None:
        scores = scores.masked_fill(mask.to(scores.device), float("-inf"))
    return F.cross_entropy(scores, positive_index.to(scores.device), reduction="none")


def pair_loss(
    anchors: torch.Tensor,
    positives: torch.Tensor,
    temperature: torch.Tensor | float,
    negatives: torch.Tensor | None = None,
    anchor_texts: Sequence[str] | None = None,
    positive_texts: Sequence[str] | None = None,
    negative_texts: Sequence[str] | None = None,
    symmetric: bool = False,
) -> torch.Tensor:
    """Per-pair loss (B,) for anchors[i] <-> positives[i], in-batch and hard negatives.

    With texts given, candidates that are the same text as the anchor or its positive are
    masked (see :func:`same_text_mask`); without them (dropout views), nothing is masked.
    """
    b = anchors.shape[0]
    if positives.shape[0] != b:
        raise ValueError(f"{b} anchors but {positives.shape[0]} positives")
    candidates = positives if negatives is None else torch.cat([positives, negatives])
    target = torch.arange(b)
    mask = None
    if anchor_texts is not None and positive_texts is not None:
        mask = candidate_mask(anchor_texts, positive_texts, negative_texts)
        if mask.shape[1] != candidates.shape[0]:
            raise ValueError("texts and embeddings disagree in number")
    loss = info_nce(anchors, candidates, target, temperature, mask)
    if symmetric:
        back_mask = None
        if mask is not None:
            back_mask = same_text_mask([text_key(t) for t in positive_texts], [text_key(t) for t in anchor_texts], target.tolist())
        loss = 0.5 * (loss + info_nce(positives, anchors, target, temperature, back_mask))
    return loss


def candidate_mask(
    anchor_texts: Sequence[str], positive_texts: Sequence[str], negative_texts: Sequence[str] | None = None
) -> torch.Tensor:
    """(B, C) :func:`same_text_mask` of a pairs batch: candidates are the positives, then the negatives."""
    a_keys = [text_key(t) for t in anchor_texts]
    c_keys = [text_key(t) for t in positive_texts] + [text_key(t) for t in (negative_texts or [])]
    return same_text_mask(a_keys, c_keys, list(range(len(a_keys))))


def listwise_kl(
    anchors: torch.Tensor,
    candidates: torch.Tensor,
    teacher_anchors: torch.Tensor,
    teacher_candidates: torch.Tensor,
    temperature: torch.Tensor | float,
    teacher_temperature: float,
    mask: torch.Tensor | None = None,
) -> torch.Tensor:
    """Per-anchor KL(teacher || student) (B,) of the anchor -> candidates softmax (listwise distillation).

    Both distributions are softmaxes of cosine similarities over the same candidates (the
    batch's positives and negatives), each at its own temperature; ``mask`` (B, C) True removes a
    candidate from both (the same-text candidates InfoNCE ignores). The teacher side carries no
    gradient. Zero exactly when the student's distribution equals the teacher's.
    """
    def logits(a: torch.Tensor, c: torch.Tensor, t) -> torch.Tensor:
        s = F.normalize(a.float(), dim=-1) @ F.normalize(c.float(), dim=-1).T / t
        return s if mask is None else s.masked_fill(mask.to(s.device), float("-inf"))

    if anchors.shape[0] != teacher_anchors.shape[0] or candidates.shape[0] != teacher_candidates.shape[0]:
        raise ValueError("student and teacher embed different numbers of texts")
    log_p = F.log_softmax(logits(anchors, candidates, temperature), dim=-1)
    with torch.no_grad():
        log_q = F.log_softmax(logits(teacher_anchors.to(anchors.device), teacher_candidates.to(anchors.device), teacher_temperature), dim=-1)
    q = log_q.exp()
    keep = torch.isfinite(log_q)  # masked candidates: 0 * (-inf - -inf) would be nan, in the backward too
    zero = torch.zeros_like(log_p)
    terms = q * (torch.where(keep, log_q, zero) - torch.where(keep, log_p, zero))
    return terms.sum(dim=-1)


class GradCache:
    """Exact large-batch gradients from small forward passes (see the module docstring).

    encode: maps a chunk (a list of whatever the caller batches, e.g. token id lists) to
    embeddings (n, d) with autograd enabled. The caller groups texts into ``groups`` (e.g.
    anchors, positives, negatives); ``loss_fn`` gets one embedding tensor per group and returns
    a scalar loss, which may also depend on parameters outside the encoder (a learned τ).
    """

    def __init__(self, encode: Callable[[list], torch.Tensor], chunk_size: int) -> None:
        if chunk_size < 1:
            raise ValueError("chunk_size must be positive")
        self.encode = encode
        self.chunk_size = chunk_size

    def _chunks(self, items: list) -> list[list]:
        return [items[i : i + self.chunk_size] for i in range(0, len(items), self.chunk_size)]

    def step(self, groups: Sequence[list], loss_fn: Callable[..., torch.Tensor]) -> tuple[torch.Tensor, list[torch.Tensor]]:
        """Accumulate the full-batch gradient into the parameters; return (loss, embeddings)."""
        if all(len(g) <= self.chunk_size for g in groups):
            # Everything fits one forward pass per group: the plain backward gives the same
            # gradient without the extra no-graph pass.
            reps = [self.encode(list(g)).float() for g in groups]
            loss = loss_fn(*reps)
            loss.backward()
            return loss.detach(), [r.detach() for r in reps]
        chunked = [self._chunks(list(g)) for g in groups]
        states: list[list[torch.Tensor]] = []
        reps: list[torch.Tensor] = []
        with torch.no_grad():
            for chunks in chunked:
                st, parts = [], []
                for c in chunks:
                    st.append(torch.get_rng_state())
                    parts.append(self.encode(c).float())
                states.append(st)
                reps.append(torch.cat(parts) if parts else torch.zeros(0))
        after = torch.get_rng_state()
        leaves = [r.detach().requires_grad_(True) for r in reps]
        loss = loss_fn(*leaves)
        loss.backward()
        for chunks, st, leaf in zip(chunked, states, leaves):
            start = 0
            for c, s in zip(chunks, st):
                torch.set_rng_state(s)  # the same dropout masks as in the no-graph pass
                out = self.encode(c).float()
                g = leaf.grad[start : start + len(c)]
                start += len(c)
                out.backward(g)
        torch.set_rng_state(after)
        return loss.detach(), [lf.detach() for lf in leaves]
