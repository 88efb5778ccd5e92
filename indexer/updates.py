"""Add, replace and delete documents of a built index, encoding only what is new.

An update is a new generation of the index (indexer/generations.py), as a rebuild is: the
documents kept are read back from the current generation (their aligned tokens from the
postings, their vectors from the FAISS indexes, their text from the stored documents,
indexer/stored_documents.py), the added ones are encoded, and every channel is written again
from both into a staging directory that is published in one rename. So:

- the result is the index a full build of the final corpus would give: kept documents in
  their order, then the added ones in theirs; BM25 (whose idf and average length change with
  every document) is recomputed from the stored texts. tests/test_updates.py checks it
  against a rebuild, channel by channel;
- a crash at any moment (kill -9 included) leaves the last published generation, verified
  and loadable; running the update again completes it;
- readers (a running ``serve``, a Retriever) keep the generation they hold until they reload.

The cost: encoding the added documents (the only model work), then rewriting the index files
(no model; ~linear in the index size). Batch many changes into one update where you can. The
dense channels must be able to give their vectors back (FAISS Flat or HNSW, the defaults; an
IVF or PQ index cannot, and is refused with a message to rebuild; a compact index's SQ8 can).

Semantics, as in the engines users know: an added document whose id is already indexed
replaces it (an upsert); a deleted id that is not indexed is reported, not an error; a
document both deleted and added in one update is replaced.
"""
from __future__ import annotations

import json
import os
import stat
import time
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import asdict, dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
from tqdm.auto import tqdm

from indexer.calibration_channels import calibrate_index, carried, stale
from indexer.channels import (
    CHANNEL_SPECS,
    LLM_EMBEDDINGS,
    LLM_TOKENS,
    LM_HEAD,
    SENTENCE_ENCODER,
    ChannelSpec,
    encoders_by_mode,
    sentence_encoder_specs,
    spec,
)
from indexer.compact import compact_as_recorded
from indexer.corpus import CorpusError, Document
from indexer.dense import DenseIndex, normalise
from indexer.diskspace import write_bytes
from indexer.generations import build_lock, publish_staged, stage
from indexer.generations import sweep as sweep_generations
from indexer.integrity import record_files
from indexer.inverted_index import InvertedIndex
from indexer.lexical import BM25Builder, make_analyzer
from indexer.manifest import DOC_IDS, IndexFormatError, Manifest
from indexer.reader import open_index, verify_generation
from indexer.shard_encoder import ShardPlan, chunks, encode_shard
from indexer.staging import staging_dir
from indexer.stored_documents import StoredDocuments, stored_line, write_documents

if TYPE_CHECKING:
    from embedder.encoder import Embedder
    from embedder.sentence_encoder import SentenceEncoder

# documents encoded at once: bounds the memory of a large update (as a build's shard does)
UPDATE_CHUNK = 1024
# the channels of one vector per document (or window), read back from FAISS and written again with
# the added documents' vectors (indexer/channels.py: query kind "dense"), and BM25, recomputed from the texts
DENSE_SPECS: tuple[ChannelSpec, ...] = tuple(s for s in CHANNEL_SPECS if s.query_kind == "dense")
BM25 = spec("bm25")


class UpdateError(ValueError):
    """The index cannot be updated in place (the message says why and what to do)."""


@dataclass
class UpdateReport:
    """What an update did."""

    added: int  # new ids
    replaced: int  # ids that were indexed and are now the added document
    deleted: int  # ids removed (not replaced)
    not_found: list[str] = field(default_factory=list)  # deleted ids that were not indexed
    n_docs: int = 0  # documents in the index now
    generation: str = ""  # the generation published (directory name)
    encode_seconds: float = 0.0
    merge_seconds: float = 0.0
    seconds: float = 0.0
    published: bool = True  # False: nothing changed (only ids that are not indexed were deleted), nothing was written

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass
class _Kept:
    """The current generation's documents that stay, as arrays in doc-number order."""

    numbers: np.ndarray  # their doc numbers in the current generation
    tokens: np.ndarray | None  # (n, K) int32; None: the index holds no aligned tokens
    weights: np.ndarray | None  # (n, K) float32
    dense: dict[str, np.ndarray]  # channel file name -> rows (normalised, projected where projected)
    rows: np.ndarray | None  # multi-vector indexes: the kept document (new number) of each dense row


