"""Console script ``train-btmr``: BTMR token-matryoshka training on a corpus's documents (training/btmr/).

    train-btmr --corpus ../shared/data/cisi --corpus ../shared/data/medline --output runs/btmr --steps 200
"""
from __future__ import annotations

import argparse

from embedder.encoder import EmbedderConfig
from training.btmr.recipe import BTMRRecipe
from training.btmr.trainer import BTMRTrainer
from training.cli.common import (
    add_corpus_arguments,
    add_recipe_arguments,
    add_run_arguments,
    fail,
    recipe_with_args,
    set_threads,
    setup,
)
from training.loop import load_backbone

PROG = "train-btmr"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog=PROG, description="BTMR token-matryoshka training on a corpus's documents (LoRA).")
    add_corpus_arguments(p)
    add_run_arguments(p, model_default="the engine's default")
    add_recipe_arguments(p, batch_help="document pairs per optimizer step")
    p.add_argument("--batch-pairs", dest="batch_size", type=int, help=argparse.SUPPRESS)  # the former name of --batch-size
    p.add_argument("--steps", type=int, help=f"optimizer steps (default {BTMRRecipe.steps})")
    p.add_argument("--segment-length", type=int, default=32)
    p.add_argument("--group-size", type=int, default=4)
    p.add_argument("--units-per-side", type=int, default=2)
    p.add_argument("--no-matryoshka", action="store_true", help="contrast only the full group (the paper's ablation)")
    args = p.parse_args(argv)
    setup(args.threads, args.quiet)
    from embedder.models import DEFAULT_MODEL, ModelNotAvailable
    from indexer.corpus import CorpusError
    from training.texts import corpus_texts

    try:
        btmr = {"segment_length": args.segment_length, "group_size": args.group_size, "units_per_side": args.units_per_side,
                "matryoshka": not args.no_matryoshka}
        recipe = recipe_with_args(BTMRRecipe(btmr=btmr), args)
        texts, _ = corpus_texts(args.corpus, args.format, args.max_texts, recipe.seed)
        emb = load_backbone(args.model or DEFAULT_MODEL, EmbedderConfig(), recipe.bf16)
        set_threads(args.threads)
        res = BTMRTrainer(emb, texts, args.output, recipe).train(resume=not args.no_resume, progress=not args.quiet)
    except (CorpusError, ModelNotAvailable, ValueError) as exc:
        return fail(PROG, exc)
    print(f"{'completed' if res['completed'] else 'stopped'}: {len(res['history'])} steps on {res['pairs']} document pairs; adapter in {args.output / 'adapter'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
