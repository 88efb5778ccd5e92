"""What Text2Token training changes: STS-B Spearman and nDCG@10 of the sparse and dense
channels, per embedder variant (raw backbone, after stage 1, after stage 2).

    python -m experiments.text2token_table --pairs ../shared/data/stsb/test.tsv \\
        --variant raw=none:benchmarks/results/text2token/raw \\
        --variant stage1=runs/smollm2-cpu/adapter-stage1:benchmarks/results/text2token/stage1 \\
        --variant stage2=runs/smollm2-cpu/adapter:benchmarks/results/text2token/stage2

Each ``--variant NAME=ADAPTER[:RESULTS]`` names an adapter (``none`` = the raw backbone, or a
folder) and the ``beir-eval`` output folder holding that adapter's sparse/dense run; STS-B is
computed here. Writes a ``{"kind": "table"}`` file that ``beir-eval report`` renders.
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from benchmarks.loco import rounded
from benchmarks.results_file import LLM_CHANNELS as CHANNELS
from benchmarks.results_file import ndcg_by_dataset, parse_variant


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--pairs", type=Path, required=True, help="STS-B style TSV (sentence1, sentence2, score)")
    p.add_argument("--variant", type=parse_variant, action="append", required=True, help="NAME=ADAPTER[:BEIR_EVAL_OUT_DIR]")
    p.add_argument("--model", default="smollm2-135m")
    p.add_argument("--out", type=Path, default=Path("benchmarks/results/text2token.json"))
    args = p.parse_args(argv)
    from embedder.adapters import resolve_adapter
    from training.cli.common import load_embedder
    from training.sts import read_pairs, sts_spearman

    pairs = read_pairs(args.pairs)
    per_variant = []
    for name, adapter, results_dir in args.variant:
        # A variant without a results folder gets its STS-B figure only (nDCG cells "–").
        ndcg = ndcg_by_dataset(results_dir, resolve_adapter(adapter, args.model)) if results_dir else {}
        t0 = time.perf_counter()
        sts = sts_spearman(load_embedder(args.model, adapter), pairs)["spearman"]
        print(f"{name}: STS-B spearman {sts:.4f} ({time.perf_counter() - t0:.0f} s)", file=sys.stderr)
        per_variant.append((name, adapter, sts, ndcg))
    datasets = sorted({d for *_, nd in per_variant for d in nd})
    columns = ["variant", "adapter", "STS-B ρ"] + [f"{d} {c}" for d in datasets for c in CHANNELS] + [f"mean {c}" for c in CHANNELS]
    rows = []
    for name, adapter, sts, nd in per_variant:
        cells = [nd.get(d, {}).get(c) for d in datasets for c in CHANNELS]
        # a mean needs every collection (and one at least: a run of STS-B alone has none)
        means = [sum(nd[d][c] for d in datasets) / len(datasets) if datasets and all(c in nd.get(d, {}) for d in datasets) else None for c in CHANNELS]
        rows.append([name, adapter, round(sts, 4), *rounded(cells + means)])
    from benchmarks.tables import study_command, write_table

    write_table(
        args.out,
        title="Text2Token: the embedder before and after training (STS-B test Spearman, nDCG@10)",
        command=study_command("experiments.text2token_table", argv),
        description=(
            f"Backbone {args.model}. STS-B: Spearman correlation of cosine similarity with the gold scores on "
            f"{args.pairs} ({len(pairs.scores)} pairs). nDCG@10 from the beir-eval runs named in the command (sparse = "
            "aligned tokens, dense = cosine of pooled embeddings; the engine's default K, M and query weighting). "
            "Training reads the documents of the collections, never their queries or judgments."
        ),
        columns=columns,
        rows=rows,
    )
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
