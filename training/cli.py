"""Console scripts: ``train-text2token``, ``sts-eval`` and ``text2token-diagnose``."""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import time
from dataclasses import replace
from pathlib import Path

from training.config import RECIPES, DataTargetConfig, ModelTargetConfig, Stage

log = logging.getLogger("training")


def _setup(threads: int | None, quiet: bool) -> None:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    logging.basicConfig(level=logging.WARNING if quiet else logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    if threads:
        import torch

        torch.set_num_threads(threads)


def load_embedder(
    model: str, adapter: str, max_length: int | None = None, batch_size: int | None = None, threads: int | None = None
):
    """An Embedder for a backbone and adapter, pooling the way the adapter was trained to."""
    import torch

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
    emb = Embedder.load(model, adapter=str(adapter_dir) if adapter_dir else "none", config=cfg)
    if threads:
        torch.set_num_threads(threads)  # Embedder.load sets all cores; respect the caller's choice
    return emb


# --------------------------------------------------------------- training
def _parse_stages(spec: str) -> tuple[Stage, ...]:
    stages = []
    for part in spec.split(","):
        try:
            target, steps = part.split(":")
            stages.append(Stage(target.strip(), int(steps)))
        except ValueError as exc:
            raise argparse.ArgumentTypeError(f"--stages expects e.g. data:500,model:200, got {spec!r} ({exc})") from None
    return tuple(stages)


def train_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="train-text2token",
        description="Train an embedder (LoRA adapter) from a backbone: Text2Token on an unlabeled corpus (documents only), "
        "and/or supervised contrastive on pairs files (--pairs, with a contrastive recipe).",
    )
    p.add_argument("--corpus", action="append", help="corpus to train on (BEIR folder, .jsonl, .tsv); repeatable")
    p.add_argument(
        "--pairs",
        action="append",
        type=Path,
        help="TSV of anchor<TAB>positive[<TAB>negative] pairs for the contrastive stage (one source per file); repeatable",
    )
    p.add_argument(
        "--holdout",
        action="append",
        type=Path,
        default=[],
        help="evaluation texts that training must never see: a BEIR folder (its queries), an STS TSV, a folder of them; "
        "pairs containing one are dropped; repeatable",
    )
    p.add_argument("--max-pairs", type=int, help="seeded sample of this many pairs per pairs file")
    p.add_argument("--kl-weight", type=float, help="weight of the joint Text2Token KL in the contrastive stage (0 = off)")
    p.add_argument("--temperature", type=float, help="InfoNCE temperature (initial value if learned)")
    p.add_argument("--learn-temperature", action=argparse.BooleanOptionalAction, default=None)
    p.add_argument("--symmetric", action=argparse.BooleanOptionalAction, default=None, help="add the positive -> anchor loss")
    p.add_argument("--init-adapter", help="continue from this adapter ('default' = shipped, 'none' = fresh LoRA)")
    p.add_argument("--format", choices=["beir", "jsonl", "tsv"], help="corpus format (guessed from the path by default)")
    p.add_argument("--output", required=True, type=Path, help="run folder: adapter/, checkpoints/, loss_curve.{json,png}")
    p.add_argument(
        "--recipe", choices=sorted(RECIPES), default="cpu", help="starting recipe (default: cpu, under an hour on 2 cores)"
    )
    p.add_argument("--model", help="backbone: registry name, local HF folder or .gguf (default: the recipe's)")
    p.add_argument("--stages", type=_parse_stages, help="e.g. data:500,model:200 (targets: data, model)")
    p.add_argument("--batch-size", type=int, help="texts per optimizer step")
    p.add_argument("--micro-batch-size", type=int, help="texts per forward pass (gradient accumulation = batch / micro)")
    p.add_argument("--max-length", type=int, help="text tokens kept per text (template added on top)")
    p.add_argument("--lr", type=float)
    p.add_argument("--warmup-steps", type=int)
    p.add_argument("--schedule", choices=["constant", "linear"])
    p.add_argument("--seed", type=int)
    p.add_argument(
        "--group-by-length",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="batch texts of similar length together (less padding)",
    )
    p.add_argument("--pooling", choices=["last", "mean"])
    p.add_argument("--attention", choices=["causal", "bidirectional"])
    p.add_argument("--lora-r", type=int)
    p.add_argument("--lora-alpha", type=int)
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
    p.add_argument("--max-texts", type=int, help="train on a seeded sample of this many documents")
    p.add_argument("--save-every", type=int, help="optimizer steps between checkpoints")
    p.add_argument(
        "--targets-cache",
        default=None,
        help="folder caching targets per corpus/model/config, or 'none' (default: the model cache)",
    )
    p.add_argument("--no-resume", action="store_true", help="start over even if the run folder holds checkpoints")
    p.add_argument("--targets-only", action="store_true", help="compute and cache the targets, then stop")
    p.add_argument("--threads", type=int, help="torch CPU threads (default: all cores)")
    p.add_argument("--quiet", action="store_true")
    return p


