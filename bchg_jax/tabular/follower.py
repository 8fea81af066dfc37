"""Soft value iteration: the follower's entropy-regularised best response (Eq. (lower)).

    Q_F(s, b) = r_F(s, b) + gamma_F (1 - term(s)) sum_{s'} p(s'|s, b) V_F(s')
    V_F(s)    = beta log sum_b exp(Q_F(s, b) / beta)
    g(b | s)  = exp((Q_F(s, b) - V_F(s)) / beta)   (rows normalised, :func:`boltzmann`)

Pure and jit-able; warm-startable from a previous ``V``; either a fixed number of sweeps
(``tol=None``) or sweeps until the sup-norm change is ``<= tol`` (at most ``max_sweeps``), or
until it has stalled at the float rounding floor (:mod:`bchg_jax.core.rounding`).
"""

from __future__ import annotations

from typing import NamedTuple, Optional

import jax
import jax.numpy as jnp

from bchg_jax.core.eager import cached_when_eager
from bchg_jax.core.precision import full_precision
from bchg_jax.core.rounding import sweep_to_tolerance
from bchg_jax.core.validate import (
    check_beta_if_concrete,
    check_bool_mask_if_concrete,
    check_discount,
    check_if_concrete,
    check_shape,
    check_solver_settings,
    transition_sizes,
)

Array = jax.Array


class BestResponse(NamedTuple):
    """The follower's best response g^{theta dagger} and its soft values.

    White-box follower (Assumption 1): the leader reads the policy and the soft values
    V_F^{theta dagger}, Q_F^{theta dagger} (S states, B follower actions).
    """

    policy: Array  # [S, B]  g(b | s)
    V: Array  # [S]     V_F
    Q: Array  # [S, B]  Q_F
    sweeps: Array  # []      number of Bellman sweeps performed (int32, under x64 too)
    residual: Array  # []    sup-norm change of the last sweep

    def log_prob(self, s, b):
        """log g(b|s) for integer arrays ``s``, ``b`` of one shape -> that shape."""
        return jnp.log(self.policy[s, b])

    def value(self, s):
        """V_F(s) for an integer array ``s`` -> its shape."""
        return self.V[s]

    def q_value(self, s, b):
        """Q_F(s, b) for integer arrays ``s``, ``b`` of one shape -> that shape."""
        return self.Q[s, b]

    def sample(self, key, s):
        """b ~ g(.|s) for a PRNG ``key`` and integer states ``s`` [...] -> int [...]."""
        return jax.random.categorical(key, jnp.log(self.policy[s]))


def continuation(terminal: Optional[Array], num_states: int, dtype) -> Array:
    """1 - term(s): zero continuation after terminal states.

    Args:
      terminal: [S] bool mask of terminal states, or None (no terminal state).
      num_states: S.
      dtype: the result's dtype.
    Returns:
      [S] continuation factors in {0, 1}.
    """
    if terminal is None:
        return jnp.ones((num_states,), dtype)
    # through bool, as the sampler reads the mask: any non-zero entry is terminal
    return 1.0 - jnp.asarray(terminal, bool).astype(dtype)


def soft_q(P: Array, r: Array, V: Array, gamma, cont: Array) -> Array:
    """One soft Bellman backup Q = r + gamma cont * P V  ([S,B,S], [S,B], [S] -> [S,B]).

    Args:
      P: [S, B, S] transition p(s'|s, b).
      r: [S, B] reward.
      V: [S] value of the next state.
      gamma: discount (scalar).
      cont: [S] continuation 1 - term(s).
    Returns:
      [S, B] Q(s, b).
    """
    return r + (gamma * cont)[:, None] * jnp.einsum("sbt,t->sb", P, V)


def soft_v(Q: Array, beta) -> Array:
    """V(s) = beta logsumexp_b Q(s, b) / beta.

    Args:
      Q: [S, B] soft action values.
      beta: entropy weight (> 0).
    Returns:
      [S] soft values.
    """
    return beta * jax.nn.logsumexp(Q / beta, axis=-1)


