"""Build an index directory: stream a corpus, embed it, keep top-K aligned tokens, invert.

Two phases. Encoding: the corpus is encoded in shards, each committed atomically
(indexer/shards.py), by this process or by ``workers`` processes; a build that dies is
resumed from the committed shards by the same command. Merging: the index is written from
the shards into a hidden temporary directory beside the target (indexer/staging.py) and
renamed into place only when complete, so an interrupted build never leaves a directory
that loads as an index; the shards are removed once it is in place.
"""
from __future__ import annotations

import errno
import functools
import json
import logging
import os
import shutil
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
from tqdm.auto import tqdm

from embedder.encoder import Embedder
from indexer.calibration_channels import record_calibration
from indexer.channels import (
    CHANNEL_SPECS,
    LLM_EMBEDDINGS,
    SENTENCE_ENCODER,
    SPARSE,
    TEXT,
    ChannelSpec,
    ChannelWriter,
    WriteContext,
)
from indexer.channels import spec as channel_spec
from indexer.compact import DEFAULT_IMPACT_BITS, compact_channel_files, compact_dense_kind, compact_format
from indexer.corpus import CorpusSpec, Document
from indexer.dense import ENCODER_NAME
from indexer.diskspace import NoSpaceError, write_bytes
from indexer.generations import build_lock, publish_staged, rename_exchange, stage
from indexer.generations import sweep as sweep_generations
from indexer.integrity import record_files
from indexer.manifest import DOC_IDS, FORMAT_VERSION, MANIFEST, SEGMENTS_FORMAT_VERSION, Manifest
from indexer.ray_workers import RayOptions
from indexer.shard_encoder import EmbedderSpec, ShardPlan, chunks, encode_shard
from indexer.shards import ShardStore, commit_shard, corpus_identity, read_shard
from indexer.staging import staging_dir
from indexer.stored_documents import write_documents
from indexer.workers import Reporter, WorkerFailed, run_workers

if TYPE_CHECKING:
    from embedder.sentence_encoder import SentenceEncoder

log = logging.getLogger(__name__)

# Chosen by the K sweep in BENCHMARKS.md (a settled study: git show ed91196:benchmarks/studies/sweep_sparse.py, raw backbone, M=64, query
# weights 1): nDCG@10 peaks at K=512 on cisi (0.163; 0.155 at 128, 0.149 at 1024) and on medline
# (0.372; 0.358 at 256, 0.372 at 1024). The paper's 1000-3000 was for 4096-d models.
DEFAULT_TOP_K = 512
# Documents per shard: the unit of commit (what a killed build loses at most) and of memory
# (one shard's K tokens and weights, and its embeddings, are held while encoding). Also the
# encoding chunk of earlier versions, so indexes come out as they did.
DEFAULT_SHARD_SIZE = 1024


def _count_lines(path: Path) -> int | None:
    """Lines of a corpus file (documents, for the progress bar); files of a "files" corpus."""
    if path.is_dir():
        from indexer.corpus import text_files

        return len(text_files(path))
    try:
        with open(path, "rb") as f:
            return sum(1 for _ in f)
    except OSError:
        return None


@dataclass(frozen=True)
class Executor:
    """Who encodes the shards: this process (``workers`` 1), ``workers`` spawned processes, or Ray
    actors (``ray``); the last two load the embedder again from ``embedder_spec``."""

    workers: int = 1
    embedder_spec: EmbedderSpec | None = None
    ray: RayOptions | None = None

    @property
    def local(self) -> bool:
        return self.workers == 1 and self.ray is None


