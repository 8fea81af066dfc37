"""The LQR game's exact references check the follower's Riccati convergence (the lq
defaults: tol 1e-6, 50,000 iterations), and the trainer's flags tell a failed solve from
another non-finite update."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from bchg_jax.games import lqr
from bchg_jax.games.lqr.estimator import estimator
from bchg_jax.games.lqr.exact import exact_hypergradient, hypergradient_split, leader_objective
from bchg_jax.problems.lqr_game import lqr_game

GF = 0.99


def _slow_game():
    """Valid and stabilisable, but near-marginal: the cold Riccati solve needs ~1850 steps."""
    return lqr.LQRGame(
        A=np.array([[1.005 / np.sqrt(GF)]]),
        B=np.array([[1.0]]),
        C=np.array([[1.0]]),
        Qbar=np.array([[1e-8]]),
        Rbar=np.array([[1.0]]),
        s0=np.array([1.0]),
        s_star=np.array([0.5]),
        Sigma=np.array([[1.0]]),
        U=np.array([[0.3]]),
        gamma_F=GF,
        gamma_L=0.99,
        horizon=100,
    ).validate(np.zeros(1))


@pytest.mark.slow
def test_exact_hypergradient_converges_or_refuses(x64):
    """The old hard-coded cap (1000) gave 1221.4 against finite differences 454.5, silently."""
    game, th, beta = _slow_game(), jnp.zeros(1), 0.1
    g = float(exact_hypergradient(game, th, beta)[0])
    eps = 1e-6
    # finite differences of a tightly solved objective (tol 1e-6 leaves P off near marginal)
    J = lambda t: float(  # noqa: E731
        leader_objective(game, jnp.array([t]), beta, gamma=0.99, tol=1e-13)
    )
    fd = (J(eps) - J(-eps)) / (2 * eps)
    assert abs(g - fd) < 1e-3 * abs(fd), (g, fd)
    assert abs(fd - 454.5) < 1.0
    for fn in (leader_objective, exact_hypergradient, hypergradient_split):
        with pytest.raises(ValueError, match="did not converge"):
            fn(game, th, beta, max_iters=1000)
        out = jax.jit(lambda t, fn=fn: fn(game, t, beta, max_iters=1000))(th)
        assert np.all(np.isnan(np.asarray(jax.tree.leaves(out))))


@pytest.mark.slow
def test_exact_method_uses_the_configured_solve():
    """The trainer's ``exact`` objective solves with config.follower_tol / follower_max_iters:
    its first gradient is the exact hypergradient (with the old hard-coded cap of 1000 it was
    ~2.7x too large)."""
    with jax.enable_x64(True):
        game = _slow_game()
        config = lqr.TrainConfig(
            iterations=1,
            dtype="float64",
            follower_max_iters=50_000,
            actor=lqr.ActorConfig(theta0_std=0.0),
            exploration=lqr.ExplorationConfig(warmup_steps=0),
        )
        trainer = lqr.make_train(game, "exact", config)
        hp = jax.tree.map(lambda x: x[0], trainer.hparams({"actor_steps": np.array([1])}))
        _, m = trainer.train(jax.random.PRNGKey(0), hp)
        # 454.5: finite differences (test_exact_hypergradient_converges_or_refuses)
        assert abs(float(m["grad_norm"][0]) - 454.5) < 1.0, m["grad_norm"]
        assert int(m["update_skipped"][0]) == 0 and int(m["solve_capped"][0]) == 0


@pytest.mark.slow
def test_nan_gradient_is_skipped_not_capped():
    """A NaN estimate that no Riccati solve caused is ``update_skipped``, not ``solve_capped``
    (the two metrics used to be the same)."""
    config = lqr.TrainConfig(
        iterations=2,
        minibatch=8,
        exploration=lqr.ExplorationConfig(warmup_steps=0),
        estimator=lqr.EstimatorConfig(benefit_samples=4, baseline_samples=4),
    )
    nan_baseline = estimator(config.estimator)._replace(baseline=lambda *a: jnp.nan)
    trainer = lqr.make_train(lqr_game(), "naive", config, estimator_pieces=nan_baseline)
    hp = jax.tree.map(lambda x: x[0], trainer.hparams({"actor_steps": np.array([1])}))
    _, m = trainer.train(jax.random.PRNGKey(0), hp)
    assert np.all(np.asarray(m["update_skipped"]) == 1)
    assert np.all(np.asarray(m["solve_capped"]) == 0)
    assert np.all(np.isnan(np.asarray(m["grad_norm"])))


def test_game_no_gain_can_stabilise_is_refused():
    """C = 0 and an unstable mode B cannot reach: validate() and make_train accepted it and the
    run reported J = NaN; now refused before compiling."""
    bad = lqr.LQRGame(
        A=np.array([[1.3, 0.0], [0.4, 0.8]]),
        B=np.array([[0.0], [1.0]]),
        C=np.zeros((2, 1)),
        Qbar=np.eye(2),
        Rbar=np.eye(1),
        s0=np.ones(2),
        s_star=np.zeros(2),
        Sigma=np.eye(2),
        U=np.array([[0.3]]),
        gamma_F=0.9,
        gamma_L=0.9,
        horizon=20,
    )
    with pytest.raises(ValueError, match="no leader gain"):
        bad.validate()
    for method in ("exact", "bchg"):
        with pytest.raises(ValueError, match="no leader gain"):
            lqr.make_train(bad, method, lqr.TrainConfig(iterations=2))
    # the same game with a leader that reaches the mode is accepted
    dataclasses.replace(bad, C=np.array([[1.0], [0.0]])).validate()


def test_leader_without_noise_is_refused_for_score_methods():
    """U = 0: log f_theta(a|s) is NaN, so bchg / naive ran with every update skipped; they are
    refused, the deterministic and exact methods accept it."""
    game = dataclasses.replace(lqr_game(), U=np.zeros((1, 1)))
    config = lqr.TrainConfig(iterations=2)
    for method in ("bchg", "naive"):
        with pytest.raises(ValueError, match="positive diagonal of U"):
            lqr.make_train(game, method, config)
    for method in ("bchg_det", "exact"):
        lqr.make_train(game, method, config)
