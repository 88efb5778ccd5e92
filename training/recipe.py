"""The fields every training recipe shares, and their checks, (de)serialisation and fingerprint.

A recipe is a frozen dataclass: written into the adapter's record, hashed for checkpoint/resume
safety and compared between runs. :class:`TrainRecipe` holds what the shared loop
(training/loop.py) reads: optimizer, schedule, LoRA, seed, checkpoints. :class:`EmbedderRecipe`
adds what a recipe that trains an :class:`~embedder.encoder.Embedder` in stages needs: the
backbone, the stages, batching and how the embedder reads a text. The Text2Token recipe
(training/text2token/recipe.py) and the LLM2Comp recipe (training/llm2comp/recipe.py) extend it with
their objectives' fields; BTMR's recipe (training/btmr/trainer.py) extends the first.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass, fields, replace
from typing import Any, ClassVar

from embedder.encoder import PLACEHOLDER, PROMPT_EOL, EmbedderConfig

SCHEDULES = ("constant", "linear")


def check_stage(field_name: str, value: str, allowed: tuple[str, ...], steps: int) -> None:
    """The checks of a stage dataclass: a known objective and a non-negative number of steps."""
    if value not in allowed:
        raise ValueError(f"stage {field_name} must be one of {', '.join(allowed)}, not {value!r}")
    if steps < 0:
        raise ValueError("stage steps must be >= 0")


@dataclass(frozen=True)
class TrainRecipe:
    """What the shared training loop reads (optimizer, LR schedule, LoRA, seed, checkpoints)."""

    batch_size: int = 64  # texts (or pairs) per optimizer step
    lr: float = 3e-5
    weight_decay: float = 0.0
    warmup_steps: int = 0
    schedule: str = "constant"  # "constant" or "linear" (decay to 0 over all steps) after warm-up
    max_grad_norm: float | None = 1.0
    lora_r: int = 16
    lora_alpha: int = 32
    lora_dropout: float = 0.05
    lora_targets: tuple[str, ...] = ("q_proj", "v_proj")
    seed: int = 0
    save_every: int = 25  # optimizer steps between checkpoints
    keep_checkpoints: int = 2

    # Fields that do not change results: a run may resume with other values of them.
    NOT_FINGERPRINTED: ClassVar[tuple[str, ...]] = ("save_every", "keep_checkpoints")

    def __post_init__(self) -> None:
        if self.batch_size < 1 or self.save_every < 1:
            raise ValueError(f"batch_size ({self.batch_size}) and save_every ({self.save_every}) must be positive")
        if self.schedule not in SCHEDULES:
            raise ValueError(f"schedule must be 'constant' or 'linear', not {self.schedule!r}")

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]):
        """The recipe of a record's ``to_dict()`` (JSON turns tuples into lists; they are turned back)."""
        unknown = set(d) - {f.name for f in fields(cls)}
        if unknown:
            raise ValueError(f"unknown recipe fields: {sorted(unknown)}")
        return cls(**{k: tuple(v) if isinstance(v, list) else v for k, v in d.items()})

    def fingerprint(self) -> str:
        """Hash of the fields that change results (resume refuses a checkpoint of another one)."""
        d = {k: v for k, v in self.to_dict().items() if k not in self.NOT_FINGERPRINTED}
        return hashlib.sha256(json.dumps(d, sort_keys=True).encode()).hexdigest()[:16]

    def with_overrides(self, **kw: Any):
        """This recipe with the given fields replaced; None means "keep the recipe's value"."""
        return replace(self, **{k: v for k, v in kw.items() if v is not None})


@dataclass(frozen=True)
class EmbedderRecipe(TrainRecipe):
    """A recipe that trains an Embedder's LoRA through a list of stages, one optimizer for all."""

    STAGE: ClassVar[type]  # the subclass's stage dataclass (from_dict rebuilds the stages with it)
    model: str = "smollm2-135m"
    stages: tuple[Any, ...] = ()
    micro_batch_size: int = 16  # texts per forward pass
    max_length: int = 128  # text tokens (the prompt template is added on top)
    prompt: str = PROMPT_EOL
    pooling: str = "last"
    attention: str = "causal"
    temperature: float = 0.05  # InfoNCE τ of the contrastive stages
    init_adapter: str | None = None  # start LoRA from this adapter (a shipped adapter's name, "default" or a folder) instead of a fresh one
    # The queries' template (asymmetric, E5/GTE style): the pairs stage reads anchors with it and
    # the adapter record carries it to search. None (or ``prompt`` itself): one template for all.
    query_prompt: str | None = None

    def __post_init__(self) -> None:
        if self.batch_size < 1 or self.micro_batch_size < 1 or self.batch_size % self.micro_batch_size:
            raise ValueError(
                f"batch_size ({self.batch_size}) must be a positive multiple of micro_batch_size ({self.micro_batch_size})"
            )
        super().__post_init__()
        if not self.stages:
            raise ValueError("a recipe needs at least one stage")
        if self.max_length < 1:
            raise ValueError("max_length must be positive")
        for name in ("prompt", "query_prompt"):
            value = getattr(self, name)
            if value is not None and PLACEHOLDER not in value:
                raise ValueError(f"recipe field {name} must contain the placeholder {PLACEHOLDER!r}: {value!r}")
        if self.query_prompt == self.prompt:  # one template: the symmetric recipe, fingerprinted as such
            object.__setattr__(self, "query_prompt", None)

    def to_dict(self) -> dict[str, Any]:
        """As :meth:`TrainRecipe.to_dict`, with ``query_prompt`` only when set: the records and
        fingerprints of symmetric recipes stay what they were (runs resume, records compare)."""
        d = super().to_dict()
        if d["query_prompt"] is None:
            del d["query_prompt"]
        return d

    @property
    def total_steps(self) -> int:
        return sum(s.steps for s in self.stages)

    @classmethod
    def from_dict(cls, d: dict[str, Any]):
        d = dict(d)
        if "stages" in d:
            d["stages"] = tuple(cls.STAGE(**s) if isinstance(s, dict) else s for s in d["stages"])
        return super().from_dict(d)

    def embedder_config(self) -> EmbedderConfig:
        """How the trained embedder reads a text; a forward pass takes one micro-batch."""
        return EmbedderConfig(
            prompt=self.prompt, pooling=self.pooling, attention=self.attention, max_length=self.max_length,
            batch_size=self.micro_batch_size, query_prompt=self.query_prompt,
        )