@dataclass(frozen=True)
class BuildPlan:
    """What a build writes and how, apart from the corpus, the target and the embedder.

    ``channels``: {mode: setting} of the channels to build, as the channel table
    (indexer/channels.py) names them (``{"sparse": True, "bm25": "words", "encoder": SentenceEncoder}``;
    the aligned-token channel unless left out); ``shards``: the committed shards' plan (K, documents
    per shard, segment windows; whether the LLM states are kept follows from the channels);
    ``executor``: who encodes them. ``dense_kind``: the FAISS kind of every dense channel (a compact
    build turns the default Flat into each channel's compact kind: :meth:`dense_kind_of`); ``compact``: 8-bit impacts (indexer/compact.py);
    ``doc_ids``: how a compact build stores the postings' doc numbers (None: int32, format 3;
    ``bitpacked-128``: format 4; ``range16-65536``: format 5); ``impact_bits``: 4 stores a compact
    build's aligned-token impacts two a byte (format 6; BM25's stay 8-bit)."""

    channels: Mapping[str, Any]
    shards: ShardPlan
    executor: Executor = Executor()
    dense_kind: str = "Flat"
    compact: bool = False
    progress: bool = True
    doc_ids: str | None = None
    impact_bits: int = DEFAULT_IMPACT_BITS

    @classmethod
    def make(
        cls, channels: Mapping[str, Any], embedder: Embedder, top_k: int = DEFAULT_TOP_K, shard_size: int = DEFAULT_SHARD_SIZE,
        segments: bool = False, max_segments: int | None = None, executor: Executor = Executor(), dense_kind: str = "Flat",
        compact: bool = False, progress: bool = True, doc_ids: str | None = None, impact_bits: int = DEFAULT_IMPACT_BITS,
        sparse: bool = True,
    ) -> BuildPlan:
        """A plan checked and completed: channels named any way the table knows them, in table
        order, the aligned tokens included unless ``sparse`` is False; K capped at the vocabulary."""
        if top_k < 1:
            raise ValueError("top_k must be positive")
        if shard_size < 1:
            raise ValueError("chunk_size (the shard size) must be positive")
        if executor.workers < 1 or (not executor.local and executor.embedder_spec is None):
            raise ValueError("workers must be >= 1, and workers > 1 or ray need embedder_spec (how each worker loads the embedder)")
        if max_segments is not None and max_segments < 1:
            raise ValueError(f"max_segments must be positive, not {max_segments}")
        compact_format(doc_ids, impact_bits)  # a known encoding and width, or ValueError
        if doc_ids is not None and not compact:
            raise ValueError("encoded doc numbers (doc_ids) go with a compact index (8-bit impacts)")
        if impact_bits != DEFAULT_IMPACT_BITS and not compact:
            raise ValueError(f"{impact_bits}-bit impacts go with a compact index")
        named = {channel_spec(name).mode: setting for name, setting in channels.items()}
        chosen = {s.mode: named.get(s.mode, True) for s in CHANNEL_SPECS if (s.required and sparse) or s.mode in named}
        if not chosen:
            raise ValueError("no channel to build: name at least one")
        keep = any(LLM_EMBEDDINGS in s.build_needs for s in CHANNEL_SPECS if s.mode in chosen)
        tokens = SPARSE.mode in chosen
        windows = (max_segments or 0) if segments else None  # None: one vector per document; 0: every window
        if windows is not None and not (tokens or keep):
            raise ValueError("segments: documents are cut into windows for the LLM's channels (sparse, dense, dense-ef), and none is built")
        shards = ShardPlan(min(top_k, embedder.vocab_size), keep, shard_size, windows, tokens)
        return cls(chosen, shards, executor, dense_kind, compact, progress, doc_ids, impact_bits)

    def dense_kind_of(self, mode: str) -> str:
        """The FAISS kind the dense channel ``mode`` is built as: a compact build turns the
        default Flat into that channel's compact kind (indexer/compact.py); any other kind asked
        for is kept."""
        return compact_dense_kind(self.dense_kind, self.compact, mode)

    @property
    def specs(self) -> tuple[ChannelSpec, ...]:
        """The rows of the channels built, in table order."""
        return tuple(s for s in CHANNEL_SPECS if s.mode in self.channels)

    @property
    def encoders(self) -> dict[str, SentenceEncoder]:
        """The sentence encoders the shards run, by the shards' array each fills (the settings of
        the sentence-encoder channels)."""
        return {s.name: self.channels[s.mode] for s in self.specs if SENTENCE_ENCODER in s.build_needs}


