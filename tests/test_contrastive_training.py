"""The supervised contrastive stage on the tiny random Llama: pairs files, the loss falls, the joint
objective, GradCache = one big forward, resume, LoRA initialised from an adapter, and the check that
no training text is an evaluation text."""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import data_dir
from test_training_loop import data_targets_without_spacy, lora_state, tiny_recipe

from embedder.encoder import EmbedderConfig
from training.pairs import PairsFileError, holdout_texts, load_pairs, pair_batches, read_pairs_file
from training.text2token.recipe import Stage
from training.text2token.trainer import Text2TokenTrainer

ANIMALS = ["cat", "dog", "horse", "tiger", "whale", "eagle", "snake", "rabbit", "otter", "camel", "goose", "shark"]


def write_pairs(path: Path, rows: list[tuple[str, ...]], negatives: bool = False) -> Path:
    head = "anchor\tpositive" + ("\tnegative" if negatives else "")
    path.write_text(head + "\n" + "".join("\t".join(r) + "\n" for r in rows), encoding="utf-8")
    return path


def animal_pairs(tmp_path: Path) -> list[Path]:
    a = write_pairs(
        tmp_path / "facts.tsv",
        [(f"what is a {x}?", f"the {x} is an animal that people know", f"the {y} is an animal that people know") for x, y in zip(ANIMALS, ANIMALS[1:] + ANIMALS[:1])],
        negatives=True,
    )
    b = write_pairs(tmp_path / "homes.tsv", [(f"where does the {x} live", f"a {x} lives in its home") for x in ANIMALS[:8]])
    return [a, b]


def pair_recipe(**kw):
    base = {"stages": (Stage("pairs", 4),), "batch_size": 4, "micro_batch_size": 2, "lr": 5e-3, "save_every": 2, "lora_dropout": 0.1}
    return tiny_recipe(**(base | kw))


def make_pair_trainer(make_embedder, recipe, run_dir, paths):
    pairs = load_pairs(paths, recipe.max_pairs_per_source, recipe.seed)
    config = EmbedderConfig(max_length=recipe.max_length, batch_size=recipe.micro_batch_size, query_prompt=recipe.query_prompt)
    emb = make_embedder(config)
    tr = Text2TokenTrainer(recipe, pairs.texts, run_dir, embedder=emb, progress=False, pairs=pairs)
    if recipe.kl_weight > 0:
        tr.targets = {"data": data_targets_without_spacy(emb, pairs.texts, recipe)}
    return tr


# ------------------------------------------------------------------ pairs files
def test_pairs_files_are_read_into_shared_texts(tmp_path):
    pairs = load_pairs(animal_pairs(tmp_path))
    assert [s.name for s in pairs.sources] == ["facts", "homes"]
    facts = pairs.sources[0]
    assert len(facts) == 12 and facts.has_negatives and not pairs.sources[1].has_negatives
    # a negative of one row is the positive of another: stored once
    assert len(pairs.texts) == 12 + 12 + 8 + 8
    assert facts.negative[0] == facts.positive[1]


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ("", r"bad\.tsv: empty file"),
        ("question\tanswer\nq\ta\n", r"bad\.tsv, line 1: header"),
        ("anchor\tpositive\nq\ta\textra\n", r"bad\.tsv, line 2: 3 fields"),
        ("anchor\tpositive\nq\ta\n\t b\n", r"bad\.tsv, line 3: field 'anchor' is empty"),
        ("anchor\tpositive\n", r"bad\.tsv: no pairs"),
    ],
)
def test_malformed_pairs_file_names_file_line_and_field(tmp_path, content, message):
    (tmp_path / "bad.tsv").write_text(content)
    with pytest.raises(PairsFileError, match=message):
        read_pairs_file(tmp_path / "bad.tsv")


def test_pairs_with_a_held_out_text_are_dropped(tmp_path):
    paths = animal_pairs(tmp_path)
    sts = tmp_path / "sts.tsv"
    sts.write_text("sentence1\tsentence2\tscore\nWhat is a CAT\tsomething else\t1.0\n")
    pairs = load_pairs(paths, holdout=holdout_texts([sts]))
    assert pairs.dropped == {"facts": 1, "homes": 0}
    assert not any("what is a cat" in t for t in pairs.texts)


def test_each_batch_comes_from_one_source_and_the_plan_is_reproducible(tmp_path):
    pairs = load_pairs(animal_pairs(tmp_path))
    plan = pair_batches(pairs.sources, 10, 4, seed=3, stage=0)
    again = pair_batches(pairs.sources, 10, 4, seed=3, stage=0)
    assert all(a[0] == b[0] and np.array_equal(a[1], b[1]) for a, b in zip(plan, again))
    for s, rows in plan:
        assert len(rows) == 4 and len(set(rows.tolist())) == 4 and rows.max() < len(pairs.sources[s])
    assert {s for s, _ in plan} == {0, 1}


