"""Compare readings of Text2Token Eq. 17 on a real corpus (the measurement behind the default).

    python -m training.cli.readings --corpus ../shared/data/cisi [--corpus ...] [--model smollm2-135m]

Tags the corpus once, then prints, for each reading, the effective number of target tokens
exp(H), the mass on the POS-selected tokens and the top-1 mass.
"""

from __future__ import annotations

import time

import numpy as np

from training.text2token.recipe import POS_KEEP, SPACY_MODEL, DataTargetConfig

READINGS = {
    "selected, T=1 (default)": DataTargetConfig(),
    "full, T=1 (literal Eq. 17)": DataTargetConfig(reading="full"),
    "full, T=0.1": DataTargetConfig(reading="full", temperature=0.1),
    "full, T=0.05": DataTargetConfig(reading="full", temperature=0.05),
    "selected, tf=document": DataTargetConfig(tf="document"),
}


def compare_readings(texts, tokenizer, vocab_size: int, max_length: int = 128, top_n: int = 128) -> dict:
    """Target statistics of each reading in :data:`READINGS` over ``texts``."""
    from training.text2token.targets_data import load_spacy, tag_texts, targets_from_tagged

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


