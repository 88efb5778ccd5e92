"""experiments.int8_recipes: the texts it measures and calibrates on (the study itself needs the
real model and OpenVINO; its numbers are in benchmarks/results/int8-recipes.json)."""
from __future__ import annotations

import csv

import pytest

from experiments.int8_recipes import PAIR_FILES, draw_texts


def _pairs(folder, n=10):
    folder.mkdir()
    for name in PAIR_FILES:
        with (folder / f"{name}.tsv").open("w", encoding="utf-8", newline="") as f:
            w = csv.writer(f, delimiter="\t")
            w.writerow(["anchor", "positive"])
            for i in range(n):
                w.writerow([f"q {name} {i}", f"{name} text {i}" if i else ""])  # one empty positive per file
    return folder


def test_measured_and_calibration_texts_are_disjoint_and_never_empty(tmp_path):
    measured, calibration = draw_texts(_pairs(tmp_path / "pairs"), 8)
    assert len(measured) == len(calibration) == 8
    assert not set(measured) & set(calibration)
    assert all(measured) and all(calibration)
    assert {t.split()[0] for t in measured} == set(PAIR_FILES)  # drawn evenly from every file
    assert draw_texts(tmp_path / "pairs", 8) == (measured, calibration)  # the same draw every run


def test_a_missing_pairs_file_is_named(tmp_path):
    folder = _pairs(tmp_path / "pairs")
    (folder / f"{PAIR_FILES[1]}.tsv").unlink()
    with pytest.raises(FileNotFoundError, match=f"{PAIR_FILES[1]}.tsv"):
        draw_texts(folder, 8)
