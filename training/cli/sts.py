"""Console script ``sts-eval``: Spearman correlation of an embedder's cosine similarities with gold STS scores (training/sts.py)."""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from training.cli.common import fail, load_embedder, setup


def main(argv: list[str] | None = None) -> int:
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


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
