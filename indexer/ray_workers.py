"""Shard encoding on a Ray cluster (``build-index --ray ADDRESS``).

The build's driver (the ``build-index`` process) streams the corpus, hands each shard that is
not committed yet to a Ray actor, and commits what comes back into its own shards directory,
exactly as a local build does (indexer/shards.py). So everything after encoding (resuming,
the merge, the publish) is the local build's code, and the index is the same one.

- Each actor loads the model once (``EmbedderSpec.load``), with the runtime and precision its
  own node's CPU calls for. The shard's JSON records which one encoded it.
- At most two shards per actor are in flight: one encoding, the next one waiting. The driver
  holds only those in memory, however large the corpus.
- A worker process lost in the middle of a shard (killed, its node gone) is restarted by Ray,
  on whatever node has room, and the shard it held is run again there (``max_restarts`` and
  ``max_task_retries``). A shard is committed once: by the driver, when its first result
  arrives. Only when the retries run out does the build fail, with the shard named; the
  shards committed so far stay committed, so the same command resumes.

Ray is an optional extra (``pip install -e '.[ray]'``). Every node needs this package and the
model cache (see docs/backends-and-scale.md, "Building on a Ray cluster").
"""
from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from tqdm.auto import tqdm

from indexer.corpus import Document
from indexer.shard_encoder import EmbedderSpec, ShardPlan, encode_shard
from indexer.workers import WorkerFailed

RAY_MISSING = "build-index --ray needs Ray, on this machine and on every node of the cluster: pip install -e '.[ray]'"
# A worker lost mid-shard is restarted (and its shard retried) this many times before the build fails.
MAX_RETRIES = 3
IN_FLIGHT_PER_WORKER = 2


class RayUnavailable(RuntimeError):
    """Ray is not installed, or the cluster cannot be reached."""


@dataclass(frozen=True)
class RayOptions:
    """Where and how wide: ``address`` as ``ray.init`` takes it ("auto": the cluster this
    machine runs; "HOST:PORT" of a head on a node of the cluster; "ray://HOST:10001" for Ray
    Client), ``workers`` actors (None: as many as the cluster's CPUs allow), each reserving
    ``cpus_per_worker`` CPUs and running that many threads."""

    address: str = "auto"
    workers: int | None = None
    cpus_per_worker: int = 1
    timeout_s: float = 30.0  # how long to try reaching the cluster before giving up


DEFAULT_CONNECT_TIMEOUT_S = RayOptions.timeout_s


def import_ray() -> Any:
    """The ``ray`` module, or :class:`RayUnavailable` saying how to install it."""
    try:
        import ray
    except ImportError:
        raise RayUnavailable(RAY_MISSING) from None
    return ray


class ShardEncoderActor:
    """One Ray worker: the embedder loaded once, then any number of shards encoded."""

    def __init__(self, embedder_spec: EmbedderSpec, plan: ShardPlan, threads: int) -> None:
        import torch

        torch.set_num_threads(max(1, threads))
        t0 = time.perf_counter()
        self.embedder, self.encoders = embedder_spec.load()
        self.plan = plan
        self.load_seconds = time.perf_counter() - t0

    def where(self) -> dict[str, Any]:
        """Host, process and runtime of this worker (for the build's report)."""
        info = self.embedder.runtime_info()
        return {"host": socket.gethostname(), "pid": os.getpid(), "runtime": f"{info['name']} {info['dtype']}",
                "load_seconds": round(self.load_seconds, 3)}

    def encode(self, number: int, chunk: list[Document]) -> tuple[int, dict[str, np.ndarray], dict]:
        arrays, meta = encode_shard(chunk, self.embedder, self.encoders, self.plan)
        meta["worker"] = f"{socket.gethostname()}:{os.getpid()}"
        return number, arrays, meta


def bootstrap_address(address: str) -> tuple[str, int] | None:
    """The host and port that ``ray.init(address)`` dials, where they can be told (``auto`` is
    looked up as Ray does: ``RAY_ADDRESS``, then the last ``ray start`` on this machine)."""
    if address.startswith("ray://"):
        hostport = address[len("ray://"):]
    else:
        try:
            from ray._private.services import canonicalize_bootstrap_address_or_die
        except ImportError:  # another Ray: let ray.init say it
            return None
        try:
            hostport = canonicalize_bootstrap_address_or_die(address)
        except ConnectionError as exc:
            raise RayUnavailable(f"cannot reach the Ray cluster at {address!r}: {str(exc).splitlines()[0] if str(exc) else exc}") from None
        except Exception:  # noqa: BLE001 - a form only ray.init understands
            return None
    host, sep, port = hostport.rpartition(":")
    if not sep or not port.isdigit() or not host:
        return None
    return host.strip("[]"), int(port)


