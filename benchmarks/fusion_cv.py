"""Choose hybrid fusion settings on held-out queries, and report what they are worth.

    python -m benchmarks.fusion_cv --runs DIR --channels sparse,dense,bm25 \\
        --baseline-runs benchmarks/results/beir-shared --baseline bm25-pyserini \\
        --out benchmarks/results/fusion_cv.json

``--runs`` is a ``beir-eval`` output folder holding each channel's TREC run (depth 100) on
each collection. Fusion is per query (min-max normalisation and reciprocal ranks only look
at the query's own lists), so every setting's per-query nDCG@10 is computed once, by ranx,
and each protocol below is only a choice among settings:

* **k-fold** (within a collection): queries split into folds (seeded); each fold is scored
  with the setting that is best on the other folds' queries.
* **leave-one-collection-out** (LOCO): each collection is scored with the setting that is
  best (mean over collections) on the other collections: how the shipped default behaves
  on a collection it was not tuned on.
* **default**: the setting best over all collections: what ``retriever.DEFAULT_FUSION``
  records. Its numbers on these collections are in-sample; the two above are not.

Settings: "minmax" (per-query min-max, weighted sum; ranx ``wsum``) with weights on a simplex
grid, and "rrf" (ranx ``rrf``) with k in a small grid over every subset of two or more channels.
"""
from __future__ import annotations

import argparse
import itertools
import shlex
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np

import benchmarks  # noqa: F401  (cache locations first)
from benchmarks.tables import write_table

RRF_KS = (10, 30, 60, 100)
METRIC = "ndcg@10"


@dataclass(frozen=True)
class Setting:
    method: str  # "minmax" or "rrf"
    weights: tuple[float, ...]  # one per channel (rrf: 0 or 1 = channel left out or used)
    k: int = 60  # rrf constant

    def label(self, channels: list[str]) -> str:
        used = ", ".join(f"{c} {w:g}" for c, w in zip(channels, self.weights) if w > 0)
        return f"{self.method}({used})" + (f" k={self.k}" if self.method == "rrf" else "")

    def to_dict(self, channels: list[str]) -> dict:
        d = {"method": self.method, "weights": dict(zip(channels, self.weights))}
        if self.method == "rrf":
            d["rrf_k"] = self.k
        return d


def settings_grid(n_channels: int, step: float = 0.1) -> list[Setting]:
    """Min-max weights on the simplex (step ``step``, at least two channels used) and RRF
    over every subset of at least two channels, for each k in RRF_KS."""
    units = round(1 / step)
    out = []
    for combo in itertools.product(range(units + 1), repeat=n_channels):
        if sum(combo) == units and sum(c > 0 for c in combo) >= 2:
            out.append(Setting("minmax", tuple(round(c * step, 10) for c in combo)))
    for mask in itertools.product((0.0, 1.0), repeat=n_channels):
        if sum(mask) >= 2:
            out.extend(Setting("rrf", mask, k) for k in RRF_KS)
    return out


def fused_run(runs: list, setting: Setting):
    """The ranx fusion of one collection's channel runs under ``setting``."""
    from ranx import fuse

    used = [(r, w) for r, w in zip(runs, setting.weights) if w > 0]
    if setting.method == "minmax":
        return fuse(runs=[r for r, _ in used], norm="min-max", method="wsum", params={"weights": [w for _, w in used]})
    return fuse(runs=[r for r, _ in used], method="rrf", params={"k": setting.k})


def per_query(qrels, run, query_ids: list[str]) -> np.ndarray:
    """nDCG@10 of each query of ``query_ids`` (0 for a query the run does not answer)."""
    from ranx import Run, evaluate

    hits = run.to_dict() if hasattr(run, "to_dict") else run
    answered = {q: hits[q] for q in query_ids if hits.get(q)}
    scores = dict.fromkeys(query_ids, 0.0)
    if answered:
        values = evaluate(qrels, Run(answered), METRIC, return_mean=False, make_comparable=True)
        scores.update(zip(answered, np.atleast_1d(values).tolist()))
    return np.asarray([scores[q] for q in query_ids], np.float64)


def folds_of(n: int, k: int, seed: int) -> np.ndarray:
    """Fold number of each of ``n`` queries (a seeded permutation cut into ``k`` folds)."""
    fold = np.empty(n, np.int64)
    fold[np.random.default_rng(seed).permutation(n)] = np.arange(n) % k
    return fold


