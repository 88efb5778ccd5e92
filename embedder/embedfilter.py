"""EmbedFilter (embedfilter paper §4): keep the bulk of the LM head's spectrum.

SVD of the unembedding matrix W_U = U Σ Vᵀ (no centring). For a filtering ratio τ keep
k = d // τ right singular vectors from the middle of the spectrum: drop ⌊(d − k) / 2⌋ with
the largest singular values and the rest with the smallest, and project e ↦ e · V[l:r]
(a k-dimensional embedding; V is orthogonal, so this preserves distances within the kept
subspace, §4.2). Training-free and tied to the backbone's weights only.
"""
from __future__ import annotations

import numpy as np

# The paper's most used ratio (its ablations and whitening comparison use τ = 2); our own
# measurements for this backbone are in BENCHMARKS.md (benchmarks/embedfilter_sweep.py).
DEFAULT_TAU = 2


def embedfilter_projection(w_u: np.ndarray, tau: int) -> tuple[np.ndarray, int, int]:
    """The (d, k) projection V[:, l:r] for ratio ``tau``, with l and r (singular values descending).

    The right singular vectors come from the eigendecomposition of the d x d Gram matrix
    W_Uᵀ W_U = V Σ² Vᵀ, which avoids an SVD of the (vocab x d) matrix.
    """
    if tau < 1:
        raise ValueError("tau must be >= 1")
    w = np.asarray(w_u, dtype=np.float64)
    d = w.shape[1]
    eigval, eigvec = np.linalg.eigh(w.T @ w)  # ascending
    order = np.argsort(eigval)[::-1]  # singular values descending
    v = eigvec[:, order]
    k = d // tau
    left = (d - k) // 2
    return np.ascontiguousarray(v[:, left : left + k], dtype=np.float32), left, left + k
