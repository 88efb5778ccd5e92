"""Console script ``train-llm2comp``: CTKD compression pre-training and unsupervised contrastive stages.

Also the contrastive stage on top of another embedder: ``--init-adapter DIR --stages
simcse:40,spans:40`` keeps training that adapter's LoRA with its prompt and pooling
(e.g. Text2Token + contrastive).
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import replace
from pathlib import Path

from embedder.util import set_threads
from training.cli_common import fail, recipe_with_args, report_adapter, setup, staged_parser
from training.llm2comp_config import RECIPES, LLM2CompStage

PROG = "train-llm2comp"


def parser() -> argparse.ArgumentParser:
    p = staged_parser(
        PROG,
        "Train an LLM2Comp embedder (LoRA + memory tokens) from a backbone and an unlabeled corpus (documents only), "
        "or add unsupervised contrastive stages to another adapter (--init-adapter).",
        RECIPES,
        LLM2CompStage,
        "ctkd:300,simcse:40,spans:40",
        batch_help="texts per CTKD optimizer step",
    )
    p.add_argument("--init-adapter",
                   help="start from this LoRA adapter ('default' = the shipped one); its prompt, pooling and LoRA shape are kept")
    p.add_argument("--contrastive-batch-size", type=int, help="pairs per contrastive step (in-batch negatives)")
    p.add_argument("--continuation-length", type=int, help="CTKD continuation tokens")
    p.add_argument("--memory-tokens", type=int, help="memory slots (paper: 8)")
    p.add_argument("--dropout", type=float, help="attention dropout of the SimCSE views (paper: 0.2)")
    p.add_argument("--export-checkpoint", type=Path, metavar="CHECKPOINT",
                   help="write the adapter of this checkpoint of the run (same arguments as the run) to --export-to, then stop")
    p.add_argument("--export-to", type=Path, help="adapter folder for --export-checkpoint")
    return p


def recipe_from_args(args: argparse.Namespace):
    """The named recipe with the command line's overrides; ``--init-adapter`` takes that adapter's embedding and LoRA shape."""
    r = recipe_with_args(RECIPES[args.recipe], args)
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
        lora = json.loads((Path(directory) / "adapter_config.json").read_text())
        r = replace(r, init_adapter=str(directory), memory_tokens=0, prompt=emb.get("prompt", r.prompt),
                    pooling=emb.get("pooling", "last"), attention=emb.get("attention", r.attention),
                    lora_r=lora["r"], lora_alpha=lora["lora_alpha"], lora_dropout=lora["lora_dropout"],
                    lora_targets=tuple(sorted(lora["target_modules"])))
    return r


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    setup(args.threads, args.quiet)
    from embedder.models import ModelNotAvailable
    from indexer.corpus import CorpusError
    from training.llm2comp_trainer import LLM2CompTrainer
    from training.texts import corpus_texts

    try:
        recipe = recipe_from_args(args)
        texts, info = corpus_texts(args.corpus, args.format, args.max_texts, recipe.seed)
    except (ValueError, CorpusError, ModelNotAvailable) as exc:
        return fail(PROG, exc)
    if not texts:
        return fail(PROG, "the corpus holds no documents")
    t0 = time.perf_counter()
    try:
        trainer = LLM2CompTrainer(recipe, texts, args.output, progress=not args.quiet, corpus_info=info)
    except ModelNotAvailable as exc:
        return fail(PROG, exc)
    set_threads(args.threads)
    if args.export_checkpoint:
        if not args.export_to:
            return fail(PROG, "--export-checkpoint needs --export-to DIR")
        try:
            out = trainer.export_checkpoint(args.export_checkpoint, args.export_to)
        except (OSError, ValueError) as exc:
            return fail(PROG, exc)
        print(f"adapter: {out}")
        return 0
    stages = " + ".join(f"{s.steps} {s.kind}" for s in recipe.stages)
    print(f"{PROG}: {len(texts)} documents, recipe {args.recipe} ({stages} steps), pooling {recipe.pooling}, "
          f"attention {recipe.attention}, output {args.output}", file=sys.stderr)
    result = trainer.train(resume=not args.no_resume)
    rate = result.tokens / result.seconds if result.seconds else 0.0
    for k, s in enumerate(recipe.stages):
        hs = [h["loss"] for h in result.history if h["stage"] == k + 1]
        if hs:
            print(f"  stage {k + 1} {s.kind}: loss {hs[0]:.4f} -> {hs[-1]:.4f} (mean of last 10: {sum(hs[-10:]) / len(hs[-10:]):.4f})")
    print(f"{PROG}: done in {time.perf_counter() - t0:.0f} s ({rate:.0f} training tokens/s)")
    report_adapter(result, recipe.model)
    return 0


if __name__ == "__main__":
    sys.exit(main())