def build_index(
    corpus: CorpusSpec | str | os.PathLike[str],
    index_dir: str | os.PathLike[str],
    embedder: Embedder,
    top_k: int = DEFAULT_TOP_K,
    dense: bool = False,
    dense_kind: str = "Flat",
    overwrite: bool = False,
    chunk_size: int = DEFAULT_SHARD_SIZE,
    progress: bool = True,
    embedfilter_tau: int | None = None,
    lexical: str | None = None,
    encoder: SentenceEncoder | None = None,
    workers: int = 1,
    embedder_spec: EmbedderSpec | None = None,
    segments: bool = False,
    max_segments: int | None = None,
    ray: RayOptions | None = None,
    compact: bool = False,
    channels: Mapping[str, Any] | None = None,
    doc_ids: str | None = None,
    impact_bits: int = DEFAULT_IMPACT_BITS,
    sparse: bool = True,
) -> Manifest:
    """Index ``corpus`` into ``index_dir`` with ``embedder``; returns the manifest written. The
    keyword form of :func:`build` (a :class:`BuildPlan` made from these arguments).

    ``channels``: the channels besides the aligned-token postings, {name: setting} (each a row of
    indexer/channels.py, by any of its names; the setting is the row's: ``{"bm25": "words",
    "encoder": SentenceEncoder, "dense-ef": 2, "dense": True}``). Every channel is built this way; the
    keywords ``dense`` (FAISS over the pooled embeddings), ``embedfilter_tau`` (EmbedFilter-projected
    embeddings, embedder/embedfilter.py), ``lexical`` ("words" or "tokens": BM25) and ``encoder`` (a
    sentence-transformers model, embedder/sentence_encoder.py) are older shorthands for their rows'
    entries, kept for callers of before the table (a channel added since has no keyword). ``sparse``: False leaves the aligned-token postings
    out (``build-index --channels`` without ``sparse``); where no channel built needs the LLM (BM25,
    the sentence encoders), ``embedder`` may be a :class:`~embedder.tokenization.TokenizerOnly` and no
    LLM runs.

    The corpus is encoded in shards of ``chunk_size`` documents, each committed to disk
    atomically (indexer/shards.py): a build killed at any point resumes, when run again with
    the same arguments, from the shards already committed, and ends with the same index.
    ``workers`` > 1 encodes the shards in that many processes, each loading the embedder
    from ``embedder_spec``; the index is the same as with one. ``ray`` encodes the shards on
    Ray actors instead (indexer/ray_workers.py; ``workers`` is then ignored for
    ``ray.workers``), committed by this process as a local build commits them. Memory during encoding is
    bounded by one shard; the merge writes the postings through memory maps.

    ``segments``: multi-vector documents (indexer/segments.py). A document longer than the
    embedder's ``max_length`` tokens is read whole, as consecutive windows of that length (at
    most ``max_segments``); its sparse vector is each token's maximum over the windows and the
    dense channels hold one vector per window (a document scores as its best window).

    ``compact``: a compact index (indexer/compact.py, format 3 with int32 doc numbers): 8-bit
    impacts in the postings and BM25, and each dense channel as its compact kind
    (:func:`indexer.compact.compact_dense_kind`: SQ8, mpnet's SQ6) where ``dense_kind`` is the default Flat. The shards are those of a plain build (same resume key).
    ``doc_ids`` (compact only): the postings' doc numbers bit-packed (``"bitpacked-128"``, format 4)
    or range-blocked (``"range16-65536"``, format 5: what fits ten million documents in RAM); None: int32.
    ``impact_bits`` (compact only): 4 stores the aligned-token impacts two a byte (format 6, 16 levels).
    """
    options = {"dense": dense or None, "embedfilter_tau": embedfilter_tau, "lexical": lexical or None, "encoder": encoder}  # None: not built
    chosen = {s.mode: options[s.option] for s in CHANNEL_SPECS if s.option in options and options[s.option] is not None}
    chosen |= {channel_spec(name).mode: setting for name, setting in (channels or {}).items()}
    plan = BuildPlan.make(chosen, embedder, top_k, chunk_size, segments, max_segments, Executor(workers, embedder_spec, ray), dense_kind,
                          compact, progress, doc_ids, impact_bits, sparse)
    return build(corpus, index_dir, embedder, plan, overwrite)


