"""Token Fusion Boosting (btmr-multiple-tokens §3.3, Algorithm 1): fusing the prefix classifiers.

The input of Algorithm 1 is, per text, the class predictions of k classifiers, one per token
prefix (the first 1, 2, ..., k token states). It starts from a constant f_0 = argmin_c sum L(y, c)
and adds T weak learners β_t b(x; γ_t), each fit to lower the loss of f_{t-1}. The paper's §4
says which weak learners: "we fit k Logistic Regression classifiers [...] employ these Logistic
Regression classifiers as weak learners, and apply the Token Fusion Boosting Algorithm".

Two readings are implemented, both trained on *out-of-fold* prefix predictions (how the
prefixes err on texts they were not fit on):

* :class:`PrefixBooster` (the default): gradient boosting whose weak learners are the k prefix
  classifiers themselves (their log-probabilities). Each round takes the prefix whose output best
  fits the negative gradient of the cross-entropy (Friedman's least-squares fit of the pseudo
  residuals), or a constant (which re-fits the class offsets), then a Newton line search for β_t.
  The fused model is f(x) = b + Σ_j w_j log p_j(x): a weighted log-linear pool of the prefixes,
  k + C numbers in all, which is why it cannot overfit a task of a few hundred texts the way trees can.
* :func:`make_tree_booster`: gradient-boosted trees on the concatenated prefix probabilities
  (scikit-learn's HistGradientBoosting), the generic weak learner. Kept as a comparison: on the
  sampled tasks it fell below the best single prefix on most of them (BENCHMARKS.md).
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

_FLOOR = 1e-12  # probabilities are clipped here before the log: a fold can miss a class entirely

BOOSTERS = ("prefix", "trees")
TREE_BOOSTER = ("HistGradientBoostingClassifier(learning_rate=0.1, l2_regularization=1.0, max_iter=300, early stopping on 10% "
                "of the training rows, patience 10) on out-of-fold prefix probabilities")
PREFIX_BOOSTER = ("gradient boosting with the prefix classifiers as weak learners (Algorithm 1; f_0 = log class prior, each round "
                  "the prefix whose log-probabilities, or the constant, best fit the negative gradient, Newton line search for beta) "
                  "on out-of-fold prefix probabilities")


def _softmax(f: np.ndarray) -> np.ndarray:
    z = np.exp(f - f.max(1, keepdims=True))
    return z / z.sum(1, keepdims=True)


def _cross_entropy(f: np.ndarray, y: np.ndarray) -> float:
    m = f.max(1, keepdims=True)
    logz = (m[:, 0] + np.log(np.exp(f - m).sum(1)))
    return float(np.mean(logz - f[np.arange(len(y)), y]))


def _centred_log(p: np.ndarray) -> np.ndarray:
    """log p with each row's mean removed: the softmax ignores a row constant, the gradient fit does not."""
    lp = np.log(np.clip(p, _FLOOR, None))
    return lp - lp.mean(1, keepdims=True)


