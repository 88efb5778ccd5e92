"""What the training console scripts (train-text2token, train-llm2comp, train-btmr, sts-eval, text2token-diagnose) share.

Process set-up, the argument groups they have in common, recipe overrides from the command
line, the error exit, and loading a trained embedder by model and adapter name. An argument overrides the recipe field of the same name (its
``dest``), so a new recipe field needs only its argument.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from collections.abc import Callable
from dataclasses import fields, replace
from pathlib import Path

from embedder.util import set_threads
from training.recipe import SCHEDULES, TrainRecipe


def setup(threads: int | None, quiet: bool) -> None:
    """Offline Hugging Face, logging (warnings only when quiet) and the torch thread count."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    logging.basicConfig(level=logging.WARNING if quiet else logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    set_threads(threads)


def fail(prog: str, message: object) -> int:
    """Report a usage or input error the way argparse does and return the exit status 2."""
    print(f"{prog}: {message}", file=sys.stderr)
    return 2


def add_run_arguments(p: argparse.ArgumentParser, model_default: str = "the recipe's") -> None:
    """Where the run goes, which backbone, resume, threads and verbosity."""
    p.add_argument(
        "--output", required=True, type=Path, help="run folder: adapter/, adapter-stageN/, checkpoints/, loss_curve.{json,png}"
    )
    p.add_argument("--model", help=f"backbone: registry name, local HF folder or .gguf (default: {model_default})")
    p.add_argument("--no-resume", action="store_true", help="start over even if the run folder holds checkpoints")
    p.add_argument("--threads", type=int, help="torch CPU threads (default: all cores)")
    p.add_argument("--quiet", action="store_true", help="no progress bar, warnings only")


def add_corpus_arguments(p: argparse.ArgumentParser, required: bool = True) -> None:
    """The documents to train on (never queries)."""
    p.add_argument(
        "--corpus", action="extend", nargs="+", required=required,
        help="corpus or corpora to train on (BEIR folder, .jsonl, .tsv); repeatable, and takes several paths "
        "(so a shell's ../data/{a,b} works)"
    )
    p.add_argument("--format", choices=["beir", "jsonl", "tsv"], help="corpus format (guessed from the path by default)")
    p.add_argument("--max-texts", type=int, help="train on a seeded sample of this many documents")


def add_recipe_arguments(p: argparse.ArgumentParser, batch_help: str = "texts per optimizer step") -> None:
    """Overrides of the fields every recipe has (training/recipe.py TrainRecipe)."""
    p.add_argument("--batch-size", type=int, help=batch_help)
    p.add_argument("--lr", type=float)
    p.add_argument("--warmup-steps", type=int)
    p.add_argument("--schedule", choices=SCHEDULES)
    p.add_argument("--seed", type=int)
    p.add_argument("--lora-r", type=int)
    p.add_argument("--lora-alpha", type=int)
    p.add_argument("--save-every", type=int, help="optimizer steps between checkpoints")


def staged_parser(
    prog: str,
    description: str,
    recipes: dict,
    stage_type: type,
    stages_example: str,
    corpus_required: bool = True,
    batch_help: str = "texts per optimizer step",
    recipe_help: str = "",
) -> argparse.ArgumentParser:
    """The parser of a staged trainer's script (training/recipe.py EmbedderRecipe), with the shared groups."""
    p = argparse.ArgumentParser(prog=prog, description=description)
    add_corpus_arguments(p, required=corpus_required)
    add_run_arguments(p)
    add_recipe_arguments(p, batch_help)
    p.add_argument("--recipe", choices=sorted(recipes), default="cpu", help=f"starting recipe (default: cpu{recipe_help})")
    p.add_argument("--stages", type=stage_parser(stage_type, stages_example), help=f"e.g. {stages_example}")
    p.add_argument("--micro-batch-size", type=int, help="texts per forward pass")
    p.add_argument("--max-length", type=int, help="text tokens read per text (the template is added on top)")
    p.add_argument("--attention", choices=["causal", "bidirectional"])
    p.add_argument("--temperature", type=float, help="InfoNCE temperature of the contrastive stages")
    return p


def add_prompt_arguments(p: argparse.ArgumentParser) -> None:
    """The templates (recipe fields ``prompt`` and ``query_prompt``), each with a [text] placeholder."""
    p.add_argument("--prompt", help="documents' template (default: the recipe's)")
    p.add_argument(
        "--query-prompt",
        help="queries' template: contrastive anchors read it, and the adapter's record makes search read queries with it "
        "(default: the recipe's); 'none': queries read the documents' template",
    )


def stage_parser(stage_type: type, example: str) -> Callable[[str], tuple]:
    """An argparse type reading "name:steps,name:steps" into a tuple of ``stage_type``."""

    def parse(spec: str) -> tuple:
        stages = []
        for part in spec.split(","):
            try:
                name, steps = part.split(":")
                stages.append(stage_type(name.strip(), int(steps)))
            except ValueError as exc:
                raise argparse.ArgumentTypeError(f"--stages expects e.g. {example}, got {spec!r} ({exc})") from None
        return tuple(stages)

    return parse


def recipe_with_args(recipe: TrainRecipe, args: argparse.Namespace, skip: tuple[str, ...] = ("init_adapter",)):
    """``recipe`` with every field that an argument of the same name gave (None = not given).

    skip: fields whose argument the caller interprets itself. A batch size given alone that
    the recipe's micro-batch does not divide becomes one forward pass per batch.
    """
    given = vars(args)
    names = {f.name for f in fields(recipe)} - set(skip)
    kw = {name: given[name] for name in names if given.get(name) is not None}
    if "micro_batch_size" in names and "batch_size" in kw and "micro_batch_size" not in kw and kw["batch_size"] % recipe.micro_batch_size:
        kw["micro_batch_size"] = kw["batch_size"]
    # "--query-prompt none": no query template (None itself means "not given")
    symmetric = kw.get("query_prompt") == "none"
    if symmetric:
        del kw["query_prompt"]
    recipe = recipe.with_overrides(**kw)
    return replace(recipe, query_prompt=None) if symmetric else recipe


def report_adapter(result, model: str) -> None:
    """Where a finished run's adapter is and how to index with it (nothing if the run stopped early)."""
    if result.completed:
        print(f"adapter: {result.adapter_dir}")
        print(f"use it: build-index --corpus CORPUS --index INDEX --model {model} --adapter {result.adapter_dir}")


def load_embedder(
    model: str,
    adapter: str,
    max_length: int | None = None,
    batch_size: int | None = None,
    threads: int | None = None,
    dtype: str = "auto",
):
    """An Embedder for a backbone and adapter, pooling the way the adapter was trained to.

    ``dtype`` as in :meth:`Embedder.load`; ``auto`` depends on the CPU (bf16 where it is native),
    so a figure meant to sit beside one measured on another machine pins ``fp32``.
    """
    from embedder.adapters import resolve_adapter
    from embedder.encoder import Embedder, EmbedderConfig
    from embedder.models import resolve_model
    from training.adapter_io import embedding_config_for

    resolved = resolve_model(model)
    adapter_dir = resolve_adapter(adapter, resolved.name)
    cfg = embedding_config_for(adapter_dir, max_length, batch_size)
    if cfg is None and (max_length or batch_size):
        base = EmbedderConfig()
        cfg = EmbedderConfig(max_length=max_length or base.max_length, batch_size=batch_size or base.batch_size)
    emb = Embedder.load(model, adapter=str(adapter_dir) if adapter_dir else "none", config=cfg, dtype=dtype)
    set_threads(threads)
    return emb
