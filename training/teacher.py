"""The teacher of the listwise distillation term: a sentence encoder's embeddings, once per text (issue 30).

The teacher is the packaged MiniLM (embedder/sentence_encoder.py), whose in-batch similarity
distribution the contrastive stage distils beside InfoNCE (training/objectives/contrastive.py
:func:`~training.objectives.contrastive.listwise_kl`). A text's teacher embedding does not
change during training, so each is computed once, before the steps that need it, and kept in a
per-text on-disk cache (embedder/cache.py ``ArrayCache``, keyed by the teacher's weights hash):
a later chunk or an A/B rerun encodes nothing twice. A batch's similarity matrix is then one
small product of cached rows.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from pathlib import Path

import numpy as np
import torch

Encode = Callable[[Sequence[str]], np.ndarray]  # texts -> (n, d) unit-norm float32


class TeacherEmbeddings:
    """Teacher embeddings of rows of ``texts``: :meth:`prepare` them, then read them as a tensor.

    encode: the teacher (e.g. ``SentenceEncoder.encode``). identity: what decides its output
    (weights hash), which names the cache folder. cache_dir: None = in memory only. dim: the
    embedding width (None: found by encoding one text).
    """

    def __init__(
        self, encode: Encode, identity: str, texts: Sequence[str], cache_dir: Path | None = None, progress: bool = True,
        dim: int | None = None,
    ) -> None:
        self.encode = encode
        self.identity = identity
        self.texts = texts
        self.cache_dir = Path(cache_dir) / identity if cache_dir is not None else None
        self.progress = progress
        self._rows: dict[int, np.ndarray] = {}
        self._shape: tuple[int, ...] | None = (dim,) if dim is not None else None

    @classmethod
    def minilm(cls, texts: Sequence[str], cache_dir: Path | None = None, name: str = "minilm", progress: bool = True) -> TeacherEmbeddings:
        """The packaged sentence encoder ``name`` as the teacher."""
        from embedder.sentence_encoder import SentenceEncoder

        device = "cuda" if torch.cuda.is_available() else None
        enc = SentenceEncoder.load(name, device=device)
        return cls(lambda part: enc.encode(list(part)), f"{enc.name}-{enc.identity['sha256'][:20]}", texts, cache_dir, progress, enc.dim)

    def prepare(self, rows: Iterable[int]) -> int:
        """Compute (or read from the cache) the embeddings of ``rows`` not yet held; returns how many were new here."""
        from embedder.cache import ArrayCache, cached_arrays

        todo = sorted({int(r) for r in rows if r >= 0} - set(self._rows))
        if not todo:
            return 0
        cache = ArrayCache(self.cache_dir) if self.cache_dir is not None else None
        if self._shape is None:  # one text, once: the teacher's output shape
            self._shape = np.asarray(self.encode([self.texts[todo[0]]]), np.float32).shape[1:]
        vecs = cached_arrays(cache, [self.texts[r] for r in todo], self.encode, self._shape, desc="teacher embeddings",
                             progress=self.progress)
        self._rows.update(zip(todo, vecs))
        return len(todo)

    def __call__(self, rows: Sequence[int]) -> torch.Tensor:
        """(len(rows), d) float32 of prepared rows."""
        try:
            return torch.from_numpy(np.stack([self._rows[int(r)] for r in rows]))
        except KeyError as exc:
            raise KeyError(f"teacher embedding of text row {exc.args[0]} was not prepared") from None