def boltzmann(Q: Array, V: Array, beta, axis: int = -1) -> Array:
    """g(b|s) = exp((Q - V) / beta), the Boltzmann best response of Section "Preliminaries",
    with its rows normalised: ``exp((Q - V) / beta) / sum_b exp((Q - V) / beta)``.

    With ``V = soft_v(Q, beta)`` the sum is 1 in exact arithmetic, so this is the same policy
    (softmax(Q / beta)). In float32 the unnormalised rows sum to 1 +- 9e-5 on Four-Rooms at
    beta 1e-3 (the rounding of Q - V, ~eps |V|, divided by beta), and every consumer inherits
    it: the Benefit baseline V_L = sum_b g Q_L of Theorem 1's estimators was off by
    ~(sum_b g - 1) V_L (BC-HG with an exact critic: a mean error of 9.4e-4 against |grad J_L|
    0.011, 9% of each estimate) and the sampler drew actions of probability ~0. Normalised,
    the rows sum to 1 within a few ulps. ``V`` only shifts the exponent (it cancels in the
    ratio, in derivatives too: the implicit derivatives of
    :func:`~bchg_jax.tabular.exact.best_response` are those of softmax(Q / beta)) and keeps
    ``exp`` <= 1. In float32, ``V`` can round below ``max_b Q``; the shift is the larger of
    the two, so ``exp`` stays <= 1 even where ``|Q| / beta`` is huge (|Q| ~ 1e4 at beta 1e-5
    overflowed to a NaN policy) and is ``V`` itself wherever ``V >= max_b Q``.

    Args:
      Q: [S, B] soft action values (any shape with the actions on ``axis``).
      V: [S] soft values (``soft_v(Q, beta)``; ``Q``'s shape without ``axis``).
      beta: entropy weight (> 0).
      axis: the actions' axis of ``Q`` (the sparse solver's run-last [S, B, R]: 1).
    Returns:
      [S, B] policy g(b|s), rows summing to 1.
    """
    shift = jnp.maximum(jnp.expand_dims(V, axis), jnp.max(Q, axis=axis, keepdims=True))
    g = jnp.exp((Q - shift) / beta)
    return g / jnp.sum(g, axis=axis, keepdims=True)


def check_follower_inputs(P, r, beta, gamma, terminal=None, V0=None, successors=None) -> int:
    """The input checks of the follower's solvers (:func:`soft_value_iteration` and the sparse
    :func:`~bchg_jax.tabular.sparse.sparse_soft_value_iteration`).

    Args:
      P: [S, B, S] transition; r: [S, B] follower reward; beta: entropy weight; gamma: discount
      gamma_F; terminal: [S] mask or None; V0: [S] warm start or None; successors: a successor
      table (``index`` [S, J], ``width`` J) or None.
    Returns:
      S, the number of states.
    Raises:
      ValueError: a concrete ``beta`` not finite and > 0, a concrete ``gamma`` outside [0, 1),
        ``r`` / ``terminal`` / ``V0`` not shaped by ``P``'s S, B, a concrete ``terminal`` that
        is not a bool (0 / 1) mask, or a ``successors`` table that fails
        :meth:`~bchg_jax.tabular.sparse.Successors.check`.
    """
    check_beta_if_concrete(beta)
    check_if_concrete(check_discount, "gamma (the follower's discount)", gamma)
    S, B = transition_sizes("P (transition)", P)
    src = f"S={S}, B={B} from P [S, B, S]"
    check_shape("r (follower reward)", r, (S, B), src)
    if successors is not None:
        successors.check(S, src)
    if terminal is not None:
        check_shape("terminal", terminal, (S,), src)
        check_bool_mask_if_concrete("terminal", terminal)
    if V0 is not None:
        check_shape("V0", V0, (S,), src)
    return S


def _check_solver_args(
    P, r, beta, gamma, terminal=None, V0=None, num_sweeps=500, tol=None, max_sweeps=2000
) -> None:
    """:func:`soft_value_iteration`'s checks (an eager call's precheck, and its body's: the
    cached program traces the arrays)."""
    check_follower_inputs(P, r, beta, gamma, terminal, V0)
    check_solver_settings(
        "soft_value_iteration",
        tol,
        **(dict(num_sweeps=(num_sweeps, 0)) if tol is None else dict(max_sweeps=(max_sweeps, 1))),
    )


