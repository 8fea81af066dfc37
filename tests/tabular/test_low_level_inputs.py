"""The tabular family's low-level pure functions refuse concrete inputs outside their documented
ranges (a SARSA step above 1, a terminal mask of 2, a continuation of 2) with a named error,
and still take traced values under ``jit``."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from bchg_jax.problems import random_tabular_cmdp
from bchg_jax.tabular import rollout, sarsa_update, sparse
from bchg_jax.tabular.exact import policy_evaluation
from bchg_jax.tabular.follower import soft_value_iteration


@pytest.fixture(scope="module")
def tables():
    prob = random_tabular_cmdp(jax.random.key(0), num_states=4, num_actions=2)
    th = prob.theta0
    P, r = prob.transition(th), prob.follower_reward(th)
    policy = jnp.full((4, 2), 0.5)
    return P, r, policy, prob.init_dist(th)


def _batch(tables, E=2, T=5):
    P, _, policy, rho = tables
    return rollout(jax.random.key(1), policy, P, rho, None, None, E, T)


@pytest.mark.parametrize("E, T", [(0, 5), (2, -1), (2.5, 5), (2, 3.0), (True, 5)])
def test_rollout_refuses_sizes_that_are_not_positive_integers(tables, E, T):
    """A float size failed in jnp.zeros with JAX's shape error (0 and -1 were named)."""
    with pytest.raises(ValueError, match="num_(envs|steps) must be a positive integer"):
        _batch(tables, E, T)


@pytest.mark.parametrize("alpha", [0.0, -0.1, 1.5, 2.0, float("nan")])
def test_sarsa_refuses_a_step_size_outside_0_1(tables, alpha):
    batch = _batch(tables)
    with pytest.raises(ValueError, match="alpha"):
        sarsa_update(jax.random.key(2), jnp.zeros((4, 2)), batch, tables[1], 0.9, alpha)


def test_sarsa_takes_a_step_of_one_and_a_traced_step(tables):
    batch, Q0 = _batch(tables), jnp.zeros((4, 2))
    key = jax.random.key(2)
    a = sarsa_update(key, Q0, batch, tables[1], 0.9, 1.0)
    b = jax.jit(lambda al: sarsa_update(key, Q0, batch, tables[1], 0.9, al))(1.0)
    np.testing.assert_allclose(a, b, rtol=1e-6)


@pytest.mark.parametrize("bad", [[0, 2, 0, 0], [0.0, 0.5, 0.0, 1.0], [0, -1, 0, 0]])
def test_terminal_masks_must_be_bool(tables, bad):
    P, r, policy, rho = tables
    terminal = jnp.asarray(bad)
    with pytest.raises(ValueError, match="terminal"):
        rollout(jax.random.key(1), policy, P, rho, terminal, None, 2, 5)
    with pytest.raises(ValueError, match="terminal"):
        soft_value_iteration(P, r, 1.0, 0.9, terminal=terminal, tol=1e-6)
    succ = sparse.successors_from_transition(P)
    with pytest.raises(ValueError, match="terminal"):
        sparse.sparse_soft_value_iteration(P, r, 1.0, 0.9, succ, terminal=terminal, tol=1e-6)


def test_zero_one_masks_pass_and_match_bool_masks(tables):
    P, r, policy, rho = tables
    as_int, as_bool = jnp.array([0, 1, 0, 0]), jnp.array([False, True, False, False])
    a = soft_value_iteration(P, r, 1.0, 0.9, terminal=as_int, tol=1e-6)
    b = soft_value_iteration(P, r, 1.0, 0.9, terminal=as_bool, tol=1e-6)
    np.testing.assert_array_equal(a.V, b.V)
    x = rollout(jax.random.key(1), policy, P, rho, as_int, None, 2, 5)
    y = rollout(jax.random.key(1), policy, P, rho, as_bool, None, 2, 5)
    np.testing.assert_array_equal(x.s, y.s)
    # a traced mask is not checked (and not refused)
    jax.jit(lambda t: soft_value_iteration(P, r, 1.0, 0.9, terminal=t, tol=1e-6).V)(as_int)


@pytest.mark.parametrize("bad", [2.0, -0.5, float("nan")])
def test_policy_evaluation_refuses_a_continuation_outside_0_1(tables, bad):
    P, r, policy, _ = tables
    cont = jnp.ones(4).at[1].set(bad)
    with pytest.raises(ValueError, match="cont"):
        policy_evaluation(P, r, policy, 0.9, cont)


def test_policy_evaluation_takes_a_fractional_continuation(tables):
    """A continuation in (0, 1) is a termination probability: V = r_g + gamma c P_g V."""
    P, r, policy, _ = tables
    cont = jnp.array([1.0, 0.5, 0.0, 1.0])
    V = policy_evaluation(P, r, policy, 0.9, cont)
    Pg = jnp.einsum("sb,sbt->st", policy, P)
    rg = jnp.sum(policy * r, -1)
    np.testing.assert_allclose(V, rg + 0.9 * cont * (Pg @ V), atol=1e-5)


@pytest.mark.slow
def test_lag_references_give_nan_for_a_traced_mix_outside_0_1():
    """A traced ``mix`` escapes the concrete check: the gradient is NaN outside (0, 1], and
    the same numbers as the eager call inside it."""
    from bchg_jax import tabular
    from bchg_jax.games import tabular as games
    from bchg_jax.problems import random_tabular_game

    prob = random_tabular_cmdp(jax.random.key(0), num_states=4, num_actions=2)
    th, prev = prob.theta0, jnp.full((4, 2), 0.5)
    lag = jax.jit(lambda m: tabular.lag_hypergradient(prob, th, prev, 1.0, m))
    np.testing.assert_allclose(
        lag(0.5), tabular.lag_hypergradient(prob, th, prev, 1.0, 0.5), rtol=1e-5, atol=1e-7
    )
    for bad in (1.5, 0.0, -0.2):
        assert np.all(np.isnan(np.asarray(lag(bad))))

    game = random_tabular_game(0, S=4, A=2, B=3)
    g = jnp.full((4, 2, 3), 1.0 / 3)

    def policy_fn(t):
        return jax.nn.softmax(t, -1)

    glag = jax.jit(lambda m: games.lag_hypergradient(policy_fn, jnp.zeros((4, 2)), game, g, 1.0, m))
    assert np.all(np.isfinite(np.asarray(glag(0.5))))
    assert np.all(np.isnan(np.asarray(glag(1.5))))
