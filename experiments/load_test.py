"""Load test of ``serve`` on loopback: N concurrent clients for T seconds, bounded, stops by itself.

    python -m experiments.load_test --index INDEX --clients 1,4 --seconds 20 --out benchmarks/results/load-test.json

1. In-process latency first: the same queries through ``Retriever.search`` one at a time in
   this process (the number the HTTP rows are compared with).
2. ``serve INDEX`` starts in a subprocess on 127.0.0.1 (never another address) with its
   default limits; /healthz is awaited.
3. For each client count: that many asyncio clients (httpx) POST /search in a loop, cycling
   through the queries, until ``--seconds`` pass or ``--max-requests`` were sent. Latency is
   measured at the client (request to full response). Any non-200 answer or transport error
   counts as an error.
4. The server's resident memory (RSS) before the first and after the last level; the server
   is stopped.

The results file is a table (``kind: table``) that BENCHMARKS.md shows with its command and CPU.
"""
from __future__ import annotations

import argparse
import asyncio
import gc
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from benchmarks.local_server import HOST, free_port, start_server, stop_server
from benchmarks.provenance import machine_info
from benchmarks.tables import study_command, write_table

DEFAULT_QUERIES = (
    "compress a file with gzip", "parse command line options", "read rows from a spreadsheet in comma separated format",
    "run an external program and capture its output", "compute the average and standard deviation of numbers",
    "generate a secure random password", "send an email", "match a regular expression", "format a date and time",
    "copy a directory tree", "serialise an object to bytes", "wait for a thread to finish",
)
COLUMNS = ["what", "clients", "requests", "seconds", "QPS", "p50 ms", "p95 ms", "p99 ms", "search p50 ms (server)", "errors",
           "server RSS MiB (before → after)"]


def read_queries(path: Path | None, limit: int) -> list[str]:
    """Queries: a BEIR queries.jsonl (``text`` field), a file of one query per line, or the defaults."""
    if path is None:
        return list(DEFAULT_QUERIES)
    out = []
    for lineno, line in enumerate(Path(path).read_text(encoding="utf-8").splitlines(), 1):
        if not line.strip():
            continue
        if path.suffix == ".jsonl":
            try:
                out.append(str(json.loads(line)["text"]))
            except (json.JSONDecodeError, KeyError, TypeError) as exc:
                raise ValueError(f"{path}:{lineno}: field 'text': {exc}") from None
        else:
            out.append(line.strip())
    if not out:
        raise ValueError(f"{path}: no queries")
    return out[:limit]


def percentiles(seconds: list[float]) -> dict[str, float | None]:
    if not seconds:
        return {"p50_ms": None, "p95_ms": None, "p99_ms": None}
    ms = np.asarray(seconds) * 1000
    return {f"p{q}_ms": round(float(np.percentile(ms, q)), 2) for q in (50, 95, 99)}


def in_process(index: Path, queries: list[str], k: int, mode: str | None, passes: int = 3) -> dict:
    """``Retriever.search`` one query at a time in this process, ``passes`` times over the
    queries after one unmeasured pass (the steady state the server reaches too)."""
    from retriever.quiet import quiet_libraries
    from retriever.retriever import Retriever

    with quiet_libraries():
        r = Retriever.load(index)
    mode = mode or r.default_mode
    for q in queries:  # one unmeasured pass: the first query of each length pays oneDNN's per-shape set-up
        r.search(q, k=k, mode=mode)
    secs = []
    for _ in range(passes):
        for q in queries:
            t0 = time.perf_counter()
            r.search(q, k=k, mode=mode)
            secs.append(time.perf_counter() - t0)
    out = {"mode": mode, "requests": len(secs), "seconds": sum(secs), **percentiles(secs)}
    del r
    gc.collect()
    return out


