"""LLM2Comp recipes: compression pre-training (CTKD) and unsupervised contrastive stages.

A recipe is a frozen dataclass, written into the adapter (``llm2comp.json``), hashed for
checkpoint/resume safety. Stages run in order in one run (one LoRA, one optimizer):

- ``ctkd``: LLM2Comp §3 continuation task with knowledge distillation (training/llm2comp.py).
- ``simcse``: two dropout views of one text, in-batch negatives (SimCSE; the paper's UCL).
- ``spans``: two spans of one document, or a sentence and its document (training/corpus_pairs.py).

The contrastive stages also run after Text2Token: ``init_adapter`` starts from that adapter
(its LoRA keeps training, with its own prompt and pooling), ``memory_tokens=0``.
"""
from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass, fields, replace
from typing import Any

STAGE_KINDS = ("ctkd", "simcse", "spans")
PLAIN_PROMPT = "[text]"  # LLM2Comp reads the bare text; the memory slots follow it


@dataclass(frozen=True)
class LLM2CompStage:
    """One stage: what it learns from and for how many optimizer steps."""

    kind: str
    steps: int

    def __post_init__(self) -> None:
        if self.kind not in STAGE_KINDS:
            raise ValueError(f"stage kind must be one of {STAGE_KINDS}, not {self.kind!r}")
        if self.steps < 0:
            raise ValueError("stage steps must be >= 0")


@dataclass(frozen=True)
class LLM2CompRecipe:
    """Everything that determines an LLM2Comp run (and hence its result, given the corpus)."""

    model: str = "smollm2-135m"
    stages: tuple[LLM2CompStage, ...] = (LLM2CompStage("ctkd", 8000), LLM2CompStage("simcse", 1000))
    batch_size: int = 4  # texts per optimizer step (CTKD); contrastive stages use contrastive_batch_size
    contrastive_batch_size: int = 128  # pairs per contrastive step (in-batch negatives; GradCache)
    micro_batch_size: int = 4  # texts per forward pass
    max_length: int = 128  # text tokens read by the encoder
    continuation_length: int = 32  # CTKD: continuation tokens distilled after the cut
    min_text: int = 10  # CTKD: the cut leaves at least this many text tokens (the authors: 10)
    min_continuation: int = 8  # CTKD: documents shorter than min_text + this are not cut
    memory_tokens: int = 8  # memory slots (paper: 8); 0 = no memory (contrastive stage on another embedder)
    lr: float = 1e-4
    weight_decay: float = 1e-5
    warmup_steps: int = 100
    schedule: str = "linear"  # "constant" or "linear" (decay to 0) after warm-up
    max_grad_norm: float | None = 1.0
    lora_r: int = 16
    lora_alpha: int = 32
    lora_dropout: float = 0.05
    lora_targets: tuple[str, ...] = ("q_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
    prompt: str = PLAIN_PROMPT
    pooling: str = "memory"
    attention: str = "bidirectional"
    temperature: float = 0.05  # InfoNCE τ (the paper: 0.05)
    dropout: float = 0.2  # attention dropout of the dropout views (the paper: 0.2)
    span_min: int = 16  # spans stage: tokens per span, drawn in [span_min, span_max]
    span_max: int = 64
    sentence_share: float = 0.5  # spans stage: share of (sentence, document) pairs; the rest are two spans
    init_adapter: str | None = None  # start from this LoRA adapter (e.g. Text2Token's) instead of a fresh one
    seed: int = 0
    save_every: int = 25
    keep_checkpoints: int = 2

    def __post_init__(self) -> None:
        for name in ("batch_size", "contrastive_batch_size", "micro_batch_size", "max_length", "continuation_length", "save_every"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be positive, not {getattr(self, name)}")
        if self.batch_size % self.micro_batch_size:
            raise ValueError(f"batch_size ({self.batch_size}) must be a multiple of micro_batch_size ({self.micro_batch_size})")
        if self.schedule not in ("constant", "linear"):
            raise ValueError(f"schedule must be 'constant' or 'linear', not {self.schedule!r}")
        if not self.stages:
            raise ValueError("a recipe needs at least one stage")
        if self.pooling == "memory" and self.memory_tokens < 1:
            raise ValueError("pooling 'memory' needs memory_tokens >= 1")
        if self.memory_tokens and self.pooling != "memory":
            raise ValueError(f"memory_tokens={self.memory_tokens} needs pooling 'memory', not {self.pooling!r}")
        if any(s.kind == "ctkd" and s.steps for s in self.stages) and not self.memory_tokens:
            raise ValueError("a ctkd stage needs memory tokens (memory_tokens >= 1)")
        if not 0 < self.span_min <= self.span_max:
            raise ValueError("need 0 < span_min <= span_max")
        if not 0.0 <= self.sentence_share <= 1.0 or not 0.0 <= self.dropout < 1.0:
            raise ValueError("sentence_share must lie in [0, 1] and dropout in [0, 1)")

    @property
    def total_steps(self) -> int:
        return sum(s.steps for s in self.stages)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> LLM2CompRecipe:
        d = dict(d)
        unknown = set(d) - {f.name for f in fields(cls)}
        if unknown:
            raise ValueError(f"unknown recipe fields: {sorted(unknown)}")
        if "stages" in d:
            d["stages"] = tuple(LLM2CompStage(**s) if isinstance(s, dict) else s for s in d["stages"])
        if "lora_targets" in d:
            d["lora_targets"] = tuple(d["lora_targets"])
        return cls(**d)

    def fingerprint(self, exclude: tuple[str, ...] = ("save_every", "keep_checkpoints")) -> str:
        """Hash of the fields that change results (resume refuses a checkpoint of another one)."""
        d = {k: v for k, v in self.to_dict().items() if k not in exclude}
        return hashlib.sha256(json.dumps(d, sort_keys=True).encode()).hexdigest()[:16]

    def with_overrides(self, **kw: Any) -> LLM2CompRecipe:
        return replace(self, **{k: v for k, v in kw.items() if v is not None})


# The paper (§3 training details, UCL details): 8 memory tokens, LoRA r16/α32 on q,v,o and the
# MLP, lr 1e-4, weight decay 1e-5, warm-up, 8000 CTKD steps of batch 4, bidirectional
# attention; then SimCSE with dropout 0.2 and batch 128 (the paper does not state UCL's steps).
PAPER_RECIPE = LLM2CompRecipe()

# The CPU recipe: the same pipeline cut to what a shared 2-core CPU trains in well under an
# hour at ~300 training tokens/s in fp32. Causal attention (the backbone's own; with only a few
# hundred steps a bidirectional switch costs more than it gives on a 135M model, and the paper's
# Fig. 11 finds causal better for STS); lr 2e-4 for the short schedule.
CPU_RECIPE = LLM2CompRecipe(
    stages=(LLM2CompStage("ctkd", 300), LLM2CompStage("simcse", 40), LLM2CompStage("spans", 40)),
    batch_size=8,
    contrastive_batch_size=32,
    micro_batch_size=8,
    max_length=96,
    continuation_length=24,
    lr=2e-4,
    warmup_steps=10,
    attention="causal",
    span_max=48,
)

RECIPES: dict[str, LLM2CompRecipe] = {"paper": PAPER_RECIPE, "cpu": CPU_RECIPE}
