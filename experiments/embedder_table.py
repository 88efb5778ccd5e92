"""One row per embedder of the same backbone, with the baselines users would build instead.

    python -m experiments.embedder_table --pairs ../shared/data/stsb/test.tsv \\
        --variant "Text2Token (shipped)=default:benchmarks/results/encoder-hybrid" \\
        --variant "+ contrastive=runs/contrastive-cpu/adapter:benchmarks/results/contrastive-cpu" \\
        --baseline-runs benchmarks/results/encoder-hybrid \\
        --baseline-fusion benchmarks/results/fusion_encoder_subsets.json --out benchmarks/results/embedders.json

Columns: STS-B test Spearman; per shared collection nDCG@10 of the sparse (aligned tokens) and
dense channels and of the hybrid with weights chosen leave-one-collection-out (LOCO; read from
``<results>/fusion_cv.json``, written by ``experiments.fusion_cv``); their means; and what the
training cost (steps, pairs or texts seen, seconds, from the adapter's record and loss curve).
With ``--classification NAME=DIR``, the mean accuracy of a ``cls-eval`` results folder (sentence
classification on frozen embeddings) for the row NAME; every such folder must share one protocol.
Baseline rows: BM25 (Pyserini), all-MiniLM-L6-v2, and BM25 + MiniLM fused with LOCO weights.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from benchmarks.results_file import (
    load_results,
    metric_by_dataset,
    ndcg_by_dataset,
    parse_variant,
    read_json,
    recorded_adapters,
)

CHANNELS = ("sparse", "dense", "hybrid")


def _hybrid_loco(results_dir: Path) -> dict[str, float]:
    """LOCO hybrid nDCG@10 per collection from ``fusion_cv.json`` in a beir-eval output folder."""
    path = results_dir / "fusion_cv.json"
    if not path.exists():
        return {}
    d = read_json(path)
    return {name: v["loco"] for name, v in d["details"]["per_collection"].items()}


def _stage_seen(stage: dict, recipe: dict) -> str:
    """What one stage read: texts (Text2Token targets, CTKD, SimCSE dropout views) or pairs."""
    if "target" in stage:  # Text2Token: a target stage reads texts, the pairs stage pairs
        return f"{stage['steps'] * recipe.get('batch_size', 0)} {'pairs' if stage['target'] == 'pairs' else 'texts'}"
    if stage["kind"] == "ctkd":
        return f"{stage['steps'] * recipe.get('batch_size', 0)} texts (CTKD)"
    n = stage["steps"] * recipe.get("contrastive_batch_size", 0)
    return f"{n} texts (SimCSE)" if stage["kind"] == "simcse" else f"{n} span pairs"


def training_cost(adapter: str, model: str) -> dict:
    """Steps, pairs/texts seen and seconds of the run that wrote ``adapter`` (from its files).

    A stage snapshot (``adapter-stageK``) counts only the steps it had seen: its record's ``steps``
    and the completed stages of its ``stage_losses``.
    """
    from embedder.adapters import adapter_record, resolve_adapter

    path = resolve_adapter(adapter, model)
    rec = adapter_record(path)
    if rec is None:
        return {}
    recipe = rec.get("recipe", {})
    steps = rec.get("steps")
    out = {"steps": steps, "batch": recipe.get("batch_size")}
    stages = recipe.get("stages", [])
    done = rec.get("stage_losses")
    if done is not None:  # the stages this adapter had completed (a snapshot stops before the last)
        stages = [s for k, s in enumerate(stages) if str(k + 1) in done]
    if stages:
        out["seen"] = " + ".join(_stage_seen(s, recipe) for s in stages)
    # a run folder keeps the curve beside adapter/; a shipped adapter carries it inside its folder
    curve = next((c for c in (Path(path) / "loss_curve.json", Path(path).parent / "loss_curve.json") if c.exists()), None)
    if curve is not None:
        hist = json.loads(curve.read_text(encoding="utf-8"))["history"][: steps or None]
        if hist and all("seconds" in h for h in hist):
            out["seconds"] = round(sum(h["seconds"] for h in hist))
        elif hist and hist[-1].get("tokens_per_s"):  # runs before per-step seconds: exact only without a resume
            out["seconds"] = round(sum(h["tokens"] for h in hist) / hist[-1]["tokens_per_s"])
    return out


def _baseline_rows(runs: Path, fusion: Path | None, datasets: list[str]) -> list[list]:
    data = load_results(runs)
    per = metric_by_dataset(data, data["systems"])
    rows = []
    loco = {}
    if fusion is not None:
        sub = read_json(fusion)["details"]["subsets"]["bm25+encoder"]["per_collection"]
        loco = {name: v["ndcg@10"] for name, v in sub.items()}
    for name, system, column in (("BM25 (Pyserini)", "bm25-pyserini", "hybrid"), ("all-MiniLM-L6-v2", "minilm", "dense")):
        vals = {d: per.get(d, {}).get(system) for d in datasets}
        rows.append((name, system, {d: {column: v} for d, v in vals.items() if v is not None}))
    if loco:
        rows.append(("BM25 + MiniLM (LOCO fusion)", "bm25-pyserini, minilm", {d: {"hybrid": loco[d]} for d in datasets if d in loco}))
    return rows


def _recorded_weights(results_dir: Path) -> str:
    """The one adapter (weights' sha256) every LLM channel of a beir-eval results file ran with."""
    used = {(adapter or {}).get("sha256") for adapter in recorded_adapters(load_results(results_dir), CHANNELS).values()}
    if len(used) != 1:
        raise ValueError(f"{results_dir / 'results.json'}: field 'systems.*.params.adapter': the channels ran different weights ({sorted(map(str, used))})")
    return str(used.pop())


def _carried_rows(previous: Path) -> dict[str, dict]:
    """Rows of an earlier table by embedder name, as {column: cell}."""
    table = read_json(previous)
    return {r[0]: dict(zip(table["columns"], r)) for r in table["rows"]}


def _mean(nd: dict[str, dict[str, float]], datasets: list[str], channel: str) -> float | None:
    """The channel's mean nDCG@10 over ``datasets``; None unless the variant has every one of them."""
    if not all(channel in nd.get(d, {}) for d in datasets):
        return None
    return sum(nd[d][channel] for d in datasets) / len(datasets)


def _classification(specs: list[str], names: list[str]) -> tuple[dict[str, float], str]:
    """``NAME=CLS_EVAL_DIR`` options as {row name: mean accuracy}, and a sentence on their protocol.

    Means over different tasks or different row caps are not comparable: every folder must hold
    the same tasks with the same ``max_rows``, or the table is refused (file and field named).
    """
    out, protocols, dtypes = {}, {}, {}
    for spec in specs:
        name, eq, folder = spec.rpartition("=")
        if not eq or not name or not folder:
            raise SystemExit(f"--classification expects NAME=CLS_EVAL_DIR, got {spec!r}")
        if name not in names:
            raise SystemExit(f"--classification {spec!r}: no row named {name!r} (rows: {', '.join(names)})")
        path = Path(folder) / "results.json"
        data = read_json(path)
        for field in ("tasks", "mean_accuracy", "max_rows"):
            if field not in data:
                raise SystemExit(f"{path}: field {field!r} missing: not a cls-eval results file")
        protocols[str(path)] = (tuple(sorted(data["tasks"])), data["max_rows"])
        runtime = ((data.get("embedder") or {}).get("runtime") or {})
        dtypes[name] = runtime.get("dtype")
        out[name] = round(100 * float(data["mean_accuracy"]), 2)
    if len(set(protocols.values())) > 1:
        seen = "; ".join(f"{f}: tasks {', '.join(t)}, max_rows {m}" for f, (t, m) in protocols.items())
        raise SystemExit(f"--classification: fields 'tasks' / 'max_rows' differ between the folders ({seen}); their means do not compare")
    if not out:
        return out, ""
    tasks, cap = next(iter(protocols.values()))
    precisions = ", ".join(f"{n} {d}" for n, d in dtypes.items() if d)
    sentence = (
        f" Classification: mean accuracy (%) of logistic regression on frozen embeddings (cls-eval) over {', '.join(tasks)}"
        + (f", each split capped at {cap} texts (the same texts for every row)" if cap else ", full sets")
        + (f"; encoder precision per row: {precisions}" if precisions else "")
        + "; per-task figures in the classification section."
    )
    return out, sentence


def _named_values(specs: list[str], flag: str, what: str) -> dict[str, float]:
    """``NAME=VALUE`` options as {name: value}; the name may itself contain '='."""
    out = {}
    for spec in specs:
        name, eq, value = spec.rpartition("=")
        try:
            out[name] = float(value)
        except ValueError:
            name = ""
        if not eq or not name:
            raise SystemExit(f"{flag} expects NAME={what}, got {spec!r}")
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--pairs", type=Path, required=True, help="STS-B style TSV (sentence1, sentence2, score)")
    p.add_argument("--variant", type=parse_variant, action="append", required=True, help="NAME=ADAPTER[:BEIR_EVAL_OUT_DIR]")
    p.add_argument("--baseline-runs", type=Path, help="beir-eval output folder with bm25-pyserini and minilm runs")
    p.add_argument("--baseline-fusion", type=Path, help="fusion_cv --subsets-out file with the bm25+encoder subset")
    p.add_argument(
        "--sts",
        action="append",
        default=[],
        metavar="NAME=RHO",
        help="a variant's STS-B figure measured before (by sts-eval or another table), instead of measuring it here",
    )
    p.add_argument(
        "--seconds",
        action="append",
        default=[],
        metavar="NAME=S",
        help="a variant's training seconds read from its logs, for runs whose adapter keeps no per-step clock (a shipped adapter without its loss curve, a resumed run)",
    )
    p.add_argument(
        "--carry",
        type=Path,
        metavar="PREVIOUS.json",
        help="an earlier table of this script: a variant whose adapter folder is gone (a lost run) keeps its STS-B and "
        "training cells from the row of the same name there; its nDCG cells still come from its results folder",
    )
    p.add_argument(
        "--classification",
        action="append",
        default=[],
        metavar="NAME=CLS_EVAL_DIR",
        help="a row's cls-eval results folder (variant or baseline name): adds the mean classification accuracy",
    )
    p.add_argument("--model", default="smollm2-135m")
    p.add_argument("--title", default="Embedders of the same backbone against the baselines (STS-B test Spearman, nDCG@10)")
    p.add_argument("--out", type=Path, required=True)
    args = p.parse_args(argv)
    from embedder.adapters import resolve_adapter, shipped_adapters
    from training.cli.common import load_embedder
    from training.sts import read_pairs, sts_spearman

    pairs = read_pairs(args.pairs)
    known = _named_values(args.sts, "--sts", "RHO")
    seconds = _named_values(args.seconds, "--seconds", "S")
    previous = _carried_rows(args.carry) if args.carry else {}
    carried = []
    entries = []
    for name, adapter, results_dir in args.variant:
        if previous and adapter not in ("none", "default") and not Path(adapter).exists() and adapter not in shipped_adapters():
            # a lost run: its measured runs stay valid, its STS-B and cost were measured while it existed
            if name not in previous or results_dir is None:
                raise SystemExit(f"{adapter}: adapter folder gone, and {args.carry} has no row named {name!r} to carry")
            row = previous[name]
            nd = metric_by_dataset(load_results(results_dir), CHANNELS)
            for d, h in _hybrid_loco(results_dir).items():
                nd.setdefault(d, {})["hybrid"] = h
            cost = {k: row[col] for k, col in (("steps", "training steps"), ("seen", "seen"), ("seconds", "training s")) if row.get(col, "–") != "–"}
            carried.append(f"{name} (weights sha256 {_recorded_weights(results_dir)[:12]})")
            entries.append((name, adapter, row["STS-B ρ"], nd, cost))
            continue
        nd = ndcg_by_dataset(results_dir, resolve_adapter(adapter, args.model)) if results_dir else {}
        for d, h in (_hybrid_loco(results_dir) if results_dir else {}).items():
            nd.setdefault(d, {})["hybrid"] = h
        t0 = time.perf_counter()
        sts = known[name] if name in known else sts_spearman(load_embedder(args.model, adapter), pairs)["spearman"]
        print(f"{name}: STS-B spearman {sts:.4f} ({time.perf_counter() - t0:.0f} s)", file=sys.stderr)
        cost = training_cost(adapter, args.model)
        if name in seconds:
            cost["seconds"] = round(seconds[name])
        entries.append((name, adapter, round(sts, 4), nd, cost))
    datasets = sorted({d for *_, nd, _ in entries for d in nd})
    if args.baseline_runs is not None:
        from embedder.sentence_encoder import SentenceEncoder

        for name, system, nd in _baseline_rows(args.baseline_runs, args.baseline_fusion, datasets):
            sts = None
            if system == "minilm":
                from training.sts import spearman_of_embeddings, unique_sentences

                enc = SentenceEncoder.load("minilm")
                sts = round(spearman_of_embeddings(enc.encode(unique_sentences(pairs)), pairs)["spearman"], 4)
            entries.append((name, system, sts, nd, {}))
    # Variants run on fewer collections still compare with the others over the ones all variants share.
    common = [d for d in datasets if all(d in nd for _, _, _, nd, _ in entries[: len(args.variant)])]
    mean_over = [datasets] + ([common] if common and common != datasets else [])
    accuracy, cls_sentence = _classification(args.classification, [e[0] for e in entries])
    columns = ["embedder", "adapter / system", "STS-B ρ"] + (["classification acc %"] if accuracy else []) + [f"{d} {c}" for d in datasets for c in CHANNELS]
    columns += [f"mean {c}" for c in CHANNELS]
    if len(mean_over) > 1:
        columns += [f"mean {c} ({', '.join(common)})" for c in CHANNELS]
    columns += ["training steps", "seen", "training s"]
    rows = []
    for name, adapter, sts, nd, cost in entries:
        cells = [nd.get(d, {}).get(c) for d in datasets for c in CHANNELS]
        means = [_mean(nd, over, c) for over in mean_over for c in CHANNELS]
        fmt = [round(x, 4) if x is not None else "–" for x in cells + means]
        acc = [accuracy.get(name, "–")] if accuracy else []
        rows.append([name, adapter, sts if sts is not None else "–"] + acc + fmt + [cost.get("steps", "–"), cost.get("seen", "–"), cost.get("seconds", "–")])
    from benchmarks.tables import study_command, write_table

    write_table(
        args.out,
        title=args.title,
        command=study_command("experiments.embedder_table", argv),
        description=(
            f"Backbone {args.model}. STS-B: Spearman correlation of cosine similarity with the gold scores on {args.pairs} "
            f"({len(pairs.scores)} pairs). nDCG@10 from the beir-eval runs named in the command: sparse = aligned tokens, "
            "dense = cosine of pooled embeddings, hybrid = min-max or RRF fusion of sparse, dense and BM25 (Pyserini) with "
            "the setting best on the other four collections (leave-one-collection-out, experiments.fusion_cv). Baselines: "
            "BM25 in the hybrid columns, MiniLM in the dense columns, BM25 + MiniLM fused with LOCO weights in the hybrid "
            "columns. Training time is the trainer's own clock on the machine of the run (its adapter record)."
            + (
                f" STS-B of {', '.join(known)}: measured before and passed with --sts (sts-eval with the same pairs file, "
                "or the Text2Token table's measurement)."
                if known
                else ""
            )
            + (f" Training seconds of {', '.join(seconds)}: from the run's logs, passed with --seconds (their adapter folders keep no per-step clock)." if seconds else "")
            + (
                f" Adapter folders no longer on disk (lost runs): {'; '.join(carried)}. Their nDCG cells are their recorded "
                f"runs; their STS-B and training cells are carried from {args.carry}, measured while the adapter existed."
                if carried
                else ""
            )
            + cls_sentence
            + " A '–' marks a collection the variant was not run on; a mean needs all of them. Where some variants"
            " were run on fewer collections, the means over the collections every variant has are given too; the"
            " hybrid of such a variant chose its LOCO weights among those collections only."
        ),
        columns=columns,
        rows=rows,
    )
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
