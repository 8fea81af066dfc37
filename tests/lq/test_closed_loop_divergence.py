"""A follower closed loop F that diverges under a discount (gamma rho(F)^2 >= 1): the
infinite-horizon J_L and the exact leader critic raise on concrete arguments and are NaN when
traced (never a finite wrong-signed number), the check is jit-friendly, and ``validate()``
refuses such a theta0; a finite horizon whose covariance overflows the dtype raises too."""

import dataclasses
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from bchg_jax import lq
from bchg_jax.lq import exact as exact_lq
from bchg_jax.lq.cmdp import LQConfigurableMDP
from bchg_jax.lq.train import TrainConfig, make_train


def _scalar(theta0, gamma_L=0.9):
    """1-d: A = 1.2, B = 1 + 0.1 theta, Rbar = 10, gamma_F = 0.5: the follower's closed loop
    F(theta) = 1.056 at theta = 0 (0.9 F^2 = 1.003), 1.035 at theta = 1 (0.964)."""
    return LQConfigurableMDP(
        A_fn=lambda th: jnp.array([[1.2]], th.dtype) + 0.0 * th[0],
        B_fn=lambda th: jnp.array([[1.0]], th.dtype) * (1.0 + 0.1 * th[0]),
        U=0.1 * np.eye(1),
        Qbar=np.eye(1),
        Rbar=10.0 * np.eye(1),
        leader_quadratic=lambda th: (
            jnp.eye(1, dtype=th.dtype),
            0.1 * jnp.eye(1, dtype=th.dtype),
            jnp.zeros((), th.dtype),
        ),
        init_cov=np.eye(1),
        gamma_F=0.5,
        gamma_L=gamma_L,
        theta0=jnp.full((1,), float(theta0)),
        horizon=100,
        name="scalar",
    )


def _two_state(A, B, Qbar, gamma_L, b_scale, mb, name):
    """A 2-state, 1-action problem with constant A, Qbar and B(theta) = B (1 + b_scale theta)."""
    return LQConfigurableMDP(
        A_fn=lambda th: jnp.asarray(A, th.dtype) + 0.0 * th[0],
        B_fn=lambda th: jnp.asarray(B, th.dtype) * (1.0 + b_scale * th[0]),
        U=0.1 * np.eye(2),
        Qbar=Qbar,
        Rbar=np.eye(1),
        leader_quadratic=lambda th: (
            jnp.eye(2, dtype=th.dtype),
            mb * jnp.eye(1, dtype=th.dtype),
            jnp.zeros((), th.dtype),
        ),
        init_cov=np.eye(2),
        gamma_F=0.9,
        gamma_L=gamma_L,
        theta0=jnp.zeros(1),
        horizon=100,
        name=name,
    )


def _undetectable():
    """The unstable mode 1.2 is not in the follower's cost (Qbar = diag(0, 1)): the Riccati
    iteration converges to a P that leaves it unstable, rho(F) = 1.2."""
    A, B = np.diag([1.2, 0.5]), np.ones((2, 1))
    return _two_state(A, B, np.diag([0.0, 1.0]), 0.9, 0.1, 0.1, "undetectable")


def test_spectral_radius_bound_matches_eigenvalues(x64):
    rng = np.random.default_rng(0)
    mats = [rng.normal(size=(n, n)) * rng.uniform(0.05, 3) for n in (1, 2, 3, 4, 6) * 8]
    mats += [np.triu(rng.normal(size=(4, 4))) * 5 for _ in range(8)]  # non-normal
    mats += [np.array([[0.999, 1e3], [0.0, 0.999]]), np.array([[1.001, 1e3], [0.0, 1.001]])]
    f = jax.jit(exact_lq.log_spectral_radius)
    for M in mats:
        rho = np.max(np.abs(np.linalg.eigvals(M)))
        est = float(np.exp(f(jnp.asarray(M))))
        assert rho * (1 - 1e-12) <= est <= rho * (1 + 1e-7), (M, rho, est)
    assert float(exact_lq.log_spectral_radius(jnp.zeros((3, 3)))) == -np.inf
    stable = jax.vmap(exact_lq.is_discounted_stable, (0, None))(
        jnp.stack([1.05 * jnp.eye(2), 1.06 * jnp.eye(2)]), 0.9
    )
    assert stable.tolist() == [True, False]  # 0.9 * 1.05^2 = 0.992, 0.9 * 1.06^2 = 1.011


