"""A text as the LLM's tokens, with or without the LLM.

:class:`TextTokens` is how the engine reads a text's own tokens (the literal tokens T_q of a
query, a vocabulary's spellings); :class:`~embedder.encoder.Embedder` is one, and so is
:class:`TokenizerOnly`: the LLM's tokenizer without its weights, all that queries with no
model on their path (``query_encoder="none"``) read. Loading it skips the weights and the
LoRA merge (cranfield's default index, warm: 1.1 s against 1.7 s with the LLM; training/README.md).
"""
from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import os

    from embedder.config import EmbedderConfig


def is_all_caps(text: str) -> bool:
    """True when ``text`` has cased letters and none of them is lower case (``EmbedderConfig.fold_all_caps``)."""
    return text != text.lower() and text == text.upper()


class TextTokens:
    """Tokenising texts as the embedder reads them. Subclasses set ``tokenizer``, ``config``
    (an :class:`~embedder.config.EmbedderConfig`) and ``vocab_size``, and call :meth:`_init_tokens`."""

    tokenizer: Any
    config: EmbedderConfig

    def _init_tokens(self) -> None:
        self._vocab_tokens: list[str] | None = None
        self._special_ids: frozenset[int] | None = None

    @property
    def vocab_size(self) -> int:
        raise NotImplementedError

    def normalise(self, text: str) -> str:
        """The text as the model reads it (all-caps folded when the config asks for it)."""
        if self.config.fold_all_caps and is_all_caps(text):
            return text.lower()
        return text

    def token_ids(self, texts: Sequence[str]) -> list[list[int]]:
        """Each text's token ids as the tokenizer gives them, no special tokens added, no truncation.

        On the query path, for a query's few words: a fast tokenizer's own (Rust) batch encoder
        is called directly, as its Python wrapper costs more than the tokenising (0.32 against
        0.12 ms for a query's words, one at a time; the same ids)."""
        if not texts:
            return []
        backend = getattr(self.tokenizer, "backend_tokenizer", None)
        if backend is not None:
            return [e.ids for e in backend.encode_batch(list(texts), add_special_tokens=False)]
        return self.tokenizer(list(texts), add_special_tokens=False)["input_ids"]

    @property
    def special_ids(self) -> frozenset[int]:
        """The tokenizer's special token ids (never a text's own token)."""
        if self._special_ids is None:
            self._special_ids = frozenset(self.tokenizer.all_special_ids)
        return self._special_ids

    def literal_token_ids(self, text: str) -> list[int]:
        """The text's own tokens (T_s in the paper), deduplicated, special tokens dropped.

        Tokenised with a leading space so that the first word gets the same word-initial
        form (e.g. ``Ġgame``) as it would inside a sentence.
        """
        ids = self.token_ids([" " + self.normalise(text).strip()])[0]
        special = self.special_ids
        return list(dict.fromkeys(i for i in ids if i not in special))

    def token_strings(self, ids: Iterable[int]) -> list[str]:
        """Vocabulary spellings of token ids (byte-level BPE forms such as ``Ġgame``)."""
        if self._vocab_tokens is None:
            self._vocab_tokens = self.tokenizer.convert_ids_to_tokens(list(range(self.vocab_size)))
        return [self._vocab_tokens[int(i)] if int(i) < len(self._vocab_tokens) else f"<{int(i)}>" for i in ids]


class TokenizerOnly(TextTokens):
    """The LLM's tokenizer and identity, no weights: what a Retriever with model-free queries
    needs (literal tokens, explanations, the manifest's model check). It encodes nothing:
    :meth:`embed` refuses, so a path that would need the model says so instead of failing later."""

    device = "cpu"  # where the Retriever puts the sentence encoder it loads beside

    def __init__(self, tokenizer, config: EmbedderConfig, identity: dict, adapter: dict | None, vocab_size: int) -> None:
        self.tokenizer = tokenizer
        self.config = config
        self.identity = identity
        self.adapter = adapter
        self._vocab_size = int(vocab_size)
        self._init_tokens()

    @classmethod
    def load(cls, model: str | os.PathLike[str], adapter: str | os.PathLike[str] | None, config: EmbedderConfig) -> TokenizerOnly:
        """The tokenizer of ``model`` (a registry name, a directory, a .gguf file) as
        :meth:`Embedder.load <embedder.encoder.Embedder.load>` would load it with ``adapter``:
        the same identity and adapter record, so an index's manifest check is the same."""
        from transformers import AutoConfig, AutoTokenizer

        from embedder.adapters import adapter_identity, resolve_adapter
        from embedder.models import resolve_model

        resolved = resolve_model(model)
        tokenizer = AutoTokenizer.from_pretrained(resolved.directory)
        # the LM head's rows (what Embedder.vocab_size reads) are the config's vocab_size
        vocab_size = AutoConfig.from_pretrained(resolved.directory).vocab_size
        return cls(tokenizer, config, resolved.identity(), adapter_identity(resolve_adapter(adapter, resolved.name)), vocab_size)

    @property
    def vocab_size(self) -> int:
        return self._vocab_size

    def embed(self, texts: Sequence[str], role: str = "document"):
        raise RuntimeError("no model loaded (query_encoder 'none' loads the tokenizer alone): load the Retriever with another query encoder")

    def runtime_info(self) -> dict:
        """What a server's /info reports for the queries' runtime: none."""
        return {"name": "none", "dtype": None, "reason": "query_encoder 'none': the LLM's tokenizer alone, no weights loaded"}

    def runtime_summary(self) -> str:
        return "encoder: none (the LLM's tokenizer alone, no weights loaded)"