def recipe_from_args(args: argparse.Namespace):
    r = RECIPES[args.recipe]
    r = r.with_overrides(
        model=args.model,
        stages=args.stages,
        batch_size=args.batch_size,
        micro_batch_size=args.micro_batch_size,
        max_length=args.max_length,
        lr=args.lr,
        warmup_steps=args.warmup_steps,
        schedule=args.schedule,
        seed=args.seed,
        pooling=args.pooling,
        attention=args.attention,
        lora_r=args.lora_r,
        lora_alpha=args.lora_alpha,
        top_n=args.top_n,
        save_every=args.save_every,
        group_by_length=args.group_by_length,
        max_pairs_per_source=args.max_pairs,
        kl_weight=args.kl_weight,
        temperature=args.temperature,
        learn_temperature=args.learn_temperature,
        symmetric=args.symmetric,
    )
    if args.init_adapter is not None:
        r = replace(r, init_adapter=None if args.init_adapter == "none" else args.init_adapter)
    if args.batch_size and not args.micro_batch_size and args.batch_size % r.micro_batch_size:
        r = replace(r, micro_batch_size=args.batch_size)
    dt = r.data_target
    r = replace(
        r,
        data_target=DataTargetConfig(
            reading=args.data_reading or dt.reading,
            temperature=args.data_temperature or dt.temperature,
            tf=args.tf or dt.tf,
            pos_keep=dt.pos_keep,
            spacy_model=dt.spacy_model,
        ),
    )
    mt = r.model_target
    pool = mt.pool_size if args.model_pool is None else (args.model_pool or None)
    r = replace(
        r,
        model_target=ModelTargetConfig(
            filter=args.filter or mt.filter,
            tau=args.tau or mt.tau,
            common_size=args.common_size or mt.common_size,
            pool_size=pool,
        ),
    )
    return r


def train_main(argv: list[str] | None = None) -> int:
    args = train_parser().parse_args(argv)
    _setup(args.threads, args.quiet)
    from embedder.models import ModelNotAvailable, cache_dir
    from indexer.corpus import CorpusError
    from training.texts import corpus_texts
    from training.trainer import Text2TokenTrainer

    try:
        recipe = recipe_from_args(args)
    except ValueError as exc:
        print(f"train-text2token: {exc}", file=sys.stderr)
        return 2
    from training.pairs import PairsFileError, holdout_texts, load_pairs

    has_pairs_stage = any(s.target == "pairs" and s.steps for s in recipe.stages)
    if has_pairs_stage != bool(args.pairs):
        print(
            "train-text2token: "
            + ("the recipe has a pairs stage: give --pairs FILE" if has_pairs_stage else "--pairs needs a recipe with a pairs stage (e.g. --recipe contrastive-cpu)"),
            file=sys.stderr,
        )
        return 2
    if not args.corpus and not args.pairs:
        print("train-text2token: give --corpus (Text2Token) and/or --pairs (contrastive)", file=sys.stderr)
        return 2
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
        print(f"train-text2token: {exc}", file=sys.stderr)
        return 2
    if not texts:
        print("train-text2token: the corpus holds no documents", file=sys.stderr)
        return 2
    cache = None if args.targets_cache == "none" else Path(args.targets_cache or cache_dir() / "text2token-targets")
    t0 = time.perf_counter()
    try:
        trainer = Text2TokenTrainer(
            recipe, texts, args.output, cache_dir=cache, progress=not args.quiet, corpus_info=info, pairs=pairs
        )
    except ModelNotAvailable as exc:
        print(f"train-text2token: {exc}", file=sys.stderr)
        return 2
    if args.threads:
        import torch

        torch.set_num_threads(args.threads)
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
    result = trainer.train(resume=not args.no_resume)
    first = result.history[0]["loss"] if result.history else float("nan")
    last = result.history[-1]["loss"] if result.history else float("nan")
    rate = result.tokens / result.seconds if result.seconds else 0.0
    print(
        f"train-text2token: done in {time.perf_counter() - t0:.0f} s ({rate:.0f} training tokens/s), loss {first:.4f} -> {last:.4f}"
    )
    print(f"adapter: {result.adapter_dir}")
    print(f"use it: build-index --corpus CORPUS --index INDEX --model {recipe.model} --adapter {result.adapter_dir}")
    return 0


