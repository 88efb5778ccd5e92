"""Which pseudo-queries should calibration read (issue 71): sentences held out of the documents, or
queries an instruct LLM wrote for them, or both?

    python -m experiments.calibration_sources --matrices .cache/calibration/written.npz \\
        --table benchmarks/results/calibration/calibration-written.json \\
        --out benchmarks/results/calibration/sources.json

Reads what ``experiments.calibration --pseudo-from DIR --matrices M --out T`` wrote: per collection, encoder
and analyser, every grid setting's nDCG@10 on each real query (``|real``), and where each setting ranks the
sources of the held-out sentences (``|pseudo|0``) and of the written queries (``|pseudo|gen``); the table
gives what a user would build (Pyserini BM25 + the same encoder, min-max 0.6/0.4 and 0.5/0.5). Each rule
is a source (held-out, written, both: their pseudo nDCG@10 averaged setting by setting), a selection (the
pseudo-best setting, or the best once each setting's score is averaged with its grid neighbours') and a shift
of indexer.calibration.select (BM25's weight moved to the encoder after the pick). For each rule:
regret against the per-pair oracle (the setting best on the qrels), the pairs within 0.005 of it, the
margin over the better B+E, and the pairs below it. The last rows choose each source's shift leaving each
collection out (the shift with the lowest mean regret on the other collections), so the rule is judged on
collections it was not chosen on.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

from benchmarks.loco import REGRET_COLUMNS, regret_summary
from benchmarks.tables import study_command, write_table
from indexer import calibration as cal

SHIFTS = (0.0, 0.1, 0.2)
SOURCES = ("held-out", "written", "both")
SELECTIONS = {False: "argmax", True: "smoothed"}  # the pseudo-best setting, or the best after smoothed()


def pseudo_scores(store: dict[str, np.ndarray], pair: str, source: str) -> np.ndarray:
    """Each setting's mean pseudo nDCG@10 for ``pair`` under ``source``."""
    held = cal.ndcg_at_10(store[f"{pair}|pseudo|0"]).mean(axis=1)
    written = cal.ndcg_at_10(store[f"{pair}|pseudo|gen"]).mean(axis=1)
    return {"held-out": held, "written": written, "both": (held + written) / 2}[source]


def smoothed(scores: np.ndarray, settings: list[cal.Setting]) -> np.ndarray:
    """Each setting's pseudo score averaged with its grid neighbours' (same method, BM25 weight one step either
    side): the argmax of a noisy curve jumps between near-equal peaks, the smoothed curve's less."""
    at = {(s.method, s.weights): i for i, s in enumerate(settings)}
    out = np.empty_like(scores)
    for i, s in enumerate(settings):
        near = [i] + [at[(s.method, (w, round(1 - w, 10)))] for w in (round(s.weights[0] - cal.GRID_STEP, 10), round(s.weights[0] + cal.GRID_STEP, 10))
                      if (s.method, (w, round(1 - w, 10))) in at]
        out[i] = scores[near].mean()
    return out


def user_baselines(table: Path) -> dict[str, float]:
    """The better B+E nDCG@10 per pair ("collection|encoder|analyser"), from an experiments.calibration table."""
    data = json.loads(table.read_text(encoding="utf-8"))
    cols = data["columns"]
    out = {}
    for row in data["rows"]:
        pair = "|".join(str(v) for v in row[:3])
        out[pair] = max(float(row[cols.index("B+E 0.6/0.4")]), float(row[cols.index("B+E 0.5/0.5")]))
    return out


def judge(store: dict[str, np.ndarray], users: dict[str, float], pairs: list[str], source: str, shift: float,
          smooth: bool = False) -> dict[str, dict]:
    """Per pair: the picked setting's nDCG@10, its regret against the oracle and its margin over the better B+E."""
    settings = cal.grid(2)
    out = {}
    for pair in pairs:
        real = store[f"{pair}|real"].mean(axis=1)
        scores = pseudo_scores(store, pair, source)
        pick = cal.select(smoothed(scores, settings) if smooth else scores, settings, shift=shift)
        out[pair] = {"pick": cal.label(settings[pick], ["bm25", "enc"]), "ndcg10": float(real[pick]),
                     "regret": float(real.max() - real[pick]), "vs_user": float(real[pick] - users[pair])}
    return out


