"""``core.stability``: the spectral-radius bound is the Gelfand bound with exactly N = 2^squarings
(hand-computed norms of a Jordan block), the default count makes it tight, the stability test is
``gamma rho^2 < 1`` (strict, with the square), no gradient flows through the bound, and a finite
matrix with huge entries keeps its bound (the norm does not overflow).

References: closed-form Frobenius norms of powers of [[1, 1], [0, 1]] and of a scaled rotation."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from bchg_jax.core.stability import is_discounted_stable, log_spectral_radius

JORDAN = np.array([[1.0, 1.0], [0.0, 1.0]])  # J^N = [[1, N], [0, 1]], ||J^N||_F = sqrt(2 + N^2)


@pytest.mark.parametrize("k", [0, 1, 2, 5])
def test_bound_is_log_norm_of_the_2_to_the_k_th_power(k, x64):
    """squarings = k gives log ||M^(2^k)||_F / 2^k exactly (k = 0: log ||M||_F), not the
    bound of one squaring fewer or more, and with the Frobenius norm."""
    N = 2**k
    want = np.log(np.sqrt(2.0 + N**2)) / N
    got = float(log_spectral_radius(jnp.asarray(JORDAN), squarings=k))
    np.testing.assert_allclose(got, want, rtol=1e-12)


def test_default_squarings_make_the_bound_tight(x64):
    """The default N = 2^32: the excess of a Jordan block, log(sqrt(2 + N^2)) / N, is ~5e-9."""
    got = float(log_spectral_radius(jnp.asarray(JORDAN)))
    N = 2.0**32
    np.testing.assert_allclose(got, np.log(np.sqrt(2.0 + N * N)) / N, rtol=1e-6)
    assert 0.0 < got < 1e-8


def test_stability_is_gamma_rho_squared_below_one(x64):
    """gamma rho^2 < 1, not gamma rho < 1: rho = 1.02, gamma = 0.97 (gamma rho = 0.989 but
    gamma rho^2 = 1.009) is unstable; gamma = 0.95 (0.988) is stable. Scaled rotation: the
    eigenvalues are complex, ||F^N||_F = sqrt(2) 1.02^N."""
    a = 0.7
    F = 1.02 * np.array([[np.cos(a), -np.sin(a)], [np.sin(a), np.cos(a)]])
    np.testing.assert_allclose(np.exp(float(log_spectral_radius(jnp.asarray(F)))), 1.02, rtol=1e-8)
    assert not bool(is_discounted_stable(jnp.asarray(F), 0.97))
    assert bool(is_discounted_stable(jnp.asarray(F), 0.95))
    one = jnp.asarray([[1.05]])
    assert not bool(is_discounted_stable(one, 0.95))  # 0.95 * 1.1025 = 1.047
    assert bool(is_discounted_stable(one, 0.9))  # 0.992


@pytest.mark.parametrize("F", [[[1.0]], [[-1.0]], [[1.0, 0.0], [0.0, 0.0]]])
def test_marginal_loop_is_not_stable(F, x64):
    """gamma rho^2 = 1 exactly (rho = 1, gamma = 1; the norms of these powers are exactly 1) is
    not stable: the discounted sums do not converge; the inequality is strict."""
    assert float(log_spectral_radius(jnp.asarray(F))) == 0.0
    assert not bool(is_discounted_stable(jnp.asarray(F), 1.0))


def test_no_gradient_flows_through_the_bound(x64):
    """The docstring: gradients are not propagated (the bound is a test, not an objective)."""
    M = jnp.asarray([[0.5, 0.3], [0.1, 0.8]])
    g = jax.grad(log_spectral_radius)(M)
    assert np.all(np.asarray(g) == 0.0)


def test_a_finite_matrix_with_huge_entries_keeps_its_bound():
    """The norm squared the entries of M first: above ~1.8e19 (float32) it overflowed, a finite
    nilpotent M (rho = 0) gave NaN and was called unstable, and a matrix of 3e38 entries
    (rho = 6e38, log 89.29) gave NaN too."""
    nilpotent = jnp.asarray([[0.0, 2e19], [0.0, 0.0]], jnp.float32)
    assert float(log_spectral_radius(nilpotent)) == -np.inf
    assert bool(is_discounted_stable(nilpotent, 0.9))
    full = jnp.full((2, 2), 3e38, jnp.float32)
    for fn in (log_spectral_radius, jax.jit(log_spectral_radius)):
        np.testing.assert_allclose(float(fn(full)), np.log(6e38), rtol=1e-6)
    assert not bool(is_discounted_stable(full, 0.9))
    scaled = jnp.asarray([[0.9, 0.1], [0.2, 0.7]], jnp.float32) * 1e30  # rho 9.75e29
    np.testing.assert_allclose(float(log_spectral_radius(scaled)), np.log(0.97320508e30), 1e-6)
    bad = jnp.asarray([[np.inf, 0.0], [0.0, 1.0]], jnp.float32)  # non-finite: still NaN
    assert np.isnan(float(log_spectral_radius(bad)))
