"""Console script ``distill-query-encoder``: distil the embedder's query state into a small student
(training/query_encoder/, embedder/query_encoder.py), so that queries need no LLM forward.

Re-run it when the default adapter changes: ``distill-query-encoder --beside-adapter`` writes the
student into the adapter's folder, where ``Retriever.load(query_encoder="auto")`` finds it.

On a GPU machine without the sentence encoder: ``--export-inputs FILE`` here (the texts and their
sentence embeddings, no teacher loaded), then ``--inputs FILE --device cuda`` there.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from training.cli.common import fail, set_threads, setup

SHARED = Path(__file__).resolve().parents[3] / "shared" / "data"
COLLECTIONS = ("adi", "cisi", "cranfield", "medline", "npl")


# The expansion's M at query time (retriever/query.py DEFAULT_EXPANSION_M; training may not import
# retriever): the faithfulness report measures the overlap of the top-M tokens.
EXPANSION_M = 128


def main(argv: list[str] | None = None) -> int:
    from training.query_encoder.recipe import DistillRecipe

    defaults = DistillRecipe()
    p = argparse.ArgumentParser(prog="distill-query-encoder", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="smollm2-135m", help="the teacher's backbone (default smollm2-135m)")
    p.add_argument("--adapter", default="default", help="the teacher's adapter: default | none | a shipped name | DIR")
    p.add_argument("--encoder", default="minilm", help="the frozen sentence encoder the head reads (default minilm)")
    p.add_argument("--pairs", type=Path, default=SHARED / "pairs", help="folder of training pairs (their anchors are used)")
    p.add_argument(
        "--collections", type=Path, nargs="+", action="extend", default=None,
        help="BEIR folders whose document sentences are used and whose queries are excluded (default: the five shared ones)",
    )
    p.add_argument("--per-file", type=int, default=2500, help="anchors drawn per pairs file (default 2500)")
    p.add_argument("--per-collection", type=int, default=1500, help="document sentences drawn per collection (default 1500)")
    p.add_argument("--max-texts", type=int, help="only the first N of the drawn texts (they are shuffled)")
    p.add_argument("--cache", type=Path, default=Path(".cache/distill"), help="per-text cache of teacher states and encoder inputs")
    p.add_argument("--kind", choices=["token-bag", "pooled"], default=defaults.kind,
                   help="the student: token-bag (the text's LLM tokens and the sentence embedding; default) or pooled (the sentence embedding only)")
    for field in ("hidden", "gate_hidden", "context_layers", "context_dim", "token_hidden", "max_tokens", "epochs", "batch_size", "kl_top", "seed"):
        p.add_argument(f"--{field.replace('_', '-')}", type=int, default=getattr(defaults, field))
    for field in ("lr", "weight_decay", "kl_weight", "temperature", "holdout"):
        p.add_argument(f"--{field.replace('_', '-')}", type=float, default=getattr(defaults, field))
    p.add_argument("--encoder-tokens", action="store_true",
                   help="the context blocks also read the sentence encoder's token states (needs --context-layers)")
    p.add_argument("--name", help="the student's name in results (default: the adapter's folder name)")
    where = p.add_mutually_exclusive_group(required=True)
    where.add_argument("--out", type=Path, help="write the student into this folder")
    where.add_argument("--beside-adapter", action="store_true", help="write it into the adapter's folder (ADAPTER/query-encoder)")
    where.add_argument("--export-inputs", type=Path, metavar="FILE",
                       help="only write the drawn texts and their sentence embeddings to FILE (no teacher, no training), for --inputs elsewhere")
    p.add_argument("--inputs", type=Path, metavar="FILE",
                   help="read the texts and their sentence embeddings from FILE (--export-inputs) instead of drawing and encoding them")
    p.add_argument("--device", help="where the teacher runs and the student trains (default: cuda if available, else cpu)")
    p.add_argument("--teacher-batch-size", type=int, metavar="N",
                   help="texts per teacher forward (default: the embedder's, 16; on a GPU 256 keeps it busy; the states do not depend on it)")
    p.add_argument("--dtype", choices=["auto", "fp32", "bf16", "int8"], default="auto", help="the teacher's precision (default auto)")
    p.add_argument("--weights", choices=["fp16", "fp32"], default="fp16",
                   help="how the student's weights are stored (default fp16: half the file; it computes in fp32 either way)")
    p.add_argument("--threads", type=int, help="torch CPU threads (default: all cores)")
    p.add_argument("--expansion-m", type=int, default=EXPANSION_M, help=f"M of the top-M overlap reported (default {EXPANSION_M})")
    p.add_argument("--quiet", action="store_true")
    args = p.parse_args(argv)
    if args.context_layers and args.kind != "token-bag":
        p.error("--context-layers: only a token-bag student reads the query's tokens (--kind token-bag)")
    if args.encoder_tokens and not args.context_layers:
        p.error("--encoder-tokens: the sentence encoder's token states are read by the context blocks; give --context-layers too")
    if args.context_dim and not args.context_layers:
        p.error("--context-dim: the width of the context blocks; give --context-layers too")
    if args.teacher_batch_size is not None and args.teacher_batch_size < 1:
        p.error("--teacher-batch-size: at least 1")
    if args.inputs and (args.export_inputs or args.encoder_tokens):
        p.error("--inputs: the texts and embeddings come from the file; --export-inputs and --encoder-tokens need the sentence encoder")
    setup(args.threads, quiet=args.quiet)

    from embedder.encoder import Embedder
    from embedder.models import ModelNotAvailable
    from embedder.query_encoder import SHIPPED_SUBDIR
    from embedder.sentence_encoder import SentenceEncoder
    from training.query_encoder.data import load_inputs, save_inputs, student_inputs, training_texts, without_evaluation_queries
    from training.query_encoder.trainer import distill

    collections = args.collections or [SHARED / c for c in COLLECTIONS]
    if args.export_inputs:
        texts = training_texts(args.pairs, collections, args.per_file, args.per_collection)[: args.max_texts]
        try:
            encoder = SentenceEncoder.load(args.encoder)
        except (ModelNotAvailable, OSError, ValueError) as exc:
            return fail("distill-query-encoder", f"error: {exc}")
        x = student_inputs(encoder, texts, args.cache, progress=not args.quiet)
        save_inputs(args.export_inputs, texts, x, {**encoder.identity, "dim": int(encoder.dim)})
        print(json.dumps({"inputs": str(args.export_inputs), "texts": len(texts), "encoder": encoder.name}))
        return 0
    inputs = texts = None
    if args.inputs:
        try:
            texts, x, meta = load_inputs(args.inputs)
        except (OSError, ValueError, KeyError) as exc:
            return fail("distill-query-encoder", f"error: {args.inputs}: {exc}")
        # the file was drawn without evaluation queries; drop any the collections here hold, in case it was not
        keep = without_evaluation_queries(texts, collections)[: args.max_texts]
        texts, inputs = [texts[i] for i in keep], (x[keep], meta["encoder"])
    try:
        embedder = Embedder.load(args.model, adapter=args.adapter, dtype=args.dtype, device=args.device)
        set_threads(args.threads)  # Embedder.load sized the pool for every core
        encoder = None if inputs else SentenceEncoder.load(args.encoder)
    except (ModelNotAvailable, OSError, ValueError) as exc:
        return fail("distill-query-encoder", f"error: {exc}")
    if args.teacher_batch_size:
        import dataclasses

        embedder.config = dataclasses.replace(embedder.config, batch_size=args.teacher_batch_size)  # padding only: cache keys ignore it
    adapter_path = (embedder.adapter or {}).get("path")
    if args.beside_adapter and not adapter_path:
        return fail("distill-query-encoder", "error: --beside-adapter needs an adapter (the raw backbone has no folder); use --out")
    out = Path(adapter_path) / SHIPPED_SUBDIR if args.beside_adapter else args.out
    if texts is None:
        texts = training_texts(args.pairs, collections, args.per_file, args.per_collection)[: args.max_texts]
    if len(texts) < 20:
        return fail("distill-query-encoder", f"error: only {len(texts)} training texts under {args.pairs} and the collections")
    recipe = DistillRecipe(**{f: getattr(args, f) for f in DistillRecipe.__dataclass_fields__})
    name = args.name or (Path(adapter_path).name if adapter_path else "raw")
    reads = encoder.name if encoder else f"{inputs[1].get('name')} (precomputed: {args.inputs})"
    print(f"{len(texts)} texts; teacher {embedder.runtime_summary()}; student head over {reads}", file=sys.stderr)
    student = distill(embedder, encoder, texts, args.cache, recipe, name, args.expansion_m, progress=not args.quiet,
                      inputs=inputs, device=embedder.device)  # fmt: skip
    student.save(out, weights=args.weights)
    print(json.dumps({"student": str(out), "faithfulness": student.record["faithfulness"], "seconds": student.record["training"]["seconds"]}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
