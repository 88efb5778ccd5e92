"""Text2Token training loop (§3.3, §4.4, §5.1): LoRA on the backbone, KL to cached token targets.

The backbone is the project's :class:`~embedder.encoder.Embedder`, so training pools exactly
as indexing does (same prompt template, pooling and attention). peft injects LoRA into the
backbone's q/v projections; W_lm stays frozen. Targets are computed first, with the frozen
backbone (the model-derived target needs θ0, not the stage-1 model), and cached.

Reproducibility: the data order of each stage is a pure function of (seed, stage), and a
checkpoint holds the LoRA weights (fp32), optimizer, scheduler, torch RNG (LoRA dropout),
step and loss history, so a resumed run ends bit-identical to an uninterrupted one on the
same machine and thread count.
"""

from __future__ import annotations

import json
import logging
import math
import os
import random
import shutil
import tempfile
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import torch

from embedder.encoder import Embedder, EmbedderConfig
from training.adapter_io import make_readable, round_lora_to_bf16, save_adapter
from training.config import Recipe
from training.contrastive import GradCache, Temperature, pair_loss
from training.loss import text2token_loss
from training.pairs import PairSet, pair_batches
from training.target_cache import SparseTargets, cache_key, cached, texts_fingerprint, write_json_atomic
from training.targets_data import compute_data_targets
from training.targets_model import compute_model_targets

log = logging.getLogger(__name__)

CHECKPOINTS = "checkpoints"
ADAPTER = "adapter"
LOSS_JSON = "loss_curve.json"
LOSS_PNG = "loss_curve.png"
TARGET_NAMES = {"data": "data-driven", "model": "model-derived", "pairs": "contrastive pairs"}


@dataclass
class TrainResult:
    adapter_dir: Path
    run_dir: Path
    history: list[dict]
    seconds: float
    tokens: int
    completed: bool


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def stage_orders(recipe: Recipe, pools: Sequence[np.ndarray], lengths: np.ndarray | None = None) -> list[np.ndarray]:
    """Text rows visited by each stage, in order: seeded reshuffles of its pool, concatenated.

    With ``recipe.group_by_length`` (and ``lengths``), each window of ``group_window`` batches
    is sorted by length, cut into batches, and the batches are shuffled: batches then hold
    texts of similar length, so far less compute goes to padding (HF's group_by_length).
    """
    orders = []
    for k, (stage, pool) in enumerate(zip(recipe.stages, pools)):
        if stage.target == "pairs":  # drawn by training.pairs.pair_batches instead
            orders.append(np.zeros(0, dtype=np.int64))
            continue
        need = stage.steps * recipe.batch_size
        if need and len(pool) == 0:
            raise ValueError(f"stage {k + 1} ({TARGET_NAMES[stage.target]}) has no text with a target")
        rng = np.random.default_rng([recipe.seed, k])
        parts, have = [], 0
        while have < need:
            parts.append(rng.permutation(pool))
            have += len(pool)
        order = np.concatenate(parts)[:need] if parts else np.zeros(0, dtype=np.int64)
        if recipe.group_by_length and lengths is not None and need:
            order = _group_by_length(order, lengths, recipe.batch_size, recipe.group_window, rng)
        orders.append(order)
    return orders


def _group_by_length(order: np.ndarray, lengths: np.ndarray, batch: int, window: int, rng: np.random.Generator) -> np.ndarray:
    out = []
    span = batch * window
    for s in range(0, len(order), span):
        chunk = order[s : s + span]
        chunk = chunk[np.argsort(-lengths[chunk], kind="stable")]
        batches = [chunk[i : i + batch] for i in range(0, len(chunk), batch)]
        out.extend(batches[j] for j in rng.permutation(len(batches)))
    return np.concatenate(out)


def make_scheduler(optimizer: torch.optim.Optimizer, recipe: Recipe) -> torch.optim.lr_scheduler.LambdaLR:
    total, warm = max(recipe.total_steps, 1), recipe.warmup_steps

    def factor(step: int) -> float:
        if warm and step < warm:
            return (step + 1) / warm
        if recipe.schedule == "linear":
            return max(0.0, (total - step) / max(total - warm, 1))
        return 1.0

    return torch.optim.lr_scheduler.LambdaLR(optimizer, factor)


