"""Run systems over datasets: index, warm up, time every query, evaluate, write results.

Timing protocol (single process, this machine):

* loading a system (model weights, JVM start) and its first query (Numba compilation,
  JIT warm-up) are timed apart and never counted as query time;
* every query is then encoded alone (timed); all pre-encoded queries are searched once
  untimed (a warm pass: Lucene's JIT needs many calls to settle), then searched again one
  at a time, timed: *search* latency is that search of the pre-encoded query, *end to
  end* is encoding + search of that query;
* ranx's own compilation is paid by a warm-up on a toy example, also timed apart;
* with ``interleaved``, every system then answers each query once more, the systems one after
  another on the same query, in an order that changes from query to query (:func:`run_orders`:
  every permutation in turn): a ratio of two systems' latencies is then taken over the same
  minutes of the machine's life, not over two stretches minutes apart (on a shared 2-core VM
  the same encoder measured 20% apart that way), and no system always runs right after the
  same other one (whose work, a JVM's included, may warm or evict the caches it needs).
"""
from __future__ import annotations

import logging
import os
import shlex
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

from benchmarks.datasets import Dataset
from benchmarks.metrics import compare_runs, evaluate_run, metric_names, warm_up
from benchmarks.provenance import git_commit, load_avg, machine_info
from benchmarks.results_file import RESULTS_FILE, RESULTS_FORMAT, RESULTS_KIND, load_results
from benchmarks.runs import write_trec
from benchmarks.systems import Settings, System, load_timed, make
from benchmarks.timing import Stopwatch, latency_stats
from embedder.util import set_threads, write_json_atomic, write_text_atomic

log = logging.getLogger(__name__)

# Queries run once before timing: the first compiles Numba kernels; a few more let the
# JVM's JIT (Lucene) and oneDNN (torch) settle. Timed apart, reported as warm-up.
WARMUP_QUERIES = 3


# ------------------------------------------------------------------------- run
def run_suite(
    datasets: list[Dataset],
    system_names: list[str],
    settings: Settings,
    out_dir: Path,
    depth: int = 100,
    compare: bool = False,
    runs_gzip: bool = False,
    command: str | None = None,
    extra_settings: dict | None = None,
    resume: bool = False,
    interleaved: bool = False,
) -> dict:
    """Run every system on every dataset; write runs, results JSON and a markdown report.

    With ``resume``, datasets that ``out_dir``'s results file already holds for every
    requested system are kept as they are and not run again (a long run stopped half-way
    goes on where it stopped); the file must come from the same systems and depth.
    """
    start = time.perf_counter()
    out_dir.mkdir(parents=True, exist_ok=True)
    metrics = metric_names(depth)
    results: dict = {
        "kind": RESULTS_KIND,
        "format_version": RESULTS_FORMAT,
        "command": command or "beir-eval " + shlex.join(sys.argv[1:]),
        "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "commit": git_commit(),
        "machine": machine_info(),
        "load_avg_start": load_avg(),
        "settings": {"depth": depth, "metrics": metrics, "compare": compare, "warmup_queries": WARMUP_QUERIES, "interleaved_latency": interleaved, **(extra_settings or {})},
        "warmup": {},
        "systems": {},
        "datasets": [],
    }

    done, previous_wall = _resumable(out_dir / RESULTS_FILE, system_names, depth) if resume else ({}, None)
    if done:
        results["resumed"] = {"datasets": sorted(done), "previous_wall_seconds": previous_wall}
    datasets = [ds for ds in datasets if ds.name not in done]
    shared: dict = {}
    # Instantiating checks that each system can run here (packages, model files) before any long work.
    systems: list[System] = [make(name, settings, shared) for name in system_names]

    results["warmup"]["ranx_seconds"] = round(warm_up(depth), 3)
    results["warmup"]["numba_cache_dir"] = os.environ.get("NUMBA_CACHE_DIR")

    for s in systems:
        seconds = load_timed(s)
        results["systems"][s.name] = {"description": s.description, "load_seconds": round(seconds, 3)}
        log.info("loaded %s in %.1f s", s.name, seconds)
    if settings.threads:
        set_threads(settings.threads)  # after loading: Embedder.load sizes torch's pool itself
    results["settings"]["threads"] = settings.threads
    for s in systems:
        results["systems"][s.name]["params"] = s.params()

    results["datasets"].extend(done.values())
    try:
        for ds in datasets:
            results["datasets"].append(_run_dataset(ds, systems, out_dir, depth, metrics, compare, runs_gzip, interleaved))
            for s in systems:  # some parameters are only known once an index exists
                results["systems"][s.name]["params"] = s.params()
            _write(results, out_dir, start)  # partial results survive a later failure
    finally:
        for s in systems:
            s.close()
    return _write(results, out_dir, start)


def _resumable(path: Path, system_names: list[str], depth: int) -> tuple[dict, float | None]:
    """Datasets of an earlier results file that hold every requested system, by name, and
    that file's wall seconds; ``({}, None)`` where there is no file."""
    if not path.exists():
        return {}, None
    old = load_results(path)
    if old.get("settings", {}).get("depth") != depth:
        raise ValueError(f"{path}: field 'settings.depth': {old['settings'].get('depth')} here, {depth} asked; cannot resume")
    missing = [n for n in system_names if n not in old.get("systems", {})]
    if missing:
        raise ValueError(f"{path}: field 'systems': no {', '.join(missing)}; cannot resume a run of other systems")
    done = {d["name"]: d for d in old.get("datasets", []) if all(n in d.get("results", {}) for n in system_names)}
    return done, old.get("wall_seconds")