def summary(judged) -> list:
    """:func:`benchmarks.loco.regret_summary` of judged picks (each a dict with "regret" and "vs_user")."""
    judged = list(judged)
    return regret_summary([j["regret"] for j in judged], [j["vs_user"] for j in judged])


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--matrices", type=Path, action="append", required=True,
                   help="experiments.calibration --matrices, run with --pseudo-from; repeatable (e.g. one run per collection)")
    p.add_argument("--table", type=Path, action="append", required=True, help="the same runs' --out tables (for the B+E baselines); repeatable")
    p.add_argument("--out", type=Path, required=True)
    args = p.parse_args(argv)
    store = {k: v for path in args.matrices for k, v in np.load(path).items()}
    users = {k: v for path in args.table for k, v in user_baselines(path).items()}
    pairs = sorted(k.removesuffix("|real") for k in store if k.endswith("|real") and f"{k.removesuffix('|real')}|pseudo|gen" in store)
    if not pairs:
        raise ValueError(f"{', '.join(map(str, args.matrices))}: no pair has both '|real' and '|pseudo|gen' matrices (run experiments.calibration --pseudo-from)")
    missing = [pair for pair in pairs if pair not in users]
    if missing:
        raise ValueError(f"{', '.join(map(str, args.table))}: no row for {', '.join(missing)}")
    rows, details = [], {}
    for smooth in (False, True):
        for source in SOURCES:
            for shift in SHIFTS:
                judged = judge(store, users, pairs, source, shift, smooth)
                rows.append([source, SELECTIONS[smooth], f"{shift:g}", *summary(judged.values())])
                details[f"{source}|{SELECTIONS[smooth]}|{shift:g}"] = {
                    pair: {k: (round(v, 4) if isinstance(v, float) else v) for k, v in j.items()} for pair, j in judged.items()}
    collections = sorted({pair.split("|")[0] for pair in pairs})
    for smooth in (False, True):
        for source in SOURCES:  # each source's shift chosen on the other collections
            held_out: dict[str, dict] = {}
            chosen = {}
            for c in collections:
                train = [pair for pair in pairs if not pair.startswith(f"{c}|")]
                test = [pair for pair in pairs if pair.startswith(f"{c}|")]
                best = cal.SHIFT if not train else min(  # one collection alone: nothing to choose on, the shipped shift
                    SHIFTS, key=lambda s: (np.mean([j["regret"] for j in judge(store, users, train, source, s, smooth).values()]), s))
                chosen[c] = best
                held_out.update(judge(store, users, test, source, best, smooth))
            rows.append([source, SELECTIONS[smooth], "left out: " + ", ".join(f"{c} {s:g}" for c, s in chosen.items()), *summary(held_out.values())])
    write_table(
        args.out,
        title="Calibration's pseudo-queries: sentences held out of the documents, queries an LLM wrote, or both",
        command=study_command("experiments.calibration_sources", argv),
        description=(
            f"{len(pairs)} pairs (collection x encoder x BM25 analyser). Each rule picks the pseudo-best grid setting and moves "
            "BM25's weight by the shift to the encoder (indexer.calibration.select). *regret*: the qrels-best setting's nDCG@10 "
            "minus the pick's; *vs best B+E*: the pick minus the better of Pyserini BM25 + the encoder at min-max 0.6/0.4 and "
            "0.5/0.5. *smoothed*: each setting's pseudo score averaged with its grid neighbours' before the pick. The 'left out' "
            "rows give, per collection, the shift chosen on the other collections, and the scores of those picks."),
        columns=["source", "selection", "shift", *REGRET_COLUMNS],
        rows=rows,
        details=details,
    )
    print(f"wrote {args.out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