def build(
    corpus: CorpusSpec | str | os.PathLike[str], index_dir: str | os.PathLike[str], embedder: Embedder, plan: BuildPlan, overwrite: bool = False,
) -> Manifest:
    """Index ``corpus`` into ``index_dir`` with ``embedder`` as ``plan`` says (see
    :func:`build_index`, its keyword form); returns the manifest written."""
    spec = corpus if isinstance(corpus, CorpusSpec) else CorpusSpec(Path(corpus))
    target = Path(index_dir)
    executor, encoders = plan.executor, plan.encoders
    if executor.local and getattr(embedder, "runtime_name", None):
        # resolve (and, the first time on this machine, probe) the runtime now, so that the
        # shards' key and the manifest name the runtime that really encodes
        embedder.runtime()
    # one build per target, from the first byte written to the publish (indexer/generations.py)
    with build_lock(target):
        if os.path.lexists(target) and not overwrite:
            raise FileExistsError(f"{target} exists; pass overwrite=True (--overwrite) to replace it")
        sweep_generations(target)
        store = ShardStore(target, _shard_params(spec, embedder, encoders, plan.shards))
        done = False
        try:
            encode = _encode_all(spec, store, embedder, encoders, plan.shards, plan.progress, executor.workers, executor.embedder_spec, executor.ray)
            with staging_dir(target, "building") as tmp:  # also sweeps what killed builds left behind
                manifest = _merge_into(spec, tmp, store, encode, embedder, plan)
                # the fusion the index's BM25 + encoder pairs earn on this corpus, read off its own documents
                manifest = record_calibration(tmp, manifest, {s.mode: plan.channels[s.mode] for s in plan.specs if SENTENCE_ENCODER in s.build_needs},
                                              getattr(embedder, "tokenizer", None))
                generation = stage(tmp, target)
            # the staging lock is let go first: readers of the new index never wait on the cleanup
            publish_staged(generation, target, overwrite)
            done = True
        except WorkerFailed:
            raise  # a worker died (a signal, a crash): its committed shards are kept for the rerun
        except OSError as exc:
            # a full disk keeps the committed shards: the rerun, with space, resumes from them
            done = exc.errno != errno.ENOSPC
            if exc.errno == errno.ENOSPC and not isinstance(exc, NoSpaceError):
                raise NoSpaceError(exc.filename or target, None) from None
            raise
        except Exception:
            done = True  # a failure (bad input) is not resumed: the rerun starts clean
            raise
        finally:
            # interrupted (KeyboardInterrupt, SIGTERM): keep the committed shards for the rerun
            store.close(remove=done)
    return manifest


def _shard_params(spec: CorpusSpec, embedder: Embedder, encoders: Mapping[str, SentenceEncoder], plan: ShardPlan) -> dict:
    """Everything that decides the shards' content: the key of a resumable build."""
    return {
        "format_version": FORMAT_VERSION,
        "corpus": {**corpus_identity(spec.file), "format": spec.fmt, "id_field": spec.id_field, "text_field": spec.text_field,
                   "title_field": spec.title_field, "on_empty": spec.on_empty},
        "model": embedder.identity,
        "adapter": embedder.adapter,
        "embedding": embedder.config.to_dict(),
        "runtime": {key: embedder.runtime_info().get(key) for key in ("name", "dtype")},
        "top_k": plan.k,
        "embeddings": plan.keep_embeddings,
        # each array's encoder; a one-encoder build keeps the key it always had (its shards still resume)
        **{array: encoder.identity for array, encoder in encoders.items()},
        **({} if ENCODER_NAME in encoders else {ENCODER_NAME: None}),
        "shard_size": plan.shard_size,
        "segments": plan.windows,
        **({} if plan.tokens else {"tokens": False}),  # a build with the aligned tokens keeps the key it always had
    }


def _swap_into_place(tmp: Path, target: Path) -> None:
    """Replace ``target`` (a directory or file, or nothing) by the directory ``tmp`` in one
    atomic step (``renameat2(RENAME_EXCHANGE)``), then remove what was there. Used for
    exports; indexes are published as generations (indexer/generations.py)."""
    if not os.path.lexists(target):
        os.replace(tmp, target)
        return
    try:
        rename_exchange(tmp, target)
    except OSError as exc:
        if exc.errno not in (errno.EINVAL, errno.ENOSYS, errno.ENOTSUP):
            raise
        old = target.with_name(f".{target.name}.old-{os.getpid()}")
        os.replace(target, old)
        os.replace(tmp, target)
        tmp = old
    if tmp.is_dir() and not tmp.is_symlink():
        shutil.rmtree(tmp, ignore_errors=True)
    else:
        tmp.unlink(missing_ok=True)


