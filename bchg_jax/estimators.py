"""Hypergradient estimators for tabular configurable MDPs (Theorem 1; Algorithms 1, 3, 5, 7).

Every term of Theorem 1 is linear in a per-step gradient (grad r_F, grad log p, grad r_L, ...),
so each estimator is computed in two stages:

1. *Segment weights.* A trajectory-segment estimator such as
   ``dQF(s_k, b_k) = sum_{j>=k} gamma_F^{j-k} [grad r_F(s_j,b_j) + gamma_F V_F(s_{j+1}) grad log p(s_{j+1}|s_j,b_j)]``
   (Eq. (8), the discounted suffix sum of a segment) enters the hypergradient with a scalar weight
   ``w_k`` (e.g. ``gamma_L^{t_k} B_L(s_k, b_k) / (beta n_episodes)``). Swapping the two sums,
   ``sum_k w_k sum_{j>=k} gamma^{j-k} x_j = sum_j Omega_j x_j`` with the *forward* discounted sum
   ``Omega_j = w_j + gamma Omega_{j-1}`` (reset at episode ends). Every-visit grouping of segments
   by (s, b) (Algorithm 1 line 12) replaces ``w_k`` by the mean weight of its group.
2. *One VJP.* The per-step coefficients are scattered into tables shaped like r_F, r_L, log p,
   log rho_0, and a single ``jax.vjp`` of the problem's functions of theta turns them into the
   gradient. The result equals summing explicit per-step gradient vectors (tested), at the cost of
   O(T) scalars plus one backward pass instead of O(T |theta|).
"""
from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp

from bchg_jax.critics import benefit, state_value
from bchg_jax.followers.soft_vi import BestResponse
from bchg_jax.problems.tabular import TabularCMDP
from bchg_jax.rollout import Batch

Array = jax.Array

GROUPINGS = ("every_visit", "per_visit")
PARTIALS = ("every_visit", "trajectory")
GUIDES = ("benefit", "none")


class Cotangents(NamedTuple):
    """Coefficient tables, one per differentiable function of theta."""

    r_F: Array      # [S, B]
    r_L: Array      # [S, B]
    log_p: Array    # [S, B, S]
    log_rho: Array  # [S]
    rho: Array      # [S]


def forward_discounted_sum(w: Array, gamma, done: Array) -> Array:
    """Omega_j = w_j + gamma (1 - done_{j-1}) Omega_{j-1} along the last axis (per stream).

    The adjoint of a discounted suffix sum that stops at episode ends: ``sum_k w_k G_k`` with
    ``G_k = sum_{j>=k, same episode} gamma^{j-k} x_j`` equals ``sum_j Omega_j x_j``.
    """
    decay = gamma * (1.0 - jnp.concatenate([jnp.ones_like(done[..., :1]), done[..., :-1]],
                                           axis=-1).astype(w.dtype))

    def combine(a, b):
        return a[0] * b[0], b[0] * a[1] + b[1]

    _, out = jax.lax.associative_scan(combine, (decay, w), axis=w.ndim - 1)
    return out


def discounted_suffix_sum(x: Array, gamma, done: Array) -> Array:
    """G_k = x_k + gamma (1 - done_k) G_{k+1} along axis 1 of ``x`` [E, T, ...] (segment returns)."""
    keep = gamma * (1.0 - done.astype(x.dtype))
    keep = keep.reshape(keep.shape + (1,) * (x.ndim - keep.ndim))

    def step(g_next, inp):
        xk, kk = inp
        g = xk + kk * g_next
        return g, g

    xs = (jnp.moveaxis(x, 1, 0)[::-1], jnp.moveaxis(keep, 1, 0)[::-1])
    _, out = jax.lax.scan(step, jnp.zeros_like(x[:, 0]), xs)
    return jnp.moveaxis(out[::-1], 0, 1)


def group_mean(w: Array, group: Array, num_groups: int) -> Array:
    """Replaces each w_k by the mean of w over its group (every-visit grouping by (s,b) or s)."""
    total = jax.ops.segment_sum(w.reshape(-1), group.reshape(-1), num_groups)
    count = jax.ops.segment_sum(jnp.ones_like(w.reshape(-1)), group.reshape(-1), num_groups)
    return (total / jnp.maximum(count, 1.0))[group]


def _scatter_sb(coef: Array, batch: Batch, S: int, B: int) -> Array:
    return jax.ops.segment_sum(coef.reshape(-1), (batch.s * B + batch.b).reshape(-1),
                               S * B).reshape(S, B)


def _scatter_sbs(coef: Array, batch: Batch, S: int, B: int) -> Array:
    idx = ((batch.s * B + batch.b) * S + batch.s_next).reshape(-1)
    return jax.ops.segment_sum(coef.reshape(-1), idx, S * B * S).reshape(S, B, S)


