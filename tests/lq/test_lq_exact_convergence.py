"""The exact LQ references never return a number from an unconverged Riccati solve: a clear
error for concrete arguments, NaN (value and gradient) under jit / vmap / grad."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from bchg_jax import lq
from bchg_jax.core.maxent_lqr import nan_unless
from bchg_jax.lq import LQConfigurableMDP


def _problem():
    A = jnp.array([[1.05, 0.3], [0.0, 0.9]])
    B = jnp.array([[0.0], [1.0]])
    return LQConfigurableMDP(
        A_fn=lambda th: A * (1 + 0.1 * jnp.tanh(th[0])),
        B_fn=lambda th: B * jnp.exp(0.2 * th[1]),
        U=0.5 * jnp.eye(2),
        Qbar=jnp.eye(2),
        Rbar=jnp.eye(1),
        leader_quadratic=lambda th: (
            jnp.eye(2) * (1 + th[0] ** 2),
            jnp.eye(1) * jnp.exp(th[1]),
            th[0],
        ),
        init_cov=jnp.eye(2),
        gamma_F=0.95,
        gamma_L=0.9,
        theta0=jnp.zeros(2),
        horizon=50,
    ).validate()


def test_nan_unless_makes_the_gradient_nan():
    """jnp.where(ok, x, nan) would give a zero gradient; nan_unless gives NaN, and x itself
    (value and gradient) where ok."""
    f = lambda ok, x: nan_unless(ok, x**2)  # noqa: E731
    assert np.isnan(jax.grad(f, argnums=1)(False, 3.0))
    assert jax.grad(f, argnums=1)(True, 3.0) == 6.0 and f(True, 3.0) == 9.0


@pytest.mark.slow
def test_unconverged_solve_raises_or_is_nan(x64):
    """max_iters=2: the exact gradient was [12.90, -0.61] (converged: [0.82, -2.65]) with no
    flag; now concrete arguments raise and traced ones give NaN."""
    p, th = _problem(), jnp.zeros(2)
    good = lq.exact_hypergradient(p, th, 0.1)
    np.testing.assert_allclose(good, [0.816814996, -2.6523217405], rtol=1e-8)  # tol 1e-13 too
    assert np.isfinite(float(lq.leader_objective(p, th, 0.1)))
    for fn in (lq.leader_objective, lq.exact_hypergradient):
        with pytest.raises(ValueError, match="did not converge"):
            fn(p, th, 0.1, max_iters=2)
        traced = jax.jit(functools.partial(fn, p, beta=0.1, max_iters=2))(th)
        assert np.all(np.isnan(np.asarray(traced)))
