"""Console script ``train-llm2comp``: CTKD compression pre-training and unsupervised contrastive stages.

Also the contrastive stage on top of another embedder: ``--init-adapter DIR --stages
simcse:40,spans:40`` keeps training that adapter's LoRA with its prompt and pooling
(e.g. Text2Token + contrastive).
"""
from __future__ import annotations

import argparse
import sys
import time
from dataclasses import replace
from pathlib import Path

from training.cli import _setup
from training.llm2comp_config import RECIPES, LLM2CompStage


def _parse_stages(spec: str) -> tuple[LLM2CompStage, ...]:
    stages = []
    for part in spec.split(","):
        try:
            kind, steps = part.split(":")
            stages.append(LLM2CompStage(kind.strip(), int(steps)))
        except ValueError as exc:
            raise argparse.ArgumentTypeError(f"--stages expects e.g. ctkd:300,simcse:40,spans:40, got {spec!r} ({exc})") from None
    return tuple(stages)


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="train-llm2comp",
        description="Train an LLM2Comp embedder (LoRA + memory tokens) from a backbone and an unlabeled corpus (documents only), "
        "or add unsupervised contrastive stages to another adapter (--init-adapter).",
    )
    p.add_argument("--corpus", action="append", required=True, help="corpus to train on (BEIR folder, .jsonl, .tsv); repeatable")
    p.add_argument("--format", choices=["beir", "jsonl", "tsv"], help="corpus format (guessed from the path by default)")
    p.add_argument("--output", required=True, type=Path, help="run folder: adapter/, adapter-stageN/, checkpoints/, loss_curve.{json,png}")
    p.add_argument("--recipe", choices=sorted(RECIPES), default="cpu", help="starting recipe (default: cpu)")
    p.add_argument("--model", help="backbone (default: the recipe's)")
    p.add_argument("--stages", type=_parse_stages, help="e.g. ctkd:300,simcse:40,spans:40")
    p.add_argument("--init-adapter", help="start from this LoRA adapter ('default' = the shipped one); its prompt and pooling are kept")
    p.add_argument("--batch-size", type=int, help="texts per CTKD optimizer step")
    p.add_argument("--contrastive-batch-size", type=int, help="pairs per contrastive step (in-batch negatives)")
    p.add_argument("--micro-batch-size", type=int, help="texts per forward pass")
    p.add_argument("--max-length", type=int, help="text tokens read by the encoder")
    p.add_argument("--continuation-length", type=int, help="CTKD continuation tokens")
    p.add_argument("--memory-tokens", type=int, help="memory slots (paper: 8)")
    p.add_argument("--attention", choices=["causal", "bidirectional"])
    p.add_argument("--lr", type=float)
    p.add_argument("--warmup-steps", type=int)
    p.add_argument("--schedule", choices=["constant", "linear"])
    p.add_argument("--temperature", type=float, help="InfoNCE temperature (paper: 0.05)")
    p.add_argument("--dropout", type=float, help="attention dropout of the SimCSE views (paper: 0.2)")
    p.add_argument("--seed", type=int)
    p.add_argument("--max-texts", type=int, help="train on a seeded sample of this many documents")
    p.add_argument("--save-every", type=int, help="optimizer steps between checkpoints")
    p.add_argument("--no-resume", action="store_true", help="start over even if the run folder holds checkpoints")
    p.add_argument("--export-checkpoint", type=Path, metavar="CHECKPOINT",
                   help="write the adapter of this checkpoint of the run (same arguments as the run) to --export-to, then stop")
    p.add_argument("--export-to", type=Path, help="adapter folder for --export-checkpoint")
    p.add_argument("--threads", type=int, help="torch CPU threads (default: all cores)")
    p.add_argument("--quiet", action="store_true")
    return p