# an added document's stored form (its id, title, text and metadata as one JSON line) may hold at most this many
# bytes (update_index's max_document_bytes, update-index --max-document-bytes, serve --max-document-bytes): a write
# of one huge document would hold the encoder (and the server's memory) for minutes
MAX_DOCUMENT_BYTES = 1 << 20


@dataclass
class PreparedUpdate:
    """An update checked and encoded, not yet published (:func:`prepare_update`): encoding, the only
    model work, runs without the index's write lock; :func:`publish_update` takes the lock."""

    target: Path
    added: list[Document]
    deleted: list[str]
    new: _New | None  # the added documents' arrays (None: nothing added)
    encoding: str | None  # the manifest settings they were encoded with (_encoding_key): checked again under the lock
    embedder: Embedder | None
    encode_seconds: float
    start: float
    verified: str | None = None  # the generation whose checksums were read before encoding (not read again under the lock)
    # the fusion calibration read again before the lock (indexer/calibration_channels.py); None: the last one carried forward
    calibration: dict | None = None


def update_index(
    index_dir: str | os.PathLike[str],
    add: Iterable[Document] = (),
    delete: Iterable[str] = (),
    embedder: Embedder | None = None,
    encoder: SentenceEncoder | None = None,
    progress: bool = True,
    encoders: Mapping[str, SentenceEncoder] | None = None,
    max_document_bytes: int = MAX_DOCUMENT_BYTES,
    recalibrate: bool = False,
) -> UpdateReport:
    """Add (or replace) ``add`` and remove ``delete`` from the index at ``index_dir``; publish
    the result as its next generation and return what was done.

    ``embedder``/``encoders``: the models that encode the added documents (``encoders``: the sentence
    encoders by channel, any of its names; ``encoder``: the ``encoder`` channel's, a shorthand);
    loaded from the manifest when not given (and only when there is something to encode). They must
    be the models the index was built with (checked, as a search checks them).

    The added documents are checked (``max_document_bytes``: the most bytes a document's stored JSON
    line may hold) and encoded first, without the index's write lock; then, under it, the generation the
    update starts from is verified (every file's checksum, and the manifest's own) and a damaged one is
    refused by name, publishing nothing; an update that changes nothing (only ids that are not indexed to
    delete) publishes nothing either (``UpdateReport.published`` False).
    """
    return publish_update(prepare_update(index_dir, add, delete, embedder, encoder, progress, encoders, max_document_bytes, recalibrate))


def prepare_update(
    index_dir: str | os.PathLike[str],
    add: Iterable[Document] = (),
    delete: Iterable[str] = (),
    embedder: Embedder | None = None,
    encoder: SentenceEncoder | None = None,
    progress: bool = True,
    encoders: Mapping[str, SentenceEncoder] | None = None,
    max_document_bytes: int = MAX_DOCUMENT_BYTES,
    recalibrate: bool = False,
) -> PreparedUpdate:
    """The first half of :func:`update_index`: the added documents checked and encoded with the
    models the index's current manifest names, and the fusion calibration read again where it is
    stale or ``recalibrate`` asks; no lock is taken and nothing is written."""
    start = time.perf_counter()
    given = encoders_by_mode(encoder, encoders)
    target = Path(index_dir)
    added = check_added(add, max_document_bytes)
    deleted = list(dict.fromkeys(_delete_id(d, i) for i, d in enumerate(delete, start=1)))
    new, key, encode_seconds = None, None, 0.0
    verified = None
    if added:
        opened = open_index(target)
        try:
            manifest = opened.manifest
            _check_updatable(target, manifest)
            # a damaged index is refused before minutes of encoding (publish_update does not read the same generation's checksums twice)
            verify_generation(target, opened, "nothing was encoded, updated or published")
            verified = opened.path.name
        finally:
            opened.close()
        t0 = time.perf_counter()
        new = _encode(added, manifest, embedder, given, progress)
        encode_seconds = time.perf_counter() - t0
        key = _encoding_key(manifest)
    calibration = _recalibrated(target, len(added), deleted, recalibrate, given, getattr(embedder, "tokenizer", None))
    return PreparedUpdate(target, added, deleted, new, key, embedder, round(encode_seconds, 3), start, verified, calibration)


