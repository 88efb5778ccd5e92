"""Compact indexes (indexer/compact.py) against the float32 index they come from and against
today's default: bytes per document and nDCG@10 per channel and hybrid (issue 53, item 2):
``python -m experiments.compact_index --data ../shared/data/adi --data ../shared/data/medline --variants per-list:SQ8:range16:-dense:encoder2=SQ6 --out benchmarks/results/compact-index/x.json``.

Per collection (a BEIR folder):
1. the default index built as float32 (build-index's default channels and the LLM dense
   channel the default held before, smollm2-135m with its default adapter), built once and
   kept under ``--cache`` (a rerun reuses it: encoding is the slow part);
2. each compact variant written from it by :func:`indexer.compact.compact_copy` (no model:
   the float32 weights and vectors are read back and quantised), one per ``--variants`` entry
   ``QUANTISATION:DENSE_KIND[:packed|:range16][:kN][:lN][:CHANNEL=KIND...][:-CHANNEL...]``: per-list or
   global 8-bit impacts; a FAISS kind for the dense channels, or for one of them; doc numbers
   bit-packed (format 4, indexer/packed_docs.py) or range-blocked (format 5, indexer/range_docs.py);
   ``kN``: only each document's top N aligned tokens kept, what a build with ``--top-k N`` writes;
   ``lN``: the aligned-token impacts spread over N levels instead of 256 (``l16``: the precision of
   4-bit impacts; the codes still take a byte each, so the bytes are those of 256 levels); ``b4``:
   4-bit aligned-token impacts stored two a byte (format 6);
   ``-CHANNEL``: the channel left out. ``--reference`` (today's default build) is always one;
3. the queries encoded once per setup (the ``fast`` and ``best`` profiles: the query's own tokens
   and MiniLM or mpnet; ``llm``: the LLM reads the query, for its aligned tokens and dense channel),
   then searched on every index holding the channel: nDCG@10 with ranx (benchmarks/metrics.py),
   and the difference from the reference (and the reference's from float32).

Bytes per document: every file of the index divided by the number of documents, per file.
Files whose size does not grow with the documents (one entry per vocabulary token or term:
``postings_indptr``, the compact ``postings_scale`` / ``postings_offset``, format 5's
``postings_rangestart``, BM25's vocabulary) weigh heavily on small collections; they are
reported apart, as is the stored text.
"""
from __future__ import annotations

import argparse
import json
import time
from dataclasses import dataclass
from pathlib import Path

from benchmarks.datasets import load_beir_folder
from benchmarks.metrics import evaluate_run
from benchmarks.provenance import load_avg
from benchmarks.tables import study_command, table_header
from indexer.build import build_index
from indexer.channel_set import CHANNELS, build_options, default_channels
from indexer.channels import CHANNEL_SPECS, sentence_encoder_specs
from indexer.compact import QUANTISATIONS, compact_copy
from indexer.inverted_index import IMPACT_LEVELS
from indexer.manifest import Manifest

DEFAULT_VARIANTS = "per-list:SQ8,per-list:SQfp16,global:SQ8"
REFERENCE = "per-list:SQ8"  # today's default build (build-index with no flags before issue 53's size goal)
# (label, setup, mode): the channels and hybrids measured; a setup is how queries are encoded
# (SETUPS), once per collection on the float32 index, then searched on every index holding the mode
MEASURES = (
    ("sparse-own-tokens", "fast", "sparse"),
    ("encoder", "fast", "encoder"),
    ("bm25", "fast", "bm25"),
    ("hybrid-fast", "fast", "hybrid"),
    ("encoder2", "best", "encoder2"),
    ("hybrid-best", "best", "hybrid"),
    ("sparse", "llm", "sparse"),
    ("dense", "llm", "dense"),
)
# Retriever.load keywords of each setup: the two profiles, and the LLM reading the query (its
# aligned tokens and dense channel, what ``best`` does on an index without encoder2)
SETUPS = {"fast": {"profile": "fast"}, "best": {"profile": "best"}, "llm": {"profile": None, "query_encoder": "llm"}}
# files whose size does not grow with the documents (one entry per vocabulary token or term;
# postings_rangestart: one per token and range of 65,536 documents, 3 bytes a document at scale;
# bm25.json: the BM25 vocabulary, one entry per term)
PER_VOCABULARY = ("postings_indptr.npy", "postings_scale.npy", "postings_offset.npy", "postings_rangestart.npy", "bm25.json")


