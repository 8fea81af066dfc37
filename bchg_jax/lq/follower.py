"""The follower of a linear-Gaussian configurable MDP: the max-ent LQR best response
(Proposition 1, the disturbance unobserved when the follower acts).

:func:`best_response` solves the discounted Riccati equation for ``(A(theta), B(theta))`` by
warm-started Riccati iteration and returns the Gaussian policy ``g(b|s) = N(-K s, (beta/2) S^{-1})``
with its soft value ``V_F(s) = -(s^T P s + v)`` (:func:`soft_value`) and soft Q-function
(:func:`soft_q`); everything is differentiable in theta by implicit differentiation of the
Riccati fixed point. The solvers themselves live in :mod:`bchg_jax.core.maxent_lqr`, shared with
the bi-level LQR game.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from bchg_jax.core.eager import cached_when_eager, theta_precheck
from bchg_jax.core.maxent_lqr import (
    GaussianBestResponse,
    check_solution,
    maxent_lqr,
    riccati,
    soft_q,
    soft_value,
)
from bchg_jax.core.precision import full_precision
from bchg_jax.core.validate import (
    check_beta_if_concrete,
    check_constants_once,
    check_floating,
    check_not_wider,
    check_problem_settings,
    check_shape,
    check_theta,
)

Array = jax.Array

__all__ = [
    "GaussianBestResponse",
    "best_response",
    "check_dynamics",
    "check_solution",
    "riccati",
    "soft_q",
    "soft_value",
]


def check_dynamics(problem, theta: Array, A, B) -> None:
    """``A(theta)`` / ``B(theta)`` of ``problem`` (an LQ configurable MDP): floating, not wider
    than theta's dtype (the Riccati loop carries it and differentiates them), [n, n] / [n, m]
    (n, m from Qbar, Rbar).

    Raises:
      ValueError: naming the piece and the problem.
    """
    name = getattr(problem, "name", "the problem")
    n, m = np.shape(problem.Qbar)[0], np.shape(problem.Rbar)[0]
    for label, value, shape in (("A(theta)", A, (n, n)), ("B(theta)", B, (n, m))):
        check_not_wider(name, label, value, theta.dtype)
        check_floating(name, label, value)
        check_shape(f"{name}: {label}", value, shape, f"n={n} from Qbar, m={m} from Rbar")


@cached_when_eager(theta_precheck)
@full_precision
def best_response(
    problem, theta: Array, beta, P0=None, tol: float = 1e-6, max_iters: int = 50_000
) -> GaussianBestResponse:
    """Proposition 1 for ``problem`` (an :class:`~bchg_jax.lq.cmdp.LQConfigurableMDP`) at theta.

    The follower's best response g^{theta dagger}(b|s) = N(b | -K s, (beta/2) S^{-1}) of
    Eq. (lqr_opt_follower_cmdp), with K = gamma_F S^{-1} B^T P A, S = Rbar + gamma_F B^T P B and
    P = Riccati(A(theta), B(theta), Qbar, Rbar, gamma_F) (Eq. (riccati_equation)), by
    warm-started Riccati iteration; differentiable in theta (implicit function theorem).

    Args:
      problem: the configurable MDP.
      theta: [d] leader parameters.
      beta: the follower's entropy weight (> 0), scalar; validated when concrete.
      P0: [n, n] warm start of the Riccati iteration (default Qbar).
      tol: relative-change stopping tolerance.
      max_iters: maximum number of Riccati iterations.
    Returns:
      :class:`GaussianBestResponse` (``P`` [n, n], ``K`` [m, n], ``cov`` [m, m], ``.sample``,
      ``.log_prob``, ``.mean``, ``.converged``).
    Raises:
      ValueError: a concrete ``beta`` not finite and > 0, a bad scalar setting of
        ``problem`` (a discount outside [0, 1), a bad ``horizon``), or ``A(theta)`` /
        ``B(theta)`` not floating [n, n] / [n, m] (n, m from Qbar, Rbar), or a ``P0`` that
        is not [n, n].
    """
    check_problem_settings(problem)
    check_constants_once(problem)
    check_beta_if_concrete(beta)
    check_theta(problem, theta)
    dt = theta.dtype
    A, B = problem.A_fn(theta), problem.B_fn(theta)
    check_dynamics(problem, theta, A, B)
    if P0 is not None:  # another shape failed as a bare dot_general TypeError
        n = A.shape[0]
        check_shape("P0 (Riccati warm start)", P0, (n, n), f"n={n} from A(theta)")
    return maxent_lqr(
        A,
        B,
        jnp.asarray(problem.Qbar, dt),
        jnp.asarray(problem.Rbar, dt),
        jnp.asarray(problem.U, dt),
        problem.gamma_F,
        jnp.asarray(beta, dt),  # theta's dtype: a float64 beta would widen the covariance
        P0=P0,
        tol=tol,
        max_iters=max_iters,
    )
