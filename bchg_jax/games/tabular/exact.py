"""Exact references for tabular Markov games (the ground truth of the estimator tests).

* :func:`best_response`: the follower's soft-Q fixed point for a leader policy f, solved to
  a tight tolerance and differentiable in f by the implicit function theorem (``custom_root``).
* :func:`leader_return`: the leader's expected return from ``init_dist`` under (f, g) by
  propagating the state distribution of the joint Markov chain: ``horizon`` steps, undiscounted
  or discounted (``gamma``), exactly (no sampling).
* :func:`leader_values`: infinite-horizon V_L(s), Q_L(s, a, b) under (f, g) (linear solve).
"""

from __future__ import annotations

from typing import Optional

import jax
import jax.numpy as jnp

from bchg_jax.core.precision import full_precision
from bchg_jax.core.validate import (
    check_beta_if_concrete,
    check_count,
    check_discount,
    check_if_concrete,
    check_problem_settings,
)
from bchg_jax.games.tabular.follower import (
    GameBestResponse,
    response_from_q,
    soft_q_backup,
    soft_q_iteration,
)
from bchg_jax.games.tabular.game import check_policy_shapes

Array = jax.Array


@full_precision
def best_response(
    game, f: Array, beta, backup: str = "reference", tol: float = 1e-12, max_sweeps: int = 100_000
) -> GameBestResponse:
    """The follower's best response g^{theta dagger} to ``f``, differentiable in ``f`` and beta.

    Soft Q-iteration (:func:`~bchg_jax.games.tabular.follower.soft_q_iteration`, not
    differentiated) to ``tol``, then ``lax.custom_root`` on the soft Bellman fixed point
    ``Q = backup(Q; f, beta)`` attaches the implicit-function-theorem derivative, so gradients
    of quantities built from the response include the follower's reaction to the leader.

    Args:
      game: a :class:`~bchg_jax.games.tabular.game.TabularGame`.
      f: [S, A] leader policy f(a|s).
      beta: the follower's entropy weight (> 0), scalar.
      backup: the soft-Q backup, ``"reference"`` or ``"paper"`` (see
        :mod:`bchg_jax.games.tabular.follower`).
      tol: sup-norm tolerance of the forward iteration.
      max_sweeps: sweep cap of the forward iteration.
    Returns:
      :class:`~bchg_jax.games.tabular.follower.GameBestResponse` (``policy`` g(b|s, a)
      [S, A, B], ``Q`` [S, A, B], ``V`` [S, A]); ``sweeps`` is reported as 0 and ``residual``
      is the fixed-point residual [] at the solution.
    Raises:
      ValueError: a concrete ``beta`` not finite and > 0, a bad scalar setting of ``game`` (a
        discount outside [0, 1), ...), ``f`` not [S, A], or an unknown ``backup``.
    """
    check_problem_settings(game)
    check_beta_if_concrete(beta)
    check_policy_shapes(game, f)
    P = jnp.asarray(game.transition, f.dtype)
    r = jnp.asarray(game.follower_reward, f.dtype)
    sg = jax.lax.stop_gradient
    Q_star = soft_q_iteration(game, sg(f), sg(beta), backup, tol=tol, max_sweeps=max_sweeps).Q

    def F(Q):
        return soft_q_backup(P, r, Q, f, beta, game.gamma_F, backup) - Q

    def tangent_solve(g, y):
        n = y.size
        J = jax.jacfwd(lambda x: g(x.reshape(y.shape)).reshape(-1))(jnp.zeros(n, y.dtype))
        return jnp.linalg.solve(J, y.reshape(-1)).reshape(y.shape)

    Q = jax.lax.custom_root(F, Q_star, lambda _f, x: x, tangent_solve)
    return response_from_q(Q, beta, jnp.asarray(0), jnp.max(jnp.abs(F(Q))))


@full_precision
def joint_chain(game, f: Array, g: Array):
    """(P_pi [S, S], r_pi [S]): state chain and expected leader reward under (f, g).

    Args:
      game: the tabular game. f: [S, A] leader policy. g: [S, A, B] follower policy.
    Returns:
      (P_pi [S, S] state transition matrix, r_pi [S] expected leader reward per state).
    """
    pi = f[:, :, None] * g  # [S, A, B]
    P = jnp.asarray(game.transition, f.dtype)
    rL = jnp.asarray(game.leader_reward, f.dtype)
    return jnp.einsum("sab,sabt->st", pi, P), jnp.sum(pi * rL, axis=(1, 2))


