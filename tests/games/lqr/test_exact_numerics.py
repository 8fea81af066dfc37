"""The LQR game's exact references where the closed loop F is unstable (rho(F) > 1, a valid game:
the follower only needs gamma_F rho(F)^2 < 1), at exactly nilpotent loops and at large gains in
float32; and the argument checks of the exact functions (complex arrays, list thetas, JAX
integer horizons).

References: the closed form in 50-digit decimal arithmetic and float64 central differences."""

import dataclasses
import decimal
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from small_problems import lqr_game_2d

from bchg_jax.games import lqr
from bchg_jax.games.lqr import LQRGame, best_response
from bchg_jax.games.lqr.config import ActorConfig, ExplorationConfig
from bchg_jax.games.lqr.exact import (
    FLOAT32_CANCELLATION_WARN,
    closed_loop,
    exact_hypergradient,
    float32_cancellation,
    hypergradient_split,
    leader_objective,
    leader_state_values,
)
from bchg_jax.problems.lqr_game import lqr_game


@pytest.fixture(autouse=True)
def x64():
    jax.config.update("jax_enable_x64", True)
    yield
    jax.config.update("jax_enable_x64", False)


def _unstable_game(horizon=100):
    """The audit's game: gamma_F = 0.5 and a costly follower action leave rho(F) = 1.285 at
    theta = (0.2, -0.1) (< 1 / sqrt(gamma_F) = 1.414)."""
    return LQRGame(
        A=np.array([[1.3, 0.2], [0.1, 1.2]]),
        B=np.array([[1.0], [0.5]]),
        C=np.array([[0.3], [1.0]]),
        Qbar=np.eye(2),
        Rbar=100 * np.eye(1),
        s0=np.array([1.0, -0.5]),
        s_star=np.array([0.5, 0.5]),
        Sigma=np.diag([4.0, 1.0]),
        U=np.array([[0.3]]),
        gamma_F=0.5,
        gamma_L=0.99,
        horizon=horizon,
        name="unstableF",
    ).validate()


TH = np.array([0.2, -0.1])


def _solve_det(M, b):
    """(M^-1 b, det M) of object arrays of Decimals by Gaussian elimination (partial pivoting)."""
    n = M.shape[0]
    A, x = np.concatenate([M, b[:, None]], 1), np.empty(n, object)
    det = decimal.Decimal(1)
    for j in range(n):
        p = j + int(np.argmax([abs(v) for v in A[j:, j]]))
        if p != j:
            A[[j, p]], det = A[[p, j]], -det
        det *= A[j, j]
        for i in range(j + 1, n):
            A[i] = A[i] - A[i, j] / A[j, j] * A[j]
    for i in reversed(range(n)):
        x[i] = (A[i, n] - A[i, i + 1 : n] @ x[i + 1 :]) / A[i, i]
    return x, det


def _mp_return(game, F, N, T, gamma):
    """sum_t gamma^t det(I + W S_t)^(-1/2) exp(-d^T (I + W S_t)^(-1) W d / 2), d = F^t s0 - s*,
    S_{t+1} = F S_t F^T + N, in 50-digit decimal arithmetic (the float64 inputs exactly; no
    cancellation can reach the result)."""
    with decimal.localcontext() as ctx:
        ctx.prec = 50
        dec = np.vectorize(lambda v: decimal.Decimal(float(v)), otypes=[object])
        F, N, W = dec(np.asarray(F)), dec(np.asarray(N)), dec(np.asarray(game.Sigma))
        mu, ss = dec(np.asarray(game.s0)), dec(np.asarray(game.s_star))
        n = mu.shape[0]
        eye = dec(np.eye(n))
        S, total, g = dec(np.zeros((n, n))), decimal.Decimal(0), decimal.Decimal(1)
        for _ in range(T):
            d = mu - ss
            z, det = _solve_det(eye + W @ S, W @ d)
            total += g * (-(d @ z) / 2).exp() / det.sqrt()
            mu, S, g = F @ mu, F @ S @ F.T + N, g * decimal.Decimal(float(gamma))
        return float(total)


