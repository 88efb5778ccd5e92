"""The section of one beir-eval results file (each run's report.md): per-dataset tables, significance, quoted numbers."""
from __future__ import annotations

import json

from benchmarks.report.markdown import fmt, fmt_commit, fmt_int, fmt_machine, fmt_ms, md_table, metric_label
from indexer.channels import LLM_STATE, MODES, spec

# Published numbers, quoted (never measured here), shown beside ours where the dataset matches.
# Keys: canonical BEIR dataset names. Each entry: (source label, link, {system: {metric: value}}).
QUOTED: dict[str, list[tuple[str, str, dict[str, dict[str, float]]]]] = {}


def _quote(dataset: str, label: str, link: str, rows: dict[str, dict[str, float]]) -> None:
    QUOTED.setdefault(dataset, []).append((label, link, rows))


_ANSERINI = "https://github.com/castorini/anserini/blob/master/docs/regressions/regressions-beir-v1.0.0-{}.flat.md"
for _name, _ndcg, _r100 in (("scifact", 0.6789, 0.9253), ("nfcorpus", 0.3218, 0.2457), ("fiqa", 0.2361, 0.5395), ("arguana", 0.3970, 0.9324)):
    _quote(_name, "Anserini/Pyserini BEIR v1.0.0 regression, BM25 flat", _ANSERINI.format(_name), {"BM25 flat (Lucene)": {"ndcg@10": _ndcg, "recall@100": _r100}})
_PAPER = "text-is-worth-several-tokens, Table 3 (nDCG@10)"
for _name, _vals in (
    ("fiqa", (0.236, 0.336, 0.531, 0.404, 0.600, 0.457)),
    ("nfcorpus", (0.325, 0.334, 0.393, 0.326, 0.409, 0.336)),
    ("scifact", (0.665, 0.693, 0.789, 0.669, 0.792, 0.703)),
    ("arguana", (0.315, 0.479, 0.575, 0.481, 0.632, 0.526)),
):
    _systems = ("BM25", "SPLADEv2", "LLM2Vec (dense)", "LLM2Vec to sparse (aligned tokens)", "GritLM (dense)", "GritLM to sparse (aligned tokens)")
    _quote(_name, _PAPER, "../shared/papers/text-is-worth-several-tokens.txt", {s: {"ndcg@10": v} for s, v in zip(_systems, _vals)})


def canonical_dataset(name: str) -> str:
    """``beir-scifact-test`` / ``scifact`` -> ``scifact`` (for matching quoted numbers)."""
    n = name.lower()
    for prefix in ("beir-", "beir/"):
        n = n.removeprefix(prefix)
    for suffix in ("-test", "/test", "-dev", "-train"):
        n = n.removesuffix(suffix)
    return n


def _shared_cpu(res: dict) -> str | None:
    """A note when the load average says other jobs competed for the CPU.

    The run itself keeps up to its thread count busy (all cores when not capped), so a
    1-minute load more than half a core above that (at start or end) means other work ran."""
    cores = (res.get("machine") or {}).get("cores") or 1
    own = min((res.get("settings") or {}).get("threads") or cores, cores)
    loads = [x[0] for x in (res.get("load_avg_start"), res.get("load_avg_end")) if x]
    if loads and max(loads) > max(own, 1) + 0.5:
        return f"1-minute load average up to {max(loads):.1f} on {cores} cores"
    return None


def _model_bits(p: dict) -> list[str]:
    model = p.get("model") or {}
    adapter = p.get("adapter")
    bits = [f"model {model.get('name')} (sha256 {str(model.get('sha256', ''))[:12]})"]
    bits.append(f"adapter {adapter.get('path')} ({str(adapter.get('sha256', ''))[:12]})" if adapter else f"adapter: none (raw backbone; --adapter {p.get('adapter_arg')})")
    emb = p.get("embedding") or {}
    bits.append(f"pooling {emb.get('pooling')}, attention {emb.get('attention')}, max_length {emb.get('max_length')}")
    if emb.get("query_prompt"):  # an asymmetric embedder: queries read their own template
        bits.append(f"query template {emb['query_prompt']!r} (documents: {emb.get('prompt')!r})")
    return bits