@pytest.mark.slow
def test_infinite_horizon_objective_and_critic_refuse_or_are_nan_when_diverging(x64):
    p = _scalar(0.0)
    w = jnp.zeros(1)
    br = p.best_response(w, 0.1, tol=1e-13)
    assert float(exact_lq.leader_objective(p, w, 0.1, 1000, br=br)) < -1e4  # really diverges
    # concrete: an error naming the spectral radius (the value was +325.5, then a silent NaN)
    for call in (
        lambda: exact_lq.leader_objective(p, w, 0.1, None, br=br),
        lambda: exact_lq.leader_objective(p, w, 0.1, None, tol=1e-13),
        lambda: exact_lq.leader_value_quadratic(p, w, br),
        lambda: exact_lq.exact_hypergradient(p, w, 0.1, None, tol=1e-13),
        lambda: exact_lq.components(p, w, br, {"J": p.leader_quadratic(w)}, None),
    ):
        with pytest.raises(ValueError, match=r"spectral radius 1\.056.*diverges"):
            call()
    # traced: NaN (value and gradient)
    jitted = jax.jit(lambda th: exact_lq.leader_objective(p, th, 0.1, None, tol=1e-13))
    assert np.isnan(float(jitted(w)))
    assert np.all(
        np.isnan(np.asarray(jax.jit(lambda th: exact_lq.leader_value_quadratic(p, th, br).Pv)(w)))
    )
    jgrad = jax.jit(lambda th: exact_lq.exact_hypergradient(p, th, 0.1, None, tol=1e-13))
    assert np.all(np.isnan(np.asarray(jgrad(w))))
    # a converging closed loop: the Lyapunov form is the limit of the finite-horizon scan
    w1 = jnp.ones(1)
    br1 = p.best_response(w1, 0.1, tol=1e-13)
    J_inf = float(exact_lq.leader_objective(p, w1, 0.1, None, br=br1))
    J_long = float(exact_lq.leader_objective(p, w1, 0.1, 3000, br=br1))
    np.testing.assert_allclose(J_inf, J_long, rtol=1e-8)
    # undetectable follower cost: rho(F) = 1.2 under gamma 0.9 (was +2.92, then NaN): the
    # Riccati iteration meets its tolerance at a P that is not the stabilising solution, which
    # the solver itself now flags (info.unstable; converged False): an error when concrete,
    # NaN when traced
    q = _undetectable()
    info = q.best_response(jnp.zeros(1), 0.1, tol=1e-13).info
    assert bool(info.unstable) and not bool(info.converged) and float(info.residual) < 1e-13
    with pytest.raises(ValueError, match="not the stabilising one.*does not help"):
        exact_lq.leader_objective(q, jnp.zeros(1), 0.1, None, tol=1e-13)
    traced = jax.jit(lambda th: exact_lq.leader_objective(q, th, 0.1, None, tol=1e-13))
    assert np.isnan(float(traced(jnp.zeros(1))))


@pytest.mark.slow
def test_exact_critic_flags_a_diverging_theta(x64):
    """The trainer (stable at theta0 = 1) with the exact critic at theta = 0: no finite
    estimate, so the step is flagged and skipped."""
    tr = make_train(_scalar(1.0), "bchg", TrainConfig(num_episodes=4, critic="exact"))
    w = jnp.zeros(1)
    br = _scalar(1.0).best_response(w, 0.1, tol=1e-13)
    estimate = jax.jit(tr.steps["estimate"])  # traced, as in training (eager: an error)
    grad = estimate(jax.random.PRNGKey(0), jax.random.PRNGKey(1), w, 0.1, br, ())[0]
    assert not np.all(np.isfinite(np.asarray(grad)))
    grad1 = estimate(
        jax.random.PRNGKey(0),
        jax.random.PRNGKey(1),
        jnp.ones(1),
        0.1,
        _scalar(1.0).best_response(jnp.ones(1), 0.1, tol=1e-13),
        (),
    )[0]
    assert np.all(np.isfinite(np.asarray(grad1)))


def test_validate_refuses_a_diverging_closed_loop_at_theta0():
    with pytest.raises(ValueError, match=r"diverges under gamma_L.*1\.056"):
        _scalar(0.0).validate()
    with pytest.raises(ValueError, match=r"diverges under gamma_L"):
        make_train(_scalar(0.0), "bchg")
    _scalar(1.0).validate()  # 0.9 * 1.035^2 < 1
    _scalar(0.0, gamma_L=0.8).validate()  # 0.8 * 1.056^2 < 1
    with pytest.raises(ValueError, match=r"diverges under gamma_F.*detectable"):
        _undetectable().validate()


