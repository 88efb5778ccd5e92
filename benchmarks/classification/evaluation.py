"""Sentence classification on frozen embeddings: the SentEval / MTEB protocol, and Token Fusion Boosting.

Tasks are folders of TSV files with a header ``text<TAB>label`` (../shared/data/classification):
``all.tsv`` alone means 10-fold cross-validation (MR, CR, SUBJ, MPQA); ``train.tsv`` +
``test.tsv`` means train/test (TREC, Banking77, Emotion; a ``dev.tsv`` is not used).

The classifier is scikit-learn's logistic regression on standardised features. Its L2
strength C is chosen by an inner stratified cross-validation on the training part only
(SentEval tunes it on the training data as well); a test fold is never seen before the one
prediction that is scored.

Token Fusion Boosting (btmr-multiple-tokens §3.3, Algorithm 1): one logistic regression per
prefix (the first 1, 2, ..., k token states concatenated), fused by gradient boosting over their
class probabilities (benchmarks/classification/fusion_boosting.py: the prefix classifiers as the weak learners by
default, trees for comparison). The probabilities the boosters are trained on are *out-of-fold*
predictions on the training part, so they learn how the prefixes err on unseen texts, not how
they fit their own training data.
"""
from __future__ import annotations

import csv
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

C_GRID = (0.001, 0.01, 0.1)
MAX_ITER = 300  # lbfgs; standardised LLM states are near-separable at large C, where more iterations buy nothing
INNER_FOLDS = 3
OUTER_FOLDS = 10


class TaskError(ValueError):
    """A classification folder that does not follow the layout (names the file and line)."""


@dataclass
class Task:
    """One classification task: its texts and labels, and how they are split."""

    name: str
    protocol: str  # "cv" (10-fold over all) or "split" (train/test)
    texts: list[str]
    labels: np.ndarray  # int class index per text
    classes: list[str]
    test_mask: np.ndarray | None = None  # split protocol: True for test rows
    source: dict = field(default_factory=dict)

    @property
    def n_classes(self) -> int:
        return len(self.classes)


def read_tsv(path: Path) -> tuple[list[str], list[str]]:
    """(texts, labels) of a ``text<TAB>label`` file; bad rows raise :class:`TaskError` naming file and line."""
    texts, labels = [], []
    with open(path, encoding="utf-8", newline="") as f:
        reader = csv.reader(f, delimiter="\t", quoting=csv.QUOTE_NONE)
        header = next(reader, None)
        if header != ["text", "label"]:
            raise TaskError(f"{path}:1: header must be 'text<TAB>label', found {header!r}")
        for lineno, row in enumerate(reader, start=2):
            if len(row) != 2:
                raise TaskError(f"{path}:{lineno}: expected 2 tab-separated fields (text, label), found {len(row)}")
            text, label = row
            if not text.strip():
                raise TaskError(f"{path}:{lineno}: field 'text' is empty")
            if not label.strip():
                raise TaskError(f"{path}:{lineno}: field 'label' is empty")
            texts.append(text)
            labels.append(label.strip())
    if not texts:
        raise TaskError(f"{path}: no rows after the header")
    return texts, labels


def _subsample(labels: np.ndarray, n: int | None, rng: np.random.Generator) -> np.ndarray:
    """Sorted indices of a stratified sample of at most ``n`` rows (all rows when n is None)."""
    if n is None or n >= len(labels):
        return np.arange(len(labels))
    from sklearn.model_selection import train_test_split

    try:
        keep, _ = train_test_split(np.arange(len(labels)), train_size=n, stratify=labels, random_state=int(rng.integers(2**31)))
    except ValueError:  # a class with a single row cannot be stratified
        keep = rng.choice(len(labels), n, replace=False)
    return np.sort(keep)


