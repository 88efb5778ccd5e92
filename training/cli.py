"""Console scripts: ``train-text2token``, ``sts-eval`` and ``text2token-diagnose``."""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import replace
from pathlib import Path

from embedder.util import set_threads
from training.cli_common import add_prompt_arguments, fail, recipe_with_args, report_adapter, setup, staged_parser
from training.config import RECIPES, Stage


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


# --------------------------------------------------------------- training
def train_parser() -> argparse.ArgumentParser:
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


def train_main(argv: list[str] | None = None) -> int:
    args = train_parser().parse_args(argv)
    setup(args.threads, args.quiet)
    from embedder.models import ModelNotAvailable, cache_dir
    from indexer.corpus import CorpusError
    from training.texts import corpus_texts
    from training.trainer import Text2TokenTrainer

    prog = "train-text2token"
    try:
        recipe = recipe_from_args(args)
    except ValueError as exc:
        return fail(prog, exc)
    from training.pairs import PairsFileError, holdout_texts, load_pairs

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
    try:
        trainer = Text2TokenTrainer(
            recipe, texts, args.output, cache_dir=cache, progress=not args.quiet, corpus_info=info, pairs=pairs
        )
    except ModelNotAvailable as exc:
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
    result = trainer.train(resume=not args.no_resume)
    first = result.history[0]["loss"] if result.history else float("nan")
    last = result.history[-1]["loss"] if result.history else float("nan")
    rate = result.tokens / result.seconds if result.seconds else 0.0
    print(
        f"train-text2token: done in {time.perf_counter() - t0:.0f} s ({rate:.0f} training tokens/s), loss {first:.4f} -> {last:.4f}"
    )
    report_adapter(result, recipe.model)
    return 0


# ------------------------------------------------------------------- STS
def sts_main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="sts-eval",
        description="Spearman correlation of cosine similarity with gold STS scores. STS is symmetric: both sentences "
        "read the document template, also with an adapter trained with a query template.",
    )
    p.add_argument("--model", default="smollm2-135m", help="registry name, local HF folder or .gguf")
    p.add_argument("--adapter", default="default", help="default | none | adapter folder")
    p.add_argument("--pairs", required=True, type=Path, help="TSV with header sentence1, sentence2, score (STS-B layout)")
    p.add_argument("--limit", type=int, help="only the first N pairs")
    p.add_argument("--batch-size", type=int)
    p.add_argument("--threads", type=int)
    p.add_argument(
        "--dtype",
        choices=["auto", "fp32", "bf16", "int8"],
        default="auto",
        help="encoder precision (auto: bf16 where the CPU has it natively, else fp32)",
    )
    p.add_argument("--json", action="store_true", help="print a JSON object")
    args = p.parse_args(argv)
    setup(args.threads, quiet=True)
    from embedder.models import ModelNotAvailable
    from training.sts import Pairs, PairsError, read_pairs, sts_spearman

    try:
        pairs = read_pairs(args.pairs)
        if args.limit:
            pairs = Pairs(pairs.left[: args.limit], pairs.right[: args.limit], pairs.scores[: args.limit])
        emb = load_embedder(args.model, args.adapter, batch_size=args.batch_size, threads=args.threads, dtype=args.dtype)
    except (PairsError, ModelNotAvailable) as exc:
        return fail("sts-eval", exc)
    t0 = time.perf_counter()
    res = sts_spearman(emb, pairs)
    res |= {
        "model": emb.identity["name"],
        "adapter": emb.adapter["path"] if emb.adapter else None,
        "pooling": emb.config.pooling,
        "attention": emb.config.attention,
        "encoder": emb.runtime_info(),
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
    setup(args.threads, quiet=True)
    from embedder.models import ModelNotAvailable
    from embedder.util import write_json_atomic
    from indexer.corpus import CorpusError
    from training.diagnostics import compare_embedders
    from training.texts import corpus_texts

    try:
        texts = args.text or corpus_texts([args.corpus], args.format, args.n, args.seed)[0]
        after = load_embedder(args.model, args.adapter, threads=args.threads)
        if after.adapter is None:
            raise ModelNotAvailable(f"--adapter {args.adapter!r} resolves to no adapter: nothing to compare")
        from embedder.encoder import Embedder, EmbedderConfig

        # The backbone read with the trained embedder's prompt, pooling and attention; memory
        # pooling reads learned vectors the backbone does not have, so the backbone is then read
        # the engine's default way (its prompt, last token).
        before_config = after.config
        if after.config.pooling == "memory":
            before_config = EmbedderConfig(max_length=after.config.max_length, batch_size=after.config.batch_size)
        before = Embedder.load(args.model, adapter="none", config=before_config)
        set_threads(args.threads)
    except (CorpusError, ModelNotAvailable) as exc:
        return fail("text2token-diagnose", exc)
    report = compare_embedders(before, after, texts, args.k, args.show, args.out)
    report["adapter"] = after.adapter
    report["before_reading"] = {"prompt": before.config.prompt, "pooling": before.config.pooling, "attention": before.config.attention}
    args.out.mkdir(parents=True, exist_ok=True)
    write_json_atomic(args.out / "diagnostics.json", report, sort_keys=True, ensure_ascii=True)
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