def _lazy_follower():
    """1-d: A = theta, B = 1, r_L = +s^2 (the leader is paid for large states), a lazy follower
    (gamma_F 0.5, Rbar 10): the closed loop A - B K diverges under gamma_L = 0.95 from
    theta ~ 1.03, and the leader's ascent takes theta there."""
    return LQConfigurableMDP(
        A_fn=lambda th: jnp.reshape(th[0], (1, 1)),
        B_fn=lambda th: jnp.ones((1, 1)),
        U=np.eye(1) * 0.5,
        Qbar=np.eye(1) * 0.01,
        Rbar=np.eye(1) * 10.0,
        leader_quadratic=lambda th: (-jnp.eye(1), jnp.zeros((1, 1)), jnp.zeros(())),
        init_cov=np.eye(1),
        gamma_F=0.5,
        gamma_L=0.95,
        theta0=jnp.asarray([0.8]),
        horizon=200,
    ).validate()


@pytest.mark.slow
@pytest.mark.parametrize("method", ["bchg", "exact"])
def test_updates_past_the_edge_of_stability_are_dropped_and_flagged(method):
    """validate() checks theta0 only; a run can step past the edge. There J_L and every critic
    diverge: the sampled estimates were finite but meaningless (norm 1e13 against 1e4 just
    inside, no flag) and the run bounced across the edge. Every method's update there is now
    dropped and flagged (``diverging``, ``update_skipped``), as the exact method's NaN was."""
    problem = _lazy_follower()
    hp = lq.HParams(lr=0.05, beta=0.1)
    tr = lq.make_train(problem, method, lq.TrainConfig(iterations=12, num_episodes=8))
    state0 = tr.init(jax.random.key(0), hp)
    final, m = jax.jit(lambda s: tr.run(s, hp, 12))(state0)
    diverging, skipped = np.asarray(m["diverging"]), np.asarray(m["update_skipped"])
    assert diverging.sum() >= 3, diverging  # the case is reached
    assert np.all(skipped[diverging > 0] == 1)
    first = int(np.argmax(diverging))
    at_edge, _ = jax.jit(lambda s: tr.run(s, hp, first))(state0)
    # past the edge the run is frozen (every update there dropped), not bouncing across it
    np.testing.assert_array_equal(np.asarray(final.theta), np.asarray(at_edge.theta))
    assert np.all(diverging[first:] == 1)
    closed = float(at_edge.theta[0]) - float(lq.best_response(problem, at_edge.theta, 0.1).K[0, 0])
    assert problem.gamma_L * closed**2 >= 1.0  # flagged where it should be
    gnorm = np.asarray(m["grad_norm"])
    assert np.all(gnorm[:first] > 0)  # moving before the edge
    # grad_norm is the estimate's, dropped or not (as in the other families), not the 0 that
    # was applied: past the edge every method's estimate blows up (exact 4.8e9 here)
    past = gnorm[first:]
    assert np.all(~np.isfinite(past) | (past > 1e3 * np.median(gnorm[:first]))), past


def test_validate_finds_a_diverging_closed_loop_behind_a_slow_riccati_iteration():
    """A = diag(1 / sqrt(0.9), 0.5), B = [b, 1]: the first mode is barely controllable, and its
    closed loop, 1.0539 (numpy's eigenvalues of A - B K at the Riccati solution), diverges under
    gamma_L = 0.95 (0.95 * 1.0539^2 = 1.055). Under gamma_F the iteration converges at rate
    0.9997; validate's host solver, a plain iteration capped at 50,000 steps, gave up at
    b = 3e-4 and skipped the check, so validate() and make_train passed a problem whose every
    update the trainer then skipped. Its doubling form reaches the limit in a few dozen steps."""
    A, B = np.diag([1.0 / np.sqrt(0.9), 0.5]), np.array([[3e-4], [1.0]])
    problem = _two_state(A, B, np.eye(2), 0.95, 1.0, 1.0, "weak")
    with pytest.raises(ValueError, match=r"diverges under gamma_L: spectral radius 1\.054"):
        problem.validate()
    with pytest.raises(ValueError, match=r"diverges under gamma_L"):
        make_train(problem, "exact")
    # the same limit as the library's Riccati iteration (tol 1e-6 + Newton), in 23k iterations
    br = problem.best_response(problem.theta0, 0.1)
    assert bool(br.converged) and int(br.info.iterations) > 20_000
    rho = np.max(np.abs(np.linalg.eigvals(A - B @ np.asarray(br.K))))
    assert 1.0539 < rho < 1.0540


