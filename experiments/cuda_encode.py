"""The engine's document encoding against a plain transformers loop, on the same texts, in one run
(issue 51, item 4: "a CUDA encode path as fast as the hardware allows").

Three systems encode the same documents (the first ``--max-docs`` of each ``--data`` corpus, read by
the indexer's own reader, indexer/corpus.py) with the same weights (one ``Embedder.load``: the model
and adapter ``build-index`` loads):

(a) **plain**: the loop a user writes first, in this file: every text tokenised inside the engine's
    document template (``Embedder.prompt_ids``: template, max_length, all-caps folding), sorted by
    length (longest first), batches of ``--plain-batch`` (256) padded to their longest, the decoder in
    ``--plain-dtype`` (bf16 on a GPU), pooled as the engine pools (the adapter's pooling: last or
    mean), the LM head on the pooled state (fp32, as the engine reads it), ``torch.topk`` K on the
    device and one host copy per batch.
(b) **engine encode**: what ``build-index`` runs per shard (``indexer.shard_encoder.encode_shard``:
    ``Embedder.iter_batches`` + ``top_tokens``, the embeddings kept), shard by shard, with the
    build's own plan (K, documents per shard) and the engine's runtime and batch size.
(c) **engine build**: ``indexer.build.build_index`` end to end into a temporary folder (encoding,
    shards, inversion, the dense channel, stored documents, the manifest, the publish): what
    ``build-index --device cuda`` runs, with build-index's defaults (read from its own parser).

Each is warmed up once (not timed) and timed between ``torch.cuda.synchronize()`` calls. Reported:
docs/s, tokens/s (the prompt tokens each network is asked to read: template + text up to
max_length, no padding; the engine's prefix cache skips the template's prefix, a saving it is
credited with), wall seconds, peak GPU memory, the projected hours to index 1M documents at that
rate (at this corpus's mean length), and for (b) and (c) against (a): the identity of the top-K
lists (the fraction of documents whose K token ids are the same set, the mean and minimum overlap)
and the cosine of the pooled embeddings ((c) reads both back from the index it built: the
postings and the dense channel, SQ8 in a compact index, so its cosine is the quantised vector's).
(c) also gets a breakdown measured by wrapping the embedder's calls during the build: the forward
pass, the LM head + top-K + host copies, tokenisation (host seconds, and on a GPU each call's span
on the stream from CUDA events, which add no synchronisation), the rest of the encode loop, and
everything after it (inversion, writing, storing documents).

    python -m experiments.cuda_encode --data ../shared/data/npl --device cuda \\
        --out benchmarks/results/cuda-encode-h200.json

On a CPU it runs the same at tiny sizes (``--device cpu --max-docs 64``). The results file is a
table (benchmarks/tables.py) that ``beir-eval report`` reads; the markdown table is printed too.
"""
from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from tqdm.auto import tqdm

from benchmarks.provenance import git_commit, machine_info
from benchmarks.tables import study_command, write_table
from embedder.encoder import Embedder
from indexer import channel_set
from indexer.build import DEFAULT_SHARD_SIZE, DEFAULT_TOP_K, BuildPlan, build_index
from indexer.channels import CHANNEL_SPECS, SENTENCE_ENCODER
from indexer.compact import DEFAULT_COMPACT
from indexer.corpus import CorpusSpec, Document
from indexer.manifest import Manifest
from indexer.shard_encoder import ShardPlan, chunks, encode_shard
from indexer.verify import open_channels

MILLION = 1_000_000
PLAIN_BATCH = 256
# the LLM's outputs the plain loop also computes (top-K tokens and the pooled state): the build
# then does the same work as the loop, plus what an index needs
DEFAULT_CHANNELS = "sparse,dense"
# token ids travel to the host inside the batch's one float32 copy: exact below 2**24
FLOAT32_EXACT_INTS = 1 << 24
SYSTEMS = ("plain", "engine encode", "engine build")


