"""An on-disk cache of pooled document embeddings, for re-indexing the same corpus.

Encoding is the whole cost of an index build (about 1,000 tokens/s for the 135M backbone
on two CPU cores), while everything downstream of the pooled embedding h (top-K aligned
tokens, dense, EmbedFilter, fusion) is cheap. Benchmarks that rebuild indexes of the same
collections with other channels or settings wrap the embedder in :class:`CachedEmbedder`.

The cache is keyed by the model's weights hash, the adapter's hash and the embedding
settings (batch size excepted: it changes padding only) with the template the texts were
read with (documents: ``prompt``; queries of an asymmetric embedder: ``query_prompt``), and
within that by each text's hash, so a changed text, model or prompt is a miss, never a stale hit.
Cached runs do not measure encoding speed; :attr:`CachedEmbedder.hits` says when one was served.
"""
from __future__ import annotations

import hashlib
import json
import os
import tempfile
from collections.abc import Iterable, Sequence
from pathlib import Path

import numpy as np
import torch

from embedder.encoder import Embedder


def embedder_key(embedder: Embedder, role: str = "document") -> str:
    """A short hash of everything that decides the embedding of a text read as ``role`` (batch size excepted).

    The config enters with the template that role reads as ``prompt`` and no ``query_prompt``:
    a document's embedding does not depend on the query template, and a symmetric embedder
    keeps the key it had before query templates existed.
    """
    config = {k: v for k, v in embedder.config.to_dict().items() if k not in ("batch_size", "query_prompt")}
    config["prompt"] = embedder.config.template(role)
    embedder.resolve_runtime()  # dtype "auto": the runtime the speed probe measured (documents and queries may differ)
    runtime, dtype = embedder.runtime_name or "torch-plain", embedder.dtype
    if role == "query" and embedder.query_runtime:
        runtime, dtype = embedder.query_runtime
    what = {
        "model": (embedder.identity or {}).get("sha256") or (embedder.identity or {}).get("name"),
        "adapter": (embedder.adapter or {}).get("sha256"),
        "config": config,
        # the precision the network ran in: fp32 and int8 embeddings differ (BENCHMARKS.md, faithfulness)
        "runtime": runtime,
        "dtype": dtype,
    }
    if dtype == "int8":  # which weights int8 keeps in fp32 changes the embedding
        from embedder.runtime import int8_recipe_id

        what["int8"] = int8_recipe_id()
    return hashlib.sha256(json.dumps(what, sort_keys=True).encode()).hexdigest()[:16]


KEY_BYTES = 16


def text_key(text: str) -> bytes:
    return hashlib.sha256(text.encode("utf-8")).digest()[:KEY_BYTES]


def _stored_key(key: np.bytes_) -> bytes:
    """A text key as written: NumPy's fixed-width bytes ("S16") drop trailing NUL bytes on read,
    so about one key in 256 comes back short and would never be found again."""
    return bytes(key).ljust(KEY_BYTES, b"\0")


class CachedEmbedder:
    """Wraps an :class:`Embedder`: ``iter_batches`` (what index builds call) reads the pooled
    embedding of every text the same model and settings encoded before from ``directory``,
    encodes the others and adds them to it. Query encoding (``embed``) and everything else
    goes to the wrapped embedder unchanged, so query latency is always measured.

    ``directory`` holds the documents' embeddings; texts read as queries (``role="query"``,
    offline studies through :meth:`embed_texts`) go to the folder of their own template's key,
    which is the same folder for a symmetric embedder.

    Each miss writes one ``.npz`` file (text hashes, embeddings, token counts); all of them
    are read once, on first use.
    """

    def __init__(self, embedder: Embedder, directory: str | os.PathLike[str]) -> None:
        self.embedder = embedder
        self.root = Path(directory)
        self.directory = self.root / embedder_key(embedder)
        self.hits = 0  # texts served from the cache
        self.misses = 0  # texts encoded
        self._stores: dict[Path, dict[bytes, tuple[np.ndarray, int]]] = {}
        self._read: dict[Path, set[str]] = {}  # the files of each folder already in its store

    def __getattr__(self, name: str):
        return getattr(self.embedder, name)

    def _load(self, directory: Path) -> dict[bytes, tuple[np.ndarray, int]]:
        """The folder's store, with every file written since the last call read in: another
        CachedEmbedder (a second system of the same beir-eval run, another process) may have
        encoded these texts meanwhile, and reading only at first use encoded them again."""
        store, read = self._stores.setdefault(directory, {}), self._read.setdefault(directory, set())
        for path in sorted(directory.glob("*.npz")):
            if path.name in read:
                continue
            with np.load(path) as z:
                for key, h, n in zip(z["keys"], z["h"], z["n_tokens"]):
                    store[_stored_key(key)] = (h, int(n))
            read.add(path.name)
        return store

    def iter_batches(self, texts: Sequence[str], role: str = "document") -> Iterable[tuple[np.ndarray, torch.Tensor, int]]:
        """As :meth:`Embedder.iter_batches`: cached texts first, then the others as encoded."""
        directory = self.root / embedder_key(self.embedder, role)
        store = self._load(directory)
        keys = [text_key(t) for t in texts]
        cached = np.array([i for i, k in enumerate(keys) if k in store], np.int64)
        missing = np.array([i for i, k in enumerate(keys) if k not in store], np.int64)
        self.hits += len(cached)
        self.misses += len(missing)
        bs = self.embedder.config.batch_size
        for start in range(0, len(cached), bs):
            pos = cached[start : start + bs]
            rows = [store[keys[i]] for i in pos]
            yield pos, torch.from_numpy(np.stack([r[0] for r in rows])), sum(r[1] for r in rows)
        if not len(missing):
            return
        todo = [texts[i] for i in missing]
        h = np.zeros((len(todo), self.embedder.dim), np.float32)
        n_tokens = np.array([len(x) for x in self.embedder.prompt_ids(todo, role)], np.int64)
        for pos, emb, ntok in self.embedder.iter_batches(todo, role):
            h[pos] = emb.float().cpu().numpy()
            yield missing[pos], emb, ntok
        new_keys = [keys[i] for i in missing]
        written = self._write(directory, np.array(new_keys, dtype=f"S{KEY_BYTES}"), h, n_tokens)
        self._read[directory].add(written.name)
        for key, row, n in zip(new_keys, h, n_tokens):
            store[key] = (row, int(n))

    def embed_texts(self, texts: Sequence[str], role: str = "document") -> np.ndarray:
        """Pooled embeddings (n, d) of texts read as ``role``, through the cache (for offline studies)."""
        out = np.zeros((len(texts), self.embedder.dim), np.float32)
        with torch.inference_mode():
            for pos, h, _ in self.iter_batches(texts, role):
                out[pos] = h.float().cpu().numpy()
        return out

    def _write(self, directory: Path, keys: np.ndarray, h: np.ndarray, n_tokens: np.ndarray) -> Path:
        """One .npz of new embeddings, written atomically; returns its path."""
        directory.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=directory, prefix=".tmp-", suffix=".npz")
        try:
            with os.fdopen(fd, "wb") as f:
                np.savez(f, keys=keys, h=h, n_tokens=n_tokens)
            os.chmod(tmp, 0o644)  # mkstemp makes it private; a cache may be shared
            path = directory / f"{hashlib.sha256(keys.tobytes()).hexdigest()[:24]}.npz"
            os.replace(tmp, path)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
        return path


