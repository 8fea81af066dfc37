"""Shared problems of the LQ tests."""

import jax.numpy as jnp
import numpy as np
import pytest

from bchg_jax.lq import LQConfigurableMDP


def _random_lq(dtype=jnp.float64):
    """A random 2-d linear-Gaussian configurable MDP (the problem of docs/experiments.md's
    critic table), T = 60."""
    rng = np.random.default_rng(5)
    n = m = 2
    A = jnp.asarray(rng.normal(size=(n, n)) * 0.6, dtype)
    B = jnp.asarray(rng.normal(size=(n, m)), dtype)
    Ms = jnp.asarray([[1.0, 0.3], [0.3, 0.5]], dtype)
    Mb = jnp.asarray([[0.4, 0.0], [0.0, 0.2]], dtype)
    return LQConfigurableMDP(
        A_fn=lambda th: A * (1 + 0.1 * jnp.tanh(th[0])),
        B_fn=lambda th: B * jnp.exp(0.2 * th[1]),
        U=jnp.asarray([[0.5, 0.0], [0.2, 0.4]], dtype),
        Qbar=jnp.eye(n, dtype=dtype),
        Rbar=0.5 * jnp.eye(m, dtype=dtype),
        leader_quadratic=lambda th: (Ms * (1 + th[0] ** 2), Mb * jnp.exp(th[1]), 0.1 + th[0]),
        init_cov=jnp.eye(n, dtype=dtype),
        gamma_F=0.8,
        gamma_L=0.85,
        theta0=jnp.zeros(2, dtype),
        horizon=60,
    ).validate()


@pytest.fixture
def random_lq():
    """``random_lq(dtype=float64)``: a random 2-d linear-Gaussian configurable MDP whose
    dynamics A, B and leader reward depend on theta [2], T = 60."""
    return _random_lq