def wait_for_cluster(options: RayOptions) -> None:
    """Give up with :class:`RayUnavailable` when nothing answers at the cluster's address within
    ``options.timeout_s`` (Ray itself retries for minutes, printing its errors, where nothing
    listens)."""
    where = bootstrap_address(options.address)
    if where is None:
        return
    shown = f"{where[0]}:{where[1]}"
    dialled = "" if options.address.removeprefix("ray://") == shown else f" on {shown}"  # Ray may dial this host's outward address
    given = options.address.removeprefix("ray://").rpartition(":")
    targets = [where] + ([(given[0].strip("[]"), int(given[2]))] if given[2].isdigit() and given[0] and dialled else [])
    deadline = time.monotonic() + options.timeout_s
    while True:
        error: OSError | None = None
        for target in targets:  # what Ray dials, and the address as given (a head listening on loopback only)
            try:
                with socket.create_connection(target, timeout=max(0.1, min(2.0, deadline - time.monotonic()))):
                    return
            except OSError as exc:
                error = exc
        if time.monotonic() + 0.5 >= deadline:
            raise RayUnavailable(
                f"cannot reach the Ray cluster at {options.address!r}: nothing answered{dialled} within "
                f"{options.timeout_s:g} s ({getattr(error, 'strerror', None) or error}); is `ray start --head` running there? "
                "(--ray-timeout sets the wait)"
            ) from None
        time.sleep(0.5)


def connect(options: RayOptions) -> Any:
    """Connect this process to the cluster as a driver; the ``ray`` module. Nothing answering at
    the address within ``options.timeout_s`` is :class:`RayUnavailable`."""
    ray = import_ray()
    if not ray.is_initialized():
        wait_for_cluster(options)
        try:
            # the driver's own logs only: a worker's progress or warnings are not the build's
            ray.init(address=options.address, log_to_driver=False, logging_level="WARNING", configure_logging=True)
        except (ConnectionError, RuntimeError, ValueError) as exc:
            raise RayUnavailable(f"cannot reach the Ray cluster at {options.address!r}: {exc}") from None
    return ray


