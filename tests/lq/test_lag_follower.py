"""The LQ ``lag`` follower: its policy (gain and covariance moved the share ``mix`` toward the
best response), its exact reference through that step against finite differences and, at
``mix = 1``, the exact hypergradient (the thermal trainer with it, and BC-HG's estimate under
it against the two references: ``test_k_step_follower.py``)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from bchg_jax import lq
from bchg_jax.lq.follower_models import first_policy, lag_response
from bchg_jax.lq.follower_references import lag_hypergradient

BETA, MIX, EPS = 0.7, 0.3, 1e-6


def test_lag_policy_is_the_parameter_mix_and_a_gaussian(x64, random_lq):
    """K and cov are the convex sums (written out), the covariance stays symmetric positive
    definite with its Cholesky factor and S = (beta / 2) cov^-1; mix = 1 is the best response;
    the first policy is that of the value 0 (gain 0, cov = (beta / 2) Rbar^-1)."""
    p, theta = random_lq(), jnp.asarray([0.2, -0.1])
    best = p.best_response(theta, BETA, tol=1e-13)
    prev = first_policy(p, BETA, jnp.float64)
    np.testing.assert_allclose(prev.K, 0.0)
    np.testing.assert_allclose(prev.cov, 0.5 * BETA * np.linalg.inv(np.asarray(p.Rbar)))
    lag = lag_response(best, prev, MIX, BETA)
    np.testing.assert_allclose(lag.K, (1 - MIX) * prev.K + MIX * best.K, rtol=1e-12)
    np.testing.assert_allclose(lag.cov, (1 - MIX) * prev.cov + MIX * best.cov, rtol=1e-12)
    np.testing.assert_allclose(lag.chol @ lag.chol.T, lag.cov, rtol=1e-12)
    np.testing.assert_allclose(lag.S, 0.5 * BETA * np.linalg.inv(np.asarray(lag.cov)), rtol=1e-10)
    assert np.all(np.linalg.eigvalsh(np.asarray(lag.cov)) > 0)
    same = lag_response(best, prev, 1.0, BETA)
    np.testing.assert_allclose(same.K, best.K, rtol=1e-12)
    np.testing.assert_allclose(same.cov, best.cov, rtol=1e-12)


@pytest.mark.parametrize("horizon", [3, pytest.param(None, marks=pytest.mark.slow)])
def test_lag_hypergradient_matches_finite_differences(x64, random_lq, horizon):
    """d/dtheta J_L^H(theta, lag(g_prev, g^{theta dagger})) with g_prev held fixed, by central
    differences of the solved best response (tolerance 1e-13); at mix = 1 it is the exact
    hypergradient, and at mix 0.3 far from it (the lag is no best response)."""
    p, theta = random_lq(), jnp.asarray([0.2, -0.1])
    prev = lag_response(
        p.best_response(theta + 0.4, BETA), first_policy(p, BETA, jnp.float64), 0.5, BETA
    )

    def J(th):
        best = p.best_response(th, BETA, tol=1e-13)
        return lq.leader_objective(p, th, BETA, horizon, br=lag_response(best, prev, MIX, BETA))

    fd = np.array(
        [
            (float(J(theta.at[i].add(EPS))) - float(J(theta.at[i].add(-EPS)))) / (2 * EPS)
            for i in range(2)
        ]
    )
    got = np.asarray(lag_hypergradient(p, theta, prev, BETA, MIX, horizon, tol=1e-13))
    np.testing.assert_allclose(got, fd, rtol=1e-6, atol=1e-8)
    exact = np.asarray(lq.exact_hypergradient(p, theta, BETA, horizon, tol=1e-13))
    at_one = lag_hypergradient(p, theta, prev, BETA, 1.0, horizon, tol=1e-13)
    np.testing.assert_allclose(at_one, exact, rtol=1e-9, atol=1e-12)
    assert np.max(np.abs(got - exact)) > 0.1 * np.max(np.abs(exact))


def test_lag_policy_and_reference_refuse_a_mix_outside_its_range(x64, random_lq):
    p, theta = random_lq(), jnp.asarray([0.2, -0.1])
    prev = first_policy(p, BETA, jnp.float64)
    for mix in (0.0, 1.5):
        with pytest.raises(ValueError, match="mix"):
            lag_hypergradient(p, theta, prev, BETA, mix)
    traced = jax.jit(lambda m: lag_hypergradient(p, theta, prev, BETA, m))(2.0)
    assert np.all(np.isnan(traced))
    with pytest.raises(ValueError, match="mix"):  # past 1 the covariance is none
        lag_response(p.best_response(theta, BETA), prev, 1.5, BETA)
