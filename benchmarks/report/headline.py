"""The headline: which results BENCHMARKS.md and README.md open with, their tables and the cost plot.

* The **headline run** is a beir-eval run of the engine's operating points (``default`` = ``fast``,
  ``default-best`` = ``best``) beside the anchors a user would use instead (BM25 with Pyserini, MiniLM,
  mpnet, BM25 fused with either): the run over the most collections that has ``default`` and an anchor,
  the latest of those (``beir-eval report --headline benchmarks/results/NAME`` pins another).
* The **headline tables** of study files (:data:`HEADLINE_TABLES`) are named here by path: a new study
  joins the headline by a line below; every other file is in the generated index (INDEX.md).

Rendering only: no file is read or written here (benchmarks/report/document.py does both).
"""
from __future__ import annotations

from pathlib import Path

from benchmarks.report.markdown import fmt, fmt_int, fmt_ms, md_table, short_machine

OPERATING_POINTS = ("default", "default-best")
ANCHORS = ("bm25-pyserini", "minilm", "bm25+minilm", "mpnet", "bm25+mpnet")
# each operating point beside the anchor at its cost, cheapest first
ORDER = ("bm25-pyserini", "minilm", "bm25+minilm", "default", "mpnet", "bm25+mpnet", "default-best")
LABELS = {
    "default": "**fast** (the default)",
    "default-best": "**best** (`--profile best`)",
    "bm25-pyserini": "BM25 (Pyserini / Lucene)",
    "minilm": "all-MiniLM-L6-v2 (sentence-transformers, FAISS)",
    "bm25+minilm": "BM25 + MiniLM, fused",
    "mpnet": "all-mpnet-base-v2 (sentence-transformers, FAISS)",
    "bm25+mpnet": "BM25 + mpnet, fused",
}

# (section title, what it shows, results files under benchmarks/results/ in the order shown; a glob
# takes its newest match by the file's date). Everything else: benchmarks/results/INDEX.md.
HEADLINE_TABLES: list[tuple[str, str, list[str]]] = [
    ("Effectiveness held out",
     ("The fusion weights of the headline run were chosen on the same five collections; here each point's setting is "
     "chosen leaving each collection out and judged on the one left out."),
     ["operating-points-max.json", "operating-points-mpnet-channel.json"]),
    ("Build speed: the LLM's document encoding",
     ("The headline run's build times exclude the LLM's pass over the documents (its states came from the embedding "
     "cache). That pass, per runtime and precision, on the newest machine measured:"),
     ["encoder-speed-*.json"]),
    ("Index size",
     ("Bytes a document of the index each `--profile` builds, and nDCG@10 against the default before it "
     "(the headline run searched the float32 reference index)."),
     ["compact-index/compact-index-profiles.json"]),
    ("Scale",
     ("Synthetic and real-shaped corpora of a million and ten million documents on one machine, and real encoded "
     "vectors beside the learned-sparse engines Seismic and BMP."),
     ["scale/ten-million.json", "scale/real-shaped-1m.json", "scale/real-vectors-20k.json"]),
    ("Serving",
     "`serve` under load on loopback: unique queries, clients at once, `--max-concurrency` lanes; then with updates.",
     ["server-load.json", "server-load-updates.json"]),
    ("Updating an index",
     "An update's cost against a rebuild, and equality with it.",
     ["update-cost.json"]),
]


def label(name: str) -> str:
    return LABELS.get(name, f"`{name}`")


def is_headline_candidate(res: dict) -> bool:
    return "default" in res.get("systems", {}) and any(a in res["systems"] for a in ANCHORS)


def pick_headline_run(runs: list[tuple[Path, dict]], pinned: Path | None = None) -> tuple[Path, dict] | None:
    """The run README.md and BENCHMARKS.md open with (module docstring), or None."""
    if pinned is not None:
        pinned = Path(pinned).resolve()
        for path, res in runs:
            if path.resolve() in (pinned, pinned / "results.json"):
                return path, res
        raise ValueError(f"--headline {pinned}: not a beir-eval results file among the results")
    candidates = [(p, r) for p, r in runs if is_headline_candidate(r)]
    return max(candidates, key=lambda pr: (len(pr[1]["datasets"]), pr[1]["date"]), default=None)


