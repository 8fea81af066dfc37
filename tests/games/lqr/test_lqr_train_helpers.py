"""The LQR game trainer's helpers and metrics written out (``bchg_jax.games.lqr.train``): the
warm-up's iteration count (rounded up, over every collected episode), the run's actor updates,
the input scales' floor, the critic's input standardisation and output scale, the start theta's
std, and the per-iteration exact returns ``J`` (undiscounted) and ``J_discounted``."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from bchg_jax.core.buffers import buffer_add, buffer_init
from bchg_jax.games import lqr
from bchg_jax.games.actor_critic import Critic
from bchg_jax.games.lqr.config import ActorConfig, CriticConfig, ExplorationConfig
from bchg_jax.games.lqr.exact import leader_returns
from bchg_jax.games.lqr.follower import best_response
from bchg_jax.games.lqr.train import actor_updates, critic_value, input_scale, warmup_iterations
from bchg_jax.problems.lqr_game import lqr_game


def test_warmup_iterations_round_up_over_all_collected_episodes():
    """(episodes + exploration.episodes) * horizon steps per iteration, rounded up."""
    own = lqr.TrainConfig(episodes=2, exploration=ExplorationConfig(warmup_steps=101))
    assert warmup_iterations(own, 10) == 6  # 101 / 20
    assert (
        warmup_iterations(lqr.TrainConfig(episodes=2, exploration=ExplorationConfig(100)), 10) == 5
    )
    both = lqr.TrainConfig(
        episodes=2,
        exploration=ExplorationConfig(warmup_steps=101, episodes=2),
        critic=CriticConfig(replay=4),
    )
    assert warmup_iterations(both, 10) == 3  # 101 / 40
    assert warmup_iterations(lqr.TrainConfig(exploration=ExplorationConfig(0)), 10) == 0


def test_actor_updates_cap_and_floor():
    """(iterations - warm-up) * min(actor_steps, max_steps), at least one iteration's worth."""
    c = lqr.TrainConfig(
        iterations=10, episodes=2, max_steps=4, exploration=ExplorationConfig(warmup_steps=40)
    )
    assert int(actor_updates(c, 10, 3)) == 8 * 3  # 2 warm-up iterations
    assert int(actor_updates(c, 10, 9)) == 8 * 4  # capped at max_steps
    long = lqr.TrainConfig(
        iterations=3, episodes=2, exploration=ExplorationConfig(warmup_steps=400)
    )
    assert int(actor_updates(long, 10, 2)) == 2  # the warm-up spans the run: at least 1 iteration


def test_input_scale_std_floor_is_added():
    """Constant inputs: the mean is the constant and the std is the floor itself."""
    buf = buffer_init(2, 3, jnp.float32, (2, 1, 1))
    s = jnp.full((2, 4, 2), 1.5)
    a, b = jnp.full((2, 3, 1), -2.0), jnp.full((2, 3, 1), 0.25)
    mean, std = input_scale(buffer_add(buf, s, a, b, "ring"), floor=1e-3)
    np.testing.assert_allclose(mean, [1.5, 1.5, -2.0, 0.25], rtol=1e-6)
    np.testing.assert_allclose(std, np.full(4, 1e-3), rtol=1e-4)


class _Linear:
    """A stand-in network: x @ params, one output."""

    @staticmethod
    def apply(params, x):
        return (x @ params)[..., None]


def test_critic_value_standardises_then_divides_by_q_scale():
    """Q = net((x - mean) / std) / q_scale with x = (s, a, b)."""
    w = jnp.array([1.0, -2.0, 0.5, 3.0])
    s, a, b = jnp.array([[1.0, 2.0]]), jnp.array([[3.0]]), jnp.array([[-1.0]])
    x = np.array([1.0, 2.0, 3.0, -1.0])
    got = critic_value(_Linear, 4.0, Critic(w, None), s, a, b)
    np.testing.assert_allclose(got, [x @ np.asarray(w) / 4.0], rtol=1e-6)
    mean, std = jnp.array([0.5, 1.0, 2.0, 0.0]), jnp.array([2.0, 1.0, 4.0, 0.5])
    got = critic_value(_Linear, 4.0, Critic(w, (mean, std)), s, a, b)
    ref = ((x - np.asarray(mean)) / np.asarray(std)) @ np.asarray(w) / 4.0
    np.testing.assert_allclose(got, [ref], rtol=1e-6)


@pytest.mark.slow
def test_start_theta_std_and_exact_returns_metrics():
    """The start theta is theta0_std * N(0, 1) (same key: 0.5 x the unit one); with no actor step
    the metrics J / J_discounted are the exact undiscounted / gamma_L-discounted returns at it."""
    game = lqr_game()
    cfg = lambda std: lqr.TrainConfig(  # noqa: E731
        iterations=1,
        episodes=2,
        actor=ActorConfig(theta0_std=std),
        exploration=ExplorationConfig(warmup_steps=0),
    )
    hp = lqr.HParams(actor_steps=0, critic_steps=0, beta=0.1)
    tr = lqr.make_train(game, "exact", cfg(0.5))
    s0 = tr.init(jax.random.key(0), hp)
    unit = lqr.make_train(game, "exact", cfg(1.0)).init(jax.random.key(0), hp).actor
    np.testing.assert_allclose(np.asarray(s0.actor), 0.5 * np.asarray(unit), rtol=1e-6)
    state, m = tr.run(s0, hp, 1)
    theta = state.actor
    resp = best_response(game, theta, 0.1)
    J, Jd = leader_returns(game, theta, 0.1, (1.0, game.gamma_L), stochastic=True, resp=resp)
    np.testing.assert_allclose(np.ravel(m["J"])[-1], float(J), rtol=1e-4)
    np.testing.assert_allclose(np.ravel(m["J_discounted"])[-1], float(Jd), rtol=1e-4)
    assert abs(float(J) - float(Jd)) > 1e-3 * abs(float(J))
