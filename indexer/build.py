"""Build an index directory: stream a corpus, embed it, keep top-K aligned tokens, invert.

The index is written into a hidden temporary directory beside the target and renamed
into place only when complete, so an interrupted build never leaves a directory that
loads as an index.
"""
from __future__ import annotations

import json
import logging
import os
import shutil
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING, Iterable, Iterator

import numpy as np
import torch
from tqdm.auto import tqdm

from embedder.encoder import Embedder
from indexer.corpus import CorpusSpec, Document
from embedder.embedfilter import embedfilter_projection
from indexer.dense import EMBEDFILTER_NAME, ENCODER_NAME, DenseIndex
from indexer.lexical import LEXICAL_DIR, BM25Builder, make_analyzer
from indexer.integrity import record_files
from indexer.inverted_index import InvertedIndex
from indexer.manifest import DOC_IDS, FORMAT_VERSION, MANIFEST, SEGMENTS_FORMAT_VERSION, Manifest
from indexer.segments import max_over_segments, split_segments
from indexer.staging import staging_dir

if TYPE_CHECKING:
    from embedder.sentence_encoder import SentenceEncoder

log = logging.getLogger(__name__)

# Chosen by the K sweep in BENCHMARKS.md (benchmarks/sweep_sparse.py, raw backbone, M=64, query
# weights 1): nDCG@10 peaks at K=512 on cisi (0.163; 0.155 at 128, 0.149 at 1024) and on medline
# (0.372; 0.358 at 256, 0.372 at 1024). The paper's 1000-3000 was for 4096-d models.
DEFAULT_TOP_K = 512


def _chunks(docs: Iterable[Document], size: int) -> Iterator[list[Document]]:
    chunk: list[Document] = []
    for d in docs:
        chunk.append(d)
        if len(chunk) == size:
            yield chunk
            chunk = []
    if chunk:
        yield chunk


def _count_lines(path: Path) -> int | None:
    try:
        with open(path, "rb") as f:
            return sum(1 for _ in f)
    except OSError:
        return None


def build_index(
    corpus: CorpusSpec | str | os.PathLike[str],
    index_dir: str | os.PathLike[str],
    embedder: Embedder,
    top_k: int = DEFAULT_TOP_K,
    dense: bool = False,
    dense_kind: str = "Flat",
    overwrite: bool = False,
    chunk_size: int = 1024,
    progress: bool = True,
    embedfilter_tau: int | None = None,
    lexical: str | None = None,
    encoder: "SentenceEncoder | None" = None,
    segments: bool = False,
    max_segments: int | None = None,
) -> Manifest:
    """Index ``corpus`` into ``index_dir`` with ``embedder``; returns the manifest written.

    Channels besides the aligned-token postings: ``dense`` (FAISS over the pooled embeddings),
    ``embedfilter_tau`` (a second dense index of EmbedFilter-projected embeddings, see
    embedder/embedfilter.py), ``lexical`` ("words" or "tokens": BM25 postings) and ``encoder``
    (a sentence-transformers model, embedder/sentence_encoder.py: its normalised embeddings in
    one more FAISS index, mode "encoder").

    ``segments``: multi-vector documents (indexer/segments.py). A document longer than the
    embedder's ``max_length`` tokens is read whole, as consecutive windows of that length (at
    most ``max_segments``); its sparse vector is each token's maximum over the windows and the
    dense channels hold one vector per window (a document scores as its best window).
    """
    spec = corpus if isinstance(corpus, CorpusSpec) else CorpusSpec(Path(corpus))
    target = Path(index_dir)
    if target.exists() and not overwrite:
        raise FileExistsError(f"{target} exists; pass overwrite=True (--overwrite) to replace it")
    if top_k < 1:
        raise ValueError("top_k must be positive")
    with staging_dir(target, "building") as tmp:  # also sweeps what killed builds left behind
        manifest = _build_into(spec, tmp, embedder, top_k, dense, dense_kind, chunk_size, progress, embedfilter_tau, lexical, encoder, segments, max_segments)
        _swap_into_place(tmp, target)
    return manifest


def _swap_into_place(tmp: Path, target: Path) -> None:
    if target.exists():
        old = target.with_name(f".{target.name}.old-{os.getpid()}")
        os.replace(target, old)
        os.replace(tmp, target)
        shutil.rmtree(old, ignore_errors=True)
    else:
        os.replace(tmp, target)


