"""The LQR game critic's TD loss (``bchg_jax.games.lqr.train.td_loss``) written out with a linear
stand-in critic and a target leader that differs from the current one: the target's next
action is the *target* leader's K_targ s' (Algorithm 3), its reward r_L(s) is of the state s,
and the target network is ``critic_targ``."""

from types import SimpleNamespace

import jax
import jax.numpy as jnp
import numpy as np

from bchg_jax.games.lqr import leader_reward
from bchg_jax.games.lqr.follower import best_response
from bchg_jax.games.lqr.train import td_loss
from bchg_jax.problems.lqr_game import lqr_game


def _Q(critic, s, a, b):
    """A linear stand-in critic: (s, a, b) @ params."""
    return jnp.concatenate([s, a, b], -1) @ critic.params


def test_td_target_uses_the_target_leader_and_network():
    """mean (Q(s, a, b) - r_L(s) - gamma_L Q_targ(s', K_targ s', mean_b(s', K_targ s')))^2 with
    K_targ != K and critic_targ != critic (a target built on the current leader differs)."""
    game = lqr_game()
    th, th_targ = jnp.array([-4.0, 0.2]), jnp.array([-6.0, 1.0])
    resp = best_response(game, th, 0.1)
    w, w_targ = jnp.array([0.3, -1.0, 2.0, 0.5]), jnp.array([1.0, 0.4, -0.7, 1.5])
    state = SimpleNamespace(actor=th, actor_targ=th_targ, critic_targ=w_targ)
    k = jax.random.split(jax.random.key(0), 4)
    s, s2 = jax.random.normal(k[0], (5, 2)), jax.random.normal(k[1], (5, 2))
    a, b = jax.random.normal(k[2], (5, 1)), jax.random.normal(k[3], (5, 1))
    got = td_loss(_Q, game, 0, w, state, None, resp, s, a, b, s2, jax.random.key(1))
    K_targ = np.asarray(th_targ).reshape(1, 2)
    a2 = np.asarray(s2) @ K_targ.T
    b2 = np.asarray(resp.mean(s2, jnp.asarray(a2)))
    nxt = np.concatenate([np.asarray(s2), a2, b2], -1) @ np.asarray(w_targ)
    y = np.asarray(leader_reward(game, s)) + game.gamma_L * nxt
    q = np.concatenate([np.asarray(s), np.asarray(a), np.asarray(b)], -1) @ np.asarray(w)
    np.testing.assert_allclose(float(got), np.mean((q - y) ** 2), rtol=1e-5)
