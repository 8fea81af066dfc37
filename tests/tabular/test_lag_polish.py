"""``tabular.follower_references.lag_hypergradient`` with ``V_star``: the given fixed point is
polished by exactly ``POLISHED_SWEEPS`` soft sweeps before its residual is checked.

With no terminal state a uniform shift ``V_F + delta`` has soft Bellman residual
``(1 - gamma_F) delta``, and k sweeps leave ``(1 - gamma_F) gamma_F^k delta``: a tolerance
between the unpolished and the polished residual separates a polished solve from an
unpolished one."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from bchg_jax.problems import random_tabular_cmdp
from bchg_jax.tabular import exact
from bchg_jax.tabular import follower_references as refs

BETA = 0.5


def _problem():
    prob = random_tabular_cmdp(
        jax.random.key(3), num_states=5, num_actions=3, dim=4, dtype=jnp.float64
    )
    theta = prob.theta0 + 0.3 * jax.random.normal(jax.random.key(1), prob.theta0.shape)
    return prob, theta


@pytest.mark.slow
def test_lag_v_star_is_polished_by_three_sweeps(x64):
    """A shifted V_star passes a tolerance that only its 3-sweep polished residual meets, and
    is refused by one just below that residual; the result stays near the cold gradient."""
    prob, theta = _problem()
    assert prob.terminal is None and refs.POLISHED_SWEEPS == 3
    g = prob.gamma_F
    previous = jax.nn.softmax(jax.random.normal(jax.random.key(5), (5, 3)), -1)
    V = exact.best_response(prob, theta, BETA).V
    delta = 1e-3
    unpolished = (1 - g) * delta  # 1.5e-4
    polished = (1 - g) * g**3 * delta  # 9.2e-5
    tol_ok = 0.5 * (unpolished + polished)
    got = refs.lag_hypergradient(prob, theta, previous, BETA, 0.7, V_star=V + delta, tol=tol_ok)
    cold = np.asarray(refs.lag_hypergradient(prob, theta, previous, BETA, 0.7))
    np.testing.assert_allclose(got, cold, rtol=0, atol=1e-2 * np.abs(cold).max())
    with pytest.raises(ValueError, match="missed its tolerance"):
        refs.lag_hypergradient(
            prob, theta, previous, BETA, 0.7, V_star=V + delta, tol=0.9 * polished
        )
