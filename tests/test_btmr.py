"""BTMR (training/btmr/, training/objectives/matryoshka.py, embedder/token_groups.py): the group attention
mask, the losses, resume, and the adapter read back as token-group features."""
from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
import torch

from embedder.token_groups import GroupSpec, btmr_config, group_states, install_bmt_embedding, prefix_features
from training.btmr.recipe import BTMRConfig, BTMRRecipe
from training.btmr.sequences import batch_inputs, document_pairs, forward_states, group_attention_mask, pack
from training.btmr.trainer import BTMRTrainer
from training.objectives.matryoshka import matryoshka_contrastive


def test_group_attention_mask_by_hand():
    # unit 0: text a b, group G0 H0; unit 1: text c, group G1 H1
    unit = [0, 0, 0, 0, 1, 1, 1]
    bmt = [False, False, True, True, False, True, True]
    T, F = True, False
    want = [
        # a  b  G0 H0 c  G1 H1
        [T, F, F, F, F, F, F],  # a
        [T, T, F, F, F, F, F],  # b
        [T, T, T, F, F, F, F],  # G0
        [T, T, T, T, F, F, F],  # H0
        [F, F, T, T, T, F, F],  # c sees the previous group, not the previous text
        [F, F, T, T, T, T, F],  # G1
        [F, F, T, T, T, T, T],  # H1
    ]
    assert group_attention_mask(unit, bmt).tolist() == want


def test_three_units_see_only_the_previous_group():
    m = group_attention_mask([0, 0, 1, 1, 2, 2], [False, True, False, True, False, True])
    assert not m[4, 1]  # unit 2 never sees unit 0's group
    assert m[4, 3] and not m[4, 2]


def test_pack_layout():
    cfg = BTMRConfig(bmt_token_id=99, group_size=2, segment_length=2)
    p = pack([1], [[5, 6], [7]], [2], cfg)
    assert p.ids == [1, 5, 6, 2, 99, 99, 1, 7, 2, 99, 99]
    assert p.unit == [0] * 6 + [1] * 5
    assert p.groups == [[4, 5], [9, 10]]
    assert [i for i, t in enumerate(p.is_text) if t] == [1, 2, 7]


def test_the_model_honours_the_mask(tiny_embedder):
    """One unit: the 4D mask is plain causal attention, so states equal the ordinary forward."""
    e = tiny_embedder
    lm = e.causal_lm
    cfg = BTMRConfig(bmt_token_id=5, group_size=2, segment_length=8)
    ids = e.tokenizer("cat dog river", add_special_tokens=False)["input_ids"]
    p = pack(e._prefix, [ids], e._suffix, cfg)
    bmt = lm.get_input_embeddings().weight[5].detach()
    states, _ = forward_states(lm, bmt, [p], e._pad_id, cfg)
    with torch.no_grad():
        ref = lm.model(input_ids=torch.tensor([p.ids])).last_hidden_state[0, p.groups[0]]
    torch.testing.assert_close(states[0, 0], ref, rtol=1e-5, atol=1e-5)
    # two units: unit 1's text positions do not depend on unit 0's text except through group 0
    p2 = pack(e._prefix, [ids, ids], e._suffix, cfg)
    _, mask, _ = batch_inputs([p2], e._pad_id)
    allowed = mask[0, 0] == 0
    start1 = p2.unit.index(1)
    assert not allowed[start1:, : p2.groups[0][0]].any()


def test_contrastive_counts_every_prefix():
    torch.manual_seed(0)
    a, p = torch.randn(4, 2, 3, 8), torch.randn(4, 2, 3, 8)
    cfg = BTMRConfig(bmt_token_id=1, group_size=3)
    full = matryoshka_contrastive(a, p, cfg)
    only_k = matryoshka_contrastive(a, p, BTMRConfig(bmt_token_id=1, group_size=3, matryoshka=False))
    assert torch.isfinite(full) and torch.isfinite(only_k) and full.item() != pytest.approx(only_k.item())
    # identical views: the loss is at its floor for every prefix
    assert matryoshka_contrastive(a, a.clone(), cfg).item() < full.item()


def test_document_pairs_are_two_halves():
    cfg = BTMRConfig(bmt_token_id=1, segment_length=2, units_per_side=1)
    pairs = document_pairs([[1, 2, 3, 4, 5, 6], [1, 2, 3]], cfg)
    assert pairs == [([[1, 2]], [[4, 5]])]


