"""Toy Markov game: the reference ground-truth values from the exact evaluator; follower backups."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from bchg_jax.games.tabular.exact import best_response, leader_return, leader_values
from bchg_jax.games.tabular.follower import soft_q_iteration
from bchg_jax.games.tabular.game import TabularGame
from bchg_jax.problems import random_tabular_game
from bchg_jax.problems.toy_game import leader_policy_from_p, toy_game


def _rets(game, ps, backup="reference"):
    """Exact 150-step leader returns and g(.|S, A) at leader policies p in ``ps`` (one vmapped,
    jitted program: eager calls would compile every operation)."""

    def one(p):
        f = leader_policy_from_p(p, jnp.float64)
        br = best_response(game, f, 0.05, backup)
        return leader_return(game, f, br.policy), br.policy[0, 0]

    r, g = jax.jit(jax.vmap(one))(jnp.asarray(ps, jnp.float64))
    return np.asarray(r), np.asarray(g)


def test_ground_truth_values_reference_backup(x64):
    game = toy_game(2.0, dtype=jnp.float64)
    ps = np.linspace(0.40, 0.60, 41)
    r, g = _rets(game, np.concatenate([[0.40, 0.51, 0.53, 1.0], ps]))
    assert abs(r[0] - 32.6) < 0.05
    np.testing.assert_allclose(g[0], [0.0, 0.47, 0.53], atol=0.006)
    assert abs(r[1] - 59.5) < 0.05
    assert abs(r[2] - 59.3) < 0.05
    assert abs(r[3] - 50.0) < 1e-6
    best = ps[int(np.argmax(r[4:]))]
    assert abs(best - 0.51) <= 0.0051


def test_paper_backup_optimum(x64):
    game = toy_game(2.0, dtype=jnp.float64)
    ps = np.linspace(0.45, 0.55, 41)
    rets = _rets(game, ps, "paper")[0]
    i = int(np.argmax(rets))
    assert abs(ps[i] - 0.50) <= 0.0051 and abs(rets[i] - 59.75) < 0.05


def test_soft_q_iteration_fixed_point_and_warm_start(x64):
    game = toy_game(2.0, dtype=jnp.float64)
    f = leader_policy_from_p(0.45, jnp.float64)
    exact = best_response(game, f, 0.05)
    br = soft_q_iteration(game, f, 0.05, tol=1e-10, max_sweeps=100_000)
    np.testing.assert_allclose(br.Q, exact.Q, atol=1e-8)
    warm = soft_q_iteration(
        game, leader_policy_from_p(0.46, jnp.float64), 0.05, Q0=br.Q, tol=1e-10, max_sweeps=100_000
    )
    cold = soft_q_iteration(
        game, leader_policy_from_p(0.46, jnp.float64), 0.05, tol=1e-10, max_sweeps=100_000
    )
    assert int(warm.sweeps) < int(cold.sweeps)
    np.testing.assert_allclose(warm.Q, cold.Q, atol=1e-7)


def test_implicit_gradient_of_the_leader_return(x64):
    game = toy_game(2.0, dtype=jnp.float64)

    def J(p):
        f = leader_policy_from_p(p, jnp.float64)
        br = best_response(game, f, 0.05, tol=1e-13, max_sweeps=200_000)
        return leader_return(game, f, br.policy, gamma=0.99)

    h = 1e-5
    fd = (jax.jit(J)(0.45 + h) - jax.jit(J)(0.45 - h)) / (2 * h)
    np.testing.assert_allclose(jax.jit(jax.grad(J))(0.45), fd, rtol=1e-5)


def test_leader_values_satisfy_bellman(x64):
    game = toy_game(2.0, dtype=jnp.float64)
    f = leader_policy_from_p(0.5, jnp.float64)
    g = best_response(game, f, 0.05).policy
    V, Q = leader_values(game, f, g)
    np.testing.assert_allclose(V, jnp.sum(f[:, :, None] * g * Q, axis=(1, 2)), atol=1e-10)
    # infinite-horizon discounted value from S equals the long discounted exact return
    np.testing.assert_allclose(V[0], leader_return(game, f, g, horizon=5000, gamma=0.99), rtol=1e-8)


def test_game_validation():
    game = toy_game()
    with pytest.raises(ValueError, match="transition"):
        TabularGame(
            game.transition[..., :2],
            game.init_dist,
            game.follower_reward,
            game.leader_reward,
            0.99,
            0.99,
        ).validate()
    with pytest.raises(ValueError, match="gamma_F"):
        TabularGame(
            game.transition, game.init_dist, game.follower_reward, game.leader_reward, 1.0, 0.99
        ).validate()
    with pytest.raises(ValueError, match="leader_reward"):
        TabularGame(
            game.transition,
            game.init_dist,
            game.follower_reward,
            game.leader_reward[:, :1],
            0.99,
            0.99,
        ).validate()
    with pytest.raises(ValueError, match="backup"):
        soft_q_iteration(game, leader_policy_from_p(0.5), 0.05, backup="mine")


def _theorem2_bias(game, theta_shape, beta, episodes, seed, guide):
    """games.tabular.check_problem's bias in SE of Theorem 2's estimator with exact critics
    (200 batches, a tabular-softmax leader drawn with ``seed``, paper backup)."""
    from bchg_jax.games.tabular import check_problem

    theta = [jnp.asarray(np.random.default_rng(seed).normal(size=theta_shape))]
    policy_fn = lambda th: jax.nn.softmax(th, axis=-1)  # noqa: E731
    key = jax.random.PRNGKey(seed + 5)
    kw = dict(backup="paper", episodes=episodes, batches=200, key=key, verbose=False)
    (row,) = check_problem(game, policy_fn, theta, beta, guide=guide, **kw)
    return row["bias_se"]


@pytest.mark.slow
def test_theorem2_estimator_unbiased_with_exact_critics(x64, backup_game):
    """BC-HG (Theorem 2) with exact Q_L, V_F and a tabular-softmax leader: mean within 4 SE of
    the exact hypergradient (implicit differentiation through soft Q-iteration, paper backup);
    Naive-PGD (direct term only) is far from it. On random_tabular_game (both discounts 0.8)
    and on a game whose discounts differ (gamma_F 0.7, gamma_L 0.9), where the guiding term's
    forward sums discount with gamma_F (with gamma_L the mean was 6.6 SE off)."""
    game = random_tabular_game()
    assert _theorem2_bias(game, (4, 2), 0.5, 200, 1, "benefit") < 4
    assert _theorem2_bias(game, (4, 2), 0.5, 200, 1, "none") > 8
    assert _theorem2_bias(backup_game(), (5, 3), 0.1, 100, 2, "benefit") < 4


@pytest.mark.slow
def test_actor_critic_training_bchg_holds_naive_falls():
    """3 seeds x 150 iterations (reference settings): BC-HG keeps the exact return near the
    optimum, Naive-PGD (on-policy, 1 actor / 20 critic steps) drifts to the follower-avoids-A
    regime (the paper's figure)."""
    from bchg_jax.core.sweep import run_grid
    from bchg_jax.games.tabular.train import TrainConfig as GameTrainConfig
    from bchg_jax.games.tabular.train import make_train as make_train_game

    out = {}
    for method, steps in (("bchg", (1, 1)), ("naive", (1, 20))):
        tr = make_train_game(toy_game(2.0), method, GameTrainConfig(iterations=150))
        grid = {"actor_steps": np.array([steps[0]]), "critic_steps": np.array([steps[1]])}
        _, m = run_grid(tr, grid, seeds=3, iterations=150, chunk=150, verbose=False)
        out[method] = m["J"][0, :, -20:].mean()
        assert np.all(np.isfinite(m["J"]))
    assert out["bchg"] > 57.0, out
    assert out["naive"] < 50.0, out


def test_game_trainer_validation():
    from bchg_jax.games.tabular.train import TrainConfig as GameTrainConfig
    from bchg_jax.games.tabular.train import make_train as make_train_game

    with pytest.raises(ValueError, match="method"):
        make_train_game(toy_game(), "sobirl")
    with pytest.raises(ValueError, match="buffer"):
        make_train_game(toy_game(), "bchg", GameTrainConfig(buffer="replay"))
    tr = make_train_game(toy_game(), "bchg", GameTrainConfig(iterations=2))
    with pytest.raises(ValueError, match="actor_steps"):
        tr.hparams({"actor_steps": np.array([30]), "critic_steps": np.array([1])})
