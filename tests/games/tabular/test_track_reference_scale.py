"""``track_reference``'s projection is 1 for an unbiased estimate: the tracked estimate is the
minibatch gradient (segment starts drawn ~ gamma_L^t / Z) times Z = sum_{t<T} gamma_L^t.

With exact critics and the paper backup (where Theorem 2's estimator is unbiased) the mean
projection over minibatches is 1 within sampling error; it was 1/Z (0.2 here) before."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from bchg_jax.core.buffers import buffer_add, buffer_init
from bchg_jax.games import tabular as tgame
from bchg_jax.games.tabular.exact import best_response, leader_values
from bchg_jax.games.tabular.rollout import rollout
from bchg_jax.problems import random_tabular_game


@pytest.mark.slow
def test_tracked_projection_of_an_unbiased_estimate_is_one(x64):
    game = random_tabular_game()  # gamma 0.8, 60-step episodes: Z = 5.0
    T, E, beta = int(game.time_limit), 4000, 0.5
    # the paper backup, no direct baseline: Theorem 2's estimator is unbiased (the default
    # "reference" baseline is biased: mean proj 0.58 here)
    config = tgame.TrainConfig(
        actor="tabular", dtype="float64", backup="paper", direct_baseline="none"
    )
    tr = tgame.make_train(game, "bchg", config)
    theta = jnp.asarray(np.random.default_rng(1).normal(size=(4, 2)))
    f = jax.nn.softmax(theta, -1)
    br = best_response(game, f, beta, "paper")
    _, Q_L = leader_values(game, f, br.policy)  # the exact critic
    ep = rollout(jax.random.key(0), game, f, br.policy, E, T + 1)
    buf = buffer_add(buffer_init(E, T, jnp.int32), ep.s, ep.a[:, :T], ep.b[:, :T], "on")
    metrics = jax.jit(
        jax.vmap(lambda k: tr.steps["reference_metrics"](k, theta, Q_L, br, beta, buf))
    )(jax.random.split(jax.random.key(1), 64))
    proj = np.asarray(metrics["proj_target"])
    # proj is linear in the estimate: its mean is the projection of the mean estimate
    assert abs(proj.mean() - 1.0) < 4 * proj.std() / np.sqrt(proj.size) + 0.05, proj.mean()
    np.testing.assert_allclose(metrics["proj_through"], proj, rtol=1e-8)  # best response
    assert np.mean(np.asarray(metrics["cos_target"])) > 0.9
