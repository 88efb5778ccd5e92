"""Diagnostics the papers use to judge an embedder through its aligned tokens.

* top-10 aligned tokens of a text before/after training (Text2Token Tables 4 and 7);
* Hit@K, LAR, GAR (text-is-worth-several-tokens Eq. 6-8), with T_s = the text's own tokens
  (``Embedder.literal_token_ids``) and T̂^K = the top-K aligned tokens;
* the variation along each principal component between backbone and trained embedder
  (text-is-worth-several-tokens Eq. 9-10, Text2Token §5.5 / Fig. 6).
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import torch


def aligned_tokens_table(embedders: dict[str, object], texts: Sequence[str], k: int = 10) -> list[dict]:
    """Top-k aligned tokens of each text under each named embedder (e.g. before / after)."""
    rows = [{"text": t} for t in texts]
    for name, emb in embedders.items():
        ids, vals = emb.top_tokens(emb.embed(list(texts)), k)
        for row, i, v in zip(rows, ids, vals):
            row[name] = [(s, round(float(x), 3)) for s, x in zip(emb.token_strings(i), v)]
    return rows


def alignment_metrics(embedder, texts: Sequence[str], k: int = 10, h: np.ndarray | None = None, chunk: int = 256) -> dict:
    """Hit@K (Eq. 6), LAR (Eq. 7) and GAR (Eq. 8) over ``texts``.

    LAR compares T_s with the top-|T_s| aligned tokens (K_i = |T_s| as in Eq. 7); GAR uses
    the same per-text top-K_i sets, pooled over the whole set of texts.
    """
    if h is None:
        h = embedder.embed(list(texts))
    literal = [set(embedder.literal_token_ids(t)) for t in texts]
    k_max = max([k] + [len(s) for s in literal])
    hits, lar = [], []
    aligned_union: set[int] = set()
    literal_union: set[int] = set()
    for s in range(0, len(texts), chunk):
        ids, _ = embedder.top_tokens(h[s : s + chunk], k_max)
        for row, lit in zip(ids, literal[s : s + chunk]):
            if not lit:
                continue
            hits.append(bool(lit & set(row[:k].tolist())))
            inter = lit & set(row[: len(lit)].tolist())
            lar.append(len(inter) / len(lit))
            aligned_union |= inter
            literal_union |= lit
    return {
        f"hit@{k}": float(np.mean(hits)) if hits else 0.0,
        "lar": float(np.mean(lar)) if lar else 0.0,
        "gar": len(aligned_union) / len(literal_union) if literal_union else 0.0,
        "n_texts": len(hits),
    }


def principal_directions(h_before: np.ndarray) -> np.ndarray:
    """U of Eq. 9: right singular vectors of the backbone's embedding matrix (rows u_j, (r, d)).

    Singular vectors have no sign; each u_j is oriented so that the texts' mean projection on
    it is positive, so a negative v_j reads "this component shrank".
    """
    _, _, vt = np.linalg.svd(np.asarray(h_before, dtype=np.float64), full_matrices=False)
    sign = np.sign(np.asarray(h_before, dtype=np.float64).mean(0) @ vt.T)
    sign[sign == 0] = 1
    return vt * sign[:, None]


def pc_variation(h_before: np.ndarray, h_after: np.ndarray) -> np.ndarray:
    """Eq. 10: v_j = E_i[(ĥ_i - h_i)^T u_j] for each principal direction u_j of the backbone."""
    if h_before.shape != h_after.shape:
        raise ValueError(f"embedding shapes differ: {h_before.shape} vs {h_after.shape}")
    u = principal_directions(h_before)
    return (np.asarray(h_after, np.float64) - np.asarray(h_before, np.float64)).mean(0) @ u.T


def plot_pc_variation(
    v: np.ndarray, path: Path, title: str = "Variation along each principal component", first: int = 64
) -> None:
    """Plot v_j for the first ``first`` components (the papers' Fig. 3 / Fig. 6)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    n = min(first, len(v))
    fig, ax = plt.subplots(figsize=(7, 3.6))
    ax.bar(np.arange(1, n + 1), v[:n], color=["tab:red"] + ["tab:blue"] * (n - 1))
    ax.axhline(0, color="black", lw=0.6)
    ax.set_xlabel("principal component j of the backbone's embeddings")
    ax.set_ylabel("v_j = mean (ĥ - h)·u_j")
    ax.set_title(title)
    fig.tight_layout()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp.png")
    fig.savefig(tmp, dpi=110)
    plt.close(fig)
    os.replace(tmp, path)


def pc_summary(v: np.ndarray) -> dict:
    """v_1, the largest |v_j| among the others, and their ratio (is v_1 dominant?)."""
    others = np.abs(v[1:]) if len(v) > 1 else np.zeros(1)
    j = int(others.argmax()) + 2
    return {
        "v1": float(v[0]),
        "max_abs_other": float(others.max()),
        "argmax_other": j,
        "v1_ratio": float(abs(v[0]) / others.max()) if others.max() > 0 else float("inf"),
        "l2_total": float(np.linalg.norm(v)),
    }


def compare_embedders(before, after, texts: Sequence[str], k: int = 10, show: int = 3, out_dir: Path | None = None) -> dict:
    """Everything above for a backbone (``before``) and a trained embedder (``after``)."""
    texts = list(texts)
    with torch.inference_mode():
        hb, ha = before.embed(texts), after.embed(texts)
    report = {
        "n_texts": len(texts),
        "examples": aligned_tokens_table({"before": before, "after": after}, texts[:show], k),
        "before": alignment_metrics(before, texts, k, hb),
        "after": alignment_metrics(after, texts, k, ha),
    }
    v = pc_variation(hb, ha)
    report["pc_variation"] = pc_summary(v) | {"first_10": [round(float(x), 4) for x in v[:10]]}
    if out_dir is not None:
        plot_pc_variation(v, Path(out_dir) / "pc_variation.png")
        report["pc_variation"]["plot"] = str(Path(out_dir) / "pc_variation.png")
    return report
