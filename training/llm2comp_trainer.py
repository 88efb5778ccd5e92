"""LLM2Comp training loop: CTKD pre-training, then unsupervised contrastive stages, one LoRA.

The encoder is the project's :class:`~embedder.encoder.Embedder` (pooling ``memory``, or the
pooling of ``init_adapter``), so training pools exactly as indexing does. Contrastive stages use
the shared loss (training/contrastive.py: ``pair_loss`` under ``GradCache``, so that the batch
of in-batch negatives is independent of what fits one forward pass).

Reproducibility as in the Text2Token trainer (training/trainer.py, whose scheduler, seeding and
loss-curve helpers are reused): each step's texts and cuts are a pure function of
(seed, stage, step); a checkpoint holds the trainable weights (LoRA + memory, fp32), optimizer,
scheduler, torch RNG, step and loss history, so a resumed run ends bit-identical to an
uninterrupted one on the same machine and thread count.
"""
from __future__ import annotations

import json
import logging
import math
import shutil
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from embedder.encoder import Embedder, EmbedderConfig
from embedder.memory import MemoryTokens
from training.adapter_io import make_readable, round_lora_to_bf16, save_adapter
from training.contrastive import GradCache, Temperature, pair_loss
from training.corpus_pairs import sentence_and_document, two_spans
from training.llm2comp import ctkd_loss, cut_for_continuation
from training.llm2comp_config import LLM2CompRecipe
from training.target_cache import texts_fingerprint, write_json_atomic
from training.trainer import make_scheduler, seed_everything

log = logging.getLogger(__name__)

RECORD = "llm2comp.json"
CHECKPOINTS = "checkpoints"
ADAPTER = "adapter"
LOSS_JSON = "loss_curve.json"
LOSS_PNG = "loss_curve.png"
LOSS_NAMES = {"ctkd": "CTKD: KL per text", "simcse": "SimCSE InfoNCE", "spans": "span/sentence InfoNCE"}


