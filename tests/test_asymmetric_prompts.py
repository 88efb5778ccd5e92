"""Asymmetric query / document templates (issue 17, item 2): ``EmbedderConfig.query_prompt``.

Queries read the query template and documents the document template, through every path
(runtimes with the prefix cache, the embedding cache, index builds, the Retriever, the
adapter record, the contrastive pairs stage); a config without the field records and behaves
exactly as before.
"""
from __future__ import annotations

import json

import numpy as np
import pytest
from test_contrastive_training import animal_pairs, make_pair_trainer, pair_recipe

from embedder.cache import CachedEmbedder, embedder_key
from embedder.encoder import PROMPT_EOL, Embedder, EmbedderConfig
from training.text2token.recipe import QUERY_PROMPT, RECIPES, Recipe, Stage

QUERIES = ["what is a cat", "computer memory", "SNOW ON THE MOUNTAIN", "a"]
DOCS = ["The cat sat on the mat near the river.", "a game for the team", "data on the disk of the server " * 5]


def asym(make_embedder, **kw) -> Embedder:
    return make_embedder(EmbedderConfig(max_length=64, batch_size=4, query_prompt=QUERY_PROMPT), **kw)


# ------------------------------------------------------------------ the config
def test_config_records_query_prompt_only_when_set():
    assert "query_prompt" not in EmbedderConfig().to_dict()  # old manifests and cache keys unchanged
    assert EmbedderConfig(query_prompt=PROMPT_EOL).query_prompt is None  # the same template is the symmetric config
    config = EmbedderConfig(query_prompt=QUERY_PROMPT)
    assert config.to_dict()["query_prompt"] == QUERY_PROMPT
    assert EmbedderConfig(**config.to_dict()) == config
    assert (config.template("document"), config.template("query")) == (PROMPT_EOL, QUERY_PROMPT)
    assert EmbedderConfig().template("query") == PROMPT_EOL


def test_config_and_embedder_refuse_bad_templates_and_roles(tiny_embedder):
    with pytest.raises(ValueError, match=r"query_prompt must contain the placeholder '\[text\]'"):
        EmbedderConfig(query_prompt="no placeholder")
    with pytest.raises(ValueError, match="role must be one of"):
        tiny_embedder.embed(["a"], role="queries")


# ------------------------------------------------------------------ the embedder
def test_queries_read_the_query_template_and_documents_the_document_one(make_embedder):
    sym, emb = make_embedder(), asym(make_embedder)
    q_rows = emb.prompt_ids(QUERIES, role="query")
    assert all(r[: len(emb._query_prefix)] == emb._query_prefix for r in q_rows)
    assert emb._query_prefix != emb._prefix
    # documents: what the symmetric embedder gives; queries: their own template
    np.testing.assert_array_equal(emb.embed(DOCS), sym.embed(DOCS))
    assert np.abs(emb.embed(QUERIES, role="query") - sym.embed(QUERIES, role="query")).max() > 1e-3
    # read as a document, a query is what the symmetric embedder makes of it
    np.testing.assert_array_equal(emb.embed(QUERIES, role="document"), sym.embed(QUERIES))


def test_without_query_prompt_both_roles_are_the_same(tiny_embedder):
    assert tiny_embedder.prompt_ids(QUERIES, role="query") == tiny_embedder.prompt_ids(QUERIES)
    np.testing.assert_array_equal(tiny_embedder.embed(QUERIES, role="query"), tiny_embedder.embed(QUERIES))


