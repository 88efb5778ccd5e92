"""The one training loop: LoRA, optimizer and schedule, checkpoints and resume, progress, outputs.

Every trainer (Text2Token: training/text2token/trainer.py, LLM2Comp: training/llm2comp/trainer.py, BTMR:
training/btmr/trainer.py) keeps only its objective and its data: it hands
:class:`TrainingLoop` a list of :class:`LoopStage` (a step function each), the tensors it
trains, and a function that writes its adapter. The loop runs the stages in order under one
optimizer and writes, into the run folder:

- ``checkpoints/step-NNNNNN/``: the trained tensors (fp32), optimizer, scheduler, every RNG
  state, step and loss history. A step's data is a pure function of (seed, stage, step) in
  every trainer, so a resumed run ends bit-identical to an uninterrupted one on the same
  machine and thread count. A checkpoint of another recipe or corpus is refused.
- ``adapter-stageK/`` after each stage but the last (each stage's effect measurable from one
  run) and ``adapter/`` at the end, written by the trainer's function.
- ``loss_curve.json`` and ``loss_curve.png``.
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
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from embedder.encoder import Embedder, EmbedderConfig
from embedder.util import write_json_atomic
from training.adapter_io import make_readable, round_lora_to_bf16
from training.recipe import EmbedderRecipe, TrainRecipe

log = logging.getLogger(__name__)

CHECKPOINTS = "checkpoints"
ADAPTER = "adapter"
LOSS_JSON = "loss_curve.json"
LOSS_PNG = "loss_curve.png"

# A stage's step: local step index -> (mean loss per text or pair, tokens through the network,
# readings for the history row). It computes the gradients (backward); the loop updates.
StepFn = Callable[[int], tuple[float, int, dict]]
# Writes the adapter (and its record) of the model as it is now into a folder: (folder, history) -> folder.
AdapterWriter = Callable[[Path, list[dict]], Path]


@dataclass(frozen=True)
class LoopStage:
    """One stage as the loop runs it."""

    name: str  # shown in the progress bar, e.g. "data" or "ctkd"
    steps: int
    step: StepFn
    row: dict = field(default_factory=dict)  # written into every history row, e.g. {"target": "data"}
    title: str = ""  # the stage's loss-curve panel
    ylabel: str = "loss"
    parts: tuple[str, ...] = ()  # readings plotted beside the loss (components of it)


@dataclass
class TrainResult:
    """What a run did: where its outputs are, its history, time, tokens, and whether it finished."""

    adapter_dir: Path
    run_dir: Path
    history: list[dict]
    seconds: float
    tokens: int
    completed: bool


# ------------------------------------------------------------------ set-up
def seed_everything(seed: int) -> None:
    """Seed Python's, NumPy's and torch's global RNGs (what a trainer draws before the loop starts)."""
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def load_backbone(model: str, config: EmbedderConfig, bf16: bool = False) -> Embedder:
    """The backbone to train: no adapter, and no runtime (the weights change under training)."""
    from embedder.hardware import device_capability

    # bf16 autocast only where the hardware multiplies in bf16: emulated, it is ~5x slower
    # than fp32 (AVX2 CPUs), so there a recipe's bf16 is ignored (and recorded as such).
    device = "cuda" if torch.cuda.is_available() else "cpu"
    native = bf16 and device_capability(device).native_bf16
    if bf16 and not native:
        log.warning("recipe asks for bf16 autocast but %s has no native bf16: training in fp32", device)
    return Embedder.load(model, adapter="none", config=config, bf16=native, runtime=None)


def attach_lora(embedder: Embedder, recipe: TrainRecipe, init_adapter: str | None = None):
    """Wrap the embedder's causal LM with peft LoRA (the recipe's r, α, dropout and target modules).

    The backbone is frozen. LoRA starts from the seed, or holds the weights of ``init_adapter``
    (a name ``resolve_adapter`` knows, or a folder). Returns (peft model, adapter folder or None).
    """
    from peft import LoraConfig, get_peft_model

    torch.manual_seed(recipe.seed)  # LoRA A matrices are initialised from torch's RNG
    lm = embedder.causal_lm
    for p in lm.parameters():
        p.requires_grad_(False)
    cfg = LoraConfig(
        r=recipe.lora_r,
        lora_alpha=recipe.lora_alpha,
        lora_dropout=recipe.lora_dropout,
        target_modules=list(recipe.lora_targets),
        bias="none",
        task_type="CAUSAL_LM",
    )
    peft_model = get_peft_model(lm, cfg)
    backbone = str(embedder.identity.get("name"))
    peft_model.peft_config["default"].base_model_name_or_path = backbone
    path = _load_adapter_weights(peft_model, init_adapter, backbone, recipe) if init_adapter else None
    embedder.model = peft_model
    return peft_model, path


