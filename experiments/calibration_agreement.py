"""Agreement between the channels' lists as a calibration signal (issue 71): does it say which channel
deserves the weight, where the held-out sentences cannot?

    python -m experiments.calibration_agreement --matrices .cache/calibration/final-v3.npz \\
        --matrices .cache/calibration/mpnet-v3.npz --out benchmarks/results/calibration/agreement.json

The channels' overlap is symmetric: it says how much fusing matters, not which side to lean to. Its
asymmetric form is *corroboration* (experiments.calibration.corroboration): how often each channel's
first document stands in the other channel's first ``--depth``. A channel that is more often right has
its first answers kept near the other's top more often, so

    d = share of queries whose encoder-first BM25 corroborates - share whose BM25-first the encoder corroborates

leans to the encoder where positive. It is read off the real queries' lists, never their qrels: a
deployed engine could read it from its own query log. Held-out sentences carry their document's exact
words, so their bias towards BM25 varies by collection; d has no such bias, but no source document either.

Reads ``experiments.calibration --matrices`` (``|real``, ``|user``, ``|pseudo|0``, ``|agree``) and writes:

* how well d and the pseudo-queries rank the pairs by the real strength gap (encoder alone minus BM25
  alone, on the qrels: Spearman over pairs), and whether d predicts what the shipped pick misses (its
  BM25 weight minus the best one of the same method);
* rules, each judged like experiments.calibration_sources (regret against the oracle, margin over the
  better B+E): the shipped pick; the pick with its shift nudged one grid step by d (shift 0, 0.1 or
  0.2 by two thresholds on d); d alone mapped to a max-normalised weight. Thresholds and maps are
  chosen on the other collections (leave one collection out).
"""
from __future__ import annotations

import argparse
import itertools
import sys
from pathlib import Path

import numpy as np
from scipy.stats import spearmanr

from benchmarks.loco import REGRET_COLUMNS, regret_summary
from benchmarks.tables import study_command, write_table
from indexer import calibration as cal

SETTINGS = cal.grid(2)
STEP = cal.GRID_STEP


def corroboration_gap(agree: np.ndarray, depth: int) -> float:
    """d: the share of queries whose encoder-first is in BM25's first ``depth``, minus the share whose
    BM25-first is in the encoder's (``agree``: experiments.calibration.corroboration's ranks, BM25's row first)."""
    return float((agree[1] <= depth).mean() - (agree[0] <= depth).mean())


def at(method: str, bm25: float) -> int:
    """The grid index of ``method`` with BM25 weight ``bm25`` (the encoder the rest)."""
    w = round(bm25, 10)
    return next(i for i, s in enumerate(SETTINGS) if s.method == method and np.isclose(s.weights[0], w))


class Pair:
    """One collection x encoder x analyser: the matrices a rule is judged on."""

    def __init__(self, name: str, store: dict[str, np.ndarray], depth: int) -> None:
        self.name, self.collection = name, name.split("|")[0]
        self.real = store[f"{name}|real"].mean(axis=1)
        self.user = float(store[f"{name}|user"].mean(axis=1).max())
        self.pseudo = cal.ndcg_at_10(store[f"{name}|pseudo|0"]).mean(axis=1)
        self.d = corroboration_gap(store[f"{name}|agree"], depth)

    def judged(self, pick: int) -> dict:
        return {"pick": cal.label(SETTINGS[pick], ["bm25", "enc"]), "ndcg10": float(self.real[pick]),
                "regret": float(self.real.max() - self.real[pick]), "vs_user": float(self.real[pick] - self.user)}


def nudged(pair: Pair, low: float, high: float) -> int:
    """The shipped pick with its shift one step less where d < ``low`` (lean back to BM25) and one step
    more where d > ``high`` (further to the encoder)."""
    shift = cal.SHIFT - STEP * (pair.d < low) + STEP * (pair.d > high)
    return cal.select(pair.pseudo, SETTINGS, shift=shift)


def mapped(pair: Pair, a: float, b: float) -> int:
    """d alone: max-normalised, BM25 weight ``a - b * d`` on the grid, both channels kept."""
    return at("max", float(np.clip(round((a - b * pair.d) / STEP) * STEP, STEP, 1 - STEP)))


def summary(judged) -> list:
    """:func:`benchmarks.loco.regret_summary` of judged picks (each a dict with "regret" and "vs_user")."""
    judged = list(judged)
    return regret_summary([j["regret"] for j in judged], [j["vs_user"] for j in judged])


