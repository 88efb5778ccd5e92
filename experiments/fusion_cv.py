"""Choose hybrid fusion settings on held-out queries, and report what they are worth.

    python -m experiments.fusion_cv --runs DIR --channels sparse,dense,bm25 \\
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

**Channels and where their runs come from.** ``--channels`` names each channel, optionally with
the system whose runs it reads: ``bm25=bm25-pyserini,encoder=minilm,sparse,dense`` fuses the
Pyserini BM25 baseline's runs as channel ``bm25`` and the MiniLM baseline's as ``encoder``
(``bm25`` / ``encoder`` alone read the engine's own ``bm25`` / ``encoder`` runs). ``--runs`` may
be given several times: a system's runs are taken from the first folder that has them. Channel
names are the Retriever's mode names, so a chosen setting is a ``Retriever(fusion=...)`` as is.

**Named channel subsets** (issue 16: does a channel add anything to the best cheap hybrid?)::

    python -m experiments.fusion_cv --runs benchmarks/results/beir-shared \
        --channels bm25=bm25-pyserini,encoder=minilm,sparse,dense,dense-ef \
        --subsets bm25+encoder,bm25+encoder+sparse,bm25+encoder+sparse+dense \
        --subsets-out benchmarks/results/fusion_encoder_subsets.json --out benchmarks/results/fusion_cv_encoder.json

For each subset, only the settings of the grid that weigh channels of that subset alone are
searched; each collection is scored with the setting best on the other collections (LOCO),
nDCG@10 and Recall@100, and compared with the reference subset (the first, or ``--reference``)
by ranx.compare (paired Student t-test) per collection and over all queries pooled. The subsets
file also records the setting each subset chooses on all collections (``details.subsets.<name>.
default``: what ``beir-eval --fusion-from`` reads), and a plot of the per-query differences.
"""
from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np

import benchmarks  # noqa: F401  (cache locations first)
from benchmarks.fusion_grid import METRIC, RECALL, RRF_KS, Setting, fused_run, per_query, settings_grid
from benchmarks.loco import loco_choices, mean_row
from benchmarks.tables import study_command, write_table

__all__ = ["METRIC", "RECALL", "RRF_KS", "Setting", "fused_run", "per_query", "settings_grid"]  # moved to benchmarks.fusion_grid


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


def parse_channels(spec: str) -> list[tuple[str, str]]:
    """``"bm25=bm25-pyserini,encoder=minilm,sparse"`` -> [(channel, system whose runs it reads)]."""
    out = []
    for item in (x.strip() for x in spec.split(",")):
        if item:
            name, _, system = item.partition("=")
            out.append((name.strip(), (system or name).strip()))
    names = [n for n, _ in out]
    if len(set(names)) != len(names):
        raise SystemExit(f"--channels: a channel is named twice ({spec})")
    return out


def subset_mask(grid: list[Setting], channels: list[str], subset: list[str]) -> np.ndarray:
    """Which settings weigh only channels of ``subset``."""
    inside = [c in subset for c in channels]
    return np.asarray([all(w == 0 or ok for w, ok in zip(s.weights, inside)) for s in grid])


@dataclass
class Collection:
    """One collection's queries, judgements, channel runs (ranx) and the grid's nDCG@10 matrix."""

    name: str
    query_ids: list[str]
    qrels: dict  # query id -> doc id -> relevance
    runs: list  # one ranx Run per channel, in channel order
    matrix: np.ndarray  # (settings, queries) nDCG@10


