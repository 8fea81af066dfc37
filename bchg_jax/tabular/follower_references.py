"""Exact references for a follower that is not at its best response (tabular CMDP).

Two gradients bound what an estimator can be asked for when the follower plays some policy g
at theta instead of g^{theta dagger}:

* :func:`as_if_optimal_hypergradient` - the follower's current policy treated as optimal:
  Theorem 1 (Eq. (hg_configurable)) with g, its leader values and its own soft values,
  ``d/dtheta J_L(theta, g_theta)`` with ``g_theta = softmax(log g + (Q^g_theta -
  sg(Q^g_theta)) / beta)``. ``Q^g_theta`` is the entropy-regularised Q of the *fixed* g in
  M_theta, so ``g_theta = g`` and ``dg_theta = (1/beta) g (dQ^g - E_g dQ^g)``: the
  Boltzmann response's derivative with the fixed-policy derivative in place of the optimal one
  (equal at the best response, by the envelope theorem). This is what BC-HG and the other
  trajectory estimators target when they sample under g: the segment estimator of Eq. (nablaQF)
  with ``V^g`` estimates ``dQ^g`` at fixed g.
* the derivative through the follower's *actual* update, its state held fixed:
  :func:`k_step_hypergradient` (``J_L(theta, softmax(T_theta^K Q_prev / beta))``, unrolled) and
  :func:`lag_hypergradient` (``J_L(theta, (1 - mix) g_prev + mix g^{theta dagger})``, the best
  response implicitly differentiated). From the learner's state after its reaction to theta_i
  (what the trainers pass), this is the leader's true one-step gradient against that learner:
  the derivative of the next J_L in the leader's step. A sample-based learner (``q_learning``)
  has no such model derivative: its update is a random function of the transitions it sees
  (and of r_F(theta) on them).

At the best response all three equal :func:`~bchg_jax.tabular.exact.exact_hypergradient`
(K -> infinity, mix = 1; tested).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from bchg_jax.core.eager import cached_when_eager
from bchg_jax.core.follower_model import mix_in_range
from bchg_jax.core.maxent_lqr import nan_unless
from bchg_jax.core.precision import full_precision
from bchg_jax.core.softmax import follower_softmax
from bchg_jax.core.validate import (
    check_count,
    check_finite_if_concrete,
    check_mix_if_concrete,
    check_probability_rows_if_concrete,
    check_shape,
    check_solver_settings,
)
from bchg_jax.tabular.cmdp import TabularCMDP
from bchg_jax.tabular.exact import best_response, check_inputs, leader_values
from bchg_jax.tabular.follower import continuation, soft_q, soft_value_iteration
from bchg_jax.tabular.follower_models import soft_policy_value

Array = jax.Array
# soft sweeps that polish an already solved fixed point (``lag_hypergradient(V_star=...)``; the
# trainer's exact hypergradient from its converged best response takes as many)
POLISHED_SWEEPS = 3


@full_precision
def policy_objective(problem: TabularCMDP, theta: Array, policy: Array) -> Array:
    """J_L(theta, g) = rho_0^theta . V_L^g + Phi_L(theta) for a given follower policy [S, B]
    (Eq. (leader-utility)); differentiable in ``theta`` and ``policy``."""
    V_L, _ = leader_values(problem, theta, policy)
    return jnp.dot(problem.init_dist(theta), V_L) + problem.regularizer(theta)


def _check(problem: TabularCMDP, theta: Array, beta, K=None) -> None:
    """The references' host-side checks: the problem's scalar settings, ``theta`` shaped like
    ``theta0`` (finite when concrete), ``beta`` finite and > 0 when concrete, at a concrete
    theta ``problem.validate(theta)`` (rows summing to 0.9 gave each reference a finite
    gradient of no problem, a NaN reward a NaN one), ``K`` >= 1."""
    check_inputs(problem, theta, beta)
    if K is not None:
        check_count("K (soft Bellman backups)", K)


def _check_policy(problem: TabularCMDP, theta: Array, label: str, policy) -> None:
    """A follower policy given to a reference: [S, B] (from the problem's reward table; static,
    so traced policies too) and, when concrete, probability rows. Rows summing to 2 gave the
    as-if gradient of no policy (one part renormalises them, the soft values do not)."""
    S, B = jax.eval_shape(problem.follower_reward, theta).shape
    check_shape(label, policy, (S, B), f"S={S}, B={B} from {problem.name}'s follower_reward")
    check_probability_rows_if_concrete(label, policy)


def _follower_tables(problem: TabularCMDP, theta: Array):
    P, r = problem.transition(theta), problem.follower_reward(theta)
    return P, r, continuation(problem.terminal, r.shape[0], r.dtype)


@full_precision
def as_if_optimal_hypergradient(problem: TabularCMDP, theta: Array, policy: Array, beta) -> Array:
    """Theorem 1's hypergradient at the follower's current ``policy`` g [S, B], as if optimal.

    Args:
      problem: the CMDP. theta: leader parameters. policy: g [S, B] (rows sum to 1).
      beta: the follower's entropy weight.
    Returns:
      the gradient, shaped like ``theta`` (module docstring).
    Raises:
      ValueError: a bad scalar setting of ``problem``, ``theta`` not shaped like ``theta0`` or
        not finite, a concrete ``beta`` not finite and > 0, or a ``policy`` not [S, B] or
        (concrete) not probability rows.
    """
    _check(problem, theta, beta)
    _check_policy(problem, theta, "policy", policy)
    g = jax.lax.stop_gradient(policy)
    log_g = jnp.log(jnp.maximum(g, jnp.finfo(g.dtype).tiny))

    def objective(th):
        P, r, cont = _follower_tables(problem, th)
        Q = soft_q(
            P, r, soft_policy_value(P, r, g, beta, problem.gamma_F, cont), problem.gamma_F, cont
        )
        # the centred derivative (core.softmax): a plain softmax leaked the tangent common to a
        # row (dQ / beta ~ 1 / ((1 - gamma_F) beta)) off the float32 simplex, 3.5% off
        g_th = follower_softmax(log_g + (Q - jax.lax.stop_gradient(Q)) / beta)
        return policy_objective(problem, th, jnp.where(g > 0, g_th, 0.0))

    return jax.grad(objective)(theta)


def _k_step_checks(problem: TabularCMDP, theta: Array, V_prev: Array, beta, K: int) -> None:
    """:func:`k_step_hypergradient`'s checks (an eager call's precheck: inside its cached
    program theta and ``V_prev`` are traced)."""
    _check(problem, theta, beta, K)
    S = jax.eval_shape(problem.follower_reward, theta).shape[0]
    check_shape("V_prev", V_prev, (S,), f"S={S} from {problem.name}'s follower_reward")
    check_finite_if_concrete("V_prev", V_prev)


@cached_when_eager(_k_step_checks)
@full_precision
def k_step_hypergradient(problem: TabularCMDP, theta: Array, V_prev: Array, beta, K: int) -> Array:
    """d/dtheta J_L(theta, g_K(theta)) through K soft Bellman backups from ``V_prev`` (held fixed).

    ``g_K`` is :func:`~bchg_jax.tabular.follower_models.k_step_response`'s policy: K - 1 soft
    value-iteration sweeps of M_theta from ``V_prev`` [S], one backup, Boltzmann. Unrolled
    (reverse mode through the K sweeps).

    Raises:
      ValueError: as :func:`as_if_optimal_hypergradient`, ``K`` not an integer >= 1, or
        ``V_prev`` not [S] or (concrete) not finite.
    """
    _k_step_checks(problem, theta, V_prev, beta, K)

    def objective(th):
        P, r, _ = _follower_tables(problem, th)
        br = soft_value_iteration(
            P, r, beta, problem.gamma_F, problem.terminal, V0=V_prev, num_sweeps=K - 1
        )
        return policy_objective(problem, th, br.policy)

    return jax.grad(objective)(theta)


def _lag_checks(
    problem: TabularCMDP, theta: Array, previous: Array, beta, mix, V0=None, V_star=None, tol=1e-6
) -> None:
    """:func:`lag_hypergradient`'s checks (an eager call's precheck, as :func:`_k_step_checks`)."""
    _check(problem, theta, beta)
    _check_policy(problem, theta, "previous", previous)
    check_mix_if_concrete(mix)  # as FollowerModel
    check_solver_settings("tabular.lag_hypergradient", tol)
    if V0 is not None and V_star is not None:
        raise ValueError("pass V0 (a warm start) or V_star (the solved fixed point), not both")


def _warn_after_lag(
    _out, problem, theta, previous, beta, mix, V0=None, V_star=None, tol=1e-6
) -> None:
    """The plain eager call's float32 logits warning (its best response's), after a cached call:
    the best response is solved again (cached) to read its Q."""
    if jnp.asarray(problem.follower_reward(theta)).dtype == jnp.float32:
        best_response(problem, theta, beta, V0=V0 if V_star is None else V_star, tol=None)


@cached_when_eager(_lag_checks, _warn_after_lag)
@full_precision
def lag_hypergradient(
    problem: TabularCMDP,
    theta: Array,
    previous: Array,
    beta,
    mix,
    V0=None,
    V_star=None,
    tol=1e-6,
) -> Array:
    """d/dtheta J_L(theta, (1 - mix) g_prev + mix g^{theta dagger}) with ``previous`` = g_prev
    [S, B] fixed; the best response implicitly differentiated at its fixed point V_F = T(V_F)
    (:func:`~bchg_jax.tabular.exact.best_response`).

    Args:
      problem: the CMDP. theta: leader parameters. previous: g_prev [S, B].
      beta: the follower's entropy weight. mix: the weight of the new best response.
      V0: [S] warm start of the best response's solve, or None (zeros). Only a start: the full
        solve (Newton, then soft sweeps) still runs, so the gradient does not depend on it beyond
        rounding.
      V_star: [S] the fixed point V_F^{theta dagger} if already solved (the trainer's converged
        best response), or None: the solve only polishes it (``POLISHED_SWEEPS`` soft sweeps,
        no Newton step). The derivative is taken at whatever V it ends at, so ``V_star`` must be
        the solution (a V_F of theta + 0.3 gave a 3.5% error, zeros 31%, before the polished
        residual was checked against ``tol``: now an error); pass a mere start as ``V0``.
      tol: the residual the best response must reach (:func:`~bchg_jax.tabular.exact.best_response`;
        a ``V_star`` that is not the solution misses it), or None: no check (the trainer
        flags its own solve).
    Returns:
      the gradient, shaped like ``theta``; NaN under a trace where the solve missed ``tol`` or
      a traced ``mix`` is outside (0, 1].
    Raises:
      ValueError: both ``V0`` and ``V_star`` given, a concrete ``mix`` outside (0, 1], a
        ``previous`` not [S, B] probability rows, a concrete solve that missed ``tol``, or as
        :func:`as_if_optimal_hypergradient`.
    """
    _lag_checks(problem, theta, previous, beta, mix, V0, V_star, tol)
    solve = {"V0": V0, "tol": tol}
    if V_star is not None:
        solve = {"V0": V_star, "newton_iters": 0, "polish_sweeps": POLISHED_SWEEPS, "tol": tol}

    def objective(th):
        best = best_response(problem, th, beta, **solve).policy
        return policy_objective(problem, th, (1.0 - mix) * previous + mix * best)

    ok = mix_in_range(mix)  # a traced mix is not checked above: NaN, never an extrapolation
    return jax.tree.map(lambda x: nan_unless(ok, x), jax.grad(objective)(theta))
