"""Issue 30 on the tiny random Llama: one epoch in resumable chunks (training/epoch.py), BM25 hard
negatives mined inside each source (training/hard_negatives.py), and the listwise KL to a teacher
(training/objectives/contrastive.py listwise_kl, training/teacher.py)."""

from __future__ import annotations

import hashlib
import json
import os
import random
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from conftest import TOPICS
from test_contrastive_training import make_pair_trainer, pair_recipe, write_pairs

from training.epoch import EpochState, EpochStateError, begin_chunk, commit_chunk, epoch_plan, open_epoch
from training.hard_negatives import attach_bm25_negatives, mine_bm25, source_negatives
from training.objectives.contrastive import candidate_mask, listwise_kl, text_key
from training.pairs import load_pairs, pair_batches
from training.teacher import TeacherEmbeddings
from training.text2token.recipe import Stage


def topic_pairs(path: Path, n: int, seed: int) -> Path:
    """``n`` distinct pairs of toy-vocabulary words: a short anchor, a longer positive sharing its topic words."""
    rng = random.Random(seed)
    words = [w for ws in TOPICS.values() for w in ws]
    rows, seen = [], set()
    while len(rows) < n:
        topic = TOPICS[rng.choice(sorted(TOPICS))]
        a = " ".join(rng.sample(topic, 3))
        p = " ".join(rng.sample(topic, 2) + [rng.choice(words) for _ in range(3)])
        if (a, p) not in seen:
            seen.add((a, p))
            rows.append((a, p))
    return write_pairs(path, rows)


def sources(tmp_path: Path, sizes=(70, 100, 33)) -> list[Path]:
    return [topic_pairs(tmp_path / f"src{i}.tsv", n, i) for i, n in enumerate(sizes)]


# ------------------------------------------------------------------ the plan
def test_epoch_plan_takes_every_pair_once_one_source_per_batch(tmp_path):
    pairs = load_pairs(sources(tmp_path))
    plan = epoch_plan(pairs.sources, 32, seed=5)
    seen = {s: [] for s in range(3)}
    for s, rows in plan:
        assert len(rows) >= 32 and rows.max() < len(pairs.sources[s])  # one source per batch, none small
        seen[s] += rows.tolist()
    for s, src in enumerate(pairs.sources):
        assert sorted(seen[s]) == list(range(len(src)))  # every pair exactly once
    assert len(plan) == 2 + 3 + 1
    again = epoch_plan(pairs.sources, 32, seed=5)
    assert all(a[0] == b[0] and np.array_equal(a[1], b[1]) for a, b in zip(plan, again))
    other = epoch_plan(pairs.sources, 32, seed=6)
    assert any(not np.array_equal(a[1], b[1]) for a, b in zip(plan, other))


def test_epoch_plan_refuses_small_batches_and_sources():
    from training.pairs import PairSource

    src = PairSource("tiny", "tiny.tsv", np.arange(40), np.arange(40, 80), np.full(40, -1))
    with pytest.raises(ValueError, match="at least 32"):
        epoch_plan([src], 16, 0)
    with pytest.raises(ValueError, match="tiny has 40 pairs, fewer than one batch"):
        epoch_plan([src], 64, 0)


