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