def follower_q_grad_cotangents(weights: Array, batch: Batch, V_F: Array, gamma_F, S: int,
                               B: int, grouping: str = "every_visit"):
    """(cot r_F, cot log p) such that VJP = sum_k weights_k * dQF_hat(s_k, b_k) (Eq. (8), Alg. 5).

    ``grouping="per_visit"`` uses each visit's own segment (unbiased); ``"every_visit"`` averages
    the segments of all visits to the same (s, b) in the batch (Algorithm 1 line 12, reference).
    """
    if grouping == "every_visit":
        weights = group_mean(weights, batch.s * B + batch.b, S * B)
    omega = forward_discounted_sum(weights, gamma_F, batch.done)
    real = 1.0 - batch.terminal.astype(omega.dtype)
    return (_scatter_sb(omega, batch, S, B),
            _scatter_sbs(gamma_F * V_F[batch.s_next] * omega * real, batch, S, B))


def partial_cotangents(batch: Batch, V_L: Array, rho: Array, gamma_L, n_episodes, S: int, B: int,
                       partial: str = "every_visit"):
    """Cotangents of the partial derivative d_theta J_L (first two terms of Theorem 1).

    ``"trajectory"``: (1/n_ep) sum_t gamma_L^t [grad r_L + V_L(s_t) grad log p(s_t|s_{t-1},b_{t-1})],
    with grad log rho_0(s_0) at t = 0 (Algorithm 4).
    ``"every_visit"``: sum_s rho_0(s) dV_L(s) + sum_s V_L(s) grad rho_0(s), where dV_L(s) is the
    every-visit mean over visits to s of discounted segment sums (Algorithm 5 line 16, reference).
    """
    dtype = V_L.dtype
    if partial == "trajectory":
        w = (batch.t == 0).astype(dtype) / n_episodes
        cot_log_rho = jax.ops.segment_sum(w.reshape(-1) * V_L[batch.s].reshape(-1),
                                          batch.s.reshape(-1), S)
        cot_rho = jnp.zeros((S,), dtype)
    elif partial == "every_visit":
        count = jax.ops.segment_sum(jnp.ones(batch.s.size, dtype), batch.s.reshape(-1), S)
        w = rho[batch.s] / jnp.maximum(count, 1.0)[batch.s]
        cot_log_rho = jnp.zeros((S,), dtype)
        cot_rho = V_L
    else:
        raise ValueError(f"partial must be one of {PARTIALS}, got {partial!r}")
    omega = forward_discounted_sum(w, gamma_L, batch.done)
    real = 1.0 - batch.terminal.astype(dtype)
    return (_scatter_sb(omega, batch, S, B),
            _scatter_sbs(gamma_L * V_L[batch.s_next] * omega * real, batch, S, B),
            cot_log_rho, cot_rho)


def _safe_log(p: Array) -> Array:
    return jnp.log(jnp.where(p > 0, p, 1.0))


def apply_cotangents(problem: TabularCMDP, theta: Array, cot: Cotangents) -> Array:
    """One VJP of the problem's tables at theta: sum of <cotangent, d table / d theta> + grad Phi_L."""
    def tables(th):
        return (problem.follower_reward(th), problem.leader_reward(th),
                _safe_log(problem.transition(th)), _safe_log(problem.init_dist(th)),
                problem.init_dist(th), problem.regularizer(th))

    out, vjp = jax.vjp(tables, theta)
    (g,) = vjp((*cot, jnp.ones_like(out[-1])))
    return g


def hypergradient(problem: TabularCMDP, theta: Array, batch: Batch, follower: BestResponse,
                  Q_L: Array, beta, guide: str = "benefit", grouping: str = "every_visit",
                  partial: str = "every_visit") -> Array:
    """BC-HG estimate of grad J_L (Theorem 1 / Algorithm 1): partial term + Benefit guiding term.

    ``Q_L`` is the leader critic ([S,B], e.g. SARSA, or exact for tests); ``guide="none"`` gives
    Naive-PGD (partial term only).
    """
    S, B = Q_L.shape
    n_ep = batch.num_episodes.astype(Q_L.dtype)
    V_L = state_value(Q_L, follower.policy)
    rho = problem.init_dist(theta)
    c_rL, c_logp_L, c_log_rho, c_rho = partial_cotangents(batch, V_L, rho, problem.gamma_L, n_ep,
                                                          S, B, partial)
    if guide == "benefit":
        w = (problem.gamma_L ** batch.t.astype(Q_L.dtype)) * benefit(Q_L, follower.policy)[batch.s, batch.b]
        c_rF, c_logp_F = follower_q_grad_cotangents(w / (beta * n_ep), batch, follower.V,
                                                    problem.gamma_F, S, B, grouping)
    elif guide == "none":
        c_rF, c_logp_F = jnp.zeros((S, B), Q_L.dtype), jnp.zeros((S, B, S), Q_L.dtype)
    else:
        raise ValueError(f"guide must be one of {GUIDES}, got {guide!r}")
    return apply_cotangents(problem, theta, Cotangents(c_rF, c_rL, c_logp_F + c_logp_L,
                                                       c_log_rho, c_rho))
