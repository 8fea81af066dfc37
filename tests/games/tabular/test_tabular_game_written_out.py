"""The tabular game's exact pieces against their formulas written out in NumPy, on a random game
whose discounts differ (gamma_F 0.7, gamma_L 0.9, random rho_0): the follower's soft
Q-iteration, the leader's returns and objective, the k-step and lag followers' reactions, the
truncated hypergradient without a cut, the dtype the tables promote to and the start
distribution's sign check. A mutation audit planted a bug in each that no other test caught:
the toy game has equal discounts, a chain that hides a transpose and a beta at which the lag
follower's two policies barely differ."""

import dataclasses
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import _backup_game

from bchg_jax.core.follower_model import FollowerModel
from bchg_jax.games import tabular as games_tabular
from bchg_jax.games.tabular import exact as ex
from bchg_jax.games.tabular import train as games_train
from bchg_jax.games.tabular.check import check_problem, truncated_hypergradient
from bchg_jax.games.tabular.follower import soft_q_iteration
from bchg_jax.games.tabular.follower_models import follower_pieces, q_learning_update
from bchg_jax.games.tabular.game import compute_dtype
from bchg_jax.games.tabular.rollout import GameEpisodes
from bchg_jax.problems.toy_game import toy_game


def _lse(x):
    return x.max() + np.log(np.sum(np.exp(x - x.max())))


def _next_value(Q, f, beta, backup):
    """v(s') of either backup: paper sum_a f beta lse(Q / beta), reference
    beta lse(sum_a f Q / beta)."""
    S, A = f.shape
    if backup == "paper":
        return np.array(
            [sum(f[t, a] * beta * _lse(Q[t, a] / beta) for a in range(A)) for t in range(S)]
        )
    return np.array(
        [beta * _lse(sum(f[t, a] * Q[t, a] for a in range(A)) / beta) for t in range(S)]
    )


def _backup(game, Q, f, beta, backup="reference"):
    P, rF = np.asarray(game.transition), np.asarray(game.follower_reward)
    return rF + game.gamma_F * np.einsum("sabt,t->sab", P, _next_value(Q, f, beta, backup))


@pytest.mark.parametrize("backup", ["paper", "reference"])
def test_soft_q_iteration_is_the_follower_bellman_equation(x64, backup):
    """Q = r_F + gamma_F P v(Q) under gamma_F 0.7 != gamma_L 0.9 (with gamma_L the Newton
    polish of best_response still landed on the right fixed point)."""
    game = _backup_game(None)
    f = np.random.default_rng(1).dirichlet(np.ones(3), size=5)
    Q = np.asarray(soft_q_iteration(game, f, 0.3, backup, tol=1e-12, max_sweeps=10**5).Q)
    np.testing.assert_allclose(Q, _backup(game, Q, f, 0.3, backup), atol=1e-9)


def test_leader_returns_and_objective_written_out(x64):
    """leader_returns: sum_t gamma^t (d_t . r_pi) with the row vector d_{t+1} = d_t P_pi from
    rho_0; leader_objective_at: rho_0 . (I - gamma_L P_pi)^-1 r_pi."""
    game = _backup_game(50)
    P, rL, rho = (np.asarray(x) for x in (game.transition, game.leader_reward, game.init_dist))
    S, A, B = rL.shape
    rng = np.random.default_rng(5)
    f, g = rng.dirichlet(np.ones(A), size=S), rng.dirichlet(np.ones(B), size=(S, A))
    pi = f[:, :, None] * g
    P_pi, r_pi = np.einsum("sab,sabt->st", pi, P), np.sum(pi * rL, (1, 2))
    d, want = rho.copy(), np.zeros(2)
    for t in range(50):
        want += np.array([1.0, 0.9**t]) * (d @ r_pi)
        d = d @ P_pi
    got = ex.leader_returns(game, jnp.asarray(f), jnp.asarray(g), (1.0, 0.9))
    np.testing.assert_allclose(np.asarray(got), want, rtol=1e-10)
    J = rho @ np.linalg.solve(np.eye(S) - 0.9 * P_pi, r_pi)
    got = ex.leader_objective_at(game, jnp.asarray(f), jnp.asarray(g))
    np.testing.assert_allclose(float(got), J, rtol=1e-10)


def test_k_step_follower_is_k_backups_of_its_table(x64):
    """steps = 2: after the leader moves f0 -> f1 the follower's table is two soft backups of its
    last one under f1, and it plays softmax(table / beta)."""
    game = _backup_game(None)
    rng = np.random.default_rng(0)
    f0, f1 = (rng.dirichlet(np.ones(3), size=5) for _ in range(2))
    beta = 0.5
    model = FollowerModel("k_step", steps=2).validate()
    pieces = follower_pieces(game, model, "reference", 1e-12, 10**5)
    start = pieces.follower(jnp.asarray(f0), beta)
    new = pieces.follower(jnp.asarray(f1), beta, start)
    Q = np.asarray(start.own)
    for _ in range(2):
        Q = _backup(game, Q, f1, beta)
    np.testing.assert_allclose(np.asarray(new.own), Q, atol=1e-10)
    want = np.exp(Q / beta) / np.exp(Q / beta).sum(-1, keepdims=True)
    np.testing.assert_allclose(np.asarray(new.policy), want, atol=1e-10)