# ------------------------------------------------------------------- training
def test_contrastive_loss_falls_and_is_recorded(make_embedder, tmp_path):
    recipe = pair_recipe(stages=(Stage("pairs", 15),), batch_size=8, micro_batch_size=4, lr=3e-3, lora_dropout=0.0)
    paths = [write_pairs(tmp_path / "one.tsv", [(f"what is a {x}?", f"the {x} is an animal") for x in ANIMALS[:8]])]
    tr = make_pair_trainer(make_embedder, recipe, tmp_path / "run", paths)
    res = tr.train()
    losses = [h["loss"] for h in res.history]
    assert res.completed and losses[-1] < 0.7 * losses[0], losses
    assert all(h["source"] == "one" and h["pos_cos"] > h["neg_cos"] - 1 for h in res.history)
    record = json.loads((res.adapter_dir / "text2token.json").read_text())
    assert record["pairs"]["sources"][0]["pairs"] == 8 and "contrastive" in record["method"]


def test_joint_objective_adds_the_weighted_kl(make_embedder, tmp_path):
    recipe = pair_recipe(kl_weight=0.5, lora_dropout=0.0, stages=(Stage("pairs", 2),))
    tr = make_pair_trainer(make_embedder, recipe, tmp_path / "run", animal_pairs(tmp_path))
    res = tr.train()
    for h in res.history:
        assert h["kl"] > 0
        assert h["loss"] == pytest.approx(h["contrastive"] + 0.5 * h["kl"], rel=1e-5)


def test_grad_cache_chunks_do_not_change_the_update(make_embedder, tmp_path):
    # Batch 4 in one forward pass (the plain path) against chunks of 1 (the cached path). No
    # dropout: chunks draw other masks than one big batch (the replay of masks within the
    # cached path is tested in test_contrastive.py).
    kw = {"stages": (Stage("pairs", 1),), "lora_dropout": 0.0}
    one = make_pair_trainer(make_embedder, pair_recipe(micro_batch_size=4, **kw), tmp_path / "a", animal_pairs(tmp_path))
    one.train()
    chunked = make_pair_trainer(make_embedder, pair_recipe(micro_batch_size=1, **kw), tmp_path / "b", animal_pairs(tmp_path))
    chunked.train()
    a, b = lora_state(one), lora_state(chunked)
    assert a.keys() == b.keys()
    moved = [k for k in a if not torch.equal(a[k], torch.zeros_like(a[k]))]
    assert moved
    for k in a:
        assert torch.allclose(a[k], b[k], atol=1e-6), k


def test_resumed_contrastive_run_is_identical_with_a_learned_temperature(make_embedder, tmp_path):
    recipe = pair_recipe(learn_temperature=True, kl_weight=0.2, stages=(Stage("pairs", 5),))
    full = make_pair_trainer(make_embedder, recipe, tmp_path / "full", animal_pairs(tmp_path))
    res_full = full.train()
    crashed = make_pair_trainer(make_embedder, recipe, tmp_path / "resumed", animal_pairs(tmp_path))
    assert not crashed.train(stop_after=3).completed
    resumed = make_pair_trainer(make_embedder, recipe, tmp_path / "resumed", animal_pairs(tmp_path))
    res = resumed.train()
    assert [h["loss"] for h in res.history] == [h["loss"] for h in res_full.history]
    assert [h["temperature"] for h in res.history] == [h["temperature"] for h in res_full.history]
    assert res.history[-1]["temperature"] != pytest.approx(0.05, abs=1e-7)  # it was learned
    a, b = lora_state(full), lora_state(resumed)
    assert all(torch.equal(a[k], b[k]) for k in a)


def test_lora_starts_from_the_init_adapter(make_embedder, tmp_path):
    first = make_pair_trainer(make_embedder, pair_recipe(), tmp_path / "first", animal_pairs(tmp_path))
    adapter = first.train().adapter_dir
    saved = lora_state(first)  # rounded to bf16 on save, as the file holds them
    second = make_pair_trainer(make_embedder, pair_recipe(init_adapter=str(adapter)), tmp_path / "second", animal_pairs(tmp_path))
    second.attach_lora()
    start = lora_state(second)
    assert all(torch.equal(saved[k], start[k]) for k in saved)
    with pytest.raises(ValueError, match="differ from the recipe"):
        make_pair_trainer(make_embedder, pair_recipe(init_adapter=str(adapter), lora_r=4), tmp_path / "third", animal_pairs(tmp_path)).attach_lora()


# ------------------------------------------------- no evaluation text in training
def _key(text: str) -> str:
    # An independent normalisation (not training.contrastive.text_key): lowercase, letters and digits only.
    return re.sub(r"[^0-9a-z]+", "", text.lower())


def test_no_training_pair_text_is_an_evaluation_text():
    data = data_dir()
    pairs_dir = data / "pairs"
    if not pairs_dir.is_dir():
        pytest.skip(f"{pairs_dir} is absent: the supervised pairs are not on this machine")
    evaluation = [data / c for c in ("adi", "cisi", "cranfield", "medline", "npl", "stsb") if (data / c).is_dir()]
    if not evaluation:
        pytest.skip(f"no evaluation collection under {data}")
    held = holdout_texts(evaluation)
    assert len(held) > 1000
    pairs = load_pairs(sorted(pairs_dir.glob("*.tsv")), holdout=held)
    banned = {_key(t) for t in held} - {""}
    leaked = [t for t in pairs.texts if _key(t) in banned]
    assert not leaked, leaked[:5]
