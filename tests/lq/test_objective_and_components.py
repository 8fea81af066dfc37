"""lq.objective_and_components gives leader_objective's J and components' values from one
covariance sum (the LQ trainer's metrics)."""

import jax
import jax.numpy as jnp
import numpy as np
from test_thermal import _small_lq

from bchg_jax import lq
from bchg_jax.lq import exact as exact_lq
from bchg_jax.problems.thermal import thermal


def test_the_same_values_as_the_two_functions():
    problem = thermal()
    beta = 0.5
    for theta in (problem.theta0, problem.theta0 + 0.05):
        br = lq.best_response(problem, theta, beta)
        quads = problem.components(theta)
        J, parts = jax.jit(lambda th, br: lq.objective_and_components(problem, th, br, quads))(
            theta, br
        )
        np.testing.assert_allclose(J, lq.leader_objective(problem, theta, beta, br=br), rtol=1e-6)
        want = lq.components(problem, theta, br, quads)
        assert set(parts) == set(want)
        for name in want:
            np.testing.assert_allclose(parts[name], want[name], rtol=1e-6)


def _explicit_return(p, th, br, H):
    """sum_{t<H} gamma_L^t E r_L(s_t, b_t), the state covariance stepped forward in NumPy."""
    A, B, U = np.asarray(p.A_fn(th)), np.asarray(p.B_fn(th)), np.asarray(p.U)
    K, cov = np.asarray(br.K), np.asarray(br.cov)
    Ms, Mb, c = (np.asarray(x) for x in p.leader_quadratic(th))
    F, W = A - B @ K, B @ cov @ B.T + U @ U.T
    S, J = np.asarray(p.init_cov, float), 0.0
    for t in range(H):
        J += p.gamma_L**t * (-np.trace((Ms + K.T @ Mb @ K) @ S) - np.trace(Mb @ cov) + float(c))
        S = F @ S @ F.T + W
    return J


def test_short_horizon_objective_is_the_covariance_recursion(x64):
    """J_L over H = 1, 2, 3, 10 steps against the recursion written out (the tests elsewhere
    use H = 100 at gamma 0.9, where a discount mass summed to gamma^(H-1) is 3e-5 off)."""
    p = _small_lq()
    th = jnp.asarray(p.theta0)
    br = p.best_response(th, 0.5, tol=1e-13)
    for H in (1, 2, 3, 10):
        J = float(exact_lq.leader_objective(p, th, 0.5, H, br=br))
        np.testing.assert_allclose(J, _explicit_return(p, th, br, H), rtol=1e-10)


def test_exact_leader_value_averages_to_the_infinite_horizon_objective(x64):
    """E_{s_0 ~ N(0, init_cov)} V_L(s_0) = -tr(Pv init_cov) + v0 is J_L (horizon None), and
    E_b Q_L(s, b) = V_L(s) exactly (the Gaussian expectation of the quadratic, no sampling)."""
    p = _small_lq()
    th = jnp.asarray(p.theta0)
    br = p.best_response(th, 0.5, tol=1e-13)
    qv = exact_lq.leader_value_quadratic(p, th, br)
    J_inf = float(exact_lq.leader_objective(p, th, 0.5, None, br=br))
    EV = -np.trace(np.asarray(qv.Pv) @ np.asarray(p.init_cov)) + float(qv.v0)
    np.testing.assert_allclose(EV, J_inf, rtol=1e-10)
    s = np.array([[0.7, -1.3], [2.0, 0.5]])
    K, cov = np.asarray(br.K), np.asarray(br.cov)
    # b ~ N(-K s, cov): Q_L is quadratic in b with Hessian -(Mb + gamma_L B^T Pv B)
    Pv, B = np.asarray(qv.Pv), np.asarray(qv.B)
    Hbb = np.asarray(qv.Mb) + p.gamma_L * B.T @ Pv @ B
    EQ = np.asarray(qv.q(s, -s @ K.T)) - np.trace(Hbb @ cov)
    np.testing.assert_allclose(EQ, np.asarray(qv.value(s)), rtol=1e-10)
