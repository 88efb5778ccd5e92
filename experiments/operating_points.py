"""Operating points (issue 50): each point's fusion weights chosen by a rule that transfers.

    python -m experiments.operating_points --results benchmarks/results \\
        --point 'fast=bm25@encoder-hybrid/bm25,encoder@encoder-hybrid/encoder,sparse@query-encoder-none/sparse' \\
        --point 'best=bm25@encoder-hybrid/bm25,encoder@encoder-hybrid/encoder,sparse@query-encoder-llm/sparse,dense@query-encoder-llm/dense' \\
        --baseline 'bm25+minilm@encoder-hybrid/bm25+minilm' --out benchmarks/results/operating_points.json

An operating point is a set of channels (each read from a stored ``beir-eval`` run,
``FOLDER/runs/<collection>/SYSTEM.trec[.gz]``) and the fusion setting that weighs them. The
setting that is best on the mean over the shared collections won there because it was chosen
there, and measured below B+M on collections nobody tuned on. So each *rule* that turns the
collections' nDCG@10 into one setting is itself judged held out: leave one collection out, apply
the rule to the other four, score the fifth. Rules (:func:`choose`), all over the same grid
(min-max weights on a 0.1 simplex, RRF k in 10-100):

* ``mean``: the best mean nDCG@10 (the rule that chose ``.4/.4/.2``);
* ``regret``: the smallest worst-collection regret, ``max_c (best_c - nDCG_c(s))``: a setting
  never far from what each collection would have wanted (minimax regret);
* ``rank``: the best mean rank among the settings, collection by collection (each collection one
  vote, however wide its nDCG spread);
* ``margin``: the largest worst-collection margin over the first ``--baseline`` (BM25 + MiniLM
  fused, what a user would build instead): the setting that is never far below it anywhere,
  then the best mean among ties. It guards the promise a default makes (not below B+M on a
  collection nobody tuned on) rather than the mean.

The shipped setting of each point is its rule applied to all collections; the evaluation queries
of the held-back collections are never seen by any rule.
"""
from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np

import benchmarks  # noqa: F401  (cache locations first)
from benchmarks.fusion_grid import Setting, fused_run, per_query, settings_grid
from benchmarks.loco import loco_choices
from benchmarks.tables import study_command, write_table

RULES = ("mean", "regret", "rank", "margin")
GRID_WORDS = {
    "minmax": "min-max weights on a {step} simplex",
    "max": "max-normalised weights (each list divided by its top score) on a {step} simplex",
    "rrf": "RRF (k 10-100)",
}


def choose(means: np.ndarray, rule: str, reference: np.ndarray | None = None) -> int:
    """The setting (row) a rule picks from ``means``: (settings, collections) nDCG@10;
    ``reference``: (collections,) nDCG@10 of the baseline the ``margin`` rule guards.
    Ties go to the setting with the higher mean, then the earlier row."""
    if rule not in RULES:
        raise ValueError(f"rule must be one of {RULES}, not {rule!r}")
    avg = means.mean(1)
    if rule == "mean":
        score = avg
    elif rule == "margin":
        if reference is None:
            raise ValueError("rule 'margin' needs the reference's nDCG@10 per collection")
        # hundredths of a point: margins equal to 1e-4 are ties, then the mean decides
        score = np.round((means - np.asarray(reference)[None, :]).min(1), 4)
    elif rule == "regret":
        score = -(means.max(0, keepdims=True) - means).max(1)
    else:
        # rank 0 = best on that collection (equal scores ranked in row order)
        ranks = np.stack([(-col).argsort(kind="stable").argsort(kind="stable") for col in means.T], axis=1)
        score = -ranks.mean(1)
    best = np.flatnonzero(np.isclose(score, score.max(), rtol=0, atol=1e-12))
    return int(best[np.argmax(avg[best])])


def loco(means: np.ndarray, rule: str, reference: np.ndarray | None = None) -> list[int]:
    """For each collection (column), the setting ``rule`` picks from the other collections."""
    ref = None if reference is None else np.asarray(reference)
    return loco_choices(means, lambda sub, others: choose(sub, rule, None if ref is None else ref[others]))


