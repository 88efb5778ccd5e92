"""A completed fusion (retriever/fusion.py, ``"complete": true``): candidates from each list's
first ``depth`` documents, each scored by every channel from its deeper list."""
from __future__ import annotations

import numpy as np
import pytest

from retriever.fusion import Fusion, check_fusion, fuse

A = (np.array([1, 2, 3, 4]), np.array([4.0, 3.0, 2.0, 1.0]))
B = (np.array([3, 1, 2, 4]), np.array([0.9, 0.5, 0.3, 0.1]))


def test_a_candidate_below_a_lists_top_gets_its_own_score_from_it():
    fused = {f.doc: f for f in fuse({"a": A, "b": B}, {"a": 0.5, "b": 0.5}, k=10, method="minmax", depth=2)}
    assert sorted(fused) == [1, 2, 3]  # doc 4 is in no list's first two
    # a's top two span 3..4: doc 3 (a's 2.0) normalises to -1; b's top two span 0.5..0.9: doc 2 (0.3) to -0.5
    assert fused[3].contributions == pytest.approx({"a": -0.5, "b": 0.5})
    assert fused[2].contributions == pytest.approx({"a": 0.0, "b": -0.25})
    assert fused[1].score == pytest.approx(0.5 * 1.0 + 0.5 * 0.0)


def test_without_depth_a_missing_document_gets_nothing_as_before():
    fused = {f.doc: f for f in fuse({"a": (A[0][:2], A[1][:2]), "b": (B[0][:2], B[1][:2])}, {"a": 0.5, "b": 0.5}, k=10)}
    assert fused[3].contributions == {"b": 0.5} and fused[2].contributions == {"a": 0.0}


def test_below_the_deep_list_a_full_list_gives_its_last_score_and_a_short_one_zero():
    short = (np.array([5, 6, -1, -1]), np.array([2.0, 1.0, -np.inf, -np.inf]))  # no more matching documents
    full = (np.array([7, 8, 9]), np.array([0.8, 0.6, 0.2]))
    fused = {f.doc: f for f in fuse({"s": short, "f": full}, {"s": 1.0, "f": 1.0}, k=10, method="max", depth=2)}
    assert fused[7].contributions["s"] == 0.0  # the short list: doc 7 matches nothing there
    assert fused[5].contributions["f"] == pytest.approx(0.2 / 0.8)  # the full list's last score bounds it


def test_the_fusion_value_completes_only_where_asked():
    lists = {"bm25": A, "encoder": B}
    plain = Fusion({"method": "max", "weights": {"bm25": 0.5, "encoder": 0.5}})
    completed = Fusion({"method": "max", "weights": {"bm25": 0.5, "encoder": 0.5}, "complete": True})
    assert not plain.complete and completed.complete
    assert [f.doc for f in plain.fuse(lists, 10, 2)] == [f.doc for f in fuse(lists, plain.weights, 10, "max")]
    assert [f.doc for f in completed.fuse(lists, 10, 2)] == [f.doc for f in fuse(lists, completed.weights, 10, "max", depth=2)]
    assert not Fusion({"method": "rrf", "weights": {"bm25": 1.0}, "complete": True}).complete  # ranks have nothing to complete
    with pytest.raises(ValueError, match="'complete'"):
        check_fusion({"method": "max", "weights": {"bm25": 1.0}, "complete": "yes"})
