"""The section of one study's table file (``kind: table``) and its optional plot."""
from __future__ import annotations

import os
from pathlib import Path

from benchmarks.report.markdown import fmt, md_table, short_machine


def render_table_section(path: Path, data: dict, rel_to: Path, plot: str | None = None, heading: str = "##", fenced: bool = False) -> str:
    """Markdown for one table results file; ``plot``: path of its PNG, if it has one; ``fenced``: the
    command in a shell block (the headline's, checked by tests/test_doc_commands.py) rather than inline."""
    cell = lambda c: fmt(c) if isinstance(c, float) else str(c)
    where = os.path.relpath(path, rel_to)
    machine = data.get("machine")
    when = ", ".join(x for x in (
        f"measured on {short_machine(machine)}" if isinstance(machine, dict) and machine.get("cpu") else "",
        f"{data['date'][:10]}" if data.get("date") else "",
    ) if x)
    if fenced:
        command = f"Results file [`{where}`]({where}){'; ' + when if when else ''}. Command:\n\n```bash\n{data['command']}\n```\n"
    else:
        command = f"Command: `{data['command']}`  (results file `{where}`{'; ' + when if when else ''})\n"
    parts = [
        f"{heading} {data['title']}\n",
        command,
        data["description"].strip() + "\n",
        md_table([str(c) for c in data["columns"]], [[cell(c) for c in row] for row in data["rows"]]) + "\n",
    ]
    if plot:
        parts.append(f"![{data['plot'].get('title', data['title'])}]({plot})\n")
    return "\n".join(parts)


def _plot_per_query_diff(data: dict):
    """One panel per system: each collection's per-query differences, sorted, over the query
    quantile (below 0: queries the system loses against the reference)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    diffs = data["details"]["per_query_diff"]
    fig, axes = plt.subplots(1, len(diffs), figsize=(5.5 * len(diffs), 4), squeeze=False, sharey=True)
    for ax, (system, by_collection) in zip(axes[0], diffs.items()):
        for collection, values in by_collection.items():
            n = len(values)
            xs = [(i + 0.5) / n for i in range(n)]
            ax.plot(xs, sorted(values), label=f"{collection} (n={n})", lw=1.2)
        ax.axhline(0, color="black", lw=0.8)
        ax.set_title(system, fontsize=9)
        ax.set_xlabel("query quantile (sorted by difference)")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    axes[0][0].set_ylabel("nDCG@10 difference")
    fig.suptitle(data["plot"].get("title", data["title"]), fontsize=10)
    fig.tight_layout()
    return fig


def plot_table(data: dict):
    """The plot a table asks for (benchmarks/tables.py): lines or grouped bars of y columns over x."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    if data["plot"].get("kind") == "per-query-diff":
        return _plot_per_query_diff(data)
    spec, cols = data["plot"], data["columns"]
    xi, si = cols.index(spec["x"]), cols.index(spec["series"]) if spec.get("series") else None
    rows = [r for r in data["rows"] if isinstance(r[cols.index(spec["y"][0])], (int, float))]
    groups: dict = {}
    for r in rows:
        groups.setdefault(r[si] if si is not None else None, []).append(r)
    lines = [(g, y) for g in groups for y in spec["y"]]
    fig, ax = plt.subplots(figsize=(7, 4))
    if spec.get("kind", "line") == "bar":
        xs = list(dict.fromkeys(r[xi] for r in rows))
        width = 0.8 / max(len(lines), 1)
        for i, (g, y) in enumerate(lines):
            by_x = {r[xi]: r[cols.index(y)] for r in groups[g]}
            pos = [j + (i - (len(lines) - 1) / 2) * width for j in range(len(xs))]
            ax.bar(pos, [by_x.get(x, float("nan")) for x in xs], width, label=y if g is None else f"{g}: {y}")
        ax.set_xticks(range(len(xs)), [str(x) for x in xs])
    else:
        for g, y in lines:
            ax.plot([r[xi] for r in groups[g]], [r[cols.index(y)] for r in groups[g]], marker="o", label=y if g is None else f"{g}: {y}")
        ax.set_xlabel(spec["x"])
    ax.set_title(spec.get("title", data["title"]))
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    return fig
