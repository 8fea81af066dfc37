"""``TabularCMDP``'s sizes, regulariser and ``validate`` at their edges: S and B from the right
axes; Phi_L added to J_L (written out); the row-sum tolerance from the larger discount and the
dtype of the theta checked; a transition to another number of states, an init_dist summing
below 1, a terminal mask of another length, a vector Phi_L and a theta shaped unlike theta0 are
each refused by name."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from small_problems import cmdp

from bchg_jax import tabular

S, B = 3, 2


def test_sizes_come_from_the_transition_axes():
    p = cmdp(
        transition=lambda th: jnp.full((4, 2, 4), 0.25),
        init_dist=lambda th: jnp.full(4, 0.25),
        follower_reward=lambda th: jnp.zeros((4, 2)) + th[0],
        leader_reward=lambda th: jnp.ones((4, 2)),
        terminal=np.array([False, False, True, False]),
    ).validate()
    assert (p.num_states, p.num_actions) == (4, 2)
    np.testing.assert_array_equal(np.asarray(p.terminal_mask), [False, False, True, False])


def test_regularizer_is_added_to_the_leader_objective():
    """r_L = 1 everywhere: J_L = sum_t 0.9^t = 10 whatever the follower does, plus
    Phi(theta) = 2 theta^2 + 0.5: 10.68 at theta 0.3, gradient 1.2."""
    p = cmdp(leader_regularizer=lambda th: 2.0 * th[0] ** 2 + 0.5).validate()
    th = jnp.asarray([0.3])
    assert float(p.regularizer(th)) == pytest.approx(0.68, rel=1e-6)
    value, g = jax.jit(jax.value_and_grad(lambda t: tabular.leader_objective(p, t, 1.0)))(th)
    assert float(value) == pytest.approx(10.68, rel=1e-5)
    np.testing.assert_allclose(np.asarray(g), [1.2], rtol=1e-4)
    assert float(cmdp().regularizer(th)) == 0.0


@pytest.mark.parametrize("gF, gL", [(0.5, 0.99), (0.99, 0.5)])
def test_row_sum_tolerance_follows_the_slower_discount(gF, gL):
    P = np.full((S, B, S), 1.0 / S)
    P[0, 0, 0] += 2e-5  # off by 2e-5: within gamma 0.5's 5e-4, not gamma 0.99's 1e-5
    p = cmdp(transition=lambda th: jnp.asarray(P, th.dtype), gamma_F=gF, gamma_L=gL)
    assert p.row_sum_tolerance() == pytest.approx(1e-3 * (1 - 0.99), rel=0.01)
    with pytest.raises(ValueError, match="summing to 1"):
        p.validate()


def test_the_tolerance_is_that_of_the_theta_checked(x64):
    """Float64 tables at gamma 0.999 get 1e-6, float32 ones 3.8e-6: a row off by 2e-6 passes
    at theta0's float32 and is refused at a float64 theta."""
    P = np.full((S, B, S), 1.0 / S)
    P[0, 0, 0] += 2e-6
    p = cmdp(
        transition=lambda th: jnp.asarray(P, th.dtype),
        init_dist=lambda th: jnp.full(S, 1.0 / S, th.dtype),
        follower_reward=lambda th: jnp.zeros((S, B), th.dtype) + th[0],
        leader_reward=lambda th: jnp.ones((S, B), th.dtype),
        gamma_F=0.999,
        gamma_L=0.999,
        theta0=jnp.zeros(1, jnp.float32),
    )
    assert p.row_sum_tolerance(np.float64) == pytest.approx(1e-6)
    p.validate()
    with pytest.raises(ValueError, match=r"summing to 1 within 1e-06"):
        p.validate(jnp.zeros(1, jnp.float64))


@pytest.mark.parametrize(
    "over, match",
    [
        (
            dict(transition=lambda th: jnp.full((S, B, S + 1), 1.0 / (S + 1))),
            r"transition\(theta\) must have shape \[S, B, S\], got \(3, 2, 4\)",
        ),
        (
            dict(init_dist=lambda th: jnp.asarray([0.3, 0.3, 0.3])),
            r"init_dist\(theta\) must be a probability vector summing to 1.*got sum 0\.9",
        ),
        (dict(init_dist=lambda th: jnp.asarray([0.3, 0.3, 0.5])), r"summing to 1.*got sum 1\.1"),
        (
            dict(terminal=np.array([False, True])),
            r"terminal must be a bool mask of shape \(3,\), got \(2,\)",
        ),
        (
            dict(leader_regularizer=lambda th: th**2),
            r"leader_regularizer\(theta\) must be a scalar, got shape \(1,\)",
        ),
    ],
    ids=["next_states", "init_below_1", "init_above_1", "terminal_length", "vector_phi"],
)
def test_a_table_of_the_wrong_shape_or_sum_is_refused_by_name(over, match):
    with pytest.raises(ValueError, match=match):
        cmdp(**over).validate()


def test_validate_refuses_a_theta_shaped_unlike_theta0():
    """As ``LQConfigurableMDP.validate`` and the exact functions do (a table reading th[0] took
    a [5] theta without complaint)."""
    p = cmdp()
    p.validate(jnp.zeros(1))
    with pytest.raises(ValueError, match=r"theta must be shaped like theta0 \(1,\), got \(5,\)"):
        p.validate(jnp.zeros(5))


def test_the_random_cmdp_is_theorem_1s_general_case():
    """``random_tabular_cmdp``'s transitions, initial distribution and both rewards all move with
    theta: the unbiasedness tests built on it see a wrong grad log p or grad rho_0 term only
    because the estimator and the exact gradient would not both lack it."""
    from bchg_jax.problems import random_tabular_cmdp

    problem = random_tabular_cmdp(jax.random.key(0))
    theta = problem.theta0
    for name in ("transition", "init_dist", "follower_reward", "leader_reward"):
        fn = getattr(problem, name)
        moved = np.asarray(fn(theta + 0.5)) - np.asarray(fn(theta))
        assert np.all(np.isfinite(moved)) and np.max(np.abs(moved)) > 1e-2, name
