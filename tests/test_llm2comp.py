"""LLM2Comp on the tiny random Llama: memory pooling on every path, the CTKD loss, the corpus
pair sources, the trainer (loss falls, adapter reloads to the same embedder, bit-identical resume)."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from conftest import toy_docs

from embedder.encoder import Embedder, EmbedderConfig
from embedder.memory import MEMORY_FILE, MemoryTokens, memory_ids
from training.corpus_pairs import sentence_and_document, split_sentences, two_spans
from training.llm2comp.recipe import RECIPES, LLM2CompRecipe, LLM2CompStage
from training.llm2comp.trainer import LLM2CompTrainer
from training.objectives.ctkd import ctkd_loss, cut_for_continuation, encode_memory

TEXTS = [f"{d['title']} {d['text']}. {d['text']} with {d['title']}." for d in toy_docs(24)]
N_MEM = 3


def memory_embedder(make_embedder, attention: str = "causal", seed: int = 0, **kw) -> Embedder:
    emb = make_embedder(EmbedderConfig(prompt="[text]", pooling="last", attention=attention, max_length=48, batch_size=4, **kw))
    mem = MemoryTokens.initial(emb.causal_lm.get_input_embeddings().weight, N_MEM, seed=seed)
    return Embedder(emb.model, emb.tokenizer, EmbedderConfig(prompt="[text]", pooling="memory", attention=attention,
                                                             max_length=48, batch_size=4), identity=emb.identity, memory=mem)


def tiny_recipe(**kw) -> LLM2CompRecipe:
    base = {
        "stages": (LLM2CompStage("ctkd", 4), LLM2CompStage("simcse", 2), LLM2CompStage("spans", 2)),
        "batch_size": 4, "contrastive_batch_size": 6, "micro_batch_size": 2, "max_length": 32, "continuation_length": 8,
        "min_text": 4, "min_continuation": 4, "memory_tokens": N_MEM, "span_min": 4, "span_max": 8, "lr": 1e-2,
        "warmup_steps": 0, "save_every": 2, "attention": "causal", "lora_dropout": 0.0,
    }
    return LLM2CompRecipe(**(base | kw))


def make_trainer(make_embedder, recipe: LLM2CompRecipe, run_dir) -> LLM2CompTrainer:
    emb = make_embedder(EmbedderConfig(prompt=recipe.prompt, attention=recipe.attention, max_length=recipe.max_length,
                                       batch_size=recipe.micro_batch_size))
    return LLM2CompTrainer(recipe, TEXTS, run_dir, embedder=emb, progress=False)


# ------------------------------------------------------------ memory pooling
@pytest.mark.parametrize("attention", ["causal", "bidirectional"])
def test_memory_pooling_is_the_mean_of_the_memory_states(make_embedder, attention):
    emb = memory_embedder(make_embedder, attention)
    texts = TEXTS[:5]
    ids = emb.prompt_ids(texts)
    vocab = emb.causal_lm.get_input_embeddings().weight.shape[0]
    assert all(row[-N_MEM:] == memory_ids(vocab, N_MEM) for row in ids)  # slots after the whole prompt
    # by hand, one text at a time (no padding): the memory vectors appended to the token embeddings
    lm = emb.causal_lm
    for text, row, got in zip(texts, ids, emb.embed(texts)):
        tok = torch.tensor([row[:-N_MEM]])
        embeds = torch.cat([lm.get_input_embeddings()(tok)[0], emb.memory.vectors.detach()]).unsqueeze(0)
        with torch.no_grad():
            hidden = lm.model(inputs_embeds=embeds).last_hidden_state[0]
        assert np.allclose(got, hidden[-N_MEM:].mean(0).numpy(), atol=1e-5), text


def test_memory_pooling_needs_memory_and_is_recorded(make_embedder):
    with pytest.raises(ValueError, match="memory"):
        make_embedder(EmbedderConfig(pooling="memory"))
    with pytest.raises(ValueError, match="memory_tokens"):
        EmbedderConfig(pooling="last", memory_tokens=4)
    emb = memory_embedder(make_embedder)
    assert emb.describe()["embedding"]["pooling"] == "memory"
    assert emb.describe()["embedding"]["memory_tokens"] == N_MEM


@pytest.mark.parametrize("runtime", ["torch", "openvino"])
def test_runtimes_reproduce_the_plain_memory_path(make_embedder, runtime, tmp_path, monkeypatch):
    if runtime == "openvino":
        pytest.importorskip("openvino")
        monkeypatch.setenv("ALIGNED_TOKENS_CACHE", str(tmp_path))
    plain = memory_embedder(make_embedder)
    fast = memory_embedder(make_embedder)
    fast.runtime_name, fast.dtype = runtime, "fp32"
    texts = TEXTS[:7] + ["a text the training never saw about a tiger"]
    assert np.allclose(fast.embed(texts), plain.embed(texts), atol=1e-4)
    assert fast.runtime().prefix_len == 0  # memory pooling runs the whole prompt


# ------------------------------------------------------------------- CTKD
def test_ctkd_cut_keeps_text_and_continuation_bounds():
    rng = np.random.default_rng(0)
    ids = list(range(100))
    for _ in range(50):
        text, cont = cut_for_continuation(ids, rng, max_text=40, continuation=8, min_text=10, min_continuation=4)
        assert 10 <= len(text) <= 40 and 4 <= len(cont) <= 8
        assert text + cont == ids[: len(text) + len(cont)]
    assert cut_for_continuation(list(range(12)), rng, 40, 8, 10, 4) is None


def test_ctkd_loss_is_the_kl_of_teacher_and_memory_prefix(make_embedder):
    emb = memory_embedder(make_embedder)
    ids = emb.tokenizer(TEXTS[0], add_special_tokens=False)["input_ids"]
    text, cont = ids[:8], ids[8:13]
    got = ctkd_loss(emb, [(text, cont)])
    # by hand: teacher = [BOS] + text + cont, student = [BOS] + memory states + cont, KL(teacher || student)
    lm, bos = emb.causal_lm, emb._special_prefix()
    with torch.no_grad():
        t_logits = lm(torch.tensor([bos + text + cont])).logits[0, len(bos) + len(text) - 1 : -1]
        states = encode_memory(emb, [text])[0]
        table = lm.get_input_embeddings()
        embeds = torch.cat([table(torch.tensor(bos)), states, table(torch.tensor(cont))]).unsqueeze(0)
        s_logits = lm(inputs_embeds=embeds).logits[0, len(bos) + N_MEM - 1 : -1]
    p, q = t_logits.log_softmax(-1), s_logits.log_softmax(-1)
    expected = (p.exp() * (p - q)).sum(-1).mean()
    assert got.shape == (1,) and torch.allclose(got[0], expected, atol=1e-5)
    assert float(got) > 0
    # gradients reach the memory vectors
    got.sum().backward()
    assert emb.memory.vectors.grad is not None and emb.memory.vectors.grad.abs().sum() > 0


def test_ctkd_batched_equals_one_by_one(make_embedder):
    emb = memory_embedder(make_embedder)
    rng = np.random.default_rng(1)
    pairs = [cut_for_continuation(emb.tokenizer(t, add_special_tokens=False)["input_ids"], rng, 20, 6, 4, 3) for t in TEXTS[:4]]
    with torch.no_grad():
        batched = ctkd_loss(emb, pairs)
        single = torch.cat([ctkd_loss(emb, [p]) for p in pairs])
    assert torch.allclose(batched, single, atol=1e-5)


# ---------------------------------------------------------------- pairs
def test_pair_sources_cut_from_the_document_only():
    rng = np.random.default_rng(0)
    ids = list(range(50))
    for _ in range(30):
        a, b = two_spans(ids, rng, 5, 12)
        assert 5 <= len(a) <= 12 and 5 <= len(b) <= 12
        assert a == ids[a[0] : a[0] + len(a)] and b == ids[b[0] : b[0] + len(b)]  # contiguous spans
        assert not set(a) & set(b)  # long enough: no overlap
    assert two_spans(list(range(9)), rng, 5, 12) is None
    text = "The first sentence is here. The second one follows it! A third?"
    assert split_sentences(text, 5) == ["The first sentence is here.", "The second one follows it!", "A third?"]
    sent, doc = sentence_and_document(text, rng, 5)
    assert doc == text and sent in text
    assert sentence_and_document("only one sentence here", rng, 5) is None


# ---------------------------------------------------------------- trainer
def test_recipes_are_valid_and_roundtrip():
    for r in RECIPES.values():
        assert LLM2CompRecipe.from_dict(json.loads(json.dumps(r.to_dict()))) == r
    assert RECIPES["paper"].memory_tokens == 8 and RECIPES["paper"].temperature == 0.05
    with pytest.raises(ValueError, match="memory"):
        LLM2CompRecipe(memory_tokens=0)
    with pytest.raises(ValueError, match="stage kind"):
        LLM2CompStage("mlm", 3)


def test_ctkd_loss_falls(make_embedder, tmp_path):
    recipe = tiny_recipe(stages=(LLM2CompStage("ctkd", 12),), lr=3e-2)
    res = make_trainer(make_embedder, recipe, tmp_path / "run").train()
    losses = [h["loss"] for h in res.history]
    assert np.mean(losses[-3:]) < np.mean(losses[:3])


def test_saved_adapter_reloads_to_the_same_embedder(make_embedder, tiny_model_dir, tmp_path):
    tr = make_trainer(make_embedder, tiny_recipe(), tmp_path / "run")
    res = tr.train()
    adapter = res.adapter_dir
    assert (adapter / MEMORY_FILE).exists()
    record = json.loads((adapter / "llm2comp.json").read_text())
    assert record["embedding"]["pooling"] == "memory" and record["embedding"]["memory_tokens"] == N_MEM
    assert [s["kind"] for s in record["stage_losses"].values()] == ["ctkd", "simcse", "spans"]
    assert (tmp_path / "run" / "adapter-stage1" / MEMORY_FILE).exists()  # the pretext-only snapshot
    assert (tmp_path / "run" / "loss_curve.png").exists()
    # no config given: the adapter's record decides prompt, pooling, attention and memory
    loaded = Embedder.load(tiny_model_dir, adapter=adapter, device="cpu", runtime=None,
                           settings={"max_length": 32, "batch_size": tr.embedder.config.batch_size})
    assert loaded.config.pooling == "memory" and loaded.config.prompt == "[text]" and loaded.memory.n == N_MEM
    texts = TEXTS[:6] + ["a text the training never saw about a tiger"]
    tr.embedder.model = tr.peft_model.merge_and_unload()
    assert np.array_equal(loaded.embed(texts), tr.embedder.embed(texts))
    backbone = memory_embedder(make_embedder).embed(texts)
    assert not np.allclose(backbone, loaded.embed(texts), atol=1e-4)  # training changed the embedder
    # the aligned tokens are read by the backbone's own LM head
    assert loaded.logits(loaded.embed(texts[:1])).shape == (1, loaded.vocab_size)


def test_resumed_run_ends_identical_to_uninterrupted(make_embedder, tmp_path):
    recipe = tiny_recipe(lora_dropout=0.1)
    full = make_trainer(make_embedder, recipe, tmp_path / "full")
    full.train()
    part = make_trainer(make_embedder, recipe, tmp_path / "part")
    assert not part.train(stop_after=5).completed  # crashes inside the simcse stage
    resumed = make_trainer(make_embedder, recipe, tmp_path / "part")
    res = resumed.train()
    assert res.completed and res.history[0]["step"] == 1 and len(res.history) == recipe.total_steps
    a, b = full.trainable(), resumed.trainable()
    assert set(a) == set(b) and all(torch.equal(a[n], b[n]) for n in a)
    assert [h["loss"] for h in res.history] == [h["loss"] for h in json.loads((tmp_path / "full" / "loss_curve.json").read_text())["history"]]


def test_resume_refuses_a_different_recipe(make_embedder, tmp_path):
    make_trainer(make_embedder, tiny_recipe(), tmp_path / "run").train(stop_after=2)
    with pytest.raises(ValueError, match="different recipe"):
        make_trainer(make_embedder, tiny_recipe(lr=1e-3), tmp_path / "run").train()


def test_contrastive_stage_on_top_of_another_adapter(make_embedder, tmp_path):
    # A Text2Token-like adapter (last-token pooling, PromptEOL): the contrastive stages keep its LoRA training.
    first = make_trainer(make_embedder, tiny_recipe(stages=(LLM2CompStage("simcse", 2),), memory_tokens=0, pooling="last",
                                                    prompt=EmbedderConfig().prompt), tmp_path / "base")
    base = first.train().adapter_dir
    recipe = tiny_recipe(stages=(LLM2CompStage("simcse", 2), LLM2CompStage("spans", 2)), memory_tokens=0, pooling="last",
                         prompt=EmbedderConfig().prompt, init_adapter=str(base))
    tr = make_trainer(make_embedder, recipe, tmp_path / "on-top")
    res = tr.train()
    assert not (res.adapter_dir / MEMORY_FILE).exists()
    assert json.loads((res.adapter_dir / "llm2comp.json").read_text())["embedding"]["pooling"] == "last"
    with pytest.raises(ValueError, match="ctkd"):
        LLM2CompRecipe(stages=(LLM2CompStage("ctkd", 2),), memory_tokens=0, pooling="last")


def test_build_index_and_retriever_use_an_llm2comp_adapter_unchanged(make_embedder, tiny_model_dir, toy_corpus, tmp_path, capsys):
    from indexer import cli as build_cli
    from indexer.manifest import Manifest
    from retriever.retriever import Retriever

    adapter = make_trainer(make_embedder, tiny_recipe(stages=(LLM2CompStage("ctkd", 2),)), tmp_path / "run").train().adapter_dir
    index = tmp_path / "index"
    argv = ["--corpus", str(toy_corpus), "--index", str(index), "--model", str(tiny_model_dir), "--adapter", str(adapter),
            "--top-k", "16", "--dense", "--runtime", "torch", "--dtype", "fp32", "--quiet"]
    assert build_cli.main(argv) == 0, capsys.readouterr().err
    m = Manifest.read(index)
    assert m.embedding["pooling"] == "memory" and m.embedding["memory_tokens"] == N_MEM and m.embedding["prompt"] == "[text]"
    r = Retriever.load(index, device="cpu", runtime="torch", dtype="fp32")
    assert r.embedder.memory is not None and r.embedder.config == Embedder.load(
        tiny_model_dir, adapter=adapter, device="cpu", runtime=None, settings={"max_length": m.embedding["max_length"]}).config
    hits = r.search("cat dog parrot", k=3, mode="dense")
    assert len(hits) == 3
    # another pooling asked for on the command line wins over the adapter's record
    assert build_cli.main(argv[:3] + [str(tmp_path / "index-last")] + argv[4:] + ["--pooling", "last"]) == 0
    assert Manifest.read(tmp_path / "index-last").embedding["pooling"] == "last"


def test_diagnose_compares_an_llm2comp_adapter_with_the_backbone_read_its_default_way(make_embedder, tiny_model_dir, toy_corpus, tmp_path, capsys):
    # the raw backbone has no memory vectors: "before" is read with the default template and last token
    from training.cli.diagnose import main as diagnose_main

    adapter = make_trainer(make_embedder, tiny_recipe(stages=(LLM2CompStage("ctkd", 1),)), tmp_path / "run").train().adapter_dir
    capsys.readouterr()
    argv = ["--model", str(tiny_model_dir), "--adapter", str(adapter), "--corpus", str(toy_corpus), "--n", "4",
            "--out", str(tmp_path / "diag"), "--json"]
    assert diagnose_main(argv) == 0, capsys.readouterr().err
    report = json.loads(capsys.readouterr().out)
    assert report["before_reading"]["pooling"] == "last" and report["before_reading"]["prompt"] != "[text]"
    assert report["n_texts"] == 4 and 0.0 <= report["after"]["hit@10"] <= 1.0


def test_cls_eval_reads_an_llm2comp_adapter_through_its_memory_pooling(make_embedder, tiny_model_dir, tmp_path, capsys):
    # the template tail is not what a memory reader embeds: cls-eval must classify the engine's own pooled vectors.
    # Precision pinned on both sides: on a CPU with native bf16, "auto" encodes in bf16 and no 1e-5 tolerance holds.
    from benchmarks.classification.cli import main

    adapter = make_trainer(make_embedder, tiny_recipe(stages=(LLM2CompStage("ctkd", 1),)), tmp_path / "run").train().adapter_dir
    task = tmp_path / "toy"
    task.mkdir()
    rows = [(TEXTS[i % len(TEXTS)], "ab"[i % 2]) for i in range(20)]
    (task / "all.tsv").write_text("text\tlabel\n" + "".join(f"{t}\t{l}\n" for t, l in rows), encoding="utf-8")
    cache = tmp_path / "cache"
    capsys.readouterr()
    argv = ["--task", str(task), "--model", str(tiny_model_dir), "--adapter", str(adapter), "--runtime", "torch", "--dtype", "fp32",
            "--boost", "--cache", str(cache), "--c", "1.0", "--out", str(tmp_path / "out"), "--no-progress"]
    assert main(argv) == 0
    assert "--boost is skipped" in capsys.readouterr().err
    res = json.loads((tmp_path / "out" / "results.json").read_text())
    assert res["k"] == 1 and not res["boost"] and res["embedder"]["token_states"]["order"].startswith("the engine's pooled vector (memory")
    from embedder.cache import ArrayCache

    (npz,) = cache.rglob("*.npz")
    texts = list(dict.fromkeys(t for t, _ in rows))
    found, missing = ArrayCache(npz.parent).get(texts)
    assert not missing
    loaded = Embedder.load(tiny_model_dir, adapter=adapter, device="cpu", runtime="torch", dtype="fp32")
    cached = np.stack([found[i] for i in range(len(texts))])[:, 0]
    assert np.allclose(cached, loaded.embed(texts), atol=1e-5)
