"""benchmarks/fusion_cv.py: the settings grid, the held-out choice, and that the fusion tuned
with ranx is the fusion the Retriever serves."""
from __future__ import annotations

import numpy as np
import pytest

from experiments.embedfilter_sweep import dense_run
from experiments.fusion_cv import RRF_KS, Setting, folds_of, fused_run, kfold_scores, settings_grid
from retriever.fusion import fuse


def test_grid_has_every_simplex_point_with_two_channels_and_every_rrf_subset():
    grid = settings_grid(3, 0.1)
    minmax = [s for s in grid if s.method == "minmax"]
    rrf = [s for s in grid if s.method == "rrf"]
    # 66 points of the 0.1 simplex in 3 weights, minus the 3 that use one channel only
    assert len(minmax) == 63
    assert all(abs(sum(s.weights) - 1) < 1e-9 and sum(w > 0 for w in s.weights) >= 2 for s in minmax)
    # 4 subsets of two or more channels, 4 values of k each
    assert len(rrf) == 16 and len(set(rrf)) == 16


def test_grid_takes_the_methods_asked_for_and_refuses_others():
    both = settings_grid(3, 0.1, ("minmax", "max"))
    assert [s.weights for s in both if s.method == "max"] == [s.weights for s in both if s.method == "minmax"]
    assert len(both) == 126 and not any(s.method == "rrf" for s in both)
    assert settings_grid(3, 0.1, ("max", "rrf")) == settings_grid(3, 0.1, ("max",)) + settings_grid(3, 0.1, ("rrf",))
    with pytest.raises(ValueError, match="zmuv"):
        settings_grid(3, 0.1, ("zmuv",))


def test_folds_are_balanced_and_seeded():
    folds = folds_of(23, 5, seed=3)
    assert sorted(np.bincount(folds).tolist()) == [4, 4, 5, 5, 5]
    assert np.array_equal(folds, folds_of(23, 5, seed=3))
    assert not np.array_equal(folds, folds_of(23, 5, seed=4))


def test_kfold_scores_each_fold_with_the_setting_best_elsewhere():
    # a held-out fold never takes part in choosing its own setting
    matrix = np.array([[0.1, 0.1, 0.1, 0.1, 0.9, 0.9], [0.6, 0.6, 0.6, 0.6, 0.2, 0.2]])
    folds = np.array([0, 0, 1, 1, 2, 2])
    scores, chosen = kfold_scores(matrix, folds)
    # folds 0 and 1: setting 0 is best on the other four queries (0.5 vs 0.4); fold 2: setting 1
    assert chosen == [0, 0, 1]
    assert np.allclose(scores, [0.1, 0.1, 0.1, 0.1, 0.2, 0.2])  # below either setting's oracle mean


def _random_channels(rng, n_docs=40, depth=15):
    channels = {}
    for name in ("sparse", "dense", "bm25"):
        docs = rng.choice(n_docs, depth, replace=False)
        scores = np.sort(rng.normal(size=depth))[::-1] * rng.uniform(0.5, 20)
        channels[name] = (docs, scores)
    return channels


@pytest.mark.parametrize("setting", [Setting("minmax", (0.2, 0.2, 0.6)), Setting("minmax", (0.5, 0.0, 0.5)), Setting("max", (0.3, 0.1, 0.6)), Setting("rrf", (1.0, 1.0, 1.0), 30)])
def test_fusion_tuned_with_ranx_is_the_fusion_the_retriever_serves(setting):
    from ranx import Run

    rng = np.random.default_rng(0)
    names = ["sparse", "dense", "bm25"]
    queries = {f"q{i}": _random_channels(rng) for i in range(5)}
    if setting.method == "max":  # positive tops, as the channels' are (ranx divides a top <= 0 by 1e-9)
        queries = {q: {c: (d, np.exp(s)) for c, (d, s) in chan.items()} for q, chan in queries.items()}
    runs = [Run({q: {f"d{d}": float(s) for d, s in zip(*chan[name])} for q, chan in queries.items()}) for name in names]
    fused = fused_run(runs, setting).to_dict()
    for q, channels in queries.items():
        ours = fuse(channels, dict(zip(names, setting.weights)), k=10, method=setting.method, rrf_k=setting.k)
        theirs = sorted(fused[q].values(), reverse=True)[:10]
        # same scores in the same order, and each of our documents has ranx's score
        # (documents tied on a score may come in another order)
        assert np.allclose([f.score for f in ours], theirs)
        assert all(np.isclose(f.score, fused[q][f"d{f.doc}"]) for f in ours)


def test_dense_run_is_exact_cosine_top_k():
    rng = np.random.default_rng(1)
    docs, queries = rng.normal(size=(30, 8)), rng.normal(size=(3, 8))
    run = dense_run(docs, queries, [f"d{i}" for i in range(30)], ["a", "b", "c"], depth=5)
    cos = (queries / np.linalg.norm(queries, axis=1, keepdims=True)) @ (docs / np.linalg.norm(docs, axis=1, keepdims=True)).T
    for i, q in enumerate("abc"):
        best = np.argsort(-cos[i])[:5]
        assert set(run[q]) == {f"d{d}" for d in best}
        assert np.allclose([run[q][f"d{d}"] for d in best], cos[i, best])


# ------------------------------------------------------------ channel subsets (issue 16)
def test_channels_name_the_runs_they_read():
    from experiments.fusion_cv import parse_channels

    assert parse_channels("bm25=bm25-pyserini, encoder=minilm,sparse") == [("bm25", "bm25-pyserini"), ("encoder", "minilm"), ("sparse", "sparse")]
    with pytest.raises(SystemExit, match="named twice"):
        parse_channels("bm25,bm25=bm25-pyserini")