def _central_difference(f, theta, h):
    eye = np.eye(theta.shape[0])
    return np.array([(f(theta + h * e) - f(theta - h * e)) / (2 * h) for e in eye])


@pytest.mark.slow
def test_unstable_closed_loop_return_matches_the_closed_form_in_50_digits():
    """rho(F) = 1.285: the covariance recursion F S F^T + N lost an eigenvalue to rounding at
    step 80 in float64 (-1.5 next to 1.5e16), det(I + W S) < 0 and the return was NaN: a
    concrete call raised "overflow float64" (max |S| was 1e16), a traced one returned NaN. The
    square-root moments give the 50-digit closed form to 1e-12 (float64) and 1e-5 (float32,
    under jit)."""
    game = _unstable_game()
    theta = jnp.asarray(TH)
    resp = best_response(game, theta, 0.5, tol=1e-12)
    F, N = closed_loop(game, theta, resp)
    rho = np.max(np.abs(np.linalg.eigvals(np.asarray(F))))
    assert 1.28 < rho < 1.29 and 0.5 * rho**2 < 1
    want = _mp_return(game, F, N, 100, 0.99)
    assert abs(want - 0.99318) < 1e-5
    got = float(leader_objective(game, theta, 0.5, gamma=0.99, resp=resp))
    assert abs(got - want) <= 1e-12 * want, (got, want)
    solved = jax.jit(lambda t: leader_objective(game, t, 0.5, gamma=0.99, tol=1e-12))
    assert abs(float(solved(theta)) - want) <= 1e-12 * want
    assert abs(float(leader_objective(game, theta, 0.5, gamma=0.99)) - want) <= 1e-9 * want
    f32 = jax.jit(lambda t: leader_objective(game, t, 0.5, gamma=0.99))(theta.astype(jnp.float32))
    assert f32.dtype == jnp.float32 and abs(float(f32) - want) <= 1e-5 * want
    # the exact critic V_L^(h) from s0 is the same sum
    v = leader_state_values(game, theta, resp, jnp.asarray(game.s0), jnp.asarray(100), 0.99, 100)
    assert abs(float(v) - want) <= 1e-12 * want


@pytest.mark.slow
@pytest.mark.parametrize("stochastic", [True, False])
def test_unstable_closed_loop_gradients_match_central_differences(stochastic):
    """The exact hypergradient and both parts of ``hypergradient_split`` against float64 central
    differences (h = 1e-5) at rho(F) = 1.285; before, ``exact_hypergradient`` raised and
    ``hypergradient_split`` returned NaN on these concrete arguments. ``stochastic=False``: the
    noise covariance has rank 1 < n (the square-root step's derivative at a singular factor)."""
    game, beta, kw = _unstable_game(), 0.5, dict(gamma=0.99, stochastic=stochastic, tol=1e-12)
    theta = jnp.asarray(TH)
    J = jax.jit(lambda t: leader_objective(game, t, beta, **kw))
    fd = _central_difference(J, theta, 1e-5)
    grad = np.asarray(exact_hypergradient(game, theta, beta, **kw))
    np.testing.assert_allclose(grad, fd, rtol=1e-7, atol=1e-9)
    full, direct = (np.asarray(x) for x in hypergradient_split(game, theta, beta, **kw))
    np.testing.assert_allclose(full, fd, rtol=1e-7, atol=1e-9)
    fixed = best_response(game, theta, beta, stochastic=stochastic, tol=1e-12)
    kw_fixed = dict(gamma=0.99, stochastic=stochastic, resp=fixed)
    J_direct = jax.jit(lambda t: leader_objective(game, t, beta, **kw_fixed))
    np.testing.assert_allclose(direct, _central_difference(J_direct, theta, 1e-5), rtol=1e-7)
    assert np.all(np.abs(full - direct) > 1e-3)  # the follower's response matters here


