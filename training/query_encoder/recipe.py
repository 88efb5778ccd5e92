"""How a query-encoder student is trained (recorded in the student's query_encoder.json)."""
from __future__ import annotations

from dataclasses import asdict, dataclass


@dataclass
class DistillRecipe:
    """The head, the optimisation and the loss of a distillation (training/objectives/query_distillation.py)."""

    kind: str = "token-bag"  # "pooled": a head over the sentence embedding; "token-bag": also the text's LLM tokens
    hidden: int = 1024  # the head's hidden width; 0: a linear map (pooled only)
    gate_hidden: int = 64  # token-bag: width of the MLP scoring each token's weight
    context_layers: int = 0  # token-bag: self-attention blocks over the query's tokens before the bag (0: none)
    context_dim: int = 0  # token-bag: the blocks' width (0: the LLM's; narrower: projected down and back up)
    token_hidden: int = 0  # token-bag: the per-token correction's hidden width (0: hidden)
    max_tokens: int = 96  # token-bag: the LLM tokens read of a text (and of the sentence encoder's, with encoder_tokens)
    encoder_tokens: bool = False  # token-bag with context_layers: the blocks also read the sentence encoder's token states
    epochs: int = 20
    batch_size: int = 128
    lr: float = 1e-3
    weight_decay: float = 1e-4
    kl_weight: float = 1.0
    kl_top: int = 256  # the teacher's top tokens the KL is taken over
    temperature: float = 1.0
    holdout: float = 0.05  # texts kept out of training, for the faithfulness report
    seed: int = 0

    def to_dict(self) -> dict:
        return asdict(self)


__all__ = ["DistillRecipe"]
