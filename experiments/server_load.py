"""Loopback load test of ``serve`` with unique queries: QPS and p50/p99 at 1, 8 and 32 clients,
for one or more ``--max-concurrency`` settings (issue 52: does throughput grow with clients?).

    python -m experiments.server_load --index INDEX --queries ../shared/data/cisi/queries.jsonl \\
        --clients 1,8,32 --seconds 5 --concurrency 1,2 --out benchmarks/results/server-load.json

For each concurrency setting, ``serve INDEX --max-concurrency N`` starts in a subprocess on
127.0.0.1 (never another address); /healthz is awaited and a few warm-up requests sent. Then, for
each client count, that many asyncio clients (httpx, one keep-alive connection each) POST
/search back to back for ``--seconds``. Every request carries a query never sent before in
the run (the collections' queries in order; once they are used up, each again with a
`` #n`` suffix), so the server's query cache never answers: every request pays its
encoding. Latency is measured at the client (request to full response). QPS = successful
responses / wall seconds; errors = non-200 answers or transport errors. The server's /info
``batching`` block says how many requests shared an encoder forward. The CPU (lscpu's model
name and flags) and the load average are recorded: the driver and the server share the cores
(and, on a shared machine, with whatever else runs), so the numbers are indicative.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from benchmarks.local_server import HOST, free_port, start_server, stop_server
from benchmarks.provenance import machine_info
from benchmarks.tables import study_command, write_table

COLUMNS = ["max-concurrency", "clients", "requests", "seconds", "QPS", "p50 ms", "p99 ms", "errors", "requests per forward"]
DEFAULT_QUERIES = [Path("../shared/data/cisi/queries.jsonl")]


class UniqueQueries:
    """Queries never repeated within a run: the files' queries in order, then again with a suffix."""

    def __init__(self, texts: list[str]) -> None:
        if not texts:
            raise ValueError("no queries")
        self.texts, self.i = list(dict.fromkeys(texts)), 0

    def next(self) -> str:
        n, rnd = self.i % len(self.texts), self.i // len(self.texts)
        self.i += 1
        return self.texts[n] if rnd == 0 else f"{self.texts[n]} #{rnd}"


def read_queries(paths: list[Path]) -> list[str]:
    out = []
    for path in paths:
        for lineno, line in enumerate(Path(path).read_text(encoding="utf-8").splitlines(), 1):
            if not line.strip():
                continue
            try:
                out.append(str(json.loads(line)["text"])[:1900] if path.suffix == ".jsonl" else line.strip())
            except (json.JSONDecodeError, KeyError, TypeError) as exc:
                raise ValueError(f"{path}:{lineno}: field 'text': {exc}") from None
    return out


def lscpu() -> dict:
    """lscpu's model name and flags (the machine the numbers belong to)."""
    try:
        text = subprocess.run(["lscpu"], capture_output=True, text=True, timeout=10, check=False).stdout
    except OSError:
        text = ""
    fields = dict(line.split(":", 1) for line in text.splitlines() if ":" in line)
    return {"model": fields.get("Model name", "").strip() or None, "flags": fields.get("Flags", "").split(),
            "cpus": fields.get("CPU(s)", "").strip() or None}


async def write_while_loaded(http, url: str, n: int, seconds: float, out: list[dict]) -> None:
    """``n`` updates spread over ``seconds``: each POST /documents adds one new document, then
    searches for it until it is found (at most 10 s): how long until the update is answered."""
    for i in range(n):
        await asyncio.sleep(seconds / (n + 1))
        doc_id, words = f"load-update-{os.getpid()}-{i}", f"quokka{i} marsupial island"
        t0 = time.perf_counter()
        res = await http.post(f"{url}/documents", json={"documents": [{"_id": doc_id, "text": f"{words} update number {i}"}]})
        posted = time.perf_counter() - t0
        seen = None
        while res.status_code == 200 and time.perf_counter() - t0 < posted + 10:
            found = await http.post(f"{url}/search", json={"query": words, "k": 3, "fields": ["id"]})
            if found.status_code == 200 and doc_id in [h["id"] for h in found.json()["hits"]]:
                seen = time.perf_counter() - t0
                break
            await asyncio.sleep(0.05)
        out.append({"status": res.status_code, "post_s": round(posted, 3), "found_after_s": None if seen is None else round(seen, 3),
                    "detail": None if res.status_code == 200 else res.text[:200]})