class ArrayCache:
    """Per-text arrays (any fixed shape) on disk under ``directory``, keyed by :func:`text_key`.

    For features other than the pooled vector (e.g. several token states per text, or a
    sentence-transformers embedding). The caller puts everything that decides the array into
    ``directory`` (see :func:`embedder_key`); each :meth:`put` writes one ``.npz`` atomically,
    so an interrupted run keeps what it wrote.
    """

    def __init__(self, directory: str | os.PathLike[str]) -> None:
        self.directory = Path(directory)
        self._store: dict[bytes, np.ndarray] | None = None

    def _load(self) -> dict[bytes, np.ndarray]:
        if self._store is None:
            self._store = {}
            for path in sorted(self.directory.glob("*.npz")):
                with np.load(path) as z:
                    for key, row in zip(z["keys"], z["values"]):
                        self._store[_stored_key(key)] = row
        return self._store

    def get(self, texts: Sequence[str]) -> tuple[dict[int, np.ndarray], list[int]]:
        """({position: array} of the cached texts, positions of the missing ones)."""
        store = self._load()
        found, missing = {}, []
        for i, t in enumerate(texts):
            row = store.get(text_key(t))
            if row is None:
                missing.append(i)
            else:
                found[i] = row
        return found, missing

    def put(self, texts: Sequence[str], values: np.ndarray) -> None:
        """Store one array per text (``values[i]`` for ``texts[i]``)."""
        if len(texts) != len(values):
            raise ValueError(f"{len(texts)} texts but {len(values)} arrays")
        if not len(texts):
            return
        keys = np.array([text_key(t) for t in texts], dtype=f"S{KEY_BYTES}")
        self.directory.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=self.directory, prefix=".tmp-", suffix=".npz")
        try:
            with os.fdopen(fd, "wb") as f:
                np.savez(f, keys=keys, values=np.asarray(values))
            os.chmod(tmp, 0o644)
            os.replace(tmp, self.directory / f"{hashlib.sha256(keys.tobytes()).hexdigest()[:24]}.npz")
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
        store = self._load()
        for k, v in zip(keys, values):
            store[bytes(k)] = v


def cached_arrays(
    cache: ArrayCache | None,
    texts: Sequence[str],
    encode,
    shape: tuple[int, ...],
    chunk: int = 256,
    desc: str = "encoding",
    progress: bool = True,
) -> np.ndarray:
    """``encode(texts) -> (n, *shape)`` through ``cache``: only missing texts are encoded, in
    chunks of ``chunk`` (each stored as it completes), with a tqdm bar in texts/s."""
    from tqdm.auto import tqdm

    out = np.zeros((len(texts), *shape), np.float32)
    if cache is None:
        found, missing = {}, list(range(len(texts)))
    else:
        found, missing = cache.get(texts)
    for i, row in found.items():
        out[i] = row
    if missing:
        # each distinct text once: data sets repeat sentences
        uniq = list(dict.fromkeys(texts[i] for i in missing))
        where: dict[str, list[int]] = {}
        for i in missing:
            where.setdefault(texts[i], []).append(i)
        bar = tqdm(total=len(uniq), desc=desc, unit="text", disable=not progress)
        for start in range(0, len(uniq), chunk):
            part = uniq[start : start + chunk]
            vals = np.asarray(encode(part), np.float32)
            if cache is not None:
                cache.put(part, vals)
            for t, v in zip(part, vals):
                for i in where[t]:
                    out[i] = v
            bar.update(len(part))
        bar.close()
    return out