def _recalibrated(target: Path, added: int, deleted: list[str], force: bool, encoders: dict, tokenizer) -> dict | None:
    """The index's fusion calibration read again off the generation the update starts from, where
    ``force`` or where the last one is stale (:func:`indexer.calibration_channels.stale`: the
    documents changed since, ``added`` and those of ``deleted`` it holds, pass a tenth of those it
    was read off); None: the last one is carried forward (an update that changes nothing never
    calibrates). Computed here, before the write lock: it encodes a few hundred sentences."""
    opened = open_index(target)
    try:
        held = set(opened.doc_ids)
        changed = added + sum(d in held for d in deleted)
        if not (force or (changed and stale(opened.manifest, changed))):
            return None
        try:
            return calibrate_index(opened.path, opened.manifest, encoders, tokenizer)
        except ValueError:  # a "tokens" analyser and no tokenizer at hand: the last calibration stays
            return None
    finally:
        opened.close()


def publish_update(prepared: PreparedUpdate) -> UpdateReport:
    """The second half of :func:`update_index`: under the index's write lock, the generation the update
    starts from verified, then the updated index written and published (nothing where nothing changes)."""
    target, added, deleted, new = prepared.target, prepared.added, prepared.deleted, prepared.new
    with build_lock(target):  # one writer at a time, builds included
        sweep_generations(target)
        opened = open_index(target)
        try:
            manifest, doc_ids = opened.manifest, opened.doc_ids
            _check_updatable(target, manifest)
            position = {d: i for i, d in enumerate(doc_ids)}
            replaced = {d.doc_id for d in added if d.doc_id in position}
            removed = {d for d in deleted if d in position} - replaced
            not_found = [d for d in deleted if d not in position]
            if not added and not removed:  # nothing changes: nothing is verified, written or published
                return UpdateReport(0, 0, 0, not_found, manifest.n_docs, opened.path.name, 0.0, 0.0,
                                    round(time.perf_counter() - prepared.start, 3), published=False)
            drop = np.zeros(len(doc_ids), bool)
            drop[[position[d] for d in replaced | removed]] = True
            if drop.all() and not added:
                raise UpdateError(f"{target}: the update would delete every document; an index holds at least one (delete the index instead)")
            if opened.path.name != prepared.verified:  # the generation the documents were encoded against was verified then
                verify_generation(target, opened, "nothing was updated or published")
            if added and _encoding_key(manifest) != prepared.encoding:
                raise UpdateError(f"{target}: rebuilt with other models or settings while the added documents were encoded; "
                                  "nothing was published: run the update again")
            kept = _read_kept(opened.path, manifest, opened.channels, np.flatnonzero(~drop))
            stored = StoredDocuments.open(opened.path, manifest.n_docs)
            kept_docs = [stored.document(int(i)) for i in kept.numbers]
            if any(d.doc_id != doc_ids[int(i)] for d, i in zip(kept_docs, kept.numbers)):
                raise IndexFormatError(f"{target}: its stored documents are not in the order of {DOC_IDS} (damaged); rebuild it")
            generation_path = opened.path
            t0 = time.perf_counter()
            with staging_dir(target, "building") as tmp:
                # the generation stays held (its files are read while the new one is written)
                out = _write(tmp, manifest, generation_path, kept, kept_docs, added, new, prepared.embedder)
                out.build = {**manifest.build, "last_update": {
                    "added": len(added) - len(replaced), "replaced": len(replaced), "deleted": len(removed),
                    "encode_seconds": prepared.encode_seconds, "based_on": generation_path.name,
                    "at": datetime.now(timezone.utc).isoformat(timespec="seconds"),
                }, "updates": int(manifest.build.get("updates", 0)) + 1}
                changed = len(added) + len(removed)
                out.calibration = ({**prepared.calibration, "changed_since": changed} if prepared.calibration is not None
                                   else carried(manifest, changed))
                out.files = record_files(tmp)
                out.write(tmp)  # last: a directory without a manifest is not an index
                gen = stage(tmp, target)
            merge_seconds = time.perf_counter() - t0
        finally:
            opened.close()
        publish_staged(gen, target, overwrite=True)
    return UpdateReport(
        added=len(added) - len(replaced), replaced=len(replaced), deleted=len(removed), not_found=not_found, n_docs=out.n_docs,
        generation=gen.name, encode_seconds=prepared.encode_seconds, merge_seconds=round(merge_seconds, 3),
        seconds=round(time.perf_counter() - prepared.start, 3),
    )