def _trainer(make_embedder, run_dir, steps=4):
    from tests.conftest import TOPICS

    rng = np.random.default_rng(0)
    words = [w for ws in TOPICS.values() for w in ws]
    texts = [" ".join(rng.choice(words, 40)) for _ in range(12)]
    emb = make_embedder()
    recipe = BTMRRecipe(steps=steps, batch_size=4, lr=1e-3, save_every=1, lora_r=4, lora_alpha=8,
                        btmr={"segment_length": 6, "group_size": 2, "units_per_side": 2})
    return BTMRTrainer(emb, texts, run_dir, recipe, bmt_token_id=emb.tokenizer.convert_tokens_to_ids("[EOS]"))


def _weights(t: BTMRTrainer) -> dict:
    w = {n: p.detach().clone() for n, p in t.peft_model.named_parameters() if p.requires_grad}
    w["bmt"] = t.bmt.detach().clone()
    return w


def test_resume_is_bit_identical(make_embedder, tmp_path):
    whole = _trainer(make_embedder, tmp_path / "whole")
    res = whole.train(progress=False)
    assert res["completed"] and len(res["history"]) == 4
    part = _trainer(make_embedder, tmp_path / "part")
    assert not part.train(stop_after=2, progress=False)["completed"]
    resumed = _trainer(make_embedder, tmp_path / "part")  # a fresh process: new objects, same folder
    res2 = resumed.train(progress=False)
    assert res2["completed"] and [h["loss"] for h in res2["history"]] == [h["loss"] for h in res["history"]]
    a, b = _weights(whole), _weights(resumed)
    assert a.keys() == b.keys()
    for k in a:
        assert torch.equal(a[k], b[k]), k


def test_resume_refuses_another_recipe(make_embedder, tmp_path):
    t = _trainer(make_embedder, tmp_path / "run")
    t.train(stop_after=1, progress=False)
    other = _trainer(make_embedder, tmp_path / "run")
    other.recipe = replace(other.recipe, lr=5e-4)  # recipes are frozen
    with pytest.raises(ValueError, match="different recipe"):
        other.train(progress=False)


def test_adapter_reads_back_as_token_groups(make_embedder, tmp_path):
    t = _trainer(make_embedder, tmp_path / "run", steps=2)
    t.train(progress=False)
    adapter = tmp_path / "run" / "adapter"
    cfg = btmr_config(adapter)
    assert cfg["group_size"] == 2 and (adapter / "adapter_config.json").exists()
    from peft import PeftModel

    from embedder.encoder import Embedder
    from tests.conftest import build_tiny_model, tiny_identity

    e = make_embedder()
    lm = PeftModel.from_pretrained(build_tiny_model(e.tokenizer, 0), str(adapter)).merge_and_unload()
    emb = Embedder(lm, e.tokenizer, e.config, identity=tiny_identity(0))
    spec = install_bmt_embedding(emb, adapter)
    assert spec.append_ids == (cfg["bmt_token_id"],) * 2
    states = group_states(emb, ["cat dog", "river sea mountain"], spec)
    assert states.shape == (2, 2, emb.dim) and np.isfinite(states).all()
    assert prefix_features(states, 2).shape == (2, 2 * emb.dim)


def test_template_tail_state_zero_is_the_pooled_token(tiny_embedder):
    texts = ["cat dog", "computer memory data", "river"]
    states = group_states(tiny_embedder, texts, GroupSpec(3))
    np.testing.assert_allclose(states[:, 0], tiny_embedder.embed(texts), rtol=1e-5, atol=1e-5)
    assert not np.allclose(states[:, 1], states[:, 0])


def test_bf16_autocast_trains_and_is_recorded(make_embedder, tmp_path):
    # train-btmr asks for bf16 autocast where the CPU has it natively (training.loop.load_backbone);
    # the trainer must run under it (states and losses back in fp32) and say so in the adapter record.
    from embedder.adapters import adapter_record
    from tests.conftest import TOPICS

    rng = np.random.default_rng(0)
    words = [w for ws in TOPICS.values() for w in ws]
    texts = [" ".join(rng.choice(words, 40)) for _ in range(12)]
    emb = make_embedder(bf16=True)
    recipe = BTMRRecipe(steps=2, batch_size=4, lr=1e-3, save_every=1, lora_r=4, lora_alpha=8,
                        btmr={"segment_length": 6, "group_size": 2, "units_per_side": 2})
    t = BTMRTrainer(emb, texts, tmp_path / "run", recipe, bmt_token_id=emb.tokenizer.convert_tokens_to_ids("[EOS]"))
    res = t.train(progress=False)
    assert res["completed"] and all(np.isfinite(h["loss"]) for h in res["history"])
    assert adapter_record(tmp_path / "run" / "adapter")["autocast_bf16"] is True
    fp32 = _trainer(make_embedder, tmp_path / "fp32", steps=1)
    fp32.train(progress=False)
    assert adapter_record(tmp_path / "fp32" / "adapter")["autocast_bf16"] is False