def test_epoch_plan_spreads_each_source_over_the_epoch():
    from training.pairs import PairSource

    def src(name, n):
        return PairSource(name, name, np.arange(n), np.arange(n), np.full(n, -1))

    srcs = [src("big", 3200), src("mid", 1600), src("small", 320)]  # 100, 50 and 10 batches of 32
    plan = epoch_plan(srcs, 32, seed=1)
    labels = np.array([s for s, _ in plan])
    n = len(labels)
    for q in range(1, 4):  # at each quarter, every source at its rate, within 2 batches
        prefix = labels[: n * q // 4]
        for s, k in enumerate((100, 50, 10)):
            assert abs((prefix == s).sum() - k * q / 4) <= 2, (q, s)


# ------------------------------------------------------------------ the state file
def test_state_file_is_atomic_and_checked(tmp_path, monkeypatch):
    path = tmp_path / "epoch.json"
    state = EpochState(plan="abc", batches=10, pairs=320)
    state.save(path)
    before = path.read_bytes()
    state.position = 4

    def crash(fd):
        raise OSError("disk gone")

    monkeypatch.setattr(os, "fsync", crash)
    with pytest.raises(OSError, match="disk gone"):
        state.save(path)
    monkeypatch.undo()
    assert path.read_bytes() == before  # the old state, whole
    assert [p.name for p in tmp_path.iterdir()] == ["epoch.json"]  # no temporary file left
    assert EpochState.load(path).position == 0
    d = json.loads(before)
    d["position"] = 11
    path.write_text(json.dumps(d))
    with pytest.raises(EpochStateError, match=r"epoch\.json: field 'position' 11 outside 0\.\.10"):
        EpochState.load(path)
    d["position"], d["batches"] = 0, "ten"
    path.write_text(json.dumps(d))
    with pytest.raises(EpochStateError, match=r"epoch\.json: field 'batches' must be int"):
        EpochState.load(path)


def test_a_state_of_another_plan_is_refused(tmp_path):
    pairs = load_pairs(sources(tmp_path))
    plan = epoch_plan(pairs.sources, 32, 0)
    path = tmp_path / "epoch.json"
    state = open_epoch(path, pairs, plan, 32, 0)
    begin_chunk(state, path, 2, tmp_path)
    assert open_epoch(path, pairs, plan, 32, 0).pending["end"] == 2
    with pytest.raises(EpochStateError, match="field 'plan'"):
        open_epoch(path, pairs, epoch_plan(pairs.sources, 32, 1), 32, 1)


def test_an_interrupted_chunk_is_resumed_as_planned_and_commits_once(tmp_path):
    pairs = load_pairs(sources(tmp_path))
    plan = epoch_plan(pairs.sources, 32, 0)
    path = tmp_path / "epoch.json"
    state = open_epoch(path, pairs, plan, 32, 0)
    start, end, folder = begin_chunk(state, path, 4, tmp_path)
    # the session dies here; the next one asks for another chunk size but gets the pending chunk
    state = open_epoch(path, pairs, plan, 32, 0)
    assert begin_chunk(state, path, 1, tmp_path) == (start, end, folder) == (0, 4, tmp_path / "chunk-0001")
    commit_chunk(state, path, folder / "adapter", plan, {"steps": 4})
    state = open_epoch(path, pairs, plan, 32, 0)
    assert (state.position, state.pending, state.adapter_path(path)) == (4, None, str(tmp_path / "chunk-0001" / "adapter"))
    assert begin_chunk(state, path, 10, tmp_path) == (4, 6, tmp_path / "chunk-0002")  # the last chunk is cut at the end
    assert state.chunks[0]["pairs"] == sum(len(r) for _, r in plan[:4])


# ------------------------------------------------------------------ hard negatives
def test_bm25_negative_is_never_the_anchors_own_positive():
    anchors = ["cat dog", "cat dog", "river lake", "river sea", "server code", "cat dog"]
    positives = ["the cat and dog play", "a dog chases a cat", "the river runs to the lake", "rain over the sea river",
                 "code on the server", "cat dog"]
    neg = mine_bm25(anchors, positives)
    for i, j in enumerate(neg):
        if j < 0:
            continue
        own = {text_key(positives[k]) for k in range(len(anchors)) if text_key(anchors[k]) == text_key(anchors[i])}
        assert text_key(positives[j]) not in own | {text_key(anchors[i])}, (i, j)
    # "river lake" shares "river" with the sea passage only: that is its negative
    assert positives[neg[2]] == "rain over the sea river"
    # every "cat dog" positive is one of its own: no cat/dog passage is left to be its negative
    assert neg[0] == -1 or "cat" not in positives[neg[0]]


def test_mined_negatives_come_from_the_same_source_and_are_cached(tmp_path, monkeypatch):
    paths = sources(tmp_path, (60, 45))
    pairs = load_pairs(paths)
    cache = tmp_path / "negatives"
    attach_bm25_negatives(pairs, cache)
    for src in pairs.sources:
        found = src.mined >= 0
        assert found.mean() > 0.5
        assert set(src.mined[found].tolist()) <= set(src.positive.tolist())  # a positive of the same source
        for i in np.flatnonzero(found):
            same_anchor = src.anchor == src.anchor[i]
            own = {text_key(pairs.texts[r]) for r in src.positive[same_anchor]}
            assert text_key(pairs.texts[src.mined[i]]) not in own
    assert len(list(cache.glob("*.npy"))) == 2
    first = [s.mined.copy() for s in pairs.sources]

    def no_mining(*a, **k):
        raise AssertionError("mined again despite the cache")

    monkeypatch.setattr("training.hard_negatives.mine_bm25", no_mining)
    again = load_pairs(paths)
    attach_bm25_negatives(again, cache)
    assert all(np.array_equal(a, s.mined) for a, s in zip(first, again.sources))
    with pytest.raises(AssertionError, match="mined again"):  # other settings: another cache entry
        source_negatives(again, again.sources[0], cache, depth=3)


def test_bm25_negatives_join_the_batch(make_embedder, tmp_path):
    paths = sources(tmp_path, (40,))
    runs = {}
    for mode in ("none", "bm25"):
        recipe = pair_recipe(stages=(Stage("pairs", 1),), batch_size=8, micro_batch_size=8, hard_negatives=mode)
        pairs = load_pairs(paths)
        if mode == "bm25":
            attach_bm25_negatives(pairs, None)
        from embedder.encoder import EmbedderConfig
        from training.text2token.trainer import Text2TokenTrainer

        emb = make_embedder(EmbedderConfig(max_length=recipe.max_length, batch_size=8))
        runs[mode] = Text2TokenTrainer(recipe, pairs.texts, tmp_path / mode, embedder=emb, progress=False, pairs=pairs).train().history[0]
    assert runs["bm25"]["tokens"] > runs["none"]["tokens"]  # the mined negatives were encoded too
    assert runs["bm25"]["contrastive"] != pytest.approx(runs["none"]["contrastive"])
    with pytest.raises(ValueError, match="mine the sources first"):
        make_pair_trainer(make_embedder, pair_recipe(hard_negatives="bm25"), tmp_path / "x", paths)


# ------------------------------------------------------------------ the teacher term
def direct_kl(a, c, ta, tc, tau, ttau, mask):
    """KL(teacher || student) per anchor, by the definition, in float64."""
    out = []
    for i in range(len(a)):
        keep = [j for j in range(len(c)) if not mask[i, j]]
        s = np.array([float(F.cosine_similarity(a[i], c[j], dim=0)) / tau for j in keep], np.float64)
        t = np.array([float(F.cosine_similarity(ta[i], tc[j], dim=0)) / ttau for j in keep], np.float64)
        p, q = np.exp(s - s.max()), np.exp(t - t.max())
        p, q = p / p.sum(), q / q.sum()
        out.append(float((q * np.log(q / p)).sum()))
    return np.array(out)


def test_listwise_kl_is_zero_when_the_distributions_agree_and_matches_the_definition():
    g = torch.Generator().manual_seed(0)
    a, c = torch.randn(4, 8, generator=g), torch.randn(6, 8, generator=g)
    mask = candidate_mask(["q0", "q1", "q2", "q3"], ["p0", "p1", "p2", "q0"], ["n0", "p1"])
    assert mask[0, 3] and mask[1, 5] and not mask[1, 1]
    same = listwise_kl(a, c, 3 * a, 3 * c, 0.05, 0.05, mask)  # cosines ignore scale: one distribution
    assert torch.allclose(same, torch.zeros(4), atol=1e-5)
    ta, tc = torch.randn(4, 16, generator=g), torch.randn(6, 16, generator=g)
    got = listwise_kl(a, c, ta, tc, 0.07, 0.05, mask)
    assert (got > 0).all()
    np.testing.assert_allclose(got.numpy(), direct_kl(a, c, ta, tc, 0.07, 0.05, mask), rtol=1e-4, atol=1e-6)
    a.requires_grad_(True)
    listwise_kl(a, c, ta, tc, 0.07, 0.05, mask).sum().backward()
    assert torch.isfinite(a.grad).all() and a.grad.abs().sum() > 0


def fake_teacher(texts, calls):
    def encode(part):
        calls.extend(part)
        vecs = [np.random.default_rng(int(hashlib.sha256(t.encode()).hexdigest()[:8], 16)).standard_normal(12) for t in part]
        v = np.asarray(vecs, np.float32)
        return v / np.linalg.norm(v, axis=1, keepdims=True)

    return TeacherEmbeddings(encode, "fake-teacher", texts, None, progress=False, dim=12)


def test_teacher_term_is_added_with_its_weight_and_each_text_is_encoded_once(make_embedder, tmp_path):
    paths = sources(tmp_path, (40,))
    recipe = pair_recipe(stages=(Stage("pairs", 3),), batch_size=8, micro_batch_size=8, lora_dropout=0.0, teacher_kl_weight=0.5)
    pairs = load_pairs(paths)
    calls: list[str] = []
    teacher = fake_teacher(pairs.texts, calls)
    from embedder.encoder import EmbedderConfig
    from training.text2token.trainer import Text2TokenTrainer

    emb = make_embedder(EmbedderConfig(max_length=recipe.max_length, batch_size=8))
    res = Text2TokenTrainer(recipe, pairs.texts, tmp_path / "run", embedder=emb, progress=False, pairs=pairs, teacher=teacher).train()
    for h in res.history:
        assert h["teacher_kl"] > 0
        assert h["loss"] == pytest.approx(h["contrastive"] + 0.5 * h["teacher_kl"], rel=1e-5)
    assert sorted(calls) == sorted(set(calls))  # every text once
    plan = pair_batches(pairs.sources, 3, 8, recipe.seed, 0)  # the stage's batches: their texts, no other
    src = pairs.sources[0]
    assert set(calls) == {pairs.texts[r] for _, rows in plan for r in np.concatenate([src.anchor[rows], src.positive[rows]])}
    record = json.loads((res.adapter_dir / "text2token.json").read_text())
    assert record["teacher"] == "fake-teacher" and record["recipe"]["teacher_kl_weight"] == 0.5
    with pytest.raises(ValueError, match="needs a teacher"):
        Text2TokenTrainer(recipe, pairs.texts, tmp_path / "x", embedder=emb, progress=False, pairs=pairs)


# ------------------------------------------------------------------ the CLI, chunk by chunk
def test_cli_trains_an_epoch_in_chunks_and_resumes_an_interrupted_one(tiny_model_dir, tmp_path, monkeypatch, capsys):
    from training.cli.text2token import main as train_main
    from training.text2token.trainer import Text2TokenTrainer

    paths = sources(tmp_path, (70, 40))  # 2 + 1 batches of 32
    run = tmp_path / "run"
    args = ["--pairs", *map(str, paths), "--model", str(tiny_model_dir), "--output", str(run), "--recipe", "contrastive",
            "--init-adapter", "none", "--batch-size", "32", "--micro-batch-size", "32", "--max-length", "16",
            "--save-every", "1", "--targets-cache", "none", "--quiet", "--epoch-chunk", "2"]
    real_train = Text2TokenTrainer.train
    monkeypatch.setattr(Text2TokenTrainer, "train", lambda self, resume=True, stop_after=None: real_train(self, resume, 1))
    assert train_main(args) == 1  # killed after one step of chunk 1: nothing committed
    state = EpochState.load(run / "epoch.json")
    assert (state.position, state.pending["end"], state.chunks) == (0, 2, [])
    monkeypatch.setattr(Text2TokenTrainer, "train", real_train)
    assert train_main([*args[:-1], "5"]) == 0  # resumes chunk 1 as planned (2 batches), from its checkpoint
    state = EpochState.load(run / "epoch.json")
    assert (state.position, state.pending, len(state.chunks)) == (2, None, 1)
    assert not (run / "chunk-0001" / "checkpoints").exists()  # committed: the adapter is what the next chunk reads
    assert train_main(args) == 0  # chunk 2: the last batch, from chunk 1's adapter
    state = EpochState.load(run / "epoch.json")
    assert state.done and [c["end"] for c in state.chunks] == [2, 3]
    assert sum(c["pairs"] for c in state.chunks) == state.pairs == 110
    histories = [json.loads((run / f"chunk-000{k}" / "loss_curve.json").read_text())["history"] for k in (1, 2)]
    assert [h["epoch_batch"] for hs in histories for h in hs] == [0, 1, 2]  # every batch once, none repeated
    assert sum(h["pairs"] for hs in histories for h in hs) == 110
    rec2 = json.loads((run / "chunk-0002" / "adapter" / "text2token.json").read_text())
    assert rec2["init_adapter"] == str(run / "chunk-0001" / "adapter")
    lines = [json.loads(x) for x in (run / "steps.jsonl").read_text().splitlines()]
    assert {x["epoch_batch"] for x in lines} == {0, 1, 2} and all(x["seconds"] >= 0 and np.isfinite(x["loss"]) for x in lines)
    assert all(c["training_seconds"] >= 0 and c["device"] for c in state.chunks)
    capsys.readouterr()
    assert train_main(args) == 2
    assert "is complete" in capsys.readouterr().err


def test_a_chunks_lr_decays_with_the_epoch_after_its_own_warm_up():
    from training.loop import make_scheduler

    def lrs(recipe, total, offset, steps):
        opt = torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=recipe.lr)
        sched = make_scheduler(opt, recipe, total, offset)
        out = []
        for _ in range(steps):
            out.append(sched.get_last_lr()[0])
            opt.step()
            sched.step()
        return out

    recipe = pair_recipe(schedule="linear", warmup_steps=2, lr=1.0)
    whole = lrs(recipe, 10, 0, 10)
    chunk = lrs(recipe, 10, 6, 4)  # steps 6..9 of the same epoch
    assert chunk[0] == pytest.approx(0.5) and chunk[1] == pytest.approx(whole[7])  # ramp, capped by the decay
    assert chunk[2:] == pytest.approx(whole[8:])
    assert lrs(recipe, 10, 0, 10) == whole == pytest.approx([0.5, 1.0] + [(10 - s) / 8 for s in range(2, 10)])
