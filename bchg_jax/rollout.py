"""Trajectory sampling with ``lax.scan``: ``num_envs`` streams x ``num_steps`` steps.

All streams start from rho_0 at the beginning of a batch and auto-reset when an episode ends
(terminal state or time limit). Each step records the pre-transition state ``s``, the follower
action ``b``, the sampled next state ``s_next`` (before any reset), the in-episode time index
``t``, and the flags ``terminal`` (s is terminal: no transition of p happened) and ``done``
(the episode ends after this step: terminal or time limit).
"""
from __future__ import annotations

from typing import NamedTuple, Optional

import jax
import jax.numpy as jnp

Array = jax.Array


class Batch(NamedTuple):
    """A batch of transitions, every field shaped [num_envs, num_steps]."""

    s: Array
    b: Array
    s_next: Array
    t: Array
    terminal: Array
    done: Array

    @property
    def num_episodes(self) -> Array:
        """Number of completed episodes in the batch, at least 1 (the spec's normaliser)."""
        return jnp.maximum(jnp.sum(self.done), 1).astype(jnp.float32)

    def flat(self) -> "Batch":
        return Batch(*(x.reshape(-1) for x in self))


def _sample_cdf(cdf: Array, u: Array) -> Array:
    """Inverse-CDF sampling: index of the first entry of ``cdf`` exceeding ``u``."""
    return jnp.minimum(jnp.sum(cdf <= u, axis=-1), cdf.shape[-1] - 1)


def rollout(key: Array, policy: Array, transition: Array, init_dist: Array,
            terminal: Optional[Array], time_limit: Optional[int], num_envs: int,
            num_steps: int) -> Batch:
    """Samples ``num_envs`` x ``num_steps`` transitions under ``policy`` [S,B] and ``transition`` [S,B,S]."""
    S = init_dist.shape[0]
    term_mask = jnp.zeros((S,), bool) if terminal is None else jnp.asarray(terminal, bool)
    limit = jnp.iinfo(jnp.int32).max if time_limit is None else int(time_limit)
    pol_cdf = jnp.cumsum(policy, axis=-1)
    p_cdf = jnp.cumsum(transition, axis=-1)
    rho_cdf = jnp.cumsum(init_dist)
    k0, k1 = jax.random.split(key)
    s0 = _sample_cdf(rho_cdf, jax.random.uniform(k0, (num_envs, 1)))
    u = jax.random.uniform(k1, (num_steps, num_envs, 3))

    def step(carry, u_t):
        s, t = carry
        b = _sample_cdf(pol_cdf[s], u_t[:, :1])
        s_next = _sample_cdf(p_cdf[s, b], u_t[:, 1:2])
        term = term_mask[s]
        done = term | (t + 1 >= limit)
        s_reset = _sample_cdf(rho_cdf, u_t[:, 2:3])
        new_s = jnp.where(done, s_reset, s_next)
        new_t = jnp.where(done, 0, t + 1)
        return (new_s, new_t), Batch(s, b, s_next, t, term, done)

    _, out = jax.lax.scan(step, (s0, jnp.zeros((num_envs,), jnp.int32)), u)
    return Batch(*(x.T for x in out))  # [num_envs, num_steps]