def summarise(res: dict) -> list[dict]:
    """One row per system measured on every collection of the run, in :data:`ORDER`."""
    datasets = res["datasets"]
    names = [n for n in res["systems"] if all(n in d["results"] for d in datasets)]
    names.sort(key=lambda n: (ORDER.index(n) if n in ORDER else len(ORDER), list(res["systems"]).index(n)))
    rows = []
    for name in names:
        rs = [d["results"][name] for d in datasets]
        mean = lambda xs: sum(xs) / len(xs)
        inter = [r["latency"].get("interleaved_end_to_end") for r in rs]
        docs = sum(d["n_docs"] for d in datasets)
        # the wall clock of the build where it was taken and is longer (an index's own record may leave out a step,
        # as the manifest's seconds left out the fusion calibration): the cost a user waits for
        seconds = sum(max(r["index"]["seconds"], r.get("index_wall_seconds") or 0.0) for r in rs)
        rows.append({
            "name": name,
            "ndcg": {d["name"]: r["metrics"]["ndcg@10"] for d, r in zip(datasets, rs)},
            "ndcg_mean": mean([r["metrics"]["ndcg@10"] for r in rs]),
            "recall_mean": mean([r["metrics"]["recall@100"] for r in rs]) if all("recall@100" in r["metrics"] for r in rs) else None,
            "e2e": {d["name"]: r["latency"]["end_to_end"]["p50_ms"] for d, r in zip(datasets, rs)},
            "e2e_mean": mean([r["latency"]["end_to_end"]["p50_ms"] for r in rs]),
            "search_mean": mean([r["latency"]["search"]["p50_ms"] for r in rs]),
            "interleaved_mean": mean([x["p50_ms"] for x in inter]) if all(inter) else None,
            "build_s": seconds,
            "docs": docs,
            "docs_per_s": docs / seconds if seconds else None,
            "bytes_per_doc": sum(r["index"]["bytes"] for r in rs) / docs,
            "cached": any(r["index"].get("embeddings_cached") for r in rs),
            # the index's build seconds on each collection: one build shared by two systems reports the same figures to both
            "build_record": tuple(r["index"]["seconds"] for r in rs) if any(r["index"].get("shared_build") for r in rs) else None,
            "float32_index": name in OPERATING_POINTS and not ((res["systems"][name].get("params") or {}).get("index_options") or {}).get("compact"),
        })
    return rows


def _build_cell(row: dict) -> str:
    rate = row["docs_per_s"]
    cell = f"{fmt_int(row['build_s'])} s ({fmt_int(rate) if rate and rate >= 100 else fmt(rate, 1)} docs/s)"
    return cell + (" †" if row["cached"] else "")


def _footnotes(rows: list[dict]) -> list[str]:
    notes = []
    if any(r["cached"] for r in rows):
        notes.append("† the LLM's document states came from the embedding cache (`--embedding-cache`): the build time counts "
                     "the rest of the build (MiniLM, mpnet, BM25, writing), not the LLM's pass over the documents "
                     "(its speed: BENCHMARKS.md, \"Build speed\").")
    if any(r["float32_index"] for r in rows):
        notes.append("The engine's index in this run is the float32 reference, not the compact one `build-index` writes by default "
                     "(its bytes a document: \"Index size\" in BENCHMARKS.md).")
    points = [r["build_record"] for r in rows if r["name"] in OPERATING_POINTS and r["build_record"] is not None]
    if len(points) > 1 and len(set(points)) == 1:
        notes.append("`fast` and `best` were searched on one index holding both points' channels (one build, counted for each).")
    return notes


def readme_table(path_label: str, res: dict) -> str:
    """README.md's results table: each operating point beside what a user would use instead."""
    rows = summarise(res)
    n = len(res["datasets"])
    body = [[label(r["name"]), fmt(r["ndcg_mean"]), fmt_ms(r["e2e_mean"]), _build_cell(r)] for r in rows]
    out = [
        md_table(["System", f"nDCG@10 (mean of {n})", "Query p50 ms, end to end (mean)", f"Build, {fmt_int(rows[0]['docs'] if rows else 0)} docs"], body),
        "",
        f"Measured on {short_machine(res.get('machine', {}))} on {res['date'][:10]}, one run "
        f"({', '.join(d['name'] for d in res['datasets'])}; `{path_label}`). " + " ".join(_footnotes(rows)),
    ]
    return "\n".join(out)