def _encode_shards(
    spec: CorpusSpec, store_path: Path, embedder: Embedder, encoders: Mapping[str, SentenceEncoder], plan: ShardPlan,
    mine: Callable[[int], bool], skip: set[int], progress: bool, position: int = 0,
    starting: Callable[[int], None] | None = None,
) -> tuple[int, int]:
    """Stream the corpus; encode and commit each shard ``mine`` selects that is not in ``skip``
    (calling ``starting(number)`` first). Returns (number of shards in the corpus, documents
    skipped as empty)."""
    bar = tqdm(total=_count_lines(spec.file), unit="doc", desc=f"indexing {spec.path.name}", disable=not progress, position=position)
    n_tokens, seconds, n_shards = 0, 0.0, 0
    for number, chunk in enumerate(chunks(spec, plan.shard_size)):
        n_shards = number + 1
        if mine(number) and number not in skip:
            if starting is not None:
                starting(number)
            arrays, meta = encode_shard(chunk, embedder, encoders, plan, encoded=bar.update)  # the bar moves per batch
            commit_shard(store_path, number, arrays, meta)
            n_tokens += meta["n_tokens"]
            seconds += meta["encode_seconds"]
            bar.set_postfix(tok_per_s=f"{n_tokens / max(seconds, 1e-9):.0f}")
        else:
            bar.update(len(chunk))  # committed by an earlier run, or another worker's
    bar.close()
    return n_shards, spec.n_empty


