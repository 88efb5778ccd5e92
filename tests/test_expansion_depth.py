"""The expansion-depth study's held-out choice of M and its per-query scores (experiments/expansion_depth.py)."""
from __future__ import annotations

import numpy as np
import pytest

from benchmarks.metrics import per_query_ndcg
from experiments.expansion_depth import agreement, leave_one_out


def test_each_collection_gets_the_m_best_on_the_others_and_its_own_score_for_it():
    means = {
        "a": {0: 0.50, 64: 0.90, 128: 0.10},  # a alone would choose 64; the others prefer 128
        "b": {0: 0.40, 64: 0.40, 128: 0.60},
        "c": {0: 0.30, 64: 0.30, 128: 0.50},
    }
    got = leave_one_out(means)
    assert got["a"] == (128, 0.10)  # chosen on b and c, scored on a: its own best is never looked at
    assert got["b"] == (64, 0.40)  # on a and c: 64 (0.60) beats 128 (0.30)
    assert got["c"] == (64, 0.30)
    tied = leave_one_out({"a": {32: 0.5, 64: 0.5}, "b": {32: 0.2, 64: 0.2}})
    assert tied["a"][0] == 32  # a tie goes to the shallower expansion


def test_per_query_ndcg_is_rankers_and_a_query_without_hits_scores_zero():
    qrels = {"q2": {"d1": 1}, "q1": {"d2": 1}, "q3": {"d9": 1}}
    run = {"q1": {"d2": 2.0, "d1": 1.0}, "q2": {"d3": 2.0, "d1": 1.0}}
    got = per_query_ndcg(qrels, run)
    assert got["q1"] == pytest.approx(1.0) and got["q2"] == pytest.approx(1 / np.log2(3)) and got["q3"] == 0.0


def test_agreement_reports_cosine_and_overlap_as_distributions():
    class Head:  # top tokens of a state: its largest coordinates, best first (as Embedder.top_tokens)
        def top_tokens(self, h, k):
            ids = np.argsort(-h, axis=1)[:, :k]
            return ids, np.take_along_axis(h, ids, 1)

    llm = np.array([[4.0, 3.0, 2.0, 1.0], [1.0, 2.0, 3.0, 4.0]])
    student = np.array([[4.0, 3.0, 1.0, 2.0], [4.0, 3.0, 2.0, 1.0]])
    got = agreement(student, llm, Head(), [1, 2])
    assert got["n"] == 2
    assert got["top1_overlap"]["mean"] == 0.5 and got["top2_overlap"]["mean"] == 0.5  # the first query agrees, the second does not
    assert got["cosine"]["mean"] == pytest.approx((29 / 30 + 20 / 30) / 2, abs=1e-4)  # both norms are sqrt(30)