def cluster_workers(ray: Any, options: RayOptions) -> int:
    """How many actors: ``options.workers``, or the cluster's CPUs over ``cpus_per_worker``."""
    if options.workers is not None:
        return options.workers
    cpus = int(ray.cluster_resources().get("CPU", 1))
    return max(1, cpus // options.cpus_per_worker)


def encode_on_ray(
    shards: Iterator[tuple[int, list[Document]]],
    commit: Callable[[int, dict[str, np.ndarray], dict], None],
    embedder_spec: EmbedderSpec,
    plan: ShardPlan,
    options: RayOptions,
    total_docs: int | None = None,
    progress: bool = True,
) -> dict[str, Any]:
    """Encode ``shards`` ((number, documents) not committed yet) on Ray actors; ``commit`` each
    result in this process. Returns what ran where ({"workers", "address", "nodes", ...}).

    Raises :class:`RayUnavailable` (no Ray, no cluster) or :class:`WorkerFailed` (a shard whose
    worker was lost more than ``MAX_RETRIES`` times, or that raised).
    """
    ray = connect(options)
    n = cluster_workers(ray, options)
    if n < 1:
        raise ValueError(f"--workers must be >= 1, not {n}")
    actor_class = ray.remote(num_cpus=options.cpus_per_worker, max_restarts=MAX_RETRIES, max_task_retries=MAX_RETRIES)(ShardEncoderActor)
    spec_ref, plan_ref = ray.put(embedder_spec), ray.put(plan)
    actors = [actor_class.remote(spec_ref, plan_ref, options.cpus_per_worker) for _ in range(n)]
    pending: dict[Any, tuple[int, int, int]] = {}  # result ref -> (shard number, actor, documents)
    committed: set[int] = set()
    bar = tqdm(total=total_docs, unit="doc", desc=f"encoding on Ray ({n} workers)", disable=not progress)
    docs_done, t0 = 0, time.perf_counter()
    source = iter(shards)

    def submit(actor: int) -> bool:
        item = next(source, None)
        if item is None:
            return False
        number, chunk = item
        pending[actors[actor].encode.remote(number, chunk)] = (number, actor, len(chunk))
        return True

    try:
        for _ in range(IN_FLIGHT_PER_WORKER):
            for a in range(n):
                submit(a)
        while pending:
            (ref,), _ = ray.wait(list(pending), num_returns=1)
            number, actor, n_docs = pending.pop(ref)
            try:
                got_number, arrays, meta = ray.get(ref)
            except ray.exceptions.RayActorError as exc:
                raise WorkerFailed(
                    f"Ray worker {actor} was lost {MAX_RETRIES + 1} times while encoding shard {number}: {exc}. "
                    "The shards committed so far are kept: run the same command again to resume.",
                    actor, number, "worker lost",
                ) from None
            except ray.exceptions.RayTaskError as exc:
                cause = exc.as_instanceof_cause()
                raise WorkerFailed(
                    f"Ray worker {actor} failed while encoding shard {number}: {type(cause).__name__}: {cause}. "
                    "The shards committed so far are kept: run the same command again to resume.",
                    actor, number, str(cause),
                ) from None
            if got_number != number:  # a result is only ever the answer to its own task
                raise RuntimeError(f"Ray returned shard {got_number} for shard {number}")
            if number not in committed:
                commit(number, arrays, meta)
                committed.add(number)
            docs_done += n_docs
            bar.update(n_docs)
            bar.set_postfix(docs_per_s=f"{docs_done / max(time.perf_counter() - t0, 1e-9):.1f}")
            submit(actor)
        where = ray.get([a.where.remote() for a in actors])
    finally:
        bar.close()
        for a in actors:
            ray.kill(a, no_restart=True)
    return {
        "executor": "ray", "address": options.address, "workers": n, "cpus_per_worker": options.cpus_per_worker,
        "nodes": sorted({w["host"] for w in where}), "runtimes": sorted({w["runtime"] for w in where}),
        "load_seconds": [w["load_seconds"] for w in where],
    }


# Ray on Linux takes the machine's outward address even when told 127.0.0.1; this switch (meant
# for laptops) keeps a head, its workers and the drivers that set it on loopback only.
LOOPBACK_ENV = {"RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0", "RAY_USAGE_STATS_ENABLED": "0"}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _listening(port: int) -> bool:
    with socket.socket() as s:
        s.settimeout(0.5)
        return s.connect_ex(("127.0.0.1", port)) == 0


@contextmanager
def local_head(cpus: int, timeout_s: float = 120.0, env: dict[str, str] | None = None) -> Iterator[str]:
    """A Ray head on 127.0.0.1 with ``cpus`` CPUs, for tests and benchmarks; yields its address.

    Started with ``ray start --head --block`` in its own process group, and stopped with that
    group (SIGTERM, then SIGKILL) on exit, whatever happened inside. Drivers that connect to it
    need ``LOOPBACK_ENV`` in their environment.
    """
    import_ray()
    port = _free_port()
    temp = tempfile.mkdtemp(prefix="rt", dir="/tmp")  # Ray's unix sockets need a short path
    cmd = [str(Path(sys.executable).with_name("ray")), "start", "--head", "--block", f"--port={port}", f"--num-cpus={cpus}",
           "--include-dashboard=false", "--disable-usage-stats", "--object-store-memory=200000000", f"--temp-dir={temp}",
           f"--ray-client-server-port={_free_port()}"]  # fmt: skip
    log_path = Path(temp) / "head.log"
    with open(log_path, "w") as log:
        head = subprocess.Popen(cmd, env={**os.environ, **(env or {}), **LOOPBACK_ENV}, stdout=log, stderr=subprocess.STDOUT,
                                start_new_session=True)  # fmt: skip
        try:
            deadline = time.monotonic() + timeout_s
            while not _listening(port):
                if head.poll() is not None:
                    raise RayUnavailable(f"the Ray head exited: {log_path.read_text()[-3000:]}")
                if time.monotonic() > deadline:
                    raise RayUnavailable(f"no Ray head listening on 127.0.0.1:{port} after {timeout_s:.0f} s")
                time.sleep(0.5)
            yield f"127.0.0.1:{port}"
        finally:
            for sig in (signal.SIGTERM, signal.SIGKILL):
                try:
                    os.killpg(head.pid, sig)
                except ProcessLookupError:
                    break
                try:
                    head.wait(30)
                    break
                except subprocess.TimeoutExpired:
                    continue
            shutil.rmtree(temp, ignore_errors=True)


__all__ = ["DEFAULT_CONNECT_TIMEOUT_S", "LOOPBACK_ENV", "MAX_RETRIES", "RAY_MISSING", "RayOptions", "RayUnavailable", "ShardEncoderActor", "connect", "encode_on_ray", "import_ray", "local_head",
           "wait_for_cluster"]
