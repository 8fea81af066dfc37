"""The LQR game trainer's buffer sizes and its ``batch_return`` metric: an off-policy buffer holds
every episode of the run (``episodes * iterations``), the replay ring ``critic.replay``, and the
batch's sampled return sums r_L(s_t) over t = 0..T-1 (one-step episodes from s0 = s*: exactly
r_L(s*))."""

import jax
import numpy as np

from bchg_jax.games import lqr
from bchg_jax.games.lqr import leader_reward
from bchg_jax.games.lqr.config import CriticConfig, ExplorationConfig
from bchg_jax.problems.lqr_game import lqr_game

HP = lqr.HParams(actor_steps=0, critic_steps=0, beta=0.1)


def test_off_policy_buffer_holds_every_episode_of_the_run():
    """buffer 'off': episodes * iterations slots; 'on': the newest batch; ring: critic.replay."""
    game = lqr_game()
    off = lqr.TrainConfig(iterations=3, episodes=2, buffer="off")
    assert lqr.make_train(game, "exact", off).init(jax.random.key(0), HP).buffer.s.shape[0] == 6
    on = lqr.TrainConfig(iterations=3, episodes=2)
    assert lqr.make_train(game, "exact", on).init(jax.random.key(0), HP).buffer.s.shape[0] == 2
    ring = lqr.TrainConfig(
        iterations=3,
        episodes=2,
        critic=CriticConfig(replay=8),
        exploration=ExplorationConfig(episodes=2),
    )
    st = lqr.make_train(game, "naive", ring).init(jax.random.key(0), HP)
    assert st.replay.s.shape[0] == 8 and st.buffer.s.shape[0] == 2


def test_batch_return_sums_the_rewards_from_s0():
    """One-step episodes from s0 = s*: batch_return is r_L(s0) exactly (not r_L(s1))."""
    game = lqr_game(horizon=1, s0=np.array([-0.8, 0.0]))
    cfg = lqr.TrainConfig(iterations=1, episodes=2, exploration=ExplorationConfig(warmup_steps=0))
    tr = lqr.make_train(game, "exact", cfg)
    _, m = tr.run(tr.init(jax.random.key(0), HP), HP, 1)
    want = float(leader_reward(game, np.asarray(game.s0, np.float32)))
    assert want > 0.5
    np.testing.assert_allclose(np.ravel(m["batch_return"])[-1], want, rtol=1e-6)
