"""Why Milvus's WeightedRanker ranks differently from our min-max fusion, measured on the runs.

Milvus's ``WeightedRanker`` (``norm_score=True``, pymilvus's default; Milvus Lite does the
same as a server) maps every inner-product score s of a channel to ``0.5 + arctan(s) / pi``
before the weighted sum; our fusion (retriever/fusion.py) min-max normalises each channel's
list per query, so every channel spans [0, 1]. This reads the channel runs of a ``beir-eval``
run with the ``*-milvus`` systems and reports, per collection and channel, how much of [0, 1]
arctan leaves to a channel's top-100 (median over queries of max - min of the normalised
scores), i.e. how much a channel can still tell its documents apart inside Milvus's fusion.

    python -m experiments.milvus_rankers --runs benchmarks/results/milvus --out benchmarks/results/milvus-rankers.json
"""
from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path

import numpy as np

CHANNELS = ("sparse", "dense", "bm25")


def arctan_spread(scores: list[float]) -> float:
    """max - min of 0.5 + arctan(s)/pi over one query's list (what Milvus leaves of [0, 1])."""
    normed = [0.5 + math.atan(s) / math.pi for s in scores]
    return max(normed) - min(normed)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m experiments.milvus_rankers", description=__doc__.split("\n\n")[0])
    p.add_argument("--runs", type=Path, required=True, help="a beir-eval output folder with the sparse-/dense-/bm25-milvus runs")
    p.add_argument("--out", type=Path, required=True, help="table results file to write")
    args = p.parse_args(argv)
    from benchmarks.runs import read_trec
    from benchmarks.tables import study_command, write_table

    rows = []
    for folder in sorted((args.runs / "runs").iterdir()):
        row: list = [folder.name]
        for channel in CHANNELS:
            files = sorted(folder.glob(f"{channel}-milvus.trec*"))
            if not files:
                raise FileNotFoundError(f"{folder}: no {channel}-milvus run (run beir-eval with --systems {channel}-milvus)")
            per_query = {q: list(hits.values()) for q, hits in read_trec(files[0]).items()}
            spreads = [arctan_spread(s) for s in per_query.values() if s]
            tops = [max(s) for s in per_query.values() if s]
            row += [round(float(np.median(tops)), 3), round(float(np.median(spreads)), 5)]
        rows.append(row)
    columns = ["collection"] + [f"{c} {what}" for c in CHANNELS for what in ("median top score", "median arctan spread")]
    description = (
        "Per collection and channel: the median over queries of the channel's best score, and of how much of [0, 1] "
        "Milvus's WeightedRanker normalisation 0.5 + arctan(s)/pi leaves to the channel's top-100 (max - min); our "
        "min-max fusion gives every channel the full 1.0. Read from the runs of the `*-milvus` systems in "
        f"`{args.runs}`. A spread near 0 means the channel adds almost the same amount to every document it returned: "
        "inside Milvus's weighted fusion it then only votes for *which* documents enter the list, not their order."
    )
    command = study_command("experiments.milvus_rankers", argv)
    write_table(args.out, "Milvus WeightedRanker vs min-max: what arctan normalisation leaves of each channel", command, description, columns, rows)
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