@dataclass(frozen=True)
class Variant:
    """A compact copy to write: ``compact_copy``'s arguments."""

    quantisation: str
    dense_kind: str  # every dense channel's FAISS kind, unless named in kinds
    doc_ids: str = "int32"  # int32 (format 3), packed (format 4) or range16 (format 5)
    top_k: int | None = None
    kinds: tuple[tuple[str, str], ...] = ()  # (channel, FAISS kind)
    drop: tuple[str, ...] = ()
    levels: int | None = None  # of the aligned-token impacts (None: all their bits hold)
    bits: int = 8  # of the aligned-token impacts

    @property
    def name(self) -> str:
        return (f"compact-{self.quantisation}-{self.dense_kind}" + ("" if self.doc_ids == "int32" else f"-{self.doc_ids}")
                + (f"-k{self.top_k}" if self.top_k is not None else "") + (f"-l{self.levels}" if self.levels is not None else "")
                + (f"-b{self.bits}" if self.bits != 8 else "")
                + "".join(f"-{c}={k}" for c, k in self.kinds)
                + "".join(f"-no-{c}" for c in self.drop))

    def copy(self, base: Path, out: Path) -> None:
        compact_copy(base, out, dense_kind=dict(self.kinds) if self.kinds else self.dense_kind, quantisation=self.quantisation, overwrite=True,
                     doc_layout={"packed": "stream", "range16": "range16"}.get(self.doc_ids), top_k=self.top_k, drop=self.drop,
                     impact_levels=self.levels, impact_bits=self.bits)


def parse_variant(item: str) -> Variant:
    """``QUANTISATION:DENSE_KIND[:packed|:range16][:kN][:lN][:b4][:CHANNEL=KIND...][:-CHANNEL...]``: per-list or
    global impacts, the dense channels' FAISS kind, how doc numbers are stored, each document's top N
    aligned tokens kept, their impacts' levels and bits, a dense channel's own kind, a channel left out."""
    parts = item.strip().split(":")
    quantisation, kind, rest = parts[0], parts[1] if len(parts) > 1 else "", parts[2:]
    doc_ids = [r for r in rest if r in ("packed", "range16")]
    ks = [r for r in rest if r.startswith("k") and r[1:].isdigit() and int(r[1:]) > 0]
    ls = [r for r in rest if r.startswith("l") and r[1:].isdigit() and 2 <= int(r[1:]) <= IMPACT_LEVELS]
    bs = [r for r in rest if r == "b4"]
    kinds = tuple(tuple(r.split("=", 1)) for r in rest if "=" in r)
    drop = tuple(r[1:] for r in rest if r.startswith("-") and len(r) > 1)
    if (quantisation not in QUANTISATIONS or not kind or len(ks) > 1 or len(ls) > 1 or len(bs) > 1 or len(doc_ids) > 1
            or len(rest) != len(doc_ids) + len(ks) + len(ls) + len(bs) + len(kinds) + len(drop)):
        raise ValueError(f"--variants: {item!r} is not QUANTISATION:DENSE_KIND[:packed|:range16][:kN][:lN][:b4][:CHANNEL=KIND...][:-CHANNEL...] "
                         f"with QUANTISATION one of {QUANTISATIONS} and N of lN from 2 to {IMPACT_LEVELS}")
    return Variant(quantisation, kind, doc_ids[0] if doc_ids else "int32", int(ks[0][1:]) if ks else None, kinds, drop,
                   int(ls[0][1:]) if ls else None, 4 if bs else 8)