class Text2TokenTrainer:
    """Turns a backbone and unlabeled texts into a LoRA adapter (see module docstring).

    texts: the training documents (never queries). embedder: an in-memory backbone
    (tests); by default ``recipe.model`` is loaded with no adapter. cache_dir: where targets
    are cached (None = no cache). pairs: the supervised pairs of "pairs" stages; their texts
    must be ``texts`` (rows of a :class:`~training.pairs.PairSet` index into it).
    """

    def __init__(
        self,
        recipe: Recipe,
        texts: Sequence[str],
        run_dir: Path,
        embedder: Embedder | None = None,
        cache_dir: Path | None = None,
        progress: bool = True,
        corpus_info: dict | None = None,
        pairs: PairSet | None = None,
    ) -> None:
        if not texts:
            raise ValueError("no training texts")
        if any(s.target == "pairs" and s.steps for s in recipe.stages) and pairs is None:
            raise ValueError("the recipe has a pairs stage: give pairs files (--pairs)")
        if pairs is not None and pairs.texts != list(texts)[: len(pairs.texts)]:
            raise ValueError("pairs must index into the training texts (texts = pairs.texts first)")
        self.recipe = recipe
        self.pairs = pairs
        self.texts = list(texts)
        self.run_dir = Path(run_dir)
        self.cache_dir = Path(cache_dir) if cache_dir is not None else None
        self.progress = progress
        self.corpus_info = corpus_info or {}
        self.texts_hash = texts_fingerprint(self.texts) + (f"+pairs:{pairs.fingerprint()}" if pairs is not None else "")
        self.temperature = Temperature(recipe.temperature, learn=recipe.learn_temperature)
        self.embedder = embedder if embedder is not None else self._load_embedder()
        self.peft_model = None
        self.targets: dict[str, SparseTargets] = {}

    # ------------------------------------------------------------ set-up
    def embedding_config(self) -> EmbedderConfig:
        r = self.recipe
        return EmbedderConfig(
            prompt=r.prompt, pooling=r.pooling, attention=r.attention, max_length=r.max_length, batch_size=r.micro_batch_size
        )

    def _load_embedder(self) -> Embedder:
        from embedder.hardware import device_capability

        # bf16 autocast only where the hardware multiplies in bf16: emulated, it is ~5x slower
        # than fp32 (AVX2 CPUs), so there the recipe's bf16 is ignored (and recorded as such).
        device = "cuda" if torch.cuda.is_available() else "cpu"
        native = device_capability(device).native_bf16
        if self.recipe.bf16 and not native:
            log.warning("recipe asks for bf16 autocast but %s has no native bf16: training in fp32", device)
        # runtime=None: the weights change under training, so no runtime may snapshot them.
        return Embedder.load(
            self.recipe.model, adapter="none", config=self.embedding_config(), bf16=self.recipe.bf16 and native, runtime=None
        )

    def prepare_targets(self) -> dict[str, SparseTargets]:
        """Compute (or load from the cache) the targets every stage needs, with the frozen backbone."""
        if self.peft_model is not None:
            raise RuntimeError("targets must be computed before LoRA is attached (θ0 = the backbone)")
        r, emb = self.recipe, self.embedder
        kinds = {s.target for s in r.stages if s.steps > 0}
        if "pairs" in kinds:  # the joint objective reads the data-driven target of the pair texts
            kinds.discard("pairs")
            if r.kl_weight > 0:
                kinds.add("data")
        model_id = emb.identity
        cache_dir = self.cache_dir if model_id.get("sha256") else None  # in-memory models have no identity
        common = {"texts": self.texts_hash, "max_length": r.max_length, "top_n": r.top_n, "vocab": emb.vocab_size}
        if "data" in kinds:
            key = cache_key(kind="data", tokenizer=model_id, cfg=asdict(r.data_target), **common)
            self.targets["data"] = cached(
                cache_dir,
                "data",
                key,
                lambda: compute_data_targets(
                    self.texts, emb.tokenizer, emb.vocab_size, r.max_length, r.data_target, r.top_n, self.progress
                ),
            )
        if "model" in kinds:
            key = cache_key(
                kind="model",
                model=model_id,
                cfg=asdict(r.model_target),
                seed=r.seed,
                bf16=r.bf16,
                prompt=r.prompt,
                pooling=r.pooling,
                attention=r.attention,
                **common,
            )
            self.targets["model"] = cached(
                cache_dir,
                "model",
                key,
                lambda: compute_model_targets(
                    emb, self.texts, r.model_target, r.top_n, r.seed, r.target_batch_size, self.progress
                ),
            )
        for kind, t in self.targets.items():
            if len(t) != len(self.texts):
                raise ValueError(f"{kind} targets cover {len(t)} texts, the corpus has {len(self.texts)}")
        return self.targets

    def attach_lora(self):
        """Wrap the backbone with peft LoRA (r, α, dropout on q_proj/v_proj, no bias)."""
        from peft import LoraConfig, get_peft_model

        r = self.recipe
        torch.manual_seed(r.seed)  # LoRA A matrices are initialised from torch's RNG
        cfg = LoraConfig(
            r=r.lora_r,
            lora_alpha=r.lora_alpha,
            lora_dropout=r.lora_dropout,
            target_modules=list(r.lora_targets),
            bias="none",
            task_type="CAUSAL_LM",
        )
        lm = self.embedder.causal_lm
        for p in lm.parameters():
            p.requires_grad_(False)
        self.peft_model = get_peft_model(lm, cfg)
        self.peft_model.peft_config["default"].base_model_name_or_path = str(self.embedder.identity.get("name"))
        if r.init_adapter:
            self._load_init_adapter(r.init_adapter)
        self.embedder.model = self.peft_model
        return self.peft_model

    def _load_init_adapter(self, name: str) -> None:
        """Start LoRA from a trained adapter (e.g. the shipped Text2Token one) instead of zero."""
        from peft import set_peft_model_state_dict
        from safetensors.torch import load_file

        from embedder.adapters import resolve_adapter

        path = resolve_adapter(name, str(self.embedder.identity.get("name")))
        if path is None:
            raise ValueError(f"init_adapter {name!r} resolves to no adapter for {self.embedder.identity.get('name')}")
        cfg = json.loads((Path(path) / "adapter_config.json").read_text())
        r = self.recipe
        if cfg.get("r") != r.lora_r or cfg.get("lora_alpha") != r.lora_alpha or set(cfg.get("target_modules") or ()) != set(r.lora_targets):
            raise ValueError(
                f"{path}/adapter_config.json: r={cfg.get('r')} alpha={cfg.get('lora_alpha')} targets={cfg.get('target_modules')} "
                f"differ from the recipe's r={r.lora_r} alpha={r.lora_alpha} targets={list(r.lora_targets)}"
            )
        weights = {k: v.float() for k, v in load_file(str(Path(path) / "adapter_model.safetensors")).items()}
        result = set_peft_model_state_dict(self.peft_model, weights)
        missing = [k for k in getattr(result, "unexpected_keys", []) if "lora" in k]
        if missing:
            raise ValueError(f"{path}: adapter weights not found in the model: {missing[:3]}")
        self.init_adapter_path = str(path)
        log.info("LoRA initialised from %s", path)

    # ------------------------------------------------------------ steps
    def _kl_step(self, rows: np.ndarray, prompt_ids: list[list[int]], target: SparseTargets) -> tuple[float, int]:
        """One Text2Token step (Eq. 11) over ``rows``, accumulated over micro-batches; (loss sum, tokens)."""
        loss_sum, n_tok = 0.0, 0
        for m in range(0, len(rows), self.recipe.micro_batch_size):
            mrows = rows[m : m + self.recipe.micro_batch_size]
            batch = [prompt_ids[i] for i in mrows]
            h = self.embedder.pooled(batch)
            ids, probs, rest = target.batch(mrows, self.embedder.device)
            per_text = text2token_loss(self.embedder, h, ids, probs, rest)
            (per_text.sum() / len(rows)).backward()
            loss_sum += float(per_text.detach().sum())
            n_tok += sum(len(x) for x in batch)
        return loss_sum, n_tok

    # ------------------------------------------------------ pairs stage
    def _pairs_step(
        self, source, picked: np.ndarray, prompt_ids: list[list[int]], data_targets: SparseTargets | None
    ) -> tuple[float, int, dict]:
        """One contrastive step over a batch of pairs of one source (gradients accumulated, no update).

        The loss is InfoNCE over the batch's positives and hard negatives (training/contrastive.py),
        plus ``kl_weight`` x the Text2Token KL of every text of the batch to its data-driven
        target: the embedding is pulled to its positive while still predicting its own key tokens.
        Returns (loss x batch, real tokens, per-step readings).
        """
        r = self.recipe
        a_rows, p_rows = source.anchor[picked], source.positive[picked]
        n_rows = source.negative[picked]
        n_rows = n_rows[n_rows >= 0]
        groups_rows = [a_rows, p_rows] + ([n_rows] if len(n_rows) else [])
        groups = [[prompt_ids[i] for i in g] for g in groups_rows]
        texts = [[self.texts[i] for i in g] for g in groups_rows]
        readings: dict = {}

        def loss_fn(a: torch.Tensor, p: torch.Tensor, n: torch.Tensor | None = None) -> torch.Tensor:
            tau = self.temperature()
            con = pair_loss(a, p, tau, n, texts[0], texts[1], texts[2] if n is not None else None, symmetric=r.symmetric)
            loss = con.mean()
            readings["contrastive"] = float(loss.detach())
            if r.kl_weight > 0 and data_targets is not None:
                h = torch.cat([a, p] + ([n] if n is not None else []))
                rows = np.concatenate(groups_rows)
                ok = torch.from_numpy(data_targets.valid()[rows])
                ids, probs, rest = data_targets.batch(rows, self.embedder.device)
                kl = text2token_loss(self.embedder, h, ids, probs, rest)
                kl = (kl * ok).sum() / ok.sum().clamp(min=1)
                readings["kl"] = float(kl.detach())
                loss = loss + r.kl_weight * kl
            return loss

        loss, reps = GradCache(self.embedder.pooled, r.micro_batch_size).step(groups, loss_fn)
        with torch.no_grad():  # how separable the batch is: mean cosine of positives vs in-batch others
            a, p = (torch.nn.functional.normalize(x, dim=-1) for x in reps[:2])
            sims = a @ p.T
            readings["pos_cos"] = float(sims.diagonal().mean())
            readings["neg_cos"] = float((sims.sum() - sims.diagonal().sum()) / max(sims.numel() - len(a), 1))
        readings["temperature"] = self.temperature.value
        n_tok = sum(len(x) for g in groups for x in g)
        return float(loss) * len(picked), n_tok, readings

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
                "lora": {n: p.detach().clone() for n, p in self.peft_model.named_parameters() if p.requires_grad},
                "optimizer": optimizer.state_dict(),
                "scheduler": scheduler.state_dict(),
                "torch_rng": torch.get_rng_state(),
                "temperature": self.temperature.log_t.detach().clone(),
                "step": step,
            }
            torch.save(state, tmp / "state.pt")
            (tmp / "trainer.json").write_text(
                json.dumps(
                    {"step": step, "fingerprint": self.recipe.fingerprint(), "texts": self.texts_hash, "history": history},
                    indent=1,
                )
            )
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
        found = (
            sorted(p for p in self._checkpoint_dir().glob("step-*") if (p / "trainer.json").exists())
            if self._checkpoint_dir().exists()
            else []
        )
        return found[-1] if found else None

    def _load_checkpoint(self, path: Path, optimizer, scheduler) -> tuple[int, list[dict]]:
        info = json.loads((path / "trainer.json").read_text())
        if info["fingerprint"] != self.recipe.fingerprint():
            raise ValueError(f"{path}: checkpoint was written by a different recipe; use a new --output or --no-resume")
        if info["texts"] != self.texts_hash:
            raise ValueError(f"{path}: checkpoint was written for a different corpus; use a new --output or --no-resume")
        state = torch.load(path / "state.pt", weights_only=True)
        params = dict(self.peft_model.named_parameters())
        with torch.no_grad():
            for n, v in state["lora"].items():
                params[n].copy_(v)
        optimizer.load_state_dict(state["optimizer"])
        scheduler.load_state_dict(state["scheduler"])
        torch.set_rng_state(state["torch_rng"])
        if "temperature" in state:
            with torch.no_grad():
                self.temperature.log_t.copy_(state["temperature"])
        return int(state["step"]), list(info["history"])

    # ------------------------------------------------------------ train
    def train(self, resume: bool = True, stop_after: int | None = None) -> TrainResult:
        """Run (or resume) all stages; write the adapter, loss curve JSON and PNG into ``run_dir``.

        stop_after: return after this many optimizer steps of this call (simulates a crash
        in tests; the last checkpoint is what a resumed run starts from).
        """
        r = self.recipe
        seed_everything(r.seed)
        self.run_dir.mkdir(parents=True, exist_ok=True)
        targets = self.prepare_targets() if not self.targets else self.targets
        if self.peft_model is None:
            self.attach_lora()
        params = [p for p in self.peft_model.parameters() if p.requires_grad] + list(self.temperature.parameters())
        optimizer = torch.optim.AdamW(params, lr=r.lr, weight_decay=r.weight_decay)
        scheduler = make_scheduler(optimizer, r)
        pools = [
            np.flatnonzero(targets[s.target].valid()) if s.steps and s.target != "pairs" else np.zeros(0, np.int64)
            for s in r.stages
        ]
        pair_plan = {
            k: pair_batches(self.pairs.sources, s.steps, r.batch_size, r.seed, k)
            for k, s in enumerate(r.stages)
            if s.target == "pairs" and s.steps
        }
        prompt_ids = self.embedder.prompt_ids(self.texts)
        orders = stage_orders(r, pools, np.array([len(x) for x in prompt_ids]))

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

            bar = tqdm(total=r.total_steps, initial=start, desc="text2token", unit="step")
        self.peft_model.train()
        t0, tokens_run = time.perf_counter(), 0
        completed = True
        for step in range(start, r.total_steps):
            if stop_after is not None and step - start >= stop_after:
                completed = False
                break
            k = int(np.searchsorted(bounds, step, side="right") - 1)
            stage = r.stages[k]
            local = step - bounds[k]
            extra: dict = {}
            if stage.target == "pairs":
                source, rows = pair_plan[k][local]
                loss_sum, n_tok, extra = self._pairs_step(self.pairs.sources[source], rows, prompt_ids, targets.get("data"))
                extra["source"] = self.pairs.sources[source].name
            else:
                rows = orders[k][local * r.batch_size : (local + 1) * r.batch_size]
                loss_sum, n_tok = self._kl_step(rows, prompt_ids, targets[stage.target])
            grad_norm = None
            if r.max_grad_norm:
                grad_norm = float(torch.nn.utils.clip_grad_norm_(params, r.max_grad_norm))
            lr = scheduler.get_last_lr()[0]
            optimizer.step()
            scheduler.step()
            optimizer.zero_grad(set_to_none=True)
            tokens_run += n_tok
            elapsed = time.perf_counter() - t0
            history.append(
                {
                    "step": step + 1,
                    "stage": k + 1,
                    "target": stage.target,
                    "loss": loss_sum / len(rows),
                    "lr": lr,
                    "grad_norm": grad_norm,
                    "tokens": n_tok,
                    "tokens_per_s": round(tokens_run / elapsed, 1),
                    **extra,
                }
            )
            if not math.isfinite(history[-1]["loss"]):
                raise FloatingPointError(f"loss is {history[-1]['loss']} at step {step + 1}")
            if bar is not None:
                bar.update(1)
                bar.set_postfix(
                    stage=f"{k + 1}:{stage.target}", loss=f"{history[-1]['loss']:.4f}", tok_s=f"{tokens_run / elapsed:.0f}"
                )
            last_of_stage = step + 1 == bounds[k + 1]
            if (step + 1) % r.save_every == 0 or last_of_stage:
                self._save_checkpoint(step + 1, optimizer, scheduler, history)
            if last_of_stage and k + 1 < len(r.stages):
                # A snapshot per finished stage, so that each stage's effect can be measured
                # from one run. Saved as bf16 without rounding the live weights, so that
                # training goes on exactly as without the snapshot.
                save_adapter(self.peft_model, self.run_dir / f"{ADAPTER}-stage{k + 1}", self.record(history))
        if bar is not None:
            bar.close()
        self.peft_model.eval()
        seconds = time.perf_counter() - t0
        self.write_loss_curve(history)
        adapter_dir = self.run_dir / ADAPTER
        if completed:
            round_lora_to_bf16(self.peft_model)
            save_adapter(self.peft_model, adapter_dir, self.record(history))
            log.info("adapter written to %s", adapter_dir)
        return TrainResult(adapter_dir, self.run_dir, history, seconds, tokens_run, completed)

    # ----------------------------------------------------------- outputs
    def record(self, history: list[dict]) -> dict:
        """What ``text2token.json`` in the adapter directory says about this run."""
        r = self.recipe
        tail = [h["loss"] for h in history[-10:]]
        return {
            "method": "Text2Token (arXiv 2510.10224 / ../shared/papers/text2token.txt)"
            + (" + supervised contrastive (InfoNCE, training/contrastive.py)" if self.pairs is not None else ""),
            "init_adapter": getattr(self, "init_adapter_path", None),
            "pairs": self.pairs.describe() if self.pairs is not None else None,
            "autocast_bf16": bool(self.embedder.bf16),
            "recipe": r.to_dict(),
            "recipe_fingerprint": r.fingerprint(),
            "backbone": self.embedder.identity,
            "embedding": {"prompt": r.prompt, "pooling": r.pooling, "attention": r.attention, "max_length": r.max_length},
            "corpus": self.corpus_info | {"n_texts": len(self.texts), "sha256": self.texts_hash},
            "targets": {k: t.meta for k, t in self.targets.items()},
            "steps": len(history),
            "final_loss_mean_last10": float(np.mean(tail)) if tail else None,
            "stage_losses": {
                str(k + 1): {"first": hs[0]["loss"], "last": hs[-1]["loss"]}
                for k in range(len(r.stages))
                if (hs := [h for h in history if h["stage"] == k + 1])
            },
            "torch_threads": torch.get_num_threads(),
            "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        }

    def write_loss_curve(self, history: list[dict]) -> None:
        write_json_atomic(self.run_dir / LOSS_JSON, {"recipe": self.recipe.to_dict(), "history": history})
        if history:
            plot_loss_curve(history, self.run_dir / LOSS_PNG)


def plot_loss_curve(history: list[dict], path: Path) -> None:
    """Loss per optimizer step, one colour per stage, with a moving average."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    for stage in sorted({h["stage"] for h in history}):
        hs = [h for h in history if h["stage"] == stage]
        x = np.array([h["step"] for h in hs])
        y = np.array([h["loss"] for h in hs])
        line = ax.plot(x, y, alpha=0.35, lw=1)[0]
        w = max(1, min(10, len(y) // 5))
        if w > 1:
            ax.plot(x[w - 1 :], np.convolve(y, np.ones(w) / w, mode="valid"), color=line.get_color(), lw=2)
        ax.plot([], [], color=line.get_color(), label=f"stage {stage}: {TARGET_NAMES[hs[0]['target']]} target")
    ax.set_xlabel("optimizer step")
    ax.set_ylabel("loss per text (KL; pairs stage: InfoNCE + w·KL)")
    ax.set_title("Training loss")
    ax.legend()
    fig.tight_layout()
    path = Path(path)
    tmp = path.with_name(f".{path.name}.tmp.png")
    fig.savefig(tmp, dpi=110)
    plt.close(fig)
    os.replace(tmp, path)
