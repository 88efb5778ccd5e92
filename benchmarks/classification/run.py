"""What ``cls-eval`` runs: encode the texts of every task once per embedder (cached), evaluate each task
with the protocol of :mod:`benchmarks.classification.evaluation`, and write a ``kind: cls-eval`` results file.

Texts are encoded through the engine's fast path and cached (the key covers model, adapter, embedding
settings, runtime and dtype), so a re-run encodes nothing. The command line is benchmarks/classification/cli.py.
"""
from __future__ import annotations

import hashlib
import json
import sys
import time
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

import numpy as np

import benchmarks

DEFAULT_K = 4


@dataclass
class ClsEvalOptions:
    """One cls-eval run: the tasks, the embedder and the protocol (the fields of ``cls-eval``'s options)."""

    task: list[Path]
    embedder: str = "llm"  # "llm": this engine's embedder (model, adapter); "minilm": all-MiniLM-L6-v2
    model: str | None = None
    adapter: str = "default"
    boost: bool = False  # also score every token prefix 1..k and their Token Fusion Boosting
    k: int = DEFAULT_K
    max_rows: int | None = None
    c: float | None = None  # a fixed L2 C instead of the inner-CV grid
    seed: int = 0
    label: str | None = None
    dtype: str = "auto"
    runtime: str = "auto"
    threads: int | None = None
    cache: Path | None = None
    json: bool = False
    out: Path | None = None
    no_progress: bool = False


def _llm_encoder(opts: ClsEvalOptions):
    """(encode(texts) -> (n, k, d), k, describe dict, cache key) of this engine's embedder."""
    from embedder.adapters import resolve_adapter
    from embedder.cache import embedder_key
    from embedder.encoder import Embedder
    from embedder.models import DEFAULT_MODEL, resolve_model
    from embedder.token_groups import GroupSpec, btmr_config, group_states, install_bmt_embedding

    model = opts.model or DEFAULT_MODEL
    emb = Embedder.load(model, opts.adapter, dtype=opts.dtype, runtime=opts.runtime)
    adapter_dir = resolve_adapter(opts.adapter, resolve_model(model).name)
    if not btmr_config(adapter_dir) and (emb.config.pooling != "last" or emb.config.attention != "causal"):
        # The template-tail positions are the engine's embedding only for a causal last-token
        # reader; any other (an LLM2Comp memory reader, mean pooling) is read through its own
        # pooled vector, one state per text, so --boost has no prefixes to fuse there.
        if opts.boost:
            print(f"cls-eval: pooling {emb.config.pooling!r} with {emb.config.attention} attention gives one pooled vector per text; "
                  "--boost is skipped", file=sys.stderr)
        desc = {**emb.describe(), "token_states": {"k": 1, "order": f"the engine's pooled vector ({emb.config.pooling} pooling)"}, "btmr": None}
        key = embedder_key(emb) + "-pooled"
        return (lambda texts: emb.embed(texts)[:, None, :]), 1, emb.dim, desc, key, emb.runtime_summary()
    spec = install_bmt_embedding(emb, adapter_dir) if btmr_config(adapter_dir) else GroupSpec(opts.k)
    desc = {**emb.describe(), "token_states": spec.to_dict(), "btmr": btmr_config(adapter_dir)}
    key = embedder_key(emb) + "-" + hashlib.sha256(json.dumps(spec.to_dict(), sort_keys=True).encode()).hexdigest()[:8]
    return (lambda texts: group_states(emb, texts, spec)), spec.k, emb.dim, desc, key, emb.runtime_summary()


def _minilm_encoder(opts: ClsEvalOptions):
    from embedder.sentence_encoder import MINILM, SentenceEncoder

    enc = SentenceEncoder.load(MINILM)
    key = "st-" + enc.identity["sha256"][:16]
    return (lambda texts: enc.encode(texts)[:, None, :]), 1, enc.dim, {**enc.describe(), "kind": "sentence-transformers"}, key, f"encoder: sentence-transformers {enc.name} on {enc.device}"


def _default_label(opts: ClsEvalOptions, desc: dict) -> str:
    if opts.embedder == "minilm":
        return "all-MiniLM-L6-v2"
    name = (desc.get("model") or {}).get("name", "llm")
    if desc.get("btmr"):
        return f"{name} + BTMR"
    return f"{name} raw" if str(opts.adapter) == "none" else f"{name} + adapter {opts.adapter}"