def load_task(directory: str | Path, max_rows: int | None = None, seed: int = 0) -> Task:
    """Read a task folder; ``max_rows`` caps each split (a stratified, seeded sample) for cheap runs."""
    d = Path(directory)
    if not d.is_dir():
        raise TaskError(f"{d}: not a folder")
    rng = np.random.default_rng(seed)
    if (d / "all.tsv").exists():
        texts, raw = read_tsv(d / "all.tsv")
        classes = sorted(set(raw))
        y = np.array([classes.index(r) for r in raw])
        keep = _subsample(y, max_rows, rng)
        return Task(d.name, "cv", [texts[i] for i in keep], y[keep], classes, None, {"all": str(d / "all.tsv"), "rows": len(texts)})
    if (d / "train.tsv").exists() and (d / "test.tsv").exists():
        tr_t, tr_l = read_tsv(d / "train.tsv")
        te_t, te_l = read_tsv(d / "test.tsv")
        classes = sorted(set(tr_l))
        unknown = sorted(set(te_l) - set(classes))
        if unknown:
            raise TaskError(f"{d / 'test.tsv'}: labels absent from train.tsv: {unknown[:5]}")
        ytr = np.array([classes.index(r) for r in tr_l])
        yte = np.array([classes.index(r) for r in te_l])
        ktr, kte = _subsample(ytr, max_rows, rng), _subsample(yte, max_rows, rng)
        texts = [tr_t[i] for i in ktr] + [te_t[i] for i in kte]
        mask = np.r_[np.zeros(len(ktr), bool), np.ones(len(kte), bool)]
        return Task(d.name, "split", texts, np.r_[ytr[ktr], yte[kte]], classes, mask,
                    {"train": str(d / "train.tsv"), "test": str(d / "test.tsv"), "rows_train": len(tr_t), "rows_test": len(te_t)})
    raise TaskError(f"{d}: expected all.tsv, or train.tsv and test.tsv")


def outer_splits(task: Task, seed: int = 0) -> list[tuple[np.ndarray, np.ndarray]]:
    """(train indices, test indices) per evaluation split: 10 stratified folds, or the one train/test split."""
    if task.protocol == "split":
        return [(np.flatnonzero(~task.test_mask), np.flatnonzero(task.test_mask))]
    from sklearn.model_selection import StratifiedKFold

    k = min(OUTER_FOLDS, int(np.bincount(task.labels).min()))
    if k < 2:
        raise TaskError(f"{task.name}: a class has a single text; cross-validation needs two per class")
    return list(StratifiedKFold(k, shuffle=True, random_state=seed).split(np.zeros(len(task.labels)), task.labels))


def _inner_cv(y: np.ndarray, seed: int):
    from sklearn.model_selection import StratifiedKFold

    return StratifiedKFold(max(2, min(INNER_FOLDS, int(np.bincount(y).min()))), shuffle=True, random_state=seed)


def fit_logreg(x: np.ndarray, y: np.ndarray, seed: int = 0, c_grid: tuple[float, ...] = C_GRID):
    """A standardised logistic regression with C chosen by inner CV on (x, y) only."""
    from sklearn.exceptions import ConvergenceWarning
    from sklearn.linear_model import LogisticRegression
    from sklearn.model_selection import GridSearchCV
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import StandardScaler

    pipe = make_pipeline(StandardScaler(), LogisticRegression(max_iter=MAX_ITER))
    if len(c_grid) == 1:
        pipe.set_params(logisticregression__C=c_grid[0])
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", ConvergenceWarning)
            return pipe.fit(x, y)
    search = GridSearchCV(pipe, {"logisticregression__C": list(c_grid)}, cv=_inner_cv(y, seed), scoring="accuracy")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        return search.fit(x, y).best_estimator_


def _proba(model, x: np.ndarray, n_classes: int) -> np.ndarray:
    """Class probabilities in the task's full class order (a fold may lack a class)."""
    p = model.predict_proba(x)
    out = np.zeros((len(x), n_classes))
    out[:, model.classes_] = p
    return out


