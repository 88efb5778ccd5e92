"""Console script ``train-text2token``: Text2Token on an unlabeled corpus and/or supervised contrastive on pairs files.

The trainer is training/text2token/trainer.py; the recipes are training/text2token/recipe.py.
"""

from __future__ import annotations

import argparse
import shutil
import sys
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING

from training.cli.common import add_prompt_arguments, fail, recipe_with_args, report_adapter, set_threads, setup, staged_parser
from training.text2token.recipe import RECIPES, Recipe, Stage

if TYPE_CHECKING:  # the CLI imports torch only once it runs
    from training.epoch import EpochState, Plan


def parser() -> argparse.ArgumentParser:
    p = staged_parser(
        "train-text2token",
        "Train an embedder (LoRA adapter) from a backbone: Text2Token on an unlabeled corpus (documents only), "
        "and/or supervised contrastive on pairs files (--pairs, with a contrastive recipe).",
        RECIPES,
        Stage,
        "data:500,model:200",
        corpus_required=False,
        recipe_help=", under an hour on 2 cores",
    )
    p.add_argument(
        "--pairs",
        action="extend",
        nargs="+",
        type=Path,
        help="TSV of anchor<TAB>positive[<TAB>negative] pairs for the contrastive stage (one source per file); repeatable, "
        "and takes several paths per flag",
    )
    p.add_argument(
        "--holdout",
        action="extend",
        nargs="+",
        type=Path,
        default=[],
        help="evaluation texts that training must never see: a BEIR folder (its queries), an STS TSV, a folder of them; "
        "pairs containing one are dropped; repeatable, and takes several paths per flag",
    )
    p.add_argument("--max-pairs", dest="max_pairs_per_source", type=int, help="seeded sample of this many pairs per pairs file")
    p.add_argument("--kl-weight", type=float, help="weight of the joint Text2Token KL in the contrastive stage (0 = off)")
    p.add_argument("--learn-temperature", action=argparse.BooleanOptionalAction, default=None)
    p.add_argument("--symmetric", action=argparse.BooleanOptionalAction, default=None, help="add the positive -> anchor loss")
    p.add_argument("--init-adapter", help="continue from this adapter ('default' = shipped, 'none' = fresh LoRA)")
    p.add_argument(
        "--group-by-length",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="batch texts of similar length together (less padding)",
    )
    p.add_argument("--pooling", choices=["last", "mean"])
    add_prompt_arguments(p)
    p.add_argument("--top-n", type=int, help="target entries cached per text")
    p.add_argument(
        "--data-reading",
        choices=["selected", "full"],
        help="Eq. 17: softmax over selected tokens (default) or the whole vocabulary",
    )
    p.add_argument("--data-temperature", type=float, help="divide Eq. 17's scores by this (default 1)")
    p.add_argument("--tf", choices=["corpus", "document"], help="Eq. 13 as written (corpus) or count / text length (document)")
    p.add_argument("--filter", choices=["div", "log", "sub"], help="model-derived filter (Eq. 18 = div; Appendix C: log, sub)")
    p.add_argument("--tau", type=float, help="Eq. 19 temperature (paper: 1e-4)")
    p.add_argument("--common-size", type=int, help="texts averaged into the common distribution Q̄")
    p.add_argument("--model-pool", type=int, help="texts given a model-derived target (stage-2 pool); 0 = all")
    p.add_argument(
        "--targets-cache",
        default=None,
        help="folder caching targets per corpus/model/config, or 'none' (default: the model cache)",
    )
    p.add_argument("--targets-only", action="store_true", help="compute and cache the targets, then stop")
    g = p.add_argument_group("issue 30: one epoch in chunks, hard negatives, a teacher")
    g.add_argument(
        "--epoch-chunk", type=int, metavar="STEPS",
        help="train the next STEPS batches of one epoch over --pairs (every pair once, one source per batch, batch >= 32), "
        "from the adapter the last chunk committed; each chunk is a run in OUTPUT/chunk-NNNN, the position is in --epoch-state",
    )
    g.add_argument("--epoch-state", type=Path, help="the epoch's position file (default: OUTPUT/epoch.json)")
    g.add_argument("--hard-negatives", choices=["none", "bm25"], help="extra negatives: each anchor's best BM25 hit among "
                   "its source's other positives (mined once per file and cached)")
    g.add_argument("--negatives-cache", help="folder caching mined negatives, or 'none' (default: the model cache)")
    g.add_argument("--teacher-kl-weight", type=float, help="weight of the listwise KL to MiniLM's in-batch similarity "
                   "distribution, beside InfoNCE (0 = off)")
    g.add_argument("--teacher-temperature", type=float, help="temperature of the teacher's softmax (default 0.05)")
    g.add_argument("--teacher-cache", help="folder caching teacher embeddings per text, or 'none' (default: the model cache)")
    return p


