"""Soft Q-iteration for the follower of a 2-player Markov game (Theorem 2's Bellman equation).

    Q_F(s, a, b) = r_F(s, a, b) + gamma_F sum_{s'} p(s'|s, a, b) V(s')
    g(b | s, a)  = softmax_b(Q_F(s, a, .) / beta),   V_F(s, a) = beta logsumexp_b Q_F(s, a, b) / beta

The next-state value V(s') has two forms (``backup``):
* ``"paper"``:     V(s') = sum_a' f(a'|s') beta logsumexp_b' Q(s', a', b') / beta   (Theorem 2)
* ``"reference"``: V(s') = beta logsumexp_b' (sum_a' f(a'|s') Q(s', a', b')) / beta  (the authors'
  code; reproduces the paper's figure; the spec's default).
Warm-startable from a previous Q; sweeps until max |dQ| <= ``tol`` (at most ``max_sweeps``).
"""
from __future__ import annotations

from typing import NamedTuple, Optional

import jax
import jax.numpy as jnp

Array = jax.Array
BACKUPS = ("reference", "paper")


class GameBestResponse(NamedTuple):
    policy: Array    # g(b | s, a) [S, A, B]
    Q: Array         # Q_F [S, A, B]
    V: Array         # V_F(s, a) [S, A]
    sweeps: Array
    residual: Array


def next_value(Q: Array, f: Array, beta, backup: str) -> Array:
    """V(s') [S] from Q [S, A, B] and the leader policy f [S, A]."""
    if backup == "paper":
        return jnp.sum(f * beta * jax.nn.logsumexp(Q / beta, axis=-1), axis=-1)
    if backup == "reference":
        return beta * jax.nn.logsumexp(jnp.einsum("sa,sab->sb", f, Q) / beta, axis=-1)
    raise ValueError(f"backup must be one of {BACKUPS}, got {backup!r}")


def soft_q_backup(P: Array, r: Array, Q: Array, f: Array, beta, gamma, backup: str) -> Array:
    return r + gamma * jnp.einsum("sabt,t->sab", P, next_value(Q, f, beta, backup))


def response_from_q(Q: Array, beta, sweeps, residual) -> GameBestResponse:
    V = beta * jax.nn.logsumexp(Q / beta, axis=-1)
    return GameBestResponse(jax.nn.softmax(Q / beta, axis=-1), Q, V, sweeps, residual)


def soft_q_iteration(game, f: Array, beta, backup: str = "reference", Q0: Optional[Array] = None,
                     tol: float = 1e-6, max_sweeps: int = 1000) -> GameBestResponse:
    """The follower's best response to the leader policy ``f`` [S, A] (not differentiated)."""
    if backup not in BACKUPS:
        raise ValueError(f"backup must be one of {BACKUPS}, got {backup!r}")
    P = jnp.asarray(game.transition, f.dtype)
    r = jnp.asarray(game.follower_reward, f.dtype)
    Q0 = jnp.zeros_like(r) if Q0 is None else Q0

    def cond(c):
        return (c[2] == 0) | ((c[1] > tol) & (c[2] < max_sweeps))

    def body(c):
        Q2 = soft_q_backup(P, r, c[0], f, beta, game.gamma_F, backup)
        return Q2, jnp.max(jnp.abs(Q2 - c[0])), c[2] + 1

    Q, res, it = jax.lax.while_loop(cond, body, (Q0, jnp.asarray(jnp.inf, r.dtype),
                                                 jnp.asarray(0, jnp.int32)))
    return response_from_q(Q, beta, it, res)
