"""BTMR training: LoRA + a learned <BMT> embedding, LM + matryoshka contrastive loss, resumable.

    train-btmr --corpus ../shared/data/cisi --corpus ../shared/data/medline --output runs/btmr --steps 200

Writes ``RUN/adapter/`` (peft LoRA, ``btmr.json``, ``btmr_token.safetensors``: loadable by
``cls-eval --adapter RUN/adapter``), ``RUN/loss_curve.json`` / ``.png`` and
``RUN/checkpoints/step-NNNNNN/`` (the last two), through the shared loop (training/loop.py); the console script is training/cli/btmr.py.
The data order is a pure function of the seed and the step, and a checkpoint holds the LoRA
weights, the <BMT> vector, the optimizer and the RNG states, so running the same command again
resumes and ends bit-identical to an uninterrupted run (tested). A checkpoint of another recipe
or corpus is refused.
"""
from __future__ import annotations

import json
from collections.abc import Sequence
from itertools import chain
from pathlib import Path

import numpy as np
import torch

from embedder.encoder import Embedder
from embedder.token_groups import BTMR_CONFIG, BTMR_TOKEN_FILE
from training.adapter_io import save_adapter
from training.btmr.recipe import BTMRConfig, BTMRRecipe
from training.btmr.sequences import document_pairs, forward_states, pack, pick_bmt_token
from training.loop import LoopStage, TrainingLoop, attach_lora, latest_checkpoint, seed_everything
from training.objectives.matryoshka import matryoshka_contrastive
from training.target_cache import texts_fingerprint


class BTMRTrainer:
    """Train BTMR on the documents of a corpus (two halves of one document = one pair)."""

    def __init__(self, embedder: Embedder, texts: Sequence[str], run_dir: str | Path, recipe: BTMRRecipe, bmt_token_id: int | None = None) -> None:
        if embedder.runtime_name is not None:
            raise ValueError("train with a runtime-less embedder (Embedder.load(..., runtime=None)): a runtime snapshots the weights")
        self.embedder = embedder
        self.recipe = recipe
        self.run_dir = Path(run_dir)
        tok = embedder.tokenizer
        self.cfg = BTMRConfig(bmt_token_id=pick_bmt_token(tok) if bmt_token_id is None else bmt_token_id, **recipe.btmr)
        rows = tok([embedder.normalise(t) for t in texts], add_special_tokens=False)["input_ids"]
        self.pairs = document_pairs(rows, self.cfg)
        if len(self.pairs) < recipe.batch_size:
            raise ValueError(
                f"{len(self.pairs)} documents hold 2 x {self.cfg.units_per_side} segments of {self.cfg.segment_length} tokens; "
                f"need at least batch_size={recipe.batch_size} (shorter segments or a longer corpus)"
            )
        self.texts_hash = texts_fingerprint(texts)
        self.peft_model = None
        self.bmt = None

    # ----------------------------------------------------------- model
    def _attach(self) -> None:
        self.peft_model, _ = attach_lora(self.embedder, self.recipe)
        # the paper initialises <BMT> with the mean token embedding
        table = self.embedder.causal_lm.get_input_embeddings().weight.detach()
        self.bmt = torch.nn.Parameter(table.float().mean(0).clone())

    def trainable(self) -> dict[str, torch.Tensor]:
        """The LoRA weights and the <BMT> input embedding."""
        return {n: p for n, p in self.peft_model.named_parameters() if p.requires_grad} | {"bmt": self.bmt}

    def latest_checkpoint(self) -> Path | None:
        return latest_checkpoint(self.run_dir)

    def _batch(self, step: int) -> list[int]:
        """Pair indices of ``step``: a seeded permutation per epoch, so resume needs no data state."""
        n, b = len(self.pairs), self.recipe.batch_size
        per_epoch = n // b
        epoch, k = divmod(step, per_epoch)
        order = np.random.default_rng([self.recipe.seed, epoch]).permutation(n)
        return order[k * b : (k + 1) * b].tolist()

    def loss(self, idx: Sequence[int]) -> tuple[torch.Tensor, dict, int]:
        """(LM + matryoshka contrastive loss of the pairs ``idx``, its two parts, tokens through the network)."""
        e = self.embedder
        pad = e._pad_id
        anchors = [pack(e._prefix, self.pairs[i][0], e._suffix, self.cfg) for i in idx]
        positives = [pack(e._prefix, self.pairs[i][1], e._suffix, self.cfg) for i in idx]
        lm = self.peft_model
        with torch.autocast(device_type=e.device.split(":")[0], dtype=torch.bfloat16, enabled=e.bf16):
            sa, lm_a = forward_states(lm, self.bmt, anchors, pad, self.cfg)
            sp, lm_p = forward_states(lm, self.bmt, positives, pad, self.cfg)
        sa, sp = sa.float(), sp.float()
        texts_a = [" ".join(map(str, chain.from_iterable(self.pairs[i][0]))) for i in idx]  # token ids: same text = same key
        texts_p = [" ".join(map(str, chain.from_iterable(self.pairs[i][1]))) for i in idx]
        cons = matryoshka_contrastive(sa, sp, self.cfg, texts_a, texts_p)
        lm_loss = 0.5 * (lm_a + lm_p)
        total = self.cfg.lm_weight * lm_loss + cons
        tokens = sum(len(p.ids) for p in anchors + positives)
        return total, {"lm": float(lm_loss.detach()), "contrastive": float(cons.detach())}, tokens

    def _step(self, step: int) -> tuple[float, int, dict]:
        loss, parts, tokens = self.loss(self._batch(step))
        loss.backward()
        return float(loss.detach()), tokens, parts

    # ----------------------------------------------------------- train
    def train(self, resume: bool = True, stop_after: int | None = None, progress: bool = True) -> dict:
        """Run or resume; returns {"completed", "history", "pairs"}.

        ``stop_after``: return after that many steps of this call (tests).
        """
        seed_everything(self.recipe.seed)
        if self.peft_model is None:
            self._attach()
        stage = LoopStage("btmr", self.recipe.steps, self._step, title="LM + matryoshka contrastive", parts=("lm", "contrastive"))
        loop = TrainingLoop(
            self.recipe, [stage], self.run_dir, self.texts_hash, self.peft_model, self.trainable(), self._write_adapter, "btmr",
            progress,
        )
        res = loop.run(resume, stop_after)
        return {"completed": res.completed, "history": res.history, "pairs": len(self.pairs)}

    def _write_adapter(self, directory: Path, history: list[dict]) -> Path:
        from safetensors.torch import save_file

        def btmr_files(folder: Path) -> None:
            # the group settings and the learned <BMT> embedding travel with the adapter (embedder/token_groups.py)
            save_file({"bmt": self.bmt.detach().float().contiguous()}, str(folder / BTMR_TOKEN_FILE))
            (folder / BTMR_CONFIG).write_text(json.dumps(self.cfg.to_dict(), indent=1))

        record = {"kind": "btmr", "recipe": self.recipe.to_dict(), "btmr": self.cfg.to_dict(), "autocast_bf16": bool(self.embedder.bf16),
                  "backbone": self.embedder.identity,
                  "embedding": self.embedder.config.to_dict(), "corpus_sha256": self.texts_hash, "pairs": len(self.pairs),
                  "final_loss": history[-1] if history else None}
        return save_adapter(self.peft_model, directory, record, extra=btmr_files)