@pytest.mark.parametrize(
    "theta, stochastic, J, grad",
    [  # float64 values of the covariance recursion (HEAD before the square-root form)
        ([-4.0, 0.0], True, 0.07081059059934167, [-0.05538090852447353, 0.00022646665701637084]),
        ([-6.0, 0.5], True, 0.2662350696683705, [-0.1254534655039432, -0.0004313131148107466]),
        ([-6.0, 0.5], False, 0.26623501980220315, [-0.12545348098804585, -0.0004313133161307922]),
        ([-8.0, 1.0], True, 0.4951226540578062, [-0.10577905152894734, -0.015286286806067818]),
        (
            [20.0, -5.0],
            False,
            0.012144469938971307,
            [5.2735700924088236e-05, 4.574701228088492e-05],
        ),
    ],
)
def test_the_preset_game_is_unchanged(theta, stochastic, J, grad):
    """On the paper's game (stable closed loops) the square-root moments give what the plain
    covariance recursion gave, to 1e-12 relative (the return, and the gradient also with the
    deterministic leader's rank-1 noise)."""
    game, th = lqr_game(), jnp.asarray(theta)
    got = float(leader_objective(game, th, 0.1, stochastic=stochastic))
    assert abs(got - J) <= 1e-12 * abs(J), got
    g = np.asarray(exact_hypergradient(game, th, 0.1, stochastic=stochastic))
    np.testing.assert_allclose(g, grad, rtol=1e-12, atol=0)


@pytest.mark.slow
def test_a_real_overflow_is_named_with_its_dtype():
    """The error of a concrete return whose moments do overflow names the dtype that overflowed
    and the step; a float64 overflow no longer suggests float64. Before, the error claimed a
    float64 overflow on a game whose moments peak at 1e16."""
    game = _unstable_game(horizon=3000)  # 1.285^t passes 1.8e308 near t = 2800
    with pytest.raises(ValueError, match=r"overflow float64 within the horizon 3000") as e:
        leader_objective(game, jnp.asarray(TH), 0.5, gamma=0.99)
    assert "float64," not in str(e.value) and "1.285^t" in str(e.value)
    short = _unstable_game(horizon=400)  # float32 overflows there (1.285^355), float64 not
    with pytest.raises(ValueError, match=r"overflow float32 within the horizon 400.*float64, "):
        exact_hypergradient(short, jnp.asarray(TH, jnp.float32), 0.5)
    with pytest.raises(ValueError, match=r"overflow float32 within the horizon 400"):
        hypergradient_split(short, jnp.asarray(TH, jnp.float32), 0.5)
    assert np.isfinite(float(leader_objective(short, jnp.asarray(TH), 0.5)))


def test_nilpotent_closed_loop_is_solved():
    """A + C K = [[0, 5], [0, 0]] (nilpotent, rho = 0) with Qbar = 0: P = 0 is the stabilising
    solution, but the spectral-radius bound returned log 5 for a zero square, and the follower's
    solve was refused as "not the stabilising one". The return against the 50-digit closed
    form."""
    game = lqr_game(Qbar=np.zeros((2, 2)))
    theta = jnp.array([0.0, 40.0])
    resp = best_response(game, theta, 0.1)
    assert bool(resp.converged) and not bool(resp.info.unstable)
    np.testing.assert_array_equal(resp.P, np.zeros((2, 2)))
    F, N = closed_loop(game, theta, resp)
    want = _mp_return(game, F, N, 100, 1.0)
    assert abs(float(leader_objective(game, theta, 0.1)) - want) <= 1e-12 * want