def left_out(pairs: list[Pair], rule, params: list[tuple], alone: tuple) -> tuple[list[dict], dict[str, tuple]]:
    """Each collection's pairs judged under the ``params`` with the lowest mean regret on the other collections
    (``alone`` where there is no other collection to choose on)."""
    out, chosen = [], {}
    for c in sorted({p.collection for p in pairs}):
        train = [p for p in pairs if p.collection != c]
        best = alone if not train else min(params, key=lambda ps: (np.mean([p.judged(rule(p, *ps))["regret"] for p in train]), ps))
        chosen[c] = best
        out += [p.judged(rule(p, *best)) for p in pairs if p.collection == c]
    return out, chosen


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--matrices", type=Path, action="append", required=True,
                   help="experiments.calibration --matrices (with '|agree' and '|user'); repeatable")
    p.add_argument("--depth", type=int, default=10, help="how deep in the other list a first document counts as corroborated")
    p.add_argument("--out", type=Path, required=True)
    args = p.parse_args(argv)
    store = {k: v for path in args.matrices for k, v in np.load(path).items()}
    names = sorted(k.removesuffix("|agree") for k in store if k.endswith("|agree"))
    if not names:
        raise ValueError(f"{', '.join(map(str, args.matrices))}: no '|agree' matrices (run experiments.calibration --matrices)")
    pairs = [Pair(n, store, args.depth) for n in names]

    bm25_alone, enc_alone = at("minmax", 1.0), at("minmax", 0.0)
    real_gap = [p.real[enc_alone] - p.real[bm25_alone] for p in pairs]
    pseudo_gap = [p.pseudo[enc_alone] - p.pseudo[bm25_alone] for p in pairs]
    shipped = [cal.select(p.pseudo, SETTINGS) for p in pairs]
    # what the shipped pick misses: its BM25 weight minus the best one of its own method (positive: too much BM25)
    missed = []
    for p, pick in zip(pairs, shipped):
        same = [i for i, s in enumerate(SETTINGS) if s.method == SETTINGS[pick].method]
        missed.append(SETTINGS[pick].weights[0] - SETTINGS[max(same, key=lambda i: p.real[i])].weights[0])
    signals = {  # None where a side is constant (one pair, or every pair alike): no rank order to compare
        name: (float(rho) if np.isfinite(rho) else None) for name, rho in (
            ("d vs real strength gap", spearmanr([p.d for p in pairs], real_gap)[0] if len(pairs) > 2 else np.nan),
            ("pseudo strength gap vs real strength gap", spearmanr(pseudo_gap, real_gap)[0] if len(pairs) > 2 else np.nan),
            ("d vs the shipped pick's excess BM25 weight", spearmanr([p.d for p in pairs], missed)[0] if len(pairs) > 2 else np.nan))
    }

    ds = sorted({round(p.d, 3) for p in pairs})
    cuts = [-1.0, *[(x + y) / 2 for x, y in itertools.pairwise(ds)], 1.0]
    nudge_params = [(lo, hi) for lo, hi in itertools.product(cuts, cuts) if lo <= hi]
    map_params = [(a, b) for a in np.round(np.arange(0.1, 0.91, 0.1), 1) for b in np.arange(-2.0, 2.01, 0.25)]
    rows, details = [], {}
    judged = [p.judged(i) for p, i in zip(pairs, shipped)]
    rows.append(["shipped pick (shift 0.1)", "", *summary(judged)])
    details["shipped"] = dict(zip(names, judged))
    # alone: the shipped shift, and the old fixed max-normalised BM25 0.3
    for label, rule, params, alone in (("pick, shift nudged by d", nudged, nudge_params, (-1.0, 1.0)),
                                       ("d alone, max-normalised", mapped, map_params, (0.3, 0.0))):
        fitted = min(params, key=lambda ps: (np.mean([p.judged(rule(p, *ps))["regret"] for p in pairs]), ps))
        judged = [p.judged(rule(p, *fitted)) for p in pairs]
        rows.append([label, "fitted on all (optimistic): " + ", ".join(f"{v:.3g}" for v in fitted), *summary(judged)])
        details[f"{label}|fitted"] = dict(zip(names, judged))
        judged, chosen = left_out(pairs, rule, params, alone)
        rows.append([label, "left out: " + "; ".join(f"{c} " + ", ".join(f"{v:.3g}" for v in ps) for c, ps in chosen.items()), *summary(judged)])
        details[f"{label}|left out"] = {p.name: j for p, j in zip(sorted(pairs, key=lambda p: p.collection), judged)}
    details["pairs"] = {p.name: {"d": round(p.d, 4), "real gap": round(float(g), 4), "pseudo gap": round(float(h), 4),
                                 "shipped excess bm25": round(float(m), 2)}
                        for p, g, h, m in zip(pairs, real_gap, pseudo_gap, missed)}
    details["spearman"] = {k: None if v is None else round(v, 3) for k, v in signals.items()}
    write_table(
        args.out,
        title="Corroboration between the channels' lists as a calibration signal",
        command=study_command("experiments.calibration_agreement", argv),
        description=(
            f"{len(pairs)} pairs (collection x encoder x BM25 analyser). d: share of real queries whose encoder-first is in BM25's "
            f"first {args.depth} minus the share whose BM25-first is in the encoder's (no qrels read). Spearman over pairs: "
            + "; ".join(f"{k} " + ("undefined" if v is None else f"{v:+.3f}") for k, v in signals.items())
            + ". *regret*: the qrels-best setting's nDCG@10 minus the rule's; *vs best B+E*: the rule minus the better of "
            "Pyserini BM25 + the encoder at min-max 0.6/0.4 and 0.5/0.5. 'left out': each collection's thresholds or map "
            "chosen on the other collections."),
        columns=["rule", "parameters", *REGRET_COLUMNS],
        rows=rows,
        details=details,
    )
    print(f"wrote {args.out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