def parse_variants(text: str) -> list[Variant]:
    """Comma-separated :func:`parse_variant` entries."""
    return [parse_variant(item) for item in text.split(",")]


def variant_name(quantisation: str, kind: str, packed: bool = False, top_k: int | None = None) -> str:
    return Variant(quantisation, kind, "packed" if packed else "int32", top_k).name


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


def base_channels() -> tuple[str, ...]:
    """The float32 index's channels: every channel of both profiles (``build-index --profile
    both``), and the LLM dense channel, which the default held before issue 53's size goal; each
    variant drops what it leaves out."""
    held = set(default_channels("both")) | {"dense"}
    return tuple(c for c in CHANNELS if c in held)


def ensure_float32(data: Path, cache: Path, models: dict, embedding_cache: Path | None, runtime: str = "auto", dtype: str = "auto") -> tuple[Path, dict]:
    """The default index of the collection, built unless the cache holds it; and how it was
    built this run ({} when it was cached). ``embedding_cache``: pooled document embeddings
    reused where the same model, adapter, settings and runtime encoded the same text before
    (embedder/cache.py); everything downstream of them (top-K, inversion, FAISS) is computed.
    ``runtime`` / ``dtype``: how the LLM encodes the documents (part of the embedding cache's key)."""
    out = cache / data.name / "float32"
    if (out / "manifest.json").exists() and set(held_channels(out)) == set(base_channels()):
        return out, {}  # a cached build of other channels (an earlier base set) is built again
    if "embedder" not in models:
        from embedder.encoder import Embedder
        from embedder.sentence_encoder import SentenceEncoder

        channels = base_channels()
        options = build_options(channels)
        # each channel's setting as build-index passes it, the sentence encoders loaded once
        settings = {s.mode: options[s.option] for s in CHANNEL_SPECS if s.mode in channels and not s.required}
        encoders = {r.mode for r in sentence_encoder_specs(settings)}
        models["channels"] = {mode: SentenceEncoder.load(v) if mode in encoders else v for mode, v in settings.items()}
        models["embedder"] = Embedder.load("smollm2-135m", runtime=runtime, dtype=dtype)
        if embedding_cache is not None:
            from embedder.cache import CachedEmbedder

            models["embedder"] = CachedEmbedder(models["embedder"], embedding_cache)
    embedder = models["embedder"]
    before = (getattr(embedder, "hits", 0), getattr(embedder, "misses", 0))
    t0 = time.perf_counter()
    build_index(data, out, embedder, progress=False, channels=models["channels"], overwrite=True)
    return out, {"seconds": round(time.perf_counter() - t0, 1), "embedding_cache_hits": getattr(embedder, "hits", 0) - before[0],
                 "documents_encoded": getattr(embedder, "misses", 0) - before[1]}


def _run(retriever, encoded, qids: list[str], mode: str) -> dict:
    hits = retriever.search_encoded(encoded, k=100, mode=mode, explain=False)
    return {qid: {h.doc_id: float(h.score) for h in hs} for qid, hs in zip(qids, hits)}


def held_channels(index_dir: Path) -> list[str]:
    """The channels an index holds, by its manifest."""
    from indexer.manifest import Manifest

    m = Manifest.read(Path(index_dir).resolve())
    return [s.mode for s in CHANNEL_SPECS if s.record(m) is not None]