def recipe_from_args(args: argparse.Namespace):
    """The named recipe with the command line's overrides, target settings included."""
    r = recipe_with_args(RECIPES[args.recipe], args)
    if args.init_adapter is not None:
        r = replace(r, init_adapter=None if args.init_adapter == "none" else args.init_adapter)
    dt, mt = r.data_target, r.model_target
    return replace(
        r,
        data_target=replace(
            dt, reading=args.data_reading or dt.reading, temperature=args.data_temperature or dt.temperature, tf=args.tf or dt.tf
        ),
        model_target=replace(
            mt,
            filter=args.filter or mt.filter,
            tau=args.tau or mt.tau,
            common_size=args.common_size or mt.common_size,
            pool_size=mt.pool_size if args.model_pool is None else (args.model_pool or None),
        ),
    )


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    setup(args.threads, args.quiet)
    from embedder.models import ModelNotAvailable, cache_dir
    from indexer.corpus import CorpusError
    from training.text2token.trainer import Text2TokenTrainer
    from training.texts import corpus_texts

    prog = "train-text2token"
    try:
        recipe = recipe_from_args(args)
    except ValueError as exc:
        return fail(prog, exc)
    from training.pairs import PairsFileError, holdout_texts, load_pairs

    if args.teacher_kl_weight and not args.pairs:
        return fail(prog, "--teacher-kl-weight needs --pairs (it distils the pairs stage's similarities)")
    if args.epoch_chunk is not None and (args.corpus or [s.target for s in recipe.stages if s.steps] != ["pairs"]):
        return fail(prog, "--epoch-chunk trains one pairs stage: a contrastive recipe (e.g. --recipe contrastive), no --corpus")
    has_pairs_stage = any(s.target == "pairs" and s.steps for s in recipe.stages)
    if has_pairs_stage != bool(args.pairs):
        return fail(
            prog,
            "the recipe has a pairs stage: give --pairs FILE"
            if has_pairs_stage
            else "--pairs needs a recipe with a pairs stage (e.g. --recipe contrastive-cpu)",
        )
    if not args.corpus and not args.pairs:
        return fail(prog, "give --corpus (Text2Token) and/or --pairs (contrastive)")
    pairs, texts, info = None, [], {}
    try:
        if args.pairs:
            pairs = load_pairs(args.pairs, recipe.max_pairs_per_source, recipe.seed, holdout_texts(args.holdout))
            texts = list(pairs.texts)
            info["pairs"] = pairs.describe() | {"holdout": [str(h) for h in args.holdout]}
        if args.corpus:
            corpus, cinfo = corpus_texts(args.corpus, args.format, args.max_texts, recipe.seed)
            texts += corpus
            info |= cinfo
    except (CorpusError, PairsFileError) as exc:
        return fail(prog, exc)
    if not texts:
        return fail(prog, "the corpus holds no documents")
    cache = None if args.targets_cache == "none" else Path(args.targets_cache or cache_dir() / "text2token-targets")
    t0 = time.perf_counter()
    run_dir, extra, epoch = args.output, {}, None
    try:
        if args.epoch_chunk is not None:
            epoch = _begin_epoch_chunk(args, recipe, pairs)
            recipe, run_dir = epoch.recipe, epoch.chunk_dir
            extra = {"pair_plan": epoch.plan[epoch.start : epoch.end], "schedule": (epoch.start, len(epoch.plan)),
                     "step_log": args.output / "steps.jsonl"}
            info["epoch"] = {"state": str(epoch.state_path), "batches": [epoch.start, epoch.end], "of": len(epoch.plan)}
        if pairs is not None and recipe.hard_negatives == "bm25":
            from training.hard_negatives import attach_bm25_negatives

            neg_cache = None if args.negatives_cache == "none" else Path(args.negatives_cache or cache_dir() / "bm25-negatives")
            attach_bm25_negatives(pairs, neg_cache)
        if recipe.teacher_kl_weight > 0:
            from training.teacher import TeacherEmbeddings

            t_cache = None if args.teacher_cache == "none" else Path(args.teacher_cache or cache_dir() / "teacher-embeddings")
            extra["teacher"] = TeacherEmbeddings.minilm(pairs.texts, t_cache, progress=not args.quiet)
        trainer = Text2TokenTrainer(
            recipe, texts, run_dir, cache_dir=cache, progress=not args.quiet, corpus_info=info, pairs=pairs, **extra
        )
    except (ModelNotAvailable, ValueError) as exc:
        return fail(prog, exc)
    set_threads(args.threads)
    print(
        f"train-text2token: {len(texts)} texts"
        + (f" ({sum(len(s) for s in pairs.sources)} pairs in {len(pairs.sources)} sources, {sum(pairs.dropped.values())} dropped as held-out overlap)" if pairs else "")
        + f", recipe {args.recipe} ({recipe.total_steps} steps x {recipe.batch_size} texts, "
        f"{' + '.join(f'{s.steps} {s.target}' for s in recipe.stages)}), output {args.output}",
        file=sys.stderr,
    )
    trainer.prepare_targets()
    for kind, t in trainer.targets.items():
        sm = t.summary()
        print(
            f"  {'data-driven' if kind == 'data' else 'model-derived'} targets: {sm['n_texts']} texts, computed in {t.meta.get('seconds')} s{' (cached)' if 'cache' in t.meta else ''}; effective tokens "
            f"{sm.get('effective_tokens_mean', 0):.1f} (median {sm.get('effective_tokens_median', 0):.1f}), mass on the "
            f"{sm.get('listed_tokens_mean', 0):.1f} listed tokens {sm.get('listed_mass_mean', 0):.3f}",
            file=sys.stderr,
        )
    if args.targets_only:
        return 0
    if epoch is not None:
        return _run_chunk(trainer, epoch, resume=not args.no_resume)
    result = trainer.train(resume=not args.no_resume)
    first = result.history[0]["loss"] if result.history else float("nan")
    last = result.history[-1]["loss"] if result.history else float("nan")
    rate = result.tokens / result.seconds if result.seconds else 0.0
    print(
        f"train-text2token: done in {time.perf_counter() - t0:.0f} s ({rate:.0f} training tokens/s), loss {first:.4f} -> {last:.4f}"
    )
    report_adapter(result, recipe.model)
    return 0