def recipe_from_args(args: argparse.Namespace):
    """The named recipe with the command line's overrides; ``--init-adapter`` takes that adapter's embedding."""
    r = RECIPES[args.recipe].with_overrides(
        model=args.model, stages=args.stages, batch_size=args.batch_size, contrastive_batch_size=args.contrastive_batch_size,
        micro_batch_size=args.micro_batch_size, max_length=args.max_length, continuation_length=args.continuation_length,
        memory_tokens=args.memory_tokens, attention=args.attention, lr=args.lr, warmup_steps=args.warmup_steps,
        schedule=args.schedule, temperature=args.temperature, dropout=args.dropout, seed=args.seed, save_every=args.save_every,
    )
    if args.batch_size and not args.micro_batch_size and args.batch_size % r.micro_batch_size:
        r = replace(r, micro_batch_size=args.batch_size)
    if args.init_adapter:
        from embedder.adapters import adapter_embedding, resolve_adapter
        from embedder.models import resolve_model

        directory = resolve_adapter(args.init_adapter, resolve_model(r.model).name)
        if directory is None:
            raise ValueError(f"--init-adapter {args.init_adapter!r}: no such adapter for {r.model}")
        emb = adapter_embedding(directory)
        if emb.get("pooling") == "memory":
            raise ValueError(f"{directory}: an LLM2Comp adapter; continue its run folder instead of --init-adapter")
        if any(s.kind == "ctkd" and s.steps for s in r.stages):
            raise ValueError("--init-adapter runs contrastive stages only (simcse, spans), not ctkd")
        r = replace(r, init_adapter=str(directory), memory_tokens=0, prompt=emb.get("prompt", r.prompt),
                    pooling=emb.get("pooling", "last"), attention=emb.get("attention", r.attention))
    return r


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    _setup(args.threads, args.quiet)
    from embedder.models import ModelNotAvailable
    from indexer.corpus import CorpusError
    from training.llm2comp_trainer import LLM2CompTrainer
    from training.texts import corpus_texts

    try:
        recipe = recipe_from_args(args)
        texts, info = corpus_texts(args.corpus, args.format, args.max_texts, recipe.seed)
    except (ValueError, CorpusError, ModelNotAvailable) as exc:
        print(f"train-llm2comp: {exc}", file=sys.stderr)
        return 2
    if not texts:
        print("train-llm2comp: the corpus holds no documents", file=sys.stderr)
        return 2
    t0 = time.perf_counter()
    try:
        trainer = LLM2CompTrainer(recipe, texts, args.output, progress=not args.quiet, corpus_info=info)
    except ModelNotAvailable as exc:
        print(f"train-llm2comp: {exc}", file=sys.stderr)
        return 2
    if args.threads:
        import torch

        torch.set_num_threads(args.threads)  # Embedder.load sizes the pool for all cores
    if args.export_checkpoint:
        if not args.export_to:
            print("train-llm2comp: --export-checkpoint needs --export-to DIR", file=sys.stderr)
            return 2
        try:
            out = trainer.export_checkpoint(args.export_checkpoint, args.export_to)
        except (OSError, ValueError) as exc:
            print(f"train-llm2comp: {exc}", file=sys.stderr)
            return 2
        print(f"adapter: {out}")
        return 0
    stages = " + ".join(f"{s.steps} {s.kind}" for s in recipe.stages)
    print(f"train-llm2comp: {len(texts)} documents, recipe {args.recipe} ({stages} steps), pooling {recipe.pooling}, "
          f"attention {recipe.attention}, output {args.output}", file=sys.stderr)
    result = trainer.train(resume=not args.no_resume)
    rate = result.tokens / result.seconds if result.seconds else 0.0
    for k, s in enumerate(recipe.stages):
        hs = [h["loss"] for h in result.history if h["stage"] == k + 1]
        if hs:
            print(f"  stage {k + 1} {s.kind}: loss {hs[0]:.4f} -> {hs[-1]:.4f} (mean of last 10: {sum(hs[-10:]) / len(hs[-10:]):.4f})")
    print(f"train-llm2comp: done in {time.perf_counter() - t0:.0f} s ({rate:.0f} training tokens/s)")
    if result.completed:
        print(f"adapter: {result.adapter_dir}")
        print(f"use it: build-index --corpus CORPUS --index INDEX --model {recipe.model} --adapter {result.adapter_dir}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