# the sweeps and residual are returned as they are (the caller judges them)
@cached_when_eager(_check_solver_args, recheck=False, problem_free=True)
@full_precision
def soft_value_iteration(
    P: Array,
    r: Array,
    beta,
    gamma,
    terminal: Optional[Array] = None,
    V0: Optional[Array] = None,
    num_sweeps: int = 500,
    tol: Optional[float] = None,
    max_sweeps: int = 2000,
) -> BestResponse:
    """Soft value iteration on the model ``P`` [S,B,S] with reward ``r`` [S,B].

    Solves the follower problem Eq. (lower) (the best response g^{theta dagger} of Eq. (upper)
    for the tables of M_theta); the forward-only solver of the training loop (Algorithm 8
    line 4). Not implicitly differentiated: use :func:`~bchg_jax.tabular.exact.best_response`
    for derivatives in theta.
    ``tol=None``: exactly ``num_sweeps`` sweeps (the reference's fixed schedule).
    ``tol=float``: sweeps until ``max |V_{k+1} - V_k| <= tol`` or ``max_sweeps``, or until the
    change has stalled at the rounding floor ``8 eps max |V|`` (:mod:`bchg_jax.core.rounding`:
    a float32 solve with ``|V|`` above ~8 may never get within 1e-6; converged means
    ``within_tolerance(residual, V, tol)``).
    ``V0``: warm start (default zeros).

    Args:
      P: [S, B, S] transition p^theta(s'|s, b).
      r: [S, B] follower reward r_F^theta.
      beta: entropy weight (> 0; scalar, may be traced).
      gamma: discount gamma_F (scalar).
      terminal: [S] bool mask of terminal states, or None.
      V0: [S] warm start, or None for zeros (cast to ``r.dtype``).
      num_sweeps: number of sweeps when ``tol`` is None.
      tol: sup-norm stopping tolerance, or None for a fixed schedule.
      max_sweeps: cap on sweeps when ``tol`` is set.
    Returns:
      :class:`BestResponse`: ``policy`` [S, B], ``V`` [S], ``Q`` [S, B], ``sweeps`` [] (sweeps
      performed), ``residual`` [] (sup-norm change of the last sweep).
    Raises:
      ValueError: a concrete ``beta`` not finite and > 0, a concrete ``gamma`` outside [0, 1),
        ``r`` / ``terminal`` / ``V0`` not shaped by ``P``'s S, B, or a concrete ``terminal``
        that is not a bool (0 / 1) mask, a concrete ``tol`` not finite and > 0, or the sweep
        count it reads not an integer >= its floor (``num_sweeps`` without ``tol``: >= 0, the
        answer then being one backup of ``V0``; ``max_sweeps`` with it: >= 1).
    """
    _check_solver_args(P, r, beta, gamma, terminal, V0, num_sweeps, tol, max_sweeps)
    S = r.shape[0]
    cont = continuation(terminal, S, r.dtype)
    V0 = jnp.zeros((S,), r.dtype) if V0 is None else V0.astype(r.dtype)
    beta = jnp.asarray(beta, r.dtype)  # a float64 beta would widen a float32 sweep's carry

    def sweep(V):
        return soft_v(soft_q(P, r, V, gamma, cont), beta)

    if tol is None:

        def body(_, carry):
            V, _res = carry
            V2 = sweep(V)
            return V2, jnp.max(jnp.abs(V2 - V))

        V, res = jax.lax.fori_loop(0, num_sweeps, body, (V0, jnp.asarray(jnp.inf, r.dtype)))
        n = jnp.asarray(num_sweeps, jnp.int32)
    else:
        V, res, n = sweep_to_tolerance(sweep, V0, tol, max_sweeps, gamma)
    Q = soft_q(P, r, V, gamma, cont)
    V = soft_v(Q, beta)
    return BestResponse(policy=boltzmann(Q, V, beta), V=V, Q=Q, sweeps=n, residual=res)
