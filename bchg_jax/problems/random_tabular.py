"""Random problems for the tests: a TabularCMDP whose transitions, initial distribution and both
rewards depend on theta (the general case of Theorem 1: every term of Eq. (hg_configurable) and
Eq. (nablaQF) is non-zero), and a random TabularGame (dense transitions, Gaussian rewards).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from bchg_jax.core.validate import check_count, check_float_dtype
from bchg_jax.games.tabular.game import TabularGame
from bchg_jax.tabular.cmdp import TabularCMDP


def random_tabular_cmdp(
    key,
    num_states: int = 5,
    num_actions: int = 3,
    dim: int = 4,
    gamma_F: float = 0.85,
    gamma_L: float = 0.9,
    scale: float = 1.0,
    time_limit=None,
    dtype=jnp.float32,
) -> TabularCMDP:
    """Random smooth tables of theta in R^dim (softmax transitions / init, tanh rewards).

    Phi_L(theta) = -0.05 ||theta||^2; no terminal states.

    Args:
      key: PRNG key of the random weights.
      num_states: S.
      num_actions: B.
      dim: D, the size of theta.
      gamma_F: follower discount.
      gamma_L: leader discount.
      scale: scale of the weights multiplying theta.
      time_limit: episode length of the sampler, or None.
      dtype: float dtype.
    Returns:
      :class:`TabularCMDP` with [S, B, S] transitions, [S] rho_0, [S, B] rewards, theta0 [D].
    Raises:
      ValueError: a ``dtype`` that is not float32 (or float64 with ``jax_enable_x64``),
        or ``num_states``, ``num_actions`` or ``dim`` not a positive integer.
    """
    check_float_dtype("random_tabular_cmdp: dtype", dtype)
    for name, value in (("num_states", num_states), ("num_actions", num_actions), ("dim", dim)):
        check_count(f"random_tabular_cmdp: {name}", value)
    S, B, D = num_states, num_actions, dim
    ks = jax.random.split(key, 9)
    Wp = scale * jax.random.normal(ks[0], (S, B, S, D), dtype)
    bp = jax.random.normal(ks[1], (S, B, S), dtype)
    Wr = scale * jax.random.normal(ks[2], (S, D), dtype)
    br = 0.5 * jax.random.normal(ks[3], (S,), dtype)
    WF = scale * jax.random.normal(ks[4], (S, B, D), dtype)
    bF = jax.random.normal(ks[5], (S, B), dtype)
    WL = scale * jax.random.normal(ks[6], (S, B, D), dtype)
    bL = jax.random.normal(ks[7], (S, B), dtype)
    theta0 = 0.5 * jax.random.normal(ks[8], (D,), dtype)
    return TabularCMDP(
        transition=lambda th: jax.nn.softmax(Wp @ th + bp, axis=-1),
        init_dist=lambda th: jax.nn.softmax(Wr @ th + br),
        follower_reward=lambda th: jnp.tanh(WF @ th + bF),
        leader_reward=lambda th: jnp.tanh(WL @ th + bL),
        leader_regularizer=lambda th: -0.05 * jnp.sum(th**2),
        gamma_F=gamma_F,
        gamma_L=gamma_L,
        theta0=theta0,
        time_limit=time_limit,
        name="random_tabular",
    )


def random_tabular_game(
    seed: int = 0, S: int = 4, A: int = 2, B: int = 3, gamma: float = 0.8, time_limit: int = 60
) -> TabularGame:
    """A random 2-player :class:`~bchg_jax.games.tabular.game.TabularGame` (validated):
    Dirichlet(1) transitions [S, A, B, S] and initial distribution, N(0, 1) rewards of both
    players, both discounts ``gamma``, from ``numpy.random.default_rng(seed)``.

    Raises:
      ValueError: ``S``, ``A`` or ``B`` not a positive integer, or a game ``validate`` refuses
        (a discount outside [0, 1), a bad ``time_limit``).
    """
    for name, value in (("S", S), ("A", A), ("B", B)):
        check_count(f"random_tabular_game: {name}", value)
    rng = np.random.default_rng(seed)
    return TabularGame(
        jnp.asarray(rng.dirichlet(np.ones(S), size=(S, A, B))),
        jnp.asarray(rng.dirichlet(np.ones(S))),
        jnp.asarray(rng.normal(size=(S, A, B))),
        jnp.asarray(rng.normal(size=(S, A, B))),
        gamma,
        gamma,
        time_limit,
    ).validate()
