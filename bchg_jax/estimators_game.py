"""Hypergradient estimators for tabular 2-player Markov games (Theorem 2, Algorithm 4).

For a leader policy table ``f = policy_fn(theta)`` [S, A] (tabular softmax or a network on
one-hot states) and episodes (s_t, a_t, b_t), with discounts gL, gF:

* direct (policy-gradient) term: ``sum_t gL^t (Q_L(s_t, a_t, b_t) - base_t) grad log f(a_t|s_t)``
  with an optional state baseline ``base_t = V_L(s_t)`` (unbiased);
* FollowerQGrad (Eq. (nablaQF_MG)): ``dQF_t = sum_{k >= t} gF^{k-t} (V_F(s_k, a_k) - vbar(s_k))
  grad log f(a_k|s_k)`` with ``vbar(s) = sum_a' f(a'|s) V_F(s, a')`` (a baseline; the k = t term
  has zero mean against the Benefit);
* guiding term: ``(1/beta) sum_t gL^t Ben(s_t, a_t, b_t) dQF_t``; ``guide="none"`` is Naive-PGD.

As for configurable MDPs the sums are swapped into per-step weights of ``grad log f(a_k|s_k)``
(the guiding weights are a forward discounted sum), scattered into an [S, A] cotangent and
pulled back through ``log policy_fn`` with one VJP. Averaged over episodes.
"""
from __future__ import annotations

from typing import Callable, NamedTuple, Optional

import jax
import jax.numpy as jnp

from bchg_jax.segments import forward_discounted_sum

Array = jax.Array


class GameEpisodes(NamedTuple):
    s: Array   # [E, T]
    a: Array   # [E, T]
    b: Array   # [E, T]


def rollout_game(key: Array, game, f: Array, g: Array, num_episodes: int,
                 horizon: int) -> GameEpisodes:
    """Episodes from ``init_dist``: a ~ f(.|s), b ~ g(.|s, a), s' ~ p(.|s, a, b)."""
    P = jnp.asarray(game.transition, f.dtype)
    k0, kl = jax.random.split(key)
    s0 = jax.random.categorical(k0, jnp.log(jnp.asarray(game.init_dist, f.dtype)),
                                shape=(num_episodes,))

    def body(s, k):
        ka, kb, ks = jax.random.split(k, 3)
        a = jax.random.categorical(ka, jnp.log(f[s]))
        b = jax.random.categorical(kb, jnp.log(g[s, a]))
        s2 = jax.random.categorical(ks, jnp.log(P[s, a, b]))
        return s2, (s, a, b)

    _, (s, a, b) = jax.lax.scan(body, s0, jax.random.split(kl, horizon))
    return GameEpisodes(s.T, a.T, b.T)


def game_hypergradient(policy_fn: Callable[[Array], Array], theta, ep: GameEpisodes, g: Array,
                       Q_L: Array, V_F: Array, beta, gamma_L, gamma_F, guide: str = "benefit",
                       V_L: Optional[Array] = None):
    """Theorem 2's estimate (``guide="benefit"``: BC-HG; ``"none"``: Naive-PGD) for one batch."""
    if guide not in ("benefit", "none"):
        raise ValueError(f"guide must be 'benefit' or 'none', got {guide!r}")
    f = jax.lax.stop_gradient(policy_fn(theta))
    E, T = ep.s.shape
    disc = gamma_L ** jnp.arange(T, dtype=f.dtype)
    q = Q_L[ep.s, ep.a, ep.b]
    base = 0.0 if V_L is None else V_L[ep.s]
    w = disc * (q - base)
    if guide == "benefit":
        ben = q - jnp.sum(g * Q_L, axis=-1)[ep.s, ep.a]
        c = forward_discounted_sum(disc * ben, gamma_F, jnp.zeros((E, T), bool))
        vbar = jnp.sum(f * V_F, axis=-1)
        w = w + c * (V_F[ep.s, ep.a] - vbar[ep.s]) / beta
    S, A = f.shape
    ct = jnp.zeros((S, A), f.dtype).at[ep.s, ep.a].add(jax.lax.stop_gradient(w)) / E
    _, vjp = jax.vjp(lambda th: jnp.log(policy_fn(th)), theta)
    return vjp(ct)[0]
