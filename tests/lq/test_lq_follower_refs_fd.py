"""lq.follower_references against central finite differences on a 2-d problem (gamma_F 0.8 !=
gamma_L 0.85), with a finite horizon passed (3) and the infinite one: the K-step reference is
the derivative of J_L(theta, g_K(theta)) at that horizon, and the as-if-optimal reference the
derivative of J_L(theta, g_theta) with g_theta the Boltzmann tilt of an off-best-response
Gaussian g by its own soft Q in M_theta (precision cov^-1 + (2/beta) dH_bb, gain
cov_theta (cov^-1 K + (2/beta) dH_bs), H_bb = Rbar + gamma_F B^T P_g B, H_bs = gamma_F B^T P_g A,
written out here)."""

import jax.numpy as jnp
import numpy as np
import pytest

from bchg_jax.lq import LQConfigurableMDP, leader_objective
from bchg_jax.lq.follower_models import k_step_response, policy_value
from bchg_jax.lq.follower_references import as_if_optimal_hypergradient, k_step_hypergradient

GF, BETA, EPS = 0.8, 0.7, 1e-5


def _problem():
    A = jnp.asarray([[0.6, 0.2], [-0.3, 0.5]])
    B = jnp.asarray([[1.0, 0.2], [0.1, 0.7]])
    Ms = jnp.asarray([[1.0, 0.3], [0.3, 0.5]])
    Mb = jnp.asarray([[0.4, 0.0], [0.0, 0.2]])
    return LQConfigurableMDP(
        A_fn=lambda th: A * (1 + 0.3 * jnp.tanh(th[0])),
        B_fn=lambda th: B * jnp.exp(0.4 * th[1]),
        U=jnp.asarray([[0.5, 0.0], [0.2, 0.4]]),
        Qbar=jnp.asarray([[1.0, 0.1], [0.1, 0.6]]),
        Rbar=jnp.asarray([[0.5, 0.1], [0.1, 0.3]]),
        leader_quadratic=lambda th: (Ms * (1 + th[0] ** 2), Mb * jnp.exp(th[1]), 0.1 + th[0]),
        init_cov=jnp.eye(2),
        gamma_F=GF,
        gamma_L=0.85,
        theta0=jnp.zeros(2),
        horizon=20,
        name="lq_2d_two_gammas",
    ).validate()


def _fd(J, theta):
    return np.array(
        [
            (float(J(theta.at[i].add(EPS))) - float(J(theta.at[i].add(-EPS)))) / (2 * EPS)
            for i in range(theta.shape[0])
        ]
    )


@pytest.mark.parametrize("horizon", [3, None])
def test_k_step_hypergradient_at_a_given_horizon(x64, horizon):
    """d/dtheta J_L^H(theta, g_2(theta)) from P_prev = Qbar, H = 3 or infinite (the default, 20,
    differs from both)."""
    p, theta = _problem(), jnp.asarray([0.2, -0.1])
    P_prev = jnp.asarray(p.Qbar)

    def J(th):
        played, _ = k_step_response(p, th, BETA, P_prev, 2)
        return leader_objective(p, th, BETA, horizon, br=played)

    got = np.asarray(k_step_hypergradient(p, theta, P_prev, BETA, 2, horizon))
    np.testing.assert_allclose(got, _fd(J, theta), rtol=1e-6, atol=1e-8)


def _H(p, th, P):
    A, B = p.A_fn(th), p.B_fn(th)
    return jnp.asarray(p.Rbar) + GF * B.T @ P @ B, GF * B.T @ P @ A


@pytest.mark.parametrize("horizon", [3, None])
def test_as_if_optimal_hypergradient_off_the_best_response(x64, horizon):
    """At a policy that is not the best response (the 1-step learner's gain and covariance,
    moved), the reference is the finite-difference derivative of J_L^H(theta, g_theta), g_theta
    the Boltzmann tilt of g by Q^g_theta - Q^g_theta0 written out from (H_bb, H_bs)."""
    p, theta = _problem(), jnp.asarray([0.2, -0.1])
    played, _ = k_step_response(p, theta, BETA, jnp.zeros((2, 2)), 1)
    cov = jnp.asarray([[0.3, 0.05], [0.05, 0.2]])
    g = played._replace(
        K=jnp.asarray([[0.3, -0.1], [0.2, 0.4]]), cov=cov, chol=jnp.linalg.cholesky(cov)
    )
    prec = jnp.linalg.inv(g.cov)
    P0, _ = policy_value(p, theta, g, BETA)
    Hbb0, Hbs0 = _H(p, theta, P0)

    def J(th):
        P, _ = policy_value(p, th, g, BETA)
        Hbb, Hbs = _H(p, th, P)
        cov_t = jnp.linalg.inv(prec + (2 / BETA) * (Hbb - Hbb0))
        K_t = cov_t @ (prec @ g.K + (2 / BETA) * (Hbs - Hbs0))
        cov_t = 0.5 * (cov_t + cov_t.T)
        return leader_objective(
            p, th, BETA, horizon, br=g._replace(K=K_t, cov=cov_t, chol=jnp.linalg.cholesky(cov_t))
        )

    got = np.asarray(as_if_optimal_hypergradient(p, theta, g, BETA, horizon))
    np.testing.assert_allclose(got, _fd(J, theta), rtol=1e-6, atol=1e-8)
    # and it is not the gradient with the policy held fixed (the tilt matters here)
    fixed = _fd(lambda th: leader_objective(p, th, BETA, horizon, br=g), theta)
    assert np.max(np.abs(got - fixed)) > 1e-3


def test_as_if_optimal_hypergradient_refuses_a_covariance_that_is_none(x64):
    """An eager call checks the policy before its cached program runs (inside it the policy is
    traced and the value checks are skipped): an asymmetric covariance, and a symmetric one
    with a negative eigenvalue, are refused by name, not turned into a gradient."""
    p, theta = _problem(), jnp.asarray([0.2, -0.1])
    played, _ = k_step_response(p, theta, BETA, jnp.zeros((2, 2)), 1)
    for cov, what in (
        (jnp.asarray([[0.3, 0.1], [0.0, 0.2]]), "symmetric"),
        (jnp.asarray([[0.3, 0.0], [0.0, -0.2]]), "definite"),
    ):
        with pytest.raises(ValueError, match=what):
            as_if_optimal_hypergradient(p, theta, played._replace(cov=cov), BETA)