@pytest.mark.parametrize("prefix_cache", [True, False])
def test_prefix_cache_serves_both_templates(make_embedder, prefix_cache):
    plain = asym(make_embedder)  # the runtime-less reference
    fast = make_embedder(plain.config, runtime="torch", dtype="fp32")
    fast.prefix_cache = prefix_cache
    rt = fast.runtime()
    # only what both templates share is cached ([BOS] "This"), so one runtime reads either
    shared = fast.shared_prefix()
    assert rt.prefix_len == (len(shared) if prefix_cache else 0)
    assert 0 < len(shared) < len(fast._prefix) and fast._prefix[: len(shared)] == fast._query_prefix[: len(shared)]
    for role, texts in (("query", QUERIES), ("document", DOCS)):
        np.testing.assert_allclose(fast.embed(texts, role=role), plain.embed(texts, role=role), atol=1e-4, rtol=1e-4)
        one_by_one = np.concatenate([fast.embed([t], role=role) for t in texts])  # the query path
        np.testing.assert_allclose(one_by_one, plain.embed(texts, role=role), atol=1e-4, rtol=1e-4)


def test_symmetric_runtime_still_caches_the_whole_prefix(make_embedder):
    fast = make_embedder(runtime="torch", dtype="fp32")
    assert fast.runtime().prefix_len == len(fast._prefix) > 0


def test_openvino_runtime_reads_both_templates(make_embedder, tmp_path, monkeypatch):
    pytest.importorskip("openvino")
    monkeypatch.setenv("ALIGNED_TOKENS_CACHE", str(tmp_path))  # the exported graph goes here
    plain = asym(make_embedder)
    fast = make_embedder(plain.config, runtime="openvino", dtype="fp32")
    for role, texts in (("query", QUERIES), ("document", DOCS)):
        np.testing.assert_allclose(fast.embed(texts, role=role), plain.embed(texts, role=role), atol=1e-4, rtol=1e-4)


# ------------------------------------------------------------------ the embedding cache
def test_cache_keys_name_the_template_used(make_embedder, tmp_path):
    sym, emb = make_embedder(), asym(make_embedder)
    # documents read the same template: the same cached embeddings serve both
    assert embedder_key(emb) == embedder_key(sym) == embedder_key(sym, role="query")
    assert embedder_key(emb, role="query") != embedder_key(emb)
    cached = CachedEmbedder(emb, tmp_path / "cache")
    np.testing.assert_allclose(cached.embed_texts(QUERIES, role="query"), emb.embed(QUERIES, role="query"), atol=1e-6)
    np.testing.assert_allclose(cached.embed_texts(QUERIES), emb.embed(QUERIES), atol=1e-6)
    assert {p.name for p in (tmp_path / "cache").iterdir()} == {embedder_key(emb), embedder_key(emb, role="query")}
    again = CachedEmbedder(asym(make_embedder), tmp_path / "cache")
    np.testing.assert_allclose(again.embed_texts(QUERIES, role="query"), emb.embed(QUERIES, role="query"), atol=1e-6)
    assert again.hits == len(QUERIES) and again.misses == 0


# ------------------------------------------------------------------ index and search
def test_index_records_the_query_template_and_the_retriever_uses_it(make_embedder, toy_corpus, tmp_path):
    from indexer.build import build_index
    from indexer.corpus import CorpusSpec
    from indexer.manifest import Manifest
    from retriever.retriever import Retriever

    emb = asym(make_embedder)
    manifest = build_index(CorpusSpec(toy_corpus), tmp_path / "asym", emb, top_k=16, dense=True, progress=False)
    assert Manifest.read(tmp_path / "asym").embedding["query_prompt"] == QUERY_PROMPT
    r = Retriever(tmp_path / "asym", manifest, emb)
    encoded = r.encode(QUERIES[:2])
    np.testing.assert_allclose(np.stack([q.embedding for q in encoded]), emb.embed(QUERIES[:2], role="query"), atol=1e-6)
    # the documents were read with the document template: the symmetric index's dense rows
    sym_manifest = build_index(CorpusSpec(toy_corpus), tmp_path / "sym", make_embedder(), top_k=16, dense=True, progress=False)
    assert "query_prompt" not in Manifest.read(tmp_path / "sym").embedding
    a = Retriever(tmp_path / "asym", manifest, emb).dense.search(encoded[0].embedding[None, :], 5)
    b = Retriever(tmp_path / "sym", sym_manifest, make_embedder()).dense.search(encoded[0].embedding[None, :], 5)
    np.testing.assert_array_equal(a[0], b[0])


