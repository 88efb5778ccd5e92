"""LLM2Comp recipes: compression pre-training (CTKD) and unsupervised contrastive stages.

A recipe is a frozen dataclass, written into the adapter (``llm2comp.json``), hashed for
checkpoint/resume safety. Stages run in order in one run (one LoRA, one optimizer):

- ``ctkd``: LLM2Comp §3 continuation task with knowledge distillation (training/objectives/ctkd.py).
- ``simcse``: two dropout views of one text, in-batch negatives (SimCSE; the paper's UCL).
- ``spans``: two spans of one document, or a sentence and its document (training/corpus_pairs.py).

The contrastive stages also run after Text2Token: ``init_adapter`` starts from that adapter
(its LoRA keeps training, with its own prompt and pooling), ``memory_tokens=0``.
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from typing import ClassVar

from embedder.encoder import EmbedderConfig
from training.recipe import EmbedderRecipe, check_stage

STAGE_KINDS = ("ctkd", "simcse", "spans")
PLAIN_PROMPT = "[text]"  # LLM2Comp reads the bare text; the memory slots follow it


@dataclass(frozen=True)
class LLM2CompStage:
    """One stage: what it learns from and for how many optimizer steps."""

    kind: str
    steps: int

    def __post_init__(self) -> None:
        check_stage("kind", self.kind, STAGE_KINDS, self.steps)


@dataclass(frozen=True)
class LLM2CompRecipe(EmbedderRecipe):
    """Everything that determines an LLM2Comp run (and hence its result, given the corpus).

    The fields shared with Text2Token are :class:`~training.recipe.EmbedderRecipe`'s; those
    repeated here only take the paper's LLM2Comp values as defaults.
    """

    STAGE: ClassVar[type] = LLM2CompStage
    stages: tuple[LLM2CompStage, ...] = (LLM2CompStage("ctkd", 8000), LLM2CompStage("simcse", 1000))
    batch_size: int = 4  # texts per optimizer step (CTKD); contrastive stages use contrastive_batch_size
    micro_batch_size: int = 4
    max_length: int = 128  # text tokens read by the encoder
    lr: float = 1e-4
    weight_decay: float = 1e-5
    warmup_steps: int = 100
    schedule: str = "linear"
    lora_targets: tuple[str, ...] = ("q_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
    prompt: str = PLAIN_PROMPT
    pooling: str = "memory"
    attention: str = "bidirectional"
    temperature: float = 0.05  # InfoNCE τ (the paper: 0.05)
    contrastive_batch_size: int = 128  # pairs per contrastive step (in-batch negatives; GradCache)
    continuation_length: int = 32  # CTKD: continuation tokens distilled after the cut
    min_text: int = 10  # CTKD: the cut leaves at least this many text tokens (the authors: 10)
    min_continuation: int = 8  # CTKD: documents shorter than min_text + this are not cut
    memory_tokens: int = 8  # memory slots (paper: 8); 0 = no memory (contrastive stage on another embedder)
    dropout: float = 0.2  # attention dropout of the dropout views (the paper: 0.2)
    span_min: int = 16  # spans stage: tokens per span, drawn in [span_min, span_max]
    span_max: int = 64
    sentence_share: float = 0.5  # spans stage: share of (sentence, document) pairs; the rest are two spans

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.contrastive_batch_size < 1 or self.continuation_length < 1:
            raise ValueError("contrastive_batch_size and continuation_length must be positive")
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
        if self.query_prompt is not None:
            # its stages pair texts with texts (spans, dropout views): no side reads as a query
            raise ValueError(
                "recipe field query_prompt: LLM2Comp trains no queries; query templates are trained by train-text2token's pairs stage"
            )

    def embedder_config(self) -> EmbedderConfig:
        """As the recipe's, but memory pooling starts as "last": the trainer adds the memory vectors."""
        config = super().embedder_config()
        return replace(config, pooling="last") if self.pooling == "memory" else config


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
