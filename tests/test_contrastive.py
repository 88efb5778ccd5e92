"""The shared contrastive loss: InfoNCE against a hand computation, masking, GradCache = full batch."""

from __future__ import annotations

import math

import pytest
import torch

from training.objectives.contrastive import GradCache, Temperature, info_nce, pair_loss, same_text_mask, text_key


def _manual(a: torch.Tensor, c: torch.Tensor, tau: float, masked: set[tuple[int, int]] = frozenset()) -> list[float]:
    out = []
    for i in range(a.shape[0]):
        sims = []
        for j in range(c.shape[0]):
            if (i, j) in masked:
                continue
            cos = float(a[i] @ c[j] / (a[i].norm() * c[j].norm()))
            sims.append((j, cos / tau))
        den = sum(math.exp(s) for _, s in sims)
        num = math.exp(dict(sims)[i])
        out.append(-math.log(num / den))
    return out


def test_info_nce_matches_hand_computation_with_hard_negatives():
    g = torch.Generator().manual_seed(0)
    a, p, n = (torch.randn(3, 5, generator=g) for _ in range(3))
    got = pair_loss(a, p, 0.1, negatives=n)
    want = _manual(a, torch.cat([p, n]), 0.1)
    assert got.tolist() == pytest.approx(want, rel=1e-5)


def test_same_text_candidates_are_not_negatives():
    # pair 0 and pair 2 share their positive text (one question, the same answer twice);
    # anchor 1's own text also appears as a candidate (a negative of another row).
    anchors = ["What is X?", "a cat", "What is X ?"]
    positives = ["X is a thing.", "A dog.", "x is a thing"]
    negatives = ["A cat!"]
    mask = same_text_mask([text_key(t) for t in anchors], [text_key(t) for t in positives + negatives], [0, 1, 2])
    want = torch.zeros(3, 4, dtype=torch.bool)
    want[0, 2] = True  # the same text as row 0's positive
    want[2, 0] = True
    want[1, 3] = True  # "A cat!" is anchor 1 itself
    assert torch.equal(mask, want)

    g = torch.Generator().manual_seed(1)
    a, p, n = torch.randn(3, 4, generator=g), torch.randn(3, 4, generator=g), torch.randn(1, 4, generator=g)
    got = pair_loss(a, p, 0.05, n, anchors, positives, negatives)
    masked = {(int(i), int(j)) for i, j in want.nonzero()}
    assert got.tolist() == pytest.approx(_manual(a, torch.cat([p, n]), 0.05, masked), rel=1e-5, abs=1e-6)


def test_symmetric_loss_averages_both_directions():
    g = torch.Generator().manual_seed(2)
    a, p = torch.randn(4, 6, generator=g), torch.randn(4, 6, generator=g)
    got = pair_loss(a, p, 0.2, symmetric=True)
    want = [(x + y) / 2 for x, y in zip(_manual(a, p, 0.2), _manual(p, a, 0.2))]
    assert got.tolist() == pytest.approx(want, rel=1e-5)


def test_learned_temperature_gets_a_gradient_and_fixed_does_not():
    learned, fixed = Temperature(0.05, learn=True), Temperature(0.05)
    assert learned.value == pytest.approx(0.05) and fixed.value == pytest.approx(0.05)
    a, p = torch.randn(4, 3), torch.randn(4, 3)
    info_nce(a, p, torch.arange(4), learned()).mean().backward()
    assert learned.log_t.grad is not None and float(learned.log_t.grad) != 0.0
    assert not any(True for _ in fixed.parameters())


class _Encoder(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.emb = torch.nn.Embedding(50, 8)
        self.drop = torch.nn.Dropout(0.3)
        self.lin = torch.nn.Linear(8, 8)

    def forward(self, rows: list[list[int]]) -> torch.Tensor:
        return torch.stack([self.lin(self.drop(self.emb(torch.tensor(r)))).mean(0) for r in rows])


def test_grad_cache_equals_full_batch_gradient_with_dropout():
    rows_a = [[1, 2, 3], [4, 5], [6], [7, 8, 9, 10], [11, 12], [13]]
    rows_p = [[14, 15], [16], [17, 18, 19], [20], [21, 22], [23, 24]]
    texts_a = [str(r) for r in rows_a]
    texts_p = [str(r) for r in rows_p]

    def loss_fn(a, p):
        return pair_loss(a, p, 0.05, anchor_texts=texts_a, positive_texts=texts_p).mean()

    full = _Encoder()
    torch.manual_seed(7)
    loss_full = loss_fn(full(rows_a), full(rows_p))
    loss_full.backward()

    cached = _Encoder()
    torch.manual_seed(7)
    loss_gc, reps = GradCache(cached, chunk_size=4).step([rows_a, rows_p], loss_fn)
    assert float(loss_gc) == pytest.approx(float(loss_full.detach()), rel=1e-6)
    assert reps[0].shape == (6, 8)
    for (name, g1), (_, g2) in zip(full.named_parameters(), cached.named_parameters()):
        assert torch.allclose(g1.grad, g2.grad, atol=1e-6), name