# ------------------------------------------------------------------- STS
def sts_main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="sts-eval", description="Spearman correlation of cosine similarity with gold STS scores.")
    p.add_argument("--model", default="smollm2-135m", help="registry name, local HF folder or .gguf")
    p.add_argument("--adapter", default="default", help="default | none | adapter folder")
    p.add_argument("--pairs", required=True, type=Path, help="TSV with header sentence1, sentence2, score (STS-B layout)")
    p.add_argument("--limit", type=int, help="only the first N pairs")
    p.add_argument("--batch-size", type=int)
    p.add_argument("--threads", type=int)
    p.add_argument("--json", action="store_true", help="print a JSON object")
    args = p.parse_args(argv)
    _setup(args.threads, quiet=True)
    from embedder.models import ModelNotAvailable
    from training.sts import Pairs, PairsError, read_pairs, sts_spearman

    try:
        pairs = read_pairs(args.pairs)
        if args.limit:
            pairs = Pairs(pairs.left[: args.limit], pairs.right[: args.limit], pairs.scores[: args.limit])
        emb = load_embedder(args.model, args.adapter, batch_size=args.batch_size, threads=args.threads)
    except (PairsError, ModelNotAvailable) as exc:
        print(f"sts-eval: {exc}", file=sys.stderr)
        return 2
    t0 = time.perf_counter()
    res = sts_spearman(emb, pairs)
    res |= {
        "model": emb.identity["name"],
        "adapter": emb.adapter["path"] if emb.adapter else None,
        "pooling": emb.config.pooling,
        "attention": emb.config.attention,
        "pairs": str(args.pairs),
        "seconds": round(time.perf_counter() - t0, 1),
    }
    if args.json:
        print(json.dumps(res, indent=2))
    else:
        print(
            f"spearman {res['spearman']:.4f}  ({res['n_pairs']} pairs, model {res['model']}, adapter {res['adapter'] or 'none'}, "
            f"{res['seconds']} s)"
        )
    return 0


# ------------------------------------------------------------ diagnostics
def diagnose_main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="text2token-diagnose",
        description="Aligned tokens before/after training, Hit@K/LAR/GAR, and the principal-component variation plot.",
    )
    p.add_argument("--model", default="smollm2-135m")
    p.add_argument("--adapter", required=True, help="the trained adapter folder (or 'default')")
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--corpus", help="texts to analyse: BEIR folder, .jsonl or .tsv")
    src.add_argument("--text", action="append", help="a text to analyse (repeatable)")
    p.add_argument("--format", choices=["beir", "jsonl", "tsv"])
    p.add_argument("--n", type=int, default=1000, help="texts sampled from the corpus (default 1000)")
    p.add_argument("--k", type=int, default=10, help="K of Hit@K and of the aligned-token lists")
    p.add_argument("--show", type=int, default=3, help="texts whose aligned tokens are printed")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument(
        "--out", type=Path, default=Path("text2token-diagnostics"), help="folder for diagnostics.json and pc_variation.png"
    )
    p.add_argument("--threads", type=int)
    p.add_argument("--json", action="store_true")
    args = p.parse_args(argv)
    _setup(args.threads, quiet=True)
    from embedder.models import ModelNotAvailable
    from indexer.corpus import CorpusError
    from training.diagnostics import compare_embedders
    from training.target_cache import write_json_atomic
    from training.texts import corpus_texts

    try:
        texts = args.text or corpus_texts([args.corpus], args.format, args.n, args.seed)[0]
        after = load_embedder(args.model, args.adapter, threads=args.threads)
        if after.adapter is None:
            raise ModelNotAvailable(f"--adapter {args.adapter!r} resolves to no adapter: nothing to compare")
        from embedder.encoder import Embedder

        # The backbone read with the trained embedder's prompt, pooling and attention.
        before = Embedder.load(args.model, adapter="none", config=after.config)
        if args.threads:
            import torch

            torch.set_num_threads(args.threads)
    except (CorpusError, ModelNotAvailable) as exc:
        print(f"text2token-diagnose: {exc}", file=sys.stderr)
        return 2
    report = compare_embedders(before, after, texts, args.k, args.show, args.out)
    report["adapter"] = after.adapter
    args.out.mkdir(parents=True, exist_ok=True)
    write_json_atomic(args.out / "diagnostics.json", report)
    if args.json:
        print(json.dumps(report, indent=2, ensure_ascii=False))
        return 0
    for ex in report["examples"]:
        print(f"\ntext: {ex['text'][:200]}")
        for name in ("before", "after"):
            print(f"  {name:6s}: " + " ".join(t for t, _ in ex[name]))
    k = args.k
    print(f"\n{'':8s} {'Hit@' + str(k):>8s} {'LAR':>8s} {'GAR':>8s}   ({report['n_texts']} texts)")
    for name in ("before", "after"):
        m = report[name]
        print(f"{name:8s} {m[f'hit@{k}']:8.3f} {m['lar']:8.3f} {m['gar']:8.3f}")
    pc = report["pc_variation"]
    print(
        f"\nPC variation: v1 = {pc['v1']:.4f}, largest other |v_{pc['argmax_other']}| = {pc['max_abs_other']:.4f} "
        f"(ratio {pc['v1_ratio']:.1f}); plot: {pc.get('plot')}"
    )
    print(f"report: {args.out / 'diagnostics.json'}")
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(train_main())
