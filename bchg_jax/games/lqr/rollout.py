"""Episodes of the bi-level LQR game (one record convention: ``s`` [E, T+1, n], ``a``, ``b``
[E, T, .])."""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp

from bchg_jax.core.precision import full_precision
from bchg_jax.core.validate import check_count, check_shape
from bchg_jax.games.lqr.follower import GameResponse
from bchg_jax.games.lqr.game import LQRGame, check_game_theta, leader_gain, transition

Array = jax.Array


class GameTrajectories(NamedTuple):
    """A batch of E episodes of T steps of the bi-level LQR game.

    Attributes:
      s: [E, T+1, n] states s_0..s_T.
      a: [E, T, k] leader actions.
      b: [E, T, m] follower actions.
    """

    s: Array  # [E, T+1, n]
    a: Array  # [E, T, k]
    b: Array  # [E, T, m]


@full_precision
def rollout(
    key: Array,
    game: LQRGame,
    theta: Array,
    resp: GameResponse,
    num_episodes: int,
    horizon: int | None = None,
    *,
    stochastic: bool = True,
    random_leader=False,
    random_std: float = 1.0,
) -> GameTrajectories:
    """Episodes from ``s0``: a ~ f_theta(.|s) (``stochastic=False``: a = K s), b ~ g(.|s, a).

    The batch B of Algorithm 1 (line 4) in the Markov-game setting; s' = A s + B b + C a.
    ``random_leader`` (may be traced): the leader acts N(0, random_std^2) at random instead (the
    reference's warm-up exploration).

    Args:
      key: PRNG key.
      game: the :class:`~bchg_jax.games.lqr.game.LQRGame` (fixed start ``s0``).
      theta: [k * n] leader parameters.
      resp: the follower's :class:`~bchg_jax.games.lqr.follower.GameResponse`.
      num_episodes: E.
      horizon: T (default ``game.horizon``).
      stochastic: Gaussian leader N(K s, U U^T) (True) or a = K s (False).
      random_leader: [] bool, act N(0, random_std^2 I) instead of f_theta.
      random_std: std of the random leader actions.
    Returns:
      :class:`GameTrajectories` (``s`` [E, T+1, n], ``a`` [E, T, k], ``b`` [E, T, m]).
    Raises:
      ValueError: ``theta`` not [k * n] or (concrete) not finite, a ``resp`` whose gains do
        not fit the game (a response of another game), or ``num_episodes`` / the horizon not a
        positive integer.
    """
    check_game_theta(game, theta)  # a NaN theta gave NaN states without a word
    check_count("num_episodes", num_episodes)
    check_count(
        "horizon (or game.horizon when horizon is None)",
        game.horizon if horizon is None else horizon,
    )
    T = int(game.horizon if horizon is None else horizon)
    dt = theta.dtype
    K = leader_gain(game, theta)
    n, k, m = game.state_dim, game.leader_dim, game.follower_dim
    src = f"n={n}, k={k}, m={m} from {game.name}"
    check_shape("resp.K_s (the follower's state gain)", resp.K_s, (m, n), src)
    check_shape("resp.K_a (the follower's leader-action gain)", resp.K_a, (m, k), src)
    U = jnp.asarray(game.U, dt) * (1.0 if stochastic else 0.0)
    s0 = jnp.broadcast_to(jnp.asarray(game.s0, dt), (num_episodes, game.state_dim))

    def body(s, k):
        ka, kb = jax.random.split(k)
        eps = jax.random.normal(ka, (num_episodes, game.leader_dim), dt)
        a = jnp.where(random_leader, random_std * eps, s @ K.T + eps @ U.T)
        b = resp.sample(kb, s, a)
        s2 = transition(game, s, a, b)
        return s2, (s, a, b)

    s_last, (s, a, b) = jax.lax.scan(body, s0, jax.random.split(key, T))
    s = jnp.concatenate([s, s_last[None]], 0)
    return GameTrajectories(jnp.swapaxes(s, 0, 1), jnp.swapaxes(a, 0, 1), jnp.swapaxes(b, 0, 1))