async def drive(url: str, queries: list[str], clients: int, seconds: float, max_requests: int, k: int, mode: str | None,
                headers: dict) -> dict:
    """``clients`` concurrent loops of POST /search until the time or request budget is spent."""
    import httpx

    latencies: list[float] = []
    server_ms: list[float] = []  # the server's own search time (its "took_ms"), without HTTP and queueing
    errors: dict[str, int] = {}
    sent = 0
    deadline = time.perf_counter() + seconds

    async def client(i: int, http: httpx.AsyncClient) -> None:
        nonlocal sent
        j = i
        while time.perf_counter() < deadline and sent < max_requests:
            sent += 1
            body = {"query": queries[j % len(queries)], "k": k, **({"mode": mode} if mode else {})}
            j += clients
            t0 = time.perf_counter()
            try:
                res = await http.post(f"{url}/search", json=body, headers=headers)
                ok = res.status_code == 200
                why = f"HTTP {res.status_code}"
            except httpx.HTTPError as exc:
                ok, why = False, type(exc).__name__
            if ok:
                latencies.append(time.perf_counter() - t0)
                server_ms.append(float(res.json().get("took_ms", "nan")))
            else:
                errors[why] = errors.get(why, 0) + 1

    limits = httpx.Limits(max_connections=clients, max_keepalive_connections=clients)
    start = time.perf_counter()
    async with httpx.AsyncClient(timeout=120, limits=limits) as http:
        await asyncio.gather(*(client(i, http) for i in range(clients)))
    wall = time.perf_counter() - start
    n = len(latencies) + sum(errors.values())
    return {"clients": clients, "requests": n, "seconds": round(wall, 2), "qps": round(len(latencies) / wall, 2) if wall else None,
            "errors": sum(errors.values()), "error_kinds": errors, "mean_ms": round(statistics.fmean(latencies) * 1000, 2) if latencies else None,
            "server_search_p50_ms": round(float(np.median(server_ms)), 2) if server_ms else None, **percentiles(latencies)}


def rss_mib(pid: int) -> float:
    import psutil

    return round(psutil.Process(pid).memory_info().rss / 2**20, 1)


def run(index: Path, queries: list[str], levels: list[int], seconds: float, max_requests: int, k: int, mode: str | None,
        serve_args: list[str], log: Path) -> dict:
    """The measurements: in-process latency, then each client level against one server."""
    results = {"load_avg_start": list(os.getloadavg()), "in_process": in_process(index, queries, k, mode), "levels": []}
    port = free_port()
    proc = start_server(index, port, serve_args, log)
    try:
        url = f"http://{HOST}:{port}"
        import httpx

        info = httpx.get(f"{url}/info", timeout=10).json()
        results["server"] = {"describe": info.get("describe"), "limits": info.get("limits"), "runtime": info.get("runtime"),
                             "documents": info.get("documents")}
        results["rss_before_mib"] = rss_mib(proc.pid)
        asyncio.run(drive(url, queries, 1, 120.0, len(queries), k, mode, {}))  # one unmeasured pass, as in-process
        for clients in levels:
            results["levels"].append(asyncio.run(drive(url, queries, clients, seconds, max_requests, k, mode, {})))
        results["rss_after_mib"] = rss_mib(proc.pid)
        results["load_avg_end"] = list(os.getloadavg())  # other work on the machine competes for the same cores
    finally:
        stop_server(proc)
    return results


