"""A follower that is not at its best response, in the bi-level LQR Markov game.

The ``k_step`` learner of :class:`~bchg_jax.core.follower_model.FollowerModel` in this family,
the game's version of the LQ CMDP's (:mod:`bchg_jax.lq.follower_models`). Against the leader
``a = K s + w`` the follower faces an LQR on ``(A + C K, B)`` with the observable disturbance
``C w`` (:mod:`bchg_jax.games.lqr.follower`). The learner keeps a value matrix ``P``
(``E_a V(s, a) = -s^T P s``) and at iteration i takes K Riccati steps of that LQR at theta_i
from it: with ``P_{K-1} = riccati_map^{K-1}(P_{i-1})`` on ``(A + C K_theta, B)`` it plays the
Boltzmann policy of ``Q_K = r_F + gamma_F E V_{P_{K-1}}(s')``,
``g(b|s, a) = N(-K_w (A s + C a), (beta/2) S^{-1})`` with ``S = Rbar + gamma_F B^T P_{K-1} B``
and ``K_w = gamma_F S^{-1} B^T P_{K-1}`` (Proposition 2's form at an iterate), and keeps
``P_i = riccati_map(P_{K-1})``. K -> infinity is Proposition 2's best response.

What the leader knows: it reads the follower's policy (its gains and covariance) and pairs it
with ``V^g``, the entropy-regularised value of that *fixed* policy against its own leader
(:func:`policy_view`), never the learner's ``P``. For a policy of this form, with
``x = A s + C a`` and ``G = I - B K_w``,

* ``V^g(s, a) = -(s^T Qbar s + x^T M_g x + v_g)``,
  ``M_g = K_w^T Rbar K_w + gamma_F G^T P_g G``;
* ``E_{a ~ f} V^g(s, a) = -(s^T P_g s + c_next + v_g)``, ``c_next = tr((C U)^T M_g C U)``;
* ``P_g = Qbar + (A + C K)^T M_g (A + C K)``: a discounted Lyapunov equation in ``P_g``
  (:func:`~bchg_jax.core.stability.discounted_lyapunov`), and
  ``(1 - gamma_F) v_g = tr(Rbar cov) - beta H(cov) + gamma_F tr(B^T P_g B cov) + gamma_F c_next``
  (H: the Gaussian entropy).

At the best response these are Proposition 2's ``P``, ``M``, ``v`` and ``c_next`` (tested), so
the estimators (which read a :class:`~bchg_jax.games.lqr.follower.GameResponse`'s ``P``, ``M``,
``v``, ``c_next``) take ``V^g`` and ``Q^g`` without a change.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from bchg_jax.core.eager import cached_when_eager
from bchg_jax.core.maxent_lqr import RiccatiInfo, response_from_value, riccati_map
from bchg_jax.core.maxent_lqr import check_value_matrix as check_learner_value
from bchg_jax.core.precision import full_precision
from bchg_jax.core.stability import discounted_lyapunov
from bchg_jax.core.validate import (
    check_beta_if_concrete,
    check_constants_once,
    check_count,
    check_finite_if_concrete,
    check_problem_settings,
    check_shape,
    is_concrete,
)
from bchg_jax.games.lqr.follower import GameResponse
from bchg_jax.games.lqr.game import LQRGame, check_game_theta, leader_gain

Array = jax.Array


class LearnerResponse(NamedTuple):
    """A K-step learner's play, what the leader sees of it, and its memory (the whole tuple is
    :attr:`~bchg_jax.games.actor_critic.LeaderState.follower` in the trainer).

    Attributes:
      played: the :class:`~bchg_jax.games.lqr.follower.GameResponse` the follower plays, its
        value fields (``P``, ``M``, ``v``, ``c_next``) those of ``V^g`` (:func:`policy_view`);
        its ``info`` is the best response's solve (``converged``: that solve met its
        tolerance).
      own: [n, n] the learner's value matrix after this reaction (where the next one starts).
      best: the best response ``g^dagger(theta)`` (the next solve's warm start, the gap).
      gap: [] ``max |K_s - K_s^dagger|, |K_a - K_a^dagger|``: how far the follower's gains are
        from the best response's.
    """

    played: GameResponse
    own: Array
    best: GameResponse
    gap: Array


def _arrays(game: LQRGame, theta: Array, stochastic: bool):
    """(A, B, C, Qbar, Rbar, A + C K_theta, C U or 0) in theta's dtype."""
    dt = theta.dtype
    A, B, C, Q, R = game.arrays(dt)
    CU = C @ jnp.asarray(game.U, dt) * (1.0 if stochastic else 0.0)
    return A, B, C, Q, R, A + C @ leader_gain(game, theta), CU


@full_precision
def policy_view(
    game: LQRGame, theta: Array, K_w: Array, cov: Array, beta, stochastic: bool = True
) -> GameResponse:
    """The follower policy ``N(-K_w (A s + C a), cov)`` with the value ``V^g`` of that fixed
    policy against the leader at theta (module docstring): what the estimators get of it.

    Args:
      game: the LQR game. theta: [k * n] leader parameters.
      K_w: [m, n] the gain on ``x = A s + C a``. cov: [m, m] the action covariance (positive
        definite).
      beta: the follower's entropy weight. stochastic: the Gaussian leader (False: U = 0).
    Returns:
      a :class:`~bchg_jax.games.lqr.follower.GameResponse` (``K_s = K_w A``, ``K_a = K_w C``;
      ``info`` records no iteration, ``converged`` when ``V^g`` is finite). NaN values when the
      policy's closed loop ``(I - B K_w)(A + C K)`` diverges under gamma_F.
    """
    A, B, C, Q, R, Acl, CU = _arrays(game, theta, stochastic)
    g, m = game.gamma_F, cov.shape[0]
    G = jnp.eye(A.shape[0], dtype=A.dtype) - B @ K_w
    L = K_w @ Acl
    P = discounted_lyapunov((G @ Acl).T, Q + L.T @ R @ L, g)
    M = K_w.T @ R @ K_w + g * G.T @ P @ G
    M = 0.5 * (M + M.T)
    c_next = jnp.trace(CU.T @ M @ CU)
    entropy = 0.5 * (m * np.log(2 * np.pi * np.e) + jnp.linalg.slogdet(cov)[1])
    v = (jnp.trace(R @ cov) - beta * entropy + g * jnp.trace(B.T @ P @ B @ cov) + g * c_next) / (
        1.0 - g
    )
    zero = jnp.zeros((), A.dtype)
    no = jnp.zeros((), bool)
    ok = jnp.isfinite(jnp.sum(P)) & jnp.isfinite(v)
    info = RiccatiInfo(jnp.zeros((), jnp.int32), zero, ok, no, no, no, zero)
    chol = jnp.linalg.cholesky(cov)
    return GameResponse(K_w @ A, K_w @ C, cov, chol, P, M, v, c_next, info)


def check_value_matrix(game: LQRGame, P_prev) -> None:
    """A learner's value matrix ``P_prev`` (``E_a V(s, a) = -s^T P s``):
    :func:`~bchg_jax.core.maxent_lqr.check_value_matrix` with the game's n.

    Raises:
      ValueError: another shape, a non-finite entry, an asymmetric or indefinite matrix.
    """
    check_learner_value(game.name, P_prev, game.state_dim, "E_a V(s, a) = -s^T P s")


def _k_step_checks(game, theta, beta, P_prev, K, **_) -> None:
    """:func:`k_step_response`'s checks (an eager call's precheck: inside its cached program
    theta and ``P_prev`` are traced)."""
    check_problem_settings(game)
    check_constants_once(game)
    check_count("K (Riccati steps)", K)
    check_beta_if_concrete(beta)
    check_game_theta(game, theta)
    check_value_matrix(game, P_prev)


@cached_when_eager(_k_step_checks)
@full_precision
def k_step_response(
    game: LQRGame, theta: Array, beta, P_prev: Array, K: int, *, stochastic: bool = True
):
    """(the policy played, the learner's next value matrix) after K Riccati steps of the game's
    follower LQR at theta from ``P_prev`` (module docstring).

    Args:
      game: the LQR game. theta: [k * n] leader parameters. beta: the entropy weight.
      P_prev: [n, n] the learner's value matrix (taken in theta's dtype).
      K: Riccati steps, an integer >= 1. stochastic: the Gaussian leader (False: U = 0).
    Returns:
      (:class:`~bchg_jax.games.lqr.follower.GameResponse` of ``P_{K-1}`` with ``V^g``
      (:func:`policy_view`), ``P_K`` [n, n]).
    Raises:
      ValueError: ``K`` not an integer >= 1, a concrete ``beta`` not finite and > 0, ``theta``
        not one floating [k * n] array, a bad ``P_prev`` (:func:`check_value_matrix`), or a bad
        setting of ``game``.
    """
    _k_step_checks(game, theta, beta, P_prev, K)
    _, B, _, Q, R, Acl, CU = _arrays(game, theta, stochastic)
    g = game.gamma_F
    step = lambda _, P: riccati_map(P, Acl, B, Q, R, g)  # noqa: E731
    P = jax.lax.fori_loop(0, K - 1, step, jnp.asarray(P_prev, theta.dtype))
    beta = jnp.asarray(beta, theta.dtype)
    br = response_from_value(P, Acl, B, R, CU, g, beta, observable=True)
    played = policy_view(game, theta, br.K_w, br.cov, beta, stochastic)
    return played, riccati_map(P, Acl, B, Q, R, g)


def gain_gap(played: GameResponse, best: GameResponse) -> Array:
    """max |K_s - K_s^dagger|, |K_a - K_a^dagger|: how far the follower's gains are from the
    best response's."""
    return jnp.maximum(
        jnp.max(jnp.abs(played.K_s - best.K_s)), jnp.max(jnp.abs(played.K_a - best.K_a))
    )


def check_response_fits(game: LQRGame, resp: GameResponse) -> None:
    """A follower policy given to the references: a :class:`GameResponse` whose ``K_s`` is
    [m, n], ``K_a`` [m, k] and ``cov`` [m, m] (static, so traced values too) and, when concrete,
    finite gains and a finite, symmetric, positive-definite covariance.

    Raises:
      ValueError: naming the piece and the game.
    """
    if not isinstance(resp, GameResponse):
        raise ValueError(
            f"{game.name}: the follower's policy must be a GameResponse (best_response, "
            f"k_step_response), got {type(resp).__name__}"
        )
    n, k, m = game.state_dim, game.leader_dim, game.follower_dim
    where = f"n={n}, k={k}, m={m} from {game.name}"
    for label, x, shape in (("K_s", resp.K_s, (m, n)), ("K_a", resp.K_a, (m, k))):
        check_shape(label, x, shape, where)
        check_finite_if_concrete(f"{game.name}: the follower's {label}", x)
    check_shape("cov", resp.cov, (m, m), where)
    if is_concrete(resp.cov):
        c = np.asarray(resp.cov, np.float64)
        ok = np.all(np.isfinite(c)) and np.allclose(c, c.T)
        if not ok or np.linalg.eigvalsh(c)[0] <= 0:
            raise ValueError(
                f"{game.name}: the follower's cov must be finite, symmetric and positive "
                f"definite, got {c.tolist()}"
            )
