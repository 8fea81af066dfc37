"""The tabular as-if-optimal reference in float32, near gamma_F = 1 at a small beta.

Its Boltzmann policy ``softmax(log g + (Q - sg(Q)) / beta)`` carries the tangent dQ / beta,
whose part common to a row (~ 1 / ((1 - gamma_F) beta)) a plain softmax leaked off the float32
simplex: 1.6% off the float64 reference here at gamma_F 0.999, beta 0.02 (3.5%, 12% on single
components, on other random CMDPs), with no warning. ``core.softmax.follower_softmax`` centres
that tangent.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from bchg_jax.core.softmax import follower_softmax
from bchg_jax.tabular import follower_models as fm
from bchg_jax.tabular import follower_references as refs
from bchg_jax.tabular.cmdp import TabularCMDP


def _cmdp(dtype, gamma_F, S=5, B=3, D=4, seed=1):
    """A random CMDP whose tables are drawn once in float64 and cast (the same problem in
    either dtype; theta moves the transitions and both rewards)."""
    rng = np.random.default_rng(seed)
    W = [jnp.asarray(rng.normal(size=s), dtype) for s in ((S, B, S, D), (S, B, S), (S, B, D))]
    b = [jnp.asarray(rng.normal(size=s), dtype) for s in ((S, B), (S, B, D), (S, B))]
    Wp, bp, WF = W
    bF, WL, bL = b
    return TabularCMDP(
        transition=lambda th: jax.nn.softmax(Wp @ th + bp, axis=-1),
        init_dist=lambda th: jnp.full((S,), 1.0 / S, th.dtype),
        follower_reward=lambda th: jnp.tanh(WF @ th + bF),
        leader_reward=lambda th: jnp.tanh(WL @ th + bL),
        leader_regularizer=lambda th: -0.05 * jnp.sum(th**2),
        gamma_F=gamma_F,
        gamma_L=0.99,
        theta0=jnp.asarray(0.5 * rng.normal(size=D), dtype),
        name="random",
    )


@pytest.mark.parametrize("gamma_F, beta", [(0.999, 0.02), (0.999, 0.05), (0.995, 0.02)])
@pytest.mark.slow
def test_float32_as_if_reference_matches_float64(x64, gamma_F, beta):
    p64, p32 = _cmdp(jnp.float64, gamma_F), _cmdp(jnp.float32, gamma_F)
    theta = p64.theta0
    P, r = p64.transition(theta), p64.follower_reward(theta)
    # a follower one backup away from zero values: far from its best response
    g = fm.k_step_response(P, r, beta, gamma_F, p64.terminal, jnp.zeros(5), 1).policy
    want = np.asarray(refs.as_if_optimal_hypergradient(p64, theta, g, beta))
    got = refs.as_if_optimal_hypergradient(
        p32, theta.astype(jnp.float32), g.astype(jnp.float32), beta
    )
    assert got.dtype == jnp.float32
    err = np.max(np.abs(np.asarray(got, np.float64) - want)) / np.max(np.abs(want))
    assert err < 1e-3, err  # was 1.6e-2 / 9.6e-3 / 3.1e-3, now 6.3e-6 / 2.0e-5 / 5.4e-6


def test_follower_softmax_is_softmax_with_its_exact_derivative(x64):
    z = jnp.asarray(np.random.default_rng(0).normal(size=(4, 3)))
    dz = jnp.asarray(np.random.default_rng(1).normal(size=(4, 3)))
    val, tan = jax.jvp(follower_softmax, (z,), (dz,))
    want_val, want_tan = jax.jvp(lambda x: jax.nn.softmax(x, -1), (z,), (dz,))
    np.testing.assert_allclose(val, want_val, rtol=1e-15)
    np.testing.assert_allclose(tan, want_tan, rtol=1e-12, atol=1e-15)
