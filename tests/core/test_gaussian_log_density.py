"""The one Gaussian log-density behind the follower, transition and leader scores.

``core.maxent_lqr.gaussian_log_density`` is checked against a dense reference (float64), and
each of its four callers is checked to keep a float32 run's densities in float32 under
``jax_enable_x64``: before, each added ``k log(2 pi)`` as a numpy float64, which promoted the
density, and so the score and everything after it, to float64.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from bchg_jax import lq
from bchg_jax.core.maxent_lqr import gaussian_log_density
from bchg_jax.games import lqr
from bchg_jax.problems.lqr_game import lqr_game
from bchg_jax.problems.thermal import thermal


def _reference(L, d):
    """log N(d; 0, L L^T) from the dense covariance."""
    cov = L @ L.T
    k = L.shape[0]
    quad = np.einsum("...i,ij,...j->...", d, np.linalg.inv(cov), d)
    return -0.5 * (quad + k * np.log(2 * np.pi) + np.linalg.slogdet(cov)[1])


@pytest.mark.parametrize("k", [1, 3])
def test_matches_the_dense_density_for_either_sign_of_the_diagonal(k):
    rng = np.random.default_rng(k)
    L = np.tril(rng.normal(size=(k, k))) + np.diag(rng.choice([-2.0, 2.0], k))
    d = rng.normal(size=(4, 5, k))
    with jax.enable_x64(True):
        got = np.asarray(gaussian_log_density(jnp.asarray(L), jnp.asarray(d)))
    assert got.shape == (4, 5)
    np.testing.assert_allclose(got, _reference(L, d), rtol=1e-12, atol=1e-12)


def _densities():
    """Each caller's log-densities at float32 inputs."""
    f32 = jnp.float32
    p = thermal()
    theta = jnp.asarray(p.theta0, f32)
    s = jnp.ones((3, p.state_dim), f32)
    b = jnp.ones((3, p.action_dim), f32)
    game = lqr_game(U=np.array([[0.3]]))
    th_game = jnp.array([-3.0, 0.5], f32)
    gs, ga, gb = jnp.ones((3, 2), f32), jnp.ones((3, 1), f32), jnp.ones((3, 1), f32)
    return {
        "lq best response": lq.best_response(p, theta, 0.5).log_prob(s, b),
        "lq transition": p.log_transition(theta, s, b, s),
        "game follower": lqr.best_response(game, th_game, 0.1).log_prob(gs, ga, gb),
        "game leader": lqr.leader_log_prob(game, th_game, gs, ga),
    }


@pytest.mark.slow
def test_a_float32_density_stays_float32_under_x64():
    off = _densities()
    with jax.enable_x64(True):
        on = _densities()
    for name in off:
        assert on[name].dtype == jnp.float32, f"{name}: {on[name].dtype} under x64"
        np.testing.assert_array_equal(np.asarray(off[name]), np.asarray(on[name]), err_msg=name)
