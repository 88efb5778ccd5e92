"""BTMR training loop: LoRA + a learned <BMT> embedding, LM + matryoshka contrastive loss, resumable.

    train-btmr --corpus ../shared/data/cisi --corpus ../shared/data/medline --output runs/btmr --steps 200

Writes ``RUN/adapter/`` (peft LoRA, ``btmr.json``, ``btmr_token.safetensors``: loadable by
``cls-eval --adapter RUN/adapter``), ``RUN/loss_curve.json`` / ``.png`` and
``RUN/checkpoints/step-NNNNNN/`` (the last two). The data order is a pure function of the seed
and the step, and a checkpoint holds the LoRA weights, the <BMT> vector, the optimizer, the
torch RNG and the history, so running the same command again resumes and ends bit-identical
to an uninterrupted run (tested). A checkpoint of another recipe or corpus is refused.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import logging
import shutil
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Sequence

import numpy as np
import torch

from embedder.encoder import Embedder
from embedder.token_groups import BTMR_CONFIG, BTMR_TOKEN_FILE
from training.adapter_io import make_readable, save_adapter
from training.btmr import BTMRConfig, document_pairs, forward_states, matryoshka_contrastive, pack, pick_bmt_token

log = logging.getLogger(__name__)


@dataclass
class BTMRRecipe:
    """What decides a BTMR run (its fingerprint guards resume)."""

    steps: int = 200
    batch_pairs: int = 8
    lr: float = 2e-4
    warmup: int = 10
    lora_r: int = 16
    lora_alpha: int = 32
    lora_dropout: float = 0.0
    lora_targets: tuple[str, ...] = ("q_proj", "v_proj")
    seed: int = 0
    checkpoint_every: int = 25
    keep_checkpoints: int = 2
    btmr: dict = field(default_factory=dict)  # BTMRConfig fields other than the token id

    def fingerprint(self) -> str:
        d = {k: v for k, v in asdict(self).items() if k not in ("checkpoint_every", "keep_checkpoints", "steps")}
        return hashlib.sha256(json.dumps(d, sort_keys=True, default=list).encode()).hexdigest()[:16]


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
        if len(self.pairs) < recipe.batch_pairs:
            raise ValueError(
                f"{len(self.pairs)} documents hold 2 x {self.cfg.units_per_side} segments of {self.cfg.segment_length} tokens; "
                f"need at least batch_pairs={recipe.batch_pairs} (shorter segments or a longer corpus)"
            )
        self.texts_hash = hashlib.sha256("\x00".join(texts).encode()).hexdigest()[:16]
        self.peft_model = None
        self.bmt = None

    # ----------------------------------------------------------- model
    def _attach(self) -> None:
        from peft import LoraConfig, get_peft_model

        r = self.recipe
        torch.manual_seed(r.seed)  # LoRA A init
        lm = self.embedder.causal_lm
        for p in lm.parameters():
            p.requires_grad_(False)
        cfg = LoraConfig(r=r.lora_r, lora_alpha=r.lora_alpha, lora_dropout=r.lora_dropout, target_modules=list(r.lora_targets), bias="none", task_type="CAUSAL_LM")
        self.peft_model = get_peft_model(lm, cfg)
        self.peft_model.peft_config["default"].base_model_name_or_path = str(self.embedder.identity.get("name"))
        # the paper initialises <BMT> with the mean token embedding
        table = lm.get_input_embeddings().weight.detach()
        self.bmt = torch.nn.Parameter(table.float().mean(0).clone())

    def _params(self) -> list[torch.nn.Parameter]:
        return [p for p in self.peft_model.parameters() if p.requires_grad] + [self.bmt]

    def _batch(self, step: int) -> list[int]:
        """Pair indices of ``step``: a seeded permutation per epoch, so resume needs no data state."""
        n, b = len(self.pairs), self.recipe.batch_pairs
        per_epoch = n // b
        epoch, k = divmod(step, per_epoch)
        order = np.random.default_rng([self.recipe.seed, epoch]).permutation(n)
        return order[k * b : (k + 1) * b].tolist()

    def loss(self, idx: Sequence[int]) -> tuple[torch.Tensor, dict]:
        e = self.embedder
        pad = e._pad_id
        anchors = [pack(e._prefix, self.pairs[i][0], e._suffix, self.cfg) for i in idx]
        positives = [pack(e._prefix, self.pairs[i][1], e._suffix, self.cfg) for i in idx]
        lm = self.peft_model
        sa, lm_a = forward_states(lm, self.bmt, anchors, pad, self.cfg)
        sp, lm_p = forward_states(lm, self.bmt, positives, pad, self.cfg)
        texts_a = [" ".join(map(str, sum(self.pairs[i][0], []))) for i in idx]  # token ids: same text = same key
        texts_p = [" ".join(map(str, sum(self.pairs[i][1], []))) for i in idx]
        cons = matryoshka_contrastive(sa, sp, self.cfg, texts_a, texts_p)
        lm_loss = 0.5 * (lm_a + lm_p)
        total = self.cfg.lm_weight * lm_loss + cons
        return total, {"lm": float(lm_loss.detach()), "contrastive": float(cons.detach())}

    # ----------------------------------------------------- checkpoints
    def _ckpt_root(self) -> Path:
        return self.run_dir / "checkpoints"

    def latest_checkpoint(self) -> Path | None:
        root = self._ckpt_root()
        found = sorted(p for p in root.glob("step-*") if (p / "trainer.json").exists()) if root.exists() else []
        return found[-1] if found else None

    def _save(self, step: int, opt, sched, history: list[dict]) -> None:
        root = self._ckpt_root()
        root.mkdir(parents=True, exist_ok=True)
        final = root / f"step-{step:06d}"
        tmp = Path(tempfile.mkdtemp(dir=root, prefix=f".{final.name}."))
        try:
            torch.save({
                "lora": {n: p.detach().clone() for n, p in self.peft_model.named_parameters() if p.requires_grad},
                "bmt": self.bmt.detach().clone(), "optimizer": opt.state_dict(), "scheduler": sched.state_dict(),
                "torch_rng": torch.get_rng_state(), "step": step,
            }, tmp / "state.pt")
            (tmp / "trainer.json").write_text(json.dumps({"step": step, "fingerprint": self.recipe.fingerprint(), "texts": self.texts_hash, "history": history}))
            make_readable(tmp)
            shutil.rmtree(final, ignore_errors=True)
            tmp.rename(final)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        for old in sorted(root.glob("step-*"))[: -self.recipe.keep_checkpoints]:
            shutil.rmtree(old, ignore_errors=True)

    def _load(self, path: Path, opt, sched) -> tuple[int, list[dict]]:
        info = json.loads((path / "trainer.json").read_text())
        if info["fingerprint"] != self.recipe.fingerprint():
            raise ValueError(f"{path}: checkpoint written by a different recipe; use a new --output or --no-resume")
        if info["texts"] != self.texts_hash:
            raise ValueError(f"{path}: checkpoint written for a different corpus; use a new --output or --no-resume")
        state = torch.load(path / "state.pt", weights_only=True)
        params = dict(self.peft_model.named_parameters())
        with torch.no_grad():
            for n, v in state["lora"].items():
                params[n].copy_(v)
            self.bmt.copy_(state["bmt"])
        opt.load_state_dict(state["optimizer"])
        sched.load_state_dict(state["scheduler"])
        torch.set_rng_state(state["torch_rng"])
        return int(state["step"]), list(info["history"])

    # ----------------------------------------------------------- train
    def train(self, resume: bool = True, stop_after: int | None = None, progress: bool = True) -> dict:
        """Run or resume; returns the run record. ``stop_after``: return after that many steps of this call (tests)."""
        from tqdm.auto import tqdm

        r = self.recipe
        torch.manual_seed(r.seed)
        self.run_dir.mkdir(parents=True, exist_ok=True)
        if self.peft_model is None:
            self._attach()
        opt = torch.optim.AdamW(self._params(), lr=r.lr, weight_decay=0.0)
        sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min(1.0, (s + 1) / max(1, r.warmup)))
        start, history = 0, []
        ckpt = self.latest_checkpoint() if resume else None
        if ckpt is not None:
            start, history = self._load(ckpt, opt, sched)
            log.info("resumed from %s (step %d)", ckpt, start)
        self.peft_model.train()
        done = 0
        bar = tqdm(total=r.steps, initial=start, desc="btmr", unit="step", disable=not progress)
        t0 = time.perf_counter()
        for step in range(start, r.steps):
            if stop_after is not None and done >= stop_after:
                break
            opt.zero_grad(set_to_none=True)
            loss, parts = self.loss(self._batch(step))
            loss.backward()
            opt.step()
            sched.step()
            done += 1
            history.append({"step": step + 1, "loss": float(loss.detach()), **parts})
            bar.update(1)
            bar.set_postfix(loss=f"{history[-1]['loss']:.3f}", pairs_per_s=f"{done * r.batch_pairs / (time.perf_counter() - t0):.2f}")
            if (step + 1) % r.checkpoint_every == 0 or step + 1 == r.steps:
                self._save(step + 1, opt, sched, history)
        bar.close()
        completed = bool(history) and history[-1]["step"] == r.steps
        if completed:
            self._write_outputs(history)
        return {"completed": completed, "history": history, "pairs": len(self.pairs)}

    def _write_outputs(self, history: list[dict]) -> None:
        from safetensors.torch import save_file

        adapter = self.run_dir / "adapter"
        record = {"kind": "btmr", "recipe": asdict(self.recipe), "btmr": self.cfg.to_dict(), "backbone": self.embedder.identity,
                  "embedding": self.embedder.config.to_dict(), "corpus_sha256": self.texts_hash, "pairs": len(self.pairs),
                  "final_loss": history[-1]}
        save_adapter(self.peft_model, adapter, record)
        # the group settings and the learned <BMT> embedding travel with the adapter (embedder/token_groups.py)
        tmp = adapter / f".{BTMR_TOKEN_FILE}.tmp"
        save_file({"bmt": self.bmt.detach().float().contiguous()}, str(tmp))
        tmp.rename(adapter / BTMR_TOKEN_FILE)
        tmp = adapter / f".{BTMR_CONFIG}.tmp"
        tmp.write_text(json.dumps(self.cfg.to_dict(), indent=1))
        tmp.rename(adapter / BTMR_CONFIG)
        make_readable(adapter)
        (self.run_dir / "loss_curve.json").write_text(json.dumps({"recipe": asdict(self.recipe), "history": history}))
        _plot(history, self.run_dir / "loss_curve.png")


def _plot(history: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    x = [h["step"] for h in history]
    for key in ("loss", "lm", "contrastive"):
        ax.plot(x, [h[key] for h in history], label=key)
    ax.set_xlabel("optimizer step")
    ax.set_ylabel("loss")
    ax.set_title("BTMR training (LM + matryoshka contrastive)")
    ax.legend()
    fig.tight_layout()
    tmp = path.with_name(f".{path.name}.tmp.png")
    fig.savefig(tmp, dpi=110)
    plt.close(fig)
    tmp.rename(path)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="train-btmr", description="BTMR token-matryoshka training on a corpus's documents (LoRA).")
    p.add_argument("--corpus", action="append", required=True, type=Path, help="a BEIR folder / corpus file (documents only are read); repeatable")
    p.add_argument("--output", required=True, type=Path, help="run folder (adapter, checkpoints, loss curve)")
    p.add_argument("--model", default=None, help="backbone (default: the engine's default)")
    p.add_argument("--steps", type=int, default=BTMRRecipe.steps)
    p.add_argument("--batch-pairs", type=int, default=BTMRRecipe.batch_pairs)
    p.add_argument("--lr", type=float, default=BTMRRecipe.lr)
    p.add_argument("--segment-length", type=int, default=32)
    p.add_argument("--group-size", type=int, default=4)
    p.add_argument("--units-per-side", type=int, default=2)
    p.add_argument("--no-matryoshka", action="store_true", help="contrast only the full group (the paper's ablation)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--no-resume", action="store_true")
    p.add_argument("--no-progress", action="store_true")
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    from embedder.models import DEFAULT_MODEL
    from indexer.corpus import CorpusError, CorpusSpec

    try:
        texts = [d.text for c in args.corpus for d in CorpusSpec(c)]
        emb = Embedder.load(args.model or DEFAULT_MODEL, "none", device="cpu", runtime=None)
        recipe = BTMRRecipe(steps=args.steps, batch_pairs=args.batch_pairs, lr=args.lr, seed=args.seed,
                            btmr={"segment_length": args.segment_length, "group_size": args.group_size,
                                  "units_per_side": args.units_per_side, "matryoshka": not args.no_matryoshka})
        res = BTMRTrainer(emb, texts, args.output, recipe).train(resume=not args.no_resume, progress=not args.no_progress)
    except (CorpusError, ValueError) as exc:
        print(f"train-btmr: error: {exc}", file=sys.stderr)
        return 2
    print(f"{'completed' if res['completed'] else 'stopped'}: {len(res['history'])} steps on {res['pairs']} document pairs; adapter in {args.output / 'adapter'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
