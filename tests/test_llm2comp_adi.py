"""LLM2Comp with the real default model on ADI: a few steps of each stage through ``train-llm2comp``.

The tiny-model tests (test_llm2comp.py) check the losses and resume exactly; this one checks that
the command a user runs trains the real backbone on a real corpus and writes an adapter that the
engine reads back with memory pooling. It skips, saying why, without the model package or ADI.
"""
from __future__ import annotations

import json
import math

import numpy as np
import pytest

from embedder.encoder import Embedder
from embedder.memory import MEMORY_FILE
from indexer.corpus import CorpusSpec
from training.cli.llm2comp import main as train_llm2comp

pytestmark = pytest.mark.slow


def test_each_stage_trains_on_adi_and_the_adapter_embeds_with_memory_pooling(default_model, adi, tmp_path):
    run = tmp_path / "run"
    # Small batches and short texts keep this at about a minute on two CPU cores; the stages and
    # their losses are the recipe's own.
    rc = train_llm2comp([
        "--corpus", str(adi), "--output", str(run), "--recipe", "cpu", "--stages", "ctkd:2,simcse:1,spans:1",
        "--batch-size", "4", "--micro-batch-size", "4", "--contrastive-batch-size", "4", "--max-length", "48",
        "--continuation-length", "8", "--warmup-steps", "0", "--quiet",
    ])
    assert rc == 0
    curve = json.loads((run / "loss_curve.json").read_text(encoding="utf-8"))["history"]
    assert [h["step"] for h in curve] == [1, 2, 3, 4]
    assert all(math.isfinite(h["loss"]) and h["loss"] > 0 for h in curve)

    adapter = run / "adapter"
    record = json.loads((adapter / "llm2comp.json").read_text(encoding="utf-8"))
    assert [s["kind"] for s in record["stage_losses"].values()] == ["ctkd", "simcse", "spans"]
    assert record["embedding"]["pooling"] == "memory" and (adapter / MEMORY_FILE).exists()
    assert record["corpus"]["corpora"][0]["n_docs"] == 82  # every ADI document was a training text

    texts = [doc.text for doc in CorpusSpec(adi)][:4]
    trained = Embedder.load(default_model, adapter=str(adapter))
    assert trained.config.pooling == "memory" and trained.memory is not None
    emb = trained.embed(texts)
    assert emb.shape == (4, trained.dim) and np.isfinite(emb).all()
    # the aligned tokens of the memory embedding come out of the backbone's own LM head
    assert trained.logits(emb[:1]).shape == (1, trained.vocab_size)
    # the contrastive stages moved the embedder away from the pretext-only snapshot
    pretext = Embedder.load(default_model, adapter=str(run / "adapter-stage1"))
    assert pretext.config.pooling == "memory"
    assert not np.allclose(pretext.embed(texts), emb, atol=1e-5)
