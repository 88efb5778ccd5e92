"""Console script ``text2token-diagnose``: aligned tokens before/after training, Hit@K/LAR/GAR, PC variation (training/diagnostics.py)."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from training.cli.common import fail, load_embedder, set_threads, setup


def main(argv: list[str] | None = None) -> int:
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
    sys.exit(main())