# ------------------------------------------------------------------ inputs
def read_documents(paths: Sequence[Path], max_docs: int | None = None) -> list[Document]:
    """The documents of each corpus in order (the indexer's reader), at most ``max_docs`` in all.

    With several corpora, ids are prefixed with the corpus folder's name so that they stay unique
    in the one corpus the build reads."""
    docs: list[Document] = []
    for path in paths:
        for doc in CorpusSpec(Path(path)):
            if max_docs is not None and len(docs) >= max_docs:
                return docs
            doc_id = f"{Path(path).name}/{doc.doc_id}" if len(paths) > 1 else doc.doc_id
            docs.append(Document(doc_id, doc.text))
    return docs


def write_corpus(docs: Sequence[Document], path: Path) -> Path:
    """The documents as JSONL (``_id``, ``text``): the build embeds ``text`` as the others do."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", encoding="utf-8") as f:
        f.writelines(json.dumps({"_id": d.doc_id, "text": d.text}, ensure_ascii=False) + "\n" for d in docs)
    return path


def count_tokens(embedder: Embedder, texts: Sequence[str]) -> int:
    """Prompt tokens of ``texts`` (template + text cut at max_length; no padding): what every system reads."""
    return sum(len(row) for row in embedder.prompt_ids(list(texts)))


def channel_settings(channels: Sequence[str], device: str | None) -> dict[str, Any]:
    """``build_index(channels=...)`` for a channel set, as build-index makes it (indexer/cli.py):
    each channel's default setting, a sentence encoder loaded by name on ``device``."""
    options = channel_set.build_options(tuple(channels))
    settings = {s.mode: options[s.option] for s in CHANNEL_SPECS if s.mode in channels and not s.required}
    for s in CHANNEL_SPECS:
        if SENTENCE_ENCODER in s.build_needs and s.mode in settings:
            from embedder.sentence_encoder import SentenceEncoder

            settings[s.mode] = SentenceEncoder.load(settings[s.mode], device=device)
    return settings


# ------------------------------------------------------------------ timing
def is_cuda(device: str) -> bool:
    return str(device).startswith("cuda")


def synchronize(device: str) -> None:
    """Wait for the GPU's queued work (CUDA runs asynchronously: a timer stopped early lies)."""
    if is_cuda(device):
        torch.cuda.synchronize()


@dataclass
class Timing:
    """One timed run: wall seconds between synchronisations, documents, prompt tokens, peak GPU memory."""

    seconds: float = 0.0
    n_docs: int = 0
    n_tokens: int = 0
    peak_gpu_bytes: int | None = None

    @property
    def docs_per_s(self) -> float:
        return self.n_docs / max(self.seconds, 1e-12)

    @property
    def tokens_per_s(self) -> float:
        return self.n_tokens / max(self.seconds, 1e-12)

    @property
    def hours_per_million(self) -> float:
        """Projected hours for 1M documents at this rate (documents of this corpus's mean length)."""
        return MILLION / max(self.docs_per_s, 1e-12) / 3600

    def to_dict(self) -> dict:
        return {
            "seconds": round(self.seconds, 4), "n_docs": self.n_docs, "n_tokens": self.n_tokens,
            "docs_per_s": round(self.docs_per_s, 2), "tokens_per_s": round(self.tokens_per_s, 1),
            "hours_per_1m_docs": round(self.hours_per_million, 3), "peak_gpu_bytes": self.peak_gpu_bytes,
        }


@contextmanager
def timed(device: str, n_docs: int, n_tokens: int) -> Iterator[Timing]:
    """Time the block on ``device``: synchronised before and after, the GPU's peak memory reset first."""
    timing = Timing(n_docs=n_docs, n_tokens=n_tokens)
    if is_cuda(device):
        torch.cuda.reset_peak_memory_stats()
    synchronize(device)
    t0 = time.perf_counter()
    yield timing
    synchronize(device)
    timing.seconds = time.perf_counter() - t0
    if is_cuda(device):
        timing.peak_gpu_bytes = int(torch.cuda.max_memory_allocated())


# ------------------------------------------------------------------ outputs and their agreement
@dataclass
class Outputs:
    """What one system computed, in text order: top-K token ids (n, K), pooled embeddings (n, d) or None."""

    ids: np.ndarray
    embeddings: np.ndarray | None = None
    weights: np.ndarray | None = None  # the K logits (n, K), best first (not read back from an index)


