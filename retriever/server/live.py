"""A served index that follows its generations: a rebuild or an update is picked up without a restart.

An index path is a link to its current generation ``.NAME.gen-NNNNNN`` (indexer/generations.py);
a build or an update publishes a new generation by swapping the link in one step. The server
polls where the link points (``realpath``, one system call) every ``poll_s`` seconds. When it
points elsewhere, the new generation is loaded in a worker thread, with the options the server
was started with (the loader, given by ``serve``: same profile, query encoder, runtime), while
the old one keeps answering; then one assignment swaps it in. A request holds the
:class:`Served` it started on until it ends, so requests in flight finish on the old generation,
and the old Retriever is closed (its generation's lock released, so the next build can remove
it) when the last of them ends. A load that fails (a damaged generation) leaves the old one
serving; the log says so, and /info shows it under ``reload``. That generation is not tried
again; the next one published is.
"""
from __future__ import annotations

import asyncio
import logging
import os
import time
from collections import OrderedDict
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from indexer.channels import sentence_encoder_specs
from indexer.manifest import IndexFormatError, Manifest
from retriever.retriever import Retriever
from retriever.server.documents import Documents

log = logging.getLogger("uvicorn.error")

POLL_S = 1.0  # how often the index link is looked at

# (the Retriever serving now, or None) -> a freshly loaded Retriever of what the index path points at now
RetrieverLoader = Callable[[Retriever | None], Retriever]


@dataclass
class Served:
    """One loaded generation: its Retriever, the documents of its snippets, and who uses it."""

    retriever: Retriever
    documents: Documents | None
    note: str  # where snippets come from (or why there are none)
    loaded_at: float = field(default_factory=time.time)
    views: OrderedDict[str, Retriever] = field(default_factory=OrderedDict)  # per-request fusions (app.py)
    users: int = 0
    retired: bool = False

    @property
    def path(self) -> str:
        """The directory its files were read from: the generation (or an old-layout index)."""
        gen = getattr(self.retriever, "generation", None)
        return str(gen.path) if gen is not None else os.path.realpath(self.retriever.index_dir)

    @property
    def generation(self) -> str:
        return Path(self.path).name

    def release(self) -> None:
        self.users -= 1
        if self.retired and self.users == 0:
            self.close()

    def close(self) -> None:
        log.info("generation %s released (no request uses it)", self.generation)
        self.retriever.close()

    def describe(self) -> dict:
        return {"generation": self.generation, "documents": self.retriever.manifest.n_docs,
                "loaded_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(self.loaded_at))}


class LiveIndex:
    """The generation being served, swapped for a newer one when the index path moves on.

    ``loader``: loads the Retriever of what the index path points at now (None: the index is
    never reloaded, what the tests and a fixed Retriever get). ``documents``: reads the
    snippets' documents for a Retriever (``Documents.for_index``, called again on each reload).
    Everything but the load itself runs on the event loop's thread (no locks needed).
    """

    def __init__(self, served: Served, loader: RetrieverLoader | None = None,
                 documents: Callable[[Retriever], tuple[Documents | None, str]] | None = None, poll_s: float = POLL_S) -> None:
        self.current = served
        self.loader, self.documents, self.poll_s = loader, documents, poll_s
        self.index_dir = Path(served.retriever.index_dir)
        self.failed: dict | None = None  # the last load that failed (kept until a later one succeeds)
        self.reloads = 0
        self._refused: str | None = None  # the generation whose load failed: not tried again
        self._checking = asyncio.Lock()

    @contextmanager
    def use(self) -> Iterator[Served]:
        """The generation a request runs on, held until the request ends."""
        served = self.current
        served.users += 1
        try:
            yield served
        finally:
            served.release()

    def pointed_at(self) -> str | None:
        """Where the index path leads now (None: it cannot be resolved, e.g. it is missing)."""
        try:
            return os.path.realpath(self.index_dir, strict=True)
        except OSError:
            return None

    async def watch(self) -> None:
        """Poll for a new generation for ever (a background task of the application)."""
        while True:
            await asyncio.sleep(self.poll_s)
            try:
                await self.check()
            except Exception:  # a bug here must not stop the watching, nor the server
                log.exception("checking %s for a new generation failed", self.index_dir)

    async def check(self) -> bool:
        """Load and swap in the generation the index path points at, when it is not the one
        served; returns whether it swapped."""
        if self.loader is None:
            return False
        async with self._checking:  # the watcher and a write's own check never load one generation twice
            return await self._check()

    async def _check(self) -> bool:
        target = self.pointed_at()
        if target is None or target == self.current.path or target == self._refused:
            return False
        name = Path(target).name
        log.warning("%s now points at %s: loading it (still serving %s)", self.index_dir, name, self.current.generation)
        t0 = time.perf_counter()
        try:
            served = await asyncio.to_thread(self._load)
        except Exception as exc:  # noqa: BLE001 - any failure keeps the old generation serving
            self._refused = target
            self.failed = {"generation": name, "error": f"{type(exc).__name__}: {exc}",
                           "at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
            log.error("loading %s failed; still serving %s: %s", name, self.current.generation, self.failed["error"])
            return False
        old, self.current = self.current, served
        self.reloads += 1
        self.failed = None
        old.retired = True
        if old.users == 0:
            old.close()
        log.warning("serving %s (%d documents, loaded in %.1f s); %s is released when its last request ends",
                    served.generation, served.retriever.manifest.n_docs, time.perf_counter() - t0, old.generation)
        return True

    def _load(self) -> Served:
        retriever = self.loader(self.current.retriever)
        try:
            documents, note = self.documents(retriever) if self.documents is not None else (None, "no snippets")
        except BaseException:
            retriever.close()
            raise
        return Served(retriever, documents, note)

    def describe(self) -> dict:
        """/info's ``reload``: whether it follows its index, and how it went."""
        return {"follows_index": self.loader is not None, "poll_s": self.poll_s if self.loader is not None else None,
                "reloads": self.reloads, "failed": self.failed}


# what a generation must share with the served one to reuse its models: the LLM's, and each sentence-encoder channel's record
MODEL_FIELDS = ("model", "adapter", "embedding")


def same_models(previous: Retriever, index_dir: Path) -> bool:
    """Does the generation ``index_dir`` points at now name the models ``previous`` runs?"""
    try:
        manifest = Manifest.read(Path(index_dir))
    except (OSError, ValueError, IndexFormatError):
        return False  # the load says what is wrong
    return (all(getattr(manifest, name) == getattr(previous.manifest, name) for name in MODEL_FIELDS)
            and all(s.record(manifest) == s.record(previous.manifest) for s in sentence_encoder_specs()))


def reload_with_models(previous: Retriever | None, load: Callable[..., Retriever]) -> Retriever:
    """``load(**models)`` reusing ``previous``'s models (the LLM or its tokenizer, the sentence
    encoders) where the new generation names the same ones: it is then loaded in the time of
    opening its files, not of loading models. Otherwise, or where that load fails, everything is
    loaded afresh: ``load()``."""
    if previous is not None and same_models(previous, previous.index_dir):
        try:
            return load(embedder=previous.embedder, encoders=previous.sentence_encoders)
        except Exception as exc:  # noqa: BLE001 - e.g. another model or adapter: loaded afresh below
            log.warning("the new generation does not take the served models (%s); loading its own", exc)
    return load()
