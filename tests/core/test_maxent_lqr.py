"""Max-ent LQR follower: Riccati equation, Propositions 1 and 2, implicit gradients, failures."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from bchg_jax.core.maxent_lqr import (
    check_solution,
    is_stabilizable,
    maxent_lqr,
    maxent_lqr_observable,
    riccati,
    riccati_map,
    soft_q,
    soft_value,
    soft_value_observable,
)


def _system(seed=0, n=3, m=2):
    rng = np.random.default_rng(seed)
    A = 0.6 * rng.normal(size=(n, n))
    B = rng.normal(size=(n, m))
    Q = np.diag(rng.uniform(0.5, 2.0, n))
    R = 0.1 * np.eye(m)
    U = 0.3 * np.eye(n)
    return A, B, Q, R, U


def test_riccati_solves_the_equation(x64):
    A, B, Q, R, _ = _system()
    P, info = riccati(A, B, Q, R, 0.9, tol=1e-13)
    assert bool(info.converged)
    np.testing.assert_allclose(riccati_map(P, A, B, Q, R, 0.9), P, atol=1e-10)
    assert np.linalg.eigvalsh(np.asarray(P)).min() > 0
    # warm start from the solution converges at once
    _, info2 = riccati(A, B, Q, R, 0.9, P0=P, tol=1e-10)
    assert int(info2.iterations) <= 2


def test_newton_steps_finish_a_riccati_iteration_near_a_marginal_closed_loop(x64):
    """Scalar system with discounted closed-loop rate ~0.9998 (state cost 1e-8): the iteration
    stops 'converged' (relative step < 1e-6) with P off by ~1e-3 of the stabilising root of the
    scalar Riccati quadratic; the two Newton steps after it bring P to within 1e-9 of it."""
    g, a, b, q, r = 0.9, (1 - 1e-4) / np.sqrt(0.9), 1.0, 1e-8, 1.0
    # P = q + g a^2 P - g^2 a^2 b^2 P^2 / (r + g b^2 P), times (r + g b^2 P):
    # g b^2 P^2 + (r (1 - g a^2) - q g b^2) P - q r = 0, the stabilising solution its root > 0
    c2, c1, c0 = g * b**2, r * (1 - g * a**2) - q * g * b**2, -q * r
    P_true = max(np.roots([c2, c1, c0]).real)
    args = [jnp.array([[x]]) for x in (a, b, q, r)]
    P_iter, info = riccati(*args, g, newton_iters=0)
    P, info_polished = riccati(*args, g)
    assert bool(info.converged) and bool(info_polished.converged)
    assert abs(float(P_iter[0, 0]) / P_true - 1) > 1e-4  # what the Newton steps fix
    assert abs(float(P[0, 0]) / P_true - 1) < 1e-9
    rate = g * (a - b * g * b * P_true * a / (r + g * b**2 * P_true)) ** 2
    assert 0.999 < rate < 1


@pytest.mark.slow
@pytest.mark.parametrize("growth", [1e-4, -1e-4])
def test_a_slowly_diverging_riccati_iteration_is_not_converged(x64, growth):
    """s1' = lam s1 with gamma lam^2 = 1 + 1e-4, out of the follower's reach (B = [0, 1]) and
    costed (Qbar = I): no stabilising solution, and P11 grows ~linearly, so the relative change
    falls below tol (1054 iterations at tol 1e-3; at the default 1e-6 after ~1e6) and the
    iteration 'converged'; the Newton steps then took P to the non-stabilising root
    P11 = 1 / (1 - gamma lam^2) = -1.8e4, and the LQR game's exact hypergradient came out as
    [-60.6, -4.55e7] with no error. ``unstable`` flags it now; the same system with
    gamma lam^2 = 1 - 1e-4 converges to its stabilising solution."""
    g = 0.9
    lam = np.sqrt((1.0 + growth) / g)
    A, B = jnp.array([[lam, 0.0], [1.0, 0.5]]), jnp.array([[0.0], [1.0]])
    P, info = riccati(A, B, jnp.eye(2), jnp.eye(1), g, tol=1e-3, max_iters=100_000)
    br = maxent_lqr(A, B, jnp.eye(2), jnp.eye(1), 0.1 * jnp.eye(2), g, 0.5, tol=1e-3)
    if growth > 0:
        assert float(info.residual) <= 1e-3 and int(info.iterations) < 100_000
        assert bool(info.unstable) and not bool(info.converged)
        assert bool(br.info.unstable) and not bool(br.converged)
        with pytest.raises(ValueError, match="not the stabilising one"):
            check_solution(br)
    else:
        assert bool(info.converged) and not bool(info.unstable)
        Q, R = jnp.eye(2), jnp.eye(1)
        np.testing.assert_allclose(riccati_map(P, A, B, Q, R, g), P, rtol=1e-9)
        assert np.linalg.eigvalsh(np.asarray(P)).min() > 0 and float(P[0, 0]) > 1e4
        check_solution(br)


@pytest.mark.slow
def test_riccati_implicit_gradient_matches_finite_differences(x64):
    A, B, Q, R, _ = _system(1)
    f = lambda a: jnp.sum(riccati(A * a, B, Q, R, 0.9, tol=1e-14)[0] * np.arange(9).reshape(3, 3))  # noqa: E731
    h = 1e-5
    fd = (f(1.0 + h) - f(1.0 - h)) / (2 * h)
    np.testing.assert_allclose(jax.grad(f)(1.0), fd, rtol=1e-6)


@pytest.mark.slow
def test_proposition1_soft_bellman_on_sampled_points(x64):
    """V_F(s) = E_b[r_F + gamma E_w V_F(s') - beta log g(b|s)] and g = exp((Q_F - V_F) / beta)."""
    A, B, Q, R, U = _system(2)
    gamma, beta = 0.9, 0.2
    br = maxent_lqr(A, B, Q, R, U, gamma, beta, tol=1e-13)
    key = jax.random.PRNGKey(0)
    states = jax.random.normal(key, (5, 3))
    N = 200_000
    for i, s in enumerate(states):
        S = jnp.broadcast_to(s, (N, 3))
        kb, kw = jax.random.split(jax.random.fold_in(key, i))
        b = br.sample(kb, S)
        # Boltzmann form: Q_F - beta log g is constant in b and equals V_F
        gap = soft_q(br, A, B, Q, R, U, gamma, S, b) - beta * br.log_prob(S, b)
        np.testing.assert_allclose(gap, soft_value(br, s), rtol=1e-9, atol=1e-9)
        # one-step soft Bellman equation with sampled next states (Monte Carlo, 5 SE)
        s2 = S @ A.T + b @ B.T + jax.random.normal(kw, (N, 3)) @ U.T
        r = -(jnp.einsum("ni,ij,nj->n", S, Q, S) + jnp.einsum("ni,ij,nj->n", b, R, b))
        x = r + gamma * soft_value(br, s2) - beta * br.log_prob(S, b)
        assert abs(float(x.mean() - soft_value(br, s))) < 5 * float(x.std()) / np.sqrt(N) + 1e-9


def test_proposition2_observable_disturbance(x64):
    """V_F(s, w) = E_b[r_F(s,b) + gamma E_w' V_F(s', w') - beta log g(b|s,w)],
    s' = A s + B b + w."""
    A, B, Q, R, U = _system(3)
    gamma, beta = 0.9, 0.2
    br = maxent_lqr_observable(A, B, Q, R, U, gamma, beta, tol=1e-13)
    key = jax.random.PRNGKey(1)
    N = 400_000
    for i in range(3):
        k1, k2, k3, k4 = jax.random.split(jax.random.fold_in(key, i), 4)
        s = jax.random.normal(k1, (3,))
        w = jax.random.normal(k2, (3,)) @ U.T
        S, W = jnp.broadcast_to(s, (N, 3)), jnp.broadcast_to(w, (N, 3))
        b = br.sample(k3, S, W)
        s2 = S @ A.T + b @ B.T + W
        w2 = jax.random.normal(k4, (N, 3)) @ U.T
        r = -(jnp.einsum("ni,ij,nj->n", S, Q, S) + jnp.einsum("ni,ij,nj->n", b, R, b))
        x = r + gamma * soft_value_observable(br, Q, A, s2, w2) - beta * br.log_prob(S, b, W)
        target = soft_value_observable(br, Q, A, s, w)
        assert abs(float(x.mean() - target)) < 5 * float(x.std()) / np.sqrt(N) + 1e-9


def test_unstabilisable_pair_is_flagged_not_silent():
    A = np.diag([2.0, 0.5])
    B = np.array([[0.0], [1.0]])  # the unstable mode is not controllable
    assert not is_stabilizable(A, B, 0.9)
    assert is_stabilizable(np.diag([0.9, 0.5]), B, 0.9)
    br = maxent_lqr(A, B, np.eye(2), np.eye(1), 0.1 * np.eye(2), 0.9, 0.1, max_iters=2000)
    assert not bool(br.converged)
    with pytest.raises(ValueError, match="did not converge"):
        check_solution(br)


def test_a_value_matrix_growing_without_bound_is_not_called_a_rounding_stall(x64):
    """float64, a mode growing 1.2^2 x 0.99 = 1.43 per iteration that B cannot reach: the
    relative change, measured against the new (growing) P, stays at 0.23, so after 1000
    iterations the stall test read a net move of at most 1 over a path of 230 as "went nowhere"
    and the error blamed float64's rounding floor ("loosen tol"). The net move is now measured
    against the window's start: the iteration runs until P overflows and the error names an
    unstabilisable pair."""
    A, B = np.diag([1.2, 0.5]), np.array([[0.0], [1.0]])
    assert not is_stabilizable(A, B, 0.99)
    br = maxent_lqr(A, B, np.eye(2), np.eye(1), 0.1 * np.eye(2), 0.99, 0.3)
    assert not bool(br.converged) and not bool(br.info.stalled)
    with pytest.raises(ValueError, match="grew until it overflowed float64.*unstabilisable"):
        check_solution(br)


def _large_gain_system(k):
    """A 2-d double integrator under a leader gain k (the LQR game's A + C K at K = (k, k))."""
    A = np.array([[0.0, 1.0], [0.0, 0.0]]) + np.array([[0.1], [0.0]]) @ np.array([[k, k]])
    return A, np.array([[0.0], [0.1]]), np.eye(2), np.eye(1)


@pytest.mark.slow
def test_riccati_float32_meets_its_tolerance_at_large_gains(x64):
    # the textbook map subtracted two terms of size g |A|^2 |P|: at gains 100 and 200 float32
    # changes wandered at ~1e-3 for all 50,000 iterations (0.7% off); the stabilised form meets
    # tol within a few hundred iterations
    for k, rtol in ((100.0, 3e-5), (200.0, 3e-4)):
        A, B, Q, R = _large_gain_system(k)
        P64, info64 = riccati(A, B, Q, R, 0.95, tol=1e-12)
        P, info = riccati(*(jnp.asarray(x, jnp.float32) for x in (A, B, Q, R)), 0.95)
        assert bool(info64.converged) and bool(info.converged), (k, info)
        assert int(info.iterations) < 2000 and not bool(info.stalled)
        np.testing.assert_allclose(np.asarray(riccati_map(P64, A, B, Q, R, 0.95)), P64, rtol=1e-10)
        np.testing.assert_allclose(P, P64, rtol=rtol, atol=rtol * float(jnp.abs(P64).max()))


def test_riccati_stall_at_the_rounding_floor_is_flagged_and_named():
    # at gain 400 the float32 change stops improving at ~2e-4: stop early, say float64
    A, B, Q, R = (jnp.asarray(x, jnp.float32) for x in _large_gain_system(400.0))
    br = maxent_lqr(A, B, Q, R, 0.3 * jnp.eye(2, dtype=jnp.float32), 0.95, 0.1)
    assert not bool(br.converged) and bool(br.info.stalled)
    assert int(br.info.iterations) < 10_000  # not the 50,000-iteration cap
    with pytest.raises(ValueError, match="stalled at a relative change.*compute in float64"):
        check_solution(br)


def test_riccati_slow_growing_mode_is_not_a_stall(x64):
    # a fast mode converges at once, then a weakly penalised slow mode grows for thousands of
    # iterations, its change rising before it falls: P moves one way, so no stall (the first
    # stall rule stopped it at iteration 1005, P22 = 0.06 of 50.5)
    A = np.diag([0.5, np.sqrt(1.005 / 0.99)])
    B, Q, R = np.diag([1.0, 0.01]), np.diag([1.0, 2e-6]), np.eye(2)
    P, info = riccati(A, B, Q, R, 0.99)
    assert bool(info.converged) and not bool(info.stalled), info
    assert int(info.iterations) > 2000
    np.testing.assert_allclose(riccati_map(P, A, B, Q, R, 0.99), P, rtol=1e-9, atol=1e-12)
    assert float(P[1, 1]) > 50