@pytest.mark.slow
def test_float32_cancellation_warns_at_large_gains_only():
    """float32 at K = (200, 0): the direct and follower-response parts are ~600x the gradient,
    and the float32 gradient [-7.2e-7, 1.8e-5] is far off the float64 [-2.85e-9, 9.87e-6] with
    every solve converged and nothing said. It warns now (the indicator's calibration:
    FLOAT32_CANCELLATION_WARN); not at the paper's gains, not in float64."""
    game = lqr_game()
    t64 = jnp.array([200.0, 0.0])
    g64 = np.asarray(exact_hypergradient(game, t64, 0.1))
    np.testing.assert_allclose(g64, [-2.85348e-9, 9.86936e-6], rtol=1e-5)
    with pytest.warns(UserWarning, match=r"float32 exact hypergradient .* unreliable"):
        g32 = np.asarray(exact_hypergradient(game, t64.astype(jnp.float32), 0.1), np.float64)
    assert np.linalg.norm(g32 - g64) > 0.5 * np.linalg.norm(g64)  # what the warning is about
    with pytest.warns(UserWarning, match=r"hypergradient_split: the float32 exact"):
        hypergradient_split(game, t64.astype(jnp.float32), 0.1)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for theta in ([-5.0, 0.5], [-20.0, 0.0], [20.0, -20.0], [-8.0, 10.0]):
            exact_hypergradient(game, jnp.asarray(theta, jnp.float32), 0.1)
            hypergradient_split(game, jnp.asarray(theta, jnp.float32), 0.1)
        exact_hypergradient(game, t64, 0.1)  # float64
        hypergradient_split(game, t64, 0.1)
    # the indicator at the two ends of its calibration (problems/lqr_game.py, beta 0.1)
    for theta, lo, hi in (([-20.0, 0.0], 0, FLOAT32_CANCELLATION_WARN / 3), ([200.0, 0.0], 1, 50)):
        t = jnp.asarray(theta, jnp.float32)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            full, direct = hypergradient_split(game, t, 0.1)
        x = float32_cancellation(game, t, best_response(game, t, 0.1), full, direct)
        assert lo <= x <= hi, (theta, x)


@pytest.mark.slow
@pytest.mark.filterwarnings("ignore:.*cuts the follower's influence sums")
def test_check_problem_warns_at_a_float32_theta_with_cancellation():
    game = lqr_game(U=np.array([[0.3]]))
    kw = dict(episodes=2, leader_steps=5, extra_steps=5, samples=2, batches=2, verbose=False)
    with pytest.warns(UserWarning, match="unreliable"):
        lqr.check_problem(game, [jnp.array([200.0, 0.0], jnp.float32)], 0.1, **kw)


def _train(game, method, iterations=8, **kw):
    cfg = lqr.TrainConfig(
        iterations=iterations,
        episodes=2,
        minibatch=8,
        actor=ActorConfig(lr=0.05, theta0_std=0.1),
        exploration=ExplorationConfig(warmup_steps=0),
        **kw,
    )
    tr = lqr.make_train(game, method, cfg)
    hp = jax.tree.map(lambda x: x[0], tr.hparams({"actor_steps": np.array([1])}))
    return jax.jit(tr.train)(jax.random.key(0), hp)


@pytest.mark.slow
def test_exact_training_on_an_unstable_closed_loop_is_finite_and_unflagged():
    """float32, rho(F) ~ 1.3: every J was NaN and every ``exact`` update was undone and counted
    as a capped solve, though each Riccati solve converged. Now J is finite, equal to the
    float64 closed form at the run's last theta, and nothing is flagged."""
    game = _unstable_game()
    state, m = _train(game, "exact")
    m = {k: np.asarray(v) for k, v in m.items()}
    assert np.all(np.isfinite(m["J"])) and np.all(np.isfinite(m["J_discounted"]))
    for flag in ("solve_capped", "update_skipped", "metric_nonfinite"):
        assert not m[flag].any(), flag
    theta = jnp.asarray(state.actor, jnp.float64)
    want = float(leader_objective(game, theta, 0.1, tol=1e-12))
    assert abs(m["J"][-1] - want) <= 1e-4 * want, (m["J"][-1], want)