def _encoding_key(m: Manifest) -> str:
    """What the added documents' arrays depend on in a manifest: the models, their settings and the channels built."""
    return json.dumps([m.model, m.adapter, m.embedding, (m.record("sparse") or {}).get("top_k"), (m.segments or {}).get("max_segments"),
                       [s.mode for s in CHANNEL_SPECS if s.record(m) is not None],
                       [(s.record(m) or {}).get("sha256") for s in sentence_encoder_specs()]], sort_keys=True, default=str)


def _delete_id(value: object, i: int) -> str:
    """An id to delete, exactly as given (a number as the corpus readers turn a numeric id into one)."""
    if isinstance(value, int) and not isinstance(value, bool):
        return str(value)
    if not isinstance(value, str):
        raise TypeError(f"deleted id {i}: expected a string, got {type(value).__name__}")
    return value


def check_added(docs: Iterable[Document], max_document_bytes: int = MAX_DOCUMENT_BYTES) -> list[Document]:
    """The added documents, refusing an id given twice (which one would win is a guess), an empty
    text, metadata that is not strict JSON (NaN, Infinity, 1e400) and a document whose stored form
    would exceed ``max_document_bytes``."""
    if isinstance(max_document_bytes, bool) or not isinstance(max_document_bytes, int) or max_document_bytes < 1:
        raise ValueError(f"max_document_bytes must be a positive integer, not {max_document_bytes!r}")
    out, seen = [], set()
    for i, doc in enumerate(docs, start=1):
        if not isinstance(doc, Document):
            raise TypeError(f"added document {i}: expected indexer.corpus.Document, got {type(doc).__name__} (see document_from_object)")
        if doc.doc_id in seen:
            raise CorpusError("added documents", i, "id", f"duplicate id {doc.doc_id!r} in one update")
        if not doc.text.strip():
            raise CorpusError("added documents", i, "text", f"empty text for id {doc.doc_id!r}")
        size = len(stored_line(doc, "added documents", i))
        if size > max_document_bytes:
            raise CorpusError("added documents", i, None, f"document {doc.doc_id!r} is {size} bytes stored (id, title, text and metadata), "
                                                          f"more than the {max_document_bytes} a document may hold (max_document_bytes)")
        seen.add(doc.doc_id)
        out.append(doc)
    return out


def _check_updatable(target: Path, m: Manifest) -> None:
    if m.documents is None:
        raise UpdateError(f"{target}: built before indexes stored their documents, so it cannot be updated in place; rebuild it once with build-index --overwrite")