def topk_agreement(reference: np.ndarray, other: np.ndarray) -> dict:
    """How far two systems' top-K lists are the same: the fraction of documents whose K ids are the
    same set, and the mean and minimum share of the K ids they have in common (order ignored)."""
    if reference.shape != other.shape:
        raise ValueError(f"top-K arrays differ in shape: {reference.shape} and {other.shape}")
    n, k = reference.shape
    if n == 0:
        return {"equal_fraction": float("nan"), "overlap_mean": float("nan"), "overlap_min": float("nan")}
    a, b = np.sort(reference.astype(np.int64), axis=1), np.sort(other.astype(np.int64), axis=1)
    equal = (a == b).all(axis=1)
    # one vectorised membership test: (row, id) pairs as one integer each
    span = int(max(a.max(), b.max())) + 2
    rows = np.arange(n, dtype=np.int64)[:, None] * span
    shared = np.isin(a + 1 + rows, b + 1 + rows).reshape(n, k).sum(axis=1) / k
    return {"equal_fraction": float(equal.mean()), "overlap_mean": float(shared.mean()), "overlap_min": float(shared.min())}


def cosine_stats(reference: np.ndarray, other: np.ndarray) -> dict:
    """Row-wise cosine of two systems' pooled embeddings: min and mean."""
    a, b = reference.astype(np.float64), other.astype(np.float64)
    cos = (a * b).sum(1) / np.maximum(np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1), 1e-30)
    return {"cos_min": float(cos.min()), "cos_mean": float(cos.mean())} if len(cos) else {"cos_min": float("nan"), "cos_mean": float("nan")}


def agreement(reference: Outputs, other: Outputs) -> dict:
    """:func:`topk_agreement` and, where both kept embeddings, :func:`cosine_stats`."""
    out = topk_agreement(reference.ids, other.ids)
    if reference.embeddings is not None and other.embeddings is not None:
        out |= cosine_stats(reference.embeddings, other.embeddings)
    return out


# ------------------------------------------------------------------ (a) the plain loop
def plain_body(embedder: Embedder, dtype: str) -> torch.nn.Module:
    """The decoder without its LM head, in ``dtype`` ("bf16": a copy cast once, as a user loads it in bf16)."""
    if embedder.config.pooling not in ("last", "mean"):
        raise ValueError(f"the plain loop pools 'last' or 'mean', not {embedder.config.pooling!r}")
    body = embedder.causal_lm.base_model
    if dtype == "bf16":
        import copy

        body = copy.deepcopy(body).to(torch.bfloat16)
    elif dtype != "fp32":
        raise ValueError(f"the plain loop runs bf16 or fp32, not {dtype!r}")
    return body.eval()


