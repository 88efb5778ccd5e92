"""Compact indexes (indexer/compact.py) against the float32 index they come from: bytes per
document and nDCG@10 per channel and hybrid (issue 53, item 2):
``python -m benchmarks.studies.compact_index --data ../shared/data/adi --data ../shared/data/medline --out benchmarks/results/compact-index/compact-index.json``.

Per collection (a BEIR folder):
1. the default index (build-index's defaults: smollm2-135m with its default adapter, the
   channels of ``indexer.channel_set.default_channels()``), built once and kept under
   ``--cache`` (a rerun reuses it: encoding is the slow part);
2. each compact variant written from it by :func:`indexer.compact.compact_copy` (no model:
   the float32 weights and vectors are read back and quantised), one per ``--variants`` entry
   ``QUANTISATION:DENSE_KIND[:packed][:kN]`` (per-list or global 8-bit impacts; a FAISS kind for the
   dense channels; ``packed``: doc numbers bit-packed too, format 4, indexer/packed_docs.py;
   ``kN``: only each document's top N aligned tokens kept, what a build with ``--top-k N`` writes);
3. the queries encoded once per operating point (profile ``best``: the LLM reads the query;
   ``fast``: the query's own tokens), then searched on every index: channels sparse (LLM
   query), dense, encoder, bm25, sparse (own tokens), and the two profiles' hybrids; nDCG@10
   with ranx (benchmarks/metrics.py), and the difference compact - float32.

Bytes per document: every file of the index divided by the number of documents, per file.
Fixed per-vocabulary files (``postings_indptr``, and the compact ``postings_scale`` /
``postings_offset``) weigh heavily on small collections; they are reported apart.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

import numpy as np

from benchmarks.datasets import load_beir_folder
from benchmarks.metrics import evaluate_run
from benchmarks.provenance import git_commit, load_avg, machine_info
from benchmarks.results_file import TABLE_KIND
from indexer.build import build_index
from indexer.channel_set import build_options, default_channels
from indexer.compact import QUANTISATIONS, compact_copy

DEFAULT_VARIANTS = "per-list:SQ8,per-list:SQfp16,global:SQ8"
# (label, profile, mode): the channels and hybrids measured
MEASURES = (
    ("sparse", "best", "sparse"),
    ("dense", "best", "dense"),
    ("encoder", "best", "encoder"),
    ("bm25", "best", "bm25"),
    ("sparse-own-tokens", "fast", "sparse"),
    ("hybrid-fast", "fast", "hybrid"),
    ("hybrid-best", "best", "hybrid"),
)
# files whose size does not grow with the documents (one entry per vocabulary token or term)
PER_VOCABULARY = ("postings_indptr.npy", "postings_scale.npy", "postings_offset.npy")


def parse_variants(text: str) -> list[tuple[str, str, bool, int | None]]:
    """``QUANTISATION:DENSE_KIND[:packed][:kN]`` entries, comma-separated, as (quantisation, dense
    kind, doc numbers bit-packed, tokens kept a document or None for all)."""
    out = []
    for item in text.split(","):
        parts = item.strip().split(":")
        quantisation, kind, rest = parts[0], parts[1] if len(parts) > 1 else "", parts[2:]
        packed = "packed" in rest
        ks = [r for r in rest if r.startswith("k") and r[1:].isdigit() and int(r[1:]) > 0]
        if quantisation not in QUANTISATIONS or not kind or len(ks) > 1 or len(rest) != int(packed) + len(ks) or rest.count("packed") > 1:
            raise ValueError(f"--variants: {item!r} is not QUANTISATION:DENSE_KIND[:packed][:kN] with QUANTISATION one of {QUANTISATIONS}")
        out.append((quantisation, kind, packed, int(ks[0][1:]) if ks else None))
    return out


def variant_name(quantisation: str, kind: str, packed: bool = False, top_k: int | None = None) -> str:
    return f"compact-{quantisation}-{kind}" + ("-packed" if packed else "") + (f"-k{top_k}" if top_k is not None else "")


def bytes_per_doc(index_dir: Path, n_docs: int) -> dict:
    """{file: bytes / document} of every file of the index (its current generation), with totals."""
    root = Path(index_dir).resolve()
    sizes = {p.relative_to(root).as_posix(): p.stat().st_size for p in sorted(root.rglob("*")) if p.is_file()}
    per_file = {rel: round(size / n_docs, 1) for rel, size in sizes.items()}
    fixed = sum(size for rel, size in sizes.items() if Path(rel).name in PER_VOCABULARY)
    text = sum(size for rel, size in sizes.items() if rel.startswith("documents"))
    total = sum(sizes.values())
    # the aligned-token postings' doc numbers and weights (docs or the packed files, weights), per-vocabulary files apart
    postings = sum(size for rel, size in sizes.items() if "/" not in rel and rel.startswith("postings_") and rel not in PER_VOCABULARY)
    return {
        "files": per_file,
        "sparse_postings": round(postings / n_docs, 1),
        "total": round(total / n_docs, 1),
        "total_without_per_vocabulary_files": round((total - fixed) / n_docs, 1),
        "total_without_per_vocabulary_files_and_text": round((total - fixed - text) / n_docs, 1),
    }


def bitpacked_docs_bytes(indptr: np.ndarray, docs: np.ndarray, block: int = 128) -> int:
    """What the doc numbers would take delta-coded and bit-packed (not built: issue 53's doc-id
    compression, estimated): per block of ``block`` postings of one list, the deltas (the first
    from the block's previous doc, or from -1) at the block's largest width, plus 5 bytes of
    block header (first doc number, width)."""
    indptr = np.asarray(indptr, np.int64)
    docs = np.asarray(docs, np.int64)
    if docs.size == 0:
        return 0
    lengths = np.diff(indptr)
    list_of = np.repeat(np.arange(lengths.size), lengths)
    pos = np.arange(docs.size) - indptr[list_of]
    prev = np.concatenate([[-1], docs[:-1]])
    prev[pos == 0] = -1
    delta = docs - prev
    starts = np.flatnonzero(pos % block == 0)
    width = np.ceil(np.log2(np.maximum.reduceat(delta, starts) + 1)).astype(np.int64)
    sizes = np.diff(np.append(starts, docs.size))
    return int(((width * sizes + 7) // 8).sum() + 5 * starts.size)


def ensure_float32(data: Path, cache: Path, models: dict, embedding_cache: Path | None, runtime: str = "auto", dtype: str = "auto") -> tuple[Path, dict]:
    """The default index of the collection, built unless the cache holds it; and how it was
    built this run ({} when it was cached). ``embedding_cache``: pooled document embeddings
    reused where the same model, adapter, settings and runtime encoded the same text before
    (embedder/cache.py); everything downstream of them (top-K, inversion, FAISS) is computed.
    ``runtime`` / ``dtype``: how the LLM encodes the documents (part of the embedding cache's key)."""
    out = cache / data.name / "float32"
    if (out / "manifest.json").exists():
        return out, {}
    if "embedder" not in models:
        from embedder.encoder import Embedder
        from embedder.sentence_encoder import SentenceEncoder

        options = build_options(default_channels())
        models["options"] = options
        models["embedder"] = Embedder.load("smollm2-135m", runtime=runtime, dtype=dtype)
        if embedding_cache is not None:
            from embedder.cache import CachedEmbedder

            models["embedder"] = CachedEmbedder(models["embedder"], embedding_cache)
        models["encoder"] = SentenceEncoder.load(options["encoder"]) if "encoder" in options else None
    options = {k: v for k, v in models["options"].items() if k != "encoder"}
    embedder = models["embedder"]
    before = (getattr(embedder, "hits", 0), getattr(embedder, "misses", 0))
    t0 = time.perf_counter()
    build_index(data, out, embedder, encoder=models["encoder"], progress=False, **options)
    return out, {"seconds": round(time.perf_counter() - t0, 1), "embedding_cache_hits": getattr(embedder, "hits", 0) - before[0],
                 "documents_encoded": getattr(embedder, "misses", 0) - before[1]}


def _run(retriever, encoded, qids: list[str], mode: str) -> dict:
    hits = retriever.search_encoded(encoded, k=100, mode=mode, explain=False)
    return {qid: {h.doc_id: float(h.score) for h in hs} for qid, hs in zip(qids, hits)}


def evaluate(indexes: dict[str, Path], queries: dict[str, str], qrels: dict) -> dict[str, dict[str, float]]:
    """{index name: {measure: nDCG@10}}: queries encoded once per profile on the first index."""
    from retriever.retriever import Retriever

    qids = list(queries)
    texts = [queries[q] for q in qids]
    out: dict[str, dict[str, float]] = {name: {} for name in indexes}
    for profile in ("best", "fast"):
        measures = [(label, mode) for label, p, mode in MEASURES if p == profile]
        first = next(iter(indexes.values()))
        with Retriever.load(first, profile=profile, warm=False) as ref:
            encoded = ref.encode(texts)
            embedder = ref.embedder
            for name, path in indexes.items():
                with Retriever.load(path, profile=profile, warm=False, embedder=embedder) as r:
                    for label, mode in measures:
                        if mode in r.modes:
                            out[name][label] = evaluate_run(qrels, _run(r, encoded, qids, mode), ["ndcg@10"])["ndcg@10"]
    return out


def measure(data: Path, cache: Path, variants: list[tuple[str, str, bool, int | None]], models: dict, embedding_cache: Path | None,
            runtime: str = "auto", dtype: str = "auto") -> dict:
    base, built = ensure_float32(data, cache, models, embedding_cache, runtime, dtype)
    indexes = {"float32": base}
    convert_s = {}
    for quantisation, kind, packed, top_k in variants:
        name = variant_name(quantisation, kind, packed, top_k)
        t0 = time.perf_counter()
        compact_copy(base, cache / data.name / name, dense_kind=kind, quantisation=quantisation, overwrite=True, pack_doc_ids=packed, top_k=top_k)
        convert_s[name] = round(time.perf_counter() - t0, 2)
        indexes[name] = cache / data.name / name
    ds = load_beir_folder(data)
    manifest = json.loads((base / "manifest.json").read_text())
    n_docs = manifest["n_docs"]
    b = base.resolve()
    indptr, docs = np.load(b / "postings_indptr.npy"), np.load(b / "postings_docs.npy", mmap_mode="r")
    packed = bitpacked_docs_bytes(indptr, docs)
    estimate = {"postings_docs_int32_bytes_per_doc": round(docs.nbytes / n_docs, 1), "bitpacked_bytes_per_doc": round(packed / n_docs, 1),
                "bits_per_posting": round(8 * packed / max(docs.size, 1), 2)}
    t0 = time.perf_counter()
    ndcg = evaluate(indexes, ds.queries, ds.qrels)
    return {
        "n_docs": n_docs, "n_queries": len(ds.queries), "channels": [c for c in ("dense", "lexical", "encoder") if manifest.get(c)],
        "runtime": f"{manifest.get('runtime', {}).get('name')} {manifest.get('runtime', {}).get('dtype')}", "float32_built_this_run": built,
        "float32_encode_seconds": manifest.get("build", {}).get("encode_seconds"), "convert_s": convert_s,
        "evaluate_s": round(time.perf_counter() - t0, 1),
        "bytes_per_doc": {name: bytes_per_doc(path, n_docs) for name, path in indexes.items()},
        "doc_id_compression_estimate": estimate,
        "ndcg@10": ndcg,
        "delta": {name: {m: round(v - ndcg["float32"][m], 4) for m, v in scores.items() if m in ndcg["float32"]}
                  for name, scores in ndcg.items() if name != "float32"},
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.studies.compact_index", description=__doc__.split("\n")[0])
    p.add_argument("--data", required=True, type=Path, action="append", help="a BEIR folder; repeatable")
    p.add_argument("--cache", type=Path, default=Path(".cache/compact-study"), help="where the indexes are kept between runs")
    p.add_argument("--embedding-cache", type=Path, default=Path(".cache/compact-study/embeddings"),
                   help="pooled document embeddings reused by the float32 builds (embedder/cache.py); 'none': encode everything")
    p.add_argument("--variants", default=DEFAULT_VARIANTS,
                   help=f"comma-separated QUANTISATION:DENSE_KIND[:packed][:kN] (kN: each document's top N aligned tokens kept; default {DEFAULT_VARIANTS})")
    p.add_argument("--runtime", default="auto", help="how the LLM encodes the documents of a float32 build not yet cached (auto, torch, openvino)")
    p.add_argument("--dtype", default="auto", help="its precision (auto, fp32, bf16...)")
    p.add_argument("--tolerance", type=float, default=0.003, help="the largest nDCG@10 loss accepted (issue 53)")
    p.add_argument("--out", required=True, type=Path, help="the table's JSON file")
    args = p.parse_args(argv)
    variants = parse_variants(args.variants)
    load_start = load_avg()
    models: dict = {}
    results = {}
    for data in args.data:
        results[data.name] = measure(data, args.cache, variants, models, None if str(args.embedding_cache) == "none" else args.embedding_cache,
                                     args.runtime, args.dtype)
        print(data.name, json.dumps({k: results[data.name][k] for k in ("ndcg@10", "delta")}), flush=True)
    names = [variant_name(*v) for v in variants]
    labels = [label for label, _, _ in MEASURES]
    rows = []
    for coll, r in results.items():
        for name in ["float32", *names]:
            b = r["bytes_per_doc"][name]
            cells = [f"{r['ndcg@10'][name].get(m, float('nan')):.4f}" + (f" ({r['delta'][name][m]:+.4f})" if name != "float32" and m in r["delta"][name] else "")
                     for m in labels]
            rows.append([coll, r["n_docs"], name, b["total_without_per_vocabulary_files_and_text"], b["total"], *cells])
    worst = {name: {m: min(r["delta"][name].get(m, 0.0) for r in results.values()) for m in labels} for name in names}
    table = {
        "kind": TABLE_KIND, "date": datetime.now(timezone.utc).isoformat(timespec="seconds"), "commit": git_commit(), "machine": machine_info(),
        "title": "Compact indexes: bytes per document and nDCG@10 against float32",
        "command": "python -m benchmarks.studies.compact_index " + " ".join(argv if argv is not None else sys.argv[1:]),
        "description": (
            f"Each collection's default index (channels {', '.join(default_channels())}, smollm2-135m with its default adapter) and its "
            "compact copies (indexer.compact.compact_copy: 8-bit impacts per posting list or global, and the dense channels as the FAISS "
            "kind named). nDCG@10 (ranx) of each channel and of the two profiles' hybrids, queries encoded once per profile "
            "(best: the LLM; fast: the query's own tokens) and searched on every index; in brackets compact - float32. Bytes per "
            "document: of the index's files without the per-vocabulary ones (postings_indptr, scale, offset) and the stored text "
            f"(documents.jsonl), then of everything. Load average at the start: {load_start}."
        ),
        "columns": ["collection", "docs", "index", "bytes/doc (postings + vectors)", "bytes/doc (all files)", *[f"nDCG@10 {m}" for m in labels]],
        "rows": rows,
        "worst_delta": worst,
        "within_tolerance": {name: all(v >= -args.tolerance for v in worst[name].values()) for name in names},
        "tolerance": args.tolerance,
        "details": results,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    partial = args.out.with_name(args.out.name + ".partial")
    partial.write_text(json.dumps(table, indent=2) + "\n")
    partial.replace(args.out)  # never half-written
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
