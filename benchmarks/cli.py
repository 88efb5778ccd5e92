"""``beir-eval``: run systems on test collections and evaluate them; ``beir-eval report``.

    beir-eval --data DIR_OR_ID [--data ...] --systems bm25-pyserini,minilm,bm25+minilm,sparse,dense \\
              [--model NAME] [--adapter default|none|DIR] [--quick] [--compare] --out DIR
    beir-eval report [--results benchmarks/results] [--output BENCHMARKS.md] [--headline RUN]
"""
from __future__ import annotations

import argparse
import logging
import shlex
import shutil
import sys
import tempfile
from pathlib import Path

import benchmarks  # noqa: F401  (cache locations first)
from retriever.options import add_query_side_arguments

# bm25+minilm: the cheap hybrid a user would assemble without this engine (issue 16), a baseline row
DEFAULT_SYSTEMS = "bm25-pyserini,minilm,bm25+minilm,sparse,dense"
QUICK_DATASETS = ("cranfield", "npl")


def _run_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="beir-eval",
        description="Evaluate this engine and baselines on BEIR-style collections (quality with ranx, and speed), "
        "writing TREC runs, results.json and report.md into --out. `beir-eval report` regenerates BENCHMARKS.md.",
    )
    p.add_argument(
        "--data",
        action="append",
        help="a BEIR folder, a folder of them, a shared collection name (cisi...), 'shared' for all, or an ir_datasets id "
        "such as beir/scifact/test; repeatable (default: the shared collections; with --quick: "
        + ", ".join(QUICK_DATASETS)
        + ")",
    )
    p.add_argument("--systems", default=DEFAULT_SYSTEMS, help=f"comma-separated system names (default {DEFAULT_SYSTEMS})")
    p.add_argument("--model", default=None, help="backbone for this project's systems (registry name, path, hub id; default: the engine's default)")
    p.add_argument("--adapter", default="default", help="default | none | a shipped adapter name | DIR (LoRA adapter for the backbone)")
    p.add_argument("--top-k", type=int, default=None, help="K aligned tokens kept per document (default: the engine's DEFAULT_TOP_K)")
    p.add_argument("--expansion-m", type=int, default=None, help="M expansion tokens per query (default: the engine's DEFAULT_EXPANSION_M)")
    p.add_argument("--embedfilter-tau", type=int, default=None, help="τ of the dense-ef system (default: embedder.embedfilter.DEFAULT_TAU)")
    p.add_argument("--lexical", choices=("words", "tokens"), default="words", help="analyser of the bm25/hybrid lexical channel (default words)")
    p.add_argument("--encoder", default="minilm", help="sentence-transformers model of the encoder channel (default, default-best, encoder, hybrid-bm25+encoder* systems): 'minilm', 'mpnet' or a local directory (default minilm)")
    p.add_argument(
        "--fusion-from",
        type=Path,
        default=None,
        help="fusion settings per channel subset for bm25+minilm and the hybrid-bm25+encoder* systems: a `fusion_cv --subsets-out` "
        "results file (the setting each subset chose on all collections) or a JSON object {subset: fusion}",
    )
    p.add_argument("--segments", action="store_true", help="multi-vector documents for this project's systems: whole documents as max_length windows (indexer/segments.py)")
    p.add_argument("--dense-kind", default="Flat", help="FAISS factory string of the dense channel (default Flat: exact)")
    p.add_argument("--device", default=None, help="torch device (default: cuda if available, else cpu)")
    p.add_argument("--dtype", choices=("auto", "fp32", "bf16", "int8"), default="auto", help="LLM encoder precision (default auto: chosen for this machine)")
    p.add_argument(
        "--runtime", choices=("auto", "torch", "openvino", "reference"), default="auto",
        help="how the LLM encoder runs (default auto; reference: the plain transformers forward, fp32, no prefix cache)",
    )
    add_query_side_arguments(p)
    p.add_argument("--threads", type=int, default=None, help="torch/FAISS threads for the run (default: the libraries' choice, all cores)")
    p.add_argument("--split", default="test", help="qrels split of BEIR folders (default test)")
    p.add_argument("--depth", type=int, default=100, help="hits per query in the runs (default 100; MAP is cut there)")
    p.add_argument("--quick", action="store_true", help="a sample of queries and documents (for CI: a few minutes)")
    p.add_argument("--quick-queries", type=int, default=20, help="queries per dataset with --quick (default 20)")
    p.add_argument("--quick-docs", type=int, default=300, help="documents per dataset with --quick (default 300)")
    p.add_argument("--seed", type=int, default=0, help="sampling seed for --quick")
    p.add_argument("--resume", action="store_true", help="keep the datasets --out's results.json already holds for these systems; run the rest")
    p.add_argument(
        "--interleaved-latency",
        action="store_true",
        help="after the timed runs, every system answers each query once more, back to back on the same query (the order running through every permutation): "
        "latency ratios taken over the same minutes (reported beside the sequential ones)",
    )
    p.add_argument("--compare", action="store_true", help="add paired significance tests between systems (ranx.compare)")
    p.add_argument("--runs-gzip", action="store_true", help="write the TREC runs gzip-compressed (.trec.gz)")
    p.add_argument("--index-dir", type=Path, default=None, help="build (and keep) indexes here (default: a temporary folder, removed)")
    p.add_argument(
        "--embedding-cache",
        type=Path,
        default=None,
        help="reuse this project's document embeddings across runs from this folder (build times and tokens/s of cached runs are not measurements)",
    )
    p.add_argument("--out", type=Path, required=True, help="output folder: results.json, report.md, runs/")
    p.add_argument("--no-progress", action="store_true", help="no progress bars")
    return p


