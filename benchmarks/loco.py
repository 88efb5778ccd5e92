"""Leave one collection out (LOCO), the protocol the studies choose settings by, its paired test, and
the scaffolding of the studies that score the default indexes collection by collection.

A setting chosen on the collections it is then scored on flatters itself; the studies (experiments/:
fusion_cv, operating_points, expansion_depth, feedback) score each collection with the setting chosen
on the *other* collections instead. Each of them used to carry its own copy of that loop; they share
this one. ``mean_row`` and ``rounded`` are the last line and the cells of their tables;
``index_study_arguments`` and ``default_indexes`` the arguments and the indexes of the studies over the
default indexes ``beir-eval --index-dir`` built (expansion_depth, feedback, state_faithfulness).
"""
from __future__ import annotations

import argparse
from collections.abc import Callable, Hashable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, TypeVar

import numpy as np

if TYPE_CHECKING:
    from benchmarks.datasets import Dataset

S = TypeVar("S", bound=Hashable)


def held_out(n: int) -> list[list[int]]:
    """For each of ``n`` collections, the indexes of the others (in order)."""
    if n < 2:
        raise ValueError("leaving one collection out needs two collections or more")
    return [[i for i in range(n) if i != j] for j in range(n)]


def loco_choices(means: np.ndarray, choose: Callable[[np.ndarray, list[int]], int] | None = None) -> list[int]:
    """For each collection (column of ``means``, shape (settings, collections)), the setting (row)
    chosen on the other collections: by default the best mean over them (ties: the first row, as
    ``np.argmax``); ``choose(means[:, others], others)`` picks by another rule."""
    means = np.asarray(means, dtype=float)
    if choose is None:
        return [int(np.argmax(means[:, others].mean(1))) for others in held_out(means.shape[1])]
    return [int(choose(means[:, others], others)) for others in held_out(means.shape[1])]


def leave_one_out(means: Mapping[str, Mapping[S, float]], order: Sequence[S] | None = None) -> dict[str, tuple[S, float]]:
    """{collection: (setting best on the other collections, its score on this one)} from ``means`` =
    {collection: {setting: mean score}}; ties go to the setting first in ``order`` (by default the
    settings sorted: the smallest first)."""
    names = list(means)
    order = list(order) if order is not None else sorted(means[names[0]])
    table = np.array([[means[c][s] for c in names] for s in order], dtype=float)
    return {name: (order[i], means[name][order[i]]) for name, i in zip(names, loco_choices(table))}


def paired_p(a: Sequence[float], b: Sequence[float]) -> float:
    """Two-sided paired t-test p-value of ``a`` against ``b`` (the same queries); 1.0 where they do
    not differ or there are fewer than two."""
    from scipy.stats import ttest_rel

    return float(ttest_rel(a, b).pvalue) if len(a) > 1 and np.any(np.asarray(a) != np.asarray(b)) else 1.0


def rounded(values, digits: int = 4) -> list:
    """Table cells: numbers rounded to ``digits``, ``None`` as '–' (not measured)."""
    return ["–" if v is None else round(float(v), digits) for v in values]


# the headers of regret_summary's cells
REGRET_COLUMNS = ["mean regret", "worst regret", "within 0.005", "mean vs best B+E", "worst vs best B+E", "below best B+E"]


def regret_summary(regrets: Sequence[float], margins: Sequence[float]) -> list:
    """The cells of a fusion rule's row in the calibration studies: mean and worst regret against the oracle,
    pairs within 0.005 of it, mean and worst margin over what a user would build, pairs below that."""
    regret, margin = np.asarray(regrets, float), np.asarray(margins, float)
    return [*rounded([regret.mean(), regret.max()]), int((regret <= 0.005).sum()), *rounded([margin.mean(), margin.min()]),
            int((margin < 0).sum())]


def mean_row(label: Sequence, rows: Sequence[Sequence], digits: int = 4) -> list:
    """A table's last row: ``label`` (its first cells), then the mean of each remaining column over ``rows``."""
    start = len(label)
    return [*label, *(round(float(np.mean([r[i] for r in rows])), digits) for i in range(start, len(rows[0])))]


def index_study_arguments(p: argparse.ArgumentParser) -> None:
    """``--index-dir``, ``--data``, ``--threads`` and ``--out``: a study over beir-eval's default indexes."""
    p.add_argument("--index-dir", type=Path, required=True, help="beir-eval's --index-dir (its default/NAME/aligned-tokens indexes)")
    p.add_argument("--data", default="shared", help="collections, as beir-eval --data takes them (default: the shared ones)")
    p.add_argument("--threads", type=int, default=None)
    p.add_argument("--out", type=Path, required=True)


def default_indexes(index_dir: Path, data: str) -> Iterator[tuple[Dataset, Path]]:
    """(collection, its default index) for each collection ``data`` names, from the indexes
    ``beir-eval --systems default --index-dir INDEX_DIR`` built (``INDEX_DIR/default/NAME/aligned-tokens``)."""
    from benchmarks.datasets import resolve

    for ds in resolve(data):
        index = index_dir / "default" / ds.name / "aligned-tokens"
        if not index.exists():
            raise SystemExit(f"{index}: no default index for {ds.name} (run beir-eval --systems default --index-dir {index_dir} first)")
        yield ds, index
