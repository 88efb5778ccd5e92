"""Distilling the query state (issue 28): the objective, the training texts (never evaluation
queries), the trainer on a tiny teacher and encoder, and ``distill-query-encoder`` end to end."""
from __future__ import annotations

import json
import random
from pathlib import Path

import numpy as np
import pytest
import torch

from training.objectives.query_distillation import kl_over_top, query_distillation_loss
from training.query_encoder.data import document_sentences, training_texts
from training.query_encoder.recipe import DistillRecipe


def test_the_objective_is_zero_at_the_teacher_and_per_example():
    torch.manual_seed(0)
    w = torch.randn(50, 8)
    t = torch.randn(4, 8)
    assert query_distillation_loss(t.clone(), t, w, kl_top=10).abs().max().item() < 1e-5
    s = torch.randn(4, 8)
    loss = query_distillation_loss(s, t, w, kl_top=10)
    assert loss.shape == (4,) and (loss > 0).all()
    # the KL term sees the scale of h, the cosine does not
    assert query_distillation_loss(2 * t, t, w, kl_weight=0.0).abs().max().item() < 1e-5
    assert kl_over_top(2 * t @ w.T, t @ w.T, 10).min().item() > 0
    # the KL term is kl_over_top's, whether the teacher's top tokens are given or found
    from training.objectives.query_distillation import teacher_top_tokens

    kl = query_distillation_loss(s, t, w, kl_top=10) - query_distillation_loss(s, t, w, kl_weight=0.0)
    torch.testing.assert_close(kl, kl_over_top(s @ w.T, t @ w.T, 10))
    torch.testing.assert_close(query_distillation_loss(s, t, w, kl_top=10, teacher_top=teacher_top_tokens(t, w, 10, chunk=3)), kl + 1 - torch.cosine_similarity(s, t))


def test_kl_over_top_matches_a_direct_computation():
    torch.manual_seed(1)
    s, t = torch.randn(3, 20), torch.randn(3, 20)
    got = kl_over_top(s, t, 5, temperature=2.0)
    for i in range(3):
        idx = torch.topk(t[i], 5).indices
        p = torch.softmax(t[i, idx] / 2.0, -1)
        q = torch.softmax(s[i, idx] / 2.0, -1)
        assert got[i].item() == pytest.approx(float((p * (p / q).log()).sum()), rel=1e-5)


def _beir(folder: Path, docs: list[str], queries: list[str]) -> Path:
    folder.mkdir(parents=True)
    with open(folder / "corpus.jsonl", "w") as f:
        f.writelines(json.dumps({"_id": f"d{i}", "title": "", "text": d}) + "\n" for i, d in enumerate(docs))
    with open(folder / "queries.jsonl", "w") as f:
        f.writelines(json.dumps({"_id": f"q{i}", "text": q}) + "\n" for i, q in enumerate(queries))
    return folder


def _pairs(folder: Path, anchors: list[str]) -> Path:
    folder.mkdir(parents=True)
    (folder / "snli.tsv").write_text("anchor\tpositive\n" + "".join(f"{a}\tpositive of {a}\n" for a in anchors))
    return folder


def test_length_batches_cover_every_text_once_in_batches_of_similar_length():
    from training.query_encoder.trainer import length_batches

    g = torch.Generator().manual_seed(0)
    lengths = torch.tensor([1, 50] * 200, dtype=torch.float32)  # short queries and long sentences, interleaved
    order = torch.randperm(400, generator=g)
    batches = length_batches(order, lengths, 10, g, pool=20)
    assert sorted(torch.cat(batches).tolist()) == list(range(400))
    assert all(len(b) == 10 for b in batches)
    # sorted within their pool, all but the batch that straddles the two lengths hold one length
    assert sum(len(set(lengths[b].tolist())) > 1 for b in batches) <= 1
    # without lengths (a pooled student), plain consecutive batches of the given order
    assert [b.tolist() for b in length_batches(order, None, 150, g)] == [order[i : i + 150].tolist() for i in (0, 150, 300)]


def test_training_texts_never_hold_an_evaluation_query(tmp_path):
    query = "The parrot sat on the river stone."
    docs = [f"{query} Then the dog ran to the sea near the mountain.", "A game of chess with the team was played at night."]
    collection = _beir(tmp_path / "c", docs, [query.upper()])  # the same text, other case: still excluded
    pairs = _pairs(tmp_path / "pairs", ["cat and dog near the lake", "  the parrot sat on the river stone. ", "river"])
    texts = training_texts(pairs, [collection], per_file=10, per_collection=10)
    assert all(" ".join(t.lower().split()) != " ".join(query.lower().split()) for t in texts)
    assert "cat and dog near the lake" in texts and "river" not in texts  # single words are not query-like
    assert "Then the dog ran to the sea near the mountain." in texts  # a document sentence
    assert document_sentences([collection], 1, random.Random(0))  # capped per collection


@pytest.fixture
def tiny_encoder(tmp_path_factory):
    from conftest import save_tiny_sentence_encoder

    from embedder.sentence_encoder import SentenceEncoder

    return SentenceEncoder.load(save_tiny_sentence_encoder(tmp_path_factory.mktemp("enc")))


