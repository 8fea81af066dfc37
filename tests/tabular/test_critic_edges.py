"""Leader critics (``tabular.critics``) against hand-written references: SARSA's bootstrap at a
time-limit episode end, its visiting order (the key's permutation, scan and triangular solve),
and the critic initialisation's scale."""

import jax
import jax.numpy as jnp
import numpy as np

from bchg_jax.tabular import critics
from bchg_jax.tabular.rollout import Batch


def test_sarsa_does_not_bootstrap_across_a_time_limit_end(x64):
    """An episode end by the time limit (done, not terminal) zeroes SARSA's bootstrap, as a
    terminal step does: (0, 1) ends its episode, so its target is r_L alone, not
    r_L + gamma Q(2, 0) of the next episode's first step."""
    batch = Batch(
        s=jnp.array([[0, 2]]),
        b=jnp.array([[1, 0]]),
        s_next=jnp.array([[2, 1]]),
        t=jnp.array([[4, 0]]),
        terminal=jnp.array([[False, False]]),
        done=jnp.array([[True, False]]),
    )
    Q = jnp.arange(9.0).reshape(3, 3) / 10 + 1.0
    rL = jnp.ones((3, 3))
    for parallel in (False, True):
        out = np.asarray(critics.sarsa_update(jax.random.key(0), Q, batch, rL, 0.9, 0.5, parallel))
        np.testing.assert_allclose(out[0, 1], Q[0, 1] + 0.5 * (1.0 - Q[0, 1]), rtol=1e-12)
        np.testing.assert_allclose(out[2, 0], Q[2, 0] + 0.5 * (1.0 - Q[2, 0]), rtol=1e-12)


def test_sarsa_visits_in_the_keys_permutation(x64):
    """The pass visits the E*T transitions in ``jax.random.permutation(key, E*T)`` order (a
    random order, not the batch's): one stream of 6 steps that all update and read Q(0, 0) and
    Q(0, 1), so the order matters; checked against the sequential loop in that order, and two
    keys give different critics."""
    s = np.zeros((1, 6), int)
    b = np.array([[0, 1, 0, 1, 1, 0]])
    done = np.zeros((1, 6), bool)
    batch = Batch(*map(jnp.asarray, (s, b, s, np.arange(6)[None], done, done)))
    rL = np.array([[1.0, -2.0]])
    Q0 = np.array([[0.4, -0.3]])
    gamma, alpha = 0.9, 0.7
    nb = np.append(b[0, 1:], b[0, -1])
    bt = np.array([1, 1, 1, 1, 1, 0.0])
    outs = []
    for seed in (0, 1):
        key = jax.random.key(seed)
        order = np.asarray(jax.random.permutation(key, 6))
        q = Q0.copy()
        for i in order:
            target = rL[0, b[0, i]] + gamma * bt[i] * q[0, nb[i]]
            q[0, b[0, i]] += alpha * (target - q[0, b[0, i]])
        for parallel in (False, True):
            out = critics.sarsa_update(
                key, jnp.asarray(Q0), batch, jnp.asarray(rL), gamma, alpha, parallel
            )
            np.testing.assert_allclose(out, q, rtol=1e-10)
        outs.append(q)
    assert np.abs(outs[0] - outs[1]).max() > 1e-3


def test_init_tabular_critic_scales_by_std():
    """Entries are std * N(0, 1): std 0 gives a zero table, std 2 twice the std-1 table."""
    key = jax.random.key(3)
    one = critics.init_tabular_critic(key, 4, 3, 1.0)
    assert one.shape == (4, 3)
    np.testing.assert_allclose(critics.init_tabular_critic(key, 4, 3, 0.0), 0.0)
    np.testing.assert_allclose(critics.init_tabular_critic(key, 4, 3, 2.0), 2.0 * one, rtol=1e-6)


def test_benefit_refuses_a_q_with_another_number_of_actions():
    """A Q of 1 action against a 3-action policy broadcasts, but is refused (it gave a
    [S, 3] Benefit of no critic); state_value too."""
    import pytest

    Q, g = jnp.zeros((4, 1)), jnp.full((4, 3), 1 / 3)
    for fn in (critics.benefit, critics.state_value):
        with pytest.raises(ValueError, match="same number of actions"):
            fn(Q, g)
