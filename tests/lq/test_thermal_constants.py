"""Building thermal control: every constant of the paper's appendix, written out here and compared
with the problem: A_theta at generic weights (each k_i, each airflow link, which half of w is
insulation), B, Qbar, Rbar, the noise scale, the start covariance, both discounts, the horizon
and r_L. A start-value band and two rows of A_theta at theta 0.5 could not see these."""

import jax.numpy as jnp
import numpy as np

from bchg_jax.problems.thermal import thermal, thermal_A

W = np.array([0.3, -0.5, 0.1, 0.8, -0.2, 0.4, -0.7, 0.0])


def _expected_A(w):
    th = 1.0 / (1.0 + np.exp(-w))
    alpha, air = th[:4], th[4:]  # first half insulation, second half airflow
    k = np.array([0.04, 0.03, 0.06, 0.05])  # the paper's k_i (Delta(alpha_i) = k_i (1 - alpha_i))
    h12, h41, h23, h21, h34, h32, h43 = 0.05, 0.05, 0.04, 0.03, 0.06, 0.04, 0.03  # paper's h
    A = np.diag(1.0 + k * (1.0 - alpha))
    # (row, col, airflow index, h): zone row exchanges heat with zone col (rows conserve heat)
    for i, j, link, h in (
        (0, 1, 0, h12),
        (0, 3, 3, h41),
        (1, 2, 1, h23),
        (1, 0, 0, h21),
        (2, 3, 2, h34),
        (2, 1, 1, h32),
        (3, 0, 3, h41),
        (3, 2, 2, h43),
    ):
        A[i, j] += h * air[link]
        A[i, i] -= h * air[link]
    return A


def test_A_theta_matches_the_appendix_at_generic_weights():
    for w in (W, np.zeros(8), -W[::-1]):
        got = np.asarray(thermal_A(jnp.asarray(w, jnp.float32)), np.float64)
        np.testing.assert_allclose(got, _expected_A(w), atol=2e-7)


def test_thermal_constants_match_the_paper():
    p = thermal()
    B = np.asarray(p.B_fn(jnp.zeros(8, jnp.float32)), np.float64)
    np.testing.assert_allclose(B, [[0.10, 0], [0.6, 0], [0, 0.55], [0, 0.30]], atol=1e-7)  # B
    np.testing.assert_allclose(np.asarray(p.Qbar), np.diag([8.0, 1.0, 5.0, 6.0]))  # Qbar
    np.testing.assert_allclose(np.asarray(p.Rbar), 0.01 * np.eye(2))  # Rbar = 0.01 I_2
    np.testing.assert_allclose(np.asarray(p.U), 0.02 * np.eye(4))  # noise U = 0.02 I_4
    np.testing.assert_allclose(np.asarray(p.init_cov), 25.0 * np.eye(4))  # s0 ~ N(0, 5^2 I)
    assert p.gamma_F == 0.9 and p.gamma_L == 0.9  # both discounts 0.9
    assert p.horizon == 100  # episodes of 100 steps


def test_leader_reward_is_the_papers_formula():
    """r_L = -(1/n) sum_i (s_i - mean s)^2 - 0.5 ||b||^2 - 0.1 (||alpha||^2 + ||beta_air||^2)."""
    p = thermal()
    rng = np.random.default_rng(1)
    s, b = rng.normal(size=(6, 4)) * 3, rng.normal(size=(6, 2)) * 2
    w = jnp.asarray(W, jnp.float32)
    th = 1.0 / (1.0 + np.exp(-W))
    rL = np.asarray(p.leader_reward(w, jnp.asarray(s, jnp.float32), jnp.asarray(b, jnp.float32)))
    stab = -np.mean((s - s.mean(1, keepdims=True)) ** 2, axis=1)
    want = stab - 0.5 * np.sum(b**2, 1) - 0.1 * (np.sum(th[:4] ** 2) + np.sum(th[4:] ** 2))
    np.testing.assert_allclose(rL, want, rtol=1e-5, atol=1e-5)
