"""Leader critic: SARSA update rule, Benefit, convergence to the exact Q_L."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from bchg_jax.problems import random_tabular_cmdp
from bchg_jax.tabular import benefit, exact, rollout, sarsa_update, state_value
from bchg_jax.tabular.critics import monte_carlo_critic
from bchg_jax.tabular.rollout import Batch


def test_single_transition_update_and_zero_bootstrap_at_batch_end():
    # one stream, two steps: (0,1) -> (2,0); the last step bootstraps 0 (batch end)
    batch = Batch(
        s=jnp.array([[0, 2]]),
        b=jnp.array([[1, 0]]),
        s_next=jnp.array([[2, 1]]),
        t=jnp.array([[0, 1]]),
        terminal=jnp.array([[False, False]]),
        done=jnp.array([[False, False]]),
    )
    Q = jnp.arange(9.0).reshape(3, 3) / 10
    rL = jnp.ones((3, 3))
    out = sarsa_update(jax.random.key(0), Q, batch, rL, 0.9, 0.5)
    # order is random but the two updates touch different entries and read Q[2,0] / nothing
    q01 = Q[0, 1] + 0.5 * (1.0 + 0.9 * Q[2, 0] - Q[0, 1])
    q20 = Q[2, 0] + 0.5 * (1.0 - Q[2, 0])
    assert np.isclose(out[2, 0], q20)
    assert np.isclose(out[0, 1], q01) or np.isclose(
        out[0, 1], Q[0, 1] + 0.5 * (1.0 + 0.9 * q20 - Q[0, 1])
    )


def test_benefit_has_zero_policy_mean():
    Q = jax.random.normal(jax.random.key(0), (4, 3))
    g = jax.nn.softmax(jax.random.normal(jax.random.key(1), (4, 3)))
    np.testing.assert_allclose(jnp.sum(g * benefit(Q, g), -1), 0.0, atol=1e-6)
    np.testing.assert_allclose(state_value(Q, g) + benefit(Q, g)[:, 0], Q[:, 0], atol=1e-6)


@pytest.mark.slow
def test_sarsa_converges_to_exact_leader_q():
    prob = random_tabular_cmdp(jax.random.key(1), num_states=4, num_actions=2, gamma_L=0.7)
    th = prob.theta0
    br = exact.best_response(prob, th, 1.0)
    _, Q_exact = exact.leader_values(prob, th, br.policy)
    P, rho, rL = prob.transition(th), prob.init_dist(th), prob.leader_reward(th)

    def body(Q, key):
        k1, k2 = jax.random.split(key)
        batch = rollout(k1, br.policy, P, rho, None, None, 1, 400)
        return sarsa_update(k2, Q, batch, rL, prob.gamma_L, 0.02), None

    Q, _ = jax.jit(lambda Q, ks: jax.lax.scan(body, Q, ks))(
        jnp.zeros((4, 2)), jax.random.split(jax.random.key(2), 300)
    )
    np.testing.assert_allclose(Q, Q_exact, atol=0.1)


@pytest.mark.slow
def test_monte_carlo_critic_matches_exact_values():
    from bchg_jax.tabular import monte_carlo_critic

    prob = random_tabular_cmdp(jax.random.key(3), num_states=4, num_actions=2, gamma_L=0.7)
    th = prob.theta0
    br = exact.best_response(prob, th, 1.0)
    V_exact, Q_exact = exact.leader_values(prob, th, br.policy)
    batch = rollout(
        jax.random.key(4), br.policy, prob.transition(th), prob.init_dist(th), None, 60, 400, 60
    )  # 0.7^60 ~ 5e-10: segments are long enough except near the end
    Q, V = monte_carlo_critic(batch, prob.leader_reward(th), prob.gamma_L)
    np.testing.assert_allclose(Q, Q_exact, atol=0.08)
    np.testing.assert_allclose(V, V_exact, atol=0.08)


def test_monte_carlo_returns_stop_at_every_episode_end(x64):
    """Algorithm 9 by explicit loops on a batch whose episodes end by the time limit (done, not
    terminal) inside the batch: no segment return runs into the next episode."""
    rng = np.random.default_rng(1)
    S, B, E, T, gamma, limit = 4, 2, 3, 9, 0.7, 3
    s, b = rng.integers(0, S, (E, T)), rng.integers(0, B, (E, T))
    t = np.tile(np.arange(T) % limit, (E, 1))
    done = t == limit - 1
    rL = rng.normal(size=(S, B))
    batch = Batch(*map(jnp.asarray, (s, b, s, t, np.zeros_like(done), done)))
    Q, V = monte_carlo_critic(batch, jnp.asarray(rL), gamma)
    G = np.zeros((E, T))
    for e in range(E):
        for k in range(T):
            for j in range(k, T):
                G[e, k] += gamma ** (j - k) * rL[s[e, j], b[e, j]]
                if done[e, j]:
                    break
    for st in range(S):
        np.testing.assert_allclose(V[st], G[s == st].mean(), rtol=1e-12)
        for a in range(B):
            m = (s == st) & (b == a)
            np.testing.assert_allclose(Q[st, a], G[m].mean() if m.any() else 0.0, rtol=1e-12)
