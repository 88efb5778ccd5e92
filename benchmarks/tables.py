"""Result tables written by the study scripts (sweeps, fusion CV, EmbedFilter), for ``beir-eval report``.

A table file is ``{"kind": "table", "title", "command", "description", "columns", "rows"}``
plus when and where it was measured (date, commit, machine), optional ``details`` (anything
JSON) and an optional ``plot``: ``{"kind": "line" or "bar", "x": column, "y": [columns], "series": column
or null, "title": str}`` that the report draws: one line (or bar group) per (series value, y column);
or ``{"kind": "per-query-diff", "title": str}``: ``details["per_query_diff"]`` = {system: {collection:
[per-query differences, sorted]}}, drawn as one panel per system, one line per collection.
"""
from __future__ import annotations

import shlex
import sys
from collections.abc import Sequence
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from embedder.util import write_json_atomic


def study_command(module: str, argv: Sequence[str] | None = None) -> str:
    """The command a table records: ``python -m MODULE`` and the arguments it was given (``argv``,
    or the process's own when ``None``), shell-quoted so that it can be run again as it stands."""
    return f"python -m {module} " + shlex.join(sys.argv[1:] if argv is None else list(argv))


def table_header() -> dict[str, Any]:
    """What every table file opens with: its kind, and when and where it was measured (UTC date, commit, machine)."""
    from benchmarks.provenance import git_commit, machine_info

    return {"kind": "table", "date": datetime.now(timezone.utc).isoformat(timespec="seconds"), "commit": git_commit(), "machine": machine_info()}


def write_table(
    path: Path,
    title: str,
    command: str,
    description: str,
    columns: list[str],
    rows: list[list[Any]],
    details: dict | None = None,
    plot: dict | None = None,
) -> Path:
    """Write a table results file atomically (temporary file, then rename)."""
    for i, row in enumerate(rows):
        if len(row) != len(columns):
            raise ValueError(f"row {i} has {len(row)} cells for {len(columns)} columns")
    if plot is not None and plot.get("kind") == "per-query-diff":
        if not isinstance((details or {}).get("per_query_diff"), dict) or not details["per_query_diff"]:
            raise ValueError("a per-query-diff plot needs details['per_query_diff'] = {system: {collection: [differences]}}")
    elif plot is not None:
        missing = [c for c in [plot.get("x"), *plot.get("y", []), plot.get("series")] if c is not None and c not in columns]
        if missing or not plot.get("y"):
            raise ValueError(f"plot names unknown columns {missing} (columns: {columns})")
    data = {
        **table_header(),
        "title": title,
        "command": command,
        "description": description,
        "columns": columns,
        "rows": rows,
    }
    if details is not None:
        data["details"] = details
    if plot is not None:
        data["plot"] = plot
    return write_json_atomic(path, data, indent=1, newline=True)
