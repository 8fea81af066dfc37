"""Error and report messages: what they say must be the actual cause.

* ``core.bias_check.compare``: a zero-variance component (the same in every batch, e.g. a
  regulariser-only one) is no overflow and no absurd ``bias_se``: equal up to float rounding
  gives z = 0, a real difference an exact mismatch (z = inf, named by ``describe``).
* ``TabularGame.validate`` / ``TabularCMDP.validate``: a transition row with a negative entry
  that sums to 1 is reported as that negative entry (value and index), not as a row sum.
* a bfloat16 ``theta0`` is a floating array.
"""

from __future__ import annotations

import re
import warnings

import jax.numpy as jnp
import numpy as np
import pytest
from small_problems import cmdp as _cmdp

from bchg_jax.core.bias_check import compare, describe
from bchg_jax.games.tabular.game import TabularGame
from bchg_jax.problems.random_tabular import random_tabular_game

S, B = 3, 2


def _estimates(g, noisy, n=200, seed=0):
    """n float32 estimates of g: N(0, 0.1) noise on the ``noisy`` components, none elsewhere."""
    rng = np.random.default_rng(seed)
    noise = 0.1 * rng.standard_normal((n, g.size)) * np.asarray(noisy, bool)
    return (g + noise).astype(np.float32)


def test_zero_variance_component_equal_up_to_rounding_is_no_bias():
    # the third component (regulariser-only) is float32(g) in every batch: off by rounding only
    g = np.array([0.3, -1.7, 0.123456789])
    est = _estimates(g, [1, 1, 0])
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        row = compare(g, est)
    assert row["z"][2] == 0.0, row["z"]
    assert np.isfinite(row["bias_se"]) and row["bias_se"] < 4, row["bias_se"]
    assert row["exact_mismatches"] == 0
    text = describe(row)
    assert re.search(r"bias \d+\.\d SE \(max over 3 components, p = [\d.e+-]+\)", text), text
    # all components deterministic and exact (e.g. g = 0 at a stationary point)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        row = compare(np.zeros(3), np.zeros((5, 3), np.float32))
    assert row["bias_se"] == 0.0 and np.all(row["z"] == 0.0)


def test_zero_variance_component_off_beyond_rounding_is_an_exact_mismatch():
    g = np.array([0.3, -1.7, 0.123456789])
    est = _estimates(g, [1, 1, 0])
    est[:, 2] += 1e-3  # a real (small) bias of a deterministic component
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no "overflow encountered in divide"
        row = compare(g, est)
    assert row["z"][2] == np.inf and row["exact_mismatches"] == 1, row["z"]
    assert row["bias_se"] > 4 and row["p_value"] == 0.0  # the verdict still fails
    assert np.all(np.isfinite(row["z"][:2]))
    text = describe(row)
    assert "EXACT MISMATCH in 1 of 3 components" in text, text
    assert "e+30" not in text and "inf SE" not in text, text
    # a tiny se (not exactly 0) is no overflow either
    est2 = est.astype(np.float64)
    est2[:, 2] += 1e-300 * np.arange(len(est2))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        row = compare(g, est2)
    assert row["z"][2] == np.inf, row["z"]


def test_compare_non_finite_estimates_stay_nan():
    g = np.array([0.3, -1.7, 0.1])
    est = _estimates(g, [1, 1, 0])
    est[0, 0] = np.nan
    row = compare(g, est)
    assert np.isnan(row["z"][0]) and np.isnan(row["bias_se"])
    assert row["z"][2] == 0.0


def test_compare_a_zero_exact_value_has_no_relative_error():
    """An exact gradient that is 0 (a leader reward before the follower acts) gave a relative
    error of ~1e290 (the mean over the smallest float); now NaN, said in words, z still judges."""
    rng = np.random.default_rng(0)
    g = np.zeros(3)
    row = compare(g, 1e-18 * rng.standard_normal((400, 3)))
    assert row["zero_exact"] and np.isnan(row["rel_error"]) and np.isnan(row["rel_se"])
    assert np.isnan(row["cosine"]) and row["bias_se"] < 5
    text = describe(row)
    assert "exact value is 0 to rounding" in text and "e+2" not in text, text
    biased = compare(g, 1.0 + rng.standard_normal((400, 3)))  # a real bias still shows
    assert biased["zero_exact"] and biased["bias_se"] > 10 and biased["p_value"] < 1e-6
    nonzero = compare(np.array([0.0, 1e-3, 0.0]), 1e-3 + 1e-4 * rng.standard_normal((400, 3)))
    assert not nonzero["zero_exact"] and np.isfinite(nonzero["rel_error"])


