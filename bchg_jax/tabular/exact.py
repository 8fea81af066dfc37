"""Exact references for tabular configurable MDPs (the ground truth of the estimator tests).

* ``policy_evaluation``: V^g = (I - gamma diag(cont) P_g)^{-1} r_g (a linear solve).
* ``best_response``: the follower's soft-optimal fixed point V_F = T_theta(V_F), differentiable in
  theta by the implicit function theorem (``jax.lax.custom_root``): dV/dtheta solves
  (I - dT/dV) dV = dT/dtheta, never by unrolling the solver.
* ``leader_objective``: J_L(theta) = rho_0^theta . V_L^{theta dagger} + Phi_L(theta)
  (Eq. (leader-utility)).
* ``exact_hypergradient``: jax.grad of ``leader_objective`` - the reference every estimator's
  mean is tested against (Theorem 1 is an identity for this gradient).
"""

from __future__ import annotations

from typing import Optional

import jax
import jax.numpy as jnp

from bchg_jax.core.eager import cached_when_eager
from bchg_jax.core.maxent_lqr import nan_unless
from bchg_jax.core.precision import full_precision
from bchg_jax.core.rounding import refuse_unless_within, sweep_to_tolerance
from bchg_jax.core.validate import (
    check_beta_if_concrete,
    check_closed_unit_interval,
    check_discount,
    check_if_concrete,
    check_probability_rows_if_concrete,
    check_problem_settings,
    check_shape,
    check_solver_settings,
    check_theta,
    is_concrete,
    transition_sizes,
    validate_if_concrete,
    warn_float32_logit_rounding,
    warn_float32_long_horizon,
)
from bchg_jax.tabular.cmdp import TabularCMDP
from bchg_jax.tabular.follower import BestResponse, boltzmann, continuation, soft_q, soft_v

Array = jax.Array


@full_precision
def policy_matrix(P: Array, policy: Array) -> Array:
    """P_g(s, s') = sum_b g(b|s) p(s'|s, b).

    Args:
      P: [S, B, S] transition p(s'|s, b).
      policy: [S, B] g(b|s).
    Returns:
      [S, S] state-to-state transition matrix under ``policy``.
    """
    return jnp.einsum("sb,sbt->st", policy, P)


@full_precision
def policy_evaluation(P: Array, r: Array, policy: Array, gamma, cont: Array) -> Array:
    """Exact V^g for reward ``r`` [S,B] by a linear solve (Bellman expectation equation).

    Solves (I - gamma diag(cont) P_g) V = sum_b g(b|s) r(s, b); differentiable in every array.

    Args:
      P: [S, B, S] transition p(s'|s, b).
      r: [S, B] per-step reward (e.g. r_L^theta).
      policy: [S, B] g(b|s).
      gamma: discount (scalar).
      cont: [S] continuation 1 - term(s) (0 after terminal states).
    Returns:
      [S] V^g(s).
    Raises:
      ValueError: a concrete ``gamma`` outside [0, 1), ``r`` / ``policy`` / ``cont`` not
        shaped by ``P``'s S, B, or a concrete ``cont`` entry outside [0, 1].
    """
    check_if_concrete(check_discount, "gamma (policy evaluation discount)", gamma)
    S, B = transition_sizes("P (transition)", P)
    src = f"S={S}, B={B} from P [S, B, S]"
    check_shape("r (reward)", r, (S, B), src)
    check_shape("policy", policy, (S, B), src)
    check_shape("cont (continuation)", cont, (S,), src)
    check_if_concrete(check_closed_unit_interval, "cont (continuation)", cont)
    A = jnp.eye(S, dtype=r.dtype) - (gamma * cont)[:, None] * policy_matrix(P, policy)
    return jnp.linalg.solve(A, jnp.sum(policy * r, axis=-1))


