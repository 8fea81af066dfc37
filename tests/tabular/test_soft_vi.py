"""Soft value iteration: fixed point, warm start + tolerance, best-response pytree."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from bchg_jax.problems import fourrooms, random_tabular_cmdp
from bchg_jax.tabular import exact, soft_value_iteration
from bchg_jax.tabular.follower import continuation, soft_q, soft_v


def test_soft_vi_matches_converged_newton_reference(x64):
    prob = random_tabular_cmdp(jax.random.key(0), num_states=6, num_actions=3, dtype=jnp.float64)
    th, beta = prob.theta0, 0.2
    P, r = prob.transition(th), prob.follower_reward(th)
    br = soft_value_iteration(P, r, beta, prob.gamma_F, num_sweeps=400)
    ref = exact.soft_newton(
        P, r, beta, prob.gamma_F, continuation(None, 6, r.dtype), jnp.zeros(6), 40
    )
    np.testing.assert_allclose(br.V, ref, atol=1e-10)
    # the best response is the Boltzmann policy of its own soft Q, rows sum to 1
    np.testing.assert_allclose(br.policy.sum(-1), 1.0, atol=1e-12)
    np.testing.assert_allclose(br.Q, soft_q(P, r, br.V, prob.gamma_F, jnp.ones(6)), atol=1e-10)
    np.testing.assert_allclose(br.V, soft_v(br.Q, beta), atol=1e-12)


def test_warm_start_with_tolerance_gives_the_reference_best_response():
    """Reference: 500 sweeps from zeros. Ours: warm start from a nearby theta + tolerance."""
    prob = fourrooms("reference")
    P, term = prob.transition(prob.theta0), prob.terminal_mask
    x0 = 0.01 * jax.random.normal(jax.random.key(0), (105,))
    x1 = x0 + 0.3 * jax.random.normal(jax.random.key(1), (105,)) / jnp.sqrt(105.0)
    for beta in (1e-3, 5e-3):
        prev = soft_value_iteration(P, prob.follower_reward(x0), beta, 0.99, term, num_sweeps=500)
        ref = soft_value_iteration(P, prob.follower_reward(x1), beta, 0.99, term, num_sweeps=500)
        warm = soft_value_iteration(
            P, prob.follower_reward(x1), beta, 0.99, term, V0=prev.V, tol=1e-6, max_sweeps=3000
        )
        assert int(warm.sweeps) < 300
        np.testing.assert_allclose(warm.V, ref.V, atol=5e-5)
        np.testing.assert_allclose(warm.policy, ref.policy, atol=2e-3)


@pytest.mark.slow
def test_fixed_sweep_mode_counts_sweeps():
    prob = random_tabular_cmdp(jax.random.key(1))
    br = soft_value_iteration(
        prob.transition(prob.theta0),
        prob.follower_reward(prob.theta0),
        0.5,
        prob.gamma_F,
        num_sweeps=7,
    )
    assert int(br.sweeps) == 7


def test_policy_finite_where_q_over_beta_is_huge():
    """float32, |Q| ~ 1e4 at beta 1e-5 (|Q| / beta ~ 1e9): V = beta logsumexp(Q / beta) can
    round below max_b Q, and exp((Q - V) / beta) overflowed to a NaN policy. The Boltzmann
    policy is softmax(Q / beta) whatever the rounding of V."""
    rng = np.random.default_rng(0)
    S, B = 4, 3
    P = jnp.asarray(rng.dirichlet(np.ones(S), size=(S, B)), jnp.float32)
    for _ in range(3):  # three earlier draws: the fourth is a case that overflowed
        rng.normal(size=(S, B))
    r = jnp.asarray(1000.0 * rng.normal(size=(S, B)), jnp.float32)
    br = soft_value_iteration(P, r, 1e-5, 0.9, tol=1e-6, max_sweeps=3000)
    assert float(jnp.abs(br.Q).max()) > 1e3
    assert bool(jnp.all(jnp.isfinite(br.policy)))
    np.testing.assert_allclose(br.policy, jax.nn.softmax(br.Q / 1e-5, axis=-1), atol=1e-6)
    np.testing.assert_allclose(jnp.sum(br.policy, -1), 1.0, atol=1e-6)