def test_lag_follower_mixes_its_last_policy_and_the_best_response(x64):
    """mix 0.3, beta 0.5, a large leader move: the played policy, exp(log_policy) and its value
    are those of (1 - mix) g_prev + mix g_best (at beta 1e-3 the two barely differ, and the
    weights swapped passed)."""
    game = _backup_game(None)
    rng = np.random.default_rng(0)
    f0, f1 = (jnp.asarray(rng.dirichlet(np.ones(3), size=5)) for _ in range(2))
    beta, mix = 0.5, 0.3
    pieces = follower_pieces(
        game, FollowerModel("lag", mix=mix).validate(), "reference", 1e-12, 10**5
    )
    start = pieces.follower(f0, beta)
    new = pieces.follower(f1, beta, start)
    g0, g1 = (np.asarray(ex.best_response(game, f, beta).policy) for f in (f0, f1))
    assert np.abs(g0 - g1).max() > 1e-2
    want = (1 - mix) * g0 + mix * g1
    np.testing.assert_allclose(np.asarray(new.policy), want, atol=1e-9)
    np.testing.assert_allclose(np.exp(np.asarray(new.log_policy)), want, atol=1e-9)
    _, V = ex.soft_policy_evaluation(game, f1, jnp.asarray(want), beta, "reference")
    np.testing.assert_allclose(np.asarray(new.V), np.asarray(V), atol=1e-8)


def test_truncated_hypergradient_with_a_long_cut_is_the_exact_one(x64):
    """At distinct discounts (the check's other exact test has both at 0.8): the truncated
    expectation at 400 steps is the exact hypergradient, and so is check_problem's uncut
    expectation (its cut_bias, the two targets' gap, is rounding)."""
    game = _backup_game(None)
    policy = lambda th: jax.nn.softmax(th, -1)  # noqa: E731
    theta = jnp.asarray(np.random.default_rng(2).normal(size=(5, 3)))
    exact = ex.exact_hypergradient(policy, theta, game, 0.1, "paper")
    long = truncated_hypergradient(game, policy, theta, 0.1, 400, backup="paper")
    np.testing.assert_allclose(np.asarray(long), np.asarray(exact), rtol=1e-9, atol=1e-12)
    kw = dict(backup="paper", episodes=2, horizon=400, batches=2, verbose=False)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # two batches cannot resolve anything
        (row,) = check_problem(game, policy, [theta], 0.1, key=jax.random.key(0), **kw)
    assert row["cut_bias"] < 1e-9, row["cut_bias"]


def test_tables_promote_the_compute_dtype(x64):
    """A float32 game whose leader reward alone is float64 computes in float64."""
    game = toy_game().astype(jnp.float32)
    game = dataclasses.replace(game, leader_reward=jnp.asarray(game.leader_reward, jnp.float64))
    f = jnp.full((3, 2), 0.5, jnp.float32)
    assert compute_dtype(game, f) == np.float64
    g = jnp.full((3, 2, 3), 1 / 3, jnp.float32)
    assert ex.leader_values(game, f, g)[0].dtype == jnp.float64


def test_a_negative_start_probability_is_refused():
    """rho_0 = (1.05, -0.05, 0) sums to 1 and is still refused, by name."""
    game = dataclasses.replace(toy_game(), init_dist=jnp.array([1.05, -0.05, 0.0]))
    with pytest.raises(ValueError, match="init_dist.*negative|negative.*init_dist"):
        game.validate()


def test_q_learning_follower_update_written_out(x64):
    """Two soft Q-learning steps along one episode, paper backup: Q(s, a, b) += lr (r_F +
    gamma_F v(s') - Q(s, a, b)), v(s') = sum_a f beta lse(Q(s', a) / beta), under gamma_F 0.7."""
    game, beta, lr = _backup_game(None), 0.3, 0.3
    rng = np.random.default_rng(0)
    f = rng.dirichlet(np.ones(3), size=5)
    Q0 = rng.normal(size=(5, 3, 4))
    ep = GameEpisodes(jnp.asarray([[0, 1, 3]]), jnp.asarray([[0, 2]]), jnp.asarray([[1, 3]]))
    got = q_learning_update(game, jnp.asarray(Q0), ep, jnp.asarray(f), beta, "paper", lr)
    Q, rF = Q0.copy(), np.asarray(game.follower_reward)
    for s, a, b, s2 in [(0, 0, 1, 1), (1, 2, 3, 3)]:
        v = _next_value(Q, f, beta, "paper")[s2]
        Q[s, a, b] += lr * (rF[s, a, b] + 0.7 * v - Q[s, a, b])
    np.testing.assert_allclose(np.asarray(got), Q, atol=1e-10)


def test_trainer_surrogate_discounts_the_influence_sums_with_gamma_F(monkeypatch):
    """The tabular-game trainer's actor surrogate weighs step k of a segment starting at t by
    gamma_F^(k-t), on a game with gamma_F 0.5 != gamma_L 0.9 (the weights it builds, captured
    as it runs; with gamma_L the Theorem-2 tests on the toy game passed)."""
    game = dataclasses.replace(_backup_game(10).astype(jnp.float32), gamma_F=0.5).validate()
    caught = []
    built = games_train.influence_weights

    def spy(t, T, gamma_F, dtype):
        W = built(t, T, gamma_F, dtype)
        jax.debug.callback(lambda t, W: caught.append((np.asarray(t), np.asarray(W))), t, W)
        return W

    monkeypatch.setattr(games_train, "influence_weights", spy)
    tr = games_tabular.make_train(
        game, "bchg", games_tabular.TrainConfig(actor="tabular", episodes=4, iterations=2)
    )
    hp = games_tabular.HParams(1, 1, 0.3)
    jax.block_until_ready(tr.run(tr.init(jax.random.key(0), hp), hp, 2))
    assert caught
    for t, W in caught:
        k = np.arange(W.shape[1])[None, :] - t[:, None]
        np.testing.assert_allclose(W, np.where(k >= 0, 0.5 ** np.maximum(k, 0), 0.0), atol=1e-6)