@full_precision
def policy_evaluation_sweeps(
    P: Array,
    r: Array,
    policy: Array,
    gamma,
    cont: Array,
    V0: Array,
    tol: float,
    max_sweeps: int = 2000,
    return_residual: bool = False,
):
    """Iterative policy evaluation from a warm start ``V0`` until sup-norm change <= ``tol``
    (or stalled at the float rounding floor: :mod:`bchg_jax.core.rounding`).

    Args:
      P: [S, B, S] transition p(s'|s, b).
      r: [S, B] per-step reward.
      policy: [S, B] g(b|s).
      gamma: discount (scalar).
      cont: [S] continuation 1 - term(s).
      V0: [S] warm start.
      tol: stopping tolerance on max_s |V_{k+1}(s) - V_k(s)|.
      max_sweeps: at most this many Bellman expectation sweeps.
      return_residual: also return the sup-norm change of the last sweep (converged:
        :func:`~bchg_jax.core.rounding.within_tolerance` of it, V and ``tol``; otherwise the
        cap was hit first).
    Returns:
      [S] V^g(s) (approximate), or (V, residual []) with ``return_residual``.
    Raises:
      ValueError: a concrete ``tol`` not finite and > 0, or ``max_sweeps`` not an integer >= 1.
    """
    check_solver_settings("policy_evaluation_sweeps", tol, max_sweeps=(max_sweeps, 1))

    def sweep(V):
        return jnp.sum(policy * soft_q(P, r, V, gamma, cont), axis=-1)

    V, res, _ = sweep_to_tolerance(sweep, V0, tol, max_sweeps, gamma)
    return (V, res) if return_residual else V


@full_precision
def soft_newton(P: Array, r: Array, beta, gamma, cont: Array, V0: Array, iters: int = 30) -> Array:
    """Soft policy iteration (Newton's method on the soft Bellman equation) - quadratic convergence.

    Accurate in float64; in float32 the linear solves limit accuracy (use soft value iteration).

    Args:
      P: [S, B, S] transition p(s'|s, b).
      r: [S, B] follower reward r_F.
      beta: entropy weight (> 0).
      gamma: discount gamma_F (scalar).
      cont: [S] continuation 1 - term(s).
      V0: [S] initial soft value.
      iters: number of Newton (policy-evaluation) steps.
    Returns:
      [S] soft value V_F after ``iters`` steps.
    Raises:
      ValueError: ``iters`` not an integer >= 0.
    """
    check_solver_settings("soft_newton", iters=(iters, 0))
    beta = jnp.asarray(beta, r.dtype)  # a float64 beta would widen a float32 step's carry

    def step(V, _):
        Q = soft_q(P, r, V, gamma, cont)
        g = boltzmann(Q, soft_v(Q, beta), beta)
        entropy_r = r - beta * jnp.log(jnp.maximum(g, jnp.finfo(r.dtype).tiny))
        return policy_evaluation(P, entropy_r, g, gamma, cont), None

    V, _ = jax.lax.scan(step, V0, None, length=iters)
    return V


def _precheck(problem, theta, beta, *_, **__) -> None:
    """:func:`check_inputs` of an eager call (``cached_when_eager``: theta is traced inside)."""
    check_inputs(problem, theta, beta)


def _warn_rounded_logits(br, problem, theta, beta, *_, **__) -> None:
    """The plain eager :func:`best_response`'s float32 logits warning, after a cached call."""
    warn_float32_logit_rounding("tabular.best_response", br.Q, beta, stacklevel=4)


def _warn_rounded_logits_at(_out, problem, theta, beta, **solve) -> None:
    """The same for :func:`leader_objective` in float32 (its best response, cached, warns)."""
    if jnp.asarray(problem.follower_reward(theta)).dtype == jnp.float32:
        best_response(problem, theta, beta, **solve)


def check_inputs(problem: TabularCMDP, theta: Array, beta) -> None:
    """The checks of :func:`best_response` and the functions built on it: the scalar settings of
    ``problem``, a concrete ``beta`` and ``theta`` (shape, finiteness when concrete) and, at a
    concrete theta, ``problem.validate(theta)`` (the tables there: an unvalidated problem whose
    rows summed to 0.9 gave finite numbers)."""
    check_problem_settings(problem)
    check_beta_if_concrete(beta)
    check_theta(problem, theta)
    if is_concrete(theta):
        validate_if_concrete(problem, theta)


