"""Build throughput on a local Ray cluster against local ``--workers``: what ``--ray`` costs.

    python -m experiments.ray_build --corpus ../shared/data/cisi --docs 256 --shard-size 32 \\
        --workers 1,2 --out benchmarks/results/ray-build.json

The first ``--docs`` documents of the corpus are indexed (aligned tokens only: encoding is what a
build costs) by ``build-index`` as a user runs it, once per executor and worker count:
``--workers N`` (local processes), then ``--ray ADDRESS --workers N`` against a Ray head this
study starts on 127.0.0.1 with the machine's CPUs, each actor reserving cores / N (and stops at the end). Each build
runs alone, one after the other, with the same model, shards and threads per worker (the
machine's cores / N).

Reported per build: wall seconds of the whole command (the driver's model load, encoding,
merge), documents per wall second, the seconds its manifest gives to encoding, the workers' model
loads (Ray: as each actor reports it), and the overhead per shard of Ray against the local build
with as many workers: (Ray wall - local wall) / shards.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import benchmarks
from benchmarks.provenance import machine_info
from benchmarks.tables import study_command, write_table
from indexer.ray_workers import LOOPBACK_ENV, local_head

COLUMNS = ["executor", "workers", "documents", "shards", "wall s", "docs/s (wall)", "encode s (sum over shards)",
           "worker model loads s", "overhead per shard vs local, ms"]


def subset(corpus: Path, n: int, out: Path) -> Path:
    """The first ``n`` lines of a BEIR corpus.jsonl, as a corpus file of their own."""
    src = corpus / "corpus.jsonl" if corpus.is_dir() else corpus
    lines = []
    with open(src, encoding="utf-8") as f:
        for line in f:
            if line.strip():
                lines.append(line if line.endswith("\n") else line + "\n")
            if len(lines) == n:
                break
    out.write_text("".join(lines), encoding="utf-8")
    return out


def build(corpus: Path, index: Path, shard_size: int, extra: list[str], env: dict[str, str]) -> dict:
    """One ``build-index`` run: its wall seconds and its manifest's build record."""
    cmd = [sys.executable, "-m", "indexer.cli", "--corpus", str(corpus), "--index", str(index), "--channels", "sparse",
           "--shard-size", str(shard_size), "--quiet", "--overwrite", *extra]  # fmt: skip
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, check=False, timeout=3600)
    wall = time.perf_counter() - t0
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed:\n{proc.stderr[-3000:]}")
    manifest = json.loads((index / "manifest.json").read_text())
    return {"wall_s": wall, "build": manifest["build"], "n_docs": manifest["n_docs"], "runtime": manifest["runtime"], "model": manifest["model"],
            "adapter": manifest.get("adapter")}


def run(corpus: Path, n_docs: int, shard_size: int, workers: list[int], work: Path, model_args: list[str]) -> list[dict]:
    env = {**os.environ, "PYTHONPATH": str(Path(benchmarks.__file__).resolve().parents[1])}
    part = subset(corpus, n_docs, work / "corpus.jsonl")
    cores = os.cpu_count() or 1
    results = []
    for n in workers:
        results.append({"executor": "local", "workers": n, **build(part, work / f"local-{n}", shard_size, ["--workers", str(n), *model_args], env)})
    with local_head(max(cores, max(workers)), env=env) as address:
        ray_env = {**env, **LOOPBACK_ENV}
        for n in workers:
            # as local workers split the cores: each actor reserves (and runs threads on) cores / n
            extra = ["--ray", address, "--workers", str(n), "--cpus-per-worker", str(max(1, cores // n)), *model_args]
            results.append({"executor": "ray", "workers": n, **build(part, work / f"ray-{n}", shard_size, extra, ray_env)})
    return results


def table(results: list[dict], command: str, corpus: Path, shard_size: int) -> dict:
    local = {r["workers"]: r["wall_s"] for r in results if r["executor"] == "local"}
    rows = []
    for r in results:
        b = r["build"]
        loads = b.get("executor", {}).get("load_seconds")
        overhead = (r["wall_s"] - local[r["workers"]]) / b["shards"] * 1000 if r["executor"] == "ray" else None
        rows.append([
            r["executor"] if r["executor"] == "local" else "ray (local head)", r["workers"], r["n_docs"], b["shards"],
            f"{r['wall_s']:.1f}", f"{r['n_docs'] / r['wall_s']:.2f}", f"{b['encode_seconds']:.1f}",
            ", ".join(f"{s:.1f}" for s in loads) if loads else "–", f"{overhead:.0f}" if overhead is not None else "–",
        ])
    m = machine_info()
    runtime, model, adapter = results[0]["runtime"], results[0]["model"], results[0].get("adapter") or {}
    model_name = model.get("name", "?") if isinstance(model, dict) else str(model)
    adapter_name = Path(adapter.get("path", "none")).name if isinstance(adapter, dict) else str(adapter)
    return {
        "title": "Build on a local Ray cluster against local --workers",
        "command": command,
        "description": (
            f"The first {results[0]['n_docs']} documents of `{corpus}`, aligned tokens only (`--channels sparse`), "
            f"{shard_size} documents per shard; model {model_name}, adapter {adapter_name} "
            f"({runtime.get('name')} {runtime.get('dtype')}). Each row is one `build-index` run, alone, one after the "
            "other; *wall* is the whole command (the driver's model load, encoding, merge), so docs/s (wall) includes fixed "
            "costs that a longer build amortises. Ray rows: a head this study started on 127.0.0.1 with the machine's "
            "CPUs, each actor reserving cores / workers of them as local workers share them; each actor loads the model once (*worker model loads*); shards come back to the driver, "
            "which commits them. *Overhead per shard*: (Ray wall - local wall with as many workers) / shards. "
            f"CPU: {m['cpu']}, {m['cores']} cores ({', '.join(m['cpu_flags']) or 'no AVX2'})."
        ),
        "columns": COLUMNS,
        "rows": rows,
        "details": {"runs": results},
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m experiments.ray_build", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--corpus", required=True, type=Path, help="BEIR folder or corpus .jsonl")
    p.add_argument("--docs", type=int, default=256, help="documents indexed (the first ones)")
    p.add_argument("--shard-size", type=int, default=32)
    p.add_argument("--workers", default="1,2", help="comma-separated worker counts")
    p.add_argument("--model", help="backbone (default: build-index's default)")
    p.add_argument("--adapter", help="adapter (default: build-index's default)")
    p.add_argument("--out", type=Path, required=True, help="results JSON (a table for BENCHMARKS.md)")
    args = p.parse_args(argv)
    workers = [int(w) for w in args.workers.split(",") if w.strip()]
    if not workers or min(workers) < 1:
        p.error("--workers: positive counts")
    command = study_command("experiments.ray_build", argv)
    with tempfile.TemporaryDirectory(prefix="ray-build-") as work:
        model_args = [*(["--model", args.model] if args.model else []), *(["--adapter", args.adapter] if args.adapter else [])]
        results = run(args.corpus, args.docs, args.shard_size, workers, Path(work), model_args)
    data = table(results, command, args.corpus, args.shard_size)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    write_table(args.out, **data)
    for row in data["rows"]:
        print(" | ".join(str(c) for c in row))
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
