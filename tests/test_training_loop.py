"""Text2Token training on the tiny random Llama: the loss falls, the saved adapter reloads to
identical embeddings, and a resumed run ends identical to an uninterrupted one."""

from __future__ import annotations

import itertools
import json

import numpy as np
import pytest
import torch
from conftest import toy_docs

from embedder.encoder import Embedder, EmbedderConfig
from training.target_cache import SparseTargets
from training.text2token.recipe import ModelTargetConfig, Recipe, Stage
from training.text2token.targets_data import TaggedText, targets_from_tagged
from training.text2token.targets_model import compute_model_targets
from training.text2token.trainer import Text2TokenTrainer

TEXTS = [d["title"] + " " + d["text"] for d in toy_docs(24)]


def tiny_recipe(**kw) -> Recipe:
    base = {
        "stages": (Stage("data", 3), Stage("model", 3)),
        "batch_size": 4,
        "micro_batch_size": 2,
        "max_length": 64,
        "lr": 5e-3,
        "top_n": 16,
        "model_target": ModelTargetConfig(common_size=12, pool_size=16),
        "save_every": 2,
        "bf16": False,
    }
    return Recipe(**(base | kw))


def data_targets_without_spacy(emb: Embedder, texts: list[str], recipe: Recipe) -> SparseTargets:
    """Data-driven targets with every alphabetic token selected (stands in for the spaCy tagger)."""
    tagged = []
    for t in texts:
        ids = emb.tokenizer(" " + t, add_special_tokens=False, truncation=True, max_length=recipe.max_length)["input_ids"]
        toks = emb.tokenizer.convert_ids_to_tokens(ids)
        tagged.append(TaggedText(np.array(ids), np.array([s.isalpha() and len(s) > 3 for s in toks])))
    return targets_from_tagged(tagged, emb.vocab_size, recipe.data_target, recipe.top_n)


def make_trainer(make_embedder, recipe: Recipe, run_dir, texts=TEXTS, bf16: bool = False) -> Text2TokenTrainer:
    emb = make_embedder(EmbedderConfig(max_length=recipe.max_length, batch_size=recipe.micro_batch_size), bf16=bf16)
    tr = Text2TokenTrainer(recipe, texts, run_dir, embedder=emb, progress=False)
    tr.targets = {
        "data": data_targets_without_spacy(emb, texts, recipe),
        "model": compute_model_targets(emb, texts, recipe.model_target, recipe.top_n, recipe.seed, progress=False),
    }
    return tr


def lora_state(tr: Text2TokenTrainer) -> dict[str, torch.Tensor]:
    return {n: p.detach().clone() for n, p in tr.peft_model.named_parameters() if p.requires_grad}


def test_kl_loss_falls_within_a_few_steps(make_embedder, tmp_path):
    # One batch of 8 texts seen at every step (the pool is the batch), bf16 autocast as on CPU.
    recipe = tiny_recipe(stages=(Stage("data", 12),), batch_size=8, micro_batch_size=4, lr=2e-2, lora_dropout=0.0, bf16=True)
    tr = make_trainer(make_embedder, recipe, tmp_path / "run", texts=TEXTS[:8], bf16=True)
    res = tr.train()
    losses = [h["loss"] for h in res.history]
    assert res.completed and len(losses) == 12
    assert all(b < a for a, b in itertools.pairwise(losses)), losses  # same batch, no dropout: every step helps
    assert losses[-1] < 0.95 * losses[0], losses
    curve = json.loads((tmp_path / "run" / "loss_curve.json").read_text())
    assert [h["loss"] for h in curve["history"]] == losses
    assert (tmp_path / "run" / "loss_curve.png").stat().st_size > 0


def test_saved_adapter_reloads_to_identical_embeddings(make_embedder, tiny_model_dir, tmp_path):
    from safetensors import safe_open

    tr = make_trainer(make_embedder, tiny_recipe(), tmp_path / "run")
    res = tr.train()
    adapter = res.adapter_dir
    with safe_open(str(adapter / "adapter_model.safetensors"), "pt") as f:
        assert {f.get_tensor(k).dtype for k in f.keys()} == {torch.bfloat16}  # noqa: SIM118 (safe_open is not iterable)
    record = json.loads((adapter / "text2token.json").read_text())
    assert record["recipe"]["stages"] == [{"target": "data", "steps": 3}, {"target": "model", "steps": 3}]
    assert record["embedding"]["pooling"] == "last"
    # The snapshot after stage 1 is an adapter of its own, recorded at the end of that stage.
    stage1 = json.loads((tmp_path / "run" / "adapter-stage1" / "text2token.json").read_text())
    assert stage1["steps"] == 3 and list(stage1["stage_losses"]) == ["1"]
    assert not (tmp_path / "run" / "adapter-stage2").exists()  # the last stage is the adapter itself

    # Same batching as the trainer's embedder: another padding width changes float sums in the last bit.
    cfg = EmbedderConfig(max_length=64, batch_size=tr.embedder.config.batch_size)
    loaded = Embedder.load(tiny_model_dir, adapter=adapter, config=cfg, device="cpu", runtime=None)
    assert loaded.adapter is not None and loaded.adapter["path"] == str(adapter.resolve())
    texts = TEXTS[:6] + ["a text the training never saw about a tiger"]
    # The trained model as training left it (LoRA unmerged, weights rounded to bf16 on save) ...
    unmerged = tr.embedder.embed(texts)
    # ... and merged the way Embedder.load merges it.
    tr.embedder.model = tr.peft_model.merge_and_unload()
    merged = tr.embedder.embed(texts)
    assert np.array_equal(loaded.embed(texts), merged)
    assert np.allclose(unmerged, merged, atol=1e-5)
    backbone = make_embedder(cfg).embed(texts)
    assert not np.allclose(backbone, merged, atol=1e-4)  # training changed the embedder


def test_resumed_run_ends_identical_to_uninterrupted(make_embedder, tmp_path):
    recipe = tiny_recipe()
    full = make_trainer(make_embedder, recipe, tmp_path / "full")
    res_full = full.train()

    crashed = make_trainer(make_embedder, recipe, tmp_path / "resumed")
    partial = crashed.train(stop_after=5)  # "crashes" after step 5; the last checkpoint is step 4
    assert not partial.completed and not (tmp_path / "resumed" / "adapter").exists()
    assert crashed.latest_checkpoint().name == "step-000004"

    resumed = make_trainer(make_embedder, recipe, tmp_path / "resumed")
    res_resumed = resumed.train()
    assert res_resumed.completed
    assert [h["loss"] for h in res_resumed.history] == [h["loss"] for h in res_full.history]
    a, b = lora_state(full), lora_state(resumed)
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_resume_refuses_a_different_recipe(make_embedder, tmp_path):
    tr = make_trainer(make_embedder, tiny_recipe(), tmp_path / "run")
    tr.train(stop_after=2)
    other = make_trainer(make_embedder, tiny_recipe(lr=1e-3), tmp_path / "run")
    with pytest.raises(ValueError, match="different recipe"):
        other.train()


def test_recipe_roundtrips_through_its_json_record():
    from training.text2token.recipe import RECIPES

    for recipe in RECIPES.values():
        back = Recipe.from_dict(json.loads(json.dumps(recipe.to_dict())))
        assert back == recipe and back.fingerprint() == recipe.fingerprint()
    assert RECIPES["cpu"].fingerprint() != RECIPES["paper"].fingerprint()
    with pytest.raises(ValueError, match="multiple of micro_batch_size"):
        Recipe(batch_size=10, micro_batch_size=4)
