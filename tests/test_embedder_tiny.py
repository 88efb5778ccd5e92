"""The Embedder on a tiny random Llama: template, pooling, attention, LM-head read-out, loading."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from embedder.encoder import PROMPT_EOL, Embedder, EmbedderConfig
from embedder.models import ModelNotAvailable

TEXTS = [
    "the cat sat near the river",
    "a computer stores data in memory and on disk",
    "game",
    "players of the arcade game team won the match with a high score on level nine",
    "snow on the mountain",
]


def template_ids(tokenizer) -> tuple[list[int], list[int]]:
    """What must surround every text: [BOS] + prefix tokens, and the suffix tokens."""
    prefix, suffix = PROMPT_EOL.split("[text]")
    pre = tokenizer(prefix, add_special_tokens=False)["input_ids"]
    suf = tokenizer(suffix, add_special_tokens=False)["input_ids"]
    return [tokenizer.bos_token_id] + pre, suf


def hidden_states(emb: Embedder, ids: list[int]) -> torch.Tensor:
    """Last hidden states of one unpadded sequence, straight from the backbone (fp32)."""
    with torch.inference_mode():
        return emb.causal_lm.base_model(input_ids=torch.tensor([ids])).last_hidden_state[0].float()


# ----------------------------------------------------------------- template
def test_prompt_ids_wrap_text_in_template(tiny_embedder, tiny_tokenizer):
    pre, suf = template_ids(tiny_tokenizer)
    text_ids = tiny_tokenizer("the cat sat", add_special_tokens=False)["input_ids"]
    assert tiny_embedder.prompt_ids(["the cat sat"]) == [pre + text_ids + suf]
    # the tokenizer's own BOS is kept, once, in front of the template (not in front of the text)
    assert tiny_embedder.prompt_ids(["x"])[0].count(tiny_tokenizer.bos_token_id) == 1


def test_template_never_truncated(tiny_embedder, tiny_tokenizer):
    pre, suf = template_ids(tiny_tokenizer)
    max_len = tiny_embedder.config.max_length
    long_text = " ".join(["mountain river forest"] * 200)
    (ids,) = tiny_embedder.prompt_ids([long_text])
    assert len(ids) == len(pre) + max_len + len(suf)
    assert ids[: len(pre)] == pre
    assert ids[-len(suf) :] == suf
    # the kept text is the beginning of the text
    assert ids[len(pre) : len(pre) + max_len] == tiny_tokenizer(long_text, add_special_tokens=False)["input_ids"][:max_len]


# ------------------------------------------------------------ embeddings
def test_embed_shape_dtype_and_batch_invariance(make_embedder):
    emb = make_embedder(batch_size=2)
    out = emb.embed(TEXTS)
    assert out.shape == (len(TEXTS), emb.dim) == (len(TEXTS), 32)
    assert out.dtype == np.float32 and np.isfinite(out).all()
    # input order kept although batches run longest-first, and padding changes nothing
    alone = np.stack([emb.embed([t])[0] for t in TEXTS])
    np.testing.assert_allclose(out, alone, atol=1e-5)
    assert emb.embed([]).shape == (0, 32)


def test_iter_batches_longest_first(make_embedder):
    emb = make_embedder(batch_size=2)
    lengths = [len(x) for x in emb.prompt_ids(TEXTS)]
    seen, batch_lengths = [], []
    for pos, h, n_tokens in emb.iter_batches(TEXTS):
        assert len(pos) <= 2 and h.shape == (len(pos), emb.dim)
        assert n_tokens == sum(lengths[i] for i in pos)
        seen.extend(pos.tolist())
        batch_lengths.extend(lengths[i] for i in pos)
    assert sorted(seen) == list(range(len(TEXTS)))
    assert batch_lengths == sorted(batch_lengths, reverse=True)


def test_last_and_mean_pooling_match_the_backbone(make_embedder):
    last = make_embedder(pooling="last")
    mean = make_embedder(pooling="mean")
    ids = last.prompt_ids([TEXTS[1]])[0]
    hidden = hidden_states(last, ids)
    np.testing.assert_allclose(last.embed([TEXTS[1]])[0], hidden[-1].numpy(), atol=1e-5)
    np.testing.assert_allclose(mean.embed([TEXTS[1]])[0], hidden.mean(0).numpy(), atol=1e-5)
    # batched mean pooling must ignore padding
    np.testing.assert_allclose(mean.embed(TEXTS)[1], hidden.mean(0).numpy(), atol=1e-5)
    assert np.abs(last.embed(TEXTS) - mean.embed(TEXTS)).max() > 1e-2


def test_bidirectional_attention_differs_from_causal(make_embedder):
    causal = make_embedder(attention="causal")
    bidir = make_embedder(attention="bidirectional")  # same seed: same weights
    assert np.abs(causal.embed(TEXTS) - bidir.embed(TEXTS)).max() > 1e-2
    # what the switch means: an early position sees later tokens only when bidirectional
    a = causal.prompt_ids(["the cat sat near the river"])[0]
    b = causal.prompt_ids(["the cat sat near the lake"])[0]
    assert a[:3] == b[:3] and a != b
    assert torch.allclose(hidden_states(causal, a)[2], hidden_states(causal, b)[2], atol=1e-6)
    assert not torch.allclose(hidden_states(bidir, a)[2], hidden_states(bidir, b)[2], atol=1e-3)
    # batched bidirectional embeddings still ignore padding
    alone = np.stack([bidir.embed([t])[0] for t in TEXTS])
    np.testing.assert_allclose(bidir.embed(TEXTS), alone, atol=1e-5)


def test_attention_switch_is_reversible(make_embedder, tiny_tokenizer):
    reference = make_embedder().embed(TEXTS)
    bidir = make_embedder(attention="bidirectional")
    again_causal = Embedder(bidir.model, tiny_tokenizer, EmbedderConfig(max_length=64, batch_size=4), bf16=False)
    np.testing.assert_allclose(again_causal.embed(TEXTS), reference, atol=1e-6)


def test_bf16_close_to_fp32(make_embedder):
    fp32 = make_embedder(bf16=False).embed(TEXTS)
    bf16 = make_embedder(bf16=True).embed(TEXTS)
    cos = (fp32 * bf16).sum(1) / np.linalg.norm(fp32, axis=1) / np.linalg.norm(bf16, axis=1)
    assert cos.min() > 0.99


# ------------------------------------------------------- LM-head read-out
def test_logits_are_the_lm_head_of_the_pooled_state(tiny_embedder):
    h = tiny_embedder.embed(TEXTS)
    logits = tiny_embedder.logits(h).detach()  # a plain tensor: training differentiates through it
    assert logits.shape == (len(TEXTS), tiny_embedder.vocab_size) and logits.dtype == torch.float32
    w = tiny_embedder.causal_lm.get_output_embeddings().weight.detach().numpy()
    np.testing.assert_allclose(logits.numpy(), h @ w.T, rtol=1e-5, atol=1e-5)
    # with last pooling, these are the LM's own next-token logits after the template
    ids = tiny_embedder.prompt_ids([TEXTS[0]])[0]
    with torch.inference_mode():
        lm = tiny_embedder.causal_lm(input_ids=torch.tensor([ids])).logits[0, -1]
    np.testing.assert_allclose(logits[0].numpy(), lm.numpy(), atol=1e-4)


def test_top_tokens_are_the_largest_logits(tiny_embedder):
    h = tiny_embedder.embed(TEXTS)
    ids, vals = tiny_embedder.top_tokens(h, 7)
    assert ids.shape == vals.shape == (len(TEXTS), 7)
    assert ids.dtype == np.int32 and vals.dtype == np.float32
    logits = tiny_embedder.logits(h).detach().numpy()
    np.testing.assert_allclose(vals, np.take_along_axis(logits, ids.astype(np.int64), 1), atol=1e-6)
    np.testing.assert_allclose(vals, -np.sort(-logits, 1)[:, :7], atol=1e-6)
    assert np.all(np.diff(vals, axis=1) <= 0)
    ids_all, _ = tiny_embedder.top_tokens(h, 10_000)  # more than the vocabulary: all of it
    assert ids_all.shape == (len(TEXTS), tiny_embedder.vocab_size)


def test_aligned_tokens(tiny_embedder):
    pairs = tiny_embedder.aligned_tokens(TEXTS[0], k=5)
    ids, vals = tiny_embedder.top_tokens(tiny_embedder.embed([TEXTS[0]]), 5)
    assert [t for t, _ in pairs] == tiny_embedder.token_strings(ids[0])
    assert [v for _, v in pairs] == pytest.approx(vals[0].tolist())


def test_literal_token_ids(tiny_embedder, tiny_tokenizer):
    ids = tiny_embedder.literal_token_ids("  the cat the cat  ")
    assert tiny_embedder.token_strings(ids) == ["the", "cat"]
    assert not set(ids) & set(tiny_tokenizer.all_special_ids)


def test_token_strings(tiny_embedder, tiny_tokenizer):
    ids = list(range(tiny_embedder.vocab_size))
    assert tiny_embedder.token_strings(ids) == tiny_tokenizer.convert_ids_to_tokens(ids)
    assert tiny_embedder.token_strings([tiny_embedder.vocab_size + 3]) == [f"<{tiny_embedder.vocab_size + 3}>"]


def test_describe(tiny_embedder):
    d = tiny_embedder.describe()
    assert d["model"] == tiny_embedder.identity and d["adapter"] is None
    assert d["embedding"] == tiny_embedder.config.to_dict()
    assert EmbedderConfig(**d["embedding"]) == tiny_embedder.config


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"prompt": "no placeholder"}, "placeholder"),
        ({"pooling": "max"}, "pooling"),
        ({"attention": "sideways"}, "attention"),
        ({"max_length": 0}, "positive"),
        ({"batch_size": 0}, "positive"),
    ],
)
def test_config_validation(kwargs, message):
    with pytest.raises(ValueError, match=message):
        EmbedderConfig(**kwargs)


# ----------------------------------------------------------------- loading
def test_load_from_directory(tiny_model_dir, other_model_dir, tiny_embedder):
    emb = Embedder.load(tiny_model_dir, adapter="none", device="cpu", runtime=None)  # the plain fp32 path, for exact comparison
    assert emb.identity["name"] == str(tiny_model_dir.resolve())
    assert len(emb.identity["sha256"]) == 64 and emb.adapter is None
    assert emb.vocab_size == tiny_embedder.vocab_size and emb.dim == 32
    assert emb.prompt_ids(TEXTS) == tiny_embedder.prompt_ids(TEXTS)
    np.testing.assert_allclose(emb.embed(TEXTS), tiny_embedder.embed(TEXTS), atol=1e-5)
    # the identity is the weights' hash: stable across loads, different for other weights
    assert Embedder.load(tiny_model_dir, adapter="none", device="cpu").identity == emb.identity
    assert Embedder.load(other_model_dir, adapter="none", device="cpu").identity["sha256"] != emb.identity["sha256"]


def test_load_with_lora_adapter(tiny_model_dir, tiny_tokenizer, tmp_path):
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    base = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32)
    peft_model = get_peft_model(base, LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"]))
    torch.manual_seed(3)
    for name, p in peft_model.named_parameters():
        if "lora_B" in name:  # B starts at zero (a no-op adapter); make it do something
            torch.nn.init.normal_(p, std=0.5)
    adapter_dir = tmp_path / "adapter"
    peft_model.save_pretrained(adapter_dir)

    plain = Embedder.load(tiny_model_dir, adapter="none", device="cpu", runtime=None)
    tuned = Embedder.load(tiny_model_dir, adapter=adapter_dir, device="cpu", runtime=None)
    assert tuned.adapter["path"] == str(adapter_dir.resolve()) and len(tuned.adapter["sha256"]) == 64
    assert tuned.identity == plain.identity  # same backbone, the adapter is recorded apart
    assert np.abs(tuned.embed(TEXTS) - plain.embed(TEXTS)).max() > 1e-3
    # merged weights give what the unmerged adapter gives
    unmerged = Embedder(peft_model, tiny_tokenizer, tuned.config, bf16=False)
    np.testing.assert_allclose(tuned.embed(TEXTS), unmerged.embed(TEXTS), atol=1e-4)
    # the OpenVINO export of the merged model (the fast path) reads the same adapter
    fast = Embedder.load(tiny_model_dir, adapter=adapter_dir, device="cpu", dtype="fp32")
    np.testing.assert_allclose(fast.embed(TEXTS), tuned.embed(TEXTS), atol=1e-4)


def test_load_refuses_a_directory_that_is_not_an_adapter(tiny_model_dir, tmp_path):
    with pytest.raises(ModelNotAvailable, match="adapter_config.json"):
        Embedder.load(tiny_model_dir, adapter=tmp_path, device="cpu")


def test_load_refuses_a_directory_that_is_not_a_model(tmp_path):
    with pytest.raises(ModelNotAvailable, match="config.json"):
        Embedder.load(tmp_path, adapter="none", device="cpu")
