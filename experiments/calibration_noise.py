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


def half_split_regrets(real: np.ndarray, pick: int, splits: int, rng: np.random.Generator) -> tuple[float, float]:
    """Mean held-out regret of (the setting best on a random half of the queries, ``pick``) on the
    other half, over ``splits`` halvings; ``real`` is (settings, queries) nDCG@10."""
    n = real.shape[1]
    oracle, fixed = [], []
    for _ in range(splits):
        perm = rng.permutation(n)
        a, b = real[:, perm[: n // 2]].mean(axis=1), real[:, perm[n // 2:]].mean(axis=1)
        oracle.append(b.max() - b[int(np.argmax(a))])
        fixed.append(b.max() - b[pick])
    return float(np.mean(oracle)), float(np.mean(fixed))


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
    rows = []
    for pair in sorted(k.removesuffix("|real") for k in store if k.endswith("|real")):
        real = store[f"{pair}|real"]
        if real.shape[0] != len(settings):
            raise ValueError(f"{pair} has {real.shape[0]} settings, the grid {len(settings)}")
        pick = cal.select(cal.ndcg_at_10(store[f"{pair}|pseudo|0"]).mean(axis=1), settings)
        # each pair its own stream, so that adding a pair (an encoder) leaves the others' figures as they were
        rng = np.random.default_rng([args.seed, zlib.crc32(pair.encode())])
        oracle, calibrated = half_split_regrets(real, pick, args.splits, rng)
        collection, encoder, analyser = pair.split("|")
        rows.append([collection, encoder, analyser, real.shape[1], *rounded([oracle, calibrated])])
    if not rows:
        raise ValueError(f"{', '.join(map(str, args.matrices))}: no '|real' matrices")
    means = np.asarray([r[4:] for r in rows], float)
    within = (means <= 0.005).sum(axis=0).tolist()
    rows.append(["mean", "", "", "", *rounded(means.mean(axis=0).tolist())])
    rows.append(["within 0.005 (pairs)", "", "", "", *within])
    write_table(
        args.out,
        title="The oracle's noise floor: a fusion chosen on half the qrels against the label-free calibration",
        command=study_command("experiments.calibration_noise", argv),
        description=(
            f"Held-out regret (nDCG@10) on a random half of each collection's queries, against the setting best on that half, "
            f"mean over {args.splits} halvings. *half-qrels oracle*: the grid setting best on the other half's qrels; "
            "*calibrated*: indexer.calibration's label-free pick. Grid and matrices: experiments.calibration."),
        columns=["collection", "encoder", "analyser", "queries", "half-qrels oracle regret", "calibrated regret"],
        rows=rows,
    )
    print(f"wrote {args.out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
