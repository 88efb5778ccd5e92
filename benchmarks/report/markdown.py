"""The small formatters every section of the report shares: numbers, tables, commits, machines."""
from __future__ import annotations

import io
import math

METRIC_LABELS = {"ndcg@10": "nDCG@10", "recall@100": "Recall@100", "mrr@10": "MRR@10"}


def fmt(x, digits: int = 4) -> str:
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "–"
    return f"{x:.{digits}f}"


def fmt_ms(x) -> str:
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "–"
    return f"{x:.2f}" if x < 10 else f"{x:.1f}"


def fmt_int(x) -> str:
    return "–" if x is None else f"{x:,.0f}"


def md_table(header: list[str], rows: list[list[str]], align: list[str] | None = None) -> str:
    align = align or ["l"] + ["r"] * (len(header) - 1)
    sep = ["---:" if a == "r" else "---" for a in align]
    lines = ["| " + " | ".join(header) + " |", "| " + " | ".join(sep) + " |"]
    lines += ["| " + " | ".join(str(c).replace("|", "\\|") for c in row) + " |" for row in rows]
    return "\n".join(lines)


def metric_label(m: str) -> str:
    if m in METRIC_LABELS:
        return METRIC_LABELS[m]
    name, _, k = m.partition("@")
    return f"{name.upper()}@{k}" if k else name.upper()


def fmt_commit(c: dict | None) -> str:
    if not c or not c.get("sha"):
        return "unknown"
    return f"`{c['sha'][:12]}`" + (" + uncommitted changes" if c.get("dirty") else "")


def fmt_machine(m: dict) -> str:
    flags = ""
    if "cpu_flags" in m:  # recorded since the runtimes issue: which precision is fast depends on them
        flags = f" [{' '.join(m['cpu_flags']) or 'no AVX2'}; native bf16: {'yes' if m.get('native_bf16') else 'no'}]"
    return f"{m.get('cpu', '?')}{flags}, {m.get('cores', '?')} cores, {m.get('ram_gib', '?')} GiB RAM, {m.get('os', '')}, Python {m.get('python', '?')}"


def short_machine(m: dict) -> str:
    """'2 cores of an Intel(R) Xeon(R) Processor (AVX512-BF16, no AMX)': a results file's machine in a few words."""
    flags = set(m.get("cpu_flags") or [])
    kind = None
    if flags:
        kind = "AMX" if "amx_bf16" in flags else ("AVX512-BF16, no AMX" if "avx512_bf16" in flags else ("AVX2" if "avx2" in flags else "no AVX2"))
    cpu = m.get("cpu", "?")
    return f"{m.get('cores', '?')} cores of {'an' if cpu[:1] in 'AEIOU' else 'a'} {cpu}" + (f" ({kind})" if kind else "")


def png_bytes(fig) -> bytes:
    """A matplotlib figure as PNG bytes without a timestamp (the same figure gives the same bytes); closes it."""
    import matplotlib.pyplot as plt

    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=100, metadata={"Software": None})
    plt.close(fig)
    return buf.getvalue()
