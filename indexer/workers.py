"""Local worker processes of a build (``build-index --workers N``) that can never hang it.

``multiprocessing.Pool.map`` waits forever for a worker that died by a signal (a native crash
in a runtime's compile, the OOM killer): the pool replaces the process but the task it held is
never answered. Here each worker is one process with a pipe to the parent. It says which shard
it starts, and ends by sending its result or its error. The parent waits on the pipes and on the
processes themselves, so a worker that exits without a result (a signal, ``os._exit``, an
exception) is noticed at once. The others are then stopped, and :class:`WorkerFailed` names the
worker, the shard it was encoding and the cause. Shards that were committed stay committed,
so the same command resumes (indexer/shards.py).
"""
from __future__ import annotations

import multiprocessing
import signal
import traceback
from collections.abc import Callable
from multiprocessing.connection import Connection, wait
from typing import Any

# How long stopped workers get to exit after SIGTERM before they are killed.
_TERMINATE_GRACE_S = 10.0


class WorkerFailed(RuntimeError):
    """A build worker died or failed; ``shard`` is the shard it was encoding (None: before its first)."""

    def __init__(self, message: str, worker: int, shard: int | None, cause: str) -> None:
        super().__init__(message)
        self.worker, self.shard, self.cause = worker, shard, cause


class Reporter:
    """A worker's side of its pipe: say which shard starts, then the result or the error."""

    def __init__(self, conn: Connection) -> None:
        self._conn = conn

    def starting(self, shard: int) -> None:
        self._conn.send(("shard", shard))


def _run(conn: Connection, target: Callable[[Any, Reporter], Any], job: Any) -> None:
    reporter = Reporter(conn)
    try:
        result = target(job, reporter)
    except BaseException as exc:  # noqa: BLE001 - every failure goes back to the parent, then the process ends
        message = f"{type(exc).__name__}: {exc}"
        try:
            try:
                conn.send(("error", (exc, message, traceback.format_exc())))
            except Exception:  # noqa: BLE001 - an exception that cannot cross the pipe: its message does
                conn.send(("error", (None, message, traceback.format_exc())))
        finally:
            conn.close()
        raise SystemExit(1) from None
    conn.send(("done", result))
    conn.close()


def _describe_exit(code: int | None) -> str:
    if code is None:
        return "still running"
    if code < 0:
        try:
            return f"killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    return f"exited with code {code} without a result"


def run_workers(
    target: Callable[[Any, Reporter], Any],
    jobs: list[Any],
    reraise: tuple[type[BaseException], ...] = (),
) -> list[Any]:
    """Run ``target(job, reporter)`` for each job in its own spawned process; their results, in order.

    A worker's exception of a type in ``reraise`` is raised again here as it was (bad input
    is reported the same with one worker or many); any other failure, or a worker that dies
    without a result, stops every worker and raises :class:`WorkerFailed`.
    """
    # spawn, not fork: a forked copy of a process whose torch/OpenMP threads already run can hang
    ctx = multiprocessing.get_context("spawn")
    procs, conns = [], []
    for job in jobs:
        parent_end, child_end = ctx.Pipe(duplex=False)
        p = ctx.Process(target=_run, args=(child_end, target, job), daemon=True)
        p.start()
        child_end.close()  # the parent keeps only its reading end: EOF when the child is gone
        procs.append(p)
        conns.append(parent_end)
    results: dict[int, Any] = {}
    shard: dict[int, int | None] = {w: None for w in range(len(jobs))}
    live = set(range(len(jobs)))
    try:
        while live:
            ready = wait([conns[w] for w in live] + [procs[w].sentinel for w in live])
            for w in sorted(live):
                if conns[w] not in ready and procs[w].sentinel not in ready:
                    continue
                error = _drain(conns[w], w, shard, results)
                if error is not None:
                    exc, message, _trace = error
                    procs[w].join()
                    if exc is not None and isinstance(exc, reraise):
                        raise exc
                    raise _failed(w, shard[w], message)
                if w in results:
                    procs[w].join()
                    live.discard(w)
                elif not procs[w].is_alive():
                    procs[w].join()
                    _drain(conns[w], w, shard, results)  # a result sent just before the exit
                    if w in results:
                        live.discard(w)
                    else:
                        raise _failed(w, shard[w], _describe_exit(procs[w].exitcode))
    finally:
        _stop(procs)
        for c in conns:
            c.close()
    return [results[w] for w in range(len(jobs))]


def _drain(conn: Connection, w: int, shard: dict[int, int | None], results: dict[int, Any]) -> tuple | None:
    """Read what worker ``w`` sent so far; its error, if it sent one."""
    while True:
        try:
            if not conn.poll():
                return None
            kind, payload = conn.recv()
        except (EOFError, OSError):  # the worker is gone; its exit code says how
            return None
        if kind == "shard":
            shard[w] = payload
        elif kind == "done":
            results[w] = payload
        elif kind == "error":
            return payload


def _failed(worker: int, shard: int | None, cause: str) -> WorkerFailed:
    where = f"shard {shard}" if shard is not None else "before its first shard (loading the model)"
    return WorkerFailed(
        f"build worker {worker} failed while encoding {where}: {cause}. "
        "The shards committed so far are kept: run the same command again to resume.",
        worker, shard, cause,
    )


def _stop(procs: list) -> None:
    for p in procs:
        if p.is_alive():
            p.terminate()
    for p in procs:
        p.join(_TERMINATE_GRACE_S)
        if p.is_alive():
            p.kill()
            p.join()


__all__ = ["Reporter", "WorkerFailed", "run_workers"]