def _classify(tasks: list, states_all: np.ndarray, row: dict[str, int], opts: ClsEvalOptions, k: int, c_grid: tuple[float, ...]) -> dict:
    """Each task's scores (benchmarks.classification.evaluation.evaluate_task) on its rows of the encoded states."""
    from tqdm.auto import tqdm

    from benchmarks.classification.evaluation import evaluate_task

    results: dict = {}
    for task in tasks:
        states = states_all[[row[t] for t in task.texts]]
        n_splits = 1 if task.protocol == "split" else 10
        with tqdm(total=n_splits, desc=f"classifying {task.name}", unit="split", disable=opts.no_progress) as bar:
            t1 = time.perf_counter()
            res = evaluate_task(task, states, opts.boost and k > 1, opts.seed, on_split=lambda: bar.update(1), c_grid=c_grid)
        res["fit_s"] = round(time.perf_counter() - t1, 1)
        res["source"] = task.source
        results[task.name] = res
    return results


def run(opts: ClsEvalOptions, command: str) -> dict:
    """Encode (cached), evaluate every task, write ``opts.out/results.json`` (when set) and return the results object."""
    from contextlib import nullcontext

    from threadpoolctl import threadpool_limits

    from benchmarks.classification.evaluation import C_GRID, load_task
    from benchmarks.classification.fusion_boosting import PREFIX_BOOSTER, TREE_BOOSTER
    from benchmarks.provenance import git_commit, machine_info
    from embedder.cache import ArrayCache, cached_arrays
    from embedder.util import set_threads, write_json_atomic

    start = time.perf_counter()
    tasks = [load_task(d, opts.max_rows, opts.seed) for d in opts.task]
    encode, k, dim, desc, key, runtime_line = (_minilm_encoder if opts.embedder == "minilm" else _llm_encoder)(opts)
    print(runtime_line, file=sys.stderr)
    if opts.threads:
        set_threads(opts.threads)  # after loading (Embedder.load sizes torch's pool), before the runtime is built
    cache = ArrayCache((opts.cache or benchmarks.cache_root() / "cls-states") / key)
    texts = list(dict.fromkeys(t for task in tasks for t in task.texts))
    t0 = time.perf_counter()
    states_all = cached_arrays(cache, texts, encode, (k, dim), desc="encoding sentences", progress=not opts.no_progress)
    encode_s = time.perf_counter() - t0
    c_grid = (opts.c,) if opts.c is not None else C_GRID
    # BLAS inside the classifiers would otherwise take every core whatever --threads says
    limits = threadpool_limits(opts.threads) if opts.threads else nullcontext()
    with limits:
        results = _classify(tasks, states_all, {t: i for i, t in enumerate(texts)}, opts, k, c_grid)
    mean = lambda key: float(np.mean([r[key]["accuracy"] if key != "accuracy" else r["accuracy"] for r in results.values()]))
    out = {
        "kind": "cls-eval",
        "label": opts.label or _default_label(opts, desc),
        "command": command,
        "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "commit": git_commit(),
        "machine": machine_info(),
        "embedder": desc,
        "boost": bool(opts.boost and k > 1),
        "k": k,
        "max_rows": opts.max_rows,
        "seed": opts.seed,
        "threads": opts.threads,
        "classifier": f"StandardScaler + LogisticRegression (L2, fixed C={opts.c}, not tuned)" if opts.c is not None
        else f"StandardScaler + LogisticRegression (L2, C from inner 3-fold CV on the training part over {list(C_GRID)})",
        "booster": PREFIX_BOOSTER if opts.boost and k > 1 else None,
        "booster_trees": TREE_BOOSTER if opts.boost and k > 1 else None,
        "texts_encoded": len(texts),
        "encode_s": round(encode_s, 1),
        "wall_s": round(time.perf_counter() - start, 1),
        "tasks": results,
        "mean_accuracy": mean("accuracy"),
    }
    if out["boost"]:
        out["mean_boosted_accuracy"] = mean("boosted")
        out["mean_boosted_trees_accuracy"] = mean("boosted_trees")
    if opts.out:
        write_json_atomic(opts.out / "results.json", out, indent=1, ensure_ascii=True, newline=True)
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
