"""Rollout draws (``tabular.rollout``): a row a little below 1 is drawn in proportion (never its
zero-probability entry), a reset is drawn independently of the step's next state, and the
``Batch`` helpers (``flat`` order, ``num_episodes``) do what they document."""

import jax
import jax.numpy as jnp
import numpy as np

from bchg_jax.tabular import rollout
from bchg_jax.tabular.rollout import Batch


def test_a_row_summing_below_one_never_draws_its_zero_entry():
    """float32 policy rows (0.99991, 0) sum 9e-5 below 1 (inside the row tolerance): the draw is
    scaled by the row's total, so action 1 (probability 0) is never drawn, by the scan or the
    parallel form. Unscaled, every uniform above 0.99991 drew it (~18 of these 200,000 draws)."""
    pol = jnp.array([[0.99991, 0.0], [0.99991, 0.0]], jnp.float32)
    P = jnp.full((2, 2, 2), 0.5, jnp.float32)
    rho = jnp.array([0.5, 0.5], jnp.float32)
    for parallel in (False, True):
        b = rollout(jax.random.key(0), pol, P, rho, None, None, 4000, 50, parallel=parallel)
        assert not np.any(np.asarray(b.b) == 1), parallel


def test_a_reset_is_independent_of_the_steps_next_state():
    """Time limit 1 (every step ends its episode) and transition rows equal to rho_0 = (1/2,
    1/2): the state after the reset must be independent of the step's sampled ``s_next`` (the
    Q-learner bootstraps from it at a cut), so they agree about half the time, not always (as
    when the reset reuses the next-state draw's uniform)."""
    rho = jnp.array([0.5, 0.5])
    P = jnp.broadcast_to(rho, (2, 2, 2))
    b = rollout(jax.random.key(1), jnp.full((2, 2), 0.5), P, rho, None, 1, 500, 20)
    same = np.asarray(b.s)[:, 1:] == np.asarray(b.s_next)[:, :-1]
    assert abs(same.mean() - 0.5) < 0.05, same.mean()  # 9,500 pairs: SE 0.005


def test_batch_flat_is_stream_major():
    """``Batch.flat`` flattens [E, T] stream by stream: entry e * T + t is (e, t)."""
    x = jnp.arange(6).reshape(2, 3)
    flat = Batch(x, x, x, x, x > 2, x > 4).flat()
    np.testing.assert_array_equal(flat.s, [0, 1, 2, 3, 4, 5])
    np.testing.assert_array_equal(flat.done, [False] * 5 + [True])


def test_num_episodes_counts_done_steps_at_least_one():
    """``num_episodes`` = max(sum(done), 1): episode ends by time limit count (not only
    terminal steps), and a batch with none gives 1."""
    z = jnp.zeros((2, 3), int)
    done = jnp.array([[False, True, False], [True, False, True]])
    assert float(Batch(z, z, z, z, jnp.zeros((2, 3), bool), done).num_episodes) == 3.0
    none = jnp.zeros((2, 3), bool)
    assert float(Batch(z, z, z, z, none, none).num_episodes) == 1.0


def test_the_start_state_is_independent_of_the_first_action():
    """rho_0 = (1/2, 1/2) and every policy row (1/2, 1/2): over 2,000 keys (one stream, one
    step each) the start state and the first action agree about half the time. Drawing the
    start state from the step uniforms' key made them the same number (JAX's partitionable
    threefry: the first entries of both draws coincide), so they always agreed."""
    rho = jnp.array([0.5, 0.5])
    pol = jnp.full((2, 2), 0.5)
    P = jnp.full((2, 2, 2), 0.5)
    keys = jax.random.split(jax.random.key(7), 2000)
    b = jax.vmap(lambda k: rollout(k, pol, P, rho, None, None, 1, 1))(keys)
    same = np.asarray(b.s[:, 0, 0] == b.b[:, 0, 0])
    assert abs(same.mean() - 0.5) < 0.06, same.mean()  # SE 0.011