@cached_when_eager(_precheck, _warn_rounded_logits)
@full_precision
def best_response(
    problem: TabularCMDP,
    theta: Array,
    beta,
    V0: Optional[Array] = None,
    newton_iters: int = 30,
    polish_sweeps: int = 200,
    tol: Optional[float] = 1e-6,
) -> BestResponse:
    """The follower's best response g^{theta dagger}, differentiable in theta (implicit diff.).

    The unique solution of the entropy-regularised follower problem Eq. (lower) in M_theta (the
    argmax of Eq. (upper)): g(b|s) = exp((Q_F - V_F) / beta).
    The forward solve is Newton (soft policy iteration) followed by ``polish_sweeps`` soft VI
    sweeps; the derivative comes from the implicit function theorem at the fixed point.

    Args:
      problem: the :class:`TabularCMDP` (uses ``transition``, ``follower_reward``, ``terminal``).
      theta: leader parameters, shaped like ``problem.theta0``.
      beta: the follower's entropy weight (> 0).
      V0: [S] warm start of the forward solve (not differentiated), or None for zeros.
      newton_iters: Newton steps before the sweeps (0: soft value iteration only).
      polish_sweeps: soft value-iteration sweeps after Newton.
      tol: the residual the solve must reach, ``max(tol, rounding_floor(V))``
        (:func:`~bchg_jax.core.rounding.within_tolerance`); None: no check (a caller that
        checks its own solve, as the trainer does its warm-started one).
    Returns:
      :class:`BestResponse`: ``policy`` [S, B], ``V`` [S], ``Q`` [S, B], ``sweeps`` []
      (= ``polish_sweeps``), ``residual`` [] (sup-norm of T(V) - V). A solve that missed
      ``tol`` under a trace (``jit`` / ``vmap`` / ``grad``) returns NaN ``policy``, ``V``,
      ``Q`` (and NaN derivatives), never a number from an unconverged solve.
    Raises:
      ValueError: a concrete ``beta`` not finite and > 0, a bad scalar setting of
        ``problem`` (a discount outside [0, 1), a bad ``time_limit``), ``theta`` not shaped
        like ``problem.theta0`` or not finite, or a concrete solve that missed ``tol`` (too
        few ``newton_iters`` / ``polish_sweeps``, or a ``V0`` far from the fixed point), a
        concrete ``tol`` not None and not finite and > 0, or ``newton_iters`` /
        ``polish_sweeps`` not an integer >= 0.
    """
    check_inputs(problem, theta, beta)
    check_solver_settings(
        "tabular.best_response",
        tol,
        newton_iters=(newton_iters, 0),
        polish_sweeps=(polish_sweeps, 0),
    )
    P = problem.transition(theta)
    r = problem.follower_reward(theta)
    cont = continuation(problem.terminal, r.shape[0], r.dtype)
    gamma = problem.gamma_F
    beta = jnp.asarray(beta, r.dtype)  # the problem's dtype: a float64 beta would widen V

    def T(V):
        return soft_v(soft_q(P, r, V, gamma, cont), beta)

    def f(V):
        return T(V) - V

    def solve(_f, V_init):
        V = V_init
        if newton_iters > 0:
            V = soft_newton(
                jax.lax.stop_gradient(P),
                jax.lax.stop_gradient(r),
                beta,
                gamma,
                cont,
                V,
                newton_iters,
            )
        return jax.lax.fori_loop(0, polish_sweeps, lambda _, v: T(v), V)

    def tangent_solve(g, y):
        J = jax.jacfwd(g)(y)
        return jnp.linalg.solve(J, y)

    V_init = jnp.zeros_like(r[:, 0]) if V0 is None else jax.lax.stop_gradient(V0)
    V = jax.lax.custom_root(f, V_init, solve, tangent_solve)
    residual = jnp.max(jnp.abs(f(V)))
    if tol is not None:
        ok = refuse_unless_within(
            residual,
            V,
            tol,
            "tabular.best_response",
            f"newton_iters={newton_iters}, polish_sweeps={polish_sweeps}: raise them (the "
            "defaults are 30 and 200), give a V0 nearer the fixed point, or pass tol=None to "
            "take the unconverged solve as it is",
        )
        V = nan_unless(ok, V)
    Q = soft_q(P, r, V, gamma, cont)
    warn_float32_logit_rounding("tabular.best_response", Q, beta)
    V = soft_v(Q, beta)
    return BestResponse(
        policy=boltzmann(Q, V, beta),
        V=V,
        Q=Q,
        sweeps=jnp.asarray(polish_sweeps, jnp.int32),
        residual=residual,
    )