@dataclass(frozen=True)
class Source:
    """Where one channel's (or a baseline's) runs are: ``FOLDER/runs/<collection>/SYSTEM``
    (``FOLDER`` may be ``A+B``: the first of them that holds the collection's run)."""

    name: str
    folder: str
    system: str

    @classmethod
    def parse(cls, text: str) -> Source:
        name, at, where = text.partition("@")
        folder, slash, system = where.rpartition("/")
        if not (at and slash and name.strip() and folder and system):
            raise SystemExit(f"{text!r}: expected CHANNEL@FOLDER/SYSTEM (e.g. sparse@query-encoder-llm/sparse)")
        return cls(name.strip(), folder, system)

    def run(self, results: Path, collection: str):
        from ranx import Run

        from benchmarks.runs import read_trec

        # FOLDER may name several folders joined by "+", read in that order (a collection run apart)
        for folder in self.folder.split("+"):
            for suffix in (".trec", ".trec.gz"):
                path = results / folder / "runs" / collection / f"{self.system}{suffix}"
                if path.exists():
                    return Run(read_trec(path))
        raise SystemExit(f"no run {self.system}.trec[.gz] for {collection} in {', '.join(str(results / f / 'runs') for f in self.folder.split('+'))}")


def save_matrices(path: Path, store: dict[str, np.ndarray]) -> None:
    """The per-query matrices computed so far, written whole to a temporary file then renamed."""
    tmp = path.with_name(path.name + ".tmp.npz")
    np.savez_compressed(tmp, **store)
    tmp.replace(path)


