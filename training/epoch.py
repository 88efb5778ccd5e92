"""One epoch over every pair, trained in resumable chunks (issue 30).

:func:`epoch_plan` cuts each source into batches and interleaves them: every pair of every
source exactly once, one source per batch, each source spread evenly over the epoch (so any
stretch of it mixes the sources at their natural rates, as :func:`training.pairs.pair_batches`
draws them). The plan is a pure function of (the pairs, batch size, seed); its fingerprint
is recorded so that a later session refuses to continue an epoch over other data.

:class:`EpochState` is the sampler's recorded position: how many batches of the plan are
committed, the adapter the next chunk starts from, and the chunk in progress. It is a small
JSON written atomically (temp, then rename). A chunk trains plan[position:end] as an
ordinary run in its own folder (checkpoints, resume: training/loop.py); the position moves
to ``end`` only once the chunk's adapter is written, so an interrupted chunk resumes from
its last checkpoint and neither loses nor repeats a pair.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np

from embedder.util import write_json_atomic
from training.pairs import PairSet, PairSource

MIN_BATCH = 32  # in-batch negatives are the contrastive signal: fewer makes the task too easy
STATE_VERSION = 1

Plan = list[tuple[int, np.ndarray]]  # (source index, pair indices of that source) per batch


class EpochStateError(ValueError):
    """An epoch state file that cannot be used; the message names the file and field."""


def epoch_plan(sources: Sequence[PairSource], batch_size: int, seed: int) -> Plan:
    """Every pair once, in batches of one source each, sources spread evenly; a pure function.

    A source of n pairs gives floor(n / batch_size) batches of its shuffled pairs, the
    remainder spread over them (sizes batch_size .. batch_size + a few), so that no pair is
    dropped and no batch is smaller than ``batch_size``. Batch j of a source with k batches is
    placed at (j + u) / k, u uniform in [0, 1): stratified, so every part of the epoch holds
    each source in proportion to its size.
    """
    if batch_size < MIN_BATCH:
        raise ValueError(f"an epoch needs batches of at least {MIN_BATCH} pairs, got {batch_size}")
    if not sources:
        raise ValueError("an epoch needs at least one pairs source")
    rng = np.random.default_rng([seed, 0xE90C])
    batches: list[tuple[int, np.ndarray]] = []
    keys: list[float] = []
    for s, source in enumerate(sources):
        n = len(source)
        k = n // batch_size
        if k == 0:
            raise ValueError(f"pairs source {source.name} has {n} pairs, fewer than one batch ({batch_size})")
        perm = rng.permutation(n)
        for j, part in enumerate(np.array_split(perm, k)):
            batches.append((s, np.sort(part)))
            keys.append((j + rng.random()) / k)
    order = np.argsort(np.asarray(keys), kind="stable")
    return [batches[i] for i in order]


def plan_fingerprint(pairs: PairSet, batch_size: int, seed: int) -> str:
    """What decides the plan: the pairs (texts and rows), the batch size and the seed."""
    what = {"pairs": pairs.fingerprint(), "batch_size": batch_size, "seed": seed, "version": STATE_VERSION}
    return hashlib.sha256(json.dumps(what, sort_keys=True).encode()).hexdigest()[:16]


def plan_slice_hash(plan: Plan) -> str:
    """Identifies a stretch of the plan (a chunk's checkpoints must belong to it)."""
    h = hashlib.sha256()
    for s, rows in plan:
        h.update(np.int64(s).tobytes())
        h.update(np.ascontiguousarray(rows, dtype=np.int64).tobytes())
    return h.hexdigest()[:16]


@dataclass
class EpochState:
    """Where an epoch stands; see the module docstring. ``adapter``: what the next chunk starts
    from (None = the recipe's init adapter); a relative path is relative to the state file."""

    plan: str
    batches: int
    pairs: int
    position: int = 0
    adapter: str | None = None
    pending: dict | None = None  # {"chunk", "start", "end", "dir"} of the chunk in progress
    chunks: list[dict] = field(default_factory=list)
    version: int = STATE_VERSION

    @property
    def done(self) -> bool:
        return self.position >= self.batches

    @classmethod
    def load(cls, path: Path) -> EpochState:
        """Read and check a state file (every field typed, the position inside the plan)."""
        path = Path(path)
        try:
            d = json.loads(path.read_text(encoding="utf-8"))
        except json.JSONDecodeError as exc:
            raise EpochStateError(f"{path}: not JSON ({exc})") from None
        if not isinstance(d, dict):
            raise EpochStateError(f"{path}: expected an object")
        types = {"plan": str, "batches": int, "pairs": int, "position": int, "chunks": list, "version": int}
        for name, t in types.items():
            if not isinstance(d.get(name), t) or isinstance(d.get(name), bool):
                raise EpochStateError(f"{path}: field {name!r} must be {t.__name__}, got {d.get(name)!r}")
        if d["version"] != STATE_VERSION:
            raise EpochStateError(f"{path}: field 'version' is {d['version']}, this code reads {STATE_VERSION}")
        if not 0 <= d["position"] <= d["batches"]:
            raise EpochStateError(f"{path}: field 'position' {d['position']} outside 0..{d['batches']}")
        if d.get("adapter") is not None and not isinstance(d["adapter"], str):
            raise EpochStateError(f"{path}: field 'adapter' must be a path or null")
        pending = d.get("pending")
        if pending is not None and not (
            isinstance(pending, dict) and all(isinstance(pending.get(k), int) for k in ("chunk", "start", "end"))
            and pending["start"] == d["position"] and pending["start"] < pending["end"] <= d["batches"]
        ):
            raise EpochStateError(f"{path}: field 'pending' must hold chunk, start (= position) and end (<= batches): {pending!r}")
        unknown = set(d) - {f for f in cls.__dataclass_fields__}
        if unknown:
            raise EpochStateError(f"{path}: unknown fields {sorted(unknown)}")
        return cls(**d)

    def save(self, path: Path) -> None:
        """Write atomically (a reader sees the old state or the new one, never a part)."""
        write_json_atomic(path, asdict(self), indent=1, sort_keys=True, newline=True)

    def adapter_path(self, state_path: Path) -> str | None:
        """``adapter`` as a usable path or name (relative paths are the state file's folder's)."""
        if self.adapter is None:
            return None
        p = Path(self.adapter)
        return str(p if p.is_absolute() else Path(state_path).parent / p)


def open_epoch(state_path: Path, pairs: PairSet, plan: Plan, batch_size: int, seed: int) -> EpochState:
    """The state of the epoch at ``state_path``, or a new one at position 0; refuses another plan."""
    fp = plan_fingerprint(pairs, batch_size, seed)
    state_path = Path(state_path)
    if not state_path.exists():
        return EpochState(plan=fp, batches=len(plan), pairs=int(sum(len(r) for _, r in plan)))
    state = EpochState.load(state_path)
    if state.plan != fp or state.batches != len(plan):
        raise EpochStateError(
            f"{state_path}: field 'plan': the epoch was planned over other pairs, batch size or seed "
            f"({state.plan}, {state.batches} batches; now {fp}, {len(plan)}); use another state file to start a new epoch"
        )
    return state


def begin_chunk(state: EpochState, state_path: Path, steps: int, run_dir: Path) -> tuple[int, int, Path]:
    """(start, end, chunk folder) of the chunk to train now, recorded as pending before any step.

    A pending chunk (an interrupted one) is resumed as it was planned, whatever ``steps`` is now,
    so its checkpoints stay valid.
    """
    if state.done:
        raise ValueError("the epoch is complete")
    if state.pending is None:
        if steps < 1:
            raise ValueError("a chunk needs at least one step")
        k = len(state.chunks) + 1
        folder = Path(run_dir) / f"chunk-{k:04d}"
        state.pending = {
            "chunk": k, "start": state.position, "end": min(state.position + steps, state.batches),
            "dir": os.path.relpath(folder, Path(state_path).parent),
        }
        state.save(state_path)
    p = state.pending
    return p["start"], p["end"], Path(state_path).parent / p["dir"]


def commit_chunk(state: EpochState, state_path: Path, adapter_dir: Path, plan: Plan, record: dict) -> None:
    """Move the position past the pending chunk and make its adapter the next chunk's start."""
    p = state.pending
    if p is None:
        raise ValueError("no chunk in progress")
    pairs = int(sum(len(rows) for _, rows in plan[p["start"] : p["end"]]))
    state.chunks.append({"chunk": p["chunk"], "start": p["start"], "end": p["end"], "pairs": pairs,
                         "adapter": os.path.relpath(adapter_dir, Path(state_path).parent), **record})
    state.position = p["end"]
    state.adapter = os.path.relpath(adapter_dir, Path(state_path).parent)
    state.pending = None
    state.save(state_path)