def test_build_index_query_prompt_is_recorded_and_reloaded(toy_corpus, tiny_model_dir, tmp_path, capsys):
    from indexer import cli as build_cli
    from indexer.manifest import Manifest
    from retriever.retriever import Retriever

    # with the aligned tokens: the default (fast) index reads no LLM since issue 71
    args = ["--corpus", str(toy_corpus), "--model", str(tiny_model_dir), "--adapter", "none", "--top-k", "16", "--quiet", "--channels", "sparse,bm25"]
    assert build_cli.main([*args, "--index", str(tmp_path / "a"), "--query-prompt", QUERY_PROMPT]) == 0
    assert Manifest.read(tmp_path / "a").embedding["query_prompt"] == QUERY_PROMPT
    r = Retriever.load(tmp_path / "a", warm=False, query_encoder="llm")  # the fast profile loads no LLM
    assert r.embedder.config.query_prompt == QUERY_PROMPT
    np.testing.assert_allclose(r.encode(["cat"])[0].embedding, r.embedder.embed(["cat"], role="query")[0], atol=1e-5)
    # an index without the field (every index built before it) reads queries as documents
    assert build_cli.main([*args, "--index", str(tmp_path / "b"), "--query-prompt", "none"]) == 0
    assert "query_prompt" not in Manifest.read(tmp_path / "b").embedding
    assert Retriever.load(tmp_path / "b", warm=False, query_encoder="llm").embedder.config.query_prompt is None
    capsys.readouterr()
    assert build_cli.main([*args, "--index", str(tmp_path / "c"), "--query-prompt", "Query:"]) == 2
    assert "query_prompt must contain the placeholder" in capsys.readouterr().err


# ------------------------------------------------------------------ recipes
def test_recipe_query_prompt_is_checked_and_recorded_only_when_set():
    with pytest.raises(ValueError, match=r"recipe field query_prompt must contain the placeholder"):
        Recipe(query_prompt="Query: ")
    with pytest.raises(ValueError, match=r"recipe field prompt must contain the placeholder"):
        Recipe(prompt="Passage: ")
    assert Recipe(query_prompt=Recipe().prompt).query_prompt is None
    # fingerprints (resume) and records of symmetric recipes are what they were
    assert "query_prompt" not in RECIPES["contrastive-cpu"].to_dict()
    asym_recipe = RECIPES["contrastive-asym-cpu"]
    assert Recipe.from_dict(asym_recipe.to_dict()) == asym_recipe
    assert {**asym_recipe.to_dict(), "query_prompt": None} == {**RECIPES["contrastive-cpu"].to_dict(), "query_prompt": None}
    assert asym_recipe.embedder_config().template("query") == QUERY_PROMPT


def test_llm2comp_recipe_refuses_a_query_template():
    from training.llm2comp.recipe import LLM2CompRecipe

    with pytest.raises(ValueError, match="recipe field query_prompt"):
        LLM2CompRecipe(query_prompt=QUERY_PROMPT)


def test_train_cli_query_prompt_overrides_the_recipe(tmp_path):
    from training.cli.text2token import parser as train_parser
    from training.cli.text2token import recipe_from_args

    base = ["--output", str(tmp_path), "--recipe", "contrastive-asym-cpu"]
    assert recipe_from_args(train_parser().parse_args(base)).query_prompt == QUERY_PROMPT
    assert recipe_from_args(train_parser().parse_args([*base, "--query-prompt", "none"])).query_prompt is None
    other = 'This question: "[text]" means in one word:"'
    assert recipe_from_args(train_parser().parse_args([*base, "--query-prompt", other])).query_prompt == other
    with pytest.raises(ValueError, match="recipe field query_prompt"):
        recipe_from_args(train_parser().parse_args([*base, "--query-prompt", "Q:"]))


