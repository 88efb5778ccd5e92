"""The classification section of BENCHMARKS.md, from ``kind: cls-eval`` results files (benchmarks/classification/)."""
from __future__ import annotations

import os
from pathlib import Path

from benchmarks.report.markdown import fmt_machine, md_table

TASK_ORDER = ("mr", "cr", "subj", "mpqa", "trec", "banking77", "emotion")
MULTI_CLASS = ("trec", "banking77", "emotion")


def row_order(item: tuple[Path, dict]) -> tuple[int, str]:
    """Baseline first, then the raw backbone, its adapters, and BTMR last (the issue's table order)."""
    path, d = item
    emb = d.get("embedder") or {}
    if emb.get("kind") == "sentence-transformers":
        rank = 0
    elif emb.get("btmr"):
        rank = 3
    elif emb.get("adapter") is None:
        rank = 1
    else:
        rank = 2
    return rank, str(path)


def _tasks(files: list[tuple[Path, dict]]) -> list[str]:
    names = {t for _, d in files for t in d["tasks"]}
    return [t for t in TASK_ORDER if t in names] + sorted(names - set(TASK_ORDER))


def _pct(x: float | None) -> str:
    return "–" if x is None else f"{100 * x:.2f}"


def _row(label: str, d: dict, tasks: list[str], get) -> list[str]:
    vals = [get(d["tasks"][t]) if t in d["tasks"] else None for t in tasks]
    mean = sum(vals) / len(vals) if vals and all(v is not None for v in vals) else None
    return [label] + [_pct(v) for v in vals] + [_pct(mean)]


