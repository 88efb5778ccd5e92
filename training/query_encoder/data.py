"""The texts and cached states a query-encoder distillation learns from (issue 28).

The teacher is the engine's embedder reading a text with its query template: its pooled state
h is the dense query embedding and, through the LM head, the logits the top-M expansion is taken
from (text-is-worth-several-tokens Eq. 16). The student (embedder/query_encoder.py) is the
packaged all-MiniLM-L6-v2, frozen, whose sentence embedding the encoder channel computes for
every query anyway, followed by a small trained head that maps it to h. One MiniLM forward then
serves the encoder channel, the dense channel and the aligned-token expansion.

Training texts are never evaluation queries: anchors of ../shared/data/pairs (short texts of
five sources) and sentences of the shared collections' *documents*; any text equal to a query
of those collections is dropped. The teacher's states and the student's inputs are computed
once and cached per text (embedder/cache.py), so a rerun or a longer training costs no encoding.
"""
from __future__ import annotations

import csv
import json
import logging
import random
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

log = logging.getLogger(__name__)

PAIR_FILES = ("debian.tsv", "wikisimple.tsv", "medquad.tsv", "snli.tsv", "scitldr.tsv")
_SENTENCE_END = re.compile(r"(?<=[.!?])\s+(?=[A-Z0-9])")


def _norm(text: str) -> str:
    return " ".join(text.lower().split())


def evaluation_queries(collections: Sequence[Path]) -> set[str]:
    """Normalised texts of every query of ``collections`` (BEIR folders): never trained on."""
    out: set[str] = set()
    for c in collections:
        path = Path(c) / "queries.jsonl"
        if path.exists():
            with open(path, encoding="utf-8") as f:
                out.update(_norm(json.loads(line).get("text", "")) for line in f if line.strip())
    return out


def pair_anchors(pairs_dir: Path, per_file: int, rng: random.Random) -> list[str]:
    """Up to ``per_file`` distinct anchors (the query-like side) of each pairs file."""
    csv.field_size_limit(1 << 24)
    texts: list[str] = []
    for name in PAIR_FILES:
        path = Path(pairs_dir) / name
        if not path.exists():
            continue
        with open(path, encoding="utf-8", newline="") as f:
            rows = [r.get("anchor", "") for r in csv.DictReader(f, delimiter="\t", quoting=csv.QUOTE_NONE)]
        anchors = list(dict.fromkeys(a.strip() for a in rows if a and 2 <= len(a.split()) <= 64))
        rng.shuffle(anchors)
        texts += anchors[:per_file]
    return texts


def document_sentences(collections: Sequence[Path], per_collection: int, rng: random.Random) -> list[str]:
    """Up to ``per_collection`` sentences (4-48 words) drawn from each collection's documents."""
    texts: list[str] = []
    for c in collections:
        path = Path(c) / "corpus.jsonl"
        if not path.exists():
            continue
        sentences: list[str] = []
        with open(path, encoding="utf-8") as f:
            for line in f:
                doc = json.loads(line)
                body = " ".join(x for x in (doc.get("title", ""), doc.get("text", "")) if x)
                sentences += [s for s in _SENTENCE_END.split(body) if 4 <= len(s.split()) <= 48]
        sentences = list(dict.fromkeys(sentences))
        rng.shuffle(sentences)
        texts += sentences[:per_collection]
    return texts


def without_evaluation_queries(texts: Sequence[str], collections: Sequence[Path]) -> list[int]:
    """Positions of ``texts`` that equal (normalised) no query of ``collections``."""
    banned = evaluation_queries(collections)
    return [i for i, t in enumerate(texts) if _norm(t) not in banned]


def training_texts(pairs_dir: Path, collections: Sequence[Path], per_file: int, per_collection: int, seed: int = 0) -> list[str]:
    """The distillation texts: pair anchors and document sentences, minus any evaluation query, shuffled."""
    rng = random.Random(seed)
    texts = pair_anchors(pairs_dir, per_file, rng) + document_sentences(collections, per_collection, rng)
    texts = list(dict.fromkeys(texts))
    texts = [texts[i] for i in without_evaluation_queries(texts, collections)]
    rng.shuffle(texts)
    return texts


def teacher_states(embedder, texts: Sequence[str], cache_root: Path, progress: bool = True) -> np.ndarray:
    """The teacher's pooled query states h (n, d), through a per-text cache under ``cache_root``."""
    from embedder.cache import ArrayCache, cached_arrays, embedder_key

    cache = ArrayCache(Path(cache_root) / "teacher" / embedder_key(embedder, "query"))
    return cached_arrays(cache, list(texts), lambda part: embedder.embed(part, role="query"), (embedder.dim,), desc="teacher states")


def student_inputs(encoder, texts: Sequence[str], cache_root: Path, progress: bool = True) -> np.ndarray:
    """The frozen encoder's normalised embeddings (n, d_enc), through a per-text cache."""
    from embedder.cache import ArrayCache, cached_arrays

    cache = ArrayCache(Path(cache_root) / "inputs" / encoder.identity["sha256"][:20])
    return cached_arrays(cache, list(texts), lambda part: encoder.encode(list(part)), (encoder.dim,), desc="encoder inputs")


INPUTS_FORMAT = 1