def subset_study(collections: list[Collection], grid: list[Setting], channels: list[str], subsets: list[str], reference: str) -> tuple[list[list], dict]:
    """LOCO nDCG@10 and Recall@100 of each named channel subset (``"bm25+encoder"``), each
    compared with ``reference`` by ranx.compare per collection and over the pooled queries.
    Returns (table rows, details)."""
    from benchmarks.metrics import compare_runs

    names = [c.name for c in collections]
    means = np.stack([c.matrix.mean(1) for c in collections], axis=1)  # (settings, collections)
    chosen: dict[str, dict[str, int]] = {}
    details: dict = {"reference": reference, "subsets": {}, "per_query_diff": {}}
    for sub in subsets:
        parts = sub.split("+")
        missing = [c for c in parts if c not in channels]
        if missing:
            raise SystemExit(f"--subsets: {sub!r} names channel(s) {missing} not in --channels {channels}")
        mask = subset_mask(grid, channels, parts)
        if not mask.any():
            raise SystemExit(f"--subsets: {sub!r}: no setting of the grid fuses two or more of its channels")
        masked = np.where(mask[:, None], means, -np.inf)
        chosen[sub] = dict(zip(names, loco_choices(masked)))
        default = int(np.argmax(masked.mean(1)))
        details["subsets"][sub] = {"default": grid[default].to_dict(channels), "default_label": grid[default].label(channels), "per_collection": {}}

    # per-query scores and fused runs of each subset's LOCO setting
    ndcg, recall, fused = {}, {}, {}
    for sub in subsets:
        for c in collections:
            s = grid[chosen[sub][c.name]]
            run = fused_run(c.runs, s).to_dict()
            fused[sub, c.name] = run
            ndcg[sub, c.name] = c.matrix[chosen[sub][c.name]]
            recall[sub, c.name] = per_query(c.qrels, run, c.query_ids, RECALL)

    metrics = [METRIC, RECALL]

    def p_values(qrels: dict, a: dict, b: dict) -> dict:
        if a == b:
            return dict.fromkeys(metrics)
        cmp = compare_runs(qrels, {reference: a, "other": b}, metrics)
        return cmp["p_values"]["other"][reference]

    rows = []
    for sub in subsets:
        diffs = {}
        for c in collections:
            n, r = ndcg[sub, c.name], recall[sub, c.name]
            rn, rr = ndcg[reference, c.name], recall[reference, c.name]
            p = p_values(c.qrels, fused[reference, c.name], fused[sub, c.name]) if sub != reference else dict.fromkeys(metrics)
            label = grid[chosen[sub][c.name]].label(channels)
            rows.append(_subset_row(sub, c.name, len(c.query_ids), n, r, rn, rr, p, label, sub == reference))
            details["subsets"][sub]["per_collection"][c.name] = {
                "loco_setting": label, METRIC: float(n.mean()), RECALL: float(r.mean()), "p_values": p,
            }
            diffs[c.name] = sorted((n - rn).round(6).tolist())
        # mean over collections (each weighs the same); the test pools every query
        pooled_q = {f"{c.name}/{q}": rel for c in collections for q, rel in c.qrels.items() if q in set(c.query_ids)}

        def pooled(s: str) -> dict:
            return {f"{c.name}/{q}": hits for c in collections for q, hits in fused[s, c.name].items()}

        p = p_values(pooled_q, pooled(reference), pooled(sub)) if sub != reference else dict.fromkeys(metrics)
        macro = lambda d, s: np.asarray([d[s, c.name].mean() for c in collections])
        rows.append(_subset_row(sub, "mean", sum(len(c.query_ids) for c in collections), macro(ndcg, sub), macro(recall, sub),
                                macro(ndcg, reference), macro(recall, reference), p, "per collection (LOCO)", sub == reference))
        details["subsets"][sub]["pooled_p_values"] = p
        if sub != reference:
            details["per_query_diff"][sub] = diffs
    return rows, details


SUBSET_COLUMNS = ["subset", "collection", "queries", "nDCG@10", "Δ nDCG@10", "p nDCG@10", "Recall@100", "Δ Recall@100", "p Recall@100", "LOCO setting"]


