"""lq.follower_models against hand references in numpy on a 2-d problem (gamma_F 0.8 !=
gamma_L 0.85): the K-step learner's first two steps from P = 0 (played gain and covariance,
next value matrix), V^g of a policy that is no best response (the discounted Lyapunov equation
by Kronecker solve and the constant of the docstring), observed_follower's value, gain_gap, and
the refusals of a bad P_prev and of K = 0."""

import jax.numpy as jnp
import numpy as np
import pytest

from bchg_jax.lq import LQConfigurableMDP
from bchg_jax.lq.follower_models import (
    check_value_matrix,
    gain_gap,
    k_step_response,
    observed_follower,
    policy_value,
)

GF, BETA = 0.8, 0.7
_A = np.array([[0.6, 0.2], [-0.3, 0.5]])
_B = np.array([[1.0, 0.2], [0.1, 0.7]])
_U = np.array([[0.5, 0.0], [0.2, 0.4]])
_Q = np.array([[1.0, 0.1], [0.1, 0.6]])
_R = np.array([[0.5, 0.1], [0.1, 0.3]])


def _problem():
    A, B = jnp.asarray(_A), jnp.asarray(_B)
    return LQConfigurableMDP(
        A_fn=lambda th: A * (1 + 0.1 * th[0]),
        B_fn=lambda th: B * (1 + 0.1 * th[1]),
        U=jnp.asarray(_U),
        Qbar=jnp.asarray(_Q),
        Rbar=jnp.asarray(_R),
        leader_quadratic=lambda th: (jnp.eye(2), jnp.eye(2), 0.0 * th[0]),
        init_cov=jnp.eye(2),
        gamma_F=GF,
        gamma_L=0.85,
        theta0=jnp.zeros(2),
        horizon=20,
        name="lq_2d_two_gammas",
    ).validate()


def _riccati(P):
    S = _R + GF * _B.T @ P @ _B
    return _Q + GF * _A.T @ P @ _A - GF**2 * _A.T @ P @ _B @ np.linalg.solve(S, _B.T @ P @ _A)


def _response(P):
    S = _R + GF * _B.T @ P @ _B
    return GF * np.linalg.solve(S, _B.T @ P @ _A), 0.5 * BETA * np.linalg.inv(S)


@pytest.mark.parametrize("K", [1, 2, 3])
def test_k_step_response_by_hand(x64, K):
    """K Riccati steps from P = 0: the policy played is the Boltzmann policy of P_{K-1}
    (gain g S^-1 B^T P A, covariance beta/2 S^-1) and the learner keeps P_K (one step more or
    less, or P_{K-1} kept, differ)."""
    p, theta = _problem(), jnp.zeros(2)
    played, P_next = k_step_response(p, theta, BETA, jnp.zeros((2, 2)), K)
    P = np.zeros((2, 2))
    for _ in range(K - 1):
        P = _riccati(P)
    gain, cov = _response(P)
    np.testing.assert_allclose(np.asarray(played.K), gain, rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(np.asarray(played.cov), cov, rtol=1e-10)
    np.testing.assert_allclose(np.asarray(P_next), _riccati(P), rtol=1e-10)


def test_k_step_response_refuses_zero_steps(x64):
    """K = 0 is refused (fori_loop(0, -1) would silently play the policy of P_prev)."""
    with pytest.raises(ValueError, match="K \\(Riccati steps\\)"):
        k_step_response(_problem(), jnp.zeros(2), BETA, jnp.zeros((2, 2)), 0)


def _off_policy(p):
    br, _ = k_step_response(p, jnp.zeros(2), BETA, jnp.zeros((2, 2)), 2)
    K = jnp.asarray([[0.3, -0.1], [0.2, 0.4]])
    cov = jnp.asarray([[0.3, 0.05], [0.05, 0.2]])
    return br._replace(K=K, cov=cov, chol=jnp.linalg.cholesky(cov))


def _hand_value(K, cov, beta):
    F = _A - _B @ K
    rhs = _Q + K.T @ _R @ K
    # P = rhs + g F^T P F  <=>  (I - g F^T (x) F^T) vec(P) = vec(rhs)
    P = np.linalg.solve(np.eye(4) - GF * np.kron(F.T, F.T), rhs.reshape(-1)).reshape(2, 2)
    entropy = 0.5 * (2 * np.log(2 * np.pi * np.e) + np.log(np.linalg.det(cov)))
    c = (
        np.trace(_R @ cov)
        - beta * entropy
        + GF * np.trace(_B.T @ P @ _B @ cov)
        + GF * np.trace(_U.T @ P @ _U)
    ) / (1 - GF)
    return P, c


def test_policy_value_of_an_off_policy_by_hand(x64):
    """V^g of N(-K s, cov) off the best response, at theta = 0 (A, B as given): P_g solves
    P = Qbar + K^T R K + gamma_F F^T P F (Kronecker solve) and c_g is the docstring's constant
    with the entropy of an m = 2 Gaussian, all under gamma_F (gamma_L differs)."""
    p = _problem()
    pol = _off_policy(p)
    P, c = policy_value(p, jnp.zeros(2), pol, BETA)
    P_ref, c_ref = _hand_value(np.asarray(pol.K), np.asarray(pol.cov), BETA)
    np.testing.assert_allclose(np.asarray(P), P_ref, rtol=1e-10)
    np.testing.assert_allclose(float(c), c_ref, rtol=1e-10)


def test_observed_follower_carries_v_g(x64):
    """observed_follower replaces both P and v by policy_value's, keeping K and cov."""
    p = _problem()
    pol = _off_policy(p)
    view = observed_follower(p, jnp.zeros(2), pol, BETA)
    P_ref, c_ref = _hand_value(np.asarray(pol.K), np.asarray(pol.cov), BETA)
    np.testing.assert_allclose(np.asarray(view.P), P_ref, rtol=1e-10)
    np.testing.assert_allclose(float(view.v), c_ref, rtol=1e-10)
    np.testing.assert_array_equal(np.asarray(view.K), np.asarray(pol.K))
    np.testing.assert_array_equal(np.asarray(view.cov), np.asarray(pol.cov))


def test_gain_gap_is_the_largest_entry(x64):
    """gain_gap is max |K - K'| (not a mean or a norm)."""
    p = _problem()
    pol = _off_policy(p)
    other = pol._replace(K=pol.K + jnp.asarray([[0.0, 0.5], [-0.1, 0.0]]))
    assert float(gain_gap(pol, other)) == pytest.approx(0.5, rel=1e-12)


@pytest.mark.parametrize(
    "P_prev, says",
    [
        (-np.eye(2), "positive semi-definite"),
        (np.array([[1.0, 0.0], [0.0, -0.01]]), "positive semi-definite"),
        (np.array([[1.0, 0.3], [0.0, 1.0]]), "symmetric"),
        (np.array([[1.0, np.nan], [np.nan, 1.0]]), "finite symmetric"),
    ],
)
def test_check_value_matrix_refuses(x64, P_prev, says):
    """A P_prev that is indefinite (V = s^T s: a sign slip), asymmetric or not finite is refused
    by name; a PSD one passes."""
    p = _problem()
    with pytest.raises(ValueError, match=says):
        check_value_matrix(p, jnp.asarray(P_prev))
    check_value_matrix(p, jnp.asarray([[1.0, 0.3], [0.3, 0.5]]))
    check_value_matrix(p, jnp.zeros((2, 2)))
