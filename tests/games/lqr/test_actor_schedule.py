"""The LQR game leader's cosine learning rate spans the run's actor updates: ``actor_steps`` per
iteration after the critic-only warm-up (``ActorConfig.lr_schedule``, ``train.actor_updates``)."""

import jax
import numpy as np
import optax
import pytest

from bchg_jax.games import lqr
from bchg_jax.games.lqr.config import ActorConfig, ExplorationConfig
from bchg_jax.problems.lqr_game import gain_metrics, lqr_game


def _train(iterations, actor_steps, warmup_steps):
    game = lqr_game()
    config = lqr.TrainConfig(
        iterations=iterations,
        actor=ActorConfig(lr=0.05, lr_schedule="cosine"),
        exploration=ExplorationConfig(warmup_steps=warmup_steps),
    )
    tr = lqr.make_train(game, "exact", config, metrics_fn=gain_metrics)
    hp = jax.tree.map(lambda x: x[0], tr.hparams({"actor_steps": np.array([actor_steps])}))
    state, m = jax.jit(tr.train)(jax.random.PRNGKey(3), hp)
    return game, config, state, m


@pytest.mark.slow
def test_cosine_schedule_keeps_the_leader_moving_to_the_last_iteration():
    """5 actor steps per iteration: theta moves in every iteration, by less and less, and the
    Adam count at the end is the run's 100 updates (before: the decay spanned 20 steps, so
    theta froze after iteration 4)."""
    game, config, state, m = _train(20, 5, 0)
    step = np.abs(np.diff(np.asarray(m["K1"])))
    assert np.all(step > 0), step
    assert step[-1] < 0.05 * step.max()  # the rate has decayed by the end
    counts = optax.tree_utils.tree_get_all_with_path(state.actor_opt, "count")
    assert {int(c) for _, c in counts} == {100}

    from bchg_jax.games.lqr.train import actor_updates

    assert int(actor_updates(config, game.horizon, 5)) == 100


@pytest.mark.slow
def test_cosine_rate_reaches_zero_at_the_last_update_after_the_warm_up():
    """12 iterations, 2 of them warm-up, 3 actor steps: 30 updates; the rate of every update is
    positive, the last one's ~ lr (pi / 60)^2, and the schedule's end (0) is the count the run
    ends at."""
    from bchg_jax.games.lqr.train import actor_updates, warmup_iterations

    game, config, state, m = _train(12, 3, 800)
    assert warmup_iterations(config, game.horizon) == 2
    n = int(actor_updates(config, game.horizon, 3))
    assert n == 30
    counts = optax.tree_utils.tree_get_all_with_path(state.actor_opt, "count")
    assert {int(c) for _, c in counts} == {n}
    K1 = np.asarray(m["K1"])
    assert np.all(K1[:2] == K1[0]) and np.all(np.diff(K1[1:]) != 0)  # warm-up, then moving
    rate = config.actor.learning_rate(n)
    lr = np.array([float(rate(c)) for c in range(n + 1)])
    assert np.all(lr[:n] > 0) and np.all(np.diff(lr) < 0)
    np.testing.assert_allclose(lr[n - 1], 0.05 * np.sin(np.pi / (2 * n)) ** 2, rtol=1e-5)
    assert lr[n] == 0.0 and lr[n - 2] > 3 * lr[n - 1]
