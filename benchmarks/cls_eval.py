"""``cls-eval``: sentence classification with logistic regression on frozen embeddings of any embedder.

    cls-eval --task ../shared/data/classification/mr [--task DIR ...] [--model M] [--adapter A]
             [--embedder minilm] [--boost] [--k 4] [--max-rows N] [--json] [--out DIR]

The protocol is in benchmarks/classification.py. Texts are encoded once per embedder through
the engine's fast path and cached (``--cache``; the key covers model, adapter, embedding
settings, runtime and dtype), so a re-run encodes nothing. ``--out DIR`` writes
``DIR/results.json`` (``kind: cls-eval``), rendered by ``beir-eval report`` into BENCHMARKS.md.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import logging
import shlex
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

import numpy as np

import benchmarks  # noqa: F401  (cache locations first)

DEFAULT_K = 4


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


def _llm_encoder(args: argparse.Namespace):
    """(encode(texts) -> (n, k, d), k, describe dict, cache key) of this engine's embedder."""
    from embedder.adapters import resolve_adapter
    from embedder.cache import embedder_key
    from embedder.encoder import Embedder
    from embedder.models import DEFAULT_MODEL, resolve_model
    from embedder.token_groups import GroupSpec, btmr_config, group_states, install_bmt_embedding

    model = args.model or DEFAULT_MODEL
    emb = Embedder.load(model, args.adapter, dtype=args.dtype, runtime=args.runtime)
    adapter_dir = resolve_adapter(args.adapter, resolve_model(model).name)
    if not btmr_config(adapter_dir) and (emb.config.pooling != "last" or emb.config.attention != "causal"):
        # The template-tail positions are the engine's embedding only for a causal last-token
        # reader; any other (an LLM2Comp memory reader, mean pooling) is read through its own
        # pooled vector, one state per text, so --boost has no prefixes to fuse there.
        if args.boost:
            print(f"cls-eval: pooling {emb.config.pooling!r} with {emb.config.attention} attention gives one pooled vector per text; "
                  "--boost is skipped", file=sys.stderr)
        desc = {**emb.describe(), "token_states": {"k": 1, "order": f"the engine's pooled vector ({emb.config.pooling} pooling)"}, "btmr": None}
        key = embedder_key(emb) + "-pooled"
        return (lambda texts: emb.embed(texts)[:, None, :]), 1, emb.dim, desc, key, emb.runtime_summary()
    spec = install_bmt_embedding(emb, adapter_dir) if btmr_config(adapter_dir) else GroupSpec(args.k)
    desc = {**emb.describe(), "token_states": spec.to_dict(), "btmr": btmr_config(adapter_dir)}
    key = embedder_key(emb) + "-" + hashlib.sha256(json.dumps(spec.to_dict(), sort_keys=True).encode()).hexdigest()[:8]
    return (lambda texts: group_states(emb, texts, spec)), spec.k, emb.dim, desc, key, emb.runtime_summary()


def _minilm_encoder(args: argparse.Namespace):
    from embedder.sentence_encoder import MINILM, SentenceEncoder

    enc = SentenceEncoder.load(MINILM)
    key = "st-" + enc.identity["sha256"][:16]
    return (lambda texts: enc.encode(texts)[:, None, :]), 1, enc.dim, {**enc.describe(), "kind": "sentence-transformers"}, key, f"encoder: sentence-transformers {enc.name} on {enc.device}"


def _default_label(args: argparse.Namespace, desc: dict) -> str:
    if args.embedder == "minilm":
        return "all-MiniLM-L6-v2"
    name = (desc.get("model") or {}).get("name", "llm")
    if desc.get("btmr"):
        return f"{name} + BTMR"
    return f"{name} raw" if str(args.adapter) == "none" else f"{name} + adapter {args.adapter}"


def _classify(tasks: list, states_all: np.ndarray, row: dict[str, int], args: argparse.Namespace, k: int, c_grid: tuple[float, ...]) -> dict:
    """Each task's scores (benchmarks.classification.evaluate_task) on its rows of the encoded states."""
    from tqdm.auto import tqdm

    from benchmarks.classification import evaluate_task

    results: dict = {}
    for task in tasks:
        states = states_all[[row[t] for t in task.texts]]
        n_splits = 1 if task.protocol == "split" else 10
        with tqdm(total=n_splits, desc=f"classifying {task.name}", unit="split", disable=args.no_progress) as bar:
            t1 = time.perf_counter()
            res = evaluate_task(task, states, args.boost and k > 1, args.seed, on_split=lambda: bar.update(1), c_grid=c_grid)
        res["fit_s"] = round(time.perf_counter() - t1, 1)
        res["source"] = task.source
        results[task.name] = res
    return results


