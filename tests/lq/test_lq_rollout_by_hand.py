"""lq.rollout against a batch known in advance: with a deterministic step and a deterministic
policy every record is fixed (s_{t+1} = step(s_t, b_t), b_t the policy's action at s_t, time
on axis 1), ``Trajectories.horizon`` / ``num_episodes`` are T and E, and a count below 1 is
refused."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from bchg_jax.lq.rollout import rollout

N, M = 2, 1


class _Deterministic:
    """A generic configurable MDP (no ``stepper``): s' = theta[0] s + b 1^T, s_0 ~ N(0, I)."""

    theta0 = jnp.zeros(1, jnp.float32)

    def sample_init(self, key, theta, num):
        return jax.random.normal(key, (num, N), theta.dtype)

    def step(self, key, theta, s, b):
        return theta[0] * s + jnp.broadcast_to(b, s.shape)


class _Gain:
    """A deterministic linear policy ``b = -K s`` (only ``sample`` is used)."""

    K = None  # no gain to check against the problem

    def __init__(self, K):
        self._K = K

    def sample(self, key, s):
        return -s @ self._K.T


def test_lq_rollout_records_the_chain_by_hand():
    """s_{t+1} = step(s_t, b_t) and b_t = policy(s_t) for t = 0..T, b_T sampled at s_T, s and b
    [E, T+1, .] (an action of the previous state, or the states before each step recorded,
    break the chain)."""
    E, T = 3, 6
    problem, theta = _Deterministic(), jnp.asarray([0.5], jnp.float32)
    K = jnp.asarray([[0.3, -0.2]], jnp.float32)
    traj = rollout(jax.random.key(0), problem, theta, _Gain(K), E, T)
    s, b = np.asarray(traj.s), np.asarray(traj.b)
    assert s.shape == (E, T + 1, N) and b.shape == (E, T + 1, M)
    want = np.zeros_like(s)
    want[:, 0] = s[:, 0]
    Kn = np.asarray(K)
    for t in range(T):
        want[:, t + 1] = 0.5 * want[:, t] + (-want[:, t] @ Kn.T)
    np.testing.assert_allclose(s, want, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(b, -want @ Kn.T, rtol=1e-5, atol=1e-6)
    assert np.all(np.abs(s[:, 0]) > 0)  # s_0 drawn, not zeros
    assert not np.allclose(s[:, 1], s[:, 0])


def test_lq_trajectories_horizon_and_num_episodes():
    """Trajectories.horizon is T (s has T+1 states) and num_episodes E: the estimators divide
    and discount by them."""
    problem, theta = _Deterministic(), jnp.asarray([0.5], jnp.float32)
    traj = rollout(jax.random.key(0), problem, theta, _Gain(jnp.ones((M, N))), 3, 6)
    assert traj.horizon == 6
    assert traj.num_episodes == 3


@pytest.mark.parametrize("num_episodes, horizon", [(0, 4), (3, 0), (3, -1), (2.0, 4)])
def test_lq_rollout_refuses_a_count_below_one(num_episodes, horizon):
    """num_episodes / horizon must be positive integers (a horizon of 0 returned s_0 alone)."""
    problem, theta = _Deterministic(), jnp.asarray([0.5], jnp.float32)
    with pytest.raises(ValueError, match="must be a positive integer"):
        rollout(jax.random.key(0), problem, theta, _Gain(jnp.ones((M, N))), num_episodes, horizon)
