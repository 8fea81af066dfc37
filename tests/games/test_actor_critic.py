"""The shared actor-critic skeleton: its minibatch loops, the one state type (and checkpoints of
the two state types it replaced), and the problem metrics the CLIs pass to ``make_train``."""

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from bchg_jax.core.buffers import buffer_init
from bchg_jax.core.io import load_state, save_state
from bchg_jax.games import actor_critic as ac
from bchg_jax.games import lqr, tabular
from bchg_jax.problems.lqr_game import gain_metrics, lqr_game
from bchg_jax.problems.toy_game import toy_game, toy_game_metrics


def test_actor_steps_ascend_and_respect_step_count_and_active():
    """``actor_steps`` ascends the objective (Adam on its negation), runs exactly the traced
    number of steps, none when inactive, and returns the last gradient's norm."""
    opt = optax.sgd(0.1)
    objective = lambda p, batch, key: -jnp.sum((p - 3.0) ** 2)  # noqa: E731
    p0 = jnp.zeros(2)
    p1, _, g1 = ac.actor_steps(opt, objective, None, jax.random.key(0), p0, opt.init(p0), 1, 5)
    np.testing.assert_allclose(p1, [0.6, 0.6], rtol=1e-6)  # 0 + 0.1 * 2 * 3
    np.testing.assert_allclose(g1, np.linalg.norm([6.0, 6.0]), rtol=1e-6)
    p3, _, _ = ac.actor_steps(opt, objective, None, jax.random.key(0), p0, opt.init(p0), 9, 3)
    np.testing.assert_allclose(p3, 3.0 - 3.0 * 0.8**3, rtol=1e-6)  # cut at max_steps = 3
    p_, _, _ = ac.actor_steps(
        opt, objective, None, jax.random.key(0), p0, opt.init(p0), 2, 5, active=False
    )
    np.testing.assert_array_equal(p_, p0)


def test_critic_steps_draw_a_minibatch_and_a_loss_key_per_step():
    """Step i draws ``draw(fold_in(key, i))`` and hands the loss ``fold_in(key, 10_000 + i)``."""
    seen = []

    def loss(params, batch, key):
        jax.debug.callback(lambda b, k: seen.append((int(b), int(k))), batch, key)
        return jnp.sum(params**2)

    def draw(key):
        return jax.random.randint(key, (), 0, 1000)

    def key_int(key):
        return jax.random.randint(key, (), 0, 1000)

    opt = optax.sgd(0.1)
    key = jax.random.key(7)
    p0 = jnp.ones(2)
    ac.critic_steps(opt, lambda p, b, k: loss(p, b, key_int(k)), draw, key, p0, opt.init(p0), 2, 5)
    want = [
        (int(draw(jax.random.fold_in(key, i))), int(key_int(jax.random.fold_in(key, 10_000 + i))))
        for i in range(2)
    ]
    assert seen == want


class _OldLQRState(NamedTuple):  # games/lqr/train.py's TrainState before the shared skeleton
    theta: Any
    theta_targ: Any
    critic: Any
    critic_targ: Any
    actor_opt: Any
    critic_opt: Any
    P: Any
    buffer: Any
    replay: Any
    key: Any
    step: Any


class _OldTabularState(NamedTuple):  # games/tabular/train.py's GameTrainState before it
    actor: Any
    actor_targ: Any
    critic: Any
    critic_targ: Any
    actor_opt: Any
    critic_opt: Any
    Q_F: Any
    buffer: Any
    key: Any
    step: Any


def test_checkpoints_of_the_old_state_types_load_into_the_shared_state(tmp_path):
    """Runs saved before the skeleton resume: ``load_state`` reads each leaf of a
    ``LeaderState`` from its old path (``LeaderState.LEGACY_PATHS``)."""
    hp = lqr.HParams()
    tr = lqr.make_train(lqr_game(), "bchg", lqr.TrainConfig(iterations=1))
    new = tr.init(jax.random.key(0), hp)
    old = _OldLQRState(*new)._replace(theta=new.actor + 1.0, P=new.follower * 2.0)
    old = old._replace(step=jnp.int32(5))
    save_state(str(tmp_path / "lqr"), old, 5)
    got = load_state(str(tmp_path / "lqr"), new)
    assert isinstance(got, ac.LeaderState)
    np.testing.assert_array_equal(got.actor, old.theta)
    np.testing.assert_array_equal(got.follower, old.P)
    assert int(got.step) == 5
    for a, b in zip(jax.tree.leaves(got.critic), jax.tree.leaves(old.critic), strict=True):
        np.testing.assert_array_equal(a, b)

    tt = tabular.make_train(toy_game(), "bchg", tabular.TrainConfig(iterations=1))
    new = tt.init(jax.random.key(0), tabular.HParams())
    crit = jax.tree.map(lambda x: x + 1.0, new.critic.params)
    old = _OldTabularState(
        new.actor, new.actor_targ, crit, new.critic_targ, new.actor_opt, new.critic_opt,
        new.follower + 3.0, new.buffer, new.key, jnp.int32(2),
    )  # fmt: skip
    save_state(str(tmp_path / "tab"), old, 2)
    got = load_state(str(tmp_path / "tab"), new)
    np.testing.assert_array_equal(got.follower, old.Q_F)
    for a, b in zip(jax.tree.leaves(got.critic.params), jax.tree.leaves(crit), strict=True):
        np.testing.assert_array_equal(a, b)
    assert got.replay is None and int(got.step) == 2


@pytest.mark.slow
def test_problem_metrics_come_from_the_caller():
    """The trainers add a problem's metrics only when ``metrics_fn`` is given (the CLIs pass
    ``toy_game_metrics`` / ``gain_metrics``); without it they report none of them."""
    tt = tabular.make_train(
        toy_game(), "naive", tabular.TrainConfig(iterations=1), toy_game_metrics
    )
    _, m = tt.train(jax.random.key(0), tabular.HParams())
    assert m["p"].shape == (1,) and m["g_S"].shape == (1, 3)
    _, m = tabular.make_train(toy_game(), "naive", tabular.TrainConfig(iterations=1)).train(
        jax.random.key(0), tabular.HParams()
    )
    assert "p" not in m and "g_S" not in m
    theta = jnp.array([-4.0, 1.5])
    assert {k: float(v) for k, v in gain_metrics(theta, None).items()} == {"K1": -4.0, "K2": 1.5}
    buf = buffer_init(1, 2)
    assert ac.critic_data(ac.LeaderState(*([None] * 7), buf, None, None, None)) is buf
