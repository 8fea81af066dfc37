"""The references for followers off their best response check the problem as the exact
references do: a tabular problem that fails ``validate(theta)`` (rows summing to 0.9, a NaN
reward) gave each of them a finite (or NaN) gradient of no problem; an LQ ``A(theta)`` of the
wrong shape a raw matmul ``TypeError``, an integer ``B(theta)`` was taken and a NaN ``A`` gave
the K-step reference a NaN gradient; a float64 ``P_prev`` of a float32 LQ problem broke the
K-step reference's loop with a carry-type ``TypeError``."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import small_problems

from bchg_jax import lq, tabular
from bchg_jax.problems import random_tabular_cmdp

S, B = 3, 2


def _tabular(scale=1.0, reward=None):
    return tabular.TabularCMDP(
        transition=lambda th: (
            scale * jax.nn.softmax(jnp.zeros((S, B, S)).at[:, 0, 0].add(th[0]), -1)
        ),
        init_dist=lambda th: jnp.ones(S) / S,
        follower_reward=reward or (lambda th: jnp.stack([jnp.full(S, th[1]), jnp.ones(S)], -1)),
        leader_reward=lambda th: jnp.zeros((S, B)).at[:, 0].set(1.0),
        gamma_F=0.9,
        gamma_L=0.9,
        theta0=jnp.zeros(2),
    )


def _tabular_calls(p, theta):
    g = jnp.full((S, B), 0.5)
    return {
        "as_if_optimal_hypergradient": lambda: tabular.as_if_optimal_hypergradient(
            p, theta, g, 0.5
        ),
        "k_step_hypergradient": lambda: tabular.k_step_hypergradient(
            p, theta, jnp.zeros(S), 0.5, 2
        ),
        "lag_hypergradient": lambda: tabular.lag_hypergradient(p, theta, g, 0.5, 0.5),
        "policy_objective": lambda: tabular.policy_objective(p, theta, g),
        "leader_values": lambda: tabular.leader_values(p, theta, g),
    }


@pytest.mark.slow
def test_tabular_follower_references_refuse_a_problem_that_fails_validate():
    theta = jnp.array([0.3, 0.2])
    for name, call in _tabular_calls(_tabular(), theta).items():
        assert np.all(np.isfinite(jax.tree.leaves(call())[0])), name  # a valid problem is taken
    for call in _tabular_calls(_tabular(scale=0.9), theta).values():
        with pytest.raises(ValueError, match="rows must be probabilities"):
            call()
    nan_reward = _tabular(
        reward=lambda th: jnp.stack([jnp.full(S, jnp.sqrt(th[1] - 1.0)), jnp.ones(S)], -1)
    )
    for call in _tabular_calls(nan_reward, theta).values():  # validate() reads every table
        with pytest.raises(ValueError, match="follower_reward"):
            call()


def _lq(dtype=jnp.float32, **over):
    kw = dict(
        A_fn=lambda t: jnp.array([[0.9, 0.1], [0.0, 0.8]], dtype) + t[0] * jnp.eye(2, dtype=dtype),
        B_fn=lambda t: jnp.array([[1.0], [0.5]], dtype) + t[1],
        U=np.eye(2, dtype=dtype) * 0.5,
        Qbar=np.eye(2, dtype=dtype),
        Rbar=np.eye(1, dtype=dtype),
        leader_quadratic=lambda t: (jnp.eye(2, dtype=dtype), jnp.eye(1, dtype=dtype), dtype(0.0)),
        init_cov=np.eye(2, dtype=dtype),
        theta0=jnp.zeros(2, dtype),
    )
    kw.update(over)
    return small_problems.lq(**kw)


def _lq_calls(p, theta, br):
    return {
        "as_if_optimal_hypergradient": lambda: lq.as_if_optimal_hypergradient(p, theta, br, 0.5),
        "k_step_hypergradient": lambda: lq.k_step_hypergradient(p, theta, br.P, 0.5, 2),
        "k_step_response": lambda: lq.k_step_response(p, theta, 0.5, br.P, 2),
        "policy_value": lambda: lq.policy_value(p, theta, br, 0.5),
    }


@pytest.mark.slow
def test_lq_follower_references_check_the_dynamics_they_read():
    p = _lq()
    theta = jnp.array([0.05, 0.1], jnp.float32)
    br = lq.best_response(p, theta, 0.5)
    bad = {
        "must have shape": dataclasses.replace(p, A_fn=lambda t: 0.5 * jnp.eye(3)),
        "floating": dataclasses.replace(p, B_fn=lambda t: jnp.array([[0], [1]])),
        "must be finite": dataclasses.replace(p, A_fn=lambda t: jnp.sqrt(t[0] - 1.0) * jnp.eye(2)),
    }
    for match, q in bad.items():
        for call in _lq_calls(q, theta, br).values():
            with pytest.raises(ValueError, match=match):
                call()
        with jax.disable_jit(), pytest.raises(ValueError, match=match):  # the plain call too
            lq.policy_value(q, theta, br, 0.5)
    for name, call in _lq_calls(p, theta, br).items():
        assert all(np.all(np.isfinite(x)) for x in jax.tree.leaves(call())), name
    # a bad beta: the cached call checked it, the plain call (disable_jit) took beta -1
    for plain in (False, True):
        with jax.disable_jit(plain), pytest.raises(ValueError, match="beta"):
            lq.policy_value(p, theta, br, -1.0)


def test_a_wider_p_prev_is_taken_in_the_problems_dtype(x64):
    p = _lq()
    theta = jnp.array([0.05, 0.1], jnp.float32)
    P64 = jnp.eye(2, dtype=jnp.float64)
    got = lq.k_step_hypergradient(p, theta, P64, 0.5, 2)
    want = lq.k_step_hypergradient(p, theta, P64.astype(jnp.float32), 0.5, 2)
    assert got.dtype == jnp.float32
    np.testing.assert_allclose(got, want, rtol=1e-6)
    played, P_next = lq.k_step_response(p, theta, 0.5, P64, 2)
    assert P_next.dtype == jnp.float32 and played.K.dtype == jnp.float32


@pytest.mark.slow
def test_a_strong_float64_beta_or_policy_is_taken_in_the_problems_dtype(x64):
    """With float64 enabled, a strong ``np.float64`` beta beside a float32 problem widened the
    solvers' loop values and broke their carry with a ``TypeError`` (the tabular best response
    and every reference built on it, soft value iteration, soft_newton, the LQ and LQR-game
    best responses and their exact gradients), as a float64 policy did in the LQ as-if-optimal
    reference. Each now computes in the problem's (theta's) dtype, and gives what a weak beta
    gives."""
    from bchg_jax.games import lqr as game_lqr
    from bchg_jax.problems import lqr_game
    from bchg_jax.tabular import exact, follower_references

    p = random_tabular_cmdp(jax.random.key(3), dtype=jnp.float32)
    th = p.theta0
    P, r = p.transition(th), p.follower_reward(th)
    S_, B_ = r.shape
    g = jnp.full((S_, B_), 1.0 / B_, jnp.float32)
    lq_p, lq_th = _lq(), jnp.array([0.05, 0.1], jnp.float32)
    game, game_th = lqr_game(), jnp.array([-1.0, 0.5], jnp.float32)
    calls = {
        "exact_hypergradient": lambda b: exact.exact_hypergradient(p, th, b),
        "best_response": lambda b: exact.best_response(p, th, b).V,
        "k_step_hypergradient": lambda b: follower_references.k_step_hypergradient(
            p, th, jnp.zeros(S_, jnp.float32), b, 2
        ),
        "lag_hypergradient": lambda b: follower_references.lag_hypergradient(p, th, g, b, 0.3),
        "soft_value_iteration": lambda b: tabular.soft_value_iteration(P, r, b, 0.9).V,
        "soft_value_iteration to tol": lambda b: (
            tabular.soft_value_iteration(P, r, b, 0.9, tol=1e-5).V
        ),
        "soft_newton": lambda b: exact.soft_newton(
            P, r, b, 0.9, jnp.ones(S_, jnp.float32), jnp.zeros(S_, jnp.float32)
        ),
        "lq exact_hypergradient": lambda b: lq.exact_hypergradient(lq_p, lq_th, b),
        "lqr game exact_hypergradient": lambda b: game_lqr.exact_hypergradient(game, game_th, b),
    }
    for name, call in calls.items():
        want = call(0.5)
        got = call(np.float64(0.5))
        assert got.dtype == jnp.float32 == want.dtype, name
        np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-7, err_msg=name)
    # the LQ as-if-optimal reference at a float64 policy: the float32 policy's answer
    played, _ = lq.k_step_response(lq_p, lq_th.astype(jnp.float64), 0.5, jnp.eye(2), 2)
    narrow = jax.tree.map(lambda x: x.astype(jnp.float32) if x.dtype == jnp.float64 else x, played)
    got = lq.as_if_optimal_hypergradient(lq_p, lq_th, played, np.float64(0.5))
    want = lq.as_if_optimal_hypergradient(lq_p, lq_th, narrow, 0.5)
    assert got.dtype == jnp.float32
    np.testing.assert_allclose(got, want, rtol=1e-5)


@pytest.mark.slow
def test_a_lag_mix_with_axes_is_refused_traced_or_not():
    """An array ``mix`` broadcast across the policy's columns (rows no longer summing to 1) and
    gave the lag references the gradient of no policy, outside the range of any scalar mix;
    a bool was taken as 1. Several mixes are a vmap."""
    from bchg_jax.games import tabular as game_tabular
    from bchg_jax.problems import toy_game

    p = random_tabular_cmdp(jax.random.key(3))
    th = p.theta0
    S_, B_ = np.shape(p.follower_reward(th))
    g = jnp.full((S_, B_), 1.0 / B_)
    lag = lambda m: tabular.lag_hypergradient(p, th, g, 0.5, m)  # noqa: E731
    game = toy_game()
    S2, A2, B2 = np.shape(game.transition)[:3]
    g2 = jnp.full((S2, A2, B2), 1.0 / B2)
    game_lag = lambda m: game_tabular.lag_hypergradient(  # noqa: E731
        lambda t: jax.nn.softmax(t, -1), jnp.zeros((S2, A2)), game, g2, 0.5, m
    )
    for call, width in ((lag, B_), (game_lag, A2)):
        for bad in (np.full(width, 0.5), np.full((S_, 1), 0.5), np.array([0.5]), True):
            with pytest.raises(ValueError, match="mix .* must be a real scalar"):
                call(bad)
        with pytest.raises(ValueError, match="mix .* must be a real scalar"):
            jax.jit(call)(jnp.full(width, 0.5))
    # several mixes: vmapped, each its own scalar answer
    mixes = jnp.array([0.2, 1.0])
    many = jax.vmap(lag)(mixes)
    for i, m in enumerate(mixes):
        np.testing.assert_allclose(many[i], lag(float(m)), rtol=1e-5, atol=1e-6)


def test_the_tabular_learners_updates_check_their_tables():
    """``q_learning_update`` took a Q with an extra column (it entered every soft next value,
    0.2 off), a step size of -1 or 5 and a NaN table, unsaid; ``k_step_response`` a NaN
    ``V_prev`` (an all-NaN policy), which ``k_step_hypergradient`` refuses."""
    p = _tabular()
    theta = jnp.asarray([0.3, 0.2])
    P, r = p.transition(theta), p.follower_reward(theta)
    batch = tabular.rollout(
        jax.random.key(1), jnp.full((S, B), 0.5), P, p.init_dist(theta), None, None, 2, 5
    )
    Q = jnp.zeros((S, B))
    assert tabular.q_learning_update(Q, batch, r, 0.3, 0.9, 0.5).shape == (S, B)
    for bad_Q, lr, match in (
        (jnp.zeros((S, B + 1)), 0.5, r"Q .* must have shape \(3, 2\)"),
        (jnp.zeros(S * B), 0.5, r"Q .* must be \[S, B\]"),
        (Q, -1.0, r"lr .* \(0, 1\]"),
        (Q, 5.0, r"lr .* \(0, 1\]"),
        (Q.at[0, 0].set(np.nan), 0.5, "Q .* must be finite"),
    ):
        with pytest.raises(ValueError, match=match):
            tabular.q_learning_update(bad_Q, batch, r, 0.3, 0.9, lr)
    V_prev = jnp.zeros(S).at[1].set(np.nan)
    for call in (tabular.k_step_response, tabular.k_step_response.__wrapped__):
        with pytest.raises(ValueError, match="V_prev .* must be finite"):
            call(P, r, 0.3, 0.9, None, V_prev, 2)
