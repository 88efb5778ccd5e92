"""The LLM's own LM head for distilled queries: the top-M aligned tokens of a student's h.

With no LLM forward left on the query path, the product over the whole vocabulary (49,152 x 576
for the default backbone) is the largest cost of a distilled query after the sentence encoder,
and on a CPU it is bound by reading the weights (113 MB in fp32). Three ways to take it:

- ``fp32``: the reference (what ``Embedder.top_tokens`` does on the LLM's own path);
- ``fp16``: half the bytes; near-ties at the cut may swap;
- ``int8`` (the CPU default): a first pass over int8 weights (a quarter of the bytes, a Numba
  kernel) bounds every logit, and only the tokens whose bound can still reach the top-M are
  rescored in fp32. The bound is rigorous, so the result is fp32's top-M (up to ties within
  fp32 rounding), at about the cost of reading the int8 weights once.

Why the bound holds: row r is stored as q_r = round(W_r / s_r), s_r = max|W_r| / 127, so
|W_r . h - s_r q_r . h| <= ||W_r - s_r q_r|| ||h|| (Cauchy-Schwarz), and the float32 sum of the
d products is off by at most d * 2^-24 * s_r ||q_r|| ||h|| in any summation order. With a_r the
first pass and e_r the sum of the two, the true logits satisfy a_r - e_r <= x_r <= a_r + e_r; the
M-th largest of a_r - e_r is a lower bound L on the true M-th largest logit, so a token with
a_r + e_r < L cannot be in the top-M. For real queries about 1,000 of 49,152 rows survive
(docs/speed-and-precision.md); they are rescored in place, row by row, in fp32.
"""
from __future__ import annotations

import threading
from typing import Any

import numba as nb
import numpy as np
import torch

LM_HEAD_DTYPES = ("fp32", "fp16", "int8")
# Numba's fallback threading layer (workqueue, where neither TBB nor OpenMP is there) must not be
# entered by two threads at once, and a served Retriever answers from many. The kernel already
# uses every core and is bound by memory: one call at a time costs concurrent queries nothing.
_KERNEL_LOCK = threading.Lock()


@nb.njit(parallel=True, fastmath=True, cache=True)
def _int8_bounds(
    q: np.ndarray, scale: np.ndarray, slack: np.ndarray, h: np.ndarray, h_norm: np.ndarray, lower: np.ndarray, upper: np.ndarray
) -> None:  # pragma: no cover - compiled
    """lower/upper (n, V) float64: bounds of h (n, d) . W.T from W's int8 rows q (V, d) and scales,
    each row read once for all n queries (the module docstring gives the bound)."""
    vocab, d = q.shape
    for r in nb.prange(vocab):
        for i in range(h.shape[0]):
            acc = np.float32(0.0)
            for j in range(d):
                acc += np.float32(q[r, j]) * h[i, j]
            approx = np.float64(acc) * scale[r]
            err = slack[r] * h_norm[i]
            lower[i, r] = approx - err
            upper[i, r] = approx + err


@nb.njit(fastmath=True, cache=True)
def _rescore(w: np.ndarray, rows: np.ndarray, h: np.ndarray) -> np.ndarray:  # pragma: no cover - compiled
    """float32 logits w[rows] . h, read in place: gathering ~1,000 fp32 rows into a new array
    first cost 0.8 ms a query, three times the products themselves (cold caches, 2 AVX2 cores)."""
    out = np.empty(rows.shape[0], np.float32)
    for i in range(rows.shape[0]):
        acc = np.float32(0.0)
        for j in range(h.shape[0]):
            acc += w[rows[i], j] * h[j]
        out[i] = acc
    return out