@dataclass
class LLM2CompResult:
    adapter_dir: Path
    run_dir: Path
    history: list[dict]
    seconds: float
    tokens: int
    completed: bool


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
    by default ``recipe.model`` is loaded (with ``recipe.init_adapter`` merged-free, trainable).
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
        self.embedder = embedder if embedder is not None else self._load_backbone()
        self.peft_model = None
        self.memory: MemoryTokens | None = None
        self.temperature = Temperature(recipe.temperature, learn=False)
        self._doc_ids: list[list[int]] | None = None

    # ------------------------------------------------------------ set-up
    def embedding_config(self) -> EmbedderConfig:
        r = self.recipe
        return EmbedderConfig(prompt=r.prompt, pooling="last" if r.pooling == "memory" else r.pooling, attention=r.attention,
                              max_length=r.max_length, batch_size=r.micro_batch_size)

    def _load_backbone(self) -> Embedder:
        # runtime=None: the weights change under training. Memory pooling is switched on in attach().
        return Embedder.load(self.recipe.model, adapter="none", config=self.embedding_config(), runtime=None)

    def attach(self):
        """LoRA (fresh, or ``init_adapter`` kept trainable) and, for pooling memory, the memory vectors."""
        from peft import LoraConfig, PeftModel, get_peft_model

        r, emb = self.recipe, self.embedder
        torch.manual_seed(r.seed)  # LoRA A matrices and the memory vectors come from torch's RNG / the seed
        lm = emb.causal_lm
        for p in lm.parameters():
            p.requires_grad_(False)
        if r.init_adapter:
            self.peft_model = PeftModel.from_pretrained(lm, r.init_adapter, is_trainable=True)
        else:
            cfg = LoraConfig(r=r.lora_r, lora_alpha=r.lora_alpha, lora_dropout=r.lora_dropout,
                             target_modules=list(r.lora_targets), bias="none", task_type="CAUSAL_LM")
            self.peft_model = get_peft_model(lm, cfg)
        self.peft_model.peft_config["default"].base_model_name_or_path = str(emb.identity.get("name"))
        emb.model = self.peft_model
        if r.pooling == "memory":
            self.memory = MemoryTokens.initial(lm.get_input_embeddings().weight, r.memory_tokens, r.seed).to(emb.device)
            emb.memory = self.memory
            emb.config = EmbedderConfig(**{**emb.config.to_dict(), "pooling": "memory", "memory_tokens": r.memory_tokens})
        return self.peft_model

    def trainable(self) -> dict[str, torch.nn.Parameter]:
        """Every trained tensor by name: the LoRA weights and the memory vectors."""
        out = {n: p for n, p in self.peft_model.named_parameters() if p.requires_grad}
        if self.memory is not None:
            out["memory.vectors"] = self.memory.vectors
        return out

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
        key = ("perm", stage)
        if not hasattr(self, "_perms"):
            self._perms: dict = {}
        if key not in self._perms:
            perm = np.random.default_rng([self.recipe.seed, stage]).permutation(len(self.texts))
            self._perms[key] = [int(i) for i in perm if usable(int(i))]
            if not self._perms[key]:
                raise ValueError(f"stage {stage + 1}: no document long enough for it")
        pool = self._perms[key]
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

    # ------------------------------------------------------- checkpoints
    def _checkpoint_dir(self) -> Path:
        return self.run_dir / CHECKPOINTS

    def _save_checkpoint(self, step: int, optimizer, scheduler, history: list[dict]) -> None:
        root = self._checkpoint_dir()
        root.mkdir(parents=True, exist_ok=True)
        final = root / f"step-{step:06d}"
        tmp = Path(tempfile.mkdtemp(dir=root, prefix=f".{final.name}."))
        try:
            state = {
                "trainable": {n: p.detach().clone() for n, p in self.trainable().items()},
                "optimizer": optimizer.state_dict(),
                "scheduler": scheduler.state_dict(),
                "torch_rng": torch.get_rng_state(),
                "step": step,
            }
            torch.save(state, tmp / "state.pt")
            info = {"step": step, "fingerprint": self.recipe.fingerprint(), "texts": self.texts_hash, "history": history}
            (tmp / "trainer.json").write_text(json.dumps(info, indent=1))
            make_readable(tmp)
            if final.exists():
                shutil.rmtree(final)
            tmp.rename(final)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        for old in sorted(root.glob("step-*"))[: -self.recipe.keep_checkpoints]:
            shutil.rmtree(old, ignore_errors=True)

    def latest_checkpoint(self) -> Path | None:
        root = self._checkpoint_dir()
        found = sorted(p for p in root.glob("step-*") if (p / "trainer.json").exists()) if root.exists() else []
        return found[-1] if found else None

    def _load_checkpoint(self, path: Path, optimizer, scheduler) -> tuple[int, list[dict]]:
        info = json.loads((path / "trainer.json").read_text())
        if info["fingerprint"] != self.recipe.fingerprint():
            raise ValueError(f"{path / 'trainer.json'}: field 'fingerprint': checkpoint written by a different recipe; use a new --output or --no-resume")
        if info["texts"] != self.texts_hash:
            raise ValueError(f"{path / 'trainer.json'}: field 'texts': checkpoint written for a different corpus; use a new --output or --no-resume")
        state = torch.load(path / "state.pt", weights_only=True)
        params = self.trainable()
        if set(state["trainable"]) != set(params):
            raise ValueError(f"{path / 'state.pt'}: holds other trainable tensors than this model")
        with torch.no_grad():
            for n, v in state["trainable"].items():
                params[n].copy_(v)
        optimizer.load_state_dict(state["optimizer"])
        scheduler.load_state_dict(state["scheduler"])
        torch.set_rng_state(state["torch_rng"])
        return int(state["step"]), list(info["history"])

    # ------------------------------------------------------------ train
    def _contrastive_step(self, kind: str, stage: int, step: int) -> tuple[float, int]:
        anchors, positives, a_txt, p_txt = self.pair_batch(kind, stage, step)
        wrapped_a, wrapped_p = self.embedder.wrap_ids(anchors), self.embedder.wrap_ids(positives)
        cache = GradCache(self.embedder.pooled, self.recipe.micro_batch_size)
        symmetric = kind == "spans"  # neither span is the query side

        def loss_fn(a: torch.Tensor, p: torch.Tensor) -> torch.Tensor:
            return pair_loss(a, p, self.temperature(), anchor_texts=a_txt, positive_texts=p_txt, symmetric=symmetric).mean()

        loss, _ = cache.step([wrapped_a, wrapped_p], loss_fn)
        return float(loss), sum(len(x) for x in wrapped_a) + sum(len(x) for x in wrapped_p)

    def _ctkd_step(self, stage: int, step: int) -> tuple[float, int]:
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
        return total / len(pairs), tokens

    def train(self, resume: bool = True, stop_after: int | None = None) -> LLM2CompResult:
        """Run (or resume) all stages; write the adapter, loss curve JSON and PNG into ``run_dir``.

        stop_after: return after this many optimizer steps of this call (simulates a crash in tests).
        """
        r = self.recipe
        seed_everything(r.seed)
        self.run_dir.mkdir(parents=True, exist_ok=True)
        if self.peft_model is None:
            self.attach()
        params = list(self.trainable().values())
        optimizer = torch.optim.AdamW(params, lr=r.lr, weight_decay=r.weight_decay)
        scheduler = make_scheduler(optimizer, r)
        start, history = 0, []
        ckpt = self.latest_checkpoint() if resume else None
        if ckpt is not None:
            start, history = self._load_checkpoint(ckpt, optimizer, scheduler)
            log.info("resuming from %s (step %d of %d)", ckpt, start, r.total_steps)
        elif self._checkpoint_dir().exists():
            shutil.rmtree(self._checkpoint_dir())
        bounds = np.cumsum([0] + [s.steps for s in r.stages])
        bar = None
        if self.progress:
            from tqdm.auto import tqdm

            bar = tqdm(total=r.total_steps, initial=start, desc="llm2comp", unit="step")
        self.peft_model.train()
        t0, tokens_run, completed = time.perf_counter(), 0, True
        for step in range(start, r.total_steps):
            if stop_after is not None and step - start >= stop_after:
                completed = False
                break
            k = int(np.searchsorted(bounds, step, side="right") - 1)
            kind, local = r.stages[k].kind, int(step - bounds[k])
            set_attention_dropout(self.embedder.causal_lm, r.dropout if kind == "simcse" else 0.0)
            if kind == "ctkd":
                loss, n_tok = self._ctkd_step(k, local)
            else:
                loss, n_tok = self._contrastive_step(kind, k, local)
            grad_norm = float(torch.nn.utils.clip_grad_norm_(params, r.max_grad_norm)) if r.max_grad_norm else None
            lr = scheduler.get_last_lr()[0]
            optimizer.step()
            scheduler.step()
            optimizer.zero_grad(set_to_none=True)
            tokens_run += n_tok
            elapsed = time.perf_counter() - t0
            history.append({"step": step + 1, "stage": k + 1, "kind": kind, "loss": loss, "lr": lr, "grad_norm": grad_norm,
                            "tokens": n_tok, "tokens_per_s": round(tokens_run / elapsed, 1)})
            if not math.isfinite(loss):
                raise FloatingPointError(f"loss is {loss} at step {step + 1} ({kind})")
            if bar is not None:
                bar.update(1)
                bar.set_postfix(stage=f"{k + 1}:{kind}", loss=f"{loss:.4f}", tok_s=f"{tokens_run / elapsed:.0f}")
            last_of_stage = step + 1 == bounds[k + 1]
            if (step + 1) % r.save_every == 0 or last_of_stage:
                self._save_checkpoint(step + 1, optimizer, scheduler, history)
            if last_of_stage and k + 1 < len(r.stages):
                # a snapshot per finished stage (each stage measurable from one run); the live
                # weights are not rounded, so training goes on exactly as without it
                self._write_adapter(self.run_dir / f"{ADAPTER}-stage{k + 1}", history)
        set_attention_dropout(self.embedder.causal_lm, 0.0)
        if bar is not None:
            bar.close()
        self.peft_model.eval()
        seconds = time.perf_counter() - t0
        self.write_loss_curve(history)
        adapter_dir = self.run_dir / ADAPTER
        if completed:
            round_lora_to_bf16(self.peft_model)
            self._write_adapter(adapter_dir, history)
            log.info("adapter written to %s", adapter_dir)
        return LLM2CompResult(adapter_dir, self.run_dir, history, seconds, tokens_run, completed)

    def export_checkpoint(self, checkpoint: Path, directory: Path) -> Path:
        """Write the adapter of a saved checkpoint (e.g. to measure a run that has not finished).

        The weights are rounded to bf16 as in a finished run; the record names the checkpoint.
        """
        if self.peft_model is None:
            self.attach()
        params = list(self.trainable().values())
        optimizer = torch.optim.AdamW(params, lr=self.recipe.lr, weight_decay=self.recipe.weight_decay)
        _, history = self._load_checkpoint(Path(checkpoint), optimizer, make_scheduler(optimizer, self.recipe))
        self.peft_model.eval()
        round_lora_to_bf16(self.peft_model)
        record = self.record(history) | {"exported_from_checkpoint": str(checkpoint)}
        return save_adapter(self.peft_model, Path(directory), record, record_name=RECORD, memory=self.memory)

    def _write_adapter(self, directory: Path, history: list[dict]) -> Path:
        return save_adapter(self.peft_model, directory, self.record(history), record_name=RECORD, memory=self.memory)

    # ----------------------------------------------------------- outputs
    def record(self, history: list[dict]) -> dict:
        """What ``llm2comp.json`` in the adapter directory says about this run."""
        r = self.recipe
        c = self.embedder.config
        tail = [h["loss"] for h in history[-10:]]
        return {
            "method": "LLM2Comp (../shared/papers/llm2comp.txt): CTKD compression pre-training + unsupervised contrastive stages",
            "recipe": r.to_dict(),
            "recipe_fingerprint": r.fingerprint(),
            "backbone": self.embedder.identity,
            "embedding": {"prompt": c.prompt, "pooling": c.pooling, "attention": c.attention, "max_length": r.max_length,
                          "memory_tokens": c.memory_tokens},
            "corpus": self.corpus_info | {"n_texts": len(self.texts), "sha256": self.texts_hash},
            "steps": len(history),
            "final_loss_mean_last10": float(np.mean(tail)) if tail else None,
            "stage_losses": {str(k + 1): {"kind": hs[0]["kind"], "first": hs[0]["loss"], "last": hs[-1]["loss"]}
                             for k in range(len(r.stages)) if (hs := [h for h in history if h["stage"] == k + 1])},
            "torch_threads": torch.get_num_threads(),
            "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        }

    def write_loss_curve(self, history: list[dict]) -> None:
        write_json_atomic(self.run_dir / LOSS_JSON, {"recipe": self.recipe.to_dict(), "history": history})
        if history:
            plot_loss_curves(history, self.run_dir / LOSS_PNG)


def plot_loss_curves(history: list[dict], path: Path) -> None:
    """One panel per stage (their losses have different units), raw and moving average."""
    import os

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    stages = sorted({h["stage"] for h in history})
    fig, axes = plt.subplots(1, len(stages), figsize=(4.5 * len(stages), 3.6), squeeze=False)
    for ax, stage in zip(axes[0], stages):
        hs = [h for h in history if h["stage"] == stage]
        x, y = np.array([h["step"] for h in hs]), np.array([h["loss"] for h in hs])
        ax.plot(x, y, alpha=0.35, lw=1)
        w = max(1, min(10, len(y) // 5))
        if w > 1:
            ax.plot(x[w - 1 :], np.convolve(y, np.ones(w) / w, mode="valid"), lw=2)
        ax.set_title(f"stage {stage}: {hs[0]['kind']}")
        ax.set_xlabel("optimizer step")
        ax.set_ylabel(LOSS_NAMES[hs[0]["kind"]])
    fig.tight_layout()
    path = Path(path)
    tmp = path.with_name(f".{path.name}.tmp.png")
    fig.savefig(tmp, dpi=110)
    plt.close(fig)
    os.replace(tmp, path)
