"""Soft value iteration: the follower's entropy-regularised best response (paper Eq. (1)).

    Q_F(s, b) = r_F(s, b) + gamma_F (1 - term(s)) sum_{s'} p(s'|s, b) V_F(s')
    V_F(s)    = beta log sum_b exp(Q_F(s, b) / beta)
    g(b | s)  = exp((Q_F(s, b) - V_F(s)) / beta)

Pure and jit-able; warm-startable from a previous ``V``; either a fixed number of sweeps
(``tol=None``) or sweeps until the sup-norm change is ``<= tol`` (at most ``max_sweeps``).
"""
from __future__ import annotations

from typing import NamedTuple, Optional

import jax
import jax.numpy as jnp

Array = jax.Array


class BestResponse(NamedTuple):
    """The follower's best response g^{theta dagger} and its soft values (white-box, Assumption 1)."""

    policy: Array  # [S, B]  g(b | s)
    V: Array       # [S]     V_F
    Q: Array       # [S, B]  Q_F
    sweeps: Array  # []      number of Bellman sweeps performed
    residual: Array  # []    sup-norm change of the last sweep

    def log_prob(self, s, b):
        return jnp.log(self.policy[s, b])

    def value(self, s):
        return self.V[s]

    def q_value(self, s, b):
        return self.Q[s, b]

    def sample(self, key, s):
        return jax.random.categorical(key, jnp.log(self.policy[s]))


def continuation(terminal: Optional[Array], num_states: int, dtype) -> Array:
    """1 - term(s): zero continuation after terminal states."""
    if terminal is None:
        return jnp.ones((num_states,), dtype)
    return 1.0 - jnp.asarray(terminal, dtype)


def soft_q(P: Array, r: Array, V: Array, gamma, cont: Array) -> Array:
    """One soft Bellman backup Q = r + gamma cont * P V  ([S,B,S], [S,B], [S] -> [S,B])."""
    return r + (gamma * cont)[:, None] * jnp.einsum("sbt,t->sb", P, V)


def soft_v(Q: Array, beta) -> Array:
    """V(s) = beta logsumexp_b Q(s, b) / beta."""
    return beta * jax.nn.logsumexp(Q / beta, axis=-1)


def boltzmann(Q: Array, V: Array, beta) -> Array:
    """g(b|s) = exp((Q - V) / beta)."""
    return jnp.exp((Q - V[:, None]) / beta)


def soft_value_iteration(P: Array, r: Array, beta, gamma, terminal: Optional[Array] = None,
                         V0: Optional[Array] = None, num_sweeps: int = 500,
                         tol: Optional[float] = None, max_sweeps: int = 2000) -> BestResponse:
    """Soft value iteration on the model ``P`` [S,B,S] with reward ``r`` [S,B].

    ``tol=None``: exactly ``num_sweeps`` sweeps (the reference's fixed schedule).
    ``tol=float``: sweeps until ``max |V_{k+1} - V_k| <= tol`` or ``max_sweeps``.
    ``V0``: warm start (default zeros).
    """
    S = r.shape[0]
    cont = continuation(terminal, S, r.dtype)
    V0 = jnp.zeros((S,), r.dtype) if V0 is None else V0.astype(r.dtype)

    def sweep(V):
        return soft_v(soft_q(P, r, V, gamma, cont), beta)

    if tol is None:
        def body(_, carry):
            V, _res = carry
            V2 = sweep(V)
            return V2, jnp.max(jnp.abs(V2 - V))
        V, res = jax.lax.fori_loop(0, num_sweeps, body, (V0, jnp.asarray(jnp.inf, r.dtype)))
        n = jnp.asarray(num_sweeps)
    else:
        def cond(carry):
            _, res, k = carry
            return (res > tol) & (k < max_sweeps)

        def body(carry):
            V, _, k = carry
            V2 = sweep(V)
            return V2, jnp.max(jnp.abs(V2 - V)), k + 1
        V, res, n = jax.lax.while_loop(cond, body, (V0, jnp.asarray(jnp.inf, r.dtype), jnp.asarray(0)))
    Q = soft_q(P, r, V, gamma, cont)
    V = soft_v(Q, beta)
    return BestResponse(policy=boltzmann(Q, V, beta), V=V, Q=Q, sweeps=n, residual=res)
