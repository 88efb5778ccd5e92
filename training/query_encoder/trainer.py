"""Train a query-encoder student on cached teacher states, and judge how faithful it is."""
from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from embedder.query_encoder import DistilledQueryEncoder, llm_token_ids, make_student_head, teacher_identity
from training.objectives.query_distillation import query_distillation_loss, teacher_top_tokens
from training.query_encoder.data import RaggedStates, encoder_token_states, student_inputs, teacher_states
from training.query_encoder.recipe import DistillRecipe


@dataclass
class TokenInputs:
    """What a token-bag student reads besides the sentence embedding: each text's LLM token ids
    and mask (:func:`embedder.query_encoder.llm_token_ids`) and the teacher's input-embedding table."""

    ids: np.ndarray  # (n, L) int64
    mask: np.ndarray  # (n, L) float32
    table: torch.Tensor  # (V, d) frozen
    encoder_states: RaggedStates | None = None  # the sentence encoder's token states (recipe.encoder_tokens)


def length_batches(order: torch.Tensor, lengths: torch.Tensor | None, batch_size: int, g: torch.Generator, pool: int = 50) -> list[torch.Tensor]:
    """``order`` cut into batches; with ``lengths``, batches of texts of similar length (sorted
    within pools of ``pool`` batches, then the batches shuffled): a batch pads to its longest
    text, so random batches of short queries and long sentences would mostly compute padding."""
    if lengths is None:
        return [order[i : i + batch_size] for i in range(0, len(order), batch_size)]
    batches: list[torch.Tensor] = []
    for i in range(0, len(order), batch_size * pool):
        chunk = order[i : i + batch_size * pool]
        chunk = chunk[torch.argsort(lengths[chunk], stable=True)]
        batches += [chunk[j : j + batch_size] for j in range(0, len(chunk), batch_size)]
    return [batches[k] for k in torch.randperm(len(batches), generator=g).tolist()]


def train_head(
    x: np.ndarray, h: np.ndarray, lm_head: torch.Tensor, recipe: DistillRecipe, progress: bool = True, tokens: TokenInputs | None = None,
    device: str = "cpu",
) -> tuple[torch.nn.Module, dict]:
    """Fit the student ``x (, tokens) -> h`` (x: the frozen encoder's embeddings, h: the teacher's
    states; ``tokens``: the texts' LLM tokens, for ``recipe.kind`` "token-bag") on ``device``.

    Returns the head (on the CPU, where students answer queries) and its training record: per-epoch
    loss and held-out cosine, seconds, and the held-out positions (never trained on), for :func:`faithfulness`.
    The split, the batches and the initial weights come from ``recipe.seed`` alone, whatever the device.
    """
    from tqdm.auto import tqdm

    g = torch.Generator().manual_seed(recipe.seed)
    n = len(x)
    order = torch.randperm(n, generator=g)
    n_hold = max(1, int(n * recipe.holdout))
    hold, train = order[:n_hold], order[n_hold:]
    xt = torch.from_numpy(np.ascontiguousarray(x)).float().to(device)
    ht = torch.from_numpy(np.ascontiguousarray(h)).float().to(device)
    torch.manual_seed(recipe.seed)
    head = make_student_head(
        recipe.kind, x.shape[1], h.shape[1], recipe.hidden, recipe.gate_hidden, recipe.context_layers, recipe.context_dim, recipe.token_hidden,
        recipe.encoder_tokens,
    ).to(device)
    if recipe.kind == "token-bag" and tokens is None:
        raise ValueError("a token-bag student is trained on the texts' LLM tokens: pass tokens")
    if recipe.encoder_tokens and (tokens is None or tokens.encoder_states is None):
        raise ValueError("a student reading the sentence encoder's token states is trained on them: pass tokens.encoder_states")
    ids = torch.from_numpy(tokens.ids).to(device) if tokens is not None else None
    mask = torch.from_numpy(tokens.mask).to(device) if tokens is not None else None
    table = tokens.table.to(device) if tokens is not None else None
    lengths = torch.from_numpy(tokens.mask).sum(1) if tokens is not None else None  # on the CPU: batching reads it

    def forward(rows: torch.Tensor) -> torch.Tensor:
        on = rows.to(device)
        if recipe.kind == "pooled":
            return head(xt[on])
        width = max(1, int(lengths[rows].max()))  # a batch pads to its own longest text, not the corpus's
        inputs = [xt[on], table[ids[on, :width]].float(), mask[on, :width]]
        if recipe.encoder_tokens:
            inputs += [torch.from_numpy(a).to(device) for a in tokens.encoder_states.batch(rows.numpy())]
        return head(*inputs)

    opt = torch.optim.AdamW(head.parameters(), lr=recipe.lr, weight_decay=recipe.weight_decay)
    steps = recipe.epochs * ((len(train) + recipe.batch_size - 1) // recipe.batch_size)
    # warm-up over a tenth of the steps, and over two at least: OneCycleLR divides by zero when it is under one step
    sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=recipe.lr, total_steps=max(steps, 3), pct_start=max(0.1, 2 / max(steps, 3)))
    w = lm_head.detach().float().to(device)
    top = teacher_top_tokens(ht, w, recipe.kl_top) if recipe.kl_weight else None
    curve, start = [], time.perf_counter()
    bar = tqdm(range(recipe.epochs), desc="distilling", unit="epoch", disable=not progress)
    for epoch in bar:
        perm = train[torch.randperm(len(train), generator=g)]
        total = 0.0
        head.train()
        for b in length_batches(perm, lengths, recipe.batch_size, g):
            loss = query_distillation_loss(
                forward(b), ht[b.to(device)], w, kl_weight=recipe.kl_weight, kl_top=recipe.kl_top, temperature=recipe.temperature,
                teacher_top=top[b.to(device)] if top is not None else None,
            ).mean()
            opt.zero_grad()
            loss.backward()
            opt.step()
            sched.step()
            total += float(loss.detach()) * len(b)
        head.eval()
        with torch.no_grad():
            cos = torch.cat([
                torch.nn.functional.cosine_similarity(forward(hold[i : i + 512]), ht[hold[i : i + 512].to(device)], dim=-1)
                for i in range(0, len(hold), 512)
            ]).mean().item()
        curve.append({"epoch": epoch + 1, "loss": round(total / len(train), 6), "holdout_cosine": round(cos, 6)})
        bar.set_postfix(loss=f"{total / len(train):.4f}", cos=f"{cos:.4f}")
    record = {"n_texts": n, "n_train": len(train), "n_holdout": n_hold, "curve": curve, "seconds": round(time.perf_counter() - start, 1)}
    return head.cpu().eval(), {**record, "device": str(device), "holdout_positions": hold.tolist()}


