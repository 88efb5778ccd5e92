"""Token Fusion Boosting with the prefix classifiers as weak learners (benchmarks/fusion_boosting.py)."""
import numpy as np
import pytest

from benchmarks.classification.fusion_boosting import PrefixBooster, _centred_log, _cross_entropy, fuse


def _softmax(z):
    e = np.exp(z - z.max(1, keepdims=True))
    return e / e.sum(1, keepdims=True)


def _prefixes(rng, n=600, c=3):
    """Two prefix classifiers: one informative but over-confident, one pure noise; labels drawn from the truth."""
    logits = rng.normal(size=(n, c)) * 2.0
    y = np.array([rng.choice(c, p=p) for p in _softmax(logits)])
    informative = _softmax(3.0 * logits + rng.normal(size=(n, c)))  # right ranking, wrong temperature
    noise = _softmax(rng.normal(size=(n, c)) * 2.0)
    return [informative, noise], y


def test_the_boosted_pool_reaches_the_optimum_of_its_loss():
    # The rounds are coordinate steps on a convex loss in the prefix weights and the class offsets:
    # where they stop must be the minimiser of CE(b + sum_j w_j log p_j) that a general-purpose
    # optimiser finds (the offsets only up to a common constant, which the softmax ignores).
    from scipy.optimize import minimize

    probas, y = _prefixes(np.random.default_rng(0))
    booster = PrefixBooster(max_rounds=2000, tol=1e-12).fit(probas, y)
    h = [_centred_log(p) for p in probas]
    c = probas[0].shape[1]

    def loss(v):
        return _cross_entropy(v[2:] + v[0] * h[0] + v[1] * h[1], y)

    direct = minimize(loss, np.zeros(2 + c), method="BFGS")
    assert booster.weights == pytest.approx(direct.x[:2], abs=2e-3)
    assert booster.losses[-1] == pytest.approx(direct.fun, abs=1e-6)
    assert booster.bias - booster.bias.mean() == pytest.approx(direct.x[2:] - direct.x[2:].mean(), abs=5e-3)
    # and every round lowered the loss
    assert all(b < a for a, b in zip(booster.losses, booster.losses[1:]))


def test_the_class_offsets_are_refit_so_the_prior_is_not_counted_twice():
    # Prefixes that already carry a skewed prior (80/20): frozen at f_0 = log prior, the pool would
    # add the prior a second time; the constant learner takes it back out.
    rng = np.random.default_rng(5)
    n = 2000
    y = (rng.random(n) < 0.2).astype(int)
    score = rng.normal(size=n) + 1.5 * y
    logit = 1.5 * score - 1.5**2 / 2 + np.log(0.2 / 0.8)  # the calibrated posterior: log prior odds + log likelihood ratio
    p1 = 1 / (1 + np.exp(-logit))
    probas = [np.stack([1 - p1, p1], 1)]
    booster = PrefixBooster(max_rounds=500, tol=1e-12).fit(probas, y)
    assert booster.weights[0] == pytest.approx(1.0, abs=0.1)  # a calibrated prefix is kept as it is
    assert abs(booster.bias[1] - booster.bias[0]) < 0.15  # and no second prior is added


def test_the_noise_prefix_gets_almost_no_weight_and_the_informative_one_is_recalibrated():
    probas, y = _prefixes(np.random.default_rng(1))
    booster = PrefixBooster().fit(probas, y)
    assert abs(booster.weights[1]) < 0.1 * abs(booster.weights[0])
    assert 0.1 < booster.weights[0] < 0.6  # the informative prefix is 3x over-confident: its weight shrinks it
    # on new texts the pool is better calibrated than the informative prefix alone (held-out cross-entropy)
    test, y_test = _prefixes(np.random.default_rng(2))
    alone = -np.log(test[0][np.arange(len(y_test)), y_test]).mean()
    assert _cross_entropy(booster.decision_function(test), y_test) < alone - 0.1


def test_a_class_missing_from_the_training_rows_does_not_break_the_fit():
    probas, y = _prefixes(np.random.default_rng(3), c=4)
    keep = y != 3
    booster = PrefixBooster().fit([p[keep] for p in probas], y[keep])
    assert np.isfinite(booster.bias).all() and np.isfinite(booster.weights).all()
    assert booster.predict([p[~keep] for p in probas]).shape == ((~keep).sum(),)


def test_fuse_returns_both_boosters_predictions():
    probas, y = _prefixes(np.random.default_rng(4))
    fused = fuse(probas, y, probas)
    assert set(fused) == {"prefix", "trees"}
    for pred, what in fused.values():
        assert pred.shape == y.shape and what["rounds"] >= 1
    assert len(fused["prefix"][1]["weights"]) == 2