@pytest.mark.slow
def test_finite_horizon_overflow_is_refused():
    # float32, rho 1.056 over 3000 steps: the covariance overflows (the return was -inf)
    p = _scalar(0.0)
    w = jnp.zeros(1, jnp.float32)
    with pytest.raises(ValueError, match="overflows float32 within the horizon 3000"):
        exact_lq.leader_objective(p, w, 0.1, 3000)
    with pytest.raises(ValueError, match="overflows float32 within the horizon 3000"):
        exact_lq.exact_hypergradient(p, w, 0.1, 3000)
    assert np.isfinite(float(exact_lq.leader_objective(p, w, 0.1, 100)))  # finite: as it is


@pytest.mark.slow
def test_follower_references_refuse_a_diverging_policy(x64):
    from bchg_jax.lq import follower_references as refs

    p = _scalar(0.0)
    w = jnp.zeros(1)
    br = p.best_response(w, 0.1, tol=1e-13)
    with pytest.raises(ValueError, match=r"as_if_optimal_hypergradient.*spectral radius 1\.056"):
        refs.as_if_optimal_hypergradient(p, w, br, 0.1, None)
    with pytest.raises(ValueError, match=r"k_step_hypergradient.*spectral radius"):
        refs.k_step_hypergradient(p, w, br.P, 0.1, 3, None)


@pytest.mark.slow
def test_a_played_policy_diverging_under_gamma_F_is_named(x64):
    """The as-if reference at a learner's policy whose closed loop is stable under gamma_L but
    not gamma_F: its value V^g (a Lyapunov sum under gamma_F) is NaN. The error blamed a
    covariance overflowing float64 within the horizon (1.3^60 does not) and suggested float64
    for a float64 problem."""
    from bchg_jax.lq.follower_models import k_step_response
    from bchg_jax.lq.follower_references import as_if_optimal_hypergradient

    A0 = jnp.asarray([[1.3, 0.2], [0.0, 1.2]])
    p = LQConfigurableMDP(
        A_fn=lambda th: A0 * (1 + 0.05 * th[0]),
        B_fn=lambda th: jnp.eye(2, dtype=th.dtype) * jnp.exp(0.1 * th[1]),
        U=0.3 * np.eye(2),
        Qbar=np.eye(2),
        Rbar=0.5 * np.eye(2),
        leader_quadratic=lambda th: (jnp.eye(2), 0.1 * jnp.eye(2), 0.0 * th[0]),
        init_cov=np.eye(2),
        gamma_F=0.8,
        gamma_L=0.5,
        theta0=jnp.zeros(2),
        horizon=30,
    ).validate()
    # one backup from P = 0: the learner does not act yet (K = 0), F = A, rho 1.3
    played, _ = k_step_response(p, p.theta0, 1.0, jnp.zeros((2, 2)), 1)
    with pytest.raises(ValueError, match=r"gamma_F rho\^2 = 1.352 >= 1.*value of this policy"):
        as_if_optimal_hypergradient(p, p.theta0, played, 1.0)


@pytest.mark.parametrize(
    "piece",
    [pytest.param("Ms", marks=pytest.mark.slow), "c", pytest.param("A", marks=pytest.mark.slow)],
)
def test_a_non_finite_problem_piece_is_named_not_the_closed_loop(piece):
    """A problem never validated whose leader_quadratic (or A) is NaN at theta: the error named a
    stable closed loop (spectral radius 0.88) as overflowing; it names the piece now."""
    base = _scalar(1.0, gamma_L=0.5)
    quad, A_fn = base.leader_quadratic, base.A_fn
    if piece == "A":
        A_fn = lambda th: jnp.array([[0.5]], th.dtype) * (th[0] / th[0] * jnp.nan)  # noqa: E731
    else:
        k = ("Ms", "Mb", "c").index(piece)
        quad = lambda th: tuple(  # noqa: E731
            x * jnp.nan if i == k else x for i, x in enumerate(base.leader_quadratic(th))
        )
    problem = dataclasses.replace(base, leader_quadratic=quad, A_fn=A_fn)
    theta = jnp.ones((1,))
    label = "A(theta)" if piece == "A" else f"leader_quadratic(theta)'s {piece}"
    calls = [
        lambda: lq.leader_objective(problem, theta, 0.5),
        lambda: lq.leader_objective(problem, theta, 0.5, None),
    ]
    if piece != "c":  # a NaN constant has derivative 0: the gradient stays finite
        calls.append(lambda: lq.exact_hypergradient(problem, theta, 0.5, None))
    for call in calls:
        try:
            call()
        except ValueError as e:
            if piece == "A" and "not finite" not in str(e):
                assert "Riccati" in str(e) or "follower" in str(e), e  # the follower fails first
                continue
            assert re.search(re.escape(label) + " is not finite", str(e)), e
            assert "spectral radius" not in str(e), e
        else:
            pytest.fail("a NaN problem piece returned a value")