def _game_with(transition=None, init_dist=None) -> TabularGame:
    game = random_tabular_game()
    return TabularGame(
        game.transition if transition is None else transition,
        game.init_dist if init_dist is None else init_dist,
        game.follower_reward,
        game.leader_reward,
        game.gamma_F,
        game.gamma_L,
        game.time_limit,
    )


def test_game_negative_transition_entry_is_named():
    P = np.asarray(random_tabular_game().transition, np.float64).copy()
    P[2, 1, 0] = [0.7, -0.2, 0.3, 0.2]  # sums to 1
    with pytest.raises(ValueError) as err:
        _game_with(transition=P).validate()
    msg = str(err.value)
    assert "transition[2, 1, 0, 1]" in msg and "-0.2" in msg and "negative" in msg, msg
    assert "normalise" not in msg, msg
    rho = np.array([0.6, -0.1, 0.3, 0.2])
    with pytest.raises(ValueError, match=r"init_dist\[1\] = -0\.1 is negative"):
        _game_with(init_dist=rho).validate()
    # a row sum off 1 is still reported as such
    P = np.asarray(random_tabular_game().transition, np.float64).copy()
    P[0, 0, 0] *= 0.5
    with pytest.raises(ValueError, match=r"largest \|row sum - 1\|: 0\.5"):
        _game_with(transition=P).validate()
    P[0, 0, 0, 0] = np.nan
    with pytest.raises(ValueError, match=r"transition has non-finite entries"):
        _game_with(transition=P).validate()


def test_cmdp_negative_transition_entry_is_named():
    neg = np.full((S, B, S), 1.0 / S)
    neg[1, 0] = [0.6, -0.2, 0.6]  # sums to 1
    with pytest.raises(ValueError) as err:
        _cmdp(transition=lambda th: jnp.asarray(neg, th.dtype)).validate()
    msg = str(err.value)
    assert "first bad (s, b): [1, 0] has the negative entry -0.2 at s' = 1" in msg, msg
    assert "normalise" not in msg, msg
    with pytest.raises(ValueError, match=r"sample_transition\(theta\).*negative entry -0\.2"):
        _cmdp(sample_transition=lambda th: jnp.asarray(neg, th.dtype)).validate()
    with pytest.raises(ValueError, match=r"init_dist\[2\] = -0\.1 is negative"):
        _cmdp(init_dist=lambda th: jnp.array([0.5, 0.6, -0.1])).validate()


def test_bfloat16_theta0_is_a_floating_array():
    with pytest.raises(ValueError) as err:
        _cmdp(theta0=jnp.zeros(1, jnp.bfloat16)).validate()
    # rejected as a 16-bit float (float16 alike, test_bad_input), not as "not a floating array"
    assert "must be a floating array" not in str(err.value), err.value
    assert "theta0 is bfloat16" in str(err.value), err.value


def test_an_integer_setting_out_of_range_is_shown_as_given():
    """``--actor-steps 25`` was refused as "got 25.0" (the check reads values as floats)."""
    from bchg_jax.core.validate import check_int_range

    with pytest.raises(ValueError, match=r"got 25$"):
        check_int_range("actor_steps", 25, 0, 20)
    with pytest.raises(ValueError, match=re.escape("got [1, 25]")):
        check_int_range("actor_steps", np.asarray([1.0, 25.0]), 0, 20)
    with pytest.raises(ValueError, match=r"got 2\.5$"):
        check_int_range("actor_steps", 2.5, 0, 20)


def test_a_boolean_step_count_is_refused():
    """``HParams(True, 1, 0.5)`` ran one actor step silently: ``check_int_range`` read True as
    1, where ``check_count`` (horizons, follower steps) refuses a boolean."""
    from bchg_jax.core.validate import check_int_range
    from bchg_jax.games.lqr import train

    for value in (True, np.array([True, False]), [False, True]):
        with pytest.raises(ValueError, match="actor_steps must be integers"):
            check_int_range("actor_steps", value, 0, 20)
    with pytest.raises(ValueError, match="critic_steps must be integers"):
        train.HParams(1, False, 0.5).validate(max_steps=4)
    check_int_range("actor_steps", np.array([0, 3]), 0, 20)  # integers still pass