@pytest.mark.slow
def test_an_overflowing_metric_is_flagged_not_counted_as_a_capped_solve():
    """float32 moments that really overflow (rho(F) = 1.3 over 400 steps): the update is undone
    (its gradient is not finite) and the iteration says why: ``metric_nonfinite``, not
    ``solve_capped`` (the solves converged)."""
    game = lqr_game_2d()
    cfg = dict(actor=ActorConfig(lr=0.05, theta0_std=0.0))
    tr = lqr.make_train(game, "exact", lqr.TrainConfig(iterations=3, episodes=2, **cfg))
    init = tr.init(jax.random.key(0), lqr.HParams())
    state = init._replace(actor=jnp.asarray([0.0, 0.8], jnp.float32))  # eigenvalue 1.3
    state, m = tr.run(state, lqr.HParams(), 3)
    m = {k: np.asarray(v) for k, v in m.items()}
    assert m["metric_nonfinite"].tolist() == [1, 1, 1]
    assert m["solve_capped"].tolist() == [0, 0, 0]
    np.testing.assert_array_equal(state.actor, np.float32([0.0, 0.8]))


def test_a_complex_array_is_refused():
    """A complex A lost its imaginary part with only a numpy ComplexWarning."""
    base = lqr_game()
    with pytest.raises(ValueError, match=r"A must be real, got a complex array"):
        dataclasses.replace(base, A=base.A + 0.5j).validate()
    with pytest.raises(ValueError, match=r"Sigma must be real"):
        dataclasses.replace(base, Sigma=base.Sigma * (1 + 0j)).validate()


def test_a_list_theta_is_refused_by_name():
    """A Python list theta raised AttributeError ('list' object has no attribute 'dtype')."""
    base = lqr_game()
    for fn in (leader_objective, exact_hypergradient, best_response, hypergradient_split):
        with pytest.raises(ValueError, match=r"theta must be one array .*got a list of 2; pass"):
            fn(base, [-5.0, 1.0], 0.1)


@pytest.mark.slow
def test_an_integer_scalar_horizon_is_accepted():
    """``horizon=jnp.int32(10)`` was refused as "must be a positive integer, got 10"."""
    base, th = lqr_game(), jnp.array([-5.0, 1.0])
    want = float(leader_objective(base, th, 0.1, horizon=10))
    for h in (jnp.int32(10), np.int64(10), jnp.asarray(10)):
        assert float(leader_objective(base, th, 0.1, horizon=h)) == want
    np.testing.assert_array_equal(
        exact_hypergradient(base, th, 0.1, horizon=jnp.int32(10)),
        exact_hypergradient(base, th, 0.1, horizon=10),
    )
    for bad in (jnp.float32(10.0), jnp.int32(0), jnp.array([10, 10]), True):
        with pytest.raises(ValueError, match="horizon must be a positive integer"):
            leader_objective(base, th, 0.1, horizon=bad)


@pytest.mark.slow
def test_a_myopic_follower_has_no_influence_sums_to_cut():
    """gamma_F = 0: ``influence_steps`` is 0, and ``exact_critic_estimate`` with 0 extra steps
    warned that the sums were cut at gamma_F^0 = 1 ("take extra_steps >= 0"); a cut that does
    lose weight still warns."""
    game = lqr_game(gamma_F=0.0)
    assert lqr.influence_steps(game) == 0
    kw = dict(episodes=2, leader_steps=5, samples=2)
    theta = jnp.asarray([0.3, 0.1])
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        g = lqr.exact_critic_estimate(game, theta, 0.2, jax.random.key(0), extra_steps=0, **kw)
    assert np.all(np.isfinite(g))
    with pytest.warns(UserWarning, match="cuts the follower's influence sums"):
        lqr.exact_critic_estimate(lqr_game(), theta, 0.2, jax.random.key(0), extra_steps=0, **kw)