def plot_classification(files: list[tuple[Path, dict]]):
    """Grouped bars: accuracy per task, one bar per embedder row (boosted rows included)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    files = sorted(files, key=row_order)
    tasks = _tasks(files)
    series = []
    for _, d in files:
        series.append((d["label"] + (" (one token)" if d["boost"] else ""), [d["tasks"].get(t, {}).get("accuracy") for t in tasks]))
        if d["boost"]:
            series.append((d["label"] + " + boosting", [d["tasks"][t]["boosted"]["accuracy"] if t in d["tasks"] else None for t in tasks]))
    fig, ax = plt.subplots(figsize=(10, 4.5))
    width = 0.8 / max(len(series), 1)
    for i, (label, vals) in enumerate(series):
        pos = [j + (i - (len(series) - 1) / 2) * width for j in range(len(tasks))]
        ax.bar(pos, [100 * v if v is not None else float("nan") for v in vals], width, label=label)
    ax.set_xticks(range(len(tasks)), tasks)
    ax.set_ylabel("accuracy (%)")
    ax.set_title("Sentence classification: logistic regression on frozen embeddings")
    ax.legend(fontsize=7, ncol=2)
    ax.grid(axis="y", alpha=0.3)
    fig.tight_layout()
    return fig


def render_classification(files: list[tuple[Path, dict]], base: Path, plot: str | None = None) -> str:
    """Markdown: accuracy per task and embedder (single token; boosted where measured), macro-F1, and per-prefix detail."""

    files = sorted(files, key=row_order)
    tasks = _tasks(files)
    header = ["Embedder"] + tasks + ["mean"]
    acc, f1, detail, cmds = [], [], [], []
    for path, d in files:
        acc.append(_row(f"{d['label']} (one token)" if d["boost"] else d["label"], d, tasks, lambda r: r["accuracy"]))
        f1.append(_row(f"{d['label']} (one token)" if d["boost"] else d["label"], d, [t for t in tasks if t in MULTI_CLASS], lambda r: r["macro_f1"]))
        if d["boost"]:
            acc.append(_row(f"{d['label']} + Token Fusion Boosting (k={d['k']})", d, tasks, lambda r: r["boosted"]["accuracy"]))
            f1.append(_row(f"{d['label']} + Token Fusion Boosting (k={d['k']})", d, [t for t in tasks if t in MULTI_CLASS], lambda r: r["boosted"]["macro_f1"]))
            trees = all("boosted_trees" in r for r in d["tasks"].values())  # results files before the prefix booster have one booster
            if trees:
                acc.append(_row(f"{d['label']} + boosted trees (k={d['k']}, comparison)", d, tasks, lambda r: r["boosted_trees"]["accuracy"]))
            for t in tasks:
                r = d["tasks"].get(t)
                if r:
                    detail.append([d["label"], t] + [_pct(p["accuracy"]) for p in r["prefixes"]] + [
                        _pct(r["boosted"]["accuracy"]), _pct(r["boosted_trees"]["accuracy"]) if trees else "–",
                        " ".join(f"{w:.2f}" for w in r.get("booster_weights", [])) or "–",
                        f"{100 * r['boost_gain_over_best_prefix']:+.2f}", f"{100 * (r['boosted']['accuracy'] - r['accuracy']):+.2f}"])
        cmds.append(f"- {d['label']}: `{d['command']}` (`{os.path.relpath(path, base)}`; {d['texts_encoded']} texts; encoding {d['encode_s']} s"
                    f"{' (from cache)' if d['encode_s'] < 5 else ''}; wall {d['wall_s']} s)")
    first = files[0][1]
    sampled = {d.get("max_rows") for _, d in files}
    caps = sorted(x for x in sampled if x)
    parts = [
        "## Sentence classification (cls-eval)" + (f", sampled ({', '.join(map(str, caps))} texts per split)" if caps else ", full sets") + "\n",
        ("Logistic regression on frozen embeddings (scikit-learn: standardised features, L2; C as each row's results file "
        "records it: from an inner 3-fold CV on the training rows only, or fixed with `--c`). MR, CR, SUBJ, MPQA: 10-fold stratified cross-validation; TREC, Banking77, Emotion: train/test. "
        "Accuracy in %, predictions of all folds pooled. For this project's embedders, *one token* is the engine's pooled token "
        "(the last prompt position); *Token Fusion Boosting* (BTMR §3.3) fits one classifier per prefix of the k token states "
        "(for an embedder without BTMR groups: the last k prompt positions, last first) and fuses their out-of-fold class "
        "probabilities with gradient boosting (Algorithm 1) whose weak learners are those prefix classifiers "
        "(benchmarks/fusion_boosting.py: a log-linear pool f_0 + sum_j w_j log p_j, the w_j shown per task below); "
        "*boosted trees* is the same algorithm with regression trees as the weak learners, for comparison.\n"),
    ]
    if caps:
        cap = min(caps)
        parts.append(f"**Sampled:** each split capped at {', '.join(str(s) for s in caps)} texts (stratified, seed 0; "
                     "the same texts for every row), so that every row fits in a session on a 2-core CPU; the rows run on the full sets "
                     "(~72k sentences) are in their own section. "
                     f"A 10-fold CV task tests each of its {cap} sampled texts once, so one text is {100 / cap:.2f} points and the "
                     f"standard error of an accuracy near 80% is about {100 * (0.16 / cap) ** 0.5:.1f} points (TREC tests its 500 texts); "
                     "rows share their texts, so their differences are less noisy than that, but differences under a point are within noise.\n")
    parts += [
        f"Machine: {fmt_machine(first.get('machine', {}))}.\n",
        md_table(header, acc, ["l"] + ["r"] * (len(header) - 1)) + "\n",
        "Macro-F1 (%) of the multi-class sets:\n",
        md_table(["Embedder"] + [t for t in tasks if t in MULTI_CLASS] + ["mean"], f1, ["l"] + ["r"] * 4) + "\n",
    ]
    if detail:
        k = max(len(r) - 7 for r in detail)
        parts += [
            ("Each prefix alone, boosted (and with trees), the booster's weight per prefix (mean over splits), and the gain of "
            "boosting over the best single prefix (measured on the test texts, so an optimistic bar for the prefix) and over "
            "the one-token row:\n"),
            md_table(["Embedder", "task"] + [f"prefix {i}" for i in range(1, k + 1)]
                   + ["boosted", "trees", "weights w_1..w_k", "gain vs best prefix", "gain vs one token"],
                   detail, ["l", "l"] + ["r"] * (k + 5)) + "\n",
        ]
    if plot:
        parts.append(f"![Sentence classification accuracy]({plot})\n")
    parts.append("Commands:\n\n" + "\n".join(cmds) + "\n")
    return "\n".join(parts)


__all__ = ["TASK_ORDER", "render_classification"]
