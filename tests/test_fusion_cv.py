"""benchmarks/fusion_cv.py: the settings grid, the held-out choice, and that the fusion tuned
with ranx is the fusion the Retriever serves."""
from __future__ import annotations

import numpy as np
import pytest

from benchmarks.embedfilter_sweep import dense_run
from benchmarks.fusion_cv import Setting, folds_of, fused_run, kfold_scores, settings_grid
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


@pytest.mark.parametrize("setting", [Setting("minmax", (0.2, 0.2, 0.6)), Setting("minmax", (0.5, 0.0, 0.5)), Setting("rrf", (1.0, 1.0, 1.0), 30)])
def test_fusion_tuned_with_ranx_is_the_fusion_the_retriever_serves(setting):
    from ranx import Run

    rng = np.random.default_rng(0)
    names = ["sparse", "dense", "bm25"]
    queries = {f"q{i}": _random_channels(rng) for i in range(5)}
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