def table(results: dict, command: str, index: Path, n_queries: int, seconds: float, k: int) -> dict:
    ip = results["in_process"]
    rss = f"{results['rss_before_mib']} → {results['rss_after_mib']}"
    rows = [["in-process Retriever.search (one at a time)", 1, ip["requests"], round(ip["seconds"], 2),
             round(ip["requests"] / ip["seconds"], 2), ip["p50_ms"], ip["p95_ms"], ip["p99_ms"], ip["p50_ms"], 0, "–"]]
    for lv in results["levels"]:
        rows.append([f"HTTP POST /search, {lv['clients']} client(s)", lv["clients"], lv["requests"], lv["seconds"], lv["qps"],
                     lv["p50_ms"], lv["p95_ms"], lv["p99_ms"], lv["server_search_p50_ms"], lv["errors"], rss])
    server = results.get("server", {})
    m = machine_info()
    return {
        "title": "Serving: `serve` under load on loopback beside in-process latency",
        "command": command,
        "description": (
            f"Index `{index}` ({server.get('documents')} documents; {server.get('describe')}), k={k}, {n_queries} distinct queries cycled. "
            "First the same queries through `Retriever.search` one at a time in the driver's process (3 passes, after one unmeasured "
            "pass: a query length seen for the first time pays oneDNN's per-shape set-up); then `serve` in a "
            f"subprocess on 127.0.0.1 with its default limits ({json.dumps(server.get('limits'))}), one unmeasured pass over the queries, "
            "and for each level that many asyncio/httpx "
            f"clients POST /search back to back for {seconds:g} s. Latency is measured at the client (request to full response, JSON "
            "encoding, loopback and queueing behind --max-concurrency included); *search p50 (server)*: the server's own time in "
            "`Retriever.batch_search` (its `took_ms`). QPS = successful responses / wall seconds; errors = non-200 answers or transport errors. "
            "RSS: the server process's resident memory before the first level and after the last. "
            f"CPU: {m['cpu']}, {m['cores']} cores ({', '.join(m['cpu_flags']) or 'no AVX2'}); the driver runs on the same cores as the "
            "server, so concurrent clients also compete with it for CPU. 1-minute load average at start / end: "
            f"{results['load_avg_start'][0]:.1f} / {results.get('load_avg_end', [float('nan')])[0]:.1f}."
        ),
        "columns": COLUMNS,
        "rows": rows,
        "details": results,
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m experiments.load_test", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--index", required=True, type=Path)
    p.add_argument("--queries", type=Path, help="BEIR queries.jsonl or one query per line (default: a dozen about the Python stdlib)")
    p.add_argument("--max-queries", type=int, default=200)
    p.add_argument("--clients", default="1,4", help="comma-separated client counts, one level each")
    p.add_argument("--seconds", type=float, default=20.0, help="per level (each level stops by itself)")
    p.add_argument("--max-requests", type=int, default=5000, help="per level, whichever comes first")
    p.add_argument("-k", type=int, default=10)
    p.add_argument("--mode", help="default: the server's default (hybrid)")
    p.add_argument("--serve-arg", action="append", default=[], help="extra argument for serve (repeat), e.g. --serve-arg=--max-concurrency=2")
    p.add_argument("--out", type=Path, required=True, help="results JSON (a table for BENCHMARKS.md)")
    args = p.parse_args(argv)
    if args.seconds <= 0 or args.seconds > 600 or args.max_requests < 1:
        p.error("--seconds must be in (0, 600] and --max-requests positive: the test is bounded")
    levels = [int(c) for c in args.clients.split(",") if c.strip()]
    if not levels or min(levels) < 1 or max(levels) > 64:
        p.error("--clients: counts between 1 and 64")
    queries = read_queries(args.queries, args.max_queries)
    command = study_command("experiments.load_test", argv)
    log = Path(tempfile.gettempdir()) / f"load_test-serve-{os.getpid()}.log"  # the server's output, for a failure's diagnosis
    args.out.parent.mkdir(parents=True, exist_ok=True)
    results = run(args.index, queries, levels, args.seconds, args.max_requests, args.k, args.mode, args.serve_arg, log)
    data = table(results, command, args.index, len(queries), args.seconds, args.k)
    write_table(args.out, **data)
    for row in data["rows"]:
        print(" | ".join(str(c) for c in row))
    print(f"wrote {args.out}")
    return 1 if any(lv["errors"] for lv in results["levels"]) else 0


if __name__ == "__main__":
    sys.exit(main())
