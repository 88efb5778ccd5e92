"""LLM2Comp training: CTKD pre-training, then unsupervised contrastive stages, one LoRA.

The encoder is the project's :class:`~embedder.encoder.Embedder` (pooling ``memory``, or the
pooling of ``init_adapter``), so training pools exactly as indexing does. Contrastive stages use
the shared loss (training/objectives/contrastive.py: ``pair_loss`` under ``GradCache``, so that the batch
of in-batch negatives is independent of what fits one forward pass).

This module holds the objectives' steps and their data: each step's texts and cuts are a pure
function of (seed, stage, step). LoRA, the optimizer, checkpoints (the trainable tensors are
the LoRA weights and the memory vectors; resume is bit-identical), progress and outputs are
the shared loop's (training/loop.py).
"""
from __future__ import annotations

from collections.abc import Sequence
from functools import partial
from pathlib import Path

import numpy as np
import torch

from embedder.encoder import Embedder, EmbedderConfig
from embedder.memory import MemoryTokens
from training.adapter_io import round_lora_to_bf16, save_adapter
from training.corpus_pairs import sentence_and_document, two_spans
from training.llm2comp.recipe import LLM2CompRecipe
from training.loop import (
    LoopStage,
    TrainingLoop,
    TrainResult,
    attach_lora,
    latest_checkpoint,
    load_backbone,
    run_record,
    seed_everything,
)
from training.objectives.contrastive import GradCache, Temperature, pair_loss
from training.objectives.ctkd import ctkd_loss, cut_for_continuation
from training.target_cache import texts_fingerprint

RECORD = "llm2comp.json"
LOSS_NAMES = {"ctkd": "CTKD: KL per text", "simcse": "SimCSE InfoNCE", "spans": "span/sentence InfoNCE"}


def set_attention_dropout(model: torch.nn.Module, p: float) -> None:
    """Attention-probability dropout of every attention module (active in train mode only).

    The dropout views of SimCSE need dropout in the network itself; Llama-family models ship
    with 0 and read ``module.attention_dropout`` at each call.
    """
    for m in model.modules():
        if hasattr(m, "attention_dropout") and isinstance(m.attention_dropout, float):
            m.attention_dropout = p