def save_inputs(path: Path, texts: Sequence[str], x: np.ndarray, encoder_identity: dict) -> Path:
    """Write the distillation's texts and their sentence embeddings ``x`` (n, d) to one file, for a
    machine that has the teacher but not the sentence encoder (a GPU machine: ``--inputs``).

    ``x`` is stored as int8 with one scale per row (a quarter of float32's bytes): the rows are
    unit vectors, and each component's rounding error is at most half a step of 1/127 of the row's
    largest one (:func:`load_inputs` gives the cosine to the original in its ``fidelity``).
    Written to a temporary file, then renamed.
    """
    import os

    x = np.asarray(x, np.float32)
    if len(texts) != len(x):
        raise ValueError(f"{len(texts)} texts but {len(x)} embeddings")
    scale = np.maximum(np.abs(x).max(axis=1, keepdims=True), 1e-12) / 127.0
    q = np.clip(np.rint(x / scale), -127, 127).astype(np.int8)
    back = q.astype(np.float32) * scale
    cos = (back * x).sum(1) / np.maximum(np.linalg.norm(back, axis=1) * np.linalg.norm(x, axis=1), 1e-12)
    meta = {"format": INPUTS_FORMAT, "encoder": encoder_identity, "n": len(texts), "dim": int(x.shape[1]),
            "fidelity": {"min_cosine": float(cos.min()), "mean_cosine": float(cos.mean())}}  # fmt: skip
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}.npz")
    np.savez_compressed(tmp, meta=np.asarray(json.dumps(meta)), texts=np.asarray(json.dumps(list(texts))), q=q, scale=scale.astype(np.float32))
    os.replace(tmp, path)
    return path


def load_inputs(path: Path) -> tuple[list[str], np.ndarray, dict]:
    """The texts, their sentence embeddings (float32, de-quantised) and the file's record
    (encoder identity, fidelity) written by :func:`save_inputs`."""
    with np.load(Path(path)) as f:
        meta = json.loads(str(f["meta"]))
        if meta.get("format") != INPUTS_FORMAT:
            raise ValueError(f"{path}: distillation inputs of format {meta.get('format')}, this code reads {INPUTS_FORMAT}")
        texts = json.loads(str(f["texts"]))
        x = f["q"].astype(np.float32) * f["scale"]
    return texts, x, meta


@dataclass
class RaggedStates:
    """Each text's token states, concatenated: rows ``offsets[i]:offsets[i + 1]`` of ``flat`` are text i's."""

    flat: np.ndarray  # (N, d) float16: half the memory; the student computes in float32
    offsets: np.ndarray  # (n + 1,) int64

    def __len__(self) -> int:
        return len(self.offsets) - 1

    def lengths(self) -> np.ndarray:
        return np.diff(self.offsets)

    def batch(self, rows: Sequence[int]) -> tuple[np.ndarray, np.ndarray]:
        """The rows' states padded to the longest: (states (B, S, d) float32, mask (B, S) float32)."""
        rows = np.asarray(rows, np.int64)
        lengths = self.offsets[rows + 1] - self.offsets[rows]
        states = np.zeros((len(rows), max(1, int(lengths.max(initial=0))), self.flat.shape[1]), np.float32)
        mask = np.zeros(states.shape[:2], np.float32)
        for j, (start, n) in enumerate(zip(self.offsets[rows], lengths)):
            states[j, :n], mask[j, :n] = self.flat[start : start + n], 1.0
        return states, mask


def encoder_token_states(encoder, texts: Sequence[str], cache_root: Path, max_tokens: int, batch_size: int = 64,
                         progress: bool = True) -> RaggedStates:  # fmt: skip
    """The sentence encoder's last-layer token states of each text (its first ``max_tokens``, as a
    student reads them: :meth:`embedder.query_encoder.DistilledQueryEncoder.states`), cached as one
    file per (encoder, texts, max_tokens) under ``cache_root`` (written to a temporary file, then renamed)."""
    import hashlib
    import os

    from tqdm.auto import tqdm

    key = hashlib.sha256(json.dumps([encoder.identity.get("sha256"), max_tokens, list(texts)]).encode()).hexdigest()[:20]
    path = Path(cache_root) / "encoder-tokens" / f"{key}.npz"
    if path.exists():
        with np.load(path) as f:
            return RaggedStates(f["flat"], f["offsets"])
    order = np.argsort([len(t) for t in texts], kind="stable")  # little padding inside a batch
    parts: list[np.ndarray | None] = [None] * len(texts)
    for start in tqdm(range(0, len(texts), batch_size), desc="encoder token states", unit="batch", disable=not progress):
        rows = order[start : start + batch_size]
        _, states, mask = encoder.encode_with_tokens([texts[i] for i in rows])
        for j, i in enumerate(rows):
            parts[i] = states[j, : min(int(mask[j].sum()), max_tokens)].astype(np.float16)
    offsets = np.concatenate([[0], np.cumsum([len(p) for p in parts])]).astype(np.int64)
    flat = np.concatenate(parts) if parts else np.zeros((0, encoder.dim), np.float16)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}.npz")
    np.savez(tmp, flat=flat, offsets=offsets)
    os.replace(tmp, path)
    return RaggedStates(flat, offsets)


__all__ = [
    "PAIR_FILES", "RaggedStates", "document_sentences", "encoder_token_states", "evaluation_queries", "load_inputs", "pair_anchors",
    "save_inputs", "student_inputs", "teacher_states", "training_texts", "without_evaluation_queries",
]
