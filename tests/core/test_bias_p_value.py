"""The verdict of an estimator check with few batches: ``p_value`` is Student's t, Sidak-corrected.

With N batches the standard error is itself estimated from N estimates, so z = (mean - exact) / SE
is Student's t with N - 1 degrees of freedom, whose tails are far heavier than the normal's for
small N: a "bias_se above ~4" rule flagged an unbiased 6-component estimator in 64% of 2-batch
checks. ``p_value`` must be uniform-or-larger (never smaller) for an unbiased estimator, at any N.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from bchg_jax.core.bias_check import compare, max_abs_t_p_value, t_two_sided_p


@pytest.mark.parametrize("t", [0.0, 0.3, 1.0, 2.5, 7.0])
def test_t_tail_matches_the_closed_forms_and_the_normal_limit(t):
    # dof 1 (Cauchy) and dof 2 have elementary tails; a large dof approaches the normal
    assert t_two_sided_p(t, 1) == pytest.approx(1 - 2 * math.atan(t) / math.pi, abs=1e-14)
    assert t_two_sided_p(t, 2) == pytest.approx(1 - t / math.sqrt(2 + t * t), abs=1e-14)
    assert t_two_sided_p(t, 20000) == pytest.approx(math.erfc(t / math.sqrt(2)), abs=2e-4)
    # monotone in the degrees of freedom: more batches, thinner tails
    tails = [float(t_two_sided_p(t, d)) for d in (1, 2, 3, 4, 7, 30)]
    assert np.all(np.diff(tails) <= 1e-15), tails


def test_t_tail_matches_sampled_t_values():
    rng = np.random.default_rng(1)
    for dof in (3, 4, 9):
        x = rng.standard_normal(400_000) / np.sqrt(rng.chisquare(dof, 400_000) / dof)
        for t in (1.0, 3.0):
            p = float(t_two_sided_p(t, dof))
            se = math.sqrt(p * (1 - p) / x.size)
            assert abs(np.mean(np.abs(x) >= t) - p) < 5 * se, (dof, t)


@pytest.mark.parametrize("batches", [2, 3, 5, 30])
def test_an_unbiased_estimator_is_rarely_called_biased_at_any_number_of_batches(batches):
    rng = np.random.default_rng(batches)
    D, checks = 6, 3000
    rows = [compare(np.zeros(D), rng.standard_normal((batches, D))) for _ in range(checks)]
    p = np.array([r["p_value"] for r in rows])
    big = np.mean([r["bias_se"] > 4 for r in rows])
    # the p-value is conservative: P(p < a) <= a (Sidak is exact for independent components)
    for a in (0.01, 0.05, 0.2):
        assert np.mean(p < a) <= a + 4 * math.sqrt(a / checks), (a, np.mean(p < a))
    assert np.mean(p < 0.05) >= 0.05 - 4 * math.sqrt(0.05 / checks)  # not vacuous either
    if batches <= 3:
        assert big > 0.25  # what the "bias_se above ~4" rule alone called biased


def test_a_real_bias_gets_a_small_p_value_and_an_exact_mismatch_zero():
    rng = np.random.default_rng(0)
    est = 1.0 + 0.1 * rng.standard_normal((200, 4))
    est[:, 1] += 0.05  # 7 SE at 200 batches
    row = compare(np.ones(4), est)
    assert row["p_value"] < 1e-6, row
    assert max_abs_t_p_value(np.inf, 10, 4) == 0.0
    assert max_abs_t_p_value(0.0, 10, 4) == 1.0
    assert np.isnan(max_abs_t_p_value(np.nan, 10, 4))
    with pytest.raises(ValueError, match="dof must be >= 1"):
        t_two_sided_p(1.0, 0)


def test_a_pass_at_low_resolution_is_warned_about():
    """A check whose standard error is several times the gradient's norm passed in silence (an
    LQ problem with Q from 1e-3 to 1e2: p = 0.38 at a resolution of 788%). It now warns that
    the pass says little; a resolved pass and a biased reading do not get that warning."""
    import warnings

    from bchg_jax.core.bias_check import LOW_RESOLUTION, compare, warn_if_unresolved

    rng = np.random.default_rng(0)
    exact = np.array([1.0, -0.5])
    noisy = exact + 20.0 * rng.normal(size=(50, 2))  # SE ~ 2.8: ~250% of the norm
    row = compare(exact, noisy)
    assert row["rel_se"] > LOW_RESOLUTION and row["p_value"] > 1e-3
    with pytest.warns(UserWarning, match="standard error is .*% of the exact gradient's norm"):
        assert warn_if_unresolved("theta 0", row, 50)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        sharp = compare(exact, exact + 0.01 * rng.normal(size=(50, 2)))
        assert not warn_if_unresolved("theta 0", sharp, 50)  # resolved
        biased = compare(exact, exact + 30.0 + 20.0 * rng.normal(size=(50, 2)))
        assert biased["p_value"] < 1e-3 and not warn_if_unresolved("theta 0", biased, 50)
        zero = compare(np.zeros(2), rng.normal(size=(50, 2)))  # no norm to be relative to
        assert not warn_if_unresolved("theta 0", zero, 50)