def _reconstruct(index: DenseIndex, where: Path) -> np.ndarray:
    """Every stored row of a FAISS index, in row order."""
    try:
        return index.index.reconstruct_n(0, index.index.ntotal)
    except RuntimeError as exc:  # IVF without a direct map, PQ: the vectors are not kept
        raise UpdateError(f"{where}: a FAISS index that cannot give its vectors back ({str(exc).splitlines()[0]}); "
                          "updates need a Flat or HNSW dense index: rebuild with --dense-kind Flat") from None


def _read_kept(path: Path, m: Manifest, channels: dict, keep: np.ndarray) -> _Kept:
    """The kept documents' aligned tokens (None: an index without them) and dense rows, read back from the generation."""
    tokens = weights = None
    sparse: InvertedIndex | None = channels.get("sparse")
    if sparse is not None:
        vectors = sparse.doc_vectors()[keep]
        k = int(m.record("sparse")["top_k"])
        counts = np.diff(vectors.indptr)
        if len(counts) and (counts != k).any():
            raise UpdateError(f"{path}: postings do not hold {k} tokens for every document; rebuild the index")
        tokens = vectors.indices.reshape(len(keep), k).astype(np.int32)
        weights = vectors.data.reshape(len(keep), k).astype(np.float32)
    dense, rows = {}, None
    for s in DENSE_SPECS:
        if s.mode not in channels:
            continue
        name = s.name
        index: DenseIndex = channels[s.mode]
        x = _reconstruct(index, path / f"{name}.faiss")
        if index.row_doc is None:
            dense[name] = x[keep]
            continue
        renumber = np.full(m.n_docs, -1, np.int64)
        renumber[keep] = np.arange(len(keep))
        mine = renumber[index.row_doc] >= 0
        dense[name] = x[mine]
        if rows is None:  # the first multi-vector channel's (every one of them has the same windows)
            rows = renumber[index.row_doc[mine]]
    return _Kept(keep, tokens, weights, dense, rows)


def needs_llm(m: Manifest) -> bool:
    """Whether encoding documents for the index of manifest ``m`` runs the LLM (its aligned tokens, its dense channels)."""
    return any(s.record(m) is not None for s in CHANNEL_SPECS if s.build_needs & {LLM_TOKENS, LLM_EMBEDDINGS, LM_HEAD})


def load_models(m: Manifest, embedder=None, encoders: Mapping[str, SentenceEncoder | None] | None = None) -> tuple[Embedder | None, dict[str, SentenceEncoder]]:
    """The manifest's embedder and the sentence encoders of its encoder channels (by channel
    mode), loaded where not given; checked where given. The embedder is None
    where no channel of the index needs the LLM (an index of BM25 and sentence encoders)."""
    from embedder.encoder import Embedder, EmbedderConfig

    if not needs_llm(m):
        embedder = None  # no channel of the index reads the LLM: it is neither loaded nor used (a given one is not read)
    elif embedder is None:
        config = EmbedderConfig(**{"fold_all_caps": False, **m.embedding})
        embedder = Embedder.load(m.model["name"], adapter=(m.adapter or {}).get("path", "none"), config=config)
    if embedder is not None:
        m.check_model(embedder.identity, embedder.adapter)
    loaded = {}
    for s in sentence_encoder_specs():
        info, encoder = s.record(m), (encoders or {}).get(s.mode)
        if info is None:
            continue
        if encoder is None:
            encoder = s.load_encoder(m, getattr(embedder, "device", None))
        else:
            m.check_encoder(encoder.identity, s.manifest_key)
        loaded[s.mode] = encoder
    return embedder, loaded


@dataclass
class _New:
    """The added documents' arrays, in their order (as a build's shards hold them)."""

    tokens: np.ndarray
    weights: np.ndarray
    embeddings: np.ndarray | None
    encoders: dict[str, np.ndarray]  # each sentence encoder's embeddings, by the channel's array name
    rows: np.ndarray | None  # multi-vector: the added document (0-based among the added) of each row
    n_tokens: int = 0

    def vectors(self, s: ChannelSpec) -> np.ndarray:
        """The added documents' vectors for dense channel ``s`` (before any projection)."""
        return self.encoders[s.name] if SENTENCE_ENCODER in s.build_needs else self.embeddings