def fusion_boost(
    prefix_x_train: list[np.ndarray], y_train: np.ndarray, prefix_x_test: list[np.ndarray], n_classes: int, seed: int = 0, c_grid: tuple[float, ...] = C_GRID
) -> tuple[dict[str, tuple[np.ndarray, dict]], list[np.ndarray]]:
    """Token Fusion Boosting: ({booster: (test predictions, what it learned)}, each prefix's test predictions).

    Each prefix's classifier is fit on the whole training part (C by inner CV) for its test
    probabilities; its out-of-fold training probabilities (inner folds, that C kept: choosing
    C again per fold costs 13x and touches no test text either way) are the boosters' features.
    """
    from benchmarks.classification.fusion_boosting import fuse

    cv = _inner_cv(y_train, seed)
    oof, test_p, single = [], [], []
    for xtr, xte in zip(prefix_x_train, prefix_x_test):
        model = fit_logreg(xtr, y_train, seed, c_grid)
        c = (model.get_params()["logisticregression__C"],)
        p_oof = np.zeros((len(y_train), n_classes))
        for a, b in cv.split(xtr, y_train):
            p_oof[b] = _proba(fit_logreg(xtr[a], y_train[a], seed, c), xtr[b], n_classes)
        p = _proba(model, xte, n_classes)
        oof.append(p_oof)
        test_p.append(p)
        single.append(p.argmax(1))
    return fuse(oof, y_train, test_p, seed), single


def scores(y_true: np.ndarray, y_pred: np.ndarray) -> dict[str, float]:
    from sklearn.metrics import accuracy_score, f1_score

    return {"accuracy": float(accuracy_score(y_true, y_pred)), "macro_f1": float(f1_score(y_true, y_pred, average="macro"))}


def evaluate_task(task: Task, states: np.ndarray, boost: bool, seed: int = 0, on_split: Callable[[], None] | None = None, c_grid: tuple[float, ...] = C_GRID) -> dict:
    """Scores of one task from per-text token states (n, k, d).

    Without ``boost``: prefix 1 only (the single pooled token). With ``boost``: every prefix
    1..k and their Token Fusion Boosting. Predictions of all splits are pooled before scoring
    (SentEval averages fold accuracies; with equal-sized stratified folds the two agree to
    rounding, and pooled macro-F1 is defined on every class).
    """
    from benchmarks.classification.fusion_boosting import BOOSTERS
    from embedder.token_groups import prefix_features

    k = states.shape[1] if boost else 1
    feats = [prefix_features(states, i) for i in range(1, k + 1)]
    y = task.labels
    pred_single = [np.full(len(y), -1) for _ in range(k)]
    pred_boost = {name: np.full(len(y), -1) for name in BOOSTERS}
    learned: dict[str, list[dict]] = {name: [] for name in BOOSTERS}
    tested = np.zeros(len(y), bool)
    for train, test in outer_splits(task, seed):
        if boost:
            fused, singles = fusion_boost([f[train] for f in feats], y[train], [f[test] for f in feats], task.n_classes, seed, c_grid)
            for name, (pred, what) in fused.items():
                pred_boost[name][test] = pred
                learned[name].append(what)
            for j, s in enumerate(singles):
                pred_single[j][test] = s
        else:
            pred_single[0][test] = fit_logreg(feats[0][train], y[train], seed, c_grid).predict(feats[0][test])
        tested[test] = True
        if on_split:
            on_split()
    yt = y[tested]
    prefixes = [scores(yt, p[tested]) for p in pred_single]
    result = {
        "protocol": "10-fold CV" if task.protocol == "cv" else "train/test",
        "n_texts": len(y),
        "n_test": int(tested.sum()),
        "n_classes": task.n_classes,
        **prefixes[0],
        "prefixes": prefixes,
    }
    if boost:
        # "boosted" is the default booster (the prefix classifiers as weak learners); the trees beside it
        result["boosted"] = scores(yt, pred_boost["prefix"][tested])
        result["boosted_trees"] = scores(yt, pred_boost["trees"][tested])
        best = max(p["accuracy"] for p in prefixes)
        result["boost_gain_over_best_prefix"] = result["boosted"]["accuracy"] - best
        result["booster_weights"] = np.mean([w["weights"] for w in learned["prefix"]], 0).round(4).tolist()  # mean over splits
        result["booster_rounds"] = {name: [w["rounds"] for w in learned[name]] for name in BOOSTERS}
    return result


__all__ = ["C_GRID", "Task", "TaskError", "evaluate_task", "fit_logreg", "fusion_boost", "load_task", "outer_splits", "read_tsv", "scores"]