def parse_point(text: str) -> tuple[str, list[Source]]:
    """``"fast=bm25@F/bm25,encoder@F/encoder"`` -> ("fast", [Source, ...])."""
    name, eq, spec = text.partition("=")
    if not eq or not name.strip():
        raise SystemExit(f"--point {text!r}: expected NAME=CHANNEL@FOLDER/SYSTEM,...")
    sources = [Source.parse(item.strip()) for item in spec.split(",") if item.strip()]
    if len(sources) < 2:
        raise SystemExit(f"--point {text!r}: an operating point fuses two channels or more")
    return name.strip(), sources


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m experiments.operating_points", description=__doc__.split("\n\n")[0])
    p.add_argument("--results", type=Path, default=Path("benchmarks/results"), help="folder the FOLDERs are in")
    p.add_argument("--point", action="append", required=True, help="NAME=CHANNEL@FOLDER/SYSTEM,... (repeatable)")
    p.add_argument("--baseline", action="append", default=[], help="NAME@FOLDER/SYSTEM: a system to compare with (repeatable)")
    p.add_argument("--collections", default="adi,cisi,cranfield,medline,npl")
    p.add_argument("--step", type=float, default=0.1, help="weight grid step (default 0.1)")
    p.add_argument("--methods", default="minmax,rrf", help="fusion methods in the grid: minmax, max, rrf (default minmax,rrf)")
    p.add_argument("--matrices", type=Path, default=None, help="cache of the per-query matrices (.npz): read if it exists, else written")
    p.add_argument("--title", default="Operating points: fusion weights chosen by a rule, judged leaving each collection out")
    p.add_argument("--out", type=Path, required=True)
    args = p.parse_args(argv)

    from benchmarks import datasets as dsets

    points = [parse_point(x) for x in args.point]
    baselines = [Source.parse(x) for x in args.baseline]
    names = [c.strip() for c in args.collections.split(",") if c.strip()]
    methods = tuple(m.strip() for m in args.methods.split(",") if m.strip())
    grids: dict[str, list[Setting]] = {}
    store: dict[str, np.ndarray] = {}
    matrices: dict[str, list[np.ndarray]] = {}  # point -> per collection (settings, queries)
    base_scores: dict[str, list[float]] = {b.name: [] for b in baselines}
    singles: dict[str, dict[str, list[float]]] = {}
    cached = np.load(args.matrices, allow_pickle=False) if args.matrices is not None and args.matrices.exists() else None
    if cached is not None:  # kept whole: matrices of points this run does not name stay in the file
        store.update({key: cached[key] for key in cached.files})
    for name in names:
        ds = dsets.resolve(name, "test")[0]
        qids = list(ds.queries)
        qrels = {q: ds.qrels[q] for q in qids}
        for b in baselines:
            base_scores[b.name].append(float(per_query(qrels, b.run(args.results, name), qids).mean()))
        for point, sources in points:
            runs = [s.run(args.results, name) for s in sources]
            blocks = []  # one (settings, queries) block per method, cached apart so another --methods reuses them
            for method in methods:
                grid = settings_grid(len(sources), args.step, (method,))
                key = f"{point}|{name}|" + ",".join(f"{s.name}@{s.folder}/{s.system}" for s in sources) + f"|{args.step}|{method}"
                if cached is not None and key in cached:
                    block = cached[key]
                else:
                    block = np.stack([per_query(qrels, fused_run(runs, s), qids) for s in grid])
                store[key] = block
                blocks.append(block)
            grids[point] = settings_grid(len(sources), args.step, methods)
            matrices.setdefault(point, []).append(np.concatenate(blocks))
            for s, r in zip(sources, runs):
                singles.setdefault(point, {}).setdefault(s.name, []).append(float(per_query(qrels, r, qids).mean()))
        print(f"{name}: {len(qids)} queries", file=sys.stderr, flush=True)
        if args.matrices is not None:  # after each collection: a later failure keeps what was computed
            save_matrices(args.matrices, store)
    columns = ["point", "rule", *names, "mean", "worst Δ vs " + (baselines[0].name if baselines else "-"), "wins", "setting on all five"]
    rows: list[list] = []
    details: dict = {"points": {}, "baselines": {b.name: dict(zip(names, base_scores[b.name])) for b in baselines}}
    for b in baselines:
        rows.append([b.name, "baseline", *(round(v, 4) for v in base_scores[b.name]), round(float(np.mean(base_scores[b.name])), 4), "", "", ""])
    ref = np.asarray(base_scores[baselines[0].name]) if baselines else None
    for point, sources in points:
        channels = [s.name for s in sources]
        grid = grids[point]
        means = np.stack([m.mean(1) for m in matrices[point]], axis=1)
        details["points"][point] = {"channels": {s.name: f"{s.folder}/{s.system}" for s in sources}, "singles": singles[point], "rules": {}}
        for rule in RULES:
            if rule == "margin" and ref is None:
                continue
            held = loco(means, rule, ref)
            scores = np.asarray([means[held[j], j] for j in range(len(names))])
            shipped = grid[choose(means, rule, ref)]
            delta = scores - ref if ref is not None else None
            rows.append([
                point, rule, *(round(float(v), 4) for v in scores), round(float(scores.mean()), 4),
                f"{delta.min():+.4f}" if delta is not None else "", f"{int((delta > 0).sum())}/{len(names)}" if delta is not None else "",
                shipped.label(channels),
            ])  # fmt: skip
            details["points"][point]["rules"][rule] = {
                "loco": dict(zip(names, scores.tolist())), "loco_settings": {n: grid[i].label(channels) for n, i in zip(names, held)},
                "shipped": shipped.to_dict(channels), "shipped_label": shipped.label(channels),
                "shipped_in_sample": dict(zip(names, means[grid.index(shipped)].tolist())),
            }  # fmt: skip
    write_table(
        args.out,
        title=args.title,
        command=study_command("experiments.operating_points", argv),
        description=(
            "nDCG@10, every number held out: each collection is scored with the setting its rule picks from the other four "
            "(leave one collection out). Rules: `mean` (best mean nDCG@10: the rule behind today's default), `regret` "
            "(smallest worst-collection regret against each collection's best setting), `rank` (best mean rank), `margin` "
            "(largest worst-collection margin over the first baseline, then the best mean). Grid: "
            + ", ".join(GRID_WORDS[m] for m in methods).replace("{step}", f"{args.step:g}")
            + " over two or more channels. *worst Δ*: the lowest "
            "per-collection difference to the first baseline; *wins*: collections above it. *setting on all five*: what the "
            "rule picks from every collection, the setting a point ships. Channels: "
            + "; ".join(f"{pt}: " + ", ".join(f"{s.name} = `{s.folder}/{s.system}`" for s in srcs) for pt, srcs in points)
            + "."
        ),
        columns=columns,
        rows=rows,
        details=details,
    )
    for row in rows:
        print("  ".join(str(c) for c in row))
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
