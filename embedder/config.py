"""How a text becomes an embedding: :class:`EmbedderConfig` (the prompt templates, pooling,
attention, lengths, all-caps folding), as recorded in every index manifest and adapter record.

Its own module, without torch, so that what only reads a text's tokens (embedder/tokenization.py)
names the config without importing the model (embedder/encoder.py, which re-exports all of it).
"""
from __future__ import annotations

from dataclasses import asdict, dataclass

PROMPT_EOL = 'This sentence: "[text]" means in one word:"'
PLACEHOLDER = "[text]"
POOLINGS = ("last", "mean", "memory")
# What a text is to the embedder: documents read ``EmbedderConfig.prompt``, queries
# ``EmbedderConfig.query_prompt`` where one is set (asymmetric embedders, as E5 and GTE).
ROLES = ("document", "query")


def check_role(role: str) -> None:
    """Refuse a role other than "document" or "query" (a typo would silently embed as a document)."""
    if role not in ROLES:
        raise ValueError(f"role must be one of {ROLES}, not {role!r}")


@dataclass(frozen=True)
class EmbedderConfig:
    """How a text becomes an embedding. Recorded in every index manifest.

    pooling: "last" (the template's final token), "mean" (masked mean over all tokens) or
    "memory" (LLM2Comp: mean of the final states of ``memory_tokens`` learned vectors appended
    after the prompt; embedder/memory.py; the vectors come with the adapter).
    attention: "causal" (as pretrained) or "bidirectional" (every token sees every token).
    query_prompt: the template of queries (asymmetric embedders, E5/GTE style); None (or the
    same text as ``prompt``): queries read ``prompt`` as documents do.
    max_length: text tokens kept; the template is added on top and never truncated.
    fold_all_caps: lowercase a text that has letters but no lower-case letter. Byte-level
    BPE vocabularies hold common words in lower/title case only, so an ALL-CAPS text (every
    NPL query, old bibliographic records) falls apart into rare pieces that neither the
    model nor the aligned-token index has seen in the documents.
    """

    prompt: str = PROMPT_EOL
    pooling: str = "last"
    attention: str = "causal"
    max_length: int = 256
    batch_size: int = 16
    fold_all_caps: bool = True
    memory_tokens: int = 0  # memory slots read by pooling "memory" (0 with any other pooling)
    query_prompt: str | None = None

    def __post_init__(self) -> None:
        if PLACEHOLDER not in self.prompt:
            raise ValueError(f"prompt must contain the placeholder {PLACEHOLDER!r}: {self.prompt!r}")
        if self.query_prompt is not None and PLACEHOLDER not in self.query_prompt:
            raise ValueError(f"query_prompt must contain the placeholder {PLACEHOLDER!r}: {self.query_prompt!r}")
        if self.query_prompt == self.prompt:
            # one template is the symmetric embedder: recorded (manifests, cache keys) as such
            object.__setattr__(self, "query_prompt", None)
        if self.pooling not in POOLINGS:
            raise ValueError(f"pooling must be one of {POOLINGS}, not {self.pooling!r}")
        if self.memory_tokens < 0 or (self.memory_tokens and self.pooling != "memory"):
            raise ValueError(f"memory_tokens={self.memory_tokens} needs pooling 'memory' (pooling is {self.pooling!r})")
        if self.attention not in ("causal", "bidirectional"):
            raise ValueError(f"attention must be 'causal' or 'bidirectional', not {self.attention!r}")
        if self.max_length < 1 or self.batch_size < 1:
            raise ValueError("max_length and batch_size must be positive")

    def template(self, role: str = "document") -> str:
        """The prompt template a text of ``role`` ("document" or "query") is read with."""
        check_role(role)
        return self.query_prompt if role == "query" and self.query_prompt is not None else self.prompt

    def to_dict(self) -> dict:
        """The settings as recorded in manifests, adapter records and cache keys.

        ``query_prompt`` appears only when set, so that a symmetric config records exactly
        what it did before the field existed: old manifests, embedding-cache keys and build
        shards keep matching.
        """
        d = asdict(self)
        if d["query_prompt"] is None:
            del d["query_prompt"]
        return d