def _build_into(
    spec: CorpusSpec,
    out: Path,
    embedder: Embedder,
    top_k: int,
    dense: bool,
    dense_kind: str,
    chunk_size: int,
    progress: bool,
    embedfilter_tau: int | None,
    lexical: str | None,
    encoder: "SentenceEncoder | None" = None,
    segments: bool = False,
    max_segments: int | None = None,
) -> Manifest:
    keep_embeddings = dense or embedfilter_tau is not None
    bm25 = BM25Builder(make_analyzer(lexical, embedder.tokenizer)) if lexical else None
    ids: list[str] = []
    fwd_tokens: list[np.ndarray] = []
    fwd_weights: list[np.ndarray] = []
    embeddings: list[np.ndarray] = []
    encoder_embeddings: list[np.ndarray] = []
    encoder_seconds = 0.0
    row_docs: list[np.ndarray] = []  # with segments: the document number of each embedding row
    n_segments = 0
    n_tokens = 0
    encode_seconds = 0.0
    start = time.perf_counter()
    bar = tqdm(total=_count_lines(spec.file), unit="doc", desc=f"indexing {spec.path.name}", disable=not progress)
    k = min(top_k, embedder.vocab_size)
    with torch.inference_mode():
        for chunk in _chunks(spec, chunk_size):
            texts = [d.text for d in chunk]
            units, owner = split_segments(embedder, texts, max_segments) if segments else (texts, None)
            tok = np.zeros((len(units), k), np.int32)
            wts = np.zeros((len(units), k), np.float32)
            emb = np.zeros((len(units), embedder.dim), np.float32) if keep_embeddings else None
            t0 = time.perf_counter()
            for pos, h, ntok in embedder.iter_batches(units):
                tok[pos], wts[pos] = embedder.top_tokens(h, k)
                if emb is not None:
                    emb[pos] = h.cpu().numpy()
                n_tokens += ntok
                bar.update(len(pos) * len(texts) / len(units))  # in documents
                elapsed = encode_seconds + time.perf_counter() - t0
                bar.set_postfix(tok_per_s=f"{n_tokens / max(elapsed, 1e-9):.0f}")
            encode_seconds += time.perf_counter() - t0
            if owner is not None:
                tok, wts = max_over_segments(tok, wts, owner, len(texts), k)
                row_docs.append(owner + len(ids))
                n_segments += len(units)
            if encoder is not None:
                t0 = time.perf_counter()
                encoder_embeddings.append(encoder.encode(texts))
                encoder_seconds += time.perf_counter() - t0
            if bm25 is not None:
                for text in texts:
                    bm25.add(text)
            ids.extend(d.doc_id for d in chunk)
            fwd_tokens.append(tok)
            fwd_weights.append(wts)
            if emb is not None:
                embeddings.append(emb)
    bar.close()
    if not ids:
        raise ValueError(f"{spec.file}: no documents to index")
    t0 = time.perf_counter()
    inv = InvertedIndex.from_forward(np.concatenate(fwd_tokens), np.concatenate(fwd_weights), embedder.vocab_size)
    inv.save(out)
    invert_seconds = time.perf_counter() - t0
    (out / DOC_IDS).write_text(json.dumps(ids), encoding="utf-8")
    dense_info = ef_info = lexical_info = encoder_info = None
    all_emb = np.concatenate(embeddings) if keep_embeddings else None
    row_doc = np.concatenate(row_docs) if segments else None
    segments_info = None
    if segments:
        per_doc = np.bincount(row_doc, minlength=len(ids))
        segments_info = {
            "length": embedder.config.max_length, "max_segments": max_segments, "n_segments": int(n_segments),
            "max_per_doc": int(per_doc.max()), "docs_with_several": int((per_doc > 1).sum()),
            "sparse": "max over segments", "dense": "one vector per segment, document = best segment",
        }
    if dense:
        DenseIndex.build(all_emb, dense_kind, row_doc=row_doc).save(out)
        dense_info = {"kind": dense_kind, "dim": embedder.dim, "normalised": True, "metric": "inner_product"}
        if segments:
            dense_info["n_vectors"] = len(all_emb)
    if embedfilter_tau is not None:
        w_u = embedder.causal_lm.get_output_embeddings().weight.detach().float().cpu().numpy()
        proj, left, right = embedfilter_projection(w_u, embedfilter_tau)
        DenseIndex.build(all_emb, dense_kind, projection=proj, row_doc=row_doc).save(out, EMBEDFILTER_NAME)
        ef_info = {"tau": embedfilter_tau, "left": left, "right": right, "dim": right - left, "kind": dense_kind, "normalised": True}
    if encoder is not None:
        DenseIndex.build(np.concatenate(encoder_embeddings), dense_kind).save(out, ENCODER_NAME)
        encoder_info = {**encoder.describe(), "kind": dense_kind, "normalised": True, "metric": "inner_product"}
    if bm25 is not None:
        lex = bm25.finish()
        lex.save(out / LEXICAL_DIR)
        lexical_info = {"analyzer": lex.analyzer, "k1": lex.k1, "b": lex.b, "n_terms": len(lex.vocab)}
    total = time.perf_counter() - start
    manifest = Manifest(
        model=embedder.identity,
        adapter=embedder.adapter,
        embedding=embedder.config.to_dict(),
        runtime=embedder.runtime_info(),
        sparse={"top_k": k, "vocab_size": embedder.vocab_size, "weight": "logit"},
        n_docs=len(ids),
        corpus=spec.describe(),
        dense=dense_info,
        embedfilter=ef_info,
        lexical=lexical_info,
        encoder=encoder_info,
        segments=segments_info,
        format_version=SEGMENTS_FORMAT_VERSION if segments else FORMAT_VERSION,
        build={
            "seconds": round(total, 3),
            "encode_seconds": round(encode_seconds, 3),
            "invert_seconds": round(invert_seconds, 3),
            "docs_per_s": round(len(ids) / encode_seconds, 2),
            "tokens_per_s": round(n_tokens / encode_seconds, 1),
            "n_tokens": n_tokens,
            **({"encoder_seconds": round(encoder_seconds, 3)} if encoder is not None else {}),
            "device": embedder.device,
            "torch_threads": torch.get_num_threads(),
        },
        created=datetime.now(timezone.utc).isoformat(timespec="seconds"),
        files=record_files(out),
    )
    manifest.write(out)  # written last: a directory without a manifest is not an index
    return manifest


def index_size_bytes(index_dir: Path) -> int:
    """Bytes on disk of everything in an index directory."""
    return sum(p.stat().st_size for p in Path(index_dir).iterdir() if p.is_file())


__all__ = ["build_index", "DEFAULT_TOP_K", "DOC_IDS", "MANIFEST", "index_size_bytes"]