def _worker(job: tuple, reporter: Reporter) -> tuple[int, int]:
    """A ``--workers`` process: load the embedder, encode the shards ``number % n == w``."""
    spec, store_path, embedder_spec, plan, w, n, skip, progress = job
    embedder, encoders = embedder_spec.load()
    # the machine's cores shared between workers, not each worker taking all of them. Set after
    # the load: set before it, 2 workers ran 1.6x faster on 2 AVX2 cores but a resumed build's
    # postings weights no longer matched a one-process build's byte for byte
    # (tests/test_runtime_probe.py); not understood yet
    torch.set_num_threads(max(1, (os.cpu_count() or 1) // n))
    return _encode_shards(spec, store_path, embedder, encoders, plan, lambda i: i % n == w, skip, progress, w, reporter.starting)


def _encode_all(
    spec: CorpusSpec, store: ShardStore, embedder: Embedder, encoders: Mapping[str, SentenceEncoder], plan: ShardPlan,
    progress: bool, workers: int, embedder_spec: EmbedderSpec | None, ray: RayOptions | None = None,
) -> dict:
    """Make sure every shard is committed; returns {"n_shards", "n_empty", "resumed", "executor"}."""
    skip = store.committed()
    executor: dict = {"executor": "local", "workers": workers}
    if ray is not None:
        n_shards, n_empty, executor = _encode_on_ray(spec, store, plan, progress, embedder_spec, ray, skip)
    elif workers == 1:
        n_shards, n_empty = _encode_shards(spec, store.path, embedder, encoders, plan, lambda i: True, skip, progress)
    else:
        from indexer.corpus import CorpusError

        jobs = [(spec, store.path, embedder_spec, plan, w, workers, skip, progress) for w in range(workers)]
        # a worker that dies fails the build at once, naming its shard (indexer/workers.py);
        # bad input is reported as one process would report it
        results = run_workers(_worker, jobs, reraise=(CorpusError,))
        n_shards, n_empty = results[0]
    missing = set(range(n_shards)) - store.committed()
    if missing:
        raise RuntimeError(f"{store.path}: shards {sorted(missing)[:5]} were not committed")
    if n_shards == 0:
        raise ValueError(f"{spec.file}: no documents to index")
    spec.n_empty = n_empty
    return {"n_shards": n_shards, "n_empty": n_empty, "resumed": len(skip & set(range(n_shards))), "executor": executor}


def _encode_on_ray(
    spec: CorpusSpec, store: ShardStore, plan: ShardPlan, progress: bool, embedder_spec: EmbedderSpec, options: RayOptions, skip: set[int],
) -> tuple[int, int, dict]:
    """The shards not in ``skip`` encoded by Ray actors and committed here: (shards, empty, executor)."""
    from indexer.ray_workers import encode_on_ray

    count = {"shards": 0}

    def todo() -> Iterator[tuple[int, list]]:
        for number, chunk in enumerate(chunks(spec, plan.shard_size)):
            count["shards"] = number + 1
            if number not in skip:
                yield number, chunk

    def commit(number: int, arrays: dict[str, np.ndarray], meta: dict) -> None:
        commit_shard(store.path, number, arrays, meta)

    total = _count_lines(spec.file)
    if total is not None:  # the bar counts what is encoded now, not the shards a rerun resumes from
        total = max(0, total - len(skip) * plan.shard_size)
    executor = encode_on_ray(todo(), commit, embedder_spec, plan, options, total_docs=total, progress=progress)
    return count["shards"], spec.n_empty, executor


def _merge_into(spec: CorpusSpec, out: Path, store: ShardStore, encode: dict, embedder: Embedder, plan: BuildPlan) -> Manifest:
    """Write the index from the committed shards, one shard in memory at a time: each channel by
    its row's writer (indexer/channels.py), those that need the documents' text fed in the pass
    over the corpus that stores the documents."""
    start = time.perf_counter()
    numbers = range(encode["n_shards"])

    def arrays(*names: str) -> Callable[[], Iterator[tuple[np.ndarray, ...]]]:
        def gen() -> Iterator[tuple[np.ndarray, ...]]:
            for i in numbers:
                got, _ = read_shard(store.path, i, names)
                yield tuple(got[n] for n in names)

        return gen

    metas = [read_shard(store.path, i, ())[1] for i in numbers]
    ids = [d for m in metas for d in m["ids"]]
    n_tokens = sum(m["n_tokens"] for m in metas)
    encode_seconds = sum(m["encode_seconds"] for m in metas)
    encoder_seconds = sum(m.get("encoder_seconds", 0.0) for m in metas)
    segments_info = row_doc = None
    if plan.shards.windows is not None:
        # shard-local document numbers of each window, made global
        offsets = np.cumsum([0] + [len(m["ids"]) for m in metas])
        row_doc = np.concatenate([r + offsets[i] for i, (r,) in zip(numbers, arrays("row_docs")())])
        per_doc = np.bincount(row_doc, minlength=len(ids))
        segments_info = {
            "length": embedder.config.max_length, "max_segments": plan.shards.windows or None, "n_segments": len(row_doc),
            "max_per_doc": int(per_doc.max()), "docs_with_several": int((per_doc > 1).sum()),
            "sparse": "max over segments", "dense": "one vector per segment, document = best segment",
        }
    # the aligned tokens' postings lie at the index's top level, BM25's in lexical/: only theirs take impact_bits
    quantise = functools.partial(_compact_channel, doc_ids=plan.doc_ids, n_docs=len(ids), bits={out: plan.impact_bits}) if plan.compact else None
    writers = {
        s.mode: s.writer(WriteContext(out, embedder, plan.channels[s.mode], arrays, plan.shards.k, plan.dense_kind_of(s.mode), row_doc, quantise))
        for s in plan.specs
    }
    write_bytes(out / DOC_IDS, json.dumps(ids).encode("utf-8"))
    records: dict[str, dict] = {}
    seconds: dict[str, float] = {}
    for s in plan.specs:  # the channels written from the shards, in table order
        if TEXT not in s.build_needs:
            t0 = time.perf_counter()
            records[s.manifest_key] = writers[s.mode].finish()
            seconds[s.mode] = time.perf_counter() - t0
    # the stored documents (and the channels that read text, which need no model: BM25) from one
    # more pass over the corpus, rather than its text kept in the shards
    readers = [writers[s.mode] for s in plan.specs if TEXT in s.build_needs]
    stored_info = write_documents(out, _feeding(readers, tqdm(
        CorpusSpec(spec.path, spec.fmt, spec.id_field, spec.text_field, spec.title_field, spec.on_empty),
        total=len(ids), unit="doc", desc="storing documents" + "".join(f" + {s.mode}" for s in plan.specs if TEXT in s.build_needs),
        disable=not plan.progress)))
    if stored_info["n_docs"] != len(ids):
        raise RuntimeError(f"{spec.file}: changed while being indexed ({stored_info['n_docs']} documents now, {len(ids)} encoded)")
    for s in plan.specs:
        if TEXT in s.build_needs:
            records[s.manifest_key] = writers[s.mode].finish()
    total = encode_seconds + encoder_seconds + time.perf_counter() - start
    manifest = Manifest(
        model=embedder.identity,
        adapter=embedder.adapter,
        embedding=embedder.config.to_dict(),
        runtime=_runtime_record(embedder.runtime_info(), _runtimes_of(metas)),
        n_docs=len(ids),
        corpus=spec.describe(),
        channels=records,
        segments=segments_info,
        documents=stored_info,
        # 4-bit impacts are the aligned tokens' alone: an index without them is laid out as at 8 bits
        format_version=(compact_format(plan.doc_ids, plan.impact_bits if plan.shards.tokens else DEFAULT_IMPACT_BITS) if plan.compact
                        else SEGMENTS_FORMAT_VERSION if plan.shards.windows is not None else FORMAT_VERSION),
        build={
            "seconds": round(total, 3),
            "encode_seconds": round(encode_seconds, 3),
            "invert_seconds": round(seconds.get(SPARSE.mode, 0.0), 3),
            # documents a second through the LLM (a build without it: through the whole build)
            "docs_per_s": round(len(ids) / max(encode_seconds if plan.shards.llm else total, 1e-9), 2),
            "tokens_per_s": round(n_tokens / max(encode_seconds, 1e-9), 1),
            "n_tokens": n_tokens,
            "shards": encode["n_shards"],
            "shards_resumed": encode["resumed"],
            "executor": encode["executor"],
            "encoded_with": _runtimes_of(metas),
            # documents longer than max_length tokens, read by the LLM channels up to there (--segments reads them whole)
            **({"documents_cut": sum(m.get("n_cut", 0) for m in metas)} if plan.shards.windows is None else {}),
            **({"encoder_seconds": round(encoder_seconds, 3)} if plan.encoders else {}),
            "device": embedder.device,
            "torch_threads": torch.get_num_threads(),
        },
        created=datetime.now(timezone.utc).isoformat(timespec="seconds"),
        files=record_files(out),
    )
    manifest.write(out)  # written last: a directory without a manifest is not an index
    return manifest


def _compact_channel(directory: Path, doc_ids: str | None, n_docs: int, bits: Mapping[Path, int]) -> dict:
    """A compact build's impacts for the postings saved in ``directory`` (``bits[directory]`` bits,
    8 where not named), and their doc numbers encoded as ``doc_ids`` says: what the channel's
    manifest record gains."""
    return compact_channel_files(directory, n_docs, doc_ids=doc_ids, bits=bits.get(directory, DEFAULT_IMPACT_BITS))


def _feeding(channels: list[ChannelWriter], docs: Iterable[Document]) -> Iterator[Document]:
    """``docs``, each text also given to the channels that read text on its way through."""
    for doc in docs:
        for channel in channels:
            channel.add_text(doc.text)
        yield doc


def _runtimes_of(metas: list[dict]) -> dict[str, int]:
    """How many shards each runtime encoded ("openvino fp32": 3): workers may differ."""
    counts: dict[str, int] = {}
    for m in metas:
        counts[m.get("runtime", "unknown")] = counts.get(m.get("runtime", "unknown"), 0) + 1
    return counts


def _runtime_record(info: dict, encoded_with: dict[str, int]) -> dict:
    """The manifest's ``runtime``: this process's, saying so where its shards were encoded by others.

    Workers load their own embedder and may fall back to another runtime than this process
    resolved (a setting whose compile crashed there): the manifest must not then claim a
    precision no document was encoded in."""
    own = f"{info['name']} {info['dtype']}"
    if set(encoded_with) <= {own}:
        return info
    shards = ", ".join(f"{name} ({n} shards)" for name, n in sorted(encoded_with.items()))
    return {**info, "shards_encoded_with": shards, "reason": f"{info.get('reason', own)}; but the documents were encoded with {shards} (build.encoded_with)"}


def index_size_bytes(index_dir: Path) -> int:
    """Bytes on disk of everything in an index directory."""
    return sum(p.stat().st_size for p in Path(index_dir).iterdir() if p.is_file())


__all__ = ["DEFAULT_SHARD_SIZE", "DEFAULT_TOP_K", "DOC_IDS", "MANIFEST", "BuildPlan", "EmbedderSpec", "Executor", "build", "build_index", "index_size_bytes"]