@full_precision
def leader_values(problem: TabularCMDP, theta: Array, policy: Array):
    """Exact (V_L [S], Q_L [S,B]) of the leader under the follower policy ``policy``.

    V_L^{theta g} and Q_L^{theta g} of Section "Hypergradient for Configurable MDPs" (with
    ``policy`` = g^{theta dagger}: the V_L, Q_L and Benefit of Theorem 1).

    Args:
      problem: the :class:`TabularCMDP`.
      theta: leader parameters, shaped like ``problem.theta0``.
      policy: [S, B] follower policy g(b|s).
    Returns:
      (V_L, Q_L): [S] and [S, B].
    Raises:
      ValueError: a bad scalar setting of ``problem`` (a discount outside [0, 1), ...), at a
        concrete theta a problem that fails ``validate(theta)``, a ``policy`` not of shape
        [S, B] (S, B from ``problem.transition``), or a concrete ``policy`` whose rows are not
        distributions.
    """
    check_problem_settings(problem)
    check_theta(problem, theta)
    if is_concrete(theta):  # rows summing to 0.9 gave the values of no problem
        validate_if_concrete(problem, theta)
    P = problem.transition(theta)
    S, B = transition_sizes("problem.transition(theta)", P)
    check_shape("policy", policy, (S, B), f"S={S}, B={B} from problem.transition(theta)")
    check_probability_rows_if_concrete("policy", policy)
    rL = problem.leader_reward(theta)
    cont = continuation(problem.terminal, rL.shape[0], rL.dtype)
    V = policy_evaluation(P, rL, policy, problem.gamma_L, cont)
    return V, soft_q(P, rL, V, problem.gamma_L, cont)


@cached_when_eager(_precheck, _warn_rounded_logits_at)
@full_precision
def leader_objective(problem: TabularCMDP, theta: Array, beta, **solve) -> Array:
    """Exact J_L(theta, g^{theta dagger}) = rho_0^theta . V_L + Phi_L(theta) (Eq. (leader-utility)).

    Args:
      problem: the :class:`TabularCMDP`.
      theta: leader parameters, shaped like ``problem.theta0``.
      beta: the follower's entropy weight (> 0).
      **solve: the follower solve, passed to :func:`best_response` by keyword: ``V0`` ([S] or
        None), ``newton_iters``, ``polish_sweeps``, ``tol``.
    Returns:
      [] scalar J_L, differentiable in ``theta`` through the follower's fixed point.
    Raises:
      ValueError: as :func:`best_response`.
    """
    br = best_response(problem, theta, beta, **solve)  # checks the inputs first
    V_L, _ = leader_values(problem, theta, br.policy)
    return jnp.dot(problem.init_dist(theta), V_L) + problem.regularizer(theta)


@cached_when_eager(_precheck, _warn_rounded_logits_at)
@full_precision
def exact_hypergradient(problem: TabularCMDP, theta: Array, beta, **solve) -> Array:
    """grad_theta J_L(theta, g^{theta dagger}) through the follower's fixed point.

    The exact hypergradient that Theorem 1 (Eq. (hg_configurable)) expresses; ``jax.grad`` of
    :func:`leader_objective` with implicit differentiation of :func:`best_response`.

    Args:
      problem, theta, beta, **solve: as :func:`leader_objective` (``solve``: ``V0``,
        ``newton_iters``, ``polish_sweeps``, ``tol`` of :func:`best_response`, by keyword).
    Returns:
      the gradient, shaped like ``theta`` (includes grad Phi_L).
    Raises:
      ValueError: as :func:`best_response`.
    Warns:
      float32 with a discount above :data:`~bchg_jax.core.validate.FLOAT32_GAMMA_WARN`.
    """
    # checked here, where theta is concrete (under grad it is a tracer: no finiteness check)
    check_inputs(problem, theta, beta)
    dtype = jnp.result_type(*jax.tree_util.tree_leaves(theta))
    warn_float32_long_horizon(
        "tabular.exact_hypergradient", dtype, problem.gamma_F, problem.gamma_L
    )
    return jax.grad(leader_objective, argnums=1)(problem, theta, beta, **solve)
