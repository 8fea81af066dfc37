"""Riccati solutions too ill-conditioned for their dtype are flagged, not called converged.

Near an unstabilisable pair the stabilising solution is huge and decided by rounding: in the LQR
game at the leader gain K = (15, -10), ``A + C K`` couples the uncontrolled unstable mode by
``1 - 0.1 * 10``, exactly 0 eagerly and -5.6e-17 under ``jit`` (a fused multiply-add), where
the iteration used to report ``converged=True`` at P ~ 1e34 (the eager call: not converged).
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from bchg_jax.core.maxent_lqr import (
    ILL_CONDITIONED,
    check_solution,
    maxent_lqr,
    relative_condition,
    riccati,
)
from bchg_jax.games.lqr.follower import best_response
from bchg_jax.problems.lqr_game import lqr_game
from bchg_jax.problems.thermal import thermal

B = np.array([[0.0], [0.1]])
Q = np.eye(2)
R = np.eye(1)


def _near_unstabilisable(coupling):
    """The LQR game's A + C K at K = (15, -10 + 10 * coupling): the unstable mode 1.5 reaches
    the follower's input only through ``coupling``."""
    return np.array([[1.5, coupling], [0.0, 0.0]])


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_the_game_at_an_unstabilisable_gain_is_not_converged_under_jit(dtype):
    with jax.enable_x64(dtype == "float64"):
        game = lqr_game()
        theta = jnp.array([15.0, -10.0], dtype)
        # (eagerly A + C K rounds the coupling to 0: no solution, not converged either way)
        traced = jax.jit(jax.vmap(lambda t: best_response(game, t, 0.1)))(theta[None])
        assert not bool(traced.converged[0])  # was True, P ~ 1e34 (float64) / 1e18 (float32)


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.slow
def test_a_rounding_sized_coupling_is_ill_conditioned(dtype):
    # the coupling jit produced at K = (15, -10): a stabilisable pair whose P ~ 1e34
    with jax.enable_x64(dtype == "float64"):
        A = jnp.asarray(_near_unstabilisable(-5.551115123125783e-17), dtype)
        P, info = riccati(A, *(jnp.asarray(x, dtype) for x in (B, Q, R)), 0.95)
        assert bool(info.ill_conditioned)
        assert not bool(info.converged) and not bool(info.unstable)
        # float64: 7.6e16 times eps; float32: the estimate overflows to NaN, also flagged
        assert not float(info.condition) * np.finfo(dtype).eps <= ILL_CONDITIONED


@pytest.mark.slow
def test_float32_far_off_answer_is_flagged_and_float64_solves_it(x64):
    # at K = (15, -9.999999) float32 used to "converge" to a P 180% off the float64 answer
    A = _near_unstabilisable(1e-7)
    P64, info64 = riccati(A, B, Q, R, 0.95)
    assert bool(info64.converged) and not bool(info64.ill_conditioned)
    assert 1e7 < float(info64.condition) < 1e8  # eps64 * condition ~ 1e-8: well determined
    f32 = [jnp.asarray(x, jnp.float32) for x in (A, B, Q, R)]
    P32, info32 = riccati(*f32, 0.95)
    assert not bool(info32.converged) and bool(info32.ill_conditioned)
    br = maxent_lqr(*f32, jnp.eye(2, dtype=jnp.float32), 0.95, 0.1)
    with pytest.raises(ValueError, match="ill-conditioned for float32.*float64 may resolve"):
        check_solution(br)
    # a milder coupling: float32 well determined (eps * condition ~ 5e-3), converged, and as
    # close to float64 as that bound says
    A = _near_unstabilisable(1e-4)
    P64, _ = riccati(A, B, Q, R, 0.95)
    f32 = [jnp.asarray(x, jnp.float32) for x in (A, B, Q, R)]
    P32, info32 = riccati(*f32, 0.95)
    assert bool(info32.converged)
    bound = float(info32.condition) * np.finfo(np.float32).eps
    assert 1e-3 < bound < ILL_CONDITIONED
    assert np.max(np.abs(np.asarray(P32, np.float64) - P64)) / np.max(np.abs(P64)) < bound


@pytest.mark.slow
def test_relative_condition_is_the_implicit_derivatives_norm(x64):
    rng = np.random.default_rng(3)
    A = 0.7 * rng.normal(size=(3, 3))
    Bm = rng.normal(size=(3, 2))
    Qm = np.diag(rng.uniform(0.5, 2.0, 3))
    Rm = 0.3 * np.eye(2)
    data = [jnp.asarray(x) for x in (A, Bm, Qm, Rm)]
    P, info = riccati(*data, 0.9, tol=1e-13)
    assert bool(info.converged)

    solution = jax.jit(lambda *x: riccati(*x, 0.9, tol=1e-13)[0].reshape(-1))
    # d vec(P) / d vec(X) through riccati's own implicit derivative, each scaled by |X|_F
    jacs = jax.jit(jax.jacfwd(solution, argnums=(0, 1, 2, 3)))(*data)
    cols = [
        j.reshape(9, -1) * np.linalg.norm(np.asarray(x)) for j, x in zip(jacs, data, strict=True)
    ]
    expected = np.linalg.norm(np.concatenate(cols, 1)) / np.linalg.norm(np.asarray(P))
    got = float(relative_condition(P, *data, 0.9))
    np.testing.assert_allclose(got, expected, rtol=1e-6)
    # and it bounds what a small relative change of the data does to P (first order)
    d = np.random.default_rng(0).normal(size=(5,) + A.shape)
    d *= 1e-7 * np.linalg.norm(A) / np.linalg.norm(d, axis=(1, 2), keepdims=True)
    P2 = jax.vmap(lambda a: solution(a, *data[1:]))(jnp.asarray(A + d))
    moved = np.linalg.norm(np.asarray(P2) - np.asarray(P).reshape(-1), axis=1)
    assert np.all(moved / np.linalg.norm(np.asarray(P)) <= 1.01 * got * 1e-7)


@pytest.mark.slow
def test_the_papers_problems_are_far_from_the_limit():
    # float32, as the experiments run: the flag must not touch the paper's paths
    eps = np.finfo(np.float32).eps
    game = lqr_game()
    gains = jax.random.uniform(jax.random.PRNGKey(0), (400, 2), jnp.float32, -30.0, 30.0)
    resp = jax.jit(jax.vmap(lambda t: best_response(game, t, 0.1)))(gains)
    ok = np.asarray(resp.converged)
    assert ok.mean() > 0.99
    assert np.max(eps * np.asarray(resp.info.condition)[ok]) < 1e-3
    assert not np.any(np.asarray(resp.info.ill_conditioned))
    problem = thermal(jnp.float32)
    qr = [jnp.asarray(x, jnp.float32) for x in (problem.Qbar, problem.Rbar)]

    def thermal_solve(w):
        return riccati(problem.A_fn(w), problem.B_fn(w), *qr, problem.gamma_F)[1]

    weights = 3.0 * jax.random.normal(jax.random.PRNGKey(1), (400, 8), jnp.float32)
    info = jax.jit(jax.vmap(thermal_solve))(weights)
    assert np.all(np.asarray(info.converged))
    assert np.max(eps * np.asarray(info.condition)) < 1e-3
