"""Compare readings of Text2Token Eq. 17 on a real corpus (the measurement behind the default).

    python -m training.readings --corpus ../shared/data/cisi [--corpus ...] [--model smollm2-135m]

Tags the corpus once, then prints, for each reading, the effective number of target tokens
exp(H), the mass on the POS-selected tokens and the top-1 mass.
"""

from __future__ import annotations

import argparse
import json
import sys
import time

import numpy as np

from training.config import POS_KEEP, SPACY_MODEL, DataTargetConfig

READINGS = {
    "selected, T=1 (default)": DataTargetConfig(),
    "full, T=1 (literal Eq. 17)": DataTargetConfig(reading="full"),
    "full, T=0.1": DataTargetConfig(reading="full", temperature=0.1),
    "full, T=0.05": DataTargetConfig(reading="full", temperature=0.05),
    "selected, tf=document": DataTargetConfig(tf="document"),
}


def compare_readings(texts, tokenizer, vocab_size: int, max_length: int = 128, top_n: int = 128) -> dict:
    """Target statistics of each reading in :data:`READINGS` over ``texts``."""
    from training.targets_data import load_spacy, tag_texts, targets_from_tagged

    t0 = time.perf_counter()
    tagged = tag_texts(texts, tokenizer, load_spacy(SPACY_MODEL), max_length, POS_KEEP)
    out: dict = {"n_texts": len(texts), "tag_seconds": round(time.perf_counter() - t0, 1)}
    for name, cfg in READINGS.items():
        t = targets_from_tagged(tagged, vocab_size, cfg, top_n)
        sm = t.summary()
        selected_mass = t.probs.astype(np.float64).sum(1)[t.valid()]
        sm["selected_mass_median"] = float(np.median(selected_mass)) if len(selected_mass) else 0.0
        sm["n_empty"] = t.meta["n_empty"]
        out[name] = sm
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m training.readings", description=__doc__.split("\n\n")[0])
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