def render_effectiveness(path_label: str, res: dict, heading: str = "##") -> str:
    rows = summarise(res)
    names = [d["name"] for d in res["datasets"]]
    body = [[label(r["name"])] + [fmt(r["ndcg"][d]) for d in names] + [f"**{fmt(r['ndcg_mean'])}**", fmt(r["recall_mean"])] for r in rows]
    return "\n".join([
        f"{heading} Effectiveness, with the anchors\n",
        (f"nDCG@10 per collection, the operating points beside what a user would use instead, in one run "
        f"(`{path_label}`; its full tables, significance and parameters: [report.md]({path_label}/report.md)).\n"),
        md_table(["System"] + names + ["mean nDCG@10", "mean Recall@100"], body) + "\n",
        _run_provenance(res),
    ])


def render_speed(path_label: str, res: dict, heading: str = "##") -> str:
    rows = summarise(res)
    names = [d["name"] for d in res["datasets"]]
    any_inter = any(r["interleaved_mean"] is not None for r in rows)
    body = [
        [label(r["name"])] + [fmt_ms(r["e2e"][d]) for d in names] + [fmt_ms(r["e2e_mean"]), fmt_ms(r["search_mean"])]
        + ([fmt_ms(r["interleaved_mean"]) if r["interleaved_mean"] is not None else "–"] if any_inter else [])
        + [_build_cell(r), fmt_int(r["bytes_per_doc"])]
        for r in rows
    ]
    head = (["System"] + [f"{d} e2e p50 ms" for d in names] + ["mean e2e p50 ms", "mean search p50 ms"]
            + (["mean e2e p50 ms, interleaved"] if any_inter else []) + ["build (all collections)", "index bytes/doc"])
    return "\n".join([
        f"{heading} Query and build speed\n",
        ("The same run: query latency one query at a time after warm-up (*end to end* = encoding the query + search; "
        "*interleaved*: every system answering each query back to back, so that all share the same minutes), "
        "build time and index size over all its collections.\n"),
        md_table(head, body) + "\n",
        " ".join(_footnotes(rows)) + "\n",
    ])


def _run_provenance(res: dict) -> str:
    return (f"Machine: {short_machine(res.get('machine', {}))}; date {res['date'][:10]}; commit "
            f"`{((res.get('commit') or {}).get('sha') or 'unknown')[:12]}`. Command:\n\n```bash\n{res['command']}\n```\n")


def plot_cost(res: dict):
    """nDCG@10 against query latency and against build time: the operating points beside the anchors."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import FuncFormatter, NullFormatter

    rows = summarise(res)
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.4), sharey=True)
    panels = (("e2e_mean", "query latency, end to end, p50 (ms, log scale; mean over collections)"),
              ("build_s", "build time for all collections (s, log scale)"))
    for ax, (key, xlabel) in zip(axes, panels):
        for r in rows:
            ours = r["name"] in OPERATING_POINTS
            x, y = r[key], r["ndcg_mean"]
            ax.scatter([x], [y], s=120 if ours else 60, marker="*" if ours else "o",
                       color="tab:red" if ours else "tab:blue", zorder=3)
            text = {"default": "fast", "default-best": "best"}.get(r["name"], r["name"])
            if key == "build_s" and r["cached"]:
                text += " †"
            ax.annotate(text, (x, y), textcoords="offset points", xytext=(-8, 4) if ours else (6, 4), fontsize=8,
                        ha="right" if ours else "left", fontweight="bold" if ours else "normal")
        xs = [r[key] for r in rows if r[key]]
        ax.set_xscale("log")
        if xs:
            ax.set_xlim(min(xs) / 1.6, max(xs) * 2.5)
        ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
        ax.xaxis.set_minor_formatter(NullFormatter())
        ax.set_xlabel(xlabel, fontsize=8)
        ax.grid(alpha=0.3)
    axes[0].set_ylabel(f"nDCG@10 (mean of {len(res['datasets'])} collections)")
    axes[0].set_title("Quality against query cost", fontsize=10)
    axes[1].set_title("Quality against build cost", fontsize=10)
    foot = f"{short_machine(res.get('machine', {}))}, {res['date'][:10]}. Red stars: the engine's operating points; blue: the anchors."
    if any(r["cached"] for r in rows):
        foot += " † LLM document states from the embedding cache (not in the build time)."
    fig.text(0.5, 0.01, foot, ha="center", fontsize=7)
    fig.tight_layout(rect=(0, 0.04, 1, 1))
    return fig