def _params_summary(name: str, p: dict) -> str:
    """The parameters that matter, in one line (all of them are in the JSON)."""
    mode = p.get("mode")
    kind = (p.get("index_options") or {}).get("dense_kind", p.get("dense_kind"))
    faiss = f"cosine, FAISS {kind}" + (" (exact)" if kind == "Flat" else "")
    if mode == "bm25":
        lex = p.get("lexical") or {}
        return f"analyser {lex.get('analyzer')}; BM25 k1={lex.get('k1')}, b={lex.get('b')}; {lex.get('scoring')}"
    row = spec(mode) if mode in MODES else None
    if (row is not None and LLM_STATE in row.query_needs) or mode == "hybrid" or "top_k" in p:
        bits = _model_bits(p)
        if (row is not None and row.required) or mode == "hybrid" or (mode is None and "top_k" in p):  # the aligned tokens
            bits.append(f"top_k (K) {p.get('top_k')}, expansion_m (M) {p.get('expansion_m')}, literal {p.get('literal')}")
            if p.get("query_weighting"):
                bits.append(f"query token weights: {p['query_weighting']}")
        if row is not None and row.query_kind == "dense":
            bits.append(faiss)
        if mode == "dense-ef":
            bits.append(f"EmbedFilter τ={p.get('embedfilter_tau')}")
        if mode == "hybrid":
            f = p.get("fusion") or {}
            if isinstance(f, str):  # a fusion each collection calibrates for itself: the run's per-collection details name it
                bits.append(f"fusion {f}")
            else:
                used = ", ".join(f"{c} {w:g}" for c, w in (f.get("weights") or {}).items() if w)
                bits.append(f"fusion {f.get('method')} ({used})" + (f", k={f['rrf_k']}" if f.get("rrf_k") else ""))
        return "; ".join(bits)
    if "k1" in p:
        return f"Pyserini {p.get('pyserini')} on Java {p.get('java')}; BM25 k1={p.get('k1')}, b={p.get('b')}; {p.get('analyzer')}"
    if "max_seq_length" in p:
        return f"{p.get('model')} ({p.get('package')}), {p.get('dim')}-d, max_seq_length {p.get('max_seq_length')}; {p.get('metric')}"
    return ", ".join(f"{k}={v}" for k, v in p.items() if not isinstance(v, (dict, list)))


# ---------------------------------------------------------------- beir-eval run
def render_run(res: dict, heading_level: int = 2, plots: list[tuple[str, str]] | None = None, title: str | None = None) -> str:
    """Markdown for one beir-eval results file."""
    h = "#" * heading_level
    metrics = res["settings"]["metrics"]
    out: list[str] = []
    out.append(f"{h} {title or 'beir-eval results'}\n")
    out.append(f"Command: `{res['command']}`\n")
    load = ""
    if res.get("load_avg_start") or res.get("load_avg_end"):
        load = f"; load average (1/5/15 min) at start {res.get('load_avg_start')}, at end {res.get('load_avg_end')}"
    busy = _shared_cpu(res)
    out.append(
        f"- Date: {res['date']}; commit {fmt_commit(res.get('commit'))}\n"
        f"- Machine: {fmt_machine(res.get('machine', {}))}{load}\n"
        f"- Wall time of the whole command: {res.get('wall_seconds', float('nan')):.0f} s (including model loads, index builds, compilation)\n"
        f"- Compute threads (torch, FAISS): {res['settings'].get('threads') or 'the libraries’ default (all cores)'}\n"
        f"- Run depth {res['settings']['depth']} hits per query; metrics by ranx; "
        f"ranx compile/cache-load {res.get('warmup', {}).get('ranx_seconds', float('nan')):.1f} s (not in any timing below)\n"
        + (f"- **The CPU was shared with other jobs during this run** ({busy}): times and throughputs are pessimistic.\n" if busy else "")
    )
    n_warm = res["settings"].get("warmup_queries", 1)
    out.append(
        f"Latency: one process, one query at a time, after a warm-up on the first {n_warm} queries (Numba compilation, "
        "JVM JIT, oneDNN) that is timed apart, and after one untimed pass of all pre-encoded queries through the index (steady state). "
        "*Search* = the pre-encoded query through the index (top-k ids and scores); "
        "*end to end* = query encoding + search. QPS = queries / summed latency. Index docs/s = documents / build seconds "
        "(the sparse and dense channels of this project share one build: the corpus is encoded once). "
        "Encode tokens/s = prompt tokens (template + text) through the backbone per encoding second (this project's systems).\n"
    )
    rows = []
    for name, info in res["systems"].items():
        rows.append([f"`{name}`", info.get("description", ""), _params_summary(name, info.get("params", {})), fmt(info.get("load_seconds"), 1)])
    out.append(md_table(["System", "What", "Parameters", "Load s"], rows, ["l", "l", "l", "r"]) + "\n")

    datasets = res["datasets"]
    if len(datasets) > 1:
        out.append(f"{h}# Mean over {len(datasets)} datasets\n")
        out.append(_mean_table(res, metrics) + "\n")
    for ds in datasets:
        out.append(_render_dataset(ds, metrics, h))
    if plots:
        out.append(f"{h}# Plots\n")
        for caption, path in plots:
            out.append(f"![{caption}]({path})\n")
    out.append(
        "<details><summary>All parameters of this run (from the results JSON)</summary>\n\n```json\n"
        + json.dumps({n: i.get("params", {}) for n, i in res["systems"].items()}, indent=2, sort_keys=True)
        + "\n```\n</details>\n"
    )
    return "\n".join(out)


def _interleaved(r: dict) -> float | None:
    """A result's interleaved end-to-end p50 (beir-eval --interleaved-latency), None where not measured."""
    stats = r["latency"].get("interleaved_end_to_end")
    return stats["p50_ms"] if stats else None