def evaluate(indexes: dict[str, Path], queries: dict[str, str], qrels: dict) -> dict[str, dict[str, float]]:
    """{index name: {measure: nDCG@10}}: queries encoded once per setup on the first index (the
    float32 one, which holds every channel), searched on every index holding the measure's mode."""
    from retriever.profiles import fit_profile
    from retriever.retriever import Retriever

    qids = list(queries)
    texts = [queries[q] for q in qids]
    out: dict[str, dict[str, float]] = {name: {} for name in indexes}
    first = next(iter(indexes.values()))
    for setup, keywords in SETUPS.items():
        measures = [(label, mode) for label, where, mode in MEASURES if where == setup]
        with Retriever.load(first, warm=False, **keywords) as ref:
            if not any(mode in ref.modes for _, mode in measures):
                continue
            encoded = ref.encode(texts)
            for name, path in indexes.items():
                if keywords["profile"] and fit_profile(keywords["profile"], held_channels(path)) is not ref.profile:
                    continue  # this index is searched at another setting of the profile (without encoder2: best's LLM fallback)
                with Retriever.load(path, warm=False, embedder=ref.embedder, **keywords) as r:
                    for label, mode in measures:
                        if mode in r.modes and (mode != "hybrid" or r.fusion == ref.fusion):  # a hybrid of the same setting only
                            out[name][label] = evaluate_run(qrels, _run(r, encoded, qids, mode), ["ndcg@10"])["ndcg@10"]
    return out


