"""What each channel of an operating point pays for its place (issue 71): per collection, the
point's calibrated hybrid beside the same index with each channel removed, the channel's gain in
nDCG@10 and Recall@100, its query cost (end-to-end ms of searching it alone) and its build cost
(seconds and documents/s, from the index manifest's build record).

    python -m experiments.channel_ablation --indexes .cache/beir-all-idx \\
        --data ../shared/data/adi --data ../shared/data/cisi ... --out benchmarks/results/channel-ablation.json

``--indexes`` is a ``beir-eval --index-dir`` folder after a run of ``default`` and ``default-best``:
their indexes are ``default-fast/NAME/aligned-tokens`` and ``default-best/NAME/aligned-tokens``. Each index
is searched as ``search-index --profile P`` searches it (the fusion its calibration chose); "without C"
is the same fusion with C's weight removed (one channel left: that channel's own mode). Query encoding
is not cached (``query_cache_size=0``), so each e2e figure pays its encoder; the configurations answer
each query in turn, timed over the same minutes.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

from benchmarks.loco import rounded
from benchmarks.metrics import compare_runs, evaluate_run
from benchmarks.runs import Run

POINTS = {"fast": "default-fast", "best": "default-best"}  # search profile -> beir-eval's index folder
TIMED_REPEATS = 2  # each query is answered this many times per configuration, the minimum kept


def _runs(configs: dict[str, tuple], queries: dict[str, str], depth: int) -> tuple[dict[str, Run], dict[str, list[float]]]:
    """Each configuration's run over ``queries`` (one search per query, as a user sends them) and
    each query's fastest end-to-end seconds over TIMED_REPEATS. The configurations answer each
    query in turn, so that they are timed over the same minutes (a shared machine slows all alike)."""
    runs: dict[str, Run] = {name: {} for name in configs}
    seconds: dict[str, list[float]] = {name: [] for name in configs}
    for qid, text in queries.items():
        for name, (searcher, mode) in configs.items():
            best = float("inf")
            for _ in range(TIMED_REPEATS):
                t0 = time.perf_counter()
                hits = searcher.search(text, k=depth, mode=mode)
                best = min(best, time.perf_counter() - t0)
            runs[name][qid] = {h.doc_id: float(h.score) for h in hits}
            seconds[name].append(best)
    return runs, seconds


def _build_costs(manifest: dict, channels: list[str]) -> dict[str, dict]:
    """Seconds and documents/s of each channel's part of the build, from the manifest's build record:
    the sentence encoder's pass (``encoder_seconds``), the calibration, and the rest (BM25, the
    documents store, writing and checking the index)."""
    build = manifest.get("build") or {}
    n = manifest["n_docs"]
    encoder = float(build.get("encoder_seconds") or 0.0)
    calibration = float(build.get("calibration_seconds") or 0.0)
    rest = float(build.get("seconds") or 0.0) - encoder - calibration

    def cost(s: float) -> dict:
        return {"seconds": round(s, 2), "docs_per_s": round(n / s, 1) if s > 0 else None}

    costs = {c: cost(encoder if c.startswith("encoder") else rest) for c in channels}
    costs["calibration"] = cost(calibration)
    costs["whole"] = cost(float(build.get("seconds") or 0.0))
    return costs


def ablate(index_dir: Path, profile: str, ds, depth: int = 100) -> dict:
    """One point's ablation on one collection: the hybrid's and each reduced configuration's
    metrics and e2e latency, each channel's gain (hybrid minus the hybrid without it) with its
    paired p-value (ranx, Student's t), and build costs."""
    from retriever import Retriever

    metrics = ["ndcg@10", "recall@100"]
    r = Retriever.load(index_dir, profile=profile, query_cache_size=0)
    try:
        r.warm_up()
        weights = {c: w for c, w in r.fusion.as_dict()["weights"].items() if w > 0}
        configs: dict[str, tuple] = {"hybrid": (r, None)}
        for c in weights:
            rest = {o: w for o, w in weights.items() if o != c}
            if len(rest) == 1:
                configs[f"without {c}"] = (r, next(iter(rest)))
            else:
                configs[f"without {c}"] = (r.with_fusion({**r.fusion.as_dict(), "weights": rest}), None)
        runs, seconds = _runs(configs, ds.queries, depth)
        out = {"fusion": r.fusion.as_dict(), "configs": {
            name: {**evaluate_run(ds.qrels, run, metrics), "e2e_p50_ms": round(float(np.percentile(seconds[name], 50)) * 1e3, 3)}
            for name, run in runs.items()}}
        p = compare_runs(ds.qrels, runs, metrics)["p_values"]
        hybrid = out["configs"]["hybrid"]
        out["gain"] = {c: {"ndcg@10": hybrid["ndcg@10"] - out["configs"][f"without {c}"]["ndcg@10"],
                           "recall@100": hybrid["recall@100"] - out["configs"][f"without {c}"]["recall@100"],
                           "p_ndcg@10": p["hybrid"][f"without {c}"]["ndcg@10"]} for c in weights}
        # a channel's query cost: searching the point without it is what it saves
        out["query_ms"] = {c: round(hybrid["e2e_p50_ms"] - out["configs"][f"without {c}"]["e2e_p50_ms"], 3) for c in weights}
        manifest = json.loads((Path(index_dir) / "manifest.json").read_text(encoding="utf-8"))
        out["build"] = _build_costs(manifest, list(weights))
    finally:
        r.close()
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--indexes", type=Path, required=True, help="a beir-eval --index-dir after default and default-best ran")
    p.add_argument("--data", action="append", required=True, help="BEIR folders (the collections the indexes were built on)")
    p.add_argument("--points", default="fast,best", help="search profiles to ablate (fast, best)")
    p.add_argument("--depth", type=int, default=100)
    p.add_argument("--out", type=Path, default=Path("benchmarks/results/channel-ablation.json"))
    args = p.parse_args(argv)
    from benchmarks.datasets import load_beir_folder
    from benchmarks.metrics import warm_up
    from benchmarks.tables import study_command, write_table

    warm_up(args.depth)
    columns = ["point", "collection", "fusion", "hybrid nDCG@10", "channel", "gain nDCG@10", "p", "gain R@100",
               "query ms (e2e p50 saved without it)", "build s", "build docs/s", "calibration s", "hybrid e2e p50 ms"]
    rows, details = [], {}
    for point in [s.strip() for s in args.points.split(",") if s.strip()]:
        for folder in args.data:
            ds = load_beir_folder(folder)
            index_dir = args.indexes / POINTS[point] / ds.name / "aligned-tokens"
            if not (index_dir / "manifest.json").exists():
                print(f"{point} {ds.name}: no index at {index_dir}, skipped", file=sys.stderr)
                continue
            t0 = time.perf_counter()
            res = ablate(index_dir, point, ds, args.depth)
            details.setdefault(point, {})[ds.name] = res
            f = res["fusion"]
            fusion = f"{f['method']} " + " / ".join(f"{c} {w:g}" for c, w in f["weights"].items() if w > 0)
            for c, g in res["gain"].items():
                rows.append([point, ds.name, fusion, *rounded([res["configs"]["hybrid"]["ndcg@10"], ]), c,
                             *rounded([g["ndcg@10"]]), g["p_ndcg@10"], *rounded([g["recall@100"]]), res["query_ms"][c],
                             res["build"][c]["seconds"], res["build"][c]["docs_per_s"], res["build"]["calibration"]["seconds"],
                             res["configs"]["hybrid"]["e2e_p50_ms"]])
            print(f"{point} {ds.name}: {json.dumps(res['gain'])} ({time.perf_counter() - t0:.0f} s)", file=sys.stderr, flush=True)
    write_table(
        args.out,
        title="Channel ablation: what each channel of fast and best adds, and what it costs",
        command=study_command("experiments.channel_ablation", argv),
        description=(
            "Each operating point's index from one beir-eval run, searched at its calibrated fusion (hybrid) and with "
            "each channel removed. *gain*: hybrid minus the hybrid without the channel (p: paired Student's t over the "
            "queries, ranx). *query ms*: the hybrid's end-to-end p50 minus the p50 without the channel (the fastest of "
            f"{TIMED_REPEATS} answers per query, no query cache). *build*: the channel's part of the build from the "
            "index manifest (the sentence encoder's pass for an encoder channel; for bm25 the rest of the build: BM25, "
            "the document store, writing and checking), and the calibration's seconds, which only a fused pair pays."),
        columns=columns, rows=rows, details=details,
    )
    print(f"wrote {args.out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