@dataclass
class PrefixBooster:
    """Algorithm 1 with the prefix classifiers as the weak learners (see the module doc).

    ``fit`` takes each prefix's out-of-fold class probabilities on the training texts;
    ``predict`` takes the same classifiers' probabilities on new texts (refit on all the
    training texts). ``weights[j]`` is the summed β of prefix j+1, ``bias`` f_0 plus the constant
    learners' steps; ``rounds`` how many rounds ran.
    """

    max_rounds: int = 200
    tol: float = 1e-7  # stop when a round lowers the mean cross-entropy by less than this
    bias: np.ndarray | None = None
    weights: np.ndarray | None = None
    rounds: int = 0
    losses: list[float] = field(default_factory=list)

    def fit(self, probas: list[np.ndarray], y: np.ndarray) -> PrefixBooster:
        n, c = probas[0].shape
        # The weak learners: each prefix's (centred) log-probabilities, and a constant, the column
        # means of the residual. Without the constant, f_0 stays frozen: the prefixes already
        # carry the class prior, so a pool whose weights sum to ~1 would count the prior twice and
        # lean towards the frequent classes.
        h = [_centred_log(p) for p in probas]
        onehot = np.eye(c)[y]
        # f_0 = argmin_c sum_i L(y_i, c): the log class frequencies (add-one, for a class a fold lacks)
        self.bias = np.log((np.bincount(y, minlength=c) + 1.0) / (n + c))
        self.weights = np.zeros(len(h))
        f = np.tile(self.bias, (n, 1))
        self.losses = [_cross_entropy(f, y)]
        for rounds in range(1, self.max_rounds + 1):
            self.rounds = rounds
            residual = onehot - _softmax(f)  # the negative gradient of the cross-entropy in f
            constant = np.tile(residual.mean(0), (n, 1))  # the least-squares constant fit of the residual
            learners = h + [constant]
            fit = [float((residual * hj).sum()) ** 2 / max(float((hj * hj).sum()), _FLOOR) for hj in learners]
            j = int(np.argmax(fit))
            beta = self._line_search(f, learners[j], y, onehot)
            f_new = f + beta * learners[j]
            loss = _cross_entropy(f_new, y)
            if self.losses[-1] - loss < self.tol:
                self.rounds -= 1
                break
            f = f_new
            if j < len(h):
                self.weights[j] += beta
            else:
                self.bias = self.bias + beta * constant[0]
            self.losses.append(loss)
        return self

    @staticmethod
    def _line_search(f: np.ndarray, h: np.ndarray, y: np.ndarray, onehot: np.ndarray, steps: int = 8) -> float:
        """argmin_β mean CE(f + β h), by Newton steps on a 1-D convex function (halved when a step overshoots)."""
        beta = 0.0
        loss = _cross_entropy(f, y)
        for _ in range(steps):
            p = _softmax(f + beta * h)
            grad = -float(((onehot - p) * h).sum()) / len(y)
            hp = (p * h).sum(1)
            hess = float(((p * h * h).sum(1) - hp * hp).sum()) / len(y)
            if hess <= _FLOOR:
                break
            step = grad / hess
            while step and abs(step) > 1e-9:
                trial = _cross_entropy(f + (beta - step) * h, y)
                if trial <= loss:
                    beta, loss = beta - step, trial
                    break
                step /= 2
            else:
                break
        return beta

    def decision_function(self, probas: list[np.ndarray]) -> np.ndarray:
        if self.weights is None:
            raise RuntimeError("fit the booster first")
        return self.bias + sum(w * _centred_log(p) for w, p in zip(self.weights, probas))

    def predict(self, probas: list[np.ndarray]) -> np.ndarray:
        return self.decision_function(probas).argmax(1)


def make_tree_booster(y_train: np.ndarray, seed: int = 0):
    """Gradient-boosted trees on the concatenated prefix probabilities (the comparison booster).

    L2 on the leaves: a Newton leaf value is sum(gradient) / sum(hessian), and with many classes
    each probability p is small, so p(1-p) is tiny and an unregularised leaf jumps by tens of
    logits in one round (Banking77: 77 classes, ~26 training texts each, boosted accuracy fell to
    0.27 where every prefix scored ~0.80). Early stopping on held-out training rows picks the
    number of rounds without touching the test texts; it is skipped where too few rows per class remain.
    """
    from sklearn.ensemble import HistGradientBoostingClassifier

    validation = int(0.1 * len(y_train))
    stop = validation >= 2 * len(np.unique(y_train))
    return HistGradientBoostingClassifier(max_iter=300 if stop else 100, learning_rate=0.1, l2_regularization=1.0,
                                          early_stopping=stop, validation_fraction=0.1, n_iter_no_change=10, random_state=seed)


def fuse(oof: list[np.ndarray], y_train: np.ndarray, test: list[np.ndarray], seed: int = 0) -> dict[str, tuple[np.ndarray, dict]]:
    """Both boosters fit on the prefixes' out-of-fold probabilities: {name: (test predictions, what it learned)}."""
    prefix = PrefixBooster().fit(oof, y_train)
    trees = make_tree_booster(y_train, seed).fit(np.hstack(oof), y_train)
    return {
        "prefix": (prefix.predict(test), {"weights": [round(float(w), 4) for w in prefix.weights], "rounds": prefix.rounds}),
        "trees": (trees.predict(np.hstack(test)), {"rounds": int(trees.n_iter_)}),
    }


__all__ = ["BOOSTERS", "PREFIX_BOOSTER", "TREE_BOOSTER", "PrefixBooster", "fuse", "make_tree_booster"]
