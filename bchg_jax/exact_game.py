"""Exact references for tabular Markov games (DESIGN principle 5).

* :func:`best_response_exact`: the follower's soft-Q fixed point for a leader policy f, solved to
  a tight tolerance and differentiable in f by the implicit function theorem (``custom_root``).
* :func:`leader_return`: the leader's expected return from ``init_dist`` under (f, g) by
  propagating the state distribution of the joint Markov chain: ``horizon`` steps, undiscounted
  or discounted (``gamma``), exactly (no sampling).
* :func:`leader_values_game`: infinite-horizon V_L(s), Q_L(s, a, b) under (f, g) (linear solve).
"""
from __future__ import annotations

from typing import Optional

import jax
import jax.numpy as jnp

from bchg_jax.followers.soft_q_game import (GameBestResponse, response_from_q, soft_q_backup,
                                            soft_q_iteration)

Array = jax.Array


def best_response_exact(game, f: Array, beta, backup: str = "reference", tol: float = 1e-12,
                        max_sweeps: int = 100_000) -> GameBestResponse:
    P = jnp.asarray(game.transition, f.dtype)
    r = jnp.asarray(game.follower_reward, f.dtype)
    sg = jax.lax.stop_gradient
    Q_star = soft_q_iteration(game, sg(f), sg(beta), backup, tol=tol, max_sweeps=max_sweeps).Q

    def F(Q):
        return soft_q_backup(P, r, Q, f, beta, game.gamma_F, backup) - Q

    def tangent_solve(g, y):
        n = y.size
        J = jax.jacfwd(lambda x: g(x.reshape(y.shape)).reshape(-1))(jnp.zeros(n, y.dtype))
        return jnp.linalg.solve(J, y.reshape(-1)).reshape(y.shape)

    Q = jax.lax.custom_root(F, Q_star, lambda _f, x: x, tangent_solve)
    return response_from_q(Q, beta, jnp.asarray(0), jnp.max(jnp.abs(F(Q))))


def joint_chain(game, f: Array, g: Array):
    """(P_pi [S, S], r_pi [S]): state chain and expected leader reward under (f, g)."""
    pi = f[:, :, None] * g                                        # [S, A, B]
    P = jnp.asarray(game.transition, f.dtype)
    rL = jnp.asarray(game.leader_reward, f.dtype)
    return jnp.einsum("sab,sabt->st", pi, P), jnp.sum(pi * rL, axis=(1, 2))


def leader_return(game, f: Array, g: Array, horizon: Optional[int] = None,
                  gamma: float = 1.0) -> Array:
    """sum_{t < horizon} gamma^t E[r_L(s_t, a_t, b_t)] from ``init_dist`` (exact)."""
    H = game.time_limit if horizon is None else horizon
    P_pi, r_pi = joint_chain(game, f, g)

    def body(c, _):
        d, disc, total = c
        return (d @ P_pi, disc * gamma, total + disc * jnp.dot(d, r_pi)), None

    init = (jnp.asarray(game.init_dist, f.dtype), jnp.ones((), f.dtype), jnp.zeros((), f.dtype))
    (_, _, total), _ = jax.lax.scan(body, init, None, length=H)
    return total


def leader_values_game(game, f: Array, g: Array):
    """Infinite-horizon discounted V_L [S] and Q_L [S, A, B] under (f, g)."""
    P_pi, r_pi = joint_chain(game, f, g)
    S = r_pi.shape[0]
    V = jnp.linalg.solve(jnp.eye(S, dtype=f.dtype) - game.gamma_L * P_pi, r_pi)
    P = jnp.asarray(game.transition, f.dtype)
    Q = jnp.asarray(game.leader_reward, f.dtype) + game.gamma_L * jnp.einsum("sabt,t->sab", P, V)
    return V, Q
