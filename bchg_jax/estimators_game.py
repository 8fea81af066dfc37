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

Continuous actions (the bi-level LQR game): :func:`game_score_weights` gives the same per-step
weights for any per-sample values, :func:`continuous_game_hypergradient` pulls them back through
``log f_theta(a_t|s_t)`` at the samples, and :func:`deterministic_game_hypergradient` is the appendix
theorem for deterministic leaders ``a = f_theta(s)`` (Eq. (hg_MG_det)): the cotangent of
``f_theta(s_k)`` is ``gL^k grad_a Q_L(s_k, a_k, b_k) + (1/beta) c_k grad_a Q_F(s_k, a_k, b_k)`` with
``c_k = sum_{t<=k} gL^t gF^(k-t) Ben_t`` (Eq. (nablaQF_MG_det) swapped into per-step weights).
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


def game_score_weights(q: Array, base, ben: Array, adv_F: Array, beta, gamma_L, gamma_F,
                       guide: str = "benefit", leader_steps: Optional[int] = None) -> Array:
    """Per-step weights of ``grad log f(a_k|s_k)`` in Theorem 2's estimate, [E, T].

    ``q`` = Q_L(s_t, a_t, b_t), ``base`` a baseline not depending on a_t (or 0), ``ben`` the
    Benefit, ``adv_F`` = V_F(s_k, a_k) (- an optional baseline depending on s_k only).
    ``leader_steps``: only t < leader_steps enter the leader's sums (a finite-horizon objective),
    while the follower's influence sums run to the end of the episode.
    """
    if guide not in ("benefit", "none"):
        raise ValueError(f"guide must be 'benefit' or 'none', got {guide!r}")
    disc = _leader_discounts(q.shape[1], q.dtype, gamma_L, leader_steps)
    w = disc * (q - base)
    if guide == "benefit":
        w = w + _guide_coefficients(disc * ben, gamma_F) * adv_F / beta
    return w


def _leader_discounts(T: int, dtype, gamma_L, leader_steps: Optional[int]) -> Array:
    """gamma_L^t for t < T, zero from ``leader_steps`` on (a finite-horizon leader objective)."""
    disc = gamma_L ** jnp.arange(T, dtype=dtype)
    return disc if leader_steps is None else jnp.where(jnp.arange(T) < leader_steps, disc, 0.0)


def _guide_coefficients(disc_ben: Array, gamma_F) -> Array:
    """c_k = sum_{t<=k} gF^(k-t) gL^t Ben_t: the guiding term's weight of step k's influence."""
    return forward_discounted_sum(disc_ben, gamma_F, jnp.zeros(disc_ben.shape, bool))


def game_hypergradient(policy_fn: Callable[[Array], Array], theta, ep: GameEpisodes, g: Array,
                       Q_L: Array, V_F: Array, beta, gamma_L, gamma_F, guide: str = "benefit",
                       V_L: Optional[Array] = None):
    """Theorem 2's estimate (``guide="benefit"``: BC-HG; ``"none"``: Naive-PGD) for one batch."""
    f = jax.lax.stop_gradient(policy_fn(theta))
    E, T = ep.s.shape
    q = Q_L[ep.s, ep.a, ep.b]
    base = 0.0 if V_L is None else V_L[ep.s]
    ben = q - jnp.sum(g * Q_L, axis=-1)[ep.s, ep.a]
    vbar = jnp.sum(f * V_F, axis=-1)
    w = game_score_weights(q, base, ben, V_F[ep.s, ep.a] - vbar[ep.s], beta, gamma_L, gamma_F,
                           guide)
    S, A = f.shape
    ct = jnp.zeros((S, A), f.dtype).at[ep.s, ep.a].add(jax.lax.stop_gradient(w)) / E
    _, vjp = jax.vjp(lambda th: jnp.log(policy_fn(th)), theta)
    return vjp(ct)[0]


def continuous_game_hypergradient(log_prob_fn: Callable, theta, s: Array, a: Array,
                                  weights: Array):
    """sum_{e,t} weights[e,t] grad log f_theta(a[e,t] | s[e,t]) / E with one VJP.

    ``log_prob_fn(theta, s, a)`` -> [E, T]; ``weights`` from :func:`game_score_weights`.
    """
    E = weights.shape[0]
    _, vjp = jax.vjp(lambda th: log_prob_fn(th, s, a), theta)
    return vjp(jax.lax.stop_gradient(weights) / E)[0]


def deterministic_game_hypergradient(policy_fn: Callable, theta, s: Array, dQL_da: Array,
                                     ben: Array, dQF_da: Array, beta, gamma_L, gamma_F,
                                     guide: str = "benefit",
                                     leader_steps: Optional[int] = None):
    """The appendix theorem (deterministic leader ``a = policy_fn(theta, s)``), one VJP.

    ``s`` [E, T, n]; ``dQL_da``, ``dQF_da`` [E, T, k] the action-gradients of Q_L and Q_F at
    (s_k, f(s_k), b_k); ``ben`` [E, T] the Benefit. ``guide="none"``: the deterministic Naive-PGD.
    """
    if guide not in ("benefit", "none"):
        raise ValueError(f"guide must be 'benefit' or 'none', got {guide!r}")
    E, T = ben.shape
    disc = _leader_discounts(T, ben.dtype, gamma_L, leader_steps)
    ct = disc[:, None] * dQL_da
    if guide == "benefit":
        ct = ct + _guide_coefficients(disc * ben, gamma_F)[..., None] * dQF_da / beta
    _, vjp = jax.vjp(lambda th: policy_fn(th, s), theta)
    return vjp(jax.lax.stop_gradient(ct) / E)[0]
