"""Text2Token training (§3.3, §4.4, §5.1): KL to cached token targets, and the contrastive pairs stage.

The backbone is the project's :class:`~embedder.encoder.Embedder`, so training pools exactly
as indexing does (same prompt template, pooling and attention); with a recipe's
``query_prompt`` the pairs stage reads anchors as search reads queries, with that template. peft injects LoRA into the
backbone's q/v projections; W_lm stays frozen. Targets are computed first, with the frozen
backbone (the model-derived target needs θ0, not the stage-1 model), and cached.

This module holds the objectives' steps and their data; LoRA, the optimizer, checkpoints
(resume is bit-identical), progress and outputs are the shared loop's (training/loop.py).
The data order of each stage is a pure function of (seed, stage).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict
from pathlib import Path

import numpy as np
import torch

from embedder.encoder import Embedder
from training.adapter_io import save_adapter
from training.epoch import Plan, plan_slice_hash
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
from training.objectives.contrastive import GradCache, Temperature, candidate_mask, listwise_kl, pair_loss
from training.objectives.text2token import text2token_loss
from training.pairs import PairSet, pair_batches
from training.target_cache import SparseTargets, cache_key, cached, texts_fingerprint
from training.teacher import TeacherEmbeddings
from training.text2token.recipe import Recipe
from training.text2token.targets_data import compute_data_targets
from training.text2token.targets_model import compute_model_targets

TARGET_NAMES = {"data": "data-driven", "model": "model-derived", "pairs": "contrastive pairs"}
LOSS_NAMES = {"data": "KL per text", "model": "KL per text", "pairs": "InfoNCE + w·KL per pair"}


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


class Text2TokenTrainer:
    """Turns a backbone and unlabeled texts into a LoRA adapter (see module docstring).

    texts: the training documents (never queries). embedder: an in-memory backbone
    (tests); by default ``recipe.model`` is loaded with no adapter. cache_dir: where targets
    are cached (None = no cache). pairs: the supervised pairs of "pairs" stages; their texts
    must be ``texts`` (rows of a :class:`~training.pairs.PairSet` index into it).

    Issue 30: pair_plan: the pairs stage's batches, given (a chunk of an epoch, training/epoch.py)
    instead of drawn by ``pair_batches``; schedule: (first step, total steps) of the longer run
    this one is a chunk of, for the LR decay; teacher: the embeddings of the listwise KL term
    (needed when ``recipe.teacher_kl_weight`` > 0); step_log: a JSON line per step.
    With ``recipe.hard_negatives == "bm25"`` every pairs source must hold its ``mined`` rows.
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
        pair_plan: Plan | None = None,
        schedule: tuple[int, int] | None = None,
        teacher: TeacherEmbeddings | None = None,
        step_log: Path | None = None,
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
        if pair_plan is not None:
            if pairs is None or [s.target for s in recipe.stages if s.steps] != ["pairs"]:
                raise ValueError("a pair plan needs pairs and a recipe whose one stage is a pairs stage")
            if len(pair_plan) != recipe.total_steps:
                raise ValueError(f"the pair plan has {len(pair_plan)} batches for {recipe.total_steps} steps")
            self.texts_hash += f"+plan:{plan_slice_hash(pair_plan)}"  # a chunk's checkpoints belong to its stretch of the epoch
        if recipe.hard_negatives == "bm25" and pairs is not None and any(src.mined is None for src in pairs.sources):
            raise ValueError("hard_negatives 'bm25': mine the sources first (training.hard_negatives.attach_bm25_negatives)")
        if recipe.teacher_kl_weight > 0 and teacher is None:
            raise ValueError("teacher_kl_weight > 0 needs a teacher (training.teacher.TeacherEmbeddings)")
        self.pair_plan = pair_plan
        self.schedule = schedule
        self.teacher = teacher
        self.step_log = step_log
        self.temperature = Temperature(recipe.temperature, learn=recipe.learn_temperature)
        self.embedder = embedder if embedder is not None else load_backbone(recipe.model, recipe.embedder_config(), recipe.bf16)
        if self.embedder.config.query_prompt != recipe.query_prompt:
            # the record promises search the recipe's query template: training must read anchors with it
            raise ValueError(
                f"the embedder's query_prompt is {self.embedder.config.query_prompt!r}, "
                f"the recipe field query_prompt {recipe.query_prompt!r}"
            )
        self.peft_model = None
        self.init_adapter_path: str | None = None
        self.targets: dict[str, SparseTargets] = {}

    # ------------------------------------------------------------ set-up
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
        """Wrap the backbone with peft LoRA (from ``recipe.init_adapter`` if set)."""
        self.peft_model, self.init_adapter_path = attach_lora(self.embedder, self.recipe, self.recipe.init_adapter)
        return self.peft_model

    def trainable(self) -> dict[str, torch.Tensor]:
        """The LoRA weights and log τ (a parameter only when learned; saved either way)."""
        return {n: p for n, p in self.peft_model.named_parameters() if p.requires_grad} | {"temperature": self.temperature.log_t}

    def latest_checkpoint(self) -> Path | None:
        return latest_checkpoint(self.run_dir)

    # ------------------------------------------------------------ steps
    def _kl_step(self, rows: np.ndarray, prompt_ids: list[list[int]], target: SparseTargets) -> tuple[float, int, dict]:
        """One Text2Token step (Eq. 11) over ``rows``, accumulated over micro-batches; (mean loss, tokens, {})."""
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
        return loss_sum / len(rows), n_tok, {}

    def _pairs_step(
        self,
        source,
        picked: np.ndarray,
        prompt_ids: list[list[int]],
        query_ids: list[list[int]],
        data_targets: SparseTargets | None,
    ) -> tuple[float, int, dict]:
        """One contrastive step over a batch of pairs of one source (gradients accumulated, no update).

        Anchors are read from ``query_ids`` (the query template; ``prompt_ids`` again for a
        symmetric recipe), positives and negatives from ``prompt_ids`` (the document template).
        The loss is InfoNCE over the batch's positives and hard negatives (training/objectives/contrastive.py),
        plus ``kl_weight`` x the Text2Token KL of every document-template text of the batch to its
        data-driven target: the embedding is pulled to its positive while still predicting its own
        key tokens. Returns (mean loss, real tokens, per-step readings).
        """
        r = self.recipe
        a_rows, p_rows = source.anchor[picked], source.positive[picked]
        n_rows = self._negative_rows(source, picked)
        groups_rows = [a_rows, p_rows] + ([n_rows] if len(n_rows) else [])
        groups = [[query_ids[i] for i in a_rows]] + [[prompt_ids[i] for i in g] for g in groups_rows[1:]]
        # The KL targets are documents' key tokens, learnt through the document template (what
        # indexing reads): anchors read with a query template are left out of it.
        kl_from = 1 if r.query_prompt is not None else 0
        texts = [[self.texts[i] for i in g] for g in groups_rows]
        readings: dict = {}

        def loss_fn(a: torch.Tensor, p: torch.Tensor, n: torch.Tensor | None = None) -> torch.Tensor:
            tau = self.temperature()
            con = pair_loss(a, p, tau, n, texts[0], texts[1], texts[2] if n is not None else None, symmetric=r.symmetric)
            loss = con.mean()
            readings["contrastive"] = float(loss.detach())
            if r.teacher_kl_weight > 0:
                cand = p if n is None else torch.cat([p, n])
                mask = candidate_mask(texts[0], texts[1], texts[2] if n is not None else None)
                t_cand = self.teacher(np.concatenate(groups_rows[1:]))
                tkl = listwise_kl(a, cand, self.teacher(a_rows), t_cand, tau, r.teacher_temperature, mask).mean()
                readings["teacher_kl"] = float(tkl.detach())
                loss = loss + r.teacher_kl_weight * tkl
            if r.kl_weight > 0 and data_targets is not None:
                embedded = [a, p] + ([n] if n is not None else [])
                h = torch.cat(embedded[kl_from:])
                rows = np.concatenate(groups_rows[kl_from:])
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
        readings["source"] = source.name
        n_tok = sum(len(x) for g in groups for x in g)
        return float(loss), n_tok, readings

    def _negative_rows(self, source, picked: np.ndarray) -> np.ndarray:
        """The batch's negatives: the file's own, then (hard_negatives "bm25") the mined ones."""
        parts = [source.negative[picked]]
        if self.recipe.hard_negatives == "bm25":
            parts.append(source.mined[picked])
        rows = np.concatenate(parts)
        return rows[rows >= 0]

    def _prepare_teacher(self, plan) -> None:
        """Teacher embeddings of every text the plan's batches hold, computed (or read) once, up front."""
        rows = []
        for s, picked in plan:
            src = self.pairs.sources[s]
            rows += [src.anchor[picked], src.positive[picked], self._negative_rows(src, picked)]
        if rows:
            self.teacher.prepare(np.concatenate(rows))

    def stages(self, targets: dict[str, SparseTargets]) -> list[LoopStage]:
        """The recipe's stages as the loop runs them, each with its data order fixed by the seed."""
        r = self.recipe
        pools = [
            np.flatnonzero(targets[s.target].valid()) if s.steps and s.target != "pairs" else np.zeros(0, np.int64)
            for s in r.stages
        ]
        prompt_ids = self.embedder.prompt_ids(self.texts)
        # anchors are rows of the pair texts, which come first in self.texts
        asym = r.query_prompt is not None and self.pairs is not None
        query_ids = self.embedder.prompt_ids(self.pairs.texts, role="query") if asym else prompt_ids
        orders = stage_orders(r, pools, np.array([len(x) for x in prompt_ids]))
        out = []
        for k, s in enumerate(r.stages):
            # each step function binds its stage's data through default arguments
            if s.target == "pairs":
                if self.pair_plan is not None:
                    plan = self.pair_plan
                else:
                    plan = pair_batches(self.pairs.sources, s.steps, r.batch_size, r.seed, k) if s.steps else []
                if r.teacher_kl_weight > 0:
                    self._prepare_teacher(plan)

                def step(local: int, plan=plan) -> tuple[float, int, dict]:
                    source, rows = plan[local]
                    loss, n_tok, readings = self._pairs_step(self.pairs.sources[source], rows, prompt_ids, query_ids, targets.get("data"))
                    if self.pair_plan is not None:  # where in the epoch this step was, and how many pairs it took
                        readings |= {"epoch_batch": (self.schedule[0] if self.schedule else 0) + local, "pairs": len(rows)}
                    return loss, n_tok, readings
            else:
                target = targets.get(s.target)

                def step(local: int, order=orders[k], target=target) -> tuple[float, int, dict]:
                    return self._kl_step(order[local * r.batch_size : (local + 1) * r.batch_size], prompt_ids, target)

            title = f"{TARGET_NAMES[s.target]} target"
            out.append(LoopStage(s.target, s.steps, step, {"target": s.target}, title, LOSS_NAMES[s.target]))
        return out

    # ------------------------------------------------------------ train
    def train(self, resume: bool = True, stop_after: int | None = None) -> TrainResult:
        """Run (or resume) all stages; write the adapter, loss curve JSON and PNG into ``run_dir``.

        stop_after: return after this many optimizer steps of this call (simulates a crash
        in tests; the last checkpoint is what a resumed run starts from).
        """
        seed_everything(self.recipe.seed)
        targets = self.prepare_targets() if not self.targets else self.targets
        if self.peft_model is None:
            self.attach_lora()
        loop = TrainingLoop(
            self.recipe, self.stages(targets), self.run_dir, self.texts_hash, self.peft_model, self.trainable(),
            self._write_adapter, "text2token", self.progress,
            schedule_offset=self.schedule[0] if self.schedule else 0, schedule_total=self.schedule[1] if self.schedule else None,
            step_log=self.step_log,
        )
        return loop.run(resume, stop_after)

    # ----------------------------------------------------------- outputs
    def _write_adapter(self, directory: Path, history: list[dict]) -> Path:
        return save_adapter(self.peft_model, directory, self.record(history))

    def record(self, history: list[dict]) -> dict:
        """What ``text2token.json`` in the adapter directory says about this run."""
        r = self.recipe
        return run_record(r, history) | {
            "method": "Text2Token (arXiv 2510.10224 / ../shared/papers/text2token.txt)"
            + (" + supervised contrastive (InfoNCE, training/objectives/contrastive.py)" if self.pairs is not None else ""),
            "init_adapter": self.init_adapter_path,
            **({"teacher": self.teacher.identity} if self.teacher is not None else {}),
            "pairs": self.pairs.describe() if self.pairs is not None else None,
            "autocast_bf16": bool(self.embedder.bf16),
            "backbone": self.embedder.identity,
            "embedding": {"prompt": r.prompt, "pooling": r.pooling, "attention": r.attention, "max_length": r.max_length}
            # only when set: the records of symmetric runs stay what they were
            | ({"query_prompt": r.query_prompt} if r.query_prompt is not None else {}),
            "corpus": self.corpus_info | {"n_texts": len(self.texts), "sha256": self.texts_hash},
            "targets": {k: t.meta for k, t in self.targets.items()},
        }
