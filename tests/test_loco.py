"""benchmarks/loco.py: leaving one collection out, the paired test and the table cells the studies share."""
from __future__ import annotations

import argparse

import numpy as np
import pytest

from benchmarks.loco import (
    default_indexes,
    held_out,
    index_study_arguments,
    leave_one_out,
    loco_choices,
    mean_row,
    paired_p,
    rounded,
)


def test_each_collection_gets_the_setting_best_on_the_others():
    # settings x collections (a, b, c)
    means = np.array([[0.1, 0.9, 0.8], [0.9, 0.2, 0.3], [0.5, 0.5, 0.5]])
    assert held_out(3) == [[1, 2], [0, 2], [0, 1]]
    # a: means over b, c (0.85, 0.25, 0.5) -> 0; b: over a, c (0.45, 0.6, 0.5) -> 1; c: over a, b (0.5, 0.55, 0.5) -> 1
    assert loco_choices(means) == [0, 1, 1]


def test_ties_go_to_the_first_setting_and_a_rule_can_replace_the_mean():
    assert loco_choices(np.array([[0.5, 0.5], [0.5, 0.5]])) == [0, 0]
    # a rule: the setting with the best worst collection among the others
    worst = lambda sub, others: int(np.argmax(sub.min(1)))
    assert loco_choices(np.array([[0.9, 0.1, 0.9], [0.5, 0.5, 0.5]]), worst) == [1, 0, 1]
    with pytest.raises(ValueError, match="two collections"):
        loco_choices(np.zeros((2, 1)))


def test_leave_one_out_over_named_settings_keeps_the_order_for_ties():
    means = {"a": {16: 0.2, 32: 0.6}, "b": {16: 0.5, 32: 0.5}, "c": {16: 0.4, 32: 0.3}}
    # a: on b, c 16 wins (0.45 vs 0.4); b: on a, c 32 (0.45 vs 0.3); c: on a, b 32 (0.55 vs 0.35)
    assert leave_one_out(means) == {"a": (16, 0.2), "b": (32, 0.5), "c": (32, 0.3)}
    tied = {"a": {"x": 0.5, "y": 0.5}, "b": {"x": 0.1, "y": 0.1}}
    assert leave_one_out(tied, order=["y", "x"]) == {"a": ("y", 0.5), "b": ("y", 0.1)}
    assert leave_one_out(tied) == {"a": ("x", 0.5), "b": ("x", 0.1)}  # sorted: the smallest first


def test_paired_p_and_the_table_cells():
    assert paired_p([0.1, 0.2], [0.1, 0.2]) == 1.0 and paired_p([0.5], [0.1]) == 1.0
    p = paired_p([0.9, 0.8, 0.85, 0.95], [0.1, 0.2, 0.15, 0.05])
    assert 0 < p < 0.01
    assert rounded([0.123456, None, 2]) == [0.1235, "–", 2.0]
    assert mean_row(["mean", 7], [["a", 3, 0.2, 1.0], ["b", 4, 0.4, 2.0]]) == ["mean", 7, 0.3, 1.5]


def test_default_indexes_name_the_missing_one(tmp_path, monkeypatch):
    from benchmarks import datasets

    class DS:
        def __init__(self, name):
            self.name = name

    monkeypatch.setattr(datasets, "resolve", lambda spec: [DS("adi"), DS("cisi")])
    (tmp_path / "default" / "adi" / "aligned-tokens").mkdir(parents=True)
    found = default_indexes(tmp_path, "shared")
    ds, index = next(found)
    assert ds.name == "adi" and index == tmp_path / "default" / "adi" / "aligned-tokens"
    with pytest.raises(SystemExit, match="no default index for cisi"):
        next(found)
    p = argparse.ArgumentParser()
    index_study_arguments(p)
    args = p.parse_args(["--index-dir", str(tmp_path), "--out", "x.json"])
    assert args.data == "shared" and args.threads is None and str(args.out) == "x.json"
