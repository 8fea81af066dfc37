"""The paper's discrete toy Markov game (appendix "Toy Markov Game Task"; ``docs/experiments.md``).

States S=0, A=1, B=2; leader actions {0, 1}; follower actions s=0, a=1, b=2; start at S;
episodes of 150 steps (time-outs). In A, leader action 1 punishes every follower action
(r_F = -1, back to S); under leader action 0 the follower's b pays R (the paper's figure: R = 2)
and leads to the absorbing-ish B. Only p = f(0 | A) matters. The leader earns 1 each time the
follower moves S -> A.
"""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np

from bchg_jax.core.validate import check_float_dtype
from bchg_jax.games.tabular.game import TabularGame

S_, A_, B_ = 0, 1, 2


def toy_game(
    R: float = 2.0,
    gamma_F: float = 0.99,
    gamma_L: float = 0.99,
    time_limit: int = 150,
    dtype=jnp.float32,
) -> TabularGame:
    """Builds the toy Markov game (module docstring; Section "2-Player Markov Games (Discrete)").

    Args:
      R: the follower's reward for b in A under leader action 0.
      gamma_F: follower discount.
      gamma_L: leader discount.
      time_limit: episode length (time-outs).
      dtype: float dtype of the tables.
    Returns:
      the validated :class:`~bchg_jax.games.tabular.game.TabularGame`: transition
      [S=3, A=2, B=3, S=3], init_dist [3] (one-hot at S), rewards [3, 2, 3].
    Raises:
      ValueError: a ``dtype`` that is not float32 (or float64 with ``jax_enable_x64``): an
        integer one would truncate R, a 16-bit one round it; or a game ``validate`` refuses.
    """
    check_float_dtype("toy_game: dtype", dtype)
    P = np.zeros((3, 2, 3, 3))
    rF = np.zeros((3, 2, 3))
    rL = np.zeros((3, 2, 3))
    for a in range(2):
        # S: s -> S (0), a -> A (r_F 1, r_L 1), b -> B (r_F 1)
        P[S_, a, 0, S_] = 1
        P[S_, a, 1, A_] = 1
        P[S_, a, 2, B_] = 1
        rF[S_, a, 1] = rF[S_, a, 2] = 1.0
        rL[S_, a, 1] = 1.0
        # B: s -> S, a/b -> B
        P[B_, a, 0, S_] = 1
        P[B_, a, 1, B_] = P[B_, a, 2, B_] = 1
    # A, leader 0: s -> S, a -> A, b -> B with r_F = R
    P[A_, 0, 0, S_] = 1
    P[A_, 0, 1, A_] = 1
    P[A_, 0, 2, B_] = 1
    rF[A_, 0, 2] = R
    # A, leader 1: everything -> S with r_F = -1
    P[A_, 1, :, S_] = 1
    rF[A_, 1, :] = -1.0
    init = np.array([1.0, 0.0, 0.0])
    return TabularGame(
        jnp.asarray(P, dtype),
        jnp.asarray(init, dtype),
        jnp.asarray(rF, dtype),
        jnp.asarray(rL, dtype),
        gamma_F,
        gamma_L,
        time_limit,
        name=f"toy_game_R{R:g}",
    ).validate()


def leader_policy_from_p(p, dtype=jnp.float32):
    """f(a|s) [3, 2] with f(0|A) = p and uniform elsewhere (only f(.|A) matters).

    Args:
      p: scalar probability f(0|A).
      dtype: float dtype.
    Returns:
      [3, 2] leader policy f(a|s).
    """
    p = jnp.asarray(p, dtype)
    half = jnp.full((2,), 0.5, dtype)
    return jnp.stack([half, jnp.stack([p, 1.0 - p]), half])


def toy_game_metrics(f, response) -> dict:
    """The toy game's own training metrics (``make_train(..., metrics_fn=toy_game_metrics)``):
    ``p`` = f(0|A), the only leader probability that matters, and ``g_S`` [3] = g(.|S, a=0),
    the follower's policy in the start state S (the same for both leader actions).

    Args:
      f: [3, 2] the leader's policy f(a|s).
      response: the follower's :class:`~bchg_jax.games.tabular.follower.GameBestResponse`
        (or the :class:`~bchg_jax.games.tabular.follower_models.FollowerResponse` of a
        follower that is not at its best response: ``g_S`` is then the policy it plays).
    Returns:
      ``{"p": [], "g_S": [3]}``.
    """
    return {"p": f[A_, 0], "g_S": response.policy[S_, 0]}