def _encode(docs: list[Document], m: Manifest, embedder, encoders: Mapping[str, SentenceEncoder | None], progress: bool) -> _New:
    embedder, loaded = load_models(m, embedder, encoders)
    by_array = {spec(mode).name: encoder for mode, encoder in loaded.items()}
    windows = None
    if m.segments is not None:
        windows = m.segments.get("max_segments") or 0
    keep = any(s.record(m) is not None for s in CHANNEL_SPECS if LLM_EMBEDDINGS in s.build_needs)  # the LLM states kept
    sparse = m.record("sparse")
    plan = ShardPlan(int((sparse or {}).get("top_k", 1)), keep, UPDATE_CHUNK, windows, tokens=sparse is not None)
    parts: list[dict] = []
    n_tokens, base = 0, 0
    bar = tqdm(total=len(docs), unit="doc", desc="encoding added documents", disable=not progress)
    for chunk in chunks(docs, UPDATE_CHUNK):
        arrays, meta = encode_shard(chunk, embedder, by_array, plan, encoded=bar.update)
        if "row_docs" in arrays:
            arrays["row_docs"] = arrays["row_docs"] + base
        parts.append(arrays)
        n_tokens += meta["n_tokens"]
        base += len(chunk)
        bar.set_postfix(docs_per_s=f"{base / max(bar.format_dict['elapsed'], 1e-9):.1f}")
    bar.close()
    cat = lambda name: np.concatenate([p[name] for p in parts]) if name in parts[0] else None
    return _New(cat("tokens"), cat("weights"), cat("embeddings"), {a: cat(a) for a in by_array}, cat("row_docs"), n_tokens)


