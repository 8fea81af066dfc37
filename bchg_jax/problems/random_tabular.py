"""A random TabularCMDP whose transitions, initial distribution and both rewards depend on theta.

Used by the tests as the general case of Theorem 1 (every term of Eq. (hg_configurable) and
Eq. (nablaQF) is non-zero).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

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
    """
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