def _quantiles(v: np.ndarray) -> dict:
    points = (0.0, 0.05, 0.25, 0.5, 0.75, 0.95, 1.0)
    return {"mean": round(float(v.mean()), 4), **{f"q{int(p * 100):02d}": round(float(q), 4) for p, q in zip(points, np.quantile(v, points))}}


def faithfulness(student_h: np.ndarray, teacher_h: np.ndarray, lm_head: torch.Tensor, m: int) -> dict:
    """Per text, the cosine of the student's state to the teacher's and the overlap of their
    top-``m`` LM-head tokens (the query expansion); reported as distributions (quantiles)."""
    s, t = torch.from_numpy(student_h).float(), torch.from_numpy(teacher_h).float()
    cos = torch.nn.functional.cosine_similarity(s, t, dim=-1).numpy()
    w = lm_head.detach().float()
    overlaps: list[float] = []
    with torch.no_grad():
        for i in range(0, len(s), 512):
            ts = torch.topk(s[i : i + 512] @ w.T, m, dim=-1).indices.numpy()
            tt = torch.topk(t[i : i + 512] @ w.T, m, dim=-1).indices.numpy()
            overlaps += [len(set(a.tolist()) & set(b.tolist())) / m for a, b in zip(ts, tt)]
    return {"n": len(cos), "cosine": _quantiles(cos), f"top{m}_overlap": _quantiles(np.asarray(overlaps)), "m": m}


def distill(
    embedder, encoder, texts: Sequence[str], cache_root: Path, recipe: DistillRecipe, name: str, m: int, progress: bool = True,
    inputs: tuple[np.ndarray, dict] | None = None, device: str = "cpu",
) -> DistilledQueryEncoder:
    """The whole distillation: cached encoder inputs and teacher states, the head, its faithfulness on held-out texts.

    ``inputs``: the texts' sentence embeddings and the encoder's identity, computed elsewhere
    (:func:`training.query_encoder.data.load_inputs`); then ``encoder`` may be None. ``device``: where the head trains.
    """
    t0 = time.perf_counter()
    if inputs is not None:
        x, encoder_record = inputs
        if len(x) != len(texts):
            raise ValueError(f"{len(texts)} texts but {len(x)} precomputed sentence embeddings")
        if recipe.encoder_tokens:
            raise ValueError("a student reading the sentence encoder's token states needs the encoder itself, not precomputed inputs")
    else:
        x = student_inputs(encoder, texts, cache_root, progress)
        encoder_record = {**encoder.identity, "dim": int(encoder.dim)}
    h = teacher_states(embedder, texts, cache_root, progress)
    lm_head = embedder.causal_lm.get_output_embeddings().weight.detach().cpu()
    tokens = None
    if recipe.kind == "token-bag":
        ids, mask = llm_token_ids(embedder, list(texts), recipe.max_tokens)
        states = encoder_token_states(encoder, texts, cache_root, recipe.max_tokens, progress=progress) if recipe.encoder_tokens else None
        tokens = TokenInputs(ids, mask, embedder.causal_lm.get_input_embeddings().weight.detach().cpu(), states)
    encode_seconds = time.perf_counter() - t0
    head, record = train_head(x, h, lm_head, recipe, progress, tokens, device=device)
    held = record.pop("holdout_positions")
    shape = {"kind": recipe.kind, "in": int(x.shape[1]), "out": int(h.shape[1]), "hidden": recipe.hidden}
    if recipe.kind == "token-bag":
        shape.update(gate_hidden=recipe.gate_hidden, max_tokens=recipe.max_tokens, context_layers=recipe.context_layers,
                     context_dim=recipe.context_dim, token_hidden=recipe.token_hidden)
        if recipe.encoder_tokens:
            shape["encoder_tokens"] = True
    student = DistilledQueryEncoder(head, {"head": shape, "teacher": teacher_identity(embedder)}).attach(embedder)
    held_states = tokens.encoder_states.batch(held) if tokens is not None and tokens.encoder_states is not None else None
    faith = faithfulness(student.states(x[held], [texts[i] for i in held], held_states), h[held], lm_head, m)
    student.record = {
        "name": name,
        "teacher": teacher_identity(embedder),
        "teacher_names": {"model": (embedder.identity or {}).get("name"), "adapter": (embedder.adapter or {}).get("path")},
        "encoder": encoder_record,
        "head": shape,
        "recipe": recipe.to_dict(),
        "training": {**record, "encode_seconds": round(encode_seconds, 1), "runtime": embedder.runtime_info(),
                     "teacher_batch_size": embedder.config.batch_size},
        "faithfulness": faith,
    }
    return student


__all__ = ["TokenInputs", "distill", "faithfulness", "length_batches", "train_head"]