def _write(out: Path, m: Manifest, current: Path, kept: _Kept, kept_docs: list[Document], added: list[Document], new: _New | None, embedder) -> Manifest:
    """Every file of the updated index into ``out``; returns its manifest (files not yet recorded)."""
    sparse = m.record("sparse")
    vocab = int((sparse or {}).get("vocab_size", 0))

    def sparse_parts() -> Iterator[tuple[np.ndarray, np.ndarray]]:
        yield kept.tokens, kept.weights
        if new is not None:
            yield new.tokens, new.weights

    n_docs = len(kept_docs) + len(added)
    if sparse is not None:
        n_docs = InvertedIndex.write_from_shards(sparse_parts, vocab, out)
        # a compact index stays compact: the kept weights were read back dequantised, so they are quantised again at
        # the record's bits and levels and the doc numbers of format 4 or 5 encoded again (the manifest's sparse record kept)
        compact_as_recorded(out, n_docs, sparse)
    ids = [d.doc_id for d in kept_docs] + [d.doc_id for d in added]
    write_bytes(out / DOC_IDS, json.dumps(ids).encode("utf-8"))
    n_kept = len(kept_docs)
    rows = None
    if kept.rows is not None:
        rows = np.concatenate([kept.rows, (new.rows + n_kept) if new is not None else np.zeros(0, np.int64)])
    segments = m.segments
    if m.segments is not None and rows is not None:
        per_doc = np.bincount(rows, minlength=n_docs)
        segments = {**m.segments, "n_segments": len(rows), "max_per_doc": int(per_doc.max()), "docs_with_several": int((per_doc > 1).sum())}
    records = dict(m.channels)  # the aligned tokens' record kept; the others' as rewritten below
    for s in DENSE_SPECS:
        name, info = s.name, s.record(m)
        if info is None:
            continue
        if rows is not None and "n_vectors" in info:  # a multi-vector channel's count of vectors
            records[s.manifest_key] = {**info, "n_vectors": len(rows)}
        projection = None
        if os.path.lexists(current / f"{name}_projection.npy"):  # a projected channel (EmbedFilter's, from the LM head): kept as it was
            from indexer.integrity import load_npy

            projection = load_npy(current / f"{name}_projection.npy", "float32", 2, mmap=False)
        parts = [kept.dense[name]]
        if new is not None:
            fresh = new.vectors(s)
            parts.append(normalise(fresh @ projection if projection is not None else fresh))
        row_doc = rows if LLM_EMBEDDINGS in s.build_needs else None  # windows are the LLM's; the encoder reads each document once
        index = DenseIndex.build(np.concatenate(parts), info.get("kind", "Flat"), row_doc=row_doc)
        index.projection = projection
        index.save(out, name)
    lexical = BM25.record(m)
    bm25 = None
    if lexical is not None:
        tokenizer = None
        if lexical["analyzer"] == "tokens" and embedder is not None and needs_llm(m):
            tokenizer = embedder.tokenizer
        if lexical["analyzer"] == "tokens" and tokenizer is None:
            from embedder.encoder import EmbedderConfig
            from embedder.tokenization import TokenizerOnly

            tokenizer = TokenizerOnly.load(m.model["name"], (m.adapter or {}).get("path", "none"), EmbedderConfig(**{"fold_all_caps": False, **m.embedding})).tokenizer
        bm25 = BM25Builder(make_analyzer(lexical["analyzer"], tokenizer), k1=lexical.get("k1", 0.9), b=lexical.get("b", 0.4))

    def feed() -> Iterator[Document]:
        for doc in [*kept_docs, *added]:
            if bm25 is not None:
                bm25.add(doc.text)
            yield doc

    stored = write_documents(out, feed())
    if bm25 is not None:
        lex = bm25.finish()
        lex.save(out / BM25.name)
        compact_as_recorded(out / BM25.name, n_docs, lexical)  # as compact_copy or the build left them
        records[BM25.manifest_key] = {**lexical, "n_terms": len(lex.vocab)}
    corpus = {**m.corpus, "updated": True}
    return Manifest(
        model=m.model, adapter=m.adapter, embedding=m.embedding, channels=records, n_docs=n_docs, corpus=corpus,
        segments=segments, documents=stored, runtime=m.runtime, build=dict(m.build), format_version=m.format_version,
        created=datetime.now(timezone.utc).isoformat(timespec="seconds"),
    )


def read_delete_ids(path: Path) -> list[str]:
    """Ids to delete, one per line, each exactly as written: only the line's end (``\\n`` or ``\\r\\n``) is
    removed, so an id with a leading or trailing space is that id. Lines that are empty or only white
    space are skipped (no id is: the corpus readers refuse one). The file must be a regular file (a
    FIFO, a device such as /dev/zero, a directory: CorpusError at once, as the index loaders refuse
    one, indexer/regular_files.py) and is read up to the size it had when opened; CorpusError naming
    the line where one is not UTF-8."""
    path = Path(path)
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)  # a FIFO with no writer: no wait
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise CorpusError(path, None, None, "not a regular file (a FIFO, a device or a directory): ids to delete are read from a file")
        os.set_blocking(fd, True)
        with os.fdopen(os.dup(fd), "rb") as f:
            data = f.read(st.st_size)
    finally:
        os.close(fd)
    out = []
    for lineno, raw in enumerate(data.split(b"\n"), start=1):
        if raw.endswith(b"\r"):
            raw = raw[:-1]
        try:
            line = raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise CorpusError(path, lineno, "id", f"not valid UTF-8 (byte {raw[exc.start]:#04x} at column {exc.start + 1})") from None
        if line.strip():
            out.append(line)
    return out


__all__ = ["MAX_DOCUMENT_BYTES", "UPDATE_CHUNK", "PreparedUpdate", "UpdateError", "UpdateReport", "check_added", "load_models", "prepare_update", "publish_update",
           "read_delete_ids", "update_index"]