def _toy_texts(n: int) -> list[str]:
    from conftest import toy_docs

    return [d["text"] for d in toy_docs(n, seed=3)]


@pytest.mark.parametrize("kind", ["pooled", "token-bag"])
def test_distillation_learns_and_reports_held_out_faithfulness(tiny_embedder, tiny_encoder, tmp_path, kind):
    from embedder.query_encoder import DistilledQueryEncoder
    from training.query_encoder.trainer import distill

    recipe = DistillRecipe(kind=kind, hidden=32, gate_hidden=8, epochs=40, batch_size=32, lr=5e-3, kl_top=16, holdout=0.2)
    student = distill(tiny_embedder, tiny_encoder, _toy_texts(200), tmp_path / "cache", recipe, "toy", m=8, progress=False)
    curve = student.record["training"]["curve"]
    assert curve[-1]["loss"] < curve[0]["loss"] and curve[-1]["holdout_cosine"] > curve[0]["holdout_cosine"]
    faith = student.record["faithfulness"]
    assert faith["n"] == 40 and faith["m"] == 8
    assert faith["cosine"]["q00"] <= faith["cosine"]["q50"] <= faith["cosine"]["q100"] <= 1.0 + 1e-6
    assert student.record["head"]["kind"] == kind
    student.save(tmp_path / "student")
    loaded = DistilledQueryEncoder.load(tmp_path / "student").attach(tiny_embedder)
    assert loaded.kind == kind
    texts = _toy_texts(5)
    x = tiny_encoder.encode(texts)
    np.testing.assert_array_equal(loaded.states(x, texts), student.states(x, texts))
    # the caches were filled: a second distillation encodes nothing again
    calls = {"n": 0}
    real = tiny_embedder.embed
    tiny_embedder.embed = lambda texts, role="document": (calls.__setitem__("n", calls["n"] + len(texts)), real(texts, role))[1]
    distill(tiny_embedder, tiny_encoder, _toy_texts(200), tmp_path / "cache", DistillRecipe(kind=kind, epochs=1, hidden=16), "again", m=8, progress=False)
    assert calls["n"] == 0


def test_distill_query_encoder_command_writes_a_student_the_retriever_takes(tiny_model_dir, tiny_encoder, tmp_path, capsys):
    from embedder.query_encoder import DistilledQueryEncoder
    from training.cli.distill_query import main

    collection = _beir(tmp_path / "c", [t + "." for t in _toy_texts(60)], ["a query nobody trains on"])
    pairs = _pairs(tmp_path / "pairs", _toy_texts(80)[20:])
    rc = main([
        "--model", str(tiny_model_dir), "--adapter", "none", "--encoder", str(tiny_encoder.identity["name"]),
        "--pairs", str(pairs), "--collections", str(collection), "--cache", str(tmp_path / "cache"),
        "--epochs", "3", "--hidden", "16", "--kl-top", "16", "--expansion-m", "8", "--dtype", "fp32", "--out", str(tmp_path / "student"), "--quiet",
        "--context-layers", "1", "--context-dim", "8", "--token-hidden", "8",
    ])
    assert rc == 0
    report = json.loads(capsys.readouterr().out)
    assert report["student"] == str(tmp_path / "student") and report["faithfulness"]["m"] == 8
    record = DistilledQueryEncoder.load(tmp_path / "student").record
    assert record["name"] == "raw" and record["recipe"]["epochs"] == 3 and record["encoder"]["dim"] == tiny_encoder.dim
    assert record["head"]["kind"] == "token-bag"  # the default student
    assert record["head"]["context_layers"] == 1 and len(DistilledQueryEncoder.load(tmp_path / "student").head.context) == 1
    assert record["head"]["context_dim"] == 8 and record["head"]["token_hidden"] == 8 and record["weights"] == "fp16"
    head = DistilledQueryEncoder.load(tmp_path / "student").head
    assert head.down.out_features == 8 and head.token[0].out_features == 8  # the narrow block and correction it was trained with
    # a pooled student reads no tokens: a context block for it is refused before anything loads
    with pytest.raises(SystemExit) as exc:
        main(["--kind", "pooled", "--context-layers", "1", "--out", str(tmp_path / "p")])
    assert exc.value.code == 2 and "only a token-bag student" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exc:
        main(["--context-dim", "64", "--out", str(tmp_path / "p")])
    assert exc.value.code == 2 and "give --context-layers too" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exc:
        main(["--encoder-tokens", "--out", str(tmp_path / "p")])
    assert exc.value.code == 2 and "give --context-layers too" in capsys.readouterr().err