def _write(results: dict, out_dir: Path, start: float) -> dict:
    from benchmarks.report import render_run

    results["wall_seconds"] = round(time.perf_counter() - start, 1)
    results["load_avg_end"] = load_avg()
    write_json_atomic(out_dir / RESULTS_FILE, results)
    write_text_atomic(out_dir / "report.md", render_run(results, heading_level=1))
    return results


def _run_dataset(
    ds: Dataset, systems: list[System], out_dir: Path, depth: int, metrics: list[str], compare: bool, runs_gzip: bool,
    interleaved: bool = False,
) -> dict:
    qids = list(ds.queries)
    texts = [ds.queries[q] for q in qids]
    entry = {**ds.describe(), "results": {}}
    runs: dict[str, dict] = {}
    print(f"\n== {ds.name}: {len(ds.docs)} docs, {len(qids)} queries", file=sys.stderr, flush=True)
    for s in systems:
        with Stopwatch() as build:
            stats = s.index(ds)
        with Stopwatch() as warm:
            s.warm_up(texts[:WARMUP_QUERIES], depth)
        encoded, enc_secs = s.encode(texts)
        with Stopwatch() as warm_pass:
            s.search_all(encoded, depth)  # steady state: Lucene's JIT needs more than a few calls
        all_hits, search_secs = s.search_all(encoded, depth)
        # canonical order (score desc, then id) so the TREC file and ranx see the same ranking
        run = {qid: dict(sorted(((d, float(sc)) for d, sc in hits), key=lambda kv: (-kv[1], kv[0]))) for qid, hits in zip(qids, all_hits)}
        runs[s.name] = run
        scores = evaluate_run(ds.qrels, run, metrics)
        suffix = ".trec.gz" if runs_gzip else ".trec"
        run_file = write_trec(run, out_dir / "runs" / ds.name / f"{s.name}{suffix}", tag=s.name)
        e2e = [a + b for a, b in zip(enc_secs, search_secs)]
        entry["results"][s.name] = {
            "metrics": scores,
            "index": stats.to_dict(),
            # less an untimed warm-up build that ran inside it (compilation, AlignedTokensEngine._warm_build)
            "index_wall_seconds": round(build.seconds - (stats.details.get("warmup_build_seconds") or 0.0), 3),
            "warmup_seconds": round(warm.seconds, 3),
            "warm_pass_seconds": round(warm_pass.seconds, 3),
            "latency": {
                "search": latency_stats(search_secs),
                "encode": latency_stats(enc_secs),
                "end_to_end": latency_stats(e2e),
            },
            "run_file": str(run_file.relative_to(out_dir)),
        }
        lat = entry["results"][s.name]["latency"]
        print(
            f"   {s.name:<15} nDCG@10 {scores['ndcg@10']:.4f}  R@100 {scores['recall@100']:.4f}  "
            f"search p50 {lat['search']['p50_ms']:.2f} ms  e2e p50 {lat['end_to_end']['p50_ms']:.2f} ms  "
            f"index {stats.to_dict()['docs_per_s']:.1f} docs/s",
            file=sys.stderr,
            flush=True,
        )
    if interleaved and len(systems) > 1:
        for name, stats in interleaved_latency(systems, texts, depth).items():
            entry["results"][name]["latency"]["interleaved_end_to_end"] = stats
        print("   interleaved e2e p50: " + ", ".join(f"{n} {entry['results'][n]['latency']['interleaved_end_to_end']['p50_ms']:.2f} ms" for n in runs),
              file=sys.stderr, flush=True)  # fmt: skip
    if compare and len(runs) > 1:
        entry["comparison"] = compare_runs(ds.qrels, runs, metrics)
    return entry


def run_orders(n: int, count: int, seed: int = 0) -> list[tuple[int, ...]]:
    """The order of ``n`` systems on each of ``count`` queries: all n! permutations in turn,
    shuffled once (seeded), so that over every n! queries each system runs in each position,
    and right after each other system, equally often. A rotation (the order shifted by one a
    query) does not do that for three systems or more: every system then runs right after the
    same one on all but one query in n. Past 5 systems (120 orders), an order drawn at random
    for each query."""
    import itertools
    import random

    rng = random.Random(seed)
    if n > 5:
        return [tuple(rng.sample(range(n), n)) for _ in range(count)]
    orders = list(itertools.permutations(range(n)))
    rng.shuffle(orders)
    return [orders[i % len(orders)] for i in range(count)]


def interleaved_latency(systems: list[System], texts: list[str], depth: int) -> dict[str, dict]:
    """End-to-end latency (encode + search) of every system on each query, the systems back to
    back on the same query, in the orders of :func:`run_orders`. Every encoding is measured
    afresh (:meth:`System.forget_encodings`)."""
    seconds: dict[str, list[float]] = {s.name: [] for s in systems}
    for text, order in zip(texts, run_orders(len(systems), len(texts))):
        for s in (systems[j] for j in order):
            s.forget_encodings()  # measured again, never recalled from the timed pass or the warm-up
            encoded, enc_secs = s.encode([text])
            _, search_secs = s.search_all(encoded, depth)
            seconds[s.name].append(enc_secs[0] + search_secs[0])
    return {name: latency_stats(v) for name, v in seconds.items()}