def kfold_scores(matrix: np.ndarray, folds: np.ndarray) -> tuple[np.ndarray, list[int]]:
    """Held-out per-query scores: each fold scored with the setting best on the other folds.
    ``matrix``: (settings, queries). Returns the scores and the setting chosen per fold."""
    out = np.zeros(matrix.shape[1])
    chosen = []
    for f in np.unique(folds):
        train, test = folds != f, folds == f
        best = int(np.argmax(matrix[:, train].mean(1)))
        out[test] = matrix[best, test]
        chosen.append(best)
    return out, chosen


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.fusion_cv", description=__doc__.split("\n\n")[0])
    p.add_argument("--runs", type=Path, required=True, help="beir-eval output folder with runs/<dataset>/<system>.trec[.gz]")
    p.add_argument("--channels", default="sparse,dense,bm25", help="systems (runs) to fuse (default sparse,dense,bm25)")
    p.add_argument("--baseline-runs", type=Path, default=None, help="beir-eval output folder holding the baseline's runs")
    p.add_argument("--baseline", default="bm25-pyserini", help="baseline system name in --baseline-runs")
    p.add_argument("--folds", type=int, default=5)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--step", type=float, default=0.1, help="min-max weight grid step (default 0.1)")
    p.add_argument("--title", default="Hybrid fusion chosen on held-out queries", help="section title in BENCHMARKS.md")
    p.add_argument("--out", type=Path, required=True, help="results JSON file to write")
    args = p.parse_args(argv)

    from ranx import Qrels, Run

    from benchmarks import datasets as dsets
    from benchmarks.evaluate import read_trec

    channels = [c.strip() for c in args.channels.split(",") if c.strip()]
    run_dirs = sorted(d for d in (args.runs / "runs").iterdir() if d.is_dir())
    if not run_dirs:
        raise SystemExit(f"{args.runs / 'runs'}: no per-dataset run folders")

    def load_run(folder: Path, system: str):
        for suffix in (".trec", ".trec.gz"):
            if (folder / f"{system}{suffix}").exists():
                return Run(read_trec(folder / f"{system}{suffix}"))
        raise SystemExit(f"{folder}: no run for system {system!r}")

    grid = settings_grid(len(channels), args.step)
    names, matrices, singles, baseline, query_counts = [], {}, {}, {}, {}
    for folder in run_dirs:
        ds = dsets.resolve(folder.name, "test")[0]
        qids = list(ds.queries)
        qrels = Qrels({q: ds.qrels[q] for q in qids})
        runs = [load_run(folder, c) for c in channels]
        names.append(ds.name)
        query_counts[ds.name] = len(qids)
        singles[ds.name] = {c: per_query(qrels, r, qids) for c, r in zip(channels, runs)}
        if args.baseline_runs is not None:
            baseline[ds.name] = per_query(qrels, load_run(args.baseline_runs / "runs" / ds.name, args.baseline), qids)
        rows = []
        for i, s in enumerate(grid):
            rows.append(per_query(qrels, fused_run(runs, s), qids))
        matrices[ds.name] = np.stack(rows)
        print(f"{ds.name}: {len(grid)} settings x {len(qids)} queries", file=sys.stderr, flush=True)

    # collection-level means of every setting: (settings, collections)
    means = np.stack([matrices[n].mean(1) for n in names], axis=1)
    default = int(np.argmax(means.mean(1)))
    table, details = [], {"grid_size": len(grid), "per_collection": {}}
    if len(names) < 2:
        raise SystemExit("leave-one-collection-out needs runs on two collections or more")
    for j, name in enumerate(names):
        m = matrices[name]
        kf, kf_chosen = kfold_scores(m, folds_of(m.shape[1], min(args.folds, m.shape[1]), args.seed))
        others = [i for i in range(len(names)) if i != j]
        loco = int(np.argmax(means[:, others].mean(1)))
        single = {c: float(v.mean()) for c, v in singles[name].items()}
        best_single = max(single, key=single.get)
        row = [name, query_counts[name]]
        if baseline:
            row.append(round(float(baseline[name].mean()), 4))
        row += [round(single[c], 4) for c in channels]
        row += [round(float(kf.mean()), 4), round(float(m[loco].mean()), 4), round(float(m[default].mean()), 4)]
        row.append(round(float(m[loco].mean()) - single[best_single], 4))
        table.append(row)
        details["per_collection"][name] = {
            "single": single,
            "best_single": best_single,
            "baseline": float(baseline[name].mean()) if baseline else None,
            "kfold": float(kf.mean()),
            "kfold_settings": [grid[i].label(channels) for i in kf_chosen],
            "loco": float(m[loco].mean()),
            "loco_setting": grid[loco].label(channels),
            "default_in_sample": float(m[default].mean()),
            "oracle_best_setting": grid[int(np.argmax(m.mean(1)))].label(channels),
            "oracle_best": float(m.mean(1).max()),
        }
    mean_row = ["mean", sum(query_counts.values())] + [round(float(np.mean([r[i] for r in table])), 4) for i in range(2, len(table[0]))]
    table.append(mean_row)
    details["default"] = grid[default].to_dict(channels)
    details["default_label"] = grid[default].label(channels)
    columns = ["collection", "queries"] + ([f"{args.baseline}"] if baseline else []) + channels
    columns += [f"hybrid {args.folds}-fold CV", "hybrid LOCO", "hybrid default (in-sample)", "LOCO − best single"]
    write_table(
        args.out,
        title=args.title,
        command="python -m benchmarks.fusion_cv " + shlex.join(argv if argv is not None else sys.argv[1:]),
        description=(
            f"nDCG@10. Channels fused: {', '.join(channels)} (runs of depth 100 from `{args.runs}`). Settings searched: "
            f"{len(grid)} (min-max weighted sums on a {args.step:g} simplex grid; RRF with k in {list(RRF_KS)} over every "
            f"subset of two or more channels). *{args.folds}-fold CV*: each query scored with the setting best on the other "
            "folds of its collection. *LOCO*: each collection scored with the setting best on the other collections (mean of "
            "their nDCG@10) — what a shipped default does on an unseen collection. *Default*: the setting best on all "
            f"collections, `{grid[default].label(channels)}` (the shipped `retriever.retriever.DEFAULT_FUSION` is the default of "
            "the three-channel study: sparse, dense, bm25); its numbers "
            "here are in-sample. *LOCO − best single*: against the best single channel of that collection, chosen in "
            "hindsight (a bar held-out fusion must clear)."
        ),
        columns=columns,
        rows=table,
        details=details,
        plot={"kind": "bar", "x": "collection", "y": [c for c in columns if c in (args.baseline, "hybrid LOCO", *channels)], "series": None, "title": "Hybrid (held-out weights) vs its channels and BM25"},
    )
    for row in table:
        print("  ".join(str(c) for c in row))
    print(f"default: {details['default_label']}\nwrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