@full_precision
def leader_return(
    game, f: Array, g: Array, horizon: Optional[int] = None, gamma: float = 1.0
) -> Array:
    """sum_{t < horizon} gamma^t E[r_L(s_t, a_t, b_t)] from ``init_dist`` (exact).

    Propagates the state distribution of the joint chain under (f, g); no sampling.

    Args:
      game: a :class:`~bchg_jax.games.tabular.game.TabularGame`.
      f: [S, A] leader policy f(a|s).
      g: [S, A, B] follower policy g(b|s, a).
      horizon: number of steps (default ``game.time_limit``, which must then be set).
      gamma: discount (1.0: undiscounted return, the paper's y-axis).
    Returns:
      [] the expected leader return.
    Raises:
      ValueError: no horizon (``horizon`` and ``game.time_limit`` both None) or one that is not
        a positive integer, a concrete ``gamma`` outside [0, 1], a bad scalar setting of
        ``game``, or ``f`` / ``g`` not shaped by ``game.transition``.
    """
    check_problem_settings(game)
    H = game.time_limit if horizon is None else horizon
    check_count("horizon (or game.time_limit when horizon is None)", H)
    check_if_concrete(check_discount, "gamma", gamma, True)
    check_policy_shapes(game, f, g)
    P_pi, r_pi = joint_chain(game, f, g)

    def body(c, _):
        d, disc, total = c
        return (d @ P_pi, disc * gamma, total + disc * jnp.dot(d, r_pi)), None

    init = (jnp.asarray(game.init_dist, f.dtype), jnp.ones((), f.dtype), jnp.zeros((), f.dtype))
    (_, _, total), _ = jax.lax.scan(body, init, None, length=H)
    return total


@full_precision
def leader_values(game, f: Array, g: Array):
    """Infinite-horizon discounted V_L [S] and Q_L [S, A, B] under (f, g) (linear solve).

    Args:
      game: the tabular game (discount ``gamma_L``).
      f: [S, A] leader policy. g: [S, A, B] follower policy.
    Returns:
      (V_L [S], Q_L [S, A, B]) with Q_L(s, a, b) = r_L(s, a, b) + gamma_L E_{s'} V_L(s').
    Raises:
      ValueError: a bad scalar setting of ``game`` (a discount outside [0, 1), ...) or ``f`` /
        ``g`` not shaped by ``game.transition``.
    """
    check_problem_settings(game)
    check_policy_shapes(game, f, g)
    P_pi, r_pi = joint_chain(game, f, g)
    S = r_pi.shape[0]
    V = jnp.linalg.solve(jnp.eye(S, dtype=f.dtype) - game.gamma_L * P_pi, r_pi)
    P = jnp.asarray(game.transition, f.dtype)
    Q = jnp.asarray(game.leader_reward, f.dtype) + game.gamma_L * jnp.einsum("sabt,t->sab", P, V)
    return V, Q


@full_precision
def leader_objective(game, f: Array, beta, backup: str = "reference") -> Array:
    """J_L(f) = sum_s rho_0(s) V_L(s) under (f, g*(f)), the follower's exact best response:
    infinite-horizon, discounted by gamma_L, differentiable in ``f`` [S, A] (implicit function
    theorem through the soft-Q fixed point, Theorem 2's Bellman equation).

    Eq. (leader-utility-MG) without a regulariser (Phi_L = 0).

    Args:
      game: a :class:`~bchg_jax.games.tabular.game.TabularGame`.
      f: [S, A] leader policy f(a|s).
      beta: the follower's entropy weight (> 0), scalar.
      backup: the follower's soft-Q backup (``"reference"`` or ``"paper"``).
    Returns:
      [] J_L.
    Raises:
      ValueError: as :func:`best_response`.
    """
    check_problem_settings(game)
    check_beta_if_concrete(beta)
    br = best_response(game, f, beta, backup)
    V, _ = leader_values(game, f, br.policy)
    return jnp.dot(jnp.asarray(game.init_dist, f.dtype), V)


@full_precision
def exact_hypergradient(policy_fn, theta, game, beta, backup: str = "reference"):
    """d J_L(policy_fn(theta)) / d theta exactly (autodiff through :func:`leader_objective`).

    The exact hypergradient that Theorem 2's estimate (Eq. (hg_MG),
    :func:`bchg_jax.games.estimators.hypergradient`) is tested against.

    Args:
      policy_fn: theta -> f [S, A] (rows on the simplex).
      theta: the leader's parameters (pytree).
      game: a :class:`~bchg_jax.games.tabular.game.TabularGame`.
      beta: the follower's entropy weight (> 0), scalar.
      backup: the follower's soft-Q backup (``"reference"`` or ``"paper"``).
    Returns:
      a pytree like ``theta``.
    Raises:
      ValueError: a concrete ``beta`` not finite and > 0, a bad scalar setting of ``game``, or
        as :func:`best_response` for ``policy_fn(theta)``.
    """
    check_problem_settings(game)
    check_beta_if_concrete(beta)
    return jax.grad(lambda th: leader_objective(game, policy_fn(th), beta, backup))(theta)
