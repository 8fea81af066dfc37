"""Exact references for a follower off its best response in the bi-level LQR game (the game's
analogue of :mod:`bchg_jax.lq.follower_references`).

* :func:`as_if_optimal_hypergradient`: Theorem 2's hypergradient at the follower's current
  Gaussian policy g as if it were optimal: ``d/dtheta J_L(theta, g_theta)`` with
  ``g_theta(b|s, a) ~ g(b|s, a) exp((Q^g_theta - sg(Q^g_theta))(s, a, b) / beta)``, ``Q^g_theta``
  the soft Q of the fixed g against the leader f_theta. For any Gaussian
  ``g = N(-K_s s - K_a a, cov)``, ``E_{a ~ f} V^g(s, a) = -(s^T P_g s + c)`` with
  ``P_g = Qbar + L^T Rbar L + gamma_F F^T P_g F`` (``L = K_s + K_a K``,
  ``F = A + C K - B L``), so ``Q^g(s, a, b) = -b^T H_bb b - 2 b^T H_bx x + (terms free of b)``
  with ``x = A s + C a``, ``H_bb = Rbar + gamma_F B^T P_g B``, ``H_bx = gamma_F B^T P_g``: the
  tilt keeps g Gaussian, with ``dH = H_theta - sg(H_theta)``, precision
  ``cov^-1 + (2/beta) dH_bb`` and gains ``cov_theta (cov^-1 K_s + (2/beta) dH_bx A)``,
  ``cov_theta (cov^-1 K_a + (2/beta) dH_bx C)``: equal to g, with the Boltzmann derivative.
  Sampled under g with ``V^g``, Theorem 2's estimator is unbiased for this gradient (tested).
* :func:`k_step_hypergradient`: ``d/dtheta J_L(theta, g_K(theta))`` through the learner's K
  Riccati steps from ``P_prev`` (held fixed), unrolled
  (:func:`~bchg_jax.games.lqr.follower_models.k_step_response`).

Both equal :func:`~bchg_jax.games.lqr.exact.exact_hypergradient` at the best response (tested).
The objective is that of ``exact_hypergradient``: the discounted ``horizon``-step leader return
(default ``game.horizon`` steps, ``game.gamma_L``).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from bchg_jax.core.eager import cached_when_eager
from bchg_jax.core.maxent_lqr import held_policy
from bchg_jax.core.precision import full_precision
from bchg_jax.core.stability import discounted_lyapunov
from bchg_jax.core.validate import (
    check_beta_if_concrete,
    check_constants_once,
    check_count,
    check_problem_settings,
)
from bchg_jax.games.lqr.exact import leader_objective
from bchg_jax.games.lqr.follower import GameResponse
from bchg_jax.games.lqr.follower_models import (
    check_response_fits,
    check_value_matrix,
    k_step_response,
)
from bchg_jax.games.lqr.game import LQRGame, check_game_theta, leader_gain

Array = jax.Array


@full_precision
def fixed_policy_value(game: LQRGame, theta: Array, resp: GameResponse) -> Array:
    """P_g [n, n]: ``E_{a ~ f_theta} V^g(s, a) = -(s^T P_g s + const)`` for the fixed follower
    policy ``N(-K_s s - K_a a, cov)`` of ``resp`` (module docstring; NaN when its closed loop
    diverges under gamma_F). Equal to ``resp.P`` for a best response and for
    :func:`~bchg_jax.games.lqr.follower_models.policy_view`'s (tested)."""
    dt = theta.dtype
    A, B, C, Q, R = game.arrays(dt)
    K = leader_gain(game, theta)
    L = resp.K_s + resp.K_a @ K
    F = A + C @ K - B @ L
    return discounted_lyapunov(F.T, Q + L.T @ R @ L, game.gamma_F)


def _common_checks(game, theta, beta) -> None:
    check_problem_settings(game)
    check_constants_once(game)
    check_game_theta(game, theta)
    check_beta_if_concrete(beta)


def _as_if_optimal_checks(game, theta, resp, beta, **_) -> None:
    """:func:`as_if_optimal_hypergradient`'s checks (an eager call's precheck)."""
    _common_checks(game, theta, beta)
    check_response_fits(game, resp)


def _objective_kw(horizon, gamma, stochastic, game):
    g = game.gamma_L if gamma is None else gamma
    return dict(horizon=horizon, gamma=g, stochastic=stochastic)