def test_subset_mask_keeps_settings_that_weigh_only_the_subset():
    from experiments.fusion_cv import subset_mask

    channels = ["bm25", "encoder", "sparse", "dense"]
    grid = settings_grid(4, 0.5)
    mask = subset_mask(grid, channels, ["bm25", "encoder"])
    kept = [s for s, m in zip(grid, mask) if m]
    # min-max 0.5/0.5 over the pair, and RRF over the pair with each k
    assert [s.method for s in kept].count("minmax") == 1 and [s.method for s in kept].count("rrf") == len(RRF_KS)
    assert all(s.weights[2] == 0 and s.weights[3] == 0 for s in kept)


def _synthetic_collection(name, rng, channels, grid, n_queries=12, n_docs=30):
    from ranx import Qrels, Run

    from experiments.fusion_cv import Collection, per_query

    qids = [f"q{i}" for i in range(n_queries)]
    qrels = {q: {f"d{d}": 1 for d in rng.choice(n_docs, 3, replace=False)} for q in qids}
    runs = []
    for _ in channels:
        runs.append(Run({q: {f"d{d}": float(s) for d, s in zip(rng.choice(n_docs, 20, replace=False), rng.normal(size=20))} for q in qids}))
    matrix = np.stack([per_query(Qrels(qrels), fused_run(runs, s), qids) for s in grid])
    return Collection(name, qids, qrels, runs, matrix)


def test_subset_study_scores_each_subset_held_out_against_the_reference(tmp_path):
    from benchmarks.report.tables import plot_table as _plot_table
    from benchmarks.tables import write_table
    from experiments.fusion_cv import SUBSET_COLUMNS, subset_study

    rng = np.random.default_rng(0)
    channels = ["bm25", "encoder", "sparse"]
    grid = settings_grid(3, 0.5)
    collections = [_synthetic_collection(n, rng, channels, grid) for n in ("a", "b", "c")]
    subsets = ["bm25+encoder", "bm25+encoder+sparse"]
    rows, details = subset_study(collections, grid, channels, subsets, "bm25+encoder")
    assert len(rows) == len(subsets) * (len(collections) + 1) and all(len(r) == len(SUBSET_COLUMNS) for r in rows)
    by = {(r[0], r[1]): r for r in rows}
    for c in ("a", "b", "c", "mean"):
        assert by["bm25+encoder", c][4:6] == ["–", "–"]  # the reference is not tested against itself
        delta = float(by["bm25+encoder+sparse", c][4])
        assert delta == pytest.approx(by["bm25+encoder+sparse", c][3] - by["bm25+encoder", c][3], abs=2e-4)
    for c in ("a", "b", "c"):
        assert "sparse" not in by["bm25+encoder", c][-1]  # the reference's LOCO setting uses its channels only
        assert details["subsets"]["bm25+encoder+sparse"]["per_collection"][c]["loco_setting"] == by["bm25+encoder+sparse", c][-1]
    p_values = [details["subsets"]["bm25+encoder+sparse"]["per_collection"][c]["p_values"] for c in ("a", "b", "c")]
    p_values.append(details["subsets"]["bm25+encoder+sparse"]["pooled_p_values"])
    assert all(set(p) == {"ndcg@10", "recall@100"} for p in p_values)
    assert any(isinstance(p["ndcg@10"], float) and 0 < p["ndcg@10"] <= 1 for p in p_values)  # ranx.compare ran
    assert set(details["subsets"]["bm25+encoder"]["default"]["weights"]) == set(channels)
    assert details["subsets"]["bm25+encoder"]["default"]["weights"]["sparse"] == 0
    diffs = details["per_query_diff"]["bm25+encoder+sparse"]
    assert list(diffs) == ["a", "b", "c"] and all(len(v) == 12 and v == sorted(v) for v in diffs.values())
    # the subsets file and its per-query difference plot
    path = write_table(tmp_path / "subsets.json", "t", "c", "d", SUBSET_COLUMNS, rows, details=details, plot={"kind": "per-query-diff", "title": "diff"})
    import json

    assert _plot_table(json.loads(path.read_text())) is not None
    with pytest.raises(ValueError, match="per-query-diff plot needs"):
        write_table(tmp_path / "bad.json", "t", "c", "d", SUBSET_COLUMNS, rows, details={}, plot={"kind": "per-query-diff"})
    with pytest.raises(SystemExit, match="not in --channels"):
        subset_study(collections, grid, channels, ["bm25+dense"], "bm25+dense")


def test_per_query_scores_follow_the_given_query_order():
    """ranx returns per-query scores in sorted id order ("1", "10", "2"...); per_query must not
    hand them out in the caller's order (numeric ids, as in cisi), nor mind a dict of qrels."""
    from ranx import Qrels, Run, evaluate

    from experiments.fusion_cv import per_query

    qids = [str(i) for i in range(1, 13)]
    qrels = {q: {f"d{q}": 1} for q in qids}
    # query i finds its document at rank i (query 12 finds nothing)
    run = {q: {**{f"x{j}": 10.0 - j for j in range(int(q) - 1)}, f"d{q}": 10.0 - int(q)} for q in qids[:-1]}
    run["12"] = {"x0": 1.0}
    want = [evaluate(Qrels({q: qrels[q]}), Run({q: run[q]}), "ndcg@10") for q in qids]
    for judged in (qrels, Qrels(qrels)):
        got = per_query(judged, Run(run), qids)
        assert np.allclose(got, want) and got[-1] == 0 and got[0] == 1
    assert np.allclose(per_query(qrels, {q: run[q] for q in qids[:5]}, qids)[5:], 0)  # unanswered queries score 0
