"""Episodes of a tabular Markov game (record convention: ``s``, ``a``, ``b`` [E, T], time
axis 1)."""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from bchg_jax.core.validate import check_count, check_shape
from bchg_jax.games.tabular.follower import check_game
from bchg_jax.games.tabular.game import check_policy_shapes, compute_dtype

Array = jax.Array


def log_probs(p: Array) -> Array:
    """log p with entries below 0 taken as 0 (log 0 = -inf: never drawn): the sampler's logits.

    ``validate()`` accepts entries down to -1e-9 (rounding: ``1 - 0.8 - 0.2`` is -5.6e-17) and
    policies down to ``-core.validate.POLICY_ROW_TOL``; their log is NaN, which
    ``jax.random.categorical`` (an argmax) picks every time."""
    return jnp.log(jnp.maximum(p, 0))


class GameEpisodes(NamedTuple):
    """A batch of E episodes of T steps of a tabular Markov game (int indices, time axis 1).

    Attributes:
      s: [E, T] states s_0..s_{T-1}.
      a: [E, T] leader actions.
      b: [E, T] follower actions.
    """

    s: Array  # [E, T]
    a: Array  # [E, T]
    b: Array  # [E, T]


def rollout(key: Array, game, f: Array, g: Array, num_episodes: int, horizon: int) -> GameEpisodes:
    """Episodes from ``init_dist``: a ~ f(.|s), b ~ g(.|s, a), s' ~ p(.|s, a, b).

    The batch B of Algorithm 1 (line 4) in the Markov-game setting, one ``lax.scan`` over time.

    Args:
      key: PRNG key.
      game: a :class:`~bchg_jax.games.tabular.game.TabularGame`.
      f: [S, A] leader policy f(a|s).
      g: [S, A, B] follower policy g(b|s, a).
      num_episodes: E (>= 1).
      horizon: T (>= 1).
    Returns:
      :class:`GameEpisodes` with ``s``, ``a``, ``b`` [num_episodes, horizon] (time axis 1).
    Raises:
      ValueError: ``game.transition`` not [S, A, B, S]; ``f``, ``g`` or ``game.init_dist`` not
        shaped by its S, A, B (the error names the array at fault); where the game's tables
        are concrete, a failed ``game.validate()`` (rows that are not distributions, an
        ``init_dist`` that does not sum to 1, non-finite entries: the sampler would otherwise
        draw from them as if normalised), or a bad scalar setting of ``game``, as every other
        function of the family; a concrete ``f`` / ``g`` whose rows are not distributions;
        ``num_episodes`` or ``horizon`` not an integer >= 1.
    """
    check_game(game)
    check_policy_shapes(game, f, g)
    S = np.shape(game.transition)[0]
    check_shape(f"{game.name}: init_dist", game.init_dist, (S,), "S from transition")
    check_count("num_episodes", num_episodes)  # a float or a bool got past a comparison
    check_count("horizon", horizon)
    # the promoted dtype of the policies and the game (games.tabular.game.compute_dtype)
    dtype = compute_dtype(game, f, g)
    f, g = jnp.asarray(f, dtype), jnp.asarray(g, dtype)
    P = jnp.asarray(game.transition, dtype)
    k0, kl = jax.random.split(key)
    s0 = jax.random.categorical(
        k0, log_probs(jnp.asarray(game.init_dist, dtype)), shape=(num_episodes,)
    )

    def body(s, k):
        ka, kb, ks = jax.random.split(k, 3)
        a = jax.random.categorical(ka, log_probs(f[s]))
        b = jax.random.categorical(kb, log_probs(g[s, a]))
        s2 = jax.random.categorical(ks, log_probs(P[s, a, b]))
        return s2, (s, a, b)

    _, (s, a, b) = jax.lax.scan(body, s0, jax.random.split(kl, horizon))
    return GameEpisodes(s.T, a.T, b.T)
