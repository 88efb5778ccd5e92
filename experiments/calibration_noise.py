"""How close to the per-collection oracle any fusion rule can be expected to land (issue 71): the
oracle is chosen on the same qrels it is scored on, so part of its lead is the queries' noise.

    python -m experiments.calibration_noise --matrices .cache/calibration/final-v2.npz \\
        --out benchmarks/results/calibration/noise-floor.json

Reads the matrices ``experiments.calibration --matrices`` wrote (per collection, encoder and analyser:
every grid setting's nDCG@10 on each real query, and the calibration's ranks of its pseudo-queries'
sources). Over ``--splits`` random halvings of the queries, it compares on the held-out half B:

* *half-qrels oracle*: the setting best on half A's qrels (a rule that reads labels, half of them);
* *calibrated*: the setting indexer.calibration.select picks from the pseudo-queries (no labels);

each as its regret against the setting best on B itself. Where a rule reading half the labels cannot
come within 0.005 of B's best, that bar is below what the collection's queries can tell apart.
"""
from __future__ import annotations

import argparse
import sys
import zlib
from pathlib import Path

import numpy as np

from benchmarks.loco import rounded
from benchmarks.tables import study_command, write_table
from indexer import calibration as cal


def half_splits(real: np.ndarray, pick: int, splits: int, rng: np.random.Generator,
                user: np.ndarray | None = None) -> dict[str, np.ndarray]:
    """Per random halving of the queries (``splits`` of them): the held-out regret of the setting best on
    half A, and of ``pick``, on half B. ``real`` is (settings, queries) nDCG@10. With ``user`` (B+E's rows,
    (2, queries)), also whether each falls below the better B+E on half B, the issue's "never below"."""
    n = real.shape[1]
    out: dict[str, list] = {"oracle": [], "calibrated": [], "oracle below": [], "calibrated below": []}
    for _ in range(splits):
        perm = rng.permutation(n)
        half_a, half_b = perm[: n // 2], perm[n // 2:]
        a, b = real[:, half_a].mean(axis=1), real[:, half_b].mean(axis=1)
        chosen = int(np.argmax(a))
        out["oracle"].append(b.max() - b[chosen])
        out["calibrated"].append(b.max() - b[pick])
        if user is not None:
            best_user = user[:, half_b].mean(axis=1).max()
            out["oracle below"].append(b[chosen] < best_user)
            out["calibrated below"].append(b[pick] < best_user)
    return {k: np.asarray(v) for k, v in out.items() if v}


def half_split_regrets(real: np.ndarray, pick: int, splits: int, rng: np.random.Generator) -> tuple[float, float]:
    """Mean held-out regret of (the setting best on a random half of the queries, ``pick``) on the
    other half, over ``splits`` halvings; ``real`` is (settings, queries) nDCG@10."""
    h = half_splits(real, pick, splits, rng)
    return float(h["oracle"].mean()), float(h["calibrated"].mean())


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--matrices", type=Path, action="append", required=True,
                   help="an experiments.calibration --matrices file (.npz); repeatable (e.g. one run per encoder)")
    p.add_argument("--splits", type=int, default=200)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", type=Path, required=True)
    args = p.parse_args(argv)
    store = {k: v for path in args.matrices for k, v in np.load(path).items()}
    settings = cal.grid(2)
    rows, below = [], []
    for pair in sorted(k.removesuffix("|real") for k in store if k.endswith("|real")):
        real = store[f"{pair}|real"]
        if real.shape[0] != len(settings):
            raise ValueError(f"{pair} has {real.shape[0]} settings, the grid {len(settings)}")
        pick = cal.select(cal.ndcg_at_10(store[f"{pair}|pseudo|0"]).mean(axis=1), settings)
        # each pair its own stream, so that adding a pair (an encoder) leaves the others' figures as they were
        rng = np.random.default_rng([args.seed, zlib.crc32(pair.encode())])
        h = half_splits(real, pick, args.splits, rng, store.get(f"{pair}|user"))
        collection, encoder, analyser = pair.split("|")
        shares = [float(h[k].mean()) for k in ("oracle below", "calibrated below")] if "oracle below" in h else [None, None]
        if "oracle below" in h:
            below.append(np.stack([h["oracle below"], h["calibrated below"]]))
        rows.append([collection, encoder, analyser, real.shape[1], *rounded([float(h["oracle"].mean()), float(h["calibrated"].mean())]),
                     *[None if v is None else round(v, 3) for v in shares]])
    if not rows:
        raise ValueError(f"{', '.join(map(str, args.matrices))}: no '|real' matrices")
    means = np.asarray([r[4:6] for r in rows], float)
    within = (means <= 0.005).sum(axis=0).tolist()
    expected = [round(float(np.mean([r[i] for r in rows if r[i] is not None])), 3) if below else None for i in (6, 7)]
    rows.append(["mean", "", "", "", *rounded(means.mean(axis=0).tolist()), *expected])
    rows.append(["within 0.005 (pairs)", "", "", "", *within, None, None])
    if below:  # pairs below the better B+E in one halving (each pair its own halving): how often none is
        counts = np.stack(below).sum(axis=0)  # (2 rules, splits)
        rows.append([f"pairs below best B+E per halving (of {len(below)}), mean", "", "", "", None, None,
                     *[round(float(c.mean()), 2) for c in counts]])
        rows.append(["halvings with no pair below best B+E (share)", "", "", "", None, None,
                     *[round(float((c == 0).mean()), 3) for c in counts]])
    write_table(
        args.out,
        title="The oracle's noise floor: a fusion chosen on half the qrels against the label-free calibration",
        command=study_command("experiments.calibration_noise", argv),
        description=(
            f"Held-out regret (nDCG@10) on a random half of each collection's queries, against the setting best on that half, "
            f"mean over {args.splits} halvings. *half-qrels oracle*: the grid setting best on the other half's qrels; "
            "*calibrated*: indexer.calibration's label-free pick. *below best B+E*: the share of halvings in which the rule's pick "
            "scores below the better of Pyserini BM25 + the encoder at min-max 0.6/0.4 and 0.5/0.5 on the held-out half (matrices "
            "with '|user' rows only). Grid and matrices: experiments.calibration."),
        columns=["collection", "encoder", "analyser", "queries", "half-qrels oracle regret", "calibrated regret",
                 "half-qrels oracle below best B+E (share)", "calibrated below best B+E (share)"],
        rows=rows,
    )
    print(f"wrote {args.out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