def test_a_student_that_reads_encoder_token_states_learns_and_loads(tiny_embedder, tiny_encoder, tmp_path):
    from embedder.query_encoder import DistilledQueryEncoder
    from training.query_encoder.trainer import distill

    recipe = DistillRecipe(kind="token-bag", hidden=16, gate_hidden=8, context_layers=1, encoder_tokens=True, epochs=20, batch_size=32,
                           lr=5e-3, kl_weight=0, holdout=0.2)  # fmt: skip
    student = distill(tiny_embedder, tiny_encoder, _toy_texts(200), tmp_path / "cache", recipe, "toy", m=8, progress=False)
    curve = student.record["training"]["curve"]
    assert curve[-1]["holdout_cosine"] > curve[0]["holdout_cosine"]
    assert student.record["head"]["encoder_tokens"] is True and student.record["recipe"]["encoder_tokens"] is True
    assert student.record["faithfulness"]["n"] == 40
    assert list((tmp_path / "cache" / "encoder-tokens").glob("*.npz"))  # the token states are cached for the next run
    student.save(tmp_path / "student")
    loaded = DistilledQueryEncoder.load(tmp_path / "student").attach(tiny_embedder)
    assert loaded.reads_encoder_tokens
    texts = _toy_texts(5)
    x, states, mask = tiny_encoder.encode_with_tokens(texts)
    np.testing.assert_array_equal(loaded.states(x, texts, (states, mask)), student.states(x, texts, (states, mask)))


def test_distill_query_encoder_beside_adapter_needs_an_adapter(tiny_model_dir, tiny_encoder, tmp_path, capsys):
    from training.cli.distill_query import main

    rc = main(["--model", str(tiny_model_dir), "--adapter", "none", "--encoder", str(tiny_encoder.identity["name"]),
               "--pairs", str(tmp_path), "--collections", str(tmp_path), "--beside-adapter", "--quiet"])
    assert rc == 2 and "--beside-adapter needs an adapter" in capsys.readouterr().err


def test_inputs_exported_here_train_a_student_where_the_sentence_encoder_is_absent(tiny_model_dir, tiny_encoder, tmp_path, capsys):
    """--export-inputs writes the drawn texts and their sentence embeddings (int8, one scale a row);
    --inputs trains from that file alone (a GPU machine without the encoder), and the student records
    the encoder the embeddings came from, so the Retriever pairs it with the right one."""
    from embedder.query_encoder import DistilledQueryEncoder
    from training.cli.distill_query import main
    from training.query_encoder.data import load_inputs, training_texts

    collection = _beir(tmp_path / "c", [t + "." for t in _toy_texts(60)], ["a query nobody trains on"])
    pairs = _pairs(tmp_path / "pairs", _toy_texts(80)[20:])
    draw = ["--pairs", str(pairs), "--collections", str(collection), "--cache", str(tmp_path / "cache")]
    assert main(["--encoder", str(tiny_encoder.identity["name"]), *draw, "--export-inputs", str(tmp_path / "inputs.npz"), "--quiet"]) == 0
    assert json.loads(capsys.readouterr().out)["texts"] > 20
    texts, x, meta = load_inputs(tmp_path / "inputs.npz")
    assert texts == training_texts(pairs, [collection], 2500, 1500)
    # a file holding an evaluation query (drawn elsewhere) trains without it
    from training.query_encoder.data import save_inputs

    save_inputs(tmp_path / "inputs.npz", [*texts, "A query nobody  trains on"], np.concatenate([x, x[:1]]), meta["encoder"])
    exact = tiny_encoder.encode(texts)
    cos = (x * exact).sum(1) / np.linalg.norm(x, axis=1) / np.linalg.norm(exact, axis=1)
    assert cos.min() > 0.999 and abs(meta["fidelity"]["min_cosine"] - cos.min()) < 1e-5
    assert meta["encoder"]["sha256"] == tiny_encoder.identity["sha256"] and meta["dim"] == tiny_encoder.dim

    rc = main([
        "--model", str(tiny_model_dir), "--adapter", "none", "--encoder", "no-such-encoder", "--inputs", str(tmp_path / "inputs.npz"),
        "--collections", str(collection),
        "--device", "cpu", "--teacher-batch-size", "7", "--cache", str(tmp_path / "cache"), "--epochs", "3", "--hidden", "16", "--kl-weight", "0", "--expansion-m", "8",
        "--dtype", "fp32", "--out", str(tmp_path / "student"), "--quiet",
    ])
    assert rc == 0
    record = DistilledQueryEncoder.load(tmp_path / "student").record
    assert record["encoder"] == meta["encoder"] and record["training"]["n_texts"] == len(texts) and record["training"]["device"] == "cpu"
    assert record["training"]["teacher_batch_size"] == 7
    # a file of another format is refused with its name
    np.savez(tmp_path / "old.npz", meta=np.asarray(json.dumps({"format": 0})))
    rc = main(["--model", str(tiny_model_dir), "--inputs", str(tmp_path / "old.npz"), "--out", str(tmp_path / "s2"), "--quiet"])
    assert rc == 2 and "old.npz" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exc:
        main(["--teacher-batch-size", "0", "--out", str(tmp_path / "p")])
    assert exc.value.code == 2 and "--teacher-batch-size" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exc:
        main(["--inputs", str(tmp_path / "inputs.npz"), "--encoder-tokens", "--context-layers", "1", "--out", str(tmp_path / "p")])
    assert exc.value.code == 2 and "--inputs" in capsys.readouterr().err