def _report_parser() -> argparse.ArgumentParser:
    from benchmarks.report import RESULTS_DIR

    p = argparse.ArgumentParser(
        prog="beir-eval report",
        description="Regenerate BENCHMARKS.md (the headline tables), the results' INDEX.md, every run's report.md, the plots "
        "and README.md's results table from the results JSON files (benchmarks/report/document.py).",
    )
    p.add_argument("--results", type=Path, default=RESULTS_DIR, help=f"folder searched for results JSON files (default {RESULTS_DIR})")
    p.add_argument("--output", type=Path, default=None, help="markdown file to write (default: BENCHMARKS.md at the repository root)")
    p.add_argument("--headline", type=Path, default=None, help="the beir-eval run (folder or results.json) the headline tables and README's "
                   "table show (default: the latest over the most collections with `default` and an anchor)")
    p.add_argument("--readme", type=Path, default=None, help="README whose results table (between its markers) is rewritten "
                   "(default: README.md beside --output)")
    return p


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    if argv[:1] == ["report"]:
        return _report(_report_parser().parse_args(argv[1:]))
    if argv[:1] == ["run"]:
        argv = argv[1:]
    args = _run_parser().parse_args(argv)
    return _run(args, "beir-eval " + shlex.join(argv))


def _report(args: argparse.Namespace) -> int:
    from benchmarks.report import generate

    try:
        output, changed = generate(args.results, args.output, headline=args.headline, readme=args.readme)
    except (ValueError, OSError) as exc:
        print(f"beir-eval report: error: {exc}", file=sys.stderr)
        return 2
    print(f"{output}: {'updated' if output in changed else 'unchanged'}; {len(changed)} file(s) written")
    return 0


def _run(args: argparse.Namespace, command: str) -> int:
    from benchmarks import datasets as dsets
    from benchmarks import systems as sysreg
    from benchmarks.results_file import read_fusions
    from benchmarks.suite import run_suite
    from embedder.models import ModelNotAvailable
    from indexer.corpus import CorpusError

    names = [s.strip() for s in args.systems.split(",") if s.strip()]
    unknown = [n for n in names if n not in sysreg.REGISTRY]
    if not names or unknown:
        print(f"beir-eval: error: unknown system(s) {', '.join(unknown) or '(none given)'}; known: {', '.join(sysreg.REGISTRY)}", file=sys.stderr)
        return 2
    if len(set(names)) != len(names):
        print("beir-eval: error: a system is named twice in --systems", file=sys.stderr)
        return 2
    specs = args.data or (list(QUICK_DATASETS) if args.quick else ["shared"])
    try:
        loaded = [d for spec in specs for d in dsets.resolve(spec, args.split)]
    except (dsets.DatasetUnavailable, CorpusError) as exc:
        print(f"beir-eval: error: {exc}", file=sys.stderr)
        return 2
    seen = set()
    for d in loaded:
        if d.name in seen:
            print(f"beir-eval: error: two datasets are named {d.name!r}", file=sys.stderr)
            return 2
        seen.add(d.name)
    if args.quick:
        loaded = [dsets.sample(d, args.quick_queries, args.quick_docs, args.seed) for d in loaded]

    try:
        fusions = read_fusions(args.fusion_from) if args.fusion_from else {}
    except (OSError, ValueError) as exc:
        print(f"beir-eval: error: --fusion-from: {exc}", file=sys.stderr)
        return 2
    work = args.index_dir or Path(tempfile.mkdtemp(prefix="beir-eval-"))
    settings = sysreg.Settings(
        work_dir=Path(work),
        model=args.model,
        adapter=args.adapter,
        top_k=args.top_k,
        expansion_m=args.expansion_m,
        dense_kind=args.dense_kind,
        dtype=args.dtype,
        runtime=args.runtime,
        device=args.device,
        progress=not args.no_progress,
        threads=args.threads,
        embedding_cache=args.embedding_cache,
        embedfilter_tau=args.embedfilter_tau,
        lexical=args.lexical,
        encoder=args.encoder,
        fusions=fusions,
        segments=args.segments,
        query_encoder=args.query_encoder,
        profile=args.profile,
        feedback=args.feedback,
        sparse_pruning=args.sparse_pruning,
    )
    extra = {"quick": args.quick, "split": args.split, "seed": args.seed if args.quick else None, "systems": names, "segments": args.segments,
             "query_encoder": args.query_encoder, "profile": args.profile, "feedback": args.feedback.to_dict() if args.feedback else None,
             "sparse_pruning": args.sparse_pruning.to_dict() if args.sparse_pruning else None}
    if args.fusion_from:
        extra["fusion_from"] = str(args.fusion_from)
    try:
        results = run_suite(loaded, names, settings, args.out, depth=args.depth, compare=args.compare, runs_gzip=args.runs_gzip, command=command, extra_settings=extra, resume=args.resume,
                            interleaved=args.interleaved_latency)
    except (sysreg.SystemUnavailable, ModelNotAvailable, CorpusError) as exc:
        print(f"beir-eval: error: {exc}", file=sys.stderr)
        return 2
    finally:
        if args.index_dir is None:
            shutil.rmtree(work, ignore_errors=True)
    print(f"wrote {args.out / 'results.json'} and {args.out / 'report.md'} ({results['wall_seconds']:.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
