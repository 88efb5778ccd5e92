"""Token targets stored sparsely: the top-n entries of each text's distribution plus the rest.

A target over a ~49K vocabulary is dense in principle, but the ones Text2Token uses put
(almost) all their mass on a few tokens. Each text keeps its ``n`` largest entries
(``ids``, ``probs``; ids padded with -1) and ``rest`` = 1 - sum(probs), read as spread
uniformly over the other ``V - n_valid`` tokens. That is exact for the data-driven targets
(both readings of Eq. 17) and, for the model-derived target, flattens a tail whose mass is
measured and recorded (``meta["rest_mass"]``).

Targets are computed once per (corpus, model, config) and cached as ``.npz`` + ``.json``
written to a temporary name then renamed, so an interrupted run never leaves a half file.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from embedder.util import write_json_atomic

log = logging.getLogger(__name__)

CACHE_FORMAT = 1


@dataclass
class SparseTargets:
    """Top-n target entries for ``len(ids)`` texts over a vocabulary of ``vocab_size``."""

    ids: np.ndarray  # (N, n) int32, -1 = padding
    probs: np.ndarray  # (N, n) float32, 0 where ids == -1
    rest: np.ndarray  # (N,) float32, mass spread uniformly over the tokens not listed
    vocab_size: int
    meta: dict = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.ids.shape != self.probs.shape or self.ids.ndim != 2 or self.rest.shape != (self.ids.shape[0],):
            raise ValueError(
                f"inconsistent target shapes: ids {self.ids.shape}, probs {self.probs.shape}, rest {self.rest.shape}"
            )

    def __len__(self) -> int:
        return int(self.ids.shape[0])

    def valid(self) -> np.ndarray:
        """Texts that have a target (a text with no selected token has none)."""
        return (self.ids[:, 0] >= 0) | (self.rest > 0)

    def batch(self, rows: Sequence[int], device: str = "cpu") -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(ids long, probs float32, rest float32) tensors for the given texts."""
        rows = np.asarray(rows)
        return (
            torch.from_numpy(self.ids[rows].astype(np.int64)).to(device),
            torch.from_numpy(self.probs[rows]).to(device),
            torch.from_numpy(self.rest[rows]).to(device),
        )

    def dense(self, row: int) -> np.ndarray:
        """The full distribution of one text (tests and diagnostics)."""
        out = np.zeros(self.vocab_size, dtype=np.float64)
        ids = self.ids[row]
        keep = ids >= 0
        n_valid = int(keep.sum())
        if self.rest[row] > 0:
            out[:] = float(self.rest[row]) / (self.vocab_size - n_valid)
        out[ids[keep]] = self.probs[row][keep]
        return out

    def entropy(self) -> np.ndarray:
        """Shannon entropy (nats) of each text's target, background included."""
        p = self.probs.astype(np.float64)
        ent = -(np.where(p > 0, p * np.log(np.where(p > 0, p, 1)), 0)).sum(1)
        n_valid = (self.ids >= 0).sum(1)
        bg_n = self.vocab_size - n_valid
        rest = self.rest.astype(np.float64)
        with np.errstate(divide="ignore", invalid="ignore"):
            ent += np.where(rest > 0, -rest * np.log(rest / bg_n), 0)
        return ent

    def summary(self) -> dict:
        """Shape of the targets over the texts that have one: entropy (nats), effective
        number of tokens exp(H), and the mass on the listed (top-n) tokens."""
        ok = self.valid()
        if not ok.any():
            return {"n_texts": 0}
        ent = self.entropy()[ok]
        listed = self.probs[ok].astype(np.float64).sum(1)
        n_listed = (self.ids[ok] >= 0).sum(1)
        return {
            "n_texts": int(ok.sum()),
            "entropy_mean": float(ent.mean()),
            "effective_tokens_mean": float(np.exp(ent).mean()),
            "effective_tokens_median": float(np.median(np.exp(ent))),
            "listed_tokens_mean": float(n_listed.mean()),
            "listed_mass_mean": float(listed.mean()),
            "top1_mass_mean": float(self.probs[ok, 0].mean()),
        }

    # ------------------------------------------------------------------ disk
    def save(self, path: Path) -> None:
        """Write ``path`` (.npz) and its ``.json`` metadata atomically."""
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".npz")
        os.close(fd)
        try:
            np.savez(tmp, ids=self.ids, probs=self.probs, rest=self.rest)
            os.chmod(tmp, 0o644)
            os.replace(tmp, path)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
        info = {"format": CACHE_FORMAT, "vocab_size": self.vocab_size, "meta": self.meta}
        write_json_atomic(path.with_suffix(".json"), info, sort_keys=True, ensure_ascii=True)

    @classmethod
    def load(cls, path: Path) -> SparseTargets:
        path = Path(path)
        info = json.loads(path.with_suffix(".json").read_text())
        if info.get("format") != CACHE_FORMAT:
            raise ValueError(f"{path}: target cache format {info.get('format')} != {CACHE_FORMAT}")
        with np.load(path) as z:
            return cls(z["ids"], z["probs"], z["rest"], int(info["vocab_size"]), info.get("meta", {}))


def from_dense_topn(probs: torch.Tensor, top_n: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Keep the ``top_n`` largest entries of each row of a dense distribution (N, V)."""
    n = min(top_n, probs.shape[1])
    vals, ids = torch.topk(probs, n, dim=1)
    rest = (1.0 - vals.double().sum(1)).clamp(min=0.0)
    return ids.numpy().astype(np.int32), vals.float().numpy(), rest.float().numpy()


def texts_fingerprint(texts: Sequence[str]) -> str:
    """Hash of the exact training texts, in order (part of every cache key)."""
    h = hashlib.sha256()
    for t in texts:
        b = t.encode("utf-8")
        h.update(len(b).to_bytes(8, "little"))
        h.update(b)
    return h.hexdigest()


def cache_key(**parts) -> str:
    """A short stable key from JSON-able parts (corpus hash, model identity, configs)."""
    return hashlib.sha256(json.dumps(parts, sort_keys=True, default=str).encode()).hexdigest()[:20]


def cached(cache_dir: Path | None, kind: str, key: str, compute: Callable[[], SparseTargets]) -> SparseTargets:
    """Load ``<cache_dir>/<kind>-<key>.npz`` if present, else compute and store it.

    ``cache_dir=None`` disables caching (in-memory models have no identity to key on).
    """
    if cache_dir is None:
        return compute()
    path = Path(cache_dir) / f"{kind}-{key}.npz"
    if path.exists() and path.with_suffix(".json").exists():
        log.info("loading cached %s targets from %s", kind, path)
        targets = SparseTargets.load(path)
        targets.meta["cache"] = str(path)
        return targets
    targets = compute()
    targets.save(path)
    log.info("cached %s targets in %s", kind, path)
    return targets
