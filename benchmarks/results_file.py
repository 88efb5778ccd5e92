"""The results files under ``benchmarks/results/``: one reader for each kind, for the report and the studies.

Three kinds, told apart by the field ``kind``:

- ``beir-eval``: a beir-eval run (``results.json`` in its ``--out`` folder; written by benchmarks/suite.py);
- ``table``: a study's table (benchmarks/tables.py);
- ``cls-eval``: a cls-eval run (``results.json``; benchmarks/classification/).

Every reader names the file and the field that is wrong.
"""
from __future__ import annotations

import argparse
import json
from collections.abc import Iterable
from pathlib import Path
from typing import Any

RESULTS_KIND = "beir-eval"
RESULTS_FORMAT = 1
RESULTS_FILE = "results.json"
TABLE_KIND = "table"
CLS_KIND = "cls-eval"
LLM_CHANNELS = ("sparse", "dense")  # the systems of this project's LLM embedder that a variant's run must hold


def read_json(path: str | Path) -> Any:
    """Parse a JSON file; malformed JSON is a ValueError naming the file and line."""
    path = Path(path)
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as exc:
        raise ValueError(f"{path}:{exc.lineno}: malformed JSON ({exc.msg})") from None


def results_path(path: str | Path) -> Path:
    """``path`` itself, or ``path/results.json`` when ``path`` is a folder (a beir-eval or cls-eval ``--out``)."""
    path = Path(path)
    return path / RESULTS_FILE if path.is_dir() else path


def load_results(path: str | Path) -> dict:
    """A beir-eval results file (or the folder holding one), checked to be one."""
    path = results_path(path)
    data = read_json(path)
    if not isinstance(data, dict) or data.get("kind") != RESULTS_KIND:
        raise ValueError(f"{path}: field 'kind': not a beir-eval results file")
    return data


def check_table(path: Path, data: dict) -> None:
    """Raise ValueError (file and field named) unless ``data`` is a well-formed table file."""
    for key, typ in (("title", str), ("command", str), ("description", str), ("columns", list), ("rows", list)):
        if not isinstance(data.get(key), typ):
            raise ValueError(f"{path}: field {key!r}: expected {typ.__name__}")  # noqa: TRY004 - a malformed file is bad input: ValueError naming file and field, which the CLIs catch
    for i, row in enumerate(data["rows"]):
        if not isinstance(row, list) or len(row) != len(data["columns"]):
            raise ValueError(f"{path}: field 'rows'[{i}]: expected a list of {len(data['columns'])} cells")


def check_cls_results(path: Path, data: dict) -> None:
    """Raise ValueError unless ``data`` is a cls-eval results file the report can render."""
    if not isinstance(data.get("tasks"), dict) or not isinstance(data.get("label"), str):
        raise ValueError(f"{path}: a cls-eval results file needs 'label' (string) and 'tasks' (object)")  # noqa: TRY004 - a malformed file is bad input: ValueError naming file and field, which the CLIs catch


def find_all_results(results_dir: Path) -> tuple[list[tuple[Path, dict]], list[tuple[Path, dict]], list[tuple[Path, dict]]]:
    """(beir-eval results, table results, cls-eval results) under ``results_dir``, sorted by path;
    hidden folders and JSON files of other kinds are skipped."""
    runs, tables, classification = [], [], []
    for path in sorted(results_dir.rglob("*.json")):
        if any(part.startswith(".") for part in path.relative_to(results_dir).parts):
            continue
        data = read_json(path)
        kind = data.get("kind") if isinstance(data, dict) else None
        if kind == RESULTS_KIND:
            runs.append((path, data))
        elif kind == TABLE_KIND:
            check_table(path, data)
            tables.append((path, data))
        elif kind == CLS_KIND:
            check_cls_results(path, data)
            classification.append((path, data))
    return runs, tables, classification


# ------------------------------------------------------------------ what the studies read from a beir-eval run
def metric_by_dataset(data: dict, systems: Iterable[str], metric: str = "ndcg@10") -> dict[str, dict[str, float]]:
    """{dataset: {system: metric}} of a beir-eval results file, for the ``systems`` each dataset holds."""
    systems = tuple(systems)
    return {ds["name"]: {s: ds["results"][s]["metrics"][metric] for s in systems if s in ds["results"]} for ds in data["datasets"]}


def ndcg_by_dataset(results_dir: Path, adapter_dir: Path | None, channels: Iterable[str] = LLM_CHANNELS) -> dict[str, dict[str, float]]:
    """nDCG@10 per dataset and channel from one beir-eval results file, checking that each channel ran
    with the weights of ``adapter_dir`` (None: the raw backbone)."""
    from embedder.adapters import adapter_identity

    path = results_path(results_dir)
    data = load_results(path)
    # the weights' hash, not the path: a shipped adapter keeps its hash when its folder is renamed
    expect = (adapter_identity(adapter_dir) or {}).get("sha256")
    for channel, used in recorded_adapters(data, channels).items():
        if (used or {}).get("sha256") != expect:
            raise ValueError(f"{path}: field 'systems.{channel}.params.adapter': ran with {used!r}, expected the weights of {adapter_dir}")
    return metric_by_dataset(data, channels)


def recorded_adapters(data: dict, systems: Iterable[str]) -> dict[str, dict | None]:
    """{system: the adapter identity it recorded ({"path", "sha256"} or None)} for the ``systems`` the file holds."""
    return {s: (data["systems"][s].get("params") or {}).get("adapter") for s in systems if s in data["systems"]}


def parse_variant(spec: str) -> tuple[str, str, Path | None]:
    """A study's ``NAME=ADAPTER[:RESULTS_DIR]`` option: an embedder variant and the beir-eval run of it."""
    name, eq, rest = spec.partition("=")
    if not eq or not name or not rest:
        raise argparse.ArgumentTypeError(f"--variant expects NAME=ADAPTER[:RESULTS_DIR], got {spec!r}")
    adapter, colon, results = rest.partition(":")
    return name, adapter, Path(results) if colon else None


def read_fusions(path: Path) -> dict[str, dict]:
    """{channel subset: Retriever fusion setting} from a ``fusion_cv --subsets-out`` results file
    (each subset's setting chosen on all collections) or from a plain JSON object of them."""
    data = read_json(path)
    if isinstance(data, dict) and data.get("kind") == TABLE_KIND:
        subsets = (data.get("details") or {}).get("subsets")
        if not isinstance(subsets, dict):
            raise ValueError(f"{path}: a table file without details.subsets (not written by fusion_cv --subsets-out)")
        data = {name: entry["default"] for name, entry in subsets.items()}
    if not isinstance(data, dict) or not all(isinstance(v, dict) and isinstance(v.get("weights"), dict) for v in data.values()):
        raise ValueError(f"{path}: expected {{subset: {{'method': ..., 'weights': {{channel: weight}}}}}}")
    return data
