"""Model-derived token targets (Text2Token §4.3, Eq. 18-19, Appendix C).

Q_θ0(·|x) = softmax(W_lm h) of the frozen backbone with the same prompt and pooling as
training and indexing; Q̄ = the mean of Q_θ0 over a corpus subset; a filter ŷ contrasts a
text's Q with Q̄ and the target is softmax(ŷ / τ).

Numerics: with τ = 1e-4, ŷ / τ spans 10^4, far beyond float32's exp range, and for the
Div filter ŷ = Q / (Q + Q̄) sits next to 1 for every key token, where float32 cannot tell
1 - 1e-8 from 1. Everything is computed in float64 from log-probabilities, and Div uses the
shift-invariant form ŷ - 1 = -sigmoid(log Q̄ - log Q), exact down to the smallest ratios.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Sequence

import numpy as np
import torch

from training.target_cache import SparseTargets, from_dense_topn
from training.text2token.recipe import ModelTargetConfig

log = logging.getLogger(__name__)

LOG_FLOOR = -700.0  # log of a float64 probability that underflowed to 0 (keeps -Q log Q̄ finite)


def filtered_scores(log_q: torch.Tensor, log_qbar: torch.Tensor, kind: str = "div") -> torch.Tensor:
    """ŷ of Appendix C for each row of ``log_q`` (N, V) against ``log_qbar`` (V,), float64.

    div: Q / (Q + Q̄), returned shifted by -1 (softmax is shift-invariant) for precision;
    log: -Q log Q̄; sub: log Q - log Q̄.
    """
    log_q = log_q.double()
    log_qbar = log_qbar.double().clamp(min=LOG_FLOOR)
    if kind == "div":
        return -torch.sigmoid(log_qbar - log_q)
    if kind == "log":
        return -log_q.exp() * log_qbar
    if kind == "sub":
        return log_q - log_qbar
    raise ValueError(f"unknown filter {kind!r} (div, log, sub)")


def model_target(log_q: torch.Tensor, log_qbar: torch.Tensor, kind: str = "div", tau: float = 1e-4) -> torch.Tensor:
    """Eq. 19: softmax(ŷ / τ) over the vocabulary, float64 (N, V)."""
    return torch.softmax(filtered_scores(log_q, log_qbar, kind) / tau, dim=-1)


def log_probs(embedder, h: torch.Tensor) -> torch.Tensor:
    """log Q_θ0 = log_softmax(W_lm h) in float64 (N, V)."""
    return torch.log_softmax(embedder.logits(h).double(), dim=-1)


@torch.inference_mode()
def common_log_distribution(embedder, h: torch.Tensor, chunk: int = 256) -> torch.Tensor:
    """log Q̄ = log of the mean of Q_θ0 over the rows of ``h`` (the corpus subset), float64 (V,)."""
    total = torch.zeros(embedder.vocab_size, dtype=torch.float64)
    for s in range(0, h.shape[0], chunk):
        total += log_probs(embedder, h[s : s + chunk]).exp().sum(0).cpu()
    return (total / h.shape[0]).log()


@torch.inference_mode()
def pooled_embeddings(embedder, texts: Sequence[str], batch_size: int, progress: bool = False) -> torch.Tensor:
    """Pooled h of each text (N, d) float32, in input order, through ``embedder.pooled``.

    Longest texts first to keep padding small, as indexing does.
    """
    ids = embedder.prompt_ids(texts)
    order = np.argsort([-len(x) for x in ids], kind="stable")
    out = torch.zeros((len(texts), embedder.dim), dtype=torch.float32)
    bar = None
    if progress:
        from tqdm.auto import tqdm

        bar = tqdm(total=len(texts), desc="Q_θ0 (backbone)", unit="text")
    t0, n_tok = time.perf_counter(), 0
    for s in range(0, len(order), batch_size):
        pos = order[s : s + batch_size]
        batch = [ids[i] for i in pos]
        out[torch.from_numpy(pos)] = embedder.pooled(batch).float().cpu()
        n_tok += sum(len(x) for x in batch)
        if bar is not None:
            bar.update(len(pos))
            bar.set_postfix(tok_s=f"{n_tok / (time.perf_counter() - t0):.0f}")
    if bar is not None:
        bar.close()
    return out


@torch.inference_mode()
def compute_model_targets(
    embedder,
    texts: Sequence[str],
    cfg: ModelTargetConfig,
    top_n: int,
    seed: int = 0,
    batch_size: int = 32,
    progress: bool = True,
) -> SparseTargets:
    """Model-derived targets for a seeded pool of ``cfg.pool_size`` texts (all when None).

    Q̄ is averaged over the first ``cfg.common_size`` texts of the pool, so it costs no extra
    forward pass. Texts outside the pool get no target (``valid()`` is False for them).
    ``embedder`` must be the frozen backbone (no adapter, or adapters disabled).
    """
    t0 = time.perf_counter()
    n = len(texts)
    perm = np.random.default_rng([seed, 0x51D]).permutation(n)
    pool = perm[: cfg.pool_size] if cfg.pool_size is not None else perm
    h = pooled_embeddings(embedder, [texts[i] for i in pool], batch_size, progress)
    n_common = min(cfg.common_size, len(pool))
    log_qbar = common_log_distribution(embedder, h[:n_common])

    ids = np.full((n, top_n), -1, dtype=np.int32)
    probs = np.zeros((n, top_n), dtype=np.float32)
    rest = np.zeros(n, dtype=np.float32)
    eff = np.zeros(len(pool))
    chunk = 128
    for s in range(0, len(pool), chunk):
        p = model_target(log_probs(embedder, h[s : s + chunk]), log_qbar, cfg.filter, cfg.tau).cpu()
        rows = pool[s : s + chunk]
        ids[rows], probs[rows], rest[rows] = from_dense_topn(p, top_n)
        ent = -(torch.where(p > 0, p * p.log(), torch.zeros_like(p))).sum(1)
        eff[s : s + chunk] = ent.exp().numpy()
    meta = {
        "kind": "model",
        "config": {"filter": cfg.filter, "tau": cfg.tau, "common_size": cfg.common_size, "pool_size": cfg.pool_size},
        "n_texts": n,
        "n_pool": len(pool),
        "n_common": int(n_common),
        "seed": seed,
        "rest_mass": {"mean": float(rest[pool].mean()), "max": float(rest[pool].max())},
        "effective_tokens": {"mean": float(eff.mean()), "median": float(np.median(eff))},
        "seconds": round(time.perf_counter() - t0, 2),
    }
    log.info(
        "model-derived targets: %d texts (Q̄ over %d), filter %s, tau %g, effective tokens %.1f (median %.1f), "
        "mass outside top-%d %.2e (max %.2e), %.1f s",
        len(pool),
        n_common,
        cfg.filter,
        cfg.tau,
        meta["effective_tokens"]["mean"],
        meta["effective_tokens"]["median"],
        top_n,
        meta["rest_mass"]["mean"],
        meta["rest_mass"]["max"],
        meta["seconds"],
    )
    if not math.isfinite(meta["rest_mass"]["mean"]):
        raise FloatingPointError("model-derived target is not finite")
    return SparseTargets(ids, probs, rest, embedder.vocab_size, meta)