async def drive(url: str, queries: UniqueQueries, clients: int, seconds: float, k: int, updates: int = 0) -> dict:
    """``clients`` concurrent loops of POST /search (each query new) for ``seconds``; with
    ``updates``, that many POST /documents meanwhile (the server must be --writable)."""
    import httpx

    latencies: list[float] = []
    errors: dict[str, int] = {}
    deadline = time.perf_counter() + seconds

    async def client(http: httpx.AsyncClient) -> None:
        while time.perf_counter() < deadline:
            t0 = time.perf_counter()
            try:
                res = await http.post(f"{url}/search", json={"query": queries.next(), "k": k})
                ok, why = res.status_code == 200, f"HTTP {res.status_code}: {res.text[:120]}"
            except httpx.HTTPError as exc:
                ok, why = False, type(exc).__name__
            if ok:
                latencies.append(time.perf_counter() - t0)
            else:
                errors[why] = errors.get(why, 0) + 1

    limits = httpx.Limits(max_connections=clients, max_keepalive_connections=clients)
    start = time.perf_counter()
    written: list[dict] = []
    async with httpx.AsyncClient(timeout=120, limits=limits) as http:
        writer = [write_while_loaded(http, url, updates, seconds, written)] if updates else []
        await asyncio.gather(*(client(http) for _ in range(clients)), *writer)
    wall = time.perf_counter() - start
    ms = np.asarray(latencies) * 1000
    return {**({"updates": written} if updates else {}),"clients": clients, "requests": len(latencies) + sum(errors.values()), "seconds": round(wall, 2),
            "qps": round(len(latencies) / wall, 2), "errors": sum(errors.values()), "error_kinds": errors,
            "p50_ms": round(float(np.percentile(ms, 50)), 1) if len(ms) else None,
            "p99_ms": round(float(np.percentile(ms, 99)), 1) if len(ms) else None}


