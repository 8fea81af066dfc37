"""``LQConfigurableMDP``'s pieces written out and its checks at their edges: initial states drawn
with covariance init_cov (L L^T, not L^T L); the transition's Gaussian log-density and mean
A s + B b for a non-symmetric A and U; stabilisability judged under gamma_F; a theta shaped
unlike theta0 refused; ``check_policy_fits`` refusing a singular or asymmetric covariance and a
non-finite gain."""

import types

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from small_problems import lq

from bchg_jax.lq.cmdp import check_policy_fits

A = np.array([[0.5, 0.3], [-0.2, 0.4]])
Bm = np.array([[1.0], [0.5]])
U = np.array([[0.3, 0.0], [0.1, 0.2]])


def test_initial_states_have_the_initial_covariance():
    """200,000 draws, a non-diagonal init_cov [[1, .8], [.8, 1]] (Cholesky factor L: L^T L is
    [[1.64, .48], [.48, .36]]); each covariance entry's SE is ~3e-3."""
    C0 = np.array([[1.0, 0.8], [0.8, 1.0]])
    s0 = np.asarray(lq(init_cov=C0).sample_init(jax.random.key(0), jnp.zeros(1), 200_000))
    np.testing.assert_allclose(s0.mean(0), 0.0, atol=0.02)
    np.testing.assert_allclose(np.cov(s0.T.astype(np.float64)), C0, atol=0.02)


def test_the_transition_is_the_gaussian_written_out(x64):
    p = lq(
        A_fn=lambda th: jnp.asarray(A, th.dtype) * (1.0 + th[0]),
        B_fn=lambda th: jnp.asarray(Bm, th.dtype),
        U=U,
    )
    th = jnp.zeros(1, jnp.float64)
    s, b, s2 = np.array([1.0, -2.0]), np.array([0.7]), np.array([0.4, 0.1])
    mu = A @ s + Bm @ b
    C = U @ U.T
    d = s2 - mu
    want = -0.5 * d @ np.linalg.solve(C, d) - 0.5 * np.log(np.linalg.det(2 * np.pi * C))
    got = float(p.log_transition(th, jnp.asarray(s), jnp.asarray(b), jnp.asarray(s2)))
    np.testing.assert_allclose(got, want, rtol=1e-10)
    mean = p.mean_next(th, jnp.asarray(s), jnp.asarray(b))
    np.testing.assert_allclose(np.asarray(mean), mu, rtol=1e-12)
    # a step is that mean plus noise that does not depend on the state or the action
    key = jax.random.key(3)
    S2, B2 = jnp.asarray([[1.0, -2.0], [0.5, 3.0]]), jnp.asarray([[0.7], [-1.0]])
    moved = np.asarray(p.step(key, th, S2, B2)) - np.asarray(p.step(key, th, 0 * S2, 0 * B2))
    np.testing.assert_allclose(moved, np.asarray(S2) @ A.T + np.asarray(B2) @ Bm.T, atol=1e-12)


def test_stabilisability_is_judged_under_the_followers_discount():
    """Mode 0 (eigenvalue 2) is out of the follower's reach: 0.9 * 4 >= 1 is not stabilisable
    for the follower, though 0.2 * 4 < 1 would be under gamma_L."""
    p = lq(
        A_fn=lambda th: jnp.diag(jnp.array([2.0, 0.5])),
        B_fn=lambda th: jnp.array([[0.0], [1.0]]),
        gamma_L=0.2,
    )
    with pytest.raises(ValueError, match=r"sqrt\(gamma_F\) A\(theta\), B\(theta\)\) is not stab"):
        p.validate()


def test_validate_refuses_a_theta_shaped_unlike_theta0():
    p = lq(A_fn=lambda th: jnp.eye(2) * 0.5 * (1.0 + th[0]))  # reads th[0] of any length
    p.validate(jnp.zeros(1))
    with pytest.raises(ValueError, match=r"theta must be shaped like theta0 \(1,\), got \(2,\)"):
        p.validate(jnp.zeros(2))


def test_check_policy_fits_refuses_a_bad_covariance_or_gain():
    p = lq(
        B_fn=lambda th: jnp.eye(2),
        Rbar=np.eye(2),
        leader_quadratic=lambda th: (jnp.eye(2), jnp.eye(2), jnp.zeros(())),
    )

    def policy(K, cov):
        return types.SimpleNamespace(K=jnp.asarray(K), cov=jnp.asarray(cov))

    check_policy_fits(p, policy(np.eye(2) * 0.1, np.eye(2) * 0.5))
    with pytest.raises(ValueError, match=r"cov must be positive definite.*smallest eigenvalue 0"):
        check_policy_fits(p, policy(np.eye(2) * 0.1, np.ones((2, 2))))
    with pytest.raises(ValueError, match=r"cov must be a finite symmetric matrix"):
        check_policy_fits(p, policy(np.eye(2) * 0.1, np.array([[1.0, 0.5], [0.0, 1.0]])))
    with pytest.raises(ValueError, match=r"policy.K \(the follower's gain\) must be finite"):
        check_policy_fits(p, policy(np.array([[np.nan, 0.0], [0.0, 0.1]]), np.eye(2)))