def _load_adapter_weights(peft_model, name: str, backbone: str, recipe: TrainRecipe) -> str:
    """Copy a trained adapter's LoRA weights into ``peft_model``, whose LoRA must have its shape."""
    from peft import set_peft_model_state_dict
    from safetensors.torch import load_file

    from embedder.adapters import resolve_adapter

    path = resolve_adapter(name, backbone)
    if path is None:
        raise ValueError(f"init_adapter {name!r} resolves to no adapter for {backbone}")
    cfg = json.loads((Path(path) / "adapter_config.json").read_text())
    r = recipe
    shape = (cfg.get("r"), cfg.get("lora_alpha"), set(cfg.get("target_modules") or ()))
    if shape != (r.lora_r, r.lora_alpha, set(r.lora_targets)):
        raise ValueError(
            f"{path}/adapter_config.json: r={cfg.get('r')} alpha={cfg.get('lora_alpha')} targets={cfg.get('target_modules')} "
            f"differ from the recipe's r={r.lora_r} alpha={r.lora_alpha} targets={list(r.lora_targets)}"
        )
    weights = {k: v.float() for k, v in load_file(str(Path(path) / "adapter_model.safetensors")).items()}
    result = set_peft_model_state_dict(peft_model, weights)
    missing = [k for k in getattr(result, "unexpected_keys", []) if "lora" in k]
    if missing:
        raise ValueError(f"{path}: adapter weights not found in the model: {missing[:3]}")
    log.info("LoRA initialised from %s", path)
    return str(path)


def make_scheduler(
    optimizer: torch.optim.Optimizer, recipe: TrainRecipe, total_steps: int, offset: int = 0
) -> torch.optim.lr_scheduler.LambdaLR:
    """Linear warm-up over ``warmup_steps``, then constant or a linear decay to 0 at ``total_steps``.

    offset: this run is a chunk of a longer one (training/epoch.py) that starts at step ``offset``
    of ``total_steps``: the decay follows the long run's step, and the warm-up is the chunk's own
    (each chunk starts a fresh optimizer, whose moments must build up again).
    """
    total, warm = max(total_steps, 1), recipe.warmup_steps

    def factor(step: int) -> float:
        ramp = (step + 1) / warm if warm and step < warm else 1.0
        if recipe.schedule != "linear" or (warm and step < warm and not offset):
            return ramp
        decay = max(0.0, (total - step - offset) / max(total - warm, 1))
        return min(ramp, decay, 1.0) if offset else decay

    return torch.optim.lr_scheduler.LambdaLR(optimizer, factor)


# --------------------------------------------------------------- RNG state
def rng_state() -> dict:
    """Every RNG a step may draw from (dropout: torch's CPU or CUDA generator), for a checkpoint."""
    name, keys, pos, has_gauss, cached = np.random.get_state()
    state = {
        "torch_rng": torch.get_rng_state(),
        "python_rng": random.getstate(),
        # as a tensor: checkpoints are read with weights_only=True, which refuses numpy arrays
        "numpy_rng": (name, torch.from_numpy(keys.astype(np.int64)), pos, has_gauss, cached),
    }
    if torch.cuda.is_available():
        state["cuda_rng"] = torch.cuda.get_rng_state_all()
    return state


def restore_rng_state(state: dict) -> None:
    """Set the RNGs saved by :func:`rng_state` (checkpoints written before this change hold only torch's)."""
    torch.set_rng_state(state["torch_rng"])
    if "python_rng" in state:
        version, internal, gauss = state["python_rng"]
        random.setstate((version, tuple(internal), gauss))
    if "numpy_rng" in state:
        name, keys, pos, has_gauss, cached = state["numpy_rng"]
        np.random.set_state((name, keys.numpy().astype(np.uint32), pos, has_gauss, cached))
    if "cuda_rng" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda_rng"])


# ------------------------------------------------------------- checkpoints
def latest_checkpoint(run_dir: Path) -> Path | None:
    """The newest complete checkpoint of a run folder (one with its ``trainer.json``), or None."""
    root = Path(run_dir) / CHECKPOINTS
    found = sorted(p for p in root.glob("step-*") if (p / "trainer.json").exists()) if root.exists() else []
    return found[-1] if found else None


def _saved_tensors(state: dict) -> dict[str, torch.Tensor]:
    """The trained tensors of a checkpoint's state. Text2Token checkpoints written before the
    trainers shared this loop kept LoRA under "lora" and the temperature beside it."""
    if "trainable" in state:
        return state["trainable"]
    return state["lora"] | ({"temperature": state["temperature"]} if "temperature" in state else {})


