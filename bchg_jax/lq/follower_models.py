"""A follower that is not at its best response, in a linear-Gaussian configurable MDP.

The ``k_step`` learner of :class:`~bchg_jax.core.follower_model.FollowerModel` in the LQ family:
it keeps its value matrix ``P`` (``V(s) = -s^T P s``) and at iteration i takes K Riccati steps
(soft Bellman backups, Eq. (riccati_equation)'s map) of M_{theta_i} from it: with
``P_{K-1} = riccati_map^{K-1}(P_{i-1})`` it plays the Boltzmann policy of
``Q_K = r_F + gamma_F E V_{P_{K-1}}(s')`` (:func:`~bchg_jax.core.maxent_lqr.response_from_value`)
and keeps ``P_i = riccati_map(P_{K-1})``: the tabular learner's K backups, in closed form.
K -> infinity is Proposition 1's best response.

The ``lag`` follower (:func:`lag_response`) moves its policy the share ``mix`` toward the best
response each iteration, in the policy's parameters: gain ``K_i = (1 - mix) K_{i-1} + mix
K^dagger_i`` and covariance ``cov_i = (1 - mix) cov_{i-1} + mix cov^dagger_i``. (The tabular lag
mixes action probabilities; a mixture of two Gaussians is no Gaussian, so the LQ family mixes
the parameters, which keeps the follower linear-Gaussian: a convex sum of covariances is one.)
It starts from the policy of the value 0 (gain 0, covariance ``(beta / 2) Rbar^-1``), as the
``k_step`` learner does. ``mix = 1`` is the best response.

What the leader knows: it reads the follower's policy (its gain and covariance) and pairs it
with ``V^g``, the entropy-regularised value of that fixed policy on the model
(:func:`observed_follower`: a discounted Lyapunov equation), never the learner's own ``P``.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from bchg_jax.core.eager import cached_when_eager
from bchg_jax.core.maxent_lqr import (
    GaussianBestResponse,
    response_from_value,
    riccati_map,
)
from bchg_jax.core.maxent_lqr import check_value_matrix as check_learner_value
from bchg_jax.core.precision import full_precision
from bchg_jax.core.stability import discounted_lyapunov
from bchg_jax.core.validate import (
    check_beta_if_concrete,
    check_constants_once,
    check_count,
    check_finite_if_concrete,
    check_mix_if_concrete,
    check_theta,
    is_concrete,
)
from bchg_jax.lq.cmdp import LQConfigurableMDP, check_policy_fits
from bchg_jax.lq.follower import check_dynamics

Array = jax.Array


def _model(problem: LQConfigurableMDP, theta: Array):
    check_constants_once(problem)  # the costs and U: named here, not a finite wrong value
    dt = theta.dtype
    A, B = problem.A_fn(theta), problem.B_fn(theta)
    check_dynamics(problem, theta, A, B)  # a matmul error deep inside before, or int B taken
    Qbar, Rbar, U = (jnp.asarray(x, dt) for x in (problem.Qbar, problem.Rbar, problem.U))
    return A, B, Qbar, Rbar, U


def check_model_at(problem: LQConfigurableMDP, theta: Array) -> None:
    """The eager checks of the follower's model at a concrete ``theta``: ``A(theta)``,
    ``B(theta)`` as :func:`~bchg_jax.lq.follower.check_dynamics` and finite (a NaN ``A`` gave
    the K-step reference a NaN gradient and no error).

    Raises:
      ValueError: naming the piece and the problem.
    """
    check_theta(problem, theta)
    if not is_concrete(theta):
        return
    A, B = problem.A_fn(theta), problem.B_fn(theta)
    check_dynamics(problem, theta, A, B)
    for label, value in (("A(theta)", A), ("B(theta)", B)):
        check_finite_if_concrete(f"{problem.name}: {label}", value)


def check_value_matrix(problem: LQConfigurableMDP, P_prev) -> None:
    """A learner's value matrix ``P_prev`` (``V(s) = -s^T P s``):
    :func:`~bchg_jax.core.maxent_lqr.check_value_matrix` with the problem's n.

    Raises:
      ValueError: another shape, a non-finite entry, an asymmetric or indefinite matrix.
    """
    check_learner_value(problem.name, P_prev, problem.state_dim)


def _k_step_checks(problem, theta, beta, P_prev, K) -> None:
    """:func:`k_step_response`'s checks (an eager call's precheck: inside its cached program
    theta and ``P_prev`` are traced)."""
    check_count("K (Riccati steps)", K)
    check_beta_if_concrete(beta)
    check_value_matrix(problem, P_prev)
    check_model_at(problem, theta)


@cached_when_eager(_k_step_checks)
def k_step_response(problem: LQConfigurableMDP, theta: Array, beta, P_prev: Array, K: int):
    """(the policy played, the learner's next value matrix) after K Riccati steps from ``P_prev``.

    Returns:
      (:class:`~bchg_jax.core.maxent_lqr.GaussianBestResponse` of ``P_{K-1}``, ``P_K`` [n, n]).
    Raises:
      ValueError: ``K`` not an integer >= 1 (0 would silently take one step), a concrete
        ``beta`` not finite and > 0, a bad ``P_prev`` (:func:`check_value_matrix`; a wider
        dtype than theta's is taken in theta's), or a bad ``A(theta)`` / ``B(theta)``
        (:func:`check_model_at`).
    """
    _k_step_checks(problem, theta, beta, P_prev, K)
    A, B, Qbar, Rbar, U = _model(problem, theta)
    step = lambda _, P: riccati_map(P, A, B, Qbar, Rbar, problem.gamma_F)  # noqa: E731
    # in theta's dtype, as the tabular learner's V_prev: a float64 P_prev (jnp.eye under x64)
    # of a float32 problem broke the reference's scan with a carry-type TypeError
    P = jax.lax.fori_loop(0, K - 1, step, jnp.asarray(P_prev, theta.dtype))
    played = response_from_value(P, A, B, Rbar, U, problem.gamma_F, beta)
    return played, riccati_map(P, A, B, Qbar, Rbar, problem.gamma_F)


def first_policy(problem: LQConfigurableMDP, beta, dtype) -> GaussianBestResponse:
    """The policy of a follower that knows nothing yet (the value 0): gain 0, covariance
    ``(beta / 2) Rbar^-1`` (:func:`~bchg_jax.core.maxent_lqr.response_from_value` at ``P = 0``;
    the ``k_step`` learner's first policy and the ``lag`` follower's start)."""
    n = problem.state_dim
    A = jnp.zeros((n, n), dtype)  # with P = 0 the policy reads neither A nor B
    B = jnp.zeros((n, problem.action_dim), dtype)
    Rbar, U = (jnp.asarray(x, dtype) for x in (problem.Rbar, problem.U))
    zero = jnp.zeros((n, n), dtype)
    return response_from_value(zero, A, B, Rbar, U, problem.gamma_F, jnp.asarray(beta, dtype))


@full_precision
def lag_response(
    best: GaussianBestResponse, previous: GaussianBestResponse, mix, beta
) -> GaussianBestResponse:
    """The ``lag`` follower's policy (module docstring): ``previous``'s gain and covariance moved
    the share ``mix`` toward ``best``'s (the best response at this theta).

    Args:
      best: the best response g^{theta dagger} (Proposition 1).
      previous: the policy played at the previous iteration (its ``K`` and ``cov`` are read).
      mix: the weight of the best response, in (0, 1] (1: the best response).
      beta: the follower's entropy weight (the covariance's ``S = (beta / 2) cov^-1``).
    Returns:
      a :class:`~bchg_jax.core.maxent_lqr.GaussianBestResponse` with the mixed ``K``, ``K_w``,
      ``cov`` (and its ``chol``, ``S``); ``P``, ``v``, ``M`` and ``info`` are ``best``'s (the
      trainer pairs the policy with its own value, :func:`observed_follower`).
    Raises:
      ValueError: a ``mix`` that is not a scalar, or a concrete one outside (0, 1] (past 1 the
        covariance is no covariance).
    """
    check_mix_if_concrete(mix)
    dt = best.K.dtype
    mix = jnp.asarray(mix, dt)
    mixed = lambda old, new: (1.0 - mix) * jnp.asarray(old, dt) + mix * new  # noqa: E731
    cov = mixed(previous.cov, best.cov)
    cov = 0.5 * (cov + cov.T)
    return best._replace(
        K=mixed(previous.K, best.K),
        K_w=mixed(previous.K_w, best.K_w),
        cov=cov,
        chol=jnp.linalg.cholesky(cov),
        S=0.5 * jnp.asarray(beta, dt) * jnp.linalg.inv(cov),
    )


def _policy_value_checks(problem, theta, policy, beta) -> None:
    """:func:`policy_value`'s checks (an eager call's precheck; the plain call's beta check too:
    under ``jax.disable_jit()`` it took beta -1)."""
    check_beta_if_concrete(beta)
    check_model_at(problem, theta)
    check_policy_fits(problem, policy)


@cached_when_eager(_policy_value_checks)
@full_precision
def policy_value(problem: LQConfigurableMDP, theta: Array, policy: GaussianBestResponse, beta):
    """(P_g, c_g): ``V^g(s) = -(s^T P_g s + c_g)`` of the fixed policy ``N(-K s, cov)``.

    ``P_g = Qbar + K^T Rbar K + gamma F^T P_g F`` with ``F = A - B K``, and
    ``(1 - gamma) c_g = tr(Rbar cov) - beta H(cov) + gamma tr(B^T P_g B cov) + gamma tr(U^T P_g U)``
    (H: the Gaussian entropy); at the best response they are Proposition 1's ``P`` and ``v``.
    NaN when the policy's closed loop diverges under gamma_F
    (:func:`~bchg_jax.core.stability.discounted_lyapunov`): the trainer flags and skips that
    iteration.

    Raises:
      ValueError: a concrete ``beta`` not finite and > 0, a ``policy`` that does not fit the
        problem, or (concrete) whose gain is not finite or whose covariance is not finite,
        symmetric and positive definite
        (:func:`~bchg_jax.lq.cmdp.check_policy_fits`), or a bad ``A(theta)`` / ``B(theta)``
        (:func:`check_model_at`).
    """
    _policy_value_checks(problem, theta, policy, beta)  # a covariance that is none: named
    A, B, Qbar, Rbar, U = _model(problem, theta)
    g, m = problem.gamma_F, policy.K.shape[0]
    F = A - B @ policy.K
    P = discounted_lyapunov(F.T, Qbar + policy.K.T @ Rbar @ policy.K, g)
    entropy = 0.5 * (m * np.log(2 * np.pi * np.e) + jnp.linalg.slogdet(policy.cov)[1])
    c = (
        jnp.trace(Rbar @ policy.cov)
        - beta * entropy
        + g * jnp.trace(B.T @ P @ B @ policy.cov)
        + g * jnp.trace(U.T @ P @ U)
    ) / (1.0 - g)
    return P, c


@full_precision
def observed_follower(problem: LQConfigurableMDP, theta: Array, policy: GaussianBestResponse, beta):
    """What the estimators get of a follower playing ``policy``: its gain and covariance with
    the value ``V^g`` (``P``, ``v`` replaced by :func:`policy_value`'s), so ``soft_value`` and
    ``soft_q`` of the result are ``V^g`` and ``Q^g``."""
    P, c = policy_value(problem, theta, policy, beta)
    return policy._replace(P=P, v=c)


def gain_gap(policy: GaussianBestResponse, best: GaussianBestResponse) -> Array:
    """max |K - K^dagger|: how far the follower's gain is from the best response's."""
    return jnp.max(jnp.abs(policy.K - best.K))
