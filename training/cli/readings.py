"""Compare readings of Text2Token Eq. 17 on a real corpus (the measurement behind the default).

    python -m training.cli.readings --corpus ../shared/data/cisi [--corpus ...] [--model smollm2-135m]

Tags the corpus once, then prints, for each reading, the effective number of target tokens
exp(H), the mass on the POS-selected tokens and the top-1 mass.
"""
from __future__ import annotations

import argparse
import json
import sys

from training.text2token.readings import READINGS, compare_readings


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m training.cli.readings", description=__doc__.split("\n\n")[0])
    p.add_argument("--corpus", action="append", required=True)
    p.add_argument("--model", default="smollm2-135m")
    p.add_argument("--max-length", type=int, default=128)
    p.add_argument("--json", action="store_true")
    args = p.parse_args(argv)
    from transformers import AutoTokenizer

    from embedder.models import resolve_model
    from training.texts import corpus_texts

    texts, _ = corpus_texts(args.corpus)
    resolved = resolve_model(args.model)
    tok = AutoTokenizer.from_pretrained(resolved.directory)
    from transformers import AutoConfig

    vocab = int(AutoConfig.from_pretrained(resolved.directory).vocab_size)
    res = compare_readings(texts, tok, vocab, args.max_length)
    if args.json:
        print(json.dumps(res, indent=2))
        return 0
    print(f"{res['n_texts']} texts, vocabulary {vocab}, tagging {res['tag_seconds']} s")
    print(f"{'reading':28s} {'eff. tokens mean':>16s} {'median':>9s} {'sel. mass mean':>14s} {'median':>7s} {'top-1':>6s}")
    for name in READINGS:
        s = res[name]
        print(
            f"{name:28s} {s['effective_tokens_mean']:16.1f} {s['effective_tokens_median']:9.1f} "
            f"{s['listed_mass_mean']:14.3f} {s['selected_mass_median']:7.3f} {s['top1_mass_mean']:6.3f}"
        )
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
