"""The tabular solvers' stopping rule at the float rounding floor (bchg_jax.core.rounding).

A float32 solve whose values are large cannot get its sup-norm change below 1e-6: before the
rule, Four-Rooms at beta 0.3 ran every solve to its cap and flagged every iteration. Solves
that do converge (to an exact fixed point of the rounded sweep) must run as before.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from bchg_jax.core import rounding
from bchg_jax.core.rounding import (
    keep_sweeping,
    progress_init,
    progress_update,
    rounding_floor,
    stall_window,
    sweep_to_tolerance,
    within_tolerance,
)
from bchg_jax.games.tabular.follower import soft_q_iteration
from bchg_jax.problems.fourrooms import fourrooms
from bchg_jax.problems.toy_game import leader_policy_from_p, toy_game
from bchg_jax.tabular import HParams, TrainConfig, make_train
from bchg_jax.tabular.exact import policy_evaluation_sweeps
from bchg_jax.tabular.follower import continuation, soft_value_iteration
from bchg_jax.tabular.sparse import (
    problem_successors,
    sparse_policy_evaluation,
    sparse_soft_value_iteration,
)

CAP = 3000


@pytest.fixture(scope="module")
def rooms():
    prob = fourrooms()
    return prob, problem_successors(prob)


def _tables(prob, seed):
    key = jax.random.PRNGKey(seed)
    theta = prob.theta0 + (0.0 if seed == 0 else 3.0) * jax.random.normal(key, prob.theta0.shape)
    f32 = lambda x: jnp.asarray(x, jnp.float32)  # noqa: E731
    return theta, f32(prob.transition(theta)), f32(prob.follower_reward(theta))


def _reference_v(P, r, beta, gamma, terminal):
    """float64 soft values (numpy): soft value iteration to 1e-13."""
    P, r = np.asarray(P, np.float64), np.asarray(r, np.float64)
    cont = 1.0 - np.asarray(terminal, np.float64)
    V = np.zeros(P.shape[0])
    for _ in range(20_000):
        Q = r + gamma * cont[:, None] * (P @ V)
        m = Q.max(axis=1)
        V2 = m + beta * np.log(np.exp((Q - m[:, None]) / beta).sum(axis=1))
        if np.max(np.abs(V2 - V)) < 1e-13:
            return V2
        V = V2
    raise AssertionError("float64 reference did not converge")


def test_window_floor_and_tests():
    assert int(stall_window(0.99)) == 207 and int(stall_window(0.9)) == 20
    assert int(stall_window(0.0)) == 1
    V = jnp.asarray([-40.0, 3.0], jnp.float32)
    floor = float(rounding_floor(V))
    assert floor == pytest.approx(8 * np.finfo(np.float32).eps * 40.0)
    assert bool(within_tolerance(jnp.float32(0.9 * floor), V, 1e-6))
    assert not bool(within_tolerance(jnp.float32(1.1 * floor), V, 1e-6))
    # a stall below the floor stops only after a whole window without a new minimum
    p = progress_init((), jnp.float32)
    p = progress_update(p, jnp.float32(floor / 2))
    for _ in range(5):  # sweeps without a new minimum: 0, 1, ..., 4 < window 5
        assert bool(keep_sweeping(jnp.float32(floor / 2), V, 1e-6, p, 5))
        p = progress_update(p, jnp.float32(floor / 2))
    assert int(p.since) == 5
    assert not bool(keep_sweeping(jnp.float32(floor / 2), V, 1e-6, p, 5))
    # above the floor a stall never stops the loop
    assert bool(keep_sweeping(jnp.float32(2 * floor), V, 1e-6, p, 5))
    # a diverged solve is never converged (the floor of non-finite values is 0)
    bad = jnp.asarray([jnp.inf, 3.0], jnp.float32)
    assert float(rounding_floor(bad)) == 0.0
    assert not bool(within_tolerance(jnp.float32(jnp.inf), bad, 1e-6))
    assert not bool(within_tolerance(jnp.float32(jnp.nan), V, 1e-6))


def test_sweep_to_tolerance_stops_at_tol_at_the_cap_and_at_a_stall():
    # x -> 0.5 x + 1 from 0: change 0.5^k after sweep k+1, so 1e-3 is met after 11 sweeps
    half = lambda x: 0.5 * x + 1.0  # noqa: E731
    x0 = jnp.zeros((3,), jnp.float64 if jax.config.jax_enable_x64 else jnp.float32)
    x, res, k = sweep_to_tolerance(half, x0, 1e-3, 100, 0.5)
    assert int(k) == 11 and float(res) == pytest.approx(2.0**-10)
    np.testing.assert_allclose(x, 2.0 - 2.0**-10, rtol=1e-6)
    x, res, k = sweep_to_tolerance(half, x0, 1e-3, 4, 0.5)  # the cap
    assert int(k) == 4 and float(res) == pytest.approx(0.125)
    _, res, k = sweep_to_tolerance(half, x0, 1e-3, 0, 0.5)  # no sweep: an infinite change
    assert int(k) == 0 and np.isinf(float(res))
    _, res, k = sweep_to_tolerance(half, x0, jnp.inf, 100, 0.5, min_sweeps=1)  # one regardless
    assert int(k) == 1 and float(res) == 1.0
    # a change stuck at the rounding floor stops after the stall window, not at the cap
    floor = float(rounding_floor(jnp.ones((1,), jnp.float32)))
    stuck = lambda x: x + jnp.where(x > 1.0, -0.5, 0.5) * floor  # noqa: E731
    _, res, k = sweep_to_tolerance(stuck, jnp.ones((1,), jnp.float32), 1e-9, 10_000, 0.5)
    assert int(k) == 1 + int(stall_window(0.5)) and float(res) <= floor


@pytest.mark.parametrize("solver", ["dense", "sparse"])
def test_float32_solves_at_beta_0p3_stop_at_the_rounding_floor_not_the_cap(rooms, solver):
    """Before: every solve ran 3000 sweeps (change ~1.7e-6, above 1e-6) and counted as capped."""
    prob, succ = rooms
    beta = 0.3
    for seed in range(3):
        _, P, r = _tables(prob, seed)
        if solver == "dense":
            br = soft_value_iteration(
                P, r, beta, prob.gamma_F, prob.terminal_mask, tol=1e-6, max_sweeps=CAP
            )
        else:
            br = sparse_soft_value_iteration(
                P, r, beta, prob.gamma_F, succ, prob.terminal_mask, tol=1e-6, max_sweeps=CAP
            )
        ref = _reference_v(P, r, beta, prob.gamma_F, prob.terminal_mask)
        assert int(br.sweeps) < 2000, int(br.sweeps)
        assert bool(within_tolerance(br.residual, br.V, 1e-6))
        # as accurate as the capped solves were (measured 7e-5 to 1.3e-4 against float64)
        assert np.max(np.abs(np.asarray(br.V, np.float64) - ref)) < 5e-4


@pytest.mark.parametrize("solver", ["dense", "sparse"])
def test_float32_policy_evaluation_of_large_values_converges(rooms, solver):
    """Leader rewards x100 (|V_L| ~ 190, an ulp 1.5e-5): the solve converges and the answer is
    float32-accurate."""
    prob, succ = rooms
    theta, P, r = _tables(prob, 0)
    br = soft_value_iteration(P, r, 5e-3, prob.gamma_F, prob.terminal_mask, tol=1e-6)
    rL = 100.0 * jnp.asarray(prob.leader_reward(theta), jnp.float32)
    cont = continuation(prob.terminal_mask, P.shape[0], jnp.float32)
    V0 = jnp.zeros(P.shape[0], jnp.float32)
    if solver == "dense":
        V, res = policy_evaluation_sweeps(
            P, rL, br.policy, prob.gamma_L, cont, V0, 1e-6, CAP, return_residual=True
        )
    else:
        V, res = sparse_policy_evaluation(
            P, rL, br.policy, prob.gamma_L, cont, V0, succ, 1e-6, CAP, return_residual=True
        )
    pol, P64 = np.asarray(br.policy, np.float64), np.asarray(P, np.float64)
    A = np.eye(P.shape[0]) - prob.gamma_L * np.asarray(cont)[:, None] * np.einsum(
        "sb,sbt->st", pol, P64
    )
    exact = np.linalg.solve(A, np.sum(pol * np.asarray(rL, np.float64), axis=1))
    assert float(np.max(np.abs(exact))) > 100
    assert bool(within_tolerance(res, V, 1e-6))
    assert np.max(np.abs(np.asarray(V, np.float64) - exact)) < 2e-5 * np.max(np.abs(exact))


def test_converging_solves_are_not_cut_short(rooms, monkeypatch):
    """Solves that keep improving (here to a change of exactly 0 on this CPU) run sweep for sweep
    as without the rule: a floor alone stopped them up to 150 sweeps early."""
    prob, _ = rooms
    _, P, r = _tables(prob, 0)
    game = toy_game()

    def solves():
        out = [soft_value_iteration(P, r, 1.0, prob.gamma_F, prob.terminal_mask, tol=1e-6)]
        for beta in (0.1, 1.0, 3.0):
            for p in (0.1, 0.9):
                f = leader_policy_from_p(p)
                out.append(soft_q_iteration(game, f, beta, tol=1e-6, max_sweeps=CAP))
        return [(int(b.sweeps), np.asarray(b.Q)) for b in out]

    with_rule = solves()
    monkeypatch.setattr(rounding, "ROUNDING_ULPS", 0)  # no floor: the loops of before the rule
    without = solves()
    for (n, Q), (n0, Q0) in zip(with_rule, without, strict=True):
        assert n == n0 < CAP
        np.testing.assert_array_equal(Q, Q0)


@pytest.mark.slow
def test_trainer_flags_no_capped_solve_at_beta_0p3(rooms):
    """The trainer's solve_capped counts the floor as converged (before: 1 in every
    iteration), and the warm-started solves stop long before the cap."""
    prob, _ = rooms
    config = TrainConfig(num_envs=4, num_steps=50, iterations=10, vi_max_sweeps=CAP)
    trainer = make_train(prob, "bchg", config)
    _, metrics = jax.jit(trainer.train)(jax.random.key(0), HParams(0.1, 0.5, 0.3))
    assert int(np.sum(metrics["solve_capped"])) == 0
    assert int(np.max(metrics["sweeps"][1:])) < 1000