def kth_largest(values: np.ndarray, k: int, stride: int = 16) -> float:
    """The k-th largest of ``values`` (1-d, finite), exactly as ``np.partition`` gives it, in a fifth of
    its time for the LM head's 49,152 bounds (0.41 -> 0.11 ms, median of 300 random draws, AVX512-BF16 EPYC): the k-th largest t of every
    ``stride``-th value is at most the k-th largest of all (a subset's k-th largest never exceeds
    the whole's), so every value of the whole's top k is >= t, and the k-th largest of the values
    >= t (a few thousand) is the answer."""
    n = values.shape[0]
    if not 1 <= k <= n:
        raise ValueError(f"k must be in 1..{n}, not {k}")
    sample = values[::stride]
    if sample.shape[0] >= 4 * k:  # else the sample's cut would keep most values: no gain
        t = np.partition(sample, sample.shape[0] - k)[sample.shape[0] - k]
        values = values[values >= t]
        n = values.shape[0]
    return float(np.partition(values, n - k)[n - k])


class LMHead:
    """Top-k tokens of W_lm h in the precision ``dtype`` (see the module docstring)."""

    def __init__(self, weight: torch.Tensor, dtype: str = "fp32") -> None:
        if dtype not in LM_HEAD_DTYPES:
            raise ValueError(f"LM head dtype must be one of {', '.join(LM_HEAD_DTYPES)}, not {dtype!r}")
        self.dtype = dtype
        weight = weight.detach()
        if dtype == "int8":
            # the fp32 rows rescore the candidates; the LLM's own fp32 weight is shared, not copied
            self.weight = weight.to("cpu", torch.float32).contiguous()
            w = self.weight.numpy()
            self._scale = np.maximum(np.abs(w).max(1), np.finfo(np.float32).tiny) / np.float32(127)
            self._q = np.clip(np.rint(w / self._scale[:, None]), -127, 127).astype(np.int8)
            dequantised = self._q.astype(np.float64) * self._scale[:, None].astype(np.float64)  # what the kernel multiplies by
            rounding = 2.0 * w.shape[1] * 2.0**-24  # float32 summation of d products, any order, and the scaling
            residual = np.linalg.norm(w.astype(np.float64) - dequantised, axis=1)
            self._slack = (residual + rounding * np.linalg.norm(dequantised, axis=1)) * (1 + 1e-6)  # widened past float64's own rounding
        else:
            self.weight = weight.to(torch.float16 if dtype == "fp16" else torch.float32).contiguous()

    @classmethod
    def of(cls, embedder: Any, dtype: str | None = None) -> LMHead:
        """``embedder``'s LM head, in ``dtype`` (None: the one its device calls for, :func:`embedder.hardware.lm_head_dtype`)."""
        from embedder.hardware import device_capability, lm_head_dtype

        if dtype is None:
            dtype = lm_head_dtype(device_capability(str(getattr(embedder, "device", "cpu"))))
        return cls(embedder.causal_lm.get_output_embeddings().weight, dtype)

    @torch.inference_mode()
    def top_tokens(self, h: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
        """Top-k token ids (n, k) int32 and their logits (n, k) float32, best first."""
        h = np.ascontiguousarray(h, dtype=np.float32).reshape(-1, self.weight.shape[1])
        k = min(k, self.weight.shape[0])
        if self.dtype == "int8" and np.isfinite(h).all():
            return self._two_stage(h, k)
        x = torch.as_tensor(h, device=self.weight.device).to(self.weight.dtype)
        vals, ids = torch.topk(x @ self.weight.T, k, dim=-1)
        return ids.cpu().numpy().astype(np.int32), vals.float().cpu().numpy()

    def _two_stage(self, h: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
        vocab = self._q.shape[0]
        lower, upper = np.empty((len(h), vocab)), np.empty((len(h), vocab))
        with _KERNEL_LOCK:
            _int8_bounds(self._q, self._scale, self._slack, h, np.linalg.norm(h.astype(np.float64), axis=1), lower, upper)
        ids, vals = np.empty((len(h), k), np.int32), np.empty((len(h), k), np.float32)
        w = self.weight.numpy()
        for i in range(len(h)):
            cut = kth_largest(lower[i], k)  # <= the true k-th largest logit
            candidates = np.flatnonzero(upper[i] >= cut)  # at least k: upper >= lower
            top_vals, top = torch.topk(torch.from_numpy(_rescore(w, candidates, h[i])), k)
            ids[i], vals[i] = candidates[top.numpy()], top_vals.numpy()
        return ids, vals


__all__ = ["LM_HEAD_DTYPES", "LMHead", "kth_largest"]
