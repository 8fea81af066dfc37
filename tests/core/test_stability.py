"""``core.stability``: an exactly nilpotent closed loop (rho = 0) is stable.

Reference: the eigenvalues (numpy, float64)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from bchg_jax.core.stability import is_discounted_stable, log_spectral_radius

NILPOTENT = [
    np.array([[0.0, 5.0], [0.0, 0.0]]),  # M^2 = 0
    np.array([[0.0, 1.2], [0.0, 0.0]]),
    np.triu(np.arange(1.0, 17.0).reshape(4, 4) * 10.0, 1),  # M^4 = 0, entries up to 150
]


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.float64])
def test_a_zero_power_means_rho_zero(dtype, x64):
    """A squaring that came out exactly zero kept the last partial sum: log||M|| (5 for
    [[0, 5], [0, 0]]), so a closed loop with rho = 0 was called unstable under any discount
    >= 1/25, and the Riccati solve at such a leader gain refused as "not the stabilising
    one". A zero power is rho = 0: -inf, also under jit and vmap."""
    for M in NILPOTENT:
        assert np.max(np.abs(np.linalg.eigvals(M))) == 0.0
        Mj = jnp.asarray(M, dtype)
        assert float(log_spectral_radius(Mj)) == -np.inf
        assert float(jax.jit(log_spectral_radius)(Mj)) == -np.inf
        for gamma in (0.0, 0.5, 0.99):
            assert bool(is_discounted_stable(Mj, gamma))
    batch = jnp.asarray(np.stack([NILPOTENT[0], np.diag([1.2, 0.0]), np.diag([0.5, 0.0])]), dtype)
    got = np.asarray(jax.jit(jax.vmap(log_spectral_radius))(batch))
    assert got[0] == -np.inf
    np.testing.assert_allclose(np.exp(got[1:]), [1.2, 0.5], rtol=1e-6)
    stable = jax.vmap(is_discounted_stable, (0, None))(batch, 0.9)
    assert stable.tolist() == [True, False, True]  # 0.9 * 1.2^2 = 1.3


def test_nearly_nilpotent_matrices_keep_their_bound(x64):
    """Not zero powers: the bound still converges to rho from above."""
    for M in (np.array([[0.0, 5.0], [0.0, 1e-3]]), np.array([[1e-6, 5.0], [0.0, 0.0]])):
        rho = np.max(np.abs(np.linalg.eigvals(M)))
        est = float(np.exp(log_spectral_radius(jnp.asarray(M))))
        assert rho * (1 - 1e-12) <= est <= rho * (1 + 1e-7), (M, rho, est)