def pad_batch(rows: Sequence[Sequence[int]], pad_id: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Right-padded ids, attention mask and lengths (int64) of a batch of id lists."""
    lengths = torch.tensor([len(r) for r in rows], dtype=torch.long)
    ids = torch.full((len(rows), int(lengths.max())), pad_id, dtype=torch.long)
    for i, row in enumerate(rows):
        ids[i, : len(row)] = torch.tensor(row, dtype=torch.long)
    mask = (torch.arange(ids.shape[1])[None, :] < lengths[:, None]).long()
    return ids, mask, lengths


def plain_encode(embedder: Embedder, body: torch.nn.Module, texts: Sequence[str], k: int, batch_size: int = PLAIN_BATCH,
                 progress: bool = False) -> Outputs:
    """(a): the plain loop over ``texts`` (see the module docstring); outputs in text order."""
    device = embedder.device
    head = embedder.causal_lm.get_output_embeddings().weight  # fp32: the engine reads h through it in fp32
    if head.shape[0] >= FLOAT32_EXACT_INTS:
        raise ValueError(f"a vocabulary of {head.shape[0]} ids does not travel exactly as float32")
    k = min(k, head.shape[0])
    rows = embedder.prompt_ids(list(texts))
    order = np.argsort([-len(r) for r in rows], kind="stable")
    ids_out = np.zeros((len(rows), k), np.int32)
    weights_out = np.zeros((len(rows), k), np.float32)
    emb_out = np.zeros((len(rows), head.shape[1]), np.float32)
    bar = tqdm(total=len(rows), unit="doc", desc="plain loop", disable=not progress, mininterval=2.0)
    with torch.inference_mode():
        for start in range(0, len(order), batch_size):
            pos = order[start : start + batch_size]
            ids, mask, lengths = pad_batch([rows[i] for i in pos], embedder._pad_id)
            ids, mask = ids.to(device, non_blocking=True), mask.to(device, non_blocking=True)
            hidden = body(input_ids=ids, attention_mask=mask, use_cache=False).last_hidden_state
            if embedder.config.pooling == "last":
                pooled = hidden[torch.arange(len(pos), device=device), lengths.to(device) - 1].float()
            else:  # in float32, as the engine pools: bf16 counts integers exactly only up to 256
                m = mask.unsqueeze(-1).float()
                pooled = (hidden.float() * m).sum(1) / m.sum(1)
            vals, top = torch.topk(pooled @ head.T, k, dim=-1)
            # one device-to-host copy per batch: the pooled states, the K logits (what an index keeps as
            # weights) and the K ids (exact in float32) together
            host = torch.cat([pooled, vals, top.float()], dim=1).cpu().numpy()
            d = head.shape[1]
            emb_out[pos], weights_out[pos], ids_out[pos] = host[:, :d], host[:, d : d + k], host[:, d + k :].astype(np.int32)
            bar.update(len(pos))
    bar.close()
    return Outputs(ids_out, emb_out, weights_out)


def padded_tokens(embedder: Embedder, texts: Sequence[str], batch_size: int) -> int:
    """Tokens the plain loop's batches hold, padding included (its wasted share is 1 - real / padded)."""
    lengths = sorted((len(r) for r in embedder.prompt_ids(list(texts))), reverse=True)
    return sum(len(lengths[i : i + batch_size]) * lengths[i] for i in range(0, len(lengths), batch_size))


# ------------------------------------------------------------------ (b) the engine's encode path
def engine_encode(embedder: Embedder, docs: Sequence[Document], plan: ShardPlan, progress: bool = False) -> Outputs:
    """(b): the build's per-shard encoding (``encode_shard``) over ``docs``, shard by shard; outputs in order."""
    ids, weights, embeddings = [], [], []
    bar = tqdm(total=len(docs), unit="doc", desc="engine encode", disable=not progress, mininterval=2.0)
    for chunk in chunks(docs, plan.shard_size):
        arrays, _ = encode_shard(chunk, embedder, None, plan, encoded=bar.update)
        ids.append(arrays["tokens"])
        weights.append(arrays["weights"])
        if "embeddings" in arrays:
            embeddings.append(arrays["embeddings"])
    bar.close()
    return Outputs(np.concatenate(ids), np.concatenate(embeddings) if embeddings else None, np.concatenate(weights))


# ------------------------------------------------------------------ (c) the engine's build, and its breakdown
def index_outputs(index: Path) -> Outputs:
    """The top-K ids (from the aligned-token postings: each document's K ids, ascending) and the
    dense channel's vectors (normalised; SQ8-decoded in a compact index) of a built index, in corpus order."""
    manifest = Manifest.read(index)
    opened = open_channels(index, manifest, mmap=False)
    rows = opened["sparse"].doc_vectors()  # documents x tokens
    per_doc = np.diff(rows.indptr)
    k = int(per_doc.max()) if len(per_doc) else 0
    if (per_doc == k).all():  # every document holds its K tokens: the CSR rows are the lists
        ids = rows.indices.astype(np.int64).reshape(rows.shape[0], k)
    else:
        ids = np.full((rows.shape[0], k), -1, np.int64)  # -1: a document with fewer postings than K (never expected)
        for d in range(rows.shape[0]):
            got = rows.indices[rows.indptr[d] : rows.indptr[d + 1]]
            ids[d, : len(got)] = got
    dense = opened.get("dense")
    embeddings = dense.index.reconstruct_n(0, dense.index.ntotal) if dense is not None else None
    return Outputs(ids, embeddings)


class Section:
    """The calls of one wrapped function: how many, their host seconds and, on a GPU, their span on
    the stream (CUDA events recorded around each call: asynchronous, so no synchronisation is added)."""

    def __init__(self, cuda: bool) -> None:
        self.cuda = cuda
        self.calls = 0
        self.host_seconds = 0.0
        self._events: list[tuple[Any, Any]] = []

    def wrap(self, fn: Callable) -> Callable:
        def timed_call(*args, **kwargs):
            start = None
            if self.cuda:
                start = torch.cuda.Event(enable_timing=True)
                start.record()
            t0 = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                self.host_seconds += time.perf_counter() - t0
                self.calls += 1
                if start is not None:
                    end = torch.cuda.Event(enable_timing=True)
                    end.record()
                    self._events.append((start, end))

        return timed_call

    def to_dict(self) -> dict:
        """Read after a synchronisation (the events must have completed)."""
        gpu = sum(s.elapsed_time(e) for s, e in self._events) / 1e3 if self.cuda else None
        return {"calls": self.calls, "host_s": round(self.host_seconds, 4), "gpu_s": round(gpu, 4) if gpu is not None else None}


@contextmanager
def wrapped(targets: dict[str, tuple[Any, str]], cuda: bool) -> Iterator[dict[str, Section]]:
    """Wrap ``getattr(obj, name)`` of each target on the instance (the class is untouched), yield the
    sections, restore the instances after."""
    sections: dict[str, Section] = {}
    undo: list[Callable[[], None]] = []
    try:
        for label, (obj, name) in targets.items():
            sections[label] = section = Section(cuda)
            had_own = name in vars(obj)
            original = getattr(obj, name)
            setattr(obj, name, section.wrap(original))
            undo.append((lambda o=obj, n=name, f=original: setattr(o, n, f)) if had_own else (lambda o=obj, n=name: delattr(o, n)))
        yield sections
    finally:
        for restore in reversed(undo):
            restore()


def breakdown_targets(embedder: Embedder) -> dict[str, tuple[Any, str]]:
    """What the breakdown wraps: the network's forward (the runtime's ``hidden``; without a runtime,
    the embedder's torch path, pooling included), the LM head + top-K + host copies (``top_tokens``),
    and tokenisation (``prompt_ids``)."""
    forward = (embedder.runtime(), "hidden") if embedder.runtime_name else (embedder, "_forward_pooled")
    return {"forward": forward, "lm_head_topk": (embedder, "top_tokens"), "tokenise": (embedder, "prompt_ids")}


def engine_build(embedder: Embedder, corpus: Path, index: Path, settings: dict, top_k: int, compact: bool, shard_size: int,
                 progress: bool = False) -> Manifest:
    """(c): ``build_index`` as build-index calls it (one process, these channels), into ``index``."""
    return build_index(corpus, index, embedder, top_k, overwrite=True, chunk_size=shard_size, progress=progress, compact=compact,
                       channels=settings)


def breakdown(sections: dict[str, Section], manifest: Manifest, wall: float) -> dict:
    """The build's time split: the wrapped calls, the rest of the encode loop (the manifest's
    encode seconds less the wrapped host seconds) and everything after it (wall less encode)."""
    parts = {label: s.to_dict() for label, s in sections.items()}
    encode = float(manifest.build.get("encode_seconds", 0.0))
    return {
        **parts,
        "encode_s": round(encode, 4),
        "encode_other_s": round(encode - sum(s.host_seconds for s in sections.values()), 4),
        "after_encoding_s": round(wall - encode, 4),
        "invert_s": manifest.build.get("invert_seconds"),
        "wall_s": round(wall, 4),
    }


# ------------------------------------------------------------------ the study
@dataclass
class StudyConfig:
    """How the three systems run (everything but the embedder and the documents)."""

    plain_batch: int = PLAIN_BATCH
    plain_dtype: str = "fp32"
    top_k: int = DEFAULT_TOP_K
    channels: tuple[str, ...] = ("sparse", "dense")
    compact: bool = DEFAULT_COMPACT
    shard_size: int = DEFAULT_SHARD_SIZE
    progress: bool = False
    breakdown: bool = True
    settings: dict = field(default_factory=dict)  # build_index(channels=...): from channel_settings


def run_study(embedder: Embedder, docs: Sequence[Document], work: Path, config: StudyConfig) -> dict:
    """Warm up and time (a), (b) and (c) on ``docs`` (see the module docstring); returns the results:
    sizes, each system's timing, (b)'s and (c)'s agreement with (a), (c)'s breakdown."""
    if not docs:
        raise ValueError("no documents to encode")
    device = str(embedder.device)
    texts = [d.text for d in docs]
    n_tokens = count_tokens(embedder, texts)
    settings = config.settings or channel_settings(config.channels, device)
    plan = BuildPlan.make(settings, embedder, config.top_k, config.shard_size).shards
    corpus = write_corpus(docs, work / "corpus.jsonl")
    longest = sorted(range(len(docs)), key=lambda i: -len(texts[i]))[: config.plain_batch]
    warm_docs = [docs[i] for i in longest]

    body = plain_body(embedder, config.plain_dtype)
    embedder.runtime()  # the engine's runtime built (a bf16 copy, the prefix's keys and values) before any timing
    # warm-ups, not timed: first allocations, kernel choices, Numba's compiles, FAISS's import
    plain_encode(embedder, body, [d.text for d in warm_docs], plan.k, config.plain_batch)
    engine_encode(embedder, warm_docs, plan)
    engine_build(embedder, write_corpus(warm_docs, work / "warm.jsonl"), work / "warm-index", settings, config.top_k,
                 config.compact, config.shard_size)

    timings: dict[str, Timing] = {}
    with timed(device, len(docs), n_tokens) as timings["plain"]:
        plain = plain_encode(embedder, body, texts, plan.k, config.plain_batch, config.progress)
    del body
    with timed(device, len(docs), n_tokens) as timings["engine encode"]:
        encoded = engine_encode(embedder, docs, plan, config.progress)
    targets = breakdown_targets(embedder) if config.breakdown else {}
    with wrapped(targets, is_cuda(device)) as sections, timed(device, len(docs), n_tokens) as timings["engine build"]:
        manifest = engine_build(embedder, corpus, work / "index", settings, config.top_k, config.compact, config.shard_size, config.progress)
    built = index_outputs(work / "index")
    if json.loads((work / "index" / "doc_ids.json").read_text(encoding="utf-8")) != [d.doc_id for d in docs]:
        raise RuntimeError("the index's documents are not the corpus's, in order")

    results: dict = {
        "n_docs": len(docs),
        "n_tokens": n_tokens,
        "mean_tokens_per_doc": round(n_tokens / len(docs), 2),
        "plain_padded_tokens": padded_tokens(embedder, texts, config.plain_batch),
        "manifest_n_tokens": manifest.build.get("n_tokens"),
        "k": plan.k,
        "systems": {name: t.to_dict() for name, t in timings.items()},
        "agreement": {"engine encode": agreement(plain, encoded), "engine build": agreement(plain, built)},
        "build": {key: manifest.build.get(key) for key in ("seconds", "encode_seconds", "invert_seconds", "docs_per_s", "tokens_per_s", "n_tokens")},
        "channels": list(plan_channels(settings)),
        "compact": config.compact,
    }
    results["ratio_to_plain"] = {name: round(t.docs_per_s / timings["plain"].docs_per_s, 3) for name, t in timings.items()}
    if config.breakdown:
        results["breakdown"] = breakdown(sections, manifest, timings["engine build"].seconds)
    return results


def plan_channels(settings: dict) -> tuple[str, ...]:
    """The channels a build with these settings holds, in table order (sparse always)."""
    return tuple(s.mode for s in CHANNEL_SPECS if s.required or s.mode in settings)


# ------------------------------------------------------------------ reporting
COLUMNS = ["system", "docs/s", "tokens/s", "seconds", "x plain", "top-K equal", "top-K overlap mean", "cos min", "cos mean",
           "hours per 1M docs", "peak GPU GiB"]


def table_rows(results: dict) -> list[list]:
    """One row per system (see :data:`COLUMNS`); the plain loop's agreement with itself is 1."""
    rows = []
    for name in SYSTEMS:
        t = results["systems"][name]
        agree = results["agreement"].get(name, {"equal_fraction": 1.0, "overlap_mean": 1.0, "cos_min": 1.0, "cos_mean": 1.0})
        peak = t["peak_gpu_bytes"]
        rows.append([
            name, t["docs_per_s"], t["tokens_per_s"], round(t["seconds"], 2), results["ratio_to_plain"][name],
            round(agree["equal_fraction"], 4), round(agree["overlap_mean"], 4),
            round(agree["cos_min"], 5) if "cos_min" in agree else None, round(agree["cos_mean"], 5) if "cos_mean" in agree else None,
            round(t["hours_per_1m_docs"], 2), round(peak / 2**30, 2) if peak is not None else None,
        ])
    return rows


def markdown(columns: list[str], rows: list[list]) -> str:
    """A markdown table."""
    def cell(v: Any) -> str:
        return "" if v is None else f"{v:,}" if isinstance(v, int) and not isinstance(v, bool) else str(v)

    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    lines += ["| " + " | ".join(cell(v) for v in row) + " |" for row in rows]
    return "\n".join(lines)


def device_info(device: str) -> dict:
    """The accelerator a number was measured on (the CPU's description where there is none)."""
    info: dict = {"device": device, "torch": torch.__version__}
    if is_cuda(device):
        index = torch.device(device).index or 0
        props = torch.cuda.get_device_properties(index)
        info |= {"name": torch.cuda.get_device_name(index), "cuda": torch.version.cuda, "memory_gib": round(props.total_memory / 2**30, 1),
                 "multiprocessors": props.multi_processor_count}
    else:
        info["name"] = machine_info()["cpu"]
    return info


def description(results: dict, config: StudyConfig, embedder: Embedder, data: Sequence[Path]) -> str:
    """What the table measured, in words (the results file's description)."""
    cfg = embedder.config
    return (
        f"{results['n_docs']:,} documents of {', '.join(Path(p).name for p in data)} ({results['n_tokens']:,} prompt tokens, "
        f"{results['mean_tokens_per_doc']} a document; template + text up to max_length {cfg.max_length}), K={results['k']}. "
        f"plain: transformers {config.plain_dtype}, texts sorted by length, batches of {config.plain_batch}, {cfg.pooling} pooling, "
        f"LM head in fp32, top-K on the device, one host copy per batch. engine: runtime {embedder.runtime_name or 'torch-plain'} "
        f"{embedder.dtype}, batches of {cfg.batch_size}; 'engine encode' is build-index's per-shard encoding (shards of "
        f"{config.shard_size}), 'engine build' all of build_index ({', '.join(results['channels'])}; "
        f"{'compact' if config.compact else 'float32'}), top-K and embeddings read back from the index. Each warmed up once; "
        "top-K equal: fraction of documents with the same K token ids as the plain loop; cos: pooled embeddings against the plain "
        "loop's; hours per 1M docs: at this rate and this corpus's mean length."
    )


# ------------------------------------------------------------------ command line
def build_index_defaults() -> argparse.Namespace:
    """build-index's own defaults (its parser): what ``build-index --device cuda`` runs with."""
    from indexer.cli import parser as build_parser

    return build_parser().parse_args(["--corpus", "-", "--index", "-"])


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m experiments.cuda_encode", description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--data", action="append", type=Path, required=True, help="a corpus the indexer reads (a BEIR folder...); repeatable")
    p.add_argument("--max-docs", type=int, default=None, help="documents in all (the first ones; default: every document)")
    p.add_argument("--device", default=None, help="cuda or cpu (default: cuda when there is one)")
    p.add_argument("--model", default=None, help="default: build-index's")
    p.add_argument("--adapter", default=None, help="default: build-index's ('default')")
    p.add_argument("--dtype", default=None, help="the engine's precision (default: build-index's, auto: bf16 on a GPU that has it)")
    p.add_argument("--runtime", default=None, help="the engine's runtime (default: build-index's, auto)")
    p.add_argument("--batch-size", type=int, default=None, help="the engine's batch size (default: build-index's)")
    p.add_argument("--max-length", type=int, default=None, help="text tokens kept, every system (default: build-index's)")
    p.add_argument("--top-k", type=int, default=None, help="K, every system (default: build-index's, 512)")
    p.add_argument("--plain-batch", type=int, default=PLAIN_BATCH, help=f"the plain loop's batch size (default {PLAIN_BATCH})")
    p.add_argument("--plain-dtype", choices=("bf16", "fp32"), default=None, help="the plain loop's precision (default: bf16 on a GPU, fp32 on a CPU)")
    p.add_argument("--channels", default=DEFAULT_CHANNELS,
                   help=f"the build's channels (default {DEFAULT_CHANNELS}: the LLM's outputs, as the plain loop computes; 'default': build-index's default set)")
    p.add_argument("--no-compact", action="store_true", help="a float32 build (build-index --no-compact)")
    p.add_argument("--no-breakdown", action="store_true", help="time the build without wrapping its calls")
    p.add_argument("--work-dir", type=Path, default=None, help="where the corpus and indexes go (default: a temporary folder, removed after)")
    p.add_argument("--commit", default=None, help="the commit measured, where this checkout has no git history (a device call's copy)")
    p.add_argument("--quiet", action="store_true", help="no progress bars")
    p.add_argument("--out", type=Path, required=True, help="results JSON (a table: benchmarks/tables.py)")
    return p


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    defaults = build_index_defaults()
    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    settings = {"max_length": args.max_length or defaults.max_length, "batch_size": args.batch_size or defaults.batch_size,
                "fold_all_caps": not defaults.keep_case}
    embedder = Embedder.load(args.model or defaults.model, adapter=args.adapter or defaults.adapter, device=device,
                             dtype=args.dtype or defaults.dtype, runtime=args.runtime or defaults.runtime, settings=settings)
    embedder.resolve_runtime()
    print(embedder.runtime_summary(), file=sys.stderr)
    channels = channel_set.default_channels() if args.channels == "default" else channel_set.parse_channels(args.channels)
    config = StudyConfig(
        plain_batch=args.plain_batch, plain_dtype=args.plain_dtype or ("bf16" if is_cuda(device) else "fp32"),
        top_k=args.top_k or defaults.top_k, channels=channels, compact=not args.no_compact and defaults.compact,
        shard_size=defaults.shard_size, progress=not args.quiet, breakdown=not args.no_breakdown,
        settings=channel_settings(channels, device),
    )
    docs = read_documents(args.data, args.max_docs)
    work = args.work_dir or Path(tempfile.mkdtemp(prefix="cuda-encode-"))
    try:
        results = run_study(embedder, docs, work, config)
    finally:
        if args.work_dir is None:
            shutil.rmtree(work, ignore_errors=True)
    dev = device_info(device)
    command = study_command("experiments.cuda_encode", argv)
    commit = git_commit()
    if args.commit:
        commit = {**commit, "sha": args.commit, "given": True}
    rows = table_rows(results)
    details = {
        **results, "device": dev, "commit": commit, "command": command,
        "embedder": {"model": embedder.identity, "adapter": embedder.adapter, "embedding": embedder.config.to_dict(),
                     "runtime": {"name": embedder.runtime_name, "dtype": embedder.dtype}},
        "plain": {"dtype": config.plain_dtype, "batch": config.plain_batch, "lm_head": "fp32", "pooling": embedder.config.pooling},
        "data": [str(p) for p in args.data],
    }
    title = f"Document encoding on {dev['name']}: the engine (build-index) against a plain transformers loop"
    write_table(args.out, title, command, description(results, config, embedder, args.data), COLUMNS, rows, details=details)
    print(f"{title} ({results['n_docs']:,} documents, {results['n_tokens']:,} tokens; commit {commit.get('sha')})")
    print(markdown(COLUMNS, rows))
    if "breakdown" in results:
        b = results["breakdown"]
        parts = ", ".join(f"{label} {b[label]['host_s']} s host" + (f" / {b[label]['gpu_s']} s GPU" if b[label]["gpu_s"] is not None else "")
                          for label in ("forward", "lm_head_topk", "tokenise") if label in b)
        print(f"engine build breakdown: {parts}; rest of the encode loop {b['encode_other_s']} s; after encoding {b['after_encoding_s']} s "
              f"(inversion {b['invert_s']} s) of {b['wall_s']} s")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
