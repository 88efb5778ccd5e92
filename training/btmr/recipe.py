"""BTMR recipes: what decides a run (its fingerprint guards resume) and the sequence layout it trains.

:class:`BTMRRecipe` holds the shared training fields (training/recipe.py TrainRecipe) with
BTMR's defaults; :class:`BTMRConfig` the layout and loss settings (segments, <BMT> group
size, τ, matryoshka prefixes), recorded with the adapter in ``btmr.json``.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import ClassVar

from training.recipe import TrainRecipe


@dataclass(frozen=True)
class BTMRConfig:
    """The BTMR layout and loss settings (recorded with the adapter in ``btmr.json``)."""

    bmt_token_id: int
    group_size: int = 4  # k <BMT> tokens per group (the paper's k = 4)
    segment_length: int = 32  # text tokens per segment (the paper: 64)
    units_per_side: int = 2  # segments of each half of a training document
    temperature: float = 0.02  # the paper's pre-training τ
    lm_weight: float = 1.0
    matryoshka: bool = True

    def __post_init__(self) -> None:
        for name in ("group_size", "segment_length", "units_per_side"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be positive, not {getattr(self, name)}")

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass(frozen=True)
class BTMRRecipe(TrainRecipe):
    """What decides a BTMR run (its fingerprint guards resume); shared fields: training/recipe.py."""

    # steps may grow on resume: with a constant schedule, more steps continue the same run
    NOT_FINGERPRINTED: ClassVar[tuple[str, ...]] = TrainRecipe.NOT_FINGERPRINTED + ("steps",)
    steps: int = 200
    batch_size: int = 8  # document pairs per step
    lr: float = 2e-4
    warmup_steps: int = 10
    max_grad_norm: float | None = None
    lora_dropout: float = 0.0
    # bf16 autocast where the hardware has it natively (training.loop.load_backbone ignores it
    # elsewhere: emulated bf16 is ~5x slower than fp32); what was used is in the adapter record
    bf16: bool = True
    btmr: dict = field(default_factory=dict)  # BTMRConfig fields other than the token id