class LLM2CompTrainer:
    """Turns a backbone and unlabeled documents into an LLM2Comp adapter (see module docstring).

    texts: the training documents (never queries). embedder: an in-memory backbone (tests);
    by default ``recipe.model`` is loaded (with ``recipe.init_adapter``'s LoRA weights, trainable).
    """

    def __init__(
        self,
        recipe: LLM2CompRecipe,
        texts: Sequence[str],
        run_dir: Path,
        embedder: Embedder | None = None,
        progress: bool = True,
        corpus_info: dict | None = None,
    ) -> None:
        if not texts:
            raise ValueError("no training texts")
        self.recipe = recipe
        self.texts = list(texts)
        self.run_dir = Path(run_dir)
        self.progress = progress
        self.corpus_info = corpus_info or {}
        self.texts_hash = texts_fingerprint(self.texts)
        # Memory pooling is switched on in attach(), once the memory vectors exist.
        self.embedder = embedder if embedder is not None else load_backbone(recipe.model, recipe.embedder_config())
        self.peft_model = None
        self.memory: MemoryTokens | None = None
        self.temperature = Temperature(recipe.temperature, learn=False)
        self._doc_ids: list[list[int]] | None = None
        self._perms: dict[int, list[int]] = {}

    # ------------------------------------------------------------ set-up
    def attach(self):
        """LoRA (fresh, or ``init_adapter``'s weights kept trainable) and, for pooling memory, the memory vectors."""
        r, emb = self.recipe, self.embedder
        self.peft_model, _ = attach_lora(emb, r, r.init_adapter)
        set_attention_dropout(emb.causal_lm, 0.0)  # only the SimCSE views use attention dropout
        if r.pooling == "memory":
            # Seeded by the recipe's seed (its own generator): LoRA's initialisation does not move it.
            table = emb.causal_lm.get_input_embeddings().weight
            self.memory = MemoryTokens.initial(table, r.memory_tokens, r.seed).to(emb.device)
            emb.memory = self.memory
            emb.config = EmbedderConfig(**{**emb.config.to_dict(), "pooling": "memory", "memory_tokens": r.memory_tokens})
        return self.peft_model

    def trainable(self) -> dict[str, torch.nn.Parameter]:
        """Every trained tensor by name: the LoRA weights and the memory vectors."""
        out = {n: p for n, p in self.peft_model.named_parameters() if p.requires_grad}
        if self.memory is not None:
            out["memory.vectors"] = self.memory.vectors
        return out

    def latest_checkpoint(self) -> Path | None:
        return latest_checkpoint(self.run_dir)

    def doc_ids(self) -> list[list[int]]:
        """Token ids of every document (no template), up to max_length + continuation tokens."""
        if self._doc_ids is None:
            r, emb = self.recipe, self.embedder
            cap = r.max_length + r.continuation_length
            enc = emb.tokenizer([emb.normalise(t) for t in self.texts], add_special_tokens=False, truncation=True, max_length=cap)
            self._doc_ids = [list(x) for x in enc["input_ids"]]
        return self._doc_ids

    # ------------------------------------------------------------ batches
    def _rng(self, stage: int, step: int) -> np.random.Generator:
        return np.random.default_rng([self.recipe.seed, stage, step])

    def _docs_for(self, stage: int, step: int, n: int, usable) -> list[int]:
        # A fixed seeded permutation per stage, walked in order; documents unusable for the
        # stage (too short to cut) are skipped, so batches stay full.
        if stage not in self._perms:
            perm = np.random.default_rng([self.recipe.seed, stage]).permutation(len(self.texts))
            self._perms[stage] = [int(i) for i in perm if usable(int(i))]
            if not self._perms[stage]:
                raise ValueError(f"stage {stage + 1}: no document long enough for it")
        pool = self._perms[stage]
        return [pool[(step * n + k) % len(pool)] for k in range(n)]

    def ctkd_batch(self, stage: int, step: int) -> list[tuple[list[int], list[int]]]:
        r, ids = self.recipe, self.doc_ids()
        docs = self._docs_for(stage, step, r.batch_size, lambda i: len(ids[i]) >= r.min_text + r.min_continuation)
        rng = self._rng(stage, step)
        return [cut_for_continuation(ids[i], rng, r.max_length, r.continuation_length, r.min_text, r.min_continuation) for i in docs]

    def pair_batch(self, kind: str, stage: int, step: int) -> tuple[list[list[int]], list[list[int]], list[str] | None, list[str] | None]:
        """(anchor ids, positive ids, anchor texts, positive texts) of a contrastive step (texts: None for dropout views)."""
        r, emb, ids = self.recipe, self.embedder, self.doc_ids()
        n = r.contrastive_batch_size
        if kind == "simcse":
            docs = self._docs_for(stage, step, n, lambda i: len(ids[i]) > 0)
            rows = [ids[i][: r.max_length] for i in docs]
            return rows, rows, None, None
        docs = self._docs_for(stage, step, n, lambda i: len(ids[i]) >= 2 * r.span_min)
        rng = self._rng(stage, step)
        anchors, positives = [], []
        for i in docs:
            pair = None
            if rng.random() < r.sentence_share:
                sd = sentence_and_document(self.texts[i], rng)
                if sd is not None:
                    tok = emb.tokenizer([emb.normalise(s) for s in sd], add_special_tokens=False, truncation=True, max_length=r.max_length)
                    pair = (list(tok["input_ids"][0]), list(tok["input_ids"][1]))
            if pair is None:
                pair = two_spans(ids[i][: r.max_length + r.continuation_length], rng, r.span_min, r.span_max)
            anchors.append(pair[0])
            positives.append(pair[1])
        decode = emb.tokenizer.decode
        return anchors, positives, [decode(a) for a in anchors], [decode(p) for p in positives]

    # ------------------------------------------------------------ steps
    def _contrastive_step(self, kind: str, stage: int, step: int) -> tuple[float, int, dict]:
        anchors, positives, a_txt, p_txt = self.pair_batch(kind, stage, step)
        wrapped_a, wrapped_p = self.embedder.wrap_ids(anchors), self.embedder.wrap_ids(positives)
        cache = GradCache(self.embedder.pooled, self.recipe.micro_batch_size)
        symmetric = kind == "spans"  # neither span is the query side

        def loss_fn(a: torch.Tensor, p: torch.Tensor) -> torch.Tensor:
            return pair_loss(a, p, self.temperature(), anchor_texts=a_txt, positive_texts=p_txt, symmetric=symmetric).mean()

        loss, _ = cache.step([wrapped_a, wrapped_p], loss_fn)
        return float(loss), sum(len(x) for x in wrapped_a) + sum(len(x) for x in wrapped_p), {}

    def _ctkd_step(self, stage: int, step: int) -> tuple[float, int, dict]:
        r = self.recipe
        pairs = self.ctkd_batch(stage, step)
        total, tokens = 0.0, 0
        for m in range(0, len(pairs), r.micro_batch_size):
            chunk = pairs[m : m + r.micro_batch_size]
            per_text = ctkd_loss(self.embedder, chunk)
            (per_text.sum() / len(pairs)).backward()
            total += float(per_text.detach().sum())
            # tokens through the network: encoder (text + memory), teacher (text + continuation), student (memory + continuation)
            tokens += sum(2 * len(t) + 2 * len(c) + 2 * r.memory_tokens for t, c in chunk)
        return total / len(pairs), tokens, {}

    def _simcse_step(self, stage: int, step: int) -> tuple[float, int, dict]:
        # Dropout in the attention itself makes the two views of a text differ; every other
        # step runs without it (attach() switches it off).
        set_attention_dropout(self.embedder.causal_lm, self.recipe.dropout)
        try:
            return self._contrastive_step("simcse", stage, step)
        finally:
            set_attention_dropout(self.embedder.causal_lm, 0.0)

    def _spans_step(self, stage: int, step: int) -> tuple[float, int, dict]:
        return self._contrastive_step("spans", stage, step)

    def stages(self) -> list[LoopStage]:
        """The recipe's stages as the loop runs them."""
        steps = {"ctkd": self._ctkd_step, "simcse": self._simcse_step, "spans": self._spans_step}
        return [
            LoopStage(s.kind, s.steps, partial(steps[s.kind], k), {"kind": s.kind}, s.kind, LOSS_NAMES[s.kind])
            for k, s in enumerate(self.recipe.stages)
        ]

    def _loop(self) -> TrainingLoop:
        if self.peft_model is None:
            self.attach()
        return TrainingLoop(
            self.recipe, self.stages(), self.run_dir, self.texts_hash, self.peft_model, self.trainable(), self._write_adapter,
            "llm2comp", self.progress,
        )

    def train(self, resume: bool = True, stop_after: int | None = None) -> TrainResult:
        """Run (or resume) all stages; write the adapter, loss curve JSON and PNG into ``run_dir``.

        stop_after: return after this many optimizer steps of this call (simulates a crash in tests).
        """
        seed_everything(self.recipe.seed)
        return self._loop().run(resume, stop_after)

    def export_checkpoint(self, checkpoint: Path, directory: Path) -> Path:
        """Write the adapter of a saved checkpoint (e.g. to measure a run that has not finished).

        The weights are rounded to bf16 as in a finished run; the record names the checkpoint.
        """
        _, history = self._loop().load_checkpoint(Path(checkpoint))
        self.peft_model.eval()
        round_lora_to_bf16(self.peft_model)
        return self._write_adapter(Path(directory), history, {"exported_from_checkpoint": str(checkpoint)})

    # ----------------------------------------------------------- outputs
    def _save_memory(self, directory: Path) -> None:
        if self.memory is not None:
            self.memory.save(directory)

    def _write_adapter(self, directory: Path, history: list[dict], note: dict | None = None) -> Path:
        """The adapter folder: LoRA, memory vectors and the record (plus ``note``'s fields)."""
        record = self.record(history) | (note or {})
        return save_adapter(self.peft_model, directory, record, record_name=RECORD, extra=self._save_memory)

    def record(self, history: list[dict]) -> dict:
        """What ``llm2comp.json`` in the adapter directory says about this run."""
        c = self.embedder.config
        return run_record(self.recipe, history, stage_keys=("kind",)) | {
            "method": "LLM2Comp (../shared/papers/llm2comp.txt): CTKD compression pre-training + unsupervised contrastive stages",
            "backbone": self.embedder.identity,
            "embedding": {"prompt": c.prompt, "pooling": c.pooling, "attention": c.attention,
                          "max_length": self.recipe.max_length, "memory_tokens": c.memory_tokens},
            "corpus": self.corpus_info | {"n_texts": len(self.texts), "sha256": self.texts_hash},
        }