def run(index: Path, texts: list[str], levels: list[int], settings: list[int], seconds: float, k: int, extra: list[str], updates: int = 0) -> dict:
    import httpx

    queries = UniqueQueries(texts)
    out: dict = {"load_avg_start": list(os.getloadavg()), "settings": []}
    for concurrency in settings:
        port = free_port()
        log = Path(tempfile.gettempdir()) / f"server_load-{os.getpid()}-{concurrency}.log"
        proc = start_server(index, port, ["--max-concurrency", str(concurrency), *extra], log)
        url = f"http://{HOST}:{port}"
        try:
            info = httpx.get(f"{url}/info", timeout=10).json()
            asyncio.run(drive(url, queries, 1, min(2.0, seconds), k))  # warm-up (not measured)
            levels_out = []
            for clients in levels:
                before = httpx.get(f"{url}/info", timeout=30).json()["batching"]
                # the updates run during the largest level only
                level = asyncio.run(drive(url, queries, clients, seconds, k, updates if clients == max(levels) else 0))
                after = httpx.get(f"{url}/info", timeout=30).json()["batching"]
                groups = after["groups"] - before["groups"]
                level["requests_per_forward"] = round(level["requests"] / groups, 2) if groups else None
                levels_out.append(level)
                print(f"max-concurrency {concurrency}, {clients} client(s): {level['qps']} QPS, p50 {level['p50_ms']} ms, "
                      f"p99 {level['p99_ms']} ms, {level['errors']} errors", flush=True)
            out["settings"].append({"max_concurrency": concurrency, "levels": levels_out, "describe": info.get("describe"),
                                    "documents": info.get("documents"), "runtime": info.get("runtime")})
        finally:
            stop_server(proc)
    out["load_avg_end"] = list(os.getloadavg())
    out["queries_sent"] = queries.i
    out["distinct_query_texts"] = len(queries.texts)
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m experiments.server_load", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--index", required=True, type=Path)
    p.add_argument("--queries", type=Path, action="append", help="queries.jsonl (BEIR) or one query per line; repeat (default: cisi's)")
    p.add_argument("--clients", default="1,8,32", help="comma-separated client counts")
    p.add_argument("--concurrency", default="2", help="comma-separated serve --max-concurrency settings, one server each")
    p.add_argument("--seconds", type=float, default=5.0, help="per level (bounded: at most 120)")
    p.add_argument("-k", type=int, default=10)
    p.add_argument("--serve-arg", action="append", default=[], help="extra argument for serve (repeat)")
    p.add_argument("--updates", type=int, default=0,
                   help="POST /documents this many times during the largest level, each adding a document, on a copy of the index "
                        "(serve --writable): its latency and how soon a search finds the document")
    p.add_argument("--out", type=Path, required=True)
    args = p.parse_args(argv)
    if not 0 < args.seconds <= 120:
        p.error("--seconds must be in (0, 120]")
    levels = [int(c) for c in args.clients.split(",") if c.strip()]
    settings = [int(c) for c in args.concurrency.split(",") if c.strip()]
    if not levels or min(levels) < 1 or max(levels) > 64 or not settings or min(settings) < 1:
        p.error("--clients: counts between 1 and 64; --concurrency: positive")
    texts = read_queries(args.queries or DEFAULT_QUERIES)
    command = study_command("experiments.server_load", argv)
    index, extra = args.index, list(args.serve_arg)
    if args.updates:  # the updates change an index: a copy of it, never the one given
        index = Path(tempfile.mkdtemp(prefix="server_load-")) / "index"
        shutil.copytree(os.path.realpath(args.index), index)
        extra.append("--writable")
    results = run(index, texts, levels, settings, args.seconds, args.k, extra, args.updates)
    if args.updates:
        shutil.rmtree(index.parent, ignore_errors=True)
    cpu = lscpu()
    results["lscpu"] = cpu
    rows = [[s["max_concurrency"], lv["clients"], lv["requests"], lv["seconds"], lv["qps"], lv["p50_ms"], lv["p99_ms"], lv["errors"],
             lv["requests_per_forward"]] for s in results["settings"] for lv in s["levels"]]
    first = results["settings"][0]
    m = machine_info()
    description = (
        f"Index `{args.index}` ({first['documents']} documents; {first['describe']}), k={args.k}, unique queries "
        f"({results['distinct_query_texts']} texts, {results['queries_sent']} sent; none repeated, so no query-cache hits). "
        f"`serve` on 127.0.0.1, one server per --max-concurrency setting; for each level that many asyncio/httpx clients POST "
        f"/search back to back for {args.seconds:g} s after a warm-up. Latency at the client. *requests per forward*: requests "
        f"served / search groups run (retriever/server/batching.py). CPU: {cpu['model'] or m['cpu']}, {m['cores']} cores; the "
        f"driver shares them with the server (and with other jobs on a shared machine: indicative numbers). 1-minute load "
        f"average at start / end: {results['load_avg_start'][0]:.1f} / {results['load_avg_end'][0]:.1f}."
    )
    written = [u for s_ in results["settings"] for lv in s_["levels"] for u in lv.get("updates", [])]
    if written:
        found = [u["found_after_s"] for u in written if u["found_after_s"] is not None]
        description += (
            f" During the {max(levels)}-client level, {len(written)} updates (POST /documents, one new document each, serve --writable, on a "
            f"copy of the index): {sum(u['status'] == 200 for u in written)} answered 200, POST seconds "
            f"{', '.join(str(u['post_s']) for u in written)}; the new document found by a search {len(found)} of {len(written)} times, "
            f"at most {max(found, default=float('nan')):.2f} s after its POST began."
        )
    args.out.parent.mkdir(parents=True, exist_ok=True)
    title = "Serving: throughput by clients, unique queries (loopback)" + (", with updates during the largest level" if args.updates else "")
    write_table(args.out, title=title, command=command,
                description=description, columns=COLUMNS, rows=rows, details=results)
    for row in rows:
        print(" | ".join(str(c) for c in row))
    print(f"wrote {args.out}")
    failed_updates = [u for s in results["settings"] for lv in s["levels"] for u in lv.get("updates", []) if u["found_after_s"] is None]
    return 1 if failed_updates or any(lv["errors"] for s in results["settings"] for lv in s["levels"]) else 0


if __name__ == "__main__":
    sys.exit(main())
