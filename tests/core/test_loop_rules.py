"""``core.loop``'s outer loop and its checks: ``train`` runs exactly ``config.iterations``
iterations; a key that is not a PRNG key (an int, a uint32 array not shaped [..., 2]), a vector
hyperparameter of one run and a beta that float32 rounds to 0 are refused before anything
runs; an all-zero gradient has norm 0 and is left as it is by the clip and the ascent step."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from bchg_jax import problems, tabular
from bchg_jax.core.loop import check_key, clip_by_global_norm, global_norm, sgd_ascent

HP = tabular.HParams(lr=0.1, sarsa_alpha=0.5, beta=0.3)


def _trainer(iterations):
    cmdp = problems.random_tabular_cmdp(jax.random.key(0), num_states=3, num_actions=2)
    config = tabular.TrainConfig(num_envs=2, num_steps=4, iterations=iterations)
    return tabular.make_train(cmdp, "bchg", config)


def test_train_runs_exactly_the_configured_iterations_and_checks_its_inputs():
    tr = _trainer(3)
    _, m = tr.train(jax.random.key(0), HP)
    assert np.shape(m["J"]) == (3,) and np.shape(m["solve_capped"]) == (3,)
    with pytest.raises(
        ValueError, match=r"key must be a PRNG key such as jax.random.key\(0\), got 0"
    ):
        tr.train(0, HP)
    with pytest.raises(ValueError, match="key must be a PRNG key"):
        tr.init(3, HP)
    with pytest.raises(ValueError, match=r"scalars, got shapes \{'lr': \(2,\)\}"):
        tr.train(jax.random.key(0), HP._replace(lr=np.array([0.1, 0.2])))
    with pytest.raises(ValueError, match="1e-46"):  # > 0 in float64, 0 in float32
        tr.train(jax.random.key(0), HP._replace(beta=1e-46))


def test_a_raw_key_is_uint32_shaped_two():
    check_key(jax.random.PRNGKey(0))
    check_key(jax.random.key(0))
    for bad in (np.zeros(3, np.uint32), np.uint32(7)):
        with pytest.raises(ValueError, match="PRNG key"):
            check_key(bad)


def test_a_zero_gradient_has_norm_zero_and_moves_nothing():
    """Not NaN: a non-finite grad_norm would read as a non-finite gradient (update skipped)."""
    g = {"a": jnp.zeros(3, jnp.float32), "b": jnp.zeros((2, 2), jnp.float32)}
    assert float(global_norm(g)) == 0.0
    out = clip_by_global_norm(1.0).update(g, optax.EmptyState())[0]
    assert all(np.all(np.asarray(x) == 0) for x in out.values())
    np.testing.assert_array_equal(sgd_ascent(jnp.ones(2), jnp.zeros(2), 0.1, 1.0), [1.0, 1.0])


def test_segment_sums_written_out():
    """The segment scans by hand (the adjoint test passes a bug common to both): suffix sums
    G_t = x_t + gamma G_t+1 cut at episode ends, forward sums restarted at episode starts,
    group means and their regrouping onto other visits (0 where a group was not seen)."""
    from bchg_jax.core.segments import (
        discounted_suffix_sum,
        forward_discounted_sum,
        group_mean,
        regroup,
    )

    x = jnp.array([[1.0, 2.0, 3.0, 4.0], [1.0, 1.0, 1.0, 1.0]])
    done = jnp.array([[False, True, False, False], [False, False, False, True]])
    # row 0: G3 = 4, G2 = 3 + .5 * 4, G1 = 2 (its episode ends), G0 = 1 + .5 * 2
    want = [[2.0, 2.0, 5.0, 4.0], [1.875, 1.75, 1.5, 1.0]]
    np.testing.assert_allclose(discounted_suffix_sum(x, 0.5, done), want, rtol=1e-6)
    # O0 = 1, O1 = 2 + .5 * 1, O2 = 3 (a new episode), O3 = 4 + .5 * 3
    got = forward_discounted_sum(x[:1], 0.5, done[:1])
    np.testing.assert_allclose(got, [[1.0, 2.5, 3.0, 5.5]])
    w = jnp.array([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]])
    group = jnp.array([[0, 1, 0], [2, 0, 1]])
    # group 0: (1 + 3 + 5) / 3, group 1: (2 + 6) / 2, group 2: 4
    np.testing.assert_allclose(group_mean(w, group, 4), [[3.0, 4.0, 3.0], [4.0, 3.0, 4.0]])
    target = jnp.array([[1, 1, 3, 2]])
    np.testing.assert_allclose(regroup(w, group, target, 4), [[4.0, 4.0, 0.0, 4.0]])
