"""Searches of concurrent requests run together: one query-encoder forward for the queries that
arrive while the previous ones are searched (dynamic micro-batching), within a bound on searches at once.

A request becomes a :class:`Job` (its queries, k, offset, mode and the Retriever view it
searches). Up to ``lanes`` (``--max-concurrency``) groups run at a time, each in a worker
thread. A lane takes the oldest waiting job and every other waiting job with the same view
and mode, up to ``max_queries`` queries, and runs them as one group: one ``Retriever.encode``
over all their queries (the model's forward, the costly part, batched), then each query's
channel search, fusion and explanations. So there is no added wait when the server is idle
(a lone request runs at once), and under load the requests that queued while a group ran share
the next forward. A job still waiting after ``queue_timeout_s`` is dropped and answered 503.
"""
from __future__ import annotations

import asyncio
import time
from collections import deque
from dataclasses import dataclass, field

from retriever.retriever import FUSION_DEPTH, Hit, Retriever

TOTAL_DEPTH = 1000  # documents counted for a single channel's total (beyond: "gte")
# queries per shared forward: on 2 CPU cores (MiniLM queries, cisi) 4 to 8 queries a forward cost 10-20% less each
# than one at a time, 32 cost more (padding to the longest); a batch request is never split
FORWARD_QUERIES = 8


class Busy(Exception):
    """A job that waited ``queue_timeout_s`` without starting."""


@dataclass
class Result:
    """One query's page of hits, the count behind it, and the seconds spent on it."""

    hits: list[Hit]
    total: int
    relation: str  # "eq", "gte" or "pool" (see app.py's SearchResponse)
    seconds: float


@dataclass
class Job:
    retriever: Retriever
    mode: str
    queries: list[str]
    k: int
    offset: int = 0
    explain: bool = True
    where: dict | None = None  # a metadata filter (retriever/filters.py)
    future: asyncio.Future | None = None
    started: bool = False
    queued_at: float = field(default_factory=time.perf_counter)

    @property
    def key(self) -> tuple[int, str]:
        return id(self.retriever), self.mode


def search_group(jobs: list[Job]) -> list[list[Result] | Exception]:
    """Run jobs of one view and mode: their queries encoded in one call, then each searched.
    Returns per job its results, or the error (ValueError / TypeError: the search contract's)
    that its search raised. A query's seconds: its share of the shared encoding plus its own search."""
    r, mode = jobs[0].retriever, jobs[0].mode
    texts = list(dict.fromkeys(q for job in jobs for q in job.queries if q.strip()))  # a blank query matches nothing
    t0 = time.perf_counter()
    try:
        encoded = dict(zip(texts, r.encode(texts, mode))) if texts else {}
    except (ValueError, TypeError) as exc:
        return [exc for _ in jobs]
    share = (time.perf_counter() - t0) / max(1, len(texts))
    out: list[list[Result] | Exception] = []
    for job in jobs:
        try:
            out.append([search_one(r, encoded.get(q), mode, job, share) for q in job.queries])
        except (ValueError, TypeError) as exc:
            out.append(exc)
    return out


def search_one(r: Retriever, encoded, mode: str, job: Job, share: float) -> Result:
    """One encoded query's page (``job.offset`` to ``+ job.k``) and total."""
    if encoded is None:  # blank
        return Result([], 0, "eq", 0.0)
    t0 = time.perf_counter()
    n = len(r.doc_ids)
    if mode == "hybrid":  # the union of each channel's top FUSION_DEPTH: what the hybrid ranks at all
        pool: set[int] = set()
        for channel in r.channels_of("hybrid"):
            docs, _ = r.search_channel(encoded, channel, min(n, FUSION_DEPTH), job.where)
            pool.update(docs[docs >= 0].tolist())
        total, relation = len(pool), "pool"
    else:  # the documents with a score in the channel, counted to TOTAL_DEPTH (or to the page's end)
        depth = min(n, max(TOTAL_DEPTH, job.offset + job.k))
        docs, _ = r.search_channel(encoded, mode, depth, job.where)
        total = int((docs >= 0).sum())
        relation = "gte" if total >= depth and depth < n else "eq"
    hits = r.search_encoded([encoded], k=min(n, job.offset + job.k), mode=mode, explain=job.explain, where=job.where, offset=job.offset)[0] \
        if job.offset < total else []  # only the page's hits are explained
    return Result(hits, total, relation, share + time.perf_counter() - t0)


class Batcher:
    """At most ``lanes`` groups at once; jobs waiting for a lane are grouped by view and mode."""

    def __init__(self, lanes: int, max_queries: int, queue_timeout_s: float) -> None:
        self.lanes, self.max_queries, self.queue_timeout_s = lanes, max_queries, queue_timeout_s
        self.waiting: deque[Job] = deque()
        self.running = 0  # lanes at work
        self.groups = 0  # groups run, and the jobs and queries in them (for /info)
        self.grouped_jobs = 0
        self.grouped_queries = 0

    async def submit(self, job: Job) -> list[Result]:
        """The job's results (ValueError / TypeError as its search raised them); Busy when it
        did not start within the queue timeout."""
        loop = asyncio.get_running_loop()
        job.future = loop.create_future()
        self.waiting.append(job)
        if self.running < self.lanes:
            self.running += 1
            loop.create_task(self._lane())
        try:
            done, _ = await asyncio.wait({job.future}, timeout=self.queue_timeout_s)
            if not done and not job.started:
                raise Busy()
            result = await job.future  # it runs: it finishes whatever the time
        finally:
            if not job.started:
                self._drop(job)
        if isinstance(result, Exception):
            raise result
        return result

    def _drop(self, job: Job) -> None:
        try:
            self.waiting.remove(job)
        except ValueError:
            pass

    def _take(self) -> list[Job]:
        """The oldest waiting job and the others with its view and mode, up to max_queries queries."""
        first = self.waiting.popleft()
        group, size = [first], len(first.queries)
        for job in list(self.waiting):
            if job.key == first.key and size + len(job.queries) <= self.max_queries:
                self.waiting.remove(job)
                group.append(job)
                size += len(job.queries)
        return group

    async def _lane(self) -> None:
        try:
            while self.waiting:
                group = self._take()
                for job in group:
                    job.started = True
                self.groups += 1
                self.grouped_jobs += len(group)
                self.grouped_queries += sum(len(j.queries) for j in group)
                try:
                    results = await asyncio.to_thread(search_group, group)
                except Exception as exc:  # noqa: BLE001 - a bug: each request of the group answers 500
                    results = [exc] * len(group)
                except BaseException as exc:  # cancelled (the server stops): the requests too
                    for job in group:
                        if not job.future.done():
                            job.future.set_exception(exc)
                    raise
                for job, result in zip(group, results):
                    if not job.future.done():
                        job.future.set_result(result)  # an error is raised by its request (submit)
        finally:
            self.running -= 1

    def describe(self) -> dict:
        return {"lanes": self.lanes, "max_queries_per_forward": self.max_queries, "groups": self.groups,
                "mean_requests_per_group": round(self.grouped_jobs / self.groups, 2) if self.groups else None,
                "mean_queries_per_group": round(self.grouped_queries / self.groups, 2) if self.groups else None}