def measure(data: Path, cache: Path, variants: list[Variant], models: dict, embedding_cache: Path | None,
            runtime: str = "auto", dtype: str = "auto") -> dict:
    base, built = ensure_float32(data, cache, models, embedding_cache, runtime, dtype)
    indexes = {"float32": base}
    convert_s = {}
    for v in variants:
        t0 = time.perf_counter()
        v.copy(base, cache / data.name / v.name)
        convert_s[v.name] = round(time.perf_counter() - t0, 2)
        indexes[v.name] = cache / data.name / v.name
    ds = load_beir_folder(data)
    manifest = json.loads((base / "manifest.json").read_text())
    n_docs = manifest["n_docs"]
    t0 = time.perf_counter()
    ndcg = evaluate(indexes, ds.queries, ds.qrels)
    return {
        "n_docs": n_docs, "n_queries": len(ds.queries), "channels": [c for c in Manifest.read(base).channels if c != "sparse"],
        "runtime": f"{manifest.get('runtime', {}).get('name')} {manifest.get('runtime', {}).get('dtype')}", "float32_built_this_run": built,
        "float32_encode_seconds": manifest.get("build", {}).get("encode_seconds"), "convert_s": convert_s,
        "evaluate_s": round(time.perf_counter() - t0, 1),
        "bytes_per_doc": {name: bytes_per_doc(path, n_docs) for name, path in indexes.items()},
        "ndcg@10": ndcg,
        "delta": {name: {m: round(v - ndcg["float32"][m], 4) for m, v in scores.items() if m in ndcg["float32"]}
                  for name, scores in ndcg.items() if name != "float32"},
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m experiments.compact_index", description=__doc__.split("\n")[0])
    p.add_argument("--data", required=True, type=Path, action="append", help="a BEIR folder; repeatable")
    p.add_argument("--cache", type=Path, default=Path(".cache/compact-study"), help="where the indexes are kept between runs")
    p.add_argument("--embedding-cache", type=Path, default=Path(".cache/compact-study/embeddings"),
                   help="pooled document embeddings reused by the float32 builds (embedder/cache.py); 'none': encode everything")
    p.add_argument("--variants", default=DEFAULT_VARIANTS,
                   help="comma-separated QUANTISATION:DENSE_KIND[:packed|:range16][:kN][:lN][:b4][:CHANNEL=KIND...][:-CHANNEL...] (kN: each "
                   "document's top N aligned tokens kept; lN: their impacts over N levels; b4: 4-bit impacts, two a byte; "
                   f"CHANNEL=KIND: that dense channel's own kind; -CHANNEL: left out; default {DEFAULT_VARIANTS})")
    p.add_argument("--reference", default=REFERENCE,
                   help=f"the variant the others are held to (default {REFERENCE}: build-index's default before issue 53's size goal); added if not listed")
    p.add_argument("--runtime", default="auto", help="how the LLM encodes the documents of a float32 build not yet cached (auto, torch, openvino)")
    p.add_argument("--dtype", default="auto", help="its precision (auto, fp32, bf16...)")
    p.add_argument("--tolerance", type=float, default=0.003, help="the largest nDCG@10 loss accepted (issue 53)")
    p.add_argument("--out", required=True, type=Path, help="the table's JSON file")
    args = p.parse_args(argv)
    variants = parse_variants(args.variants)
    reference = parse_variant(args.reference)
    if reference not in variants:
        variants.insert(0, reference)
    load_start = load_avg()
    models: dict = {}
    results = {}
    for data in args.data:
        results[data.name] = measure(data, args.cache, variants, models, None if str(args.embedding_cache) == "none" else args.embedding_cache,
                                     args.runtime, args.dtype)
        print(data.name, json.dumps(results[data.name]["ndcg@10"]), flush=True)
    names = [v.name for v in variants]
    ref = reference.name
    labels = [label for label, _, _ in MEASURES]
    against = {}  # {collection: {variant: {measure: variant - reference}}}
    for coll, r in results.items():
        scores = r["ndcg@10"]
        against[coll] = {name: {m: round(v - scores[ref][m], 4) for m, v in scores[name].items() if m in scores[ref]} for name in names if name != ref}
    rows = []
    for coll, r in results.items():
        for name in ["float32", *names]:
            b = r["bytes_per_doc"][name]
            delta = r["delta"][name] if name == ref else against[coll].get(name, {})
            cells = [f"{r['ndcg@10'][name][m]:.4f}" + (f" ({delta[m]:+.4f})" if m in delta else "") if m in r["ndcg@10"][name] else "-"
                     for m in labels]
            rows.append([coll, r["n_docs"], name, b["total_without_per_vocabulary_files_and_text"], b["total_without_per_vocabulary_files"], *cells])
    others = [n for n in names if n != ref]
    worst = {name: {m: min((against[c][name][m] for c in results if m in against[c][name]), default=None) for m in labels} for name in others}
    largest = {name: max(r["bytes_per_doc"][name]["total_without_per_vocabulary_files_and_text"] for r in results.values()) for name in names}
    table = {
        **table_header(),
        "title": "Compact indexes: bytes per document and nDCG@10 against today's default",
        "command": study_command("experiments.compact_index", argv),
        "description": (
            f"Each collection's default index built as float32 (channels {', '.join(base_channels())}, smollm2-135m with its default "
            "adapter) and compact copies of it (indexer.compact.compact_copy: 8-bit impacts per posting list or global; the dense channels "
            "as the FAISS kind named, or per channel; doc numbers int32 (format 3), bit-packed (4) or as 16-bit offsets in ranges (5, "
            "'range16'); kN: each document's top N aligned tokens kept; no-X: channel X left out). nDCG@10 (ranx) of each channel and "
            "of the two profiles' hybrids (fast: the query's own tokens + MiniLM + BM25; best: the same over mpnet), and of the LLM "
            "reading the query (sparse, dense); queries encoded once per setup and searched on every index holding the channel; "
            f"in brackets the difference from {ref} (build-index's default before this table), and for it from float32. Bytes per document: "
            "of the index's files without the per-vocabulary ones (postings_indptr, scale, offset, rangestart) and the stored text "
            f"(documents.jsonl), then with the stored text. Load average at the start: {load_start}."
        ),
        "columns": ["collection", "docs", "index", "bytes/doc (postings + vectors)", "bytes/doc (with the stored text)", *[f"nDCG@10 {m}" for m in labels]],
        "rows": rows,
        "reference": ref,
        "worst_delta": worst,
        "largest_bytes_per_doc": largest,
        "within_tolerance": {name: all(v is None or v >= -args.tolerance for v in worst[name].values()) for name in others},
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