@cached_when_eager(_as_if_optimal_checks)
@full_precision
def as_if_optimal_hypergradient(
    game: LQRGame,
    theta: Array,
    resp: GameResponse,
    beta,
    *,
    horizon: int | None = None,
    gamma=None,
    stochastic: bool = True,
) -> Array:
    """Theorem 2's hypergradient at the follower's current policy ``resp`` (gains ``K_s``,
    ``K_a``, ``cov``) as if it were optimal (module docstring).

    Args:
      game: the LQR game. theta: [k * n] leader parameters.
      resp: the follower's policy (a :class:`~bchg_jax.games.lqr.follower.GameResponse`: only
        its gains and covariance are read).
      beta: the follower's entropy weight (> 0).
      horizon, gamma: the leader objective's steps and discount (default ``game.horizon``,
        ``game.gamma_L``), as :func:`~bchg_jax.games.lqr.exact.exact_hypergradient`.
      stochastic: the Gaussian leader (False: deterministic).
    Returns:
      [k * n] the gradient (NaN when the policy's closed loop diverges under gamma_F).
    Raises:
      ValueError: ``theta`` not one finite floating [k * n] array, a concrete ``beta`` not
        finite and > 0, a bad setting of ``game``, or a ``resp`` that does not fit the game
        (:func:`~bchg_jax.games.lqr.follower_models.check_response_fits`).
    """
    _as_if_optimal_checks(game, theta, resp, beta)
    dt = theta.dtype
    g = held_policy(resp, dt)
    beta = jnp.asarray(beta, dt)
    prec = jnp.linalg.inv(g.cov)
    kw = _objective_kw(horizon, gamma, stochastic, game)

    def objective(th):
        A, B, C, _, R = game.arrays(dt)
        P = fixed_policy_value(game, th, g)
        H_bb, H_bx = R + game.gamma_F * B.T @ P @ B, game.gamma_F * B.T @ P
        d_bb, d_bx = H_bb - jax.lax.stop_gradient(H_bb), H_bx - jax.lax.stop_gradient(H_bx)
        cov = jnp.linalg.inv(prec + (2.0 / beta) * d_bb)
        cov = 0.5 * (cov + cov.T)
        K_s = cov @ (prec @ g.K_s + (2.0 / beta) * d_bx @ A)
        K_a = cov @ (prec @ g.K_a + (2.0 / beta) * d_bx @ C)
        moved = g._replace(K_s=K_s, K_a=K_a, cov=cov, chol=jnp.linalg.cholesky(cov))
        return leader_objective(game, th, beta, resp=moved, **kw)

    return jax.grad(objective)(theta)


def _k_step_checks(game, theta, P_prev, beta, K, **_) -> None:
    """:func:`k_step_hypergradient`'s checks (an eager call's precheck)."""
    if np.ndim(beta) == 2 and np.ndim(P_prev) == 0:
        raise ValueError(
            "games.lqr.k_step_hypergradient takes (game, theta, P_prev, beta, K), the order of "
            "the other families' k_step_hypergradient (beta came before P_prev until "
            "2026-12-07); got a matrix for beta and a scalar for P_prev"
        )
    _common_checks(game, theta, beta)
    check_count("K (Riccati steps)", K)
    check_value_matrix(game, P_prev)


@cached_when_eager(_k_step_checks)
@full_precision
def k_step_hypergradient(
    game: LQRGame,
    theta: Array,
    P_prev: Array,
    beta,
    K: int,
    *,
    horizon: int | None = None,
    gamma=None,
    stochastic: bool = True,
) -> Array:
    """d/dtheta J_L(theta, g_K(theta)), g_K the K-step learner's policy from ``P_prev`` [n, n]
    (held fixed; module docstring).

    The arguments come in the order of the other families' ``k_step_hypergradient``
    (``lq``, ``tabular``: the learner's previous values, then beta; until 2026-12-07 this one
    took beta first, and the swapped call is named).

    Args:
      game, theta, beta, horizon, gamma, stochastic: as :func:`as_if_optimal_hypergradient`.
      P_prev: [n, n] the learner's value matrix before its reaction. K: its Riccati steps.
    Returns:
      [k * n] the gradient (NaN when the learner's policy diverges under gamma_F).
    Raises:
      ValueError: as :func:`as_if_optimal_hypergradient`, ``K`` not an integer >= 1, or a bad
        ``P_prev`` (:func:`~bchg_jax.games.lqr.follower_models.check_value_matrix`).
    """
    _k_step_checks(game, theta, P_prev, beta, K)
    kw = _objective_kw(horizon, gamma, stochastic, game)

    def objective(th):
        played, _ = k_step_response(game, th, beta, P_prev, K, stochastic=stochastic)
        return leader_objective(game, th, beta, resp=played, **kw)

    return jax.grad(objective)(theta)
