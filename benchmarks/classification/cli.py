"""``cls-eval``: sentence classification with logistic regression on frozen embeddings of any embedder.

    cls-eval --task ../shared/data/classification/mr [--task DIR ...] [--model M] [--adapter A]
             [--embedder minilm] [--boost] [--k 4] [--max-rows N] [--json] [--out DIR]

The protocol is in benchmarks/classification/evaluation.py, the run in benchmarks/classification/run.py.
Texts are encoded once per embedder through the engine's fast path and cached (``--cache``; the key covers model, adapter, embedding
settings, runtime and dtype), so a re-run encodes nothing. ``--out DIR`` writes
``DIR/results.json`` (``kind: cls-eval``), rendered by ``beir-eval report`` into BENCHMARKS.md.
"""
from __future__ import annotations

import argparse
import json
import logging
import shlex
import sys
from pathlib import Path

import benchmarks  # noqa: F401  (cache locations first)
from benchmarks.classification.run import DEFAULT_K


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="cls-eval", description="Sentence classification (logistic regression on frozen embeddings; SentEval/MTEB protocol).")
    p.add_argument(
        "--task", action="extend", nargs="+", required=True, type=Path,
        help="task folder(s) (all.tsv, or train.tsv + test.tsv); repeatable, and takes several paths per flag",
    )
    p.add_argument("--embedder", choices=("llm", "minilm"), default="llm", help="llm: this engine's embedder (--model/--adapter); minilm: all-MiniLM-L6-v2 (default llm)")
    p.add_argument("--model", default=None, help="backbone (registry name, path, hub id; default: the engine's default)")
    p.add_argument("--adapter", default="default", help="default | none | a shipped adapter name | DIR (Text2Token or BTMR adapter)")
    p.add_argument("--boost", action="store_true", help="also score every token prefix 1..k and their Token Fusion Boosting")
    p.add_argument("--k", type=int, default=DEFAULT_K, help=f"token states per text for --boost when the adapter is not BTMR (template tail; default {DEFAULT_K})")
    p.add_argument("--max-rows", type=int, default=None, help="cap each split at N texts (stratified, seeded sample); default: all rows")
    p.add_argument("--c", type=float, default=None, help="a fixed L2 C for every classifier instead of the inner-CV grid (about 10x cheaper)")
    p.add_argument("--seed", type=int, default=0, help="folds, sampling and classifier seed (default 0)")
    p.add_argument("--label", default=None, help="row name in the report (default: derived from the embedder)")
    p.add_argument("--dtype", choices=("auto", "fp32", "bf16", "int8"), default="auto", help="LLM encoder precision (default auto)")
    p.add_argument("--runtime", choices=("auto", "torch", "openvino"), default="auto", help="LLM encoder runtime (default auto)")
    p.add_argument("--threads", type=int, default=None, help="compute threads for encoding and classifiers (default: all cores; 1 beside another job)")
    p.add_argument("--cache", type=Path, default=None, help="embedding cache folder (default <cache root>/cls-states)")
    p.add_argument("--json", action="store_true", help="print one JSON object with each task's accuracy")
    p.add_argument("--out", type=Path, default=None, help="write results.json into this folder")
    p.add_argument("--no-progress", action="store_true", help="no progress bars")
    return p


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    args = _parser().parse_args(argv)
    if args.boost and args.embedder == "minilm":
        raise SystemExit("cls-eval: error: --boost needs several token states per text; minilm gives one pooled vector")
    from benchmarks.classification.evaluation import TaskError
    from benchmarks.classification.run import ClsEvalOptions, run, summary
    from embedder.models import ModelNotAvailable

    try:
        res = run(ClsEvalOptions(**vars(args)), "cls-eval " + shlex.join(argv))
    except (TaskError, ModelNotAvailable, ValueError) as exc:
        print(f"cls-eval: error: {exc}", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps(summary(res)))
    else:
        for name, r in res["tasks"].items():
            extra = (f"  boosted {r['boosted']['accuracy']:.4f} (gain over best prefix {r['boost_gain_over_best_prefix']:+.4f}; "
                     f"trees {r['boosted_trees']['accuracy']:.4f})" if "boosted" in r else "")
            print(f"{name:12s} accuracy {r['accuracy']:.4f}  macro-F1 {r['macro_f1']:.4f}{extra}")
        print(f"{'mean':12s} accuracy {res['mean_accuracy']:.4f}" + (f"  boosted {res['mean_boosted_accuracy']:.4f} (trees {res['mean_boosted_trees_accuracy']:.4f})" if res["boost"] else ""))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