# -------------------------------------------------------------------- loop
@dataclass
class TrainingLoop:
    """Runs stages under one AdamW optimizer and LR schedule, with checkpoints and resume.

    trainable: every tensor the run changes, by name (saved in checkpoints); those that
    require grad are optimised, in this order. model: the peft model (train/eval mode; its
    LoRA weights are rounded to bf16 before the final adapter is written, so that the model in
    memory is the one on disk). texts_hash: identifies the training data in checkpoints.
    name: the progress bar's label.
    """

    recipe: TrainRecipe
    stages: Sequence[LoopStage]
    run_dir: Path
    texts_hash: str
    model: torch.nn.Module
    trainable: dict[str, torch.Tensor]
    write_adapter: AdapterWriter
    name: str
    progress: bool = True
    # A chunk of a longer run (training/epoch.py): its first step is step schedule_offset of
    # schedule_total, for the LR decay (None: this run is the whole schedule).
    schedule_offset: int = 0
    schedule_total: int | None = None
    # One JSON line per optimizer step (the history row), appended and flushed as the step ends,
    # so that a killed run's per-step losses and seconds survive (None: none written).
    step_log: Path | None = None

    def __post_init__(self) -> None:
        self.run_dir = Path(self.run_dir)
        self.total_steps = sum(s.steps for s in self.stages)
        self.params = [p for p in self.trainable.values() if p.requires_grad]
        self.optimizer = torch.optim.AdamW(self.params, lr=self.recipe.lr, weight_decay=self.recipe.weight_decay)
        self.scheduler = make_scheduler(self.optimizer, self.recipe, self.schedule_total or self.total_steps, self.schedule_offset)

    # ------------------------------------------------------- checkpoints
    def save_checkpoint(self, step: int, history: list[dict]) -> None:
        """Write ``checkpoints/step-NNNNNN`` under a temporary name, then rename; keep the newest few."""
        root = self.run_dir / CHECKPOINTS
        root.mkdir(parents=True, exist_ok=True)
        final = root / f"step-{step:06d}"
        tmp = Path(tempfile.mkdtemp(dir=root, prefix=f".{final.name}."))
        try:
            state = {
                "trainable": {n: p.detach().clone() for n, p in self.trainable.items()},
                "optimizer": self.optimizer.state_dict(),
                "scheduler": self.scheduler.state_dict(),
                "step": step,
                **rng_state(),
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

    def load_checkpoint(self, path: Path) -> tuple[int, list[dict]]:
        """Restore the trained tensors, optimizer, scheduler and RNGs; returns (step, history)."""
        path = Path(path)
        info = json.loads((path / "trainer.json").read_text())
        if info["fingerprint"] != self.recipe.fingerprint():
            raise ValueError(
                f"{path / 'trainer.json'}: field 'fingerprint': checkpoint written by a different recipe; "
                "use a new --output or --no-resume"
            )
        if info["texts"] != self.texts_hash:
            raise ValueError(
                f"{path / 'trainer.json'}: field 'texts': checkpoint written for a different corpus; "
                "use a new --output or --no-resume"
            )
        state = torch.load(path / "state.pt", weights_only=True)
        saved = _saved_tensors(state)
        if set(saved) != set(self.trainable):
            raise ValueError(f"{path / 'state.pt'}: holds other trainable tensors than this model")
        with torch.no_grad():
            for n, v in saved.items():
                self.trainable[n].copy_(v)
        self.optimizer.load_state_dict(state["optimizer"])
        self.scheduler.load_state_dict(state["scheduler"])
        restore_rng_state(state)
        return int(state["step"]), list(info["history"])

    # --------------------------------------------------------------- run
    def run(self, resume: bool = True, stop_after: int | None = None) -> TrainResult:
        """Run (or resume) all stages; write the adapters and the loss curve into the run folder.

        stop_after: return after this many optimizer steps of this call (simulates a crash in
        tests; the last checkpoint is what a resumed run starts from).
        """
        from tqdm.auto import tqdm

        r, total = self.recipe, self.total_steps
        self.run_dir.mkdir(parents=True, exist_ok=True)
        start, history = 0, []
        ckpt = latest_checkpoint(self.run_dir) if resume else None
        if ckpt is not None:
            start, history = self.load_checkpoint(ckpt)
            log.info("resuming from %s (step %d of %d)", ckpt, start, total)
        elif (self.run_dir / CHECKPOINTS).exists():  # a fresh start: no stale checkpoint may be resumed later
            shutil.rmtree(self.run_dir / CHECKPOINTS)
        bounds = np.cumsum([0] + [s.steps for s in self.stages])
        bar = tqdm(total=total, initial=start, desc=self.name, unit="step", disable=not self.progress)
        self.model.train()
        t0, tokens_run, completed = time.perf_counter(), 0, True
        t_step = t0
        for step in range(start, total):
            if stop_after is not None and step - start >= stop_after:
                completed = False
                break
            k = int(np.searchsorted(bounds, step, side="right") - 1)
            stage = self.stages[k]
            loss, n_tok, readings = stage.step(int(step - bounds[k]))
            grad_norm = float(torch.nn.utils.clip_grad_norm_(self.params, r.max_grad_norm)) if r.max_grad_norm else None
            lr = self.scheduler.get_last_lr()[0]
            self.optimizer.step()
            self.scheduler.step()
            self.optimizer.zero_grad(set_to_none=True)
            tokens_run += n_tok
            now = time.perf_counter()
            elapsed = now - t0
            # per-step seconds add up to the training time even across resumes (a rate does not)
            history.append(
                {"step": step + 1, "stage": k + 1, **stage.row, "loss": loss, "lr": lr, "grad_norm": grad_norm, "tokens": n_tok,
                 "seconds": round(now - t_step, 3), "tokens_per_s": round(tokens_run / elapsed, 1), **readings}
            )
            t_step = now
            if self.step_log is not None:
                with open(self.step_log, "a", encoding="utf-8") as f:
                    f.write(json.dumps(history[-1], sort_keys=True) + "\n")
            if not math.isfinite(loss):
                raise FloatingPointError(f"loss is {loss} at step {step + 1} (stage {k + 1}: {stage.name})")
            bar.update(1)
            bar.set_postfix(stage=f"{k + 1}:{stage.name}", loss=f"{loss:.4f}", tok_s=f"{tokens_run / elapsed:.0f}")
            last_of_stage = step + 1 == bounds[k + 1]
            if (step + 1) % r.save_every == 0 or last_of_stage:
                self.save_checkpoint(step + 1, history)
            if last_of_stage and k + 1 < len(self.stages):
                # Saved as bf16 without rounding the live weights, so that training goes on
                # exactly as without the snapshot.
                self.write_adapter(self.run_dir / f"{ADAPTER}-stage{k + 1}", history)
        bar.close()
        self.model.eval()
        seconds = time.perf_counter() - t0
        write_json_atomic(self.run_dir / LOSS_JSON, {"recipe": r.to_dict(), "history": history}, sort_keys=True, ensure_ascii=True)
        if history:
            plot_loss_curve(history, self.stages, self.run_dir / LOSS_PNG)
        adapter_dir = self.run_dir / ADAPTER
        if completed:
            round_lora_to_bf16(self.model)
            self.write_adapter(adapter_dir, history)
            log.info("adapter written to %s", adapter_dir)
        return TrainResult(adapter_dir, self.run_dir, history, seconds, tokens_run, completed)


# ----------------------------------------------------------------- outputs
def run_record(recipe: EmbedderRecipe, history: list[dict], stage_keys: Sequence[str] = ()) -> dict:
    """The fields every staged run's adapter record holds: recipe, steps, losses, threads, time.

    stage_keys: history fields repeated in each stage's entry of ``stage_losses``.
    """
    tail = [h["loss"] for h in history[-10:]]
    return {
        "recipe": recipe.to_dict(),
        "recipe_fingerprint": recipe.fingerprint(),
        "steps": len(history),
        "final_loss_mean_last10": float(np.mean(tail)) if tail else None,
        "stage_losses": {
            str(k + 1): {**{key: hs[0][key] for key in stage_keys}, "first": hs[0]["loss"], "last": hs[-1]["loss"]}
            for k in range(len(recipe.stages))
            if (hs := [h for h in history if h["stage"] == k + 1])
        },
        "torch_threads": torch.get_num_threads(),
        "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
    }


def plot_loss_curve(history: list[dict], stages: Sequence[LoopStage], path: Path) -> None:
    """One panel per stage (their losses differ in kind and scale): raw, moving average, parts."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    present = sorted({h["stage"] for h in history})
    fig, axes = plt.subplots(1, len(present), figsize=(4.5 * len(present), 3.6), squeeze=False)
    for ax, k in zip(axes[0], present):
        stage = stages[k - 1]
        hs = [h for h in history if h["stage"] == k]
        x, y = np.array([h["step"] for h in hs]), np.array([h["loss"] for h in hs])
        ax.plot(x, y, alpha=0.35, lw=1, label="loss")
        w = max(1, min(10, len(y) // 5))
        if w > 1:
            ax.plot(x[w - 1 :], np.convolve(y, np.ones(w) / w, mode="valid"), lw=2, label=f"loss, mean of {w}")
        for part in stage.parts:
            ax.plot(x, [h[part] for h in hs], lw=1, label=part)
        ax.set_title(f"stage {k}: {stage.title or stage.name}")
        ax.set_xlabel("optimizer step")
        ax.set_ylabel(stage.ylabel)
        ax.legend(fontsize="small")
    fig.tight_layout()
    path = Path(path)
    tmp = path.with_name(f".{path.name}.tmp.png")
    fig.savefig(tmp, dpi=110)
    plt.close(fig)
    os.replace(tmp, path)