def run(args: argparse.Namespace, command: str) -> dict:
    """Encode (cached), evaluate every task, write and return the results object."""
    from contextlib import nullcontext

    from threadpoolctl import threadpool_limits

    from benchmarks.classification import C_GRID, load_task
    from benchmarks.fusion_boosting import PREFIX_BOOSTER, TREE_BOOSTER
    from benchmarks.suite import git_commit, machine_info
    from embedder.cache import ArrayCache, cached_arrays
    from embedder.util import set_threads, write_json_atomic

    if args.boost and args.embedder == "minilm":
        raise SystemExit("cls-eval: error: --boost needs several token states per text; minilm gives one pooled vector")
    start = time.perf_counter()
    tasks = [load_task(d, args.max_rows, args.seed) for d in args.task]
    encode, k, dim, desc, key, runtime_line = (_minilm_encoder if args.embedder == "minilm" else _llm_encoder)(args)
    print(runtime_line, file=sys.stderr)
    if args.threads:
        set_threads(args.threads)  # after loading (Embedder.load sizes torch's pool), before the runtime is built
    cache = ArrayCache((args.cache or benchmarks.cache_root() / "cls-states") / key)
    texts = list(dict.fromkeys(t for task in tasks for t in task.texts))
    t0 = time.perf_counter()
    states_all = cached_arrays(cache, texts, encode, (k, dim), desc="encoding sentences", progress=not args.no_progress)
    encode_s = time.perf_counter() - t0
    c_grid = (args.c,) if args.c is not None else C_GRID
    # BLAS inside the classifiers would otherwise take every core whatever --threads says
    limits = threadpool_limits(args.threads) if args.threads else nullcontext()
    with limits:
        results = _classify(tasks, states_all, {t: i for i, t in enumerate(texts)}, args, k, c_grid)
    mean = lambda key: float(np.mean([r[key]["accuracy"] if key != "accuracy" else r["accuracy"] for r in results.values()]))  # noqa: E731
    out = {
        "kind": "cls-eval",
        "label": args.label or _default_label(args, desc),
        "command": command,
        "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "commit": git_commit(),
        "machine": machine_info(),
        "embedder": desc,
        "boost": bool(args.boost and k > 1),
        "k": k,
        "max_rows": args.max_rows,
        "seed": args.seed,
        "threads": args.threads,
        "classifier": f"StandardScaler + LogisticRegression (L2, fixed C={args.c}, not tuned)" if args.c is not None
        else f"StandardScaler + LogisticRegression (L2, C from inner 3-fold CV on the training part over {list(C_GRID)})",
        "booster": PREFIX_BOOSTER if args.boost and k > 1 else None,
        "booster_trees": TREE_BOOSTER if args.boost and k > 1 else None,
        "texts_encoded": len(texts),
        "encode_s": round(encode_s, 1),
        "wall_s": round(time.perf_counter() - start, 1),
        "tasks": results,
        "mean_accuracy": mean("accuracy"),
    }
    if out["boost"]:
        out["mean_boosted_accuracy"] = mean("boosted")
        out["mean_boosted_trees_accuracy"] = mean("boosted_trees")
    if args.out:
        write_json_atomic(args.out / "results.json", out, indent=1, ensure_ascii=True, newline=True)
    return out


def summary(res: dict) -> dict:
    """The ``--json`` object: each task's accuracy (and macro-F1, boosted accuracy where measured)."""
    tasks = {}
    for name, r in res["tasks"].items():
        t = {"accuracy": r["accuracy"], "macro_f1": r["macro_f1"]}
        if "boosted" in r:
            t["boosted_accuracy"] = r["boosted"]["accuracy"]
            t["boosted_trees_accuracy"] = r["boosted_trees"]["accuracy"]
            t["prefix_accuracy"] = [p["accuracy"] for p in r["prefixes"]]
        tasks[name] = t
    return {"label": res["label"], "tasks": tasks, "mean_accuracy": res["mean_accuracy"], **({"mean_boosted_accuracy": res["mean_boosted_accuracy"]} if res["boost"] else {})}


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    args = _parser().parse_args(argv)
    from benchmarks.classification import TaskError
    from embedder.models import ModelNotAvailable

    try:
        res = run(args, "cls-eval " + shlex.join(argv))
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