def _mean_table(res: dict, metrics: list[str]) -> str:
    rows = []
    any_interleaved = any(_interleaved(r) is not None for ds in res["datasets"] for r in ds["results"].values())
    for name in res["systems"]:
        vals = {m: [] for m in metrics}
        e2e, inter = [], []
        for ds in res["datasets"]:
            r = ds["results"].get(name)
            if r:
                for m in metrics:
                    vals[m].append(r["metrics"][m])
                e2e.append(r["latency"]["end_to_end"]["p50_ms"])
                inter.append(_interleaved(r))
        if not e2e:
            continue
        row = [f"`{name}`"] + [fmt(sum(v) / len(v)) for v in vals.values()] + [fmt_ms(sum(e2e) / len(e2e))]
        if any_interleaved:
            row.append(fmt_ms(sum(inter) / len(inter)) if None not in inter else "–")
        rows.append(row)
    head = ["System"] + [metric_label(m) for m in metrics] + ["e2e p50 ms (mean)"] + (["interleaved e2e p50 ms (mean)"] if any_interleaved else [])
    return md_table(head, rows)


def _render_dataset(ds: dict, metrics: list[str], h: str) -> str:
    out = [f"{h}# {ds['name']}\n"]
    desc = f"Source: `{ds['source']}` (split {ds['split']}): {ds['n_docs']:,} documents, {ds['n_queries']} judged queries, {ds['n_qrels']:,} qrels."
    if ds.get("sample"):
        s = ds["sample"]
        desc += f" **Sampled** (seed {s['seed']}): {s['n_queries']} of {s['of_queries']} queries, {s['n_docs']} of {s['of_docs']:,} documents (all judged documents of the sampled queries kept)."
    for note in ds.get("notes") or []:
        desc += f" Note: {note}."
    out.append(desc + "\n")
    rows = []
    for name, r in ds["results"].items():
        rows.append([f"`{name}`"] + [fmt(r["metrics"][m]) for m in metrics] + [fmt_ms(r["latency"]["end_to_end"]["p50_ms"])])
    out.append(md_table(["System"] + [metric_label(m) for m in metrics] + ["Latency e2e p50 ms"], rows) + "\n")
    rows = []
    any_interleaved = any(_interleaved(r) is not None for r in ds["results"].values())
    for name, r in ds["results"].items():
        lat, ix = r["latency"], r["index"]
        cached = bool(ix.get("embeddings_cached"))  # build from cached embeddings: no encoding measured
        rows.append(
            [
                f"`{name}`",
                "cached" if cached else fmt(ix["docs_per_s"], 1),
                "cached" if cached else (fmt_int(ix.get("tokens_per_s")) if ix.get("tokens_per_s") else "–"),
                fmt_int(ix["bytes_per_doc"]),
                fmt_ms(lat["search"]["p50_ms"]),
                fmt_ms(lat["search"]["p95_ms"]),
                fmt(lat["search"]["qps"], 1),
                fmt_ms(lat["end_to_end"]["p50_ms"]),
                fmt_ms(lat["end_to_end"]["p95_ms"]),
                fmt(lat["end_to_end"]["qps"], 1),
                fmt(r.get("warmup_seconds"), 2),
            ]
            + ([fmt_ms(_interleaved(r)) if _interleaved(r) is not None else "–"] if any_interleaved else [])
        )
    out.append(
        md_table(
            ["System", "Index docs/s", "Encode tokens/s", "Index bytes/doc", "Search p50 ms", "Search p95 ms", "Search QPS", "E2E p50 ms", "E2E p95 ms", "E2E QPS", "Warm-up s"]
            + (["E2E p50 ms, interleaved"] if any_interleaved else []),
            rows,
        )
        + "\n"
    )
    if ds.get("comparison"):
        out.append(_render_comparison(ds["comparison"]))
    quoted = QUOTED.get(canonical_dataset(ds["name"]))
    if quoted and not ds.get("sample"):
        out.append(_render_quoted(quoted, metrics))
    return "\n".join(out)


def _render_comparison(c: dict) -> str:
    systems, metrics = c["systems"], c["metrics"]
    rows = []
    for i, a in enumerate(systems):
        for b in systems[i + 1 :]:
            cells = []
            for m in metrics:
                p = c["p_values"].get(a, {}).get(b, {}).get(m)
                cells.append("–" if p is None else (f"**{p:.4f}**" if p < c["max_p"] else f"{p:.4f}"))
            rows.append([f"`{a}` vs `{b}`"] + cells)
    return (
        f"Paired significance ({c['stat_test']} test, ranx.compare), p-values; bold: p < {c['max_p']}:\n\n"
        + md_table(["Pair"] + [metric_label(m) for m in metrics], rows)
        + "\n"
    )


def _render_quoted(quoted: list, metrics: list[str]) -> str:
    out = ["Published numbers on the full dataset, **quoted, not measured here** (other machines, other settings):\n"]
    for label, link, rows in quoted:
        cols = [m for m in metrics if any(m in v for v in rows.values())]
        out.append(f"[{label}]({link}):\n")
        out.append(md_table(["System (quoted)"] + [metric_label(m) for m in cols], [[s] + [fmt(v.get(m)) for m in cols] for s, v in rows.items()]) + "\n")
    return "\n".join(out)