@dataclass
class _EpochChunk:
    """The chunk of the epoch this call trains (training/epoch.py)."""

    state: EpochState
    state_path: Path
    plan: Plan
    start: int
    end: int
    chunk_dir: Path
    recipe: Recipe


def _begin_epoch_chunk(args: argparse.Namespace, recipe: Recipe, pairs) -> _EpochChunk:
    """Plan the epoch, read its position, and record the chunk to train as pending (ValueError if none is left)."""
    from training.epoch import begin_chunk, epoch_plan, open_epoch

    plan = epoch_plan(pairs.sources, recipe.batch_size, recipe.seed)
    state_path = args.epoch_state or args.output / "epoch.json"
    state = open_epoch(state_path, pairs, plan, recipe.batch_size, recipe.seed)
    if state.done:
        raise ValueError(f"the epoch in {state_path} is complete ({state.batches} batches, {state.pairs} pairs)")
    args.output.mkdir(parents=True, exist_ok=True)
    start, end, chunk_dir = begin_chunk(state, state_path, args.epoch_chunk, args.output)
    init = state.adapter_path(state_path) or recipe.init_adapter
    chunk_recipe = replace(recipe, stages=(Stage("pairs", end - start),), init_adapter=init)
    print(
        f"train-text2token: epoch {state_path}: batches {start}..{end} of {len(plan)} "
        f"({state.pairs} pairs in all), from {init or 'a fresh LoRA'}, into {chunk_dir}",
        file=sys.stderr,
    )
    return _EpochChunk(state, Path(state_path), plan, start, end, chunk_dir, chunk_recipe)


def _run_chunk(trainer, epoch: _EpochChunk, resume: bool) -> int:
    """Train the pending chunk (resuming its checkpoints) and, once its adapter is written, commit the position."""
    from embedder.hardware import device_capability
    from training.epoch import commit_chunk
    from training.loop import CHECKPOINTS

    result = trainer.train(resume=resume)
    if not result.completed:
        return 1
    hist = result.history
    device = "cuda" if str(trainer.embedder.device).startswith("cuda") else "cpu"
    commit_chunk(epoch.state, epoch.state_path, result.adapter_dir, epoch.plan, {
        "steps": len(hist),
        "training_seconds": round(sum(h["seconds"] for h in hist), 1),
        "loss_first": hist[0]["loss"] if hist else None,
        "loss_last": hist[-1]["loss"] if hist else None,
        "device": device_capability(device).describe(),
        "finished": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
    })
    # The next chunk starts from the adapter: the committed chunk's checkpoints (~20 MB each) are
    # dead weight, and a run folder carried between sessions stays small without them.
    shutil.rmtree(epoch.chunk_dir / CHECKPOINTS, ignore_errors=True)
    s = epoch.state
    seen = sum(c["pairs"] for c in s.chunks)
    print(f"train-text2token: chunk {s.chunks[-1]['chunk']} committed: position {s.position} of {s.batches} batches, "
          f"{seen} of {s.pairs} pairs seen; adapter {result.adapter_dir}")
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