# ------------------------------------------------------------------ training
def test_pairs_stage_reads_anchors_with_the_query_template(make_embedder, tmp_path):
    recipe = pair_recipe(stages=(Stage("pairs", 2),), query_prompt=QUERY_PROMPT, kl_weight=0.5, lora_dropout=0.0)
    tr = make_pair_trainer(make_embedder, recipe, tmp_path / "run", animal_pairs(tmp_path))
    seen: list[list[int]] = []
    pooled = tr.embedder.pooled

    def spy(batch_ids):
        seen.extend(batch_ids)
        return pooled(batch_ids)

    tr.embedder.pooled = spy  # what GradCache encodes, batch by batch
    res = tr.train()
    emb = tr.embedder
    queries = [r for r in seen if r[: len(emb._query_prefix)] == emb._query_prefix]
    documents = [r for r in seen if r[: len(emb._prefix)] == emb._prefix]
    assert len(queries) + len(documents) == len(seen)
    anchors = {tuple(r) for r in emb.prompt_ids(tr.pairs.texts, role="query")}
    assert queries and all(tuple(r) in anchors for r in queries)
    assert len(documents) >= len(queries)  # positives (and negatives) read as documents
    for h in res.history:  # the joint KL still applies (to the document-template embeddings)
        assert h["kl"] > 0 and h["loss"] == pytest.approx(h["contrastive"] + 0.5 * h["kl"], rel=1e-5)


def test_symmetric_pairs_stage_reads_one_template(make_embedder, tmp_path):
    tr = make_pair_trainer(make_embedder, pair_recipe(stages=(Stage("pairs", 1),)), tmp_path / "run", animal_pairs(tmp_path))
    seen: list[list[int]] = []
    pooled = tr.embedder.pooled
    tr.embedder.pooled = lambda ids: (seen.extend(ids), pooled(ids))[1]
    tr.train()
    assert seen and all(r[: len(tr.embedder._prefix)] == tr.embedder._prefix for r in seen)


def test_trainer_refuses_an_embedder_with_another_query_template(make_embedder, tmp_path):
    from training.pairs import load_pairs
    from training.text2token.trainer import Text2TokenTrainer

    recipe = pair_recipe(query_prompt=QUERY_PROMPT)
    pairs = load_pairs(animal_pairs(tmp_path))
    with pytest.raises(ValueError, match="recipe field query_prompt"):
        Text2TokenTrainer(recipe, pairs.texts, tmp_path / "run", embedder=make_embedder(), progress=False, pairs=pairs)


def test_adapter_trained_asymmetric_is_loaded_asymmetric(make_embedder, tiny_model_dir, tmp_path):
    recipe = pair_recipe(stages=(Stage("pairs", 1),), query_prompt=QUERY_PROMPT)
    adapter = make_pair_trainer(make_embedder, recipe, tmp_path / "asym", animal_pairs(tmp_path)).train().adapter_dir
    record = json.loads((adapter / "text2token.json").read_text())
    assert record["embedding"]["query_prompt"] == QUERY_PROMPT and record["recipe"]["query_prompt"] == QUERY_PROMPT
    loaded = Embedder.load(tiny_model_dir, adapter=adapter, device="cpu", runtime=None)
    assert loaded.config.query_prompt == QUERY_PROMPT
    # what the command line gives wins ("none" in build-index means this)
    overridden = Embedder.load(tiny_model_dir, adapter=adapter, device="cpu", runtime=None, settings={"query_prompt": None})
    assert overridden.config.query_prompt is None
    # a symmetric run records no query template, and loads symmetric
    sym_recipe = pair_recipe(stages=(Stage("pairs", 1),))
    sym = make_pair_trainer(make_embedder, sym_recipe, tmp_path / "sym", animal_pairs(tmp_path)).train().adapter_dir
    assert "query_prompt" not in json.loads((sym / "text2token.json").read_text())["embedding"]
    assert Embedder.load(tiny_model_dir, adapter=sym, device="cpu", runtime=None).config.query_prompt is None