def _subset_row(sub, collection, n, ndcg, recall, ref_ndcg, ref_recall, p, label, is_reference) -> list:
    def p_cell(x):
        return "–" if x is None else (f"{x:.4f}" if x >= 1e-4 else f"{x:.1e}")

    if is_reference:
        return [sub, collection, n, round(float(ndcg.mean()), 4), "–", "–", round(float(recall.mean()), 4), "–", "–", label]
    return [
        sub, collection, n,
        round(float(ndcg.mean()), 4), f"{float(ndcg.mean() - ref_ndcg.mean()):+.4f}", p_cell(p.get(METRIC)),
        round(float(recall.mean()), 4), f"{float(recall.mean() - ref_recall.mean()):+.4f}", p_cell(p.get(RECALL)),
        label,
    ]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m experiments.fusion_cv", description=__doc__.split("\n\n")[0])
    p.add_argument("--runs", type=Path, action="append", required=True, help="beir-eval output folder with runs/<dataset>/<system>.trec[.gz]; repeatable (a system's runs come from the first that has them; collections from the first)")
    p.add_argument("--channels", default="sparse,dense,bm25", help="channels to fuse, each NAME or NAME=SYSTEM (the system whose runs it reads), e.g. bm25=bm25-pyserini,encoder=minilm,sparse,dense (default sparse,dense,bm25)")
    p.add_argument("--subsets", default=None, help="named channel subsets to compare, e.g. bm25+encoder,bm25+encoder+sparse (needs --subsets-out)")
    p.add_argument("--reference", default=None, help="the subset the others are tested against (default: the first of --subsets)")
    p.add_argument("--subsets-out", type=Path, default=None, help="results JSON file for the subset comparison")
    p.add_argument("--subsets-title", default="Does a channel add to BM25 + encoder? Channel subsets, weights chosen on the other collections", help="its section title")
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
    from benchmarks.runs import read_trec

    sources = parse_channels(args.channels)
    channels = [c for c, _ in sources]
    subsets = [x.strip() for x in (args.subsets or "").split(",") if x.strip()]
    reference = args.reference or (subsets[0] if subsets else None)
    if subsets and args.subsets_out is None:
        raise SystemExit("--subsets needs --subsets-out")
    if reference is not None and reference not in subsets:
        subsets.insert(0, reference)
    run_dirs = sorted(d for d in (args.runs[0] / "runs").iterdir() if d.is_dir())
    if not run_dirs:
        raise SystemExit(f"{args.runs[0] / 'runs'}: no per-dataset run folders")

    def load_run(dataset: str, system: str, roots: list[Path]):
        for root in roots:
            for suffix in (".trec", ".trec.gz"):
                path = root / "runs" / dataset / f"{system}{suffix}"
                if path.exists():
                    return Run(read_trec(path))
        raise SystemExit(f"no run for system {system!r} on {dataset!r} in {', '.join(str(r) for r in roots)}")

    grid = settings_grid(len(channels), args.step)
    names, matrices, singles, baseline, query_counts, collections = [], {}, {}, {}, {}, []
    for folder in run_dirs:
        ds = dsets.resolve(folder.name, "test")[0]
        qids = list(ds.queries)
        qrels = Qrels({q: ds.qrels[q] for q in qids})
        runs = [load_run(folder.name, system, args.runs) for _, system in sources]
        names.append(ds.name)
        query_counts[ds.name] = len(qids)
        singles[ds.name] = {c: per_query(qrels, r, qids) for c, r in zip(channels, runs)}
        if args.baseline_runs is not None:
            baseline[ds.name] = per_query(qrels, load_run(folder.name, args.baseline, [args.baseline_runs]), qids)
        rows = []
        for i, s in enumerate(grid):
            rows.append(per_query(qrels, fused_run(runs, s), qids))
        matrices[ds.name] = np.stack(rows)
        collections.append(Collection(ds.name, qids, {q: ds.qrels[q] for q in qids}, runs, matrices[ds.name]))
        print(f"{ds.name}: {len(grid)} settings x {len(qids)} queries", file=sys.stderr, flush=True)

    # collection-level means of every setting: (settings, collections)
    means = np.stack([matrices[n].mean(1) for n in names], axis=1)
    default = int(np.argmax(means.mean(1)))
    table, details = [], {"grid_size": len(grid), "per_collection": {}}
    if len(names) < 2:
        raise SystemExit("leave-one-collection-out needs runs on two collections or more")
    for name, loco in zip(names, loco_choices(means)):
        m = matrices[name]
        kf, kf_chosen = kfold_scores(m, folds_of(m.shape[1], min(args.folds, m.shape[1]), args.seed))
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
    table.append(mean_row(["mean", sum(query_counts.values())], table))
    details["default"] = grid[default].to_dict(channels)
    details["default_label"] = grid[default].label(channels)
    details["channel_runs"] = dict(sources)
    columns = ["collection", "queries"] + ([f"{args.baseline}"] if baseline else []) + channels
    columns += [f"hybrid {args.folds}-fold CV", "hybrid LOCO", "hybrid default (in-sample)", "LOCO − best single"]
    write_table(
        args.out,
        title=args.title,
        command=study_command("experiments.fusion_cv", argv),
        description=(
            f"nDCG@10. Channels fused: {_describe_sources(sources)}; runs of depth 100 from {', '.join(f'`{r}`' for r in args.runs)}. Settings searched: "
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
    if subsets:
        rows, sub_details = subset_study(collections, grid, channels, subsets, reference)
        sub_details["channel_runs"] = dict(sources)
        others = [s for s in subsets if s != reference]
        write_table(
            args.subsets_out,
            title=args.subsets_title,
            command=study_command("experiments.fusion_cv", argv),
            description=(
                f"Channels: {_describe_sources(sources)}; runs of depth 100 from {', '.join(f'`{r}`' for r in args.runs)}. "
                "Each subset is fused with the setting best (mean nDCG@10) on the *other* collections among the grid's settings "
                f"that weigh only its channels (min-max weights on a {args.step:g} simplex, RRF), so every number is held out "
                f"(LOCO). Δ and p: against `{reference}` on the same queries; p from ranx.compare (paired Student t-test), "
                "per collection and, on the mean rows, over all queries pooled (the mean itself weighs collections equally). "
                "Setting chosen on all collections (what `beir-eval --fusion-from` uses, in-sample here): "
                + "; ".join(f"{s}: `{sub_details['subsets'][s]['default_label']}`" for s in subsets)
                + "."
            ),
            columns=SUBSET_COLUMNS,
            rows=rows,
            details=sub_details,
            plot={"kind": "per-query-diff", "title": f"Per-query nDCG@10 difference vs {reference} (LOCO weights), sorted"} if others else None,
        )
        for row in rows:
            print("  ".join(str(c) for c in row))
        print(f"wrote {args.subsets_out}")
    return 0


def _describe_sources(sources: list[tuple[str, str]]) -> str:
    return ", ".join(c if c == s else f"{c} (runs of `{s}`)" for c, s in sources)


if __name__ == "__main__":
    sys.exit(main())
