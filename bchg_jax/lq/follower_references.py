"""Exact references for an LQ follower off its best response (the LQ analogue of
:mod:`bchg_jax.tabular.follower_references`).

* :func:`as_if_optimal_hypergradient`: Theorem 1 at the follower's current Gaussian policy g as if
  it were optimal: ``d/dtheta J_L(theta, g_theta)`` with
  ``g_theta(b|s) ~ g(b|s) exp((Q^g_theta - sg(Q^g_theta))(s, b) / beta)``, ``Q^g_theta`` the soft Q
  of the fixed g in M_theta. Q^g is quadratic, ``-[s; b]^T H [s; b] + const``, so g_theta stays
  Gaussian: with ``dH = H_theta - sg(H_theta)``, precision ``cov^-1 + (2/beta) dH_bb`` and gain
  ``cov_theta (cov^-1 K + (2/beta) dH_bs)``: equal to g, with the Boltzmann derivative.
* :func:`k_step_hypergradient`: ``d/dtheta J_L(theta, g_K(theta))`` through the learner's K
  Riccati steps from ``P_prev`` (held fixed), unrolled; from the learner's value after its
  reaction to theta_i (what the trainer passes), the leader's true one-step gradient.
* :func:`lag_hypergradient`: ``d/dtheta J_L(theta, lag(g_prev, g^{theta dagger}))`` with the
  previous policy held fixed and the best response implicitly differentiated (the Riccati
  solution's ``custom_root``): the ``lag`` follower's step
  (:func:`~bchg_jax.lq.follower_models.lag_response`), ``mix`` times the best response's share
  of the derivative.

All three equal :func:`~bchg_jax.lq.exact.exact_hypergradient` at the best response (tested).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from bchg_jax.core.eager import cached_when_eager
from bchg_jax.core.follower_model import mix_in_range
from bchg_jax.core.maxent_lqr import (
    GaussianBestResponse,
    held_policy,
    nan_unless,
    nan_unless_converged,
)
from bchg_jax.core.precision import full_precision
from bchg_jax.core.validate import (
    check_beta_if_concrete,
    check_count,
    check_mix_if_concrete,
    is_concrete,
)
from bchg_jax.lq.cmdp import LQConfigurableMDP, check_policy_fits
from bchg_jax.lq.exact import leader_objective, refuse_divergence
from bchg_jax.lq.follower_models import (
    check_model_at,
    check_value_matrix,
    k_step_response,
    lag_response,
    policy_value,
)

Array = jax.Array


def _q_matrices(problem: LQConfigurableMDP, theta: Array, P: Array):
    """(H_bb [m, m], H_bs [m, n]) of Q(s, b) = -[s; b]^T H [s; b] + const for the value
    ``-s^T P s``: ``H_bb = Rbar + gamma B^T P B``, ``H_bs = gamma B^T P A``."""
    A, B = problem.A_fn(theta), problem.B_fn(theta)
    Rbar = jnp.asarray(problem.Rbar, theta.dtype)
    g = problem.gamma_F
    return Rbar + g * B.T @ P @ B, g * B.T @ P @ A


def _as_if_optimal_checks(problem, theta, policy, beta, horizon="default") -> None:
    """:func:`as_if_optimal_hypergradient`'s checks (an eager call's precheck: inside its cached
    program theta and the policy are traced)."""
    check_model_at(problem, theta)
    check_beta_if_concrete(beta)
    check_policy_fits(problem, policy)


@cached_when_eager(_as_if_optimal_checks)
@full_precision
def as_if_optimal_hypergradient(
    problem: LQConfigurableMDP, theta: Array, policy: GaussianBestResponse, beta, horizon="default"
) -> Array:
    """Theorem 1's hypergradient at the follower's current ``policy`` (gain ``K``, ``cov``) as if
    it were optimal (module docstring); ``horizon`` as :func:`~bchg_jax.lq.exact.leader_objective`.

    Raises:
      ValueError: ``theta`` not shaped like ``theta0`` or not finite, a bad ``A(theta)`` /
        ``B(theta)`` (:func:`~bchg_jax.lq.follower_models.check_model_at`), a concrete ``beta``
        not finite and > 0, a ``policy`` whose gain or covariance does not fit the problem, or a
        concrete result that is not finite because the policy's closed loop diverges
        (:func:`~bchg_jax.lq.exact.refuse_divergence`).
    """
    _as_if_optimal_checks(problem, theta, policy, beta)
    # in theta's dtype, as k_step_hypergradient's P_prev: a float64 policy or beta beside a
    # float32 theta would widen the covariance sum's carry
    dt = theta.dtype
    g = held_policy(policy, dt)
    beta = jnp.asarray(beta, dt)
    prec = jnp.linalg.inv(g.cov)

    def objective(th):
        P, _ = policy_value(problem, th, g, beta)
        H_bb, H_bs = _q_matrices(problem, th, P)
        d_bb, d_bs = H_bb - jax.lax.stop_gradient(H_bb), H_bs - jax.lax.stop_gradient(H_bs)
        cov = jnp.linalg.inv(prec + (2.0 / beta) * d_bb)
        K = cov @ (prec @ g.K + (2.0 / beta) * d_bs)
        moved = g._replace(K=K, cov=0.5 * (cov + cov.T))
        return leader_objective(problem, th, beta, horizon, br=moved)

    grad = jax.grad(objective)(theta)
    H = problem.horizon if horizon == "default" else horizon
    refuse_divergence(problem, theta, policy, H, grad, "lq.as_if_optimal_hypergradient")
    return grad


def _k_step_checks(problem, theta, P_prev, beta, K, horizon="default") -> None:
    """:func:`k_step_hypergradient`'s checks (an eager call's precheck, as above)."""
    check_model_at(problem, theta)
    check_beta_if_concrete(beta)
    check_count("K (Riccati steps)", K)
    check_value_matrix(problem, P_prev)


@cached_when_eager(_k_step_checks)
@full_precision
def k_step_hypergradient(
    problem: LQConfigurableMDP, theta: Array, P_prev: Array, beta, K: int, horizon="default"
) -> Array:
    """d/dtheta J_L(theta, g_K(theta)), g_K the K-step learner's policy from ``P_prev`` [n, n].

    Raises:
      ValueError: as :func:`as_if_optimal_hypergradient`, a bad ``P_prev``
        (:func:`~bchg_jax.lq.follower_models.check_value_matrix`), ``K`` not an integer >= 1,
        or a concrete result that is not finite because the learner's closed loop diverges.
    """
    _k_step_checks(problem, theta, P_prev, beta, K)

    def objective(th):
        played, _ = k_step_response(problem, th, beta, P_prev, K)
        return leader_objective(problem, th, beta, horizon, br=played), played

    grad, played = jax.grad(objective, has_aux=True)(theta)
    H = problem.horizon if horizon == "default" else horizon
    refuse_divergence(problem, theta, played, H, grad, "lq.k_step_hypergradient")
    return grad


def _lag_checks(problem, theta, previous, beta, mix, *_, **__) -> None:
    """:func:`lag_hypergradient`'s checks (an eager call's precheck, as above)."""
    check_model_at(problem, theta)
    check_beta_if_concrete(beta)
    check_mix_if_concrete(mix)
    check_policy_fits(problem, previous)


@cached_when_eager(_lag_checks)
@full_precision
def lag_hypergradient(
    problem: LQConfigurableMDP,
    theta: Array,
    previous: GaussianBestResponse,
    beta,
    mix,
    horizon="default",
    P0=None,
    tol: float = 1e-6,
    max_iters: int = 50_000,
) -> Array:
    """d/dtheta J_L(theta, lag(g_prev, g^{theta dagger})), ``previous`` = g_prev held fixed
    (module docstring; :func:`~bchg_jax.lq.follower_models.lag_response`).

    Args:
      problem: the configurable MDP. theta: [d] leader parameters.
      previous: the lag follower's previous policy (its ``K`` and ``cov`` are read).
      beta: the follower's entropy weight. mix: the weight of the best response, in (0, 1].
      horizon: as :func:`~bchg_jax.lq.exact.leader_objective`.
      P0: [n, n] warm start of the best response's Riccati iteration (default Qbar): a start
        only, the solve runs to ``tol``.
      tol, max_iters: the Riccati iteration's tolerance and cap.
    Returns:
      the gradient, shaped like ``theta``; NaN under a trace where the solve missed ``tol`` or a
      traced ``mix`` is outside (0, 1].
    Raises:
      ValueError: a ``mix`` that is not a scalar in (0, 1], a concrete solve that missed
        ``tol``, or as :func:`as_if_optimal_hypergradient` (``previous`` as its ``policy``).
    """
    _lag_checks(problem, theta, previous, beta, mix)
    what = "lq.lag_hypergradient: the follower's Riccati iteration"
    prev = held_policy(previous, theta.dtype)

    def objective(th):
        best = problem.best_response(th, beta, P0=P0, tol=tol, max_iters=max_iters)
        if is_concrete(best.K, best.info):  # dynamics that do not depend on theta
            nan_unless_converged(best, best.K, what)
        played = lag_response(best, prev, mix, beta)
        return leader_objective(problem, th, beta, horizon, br=played), (best, played)

    grad, (best, played) = jax.grad(objective, has_aux=True)(theta)
    grad = nan_unless_converged(best, grad, what)
    grad = nan_unless(mix_in_range(mix), grad)  # a traced mix is not checked above
    H = problem.horizon if horizon == "default" else horizon
    refuse_divergence(problem, theta, played, H, grad, "lq.lag_hypergradient")
    return grad
