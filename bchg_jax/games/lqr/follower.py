"""The follower of the bi-level LQR game: Proposition 2 with an observable disturbance
(Eq. (lqr_opt_follower_mg)).

The follower observes the leader's action ``a`` before acting. Writing ``a = K s + w`` with
``w ~ N(0, U U^T)``, the game is an LQR with dynamics ``A + C K`` and an observable disturbance
``C w``, so the best response is Proposition 2 (:func:`best_response`):
``g(b|s, a) = N(-K_s s - K_a a, (beta/2) S^{-1})``, ``K_s = gamma S^{-1} B^T P A``,
``K_a = gamma S^{-1} B^T P C``, ``P = Riccati(A + C K, B, Qbar, Rbar, gamma_F)``;
``V_F(s, a) = -(s^T Qbar s + (A s + C a)^T M (A s + C a) + v_w)`` and
``Q_F(s, a, b) = r_F + gamma E_{a' ~ f} V_F(s', a')`` (:func:`follower_value`,
:func:`follower_q`). For the deterministic leader ``U = 0``.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp

from bchg_jax.core.eager import cached_when_eager
from bchg_jax.core.maxent_lqr import (
    GaussianBestResponse,
    RiccatiInfo,
    gaussian_log_density,
    maxent_lqr_observable,
)
from bchg_jax.core.maxent_lqr import quad_form as _quad
from bchg_jax.core.precision import full_precision
from bchg_jax.core.validate import (
    check_beta_if_concrete,
    check_constants_once,
    check_problem_settings,
)
from bchg_jax.games.lqr.game import (
    LQRGame,
    check_game_theta,
    follower_reward,
    leader_gain,
    transition,
)

Array = jax.Array


class GameResponse(NamedTuple):
    """Proposition 2's best response to the leader gain K, in the game's (s, a) coordinates.

    g(b|s, a) = N(b | -K_s s - K_a a, cov) (Eq. (lqr_opt_follower_mg) with ``w = C (a - K s)``).

    Attributes:
      K_s: [m, n] state gain gamma S^{-1} B^T P A.
      K_a: [m, k] leader-action gain gamma S^{-1} B^T P C.
      cov: [m, m] action covariance (beta/2) S^{-1}.
      chol: [m, m] lower Cholesky factor of ``cov``.
      P: [n, n] Riccati solution on A + C K.
      M: [n, n] gamma P - gamma^2 P B S^{-1} B^T P.
      v: [] constant of -V_F(s, a) (v_w of Proposition 2 with disturbance C U).
      c_next: [] tr((C U)^T M (C U)), E_a' of the leader's noise term in -V_F(s', a').
      info: :class:`~bchg_jax.core.maxent_lqr.RiccatiInfo` of the Riccati iteration.
    """

    K_s: Array  # [m, n]  gamma S^{-1} B^T P A
    K_a: Array  # [m, k]  gamma S^{-1} B^T P C
    cov: Array  # (beta/2) S^{-1}
    chol: Array
    P: Array  # Riccati solution on A + C K
    M: Array  # gamma P - gamma^2 P B S^{-1} B^T P
    v: Array  # constant of -V_F(s, a) (v_w of Proposition 2 with disturbance C U)
    c_next: Array  # tr((C U)^T M (C U)): E_a' of the leader's noise term in -V_F(s', a')
    info: RiccatiInfo

    @property
    def converged(self):
        """[] bool: whether the Riccati iteration converged."""
        return self.info.converged

    @full_precision
    def mean(self, s: Array, a: Array) -> Array:
        """-K_s s - K_a a for ``s`` [..., n], ``a`` [..., k] -> [..., m]."""
        return -(s @ self.K_s.T + a @ self.K_a.T)

    @full_precision
    def sample(self, key: Array, s: Array, a: Array) -> Array:
        """b ~ g(.|s, a) for ``s`` [..., n], ``a`` [..., k] -> [..., m]."""
        eps = jax.random.normal(key, s.shape[:-1] + (self.K_s.shape[0],), s.dtype)
        return self.mean(s, a) + eps @ self.chol.T

    @full_precision
    def log_prob(self, s: Array, a: Array, b: Array) -> Array:
        """log g(b|s, a) for ``s`` [..., n], ``a`` [..., k], ``b`` [..., m] -> [...]."""
        return gaussian_log_density(self.chol, b - self.mean(s, a))


def _check_response_args(game: LQRGame, theta, beta, *_, **__) -> None:
    """The checks of :func:`best_response` (eagerly before a cached call: theta finite)."""
    check_problem_settings(game)
    check_constants_once(game)
    check_beta_if_concrete(beta)
    check_game_theta(game, theta)


# an unconverged solve is returned flagged, as by the plain call: no recomputation
@cached_when_eager(_check_response_args, recheck=False)
@full_precision
def best_response(
    game: LQRGame,
    theta: Array,
    beta,
    *,
    stochastic: bool = True,
    P0=None,
    tol: float = 1e-6,
    max_iters: int = 50_000,
) -> GameResponse:
    """Proposition 2 on ``(A + C K_theta, B)`` with the observable disturbance ``C (a - K s)``.

    The follower's best response g^{theta dagger}(b|s, a) = N(-K_s s - K_a a, (beta/2) S^{-1})
    (Eq. (lqr_opt_follower_mg)), P = Riccati(A + C K_theta, B, Qbar, Rbar, gamma_F)
    (Eq. (riccati_equation)) by warm-started Riccati iteration.
    ``stochastic=False``: the deterministic leader (no leader noise: U = 0). Differentiable in
    theta (implicit differentiation through the Riccati solution); check ``.converged``.

    Args:
      game: the :class:`~bchg_jax.games.lqr.game.LQRGame`.
      theta: [k * n] leader parameters.
      beta: the follower's entropy weight (> 0), scalar.
      stochastic: Gaussian leader (True) or deterministic leader (False).
      P0: optional [n, n] warm start of the Riccati iteration.
      tol: relative-change stopping tolerance.
      max_iters: maximum number of Riccati iterations.
    Returns:
      :class:`GameResponse`.
    Raises:
      ValueError: a concrete ``beta`` not finite and > 0, a bad scalar setting of ``game`` (a
        discount outside [0, 1), a bad ``horizon``), or ``theta`` not one floating array
        [k * n] (a Python list is refused by name).
    """
    _check_response_args(game, theta, beta)
    dt = theta.dtype
    A, B, C, Q, R = game.arrays(dt)
    K = leader_gain(game, theta)
    CU = C @ jnp.asarray(game.U, dt) * (1.0 if stochastic else 0.0)
    br: GaussianBestResponse = maxent_lqr_observable(
        A + C @ K,
        B,
        Q,
        R,
        CU,
        game.gamma_F,
        jnp.asarray(beta, dt),  # theta's dtype: a float64 beta would widen the covariance
        P0=P0,
        tol=tol,
        max_iters=max_iters,
    )
    return GameResponse(
        br.K_w @ A,
        br.K_w @ C,
        br.cov,
        br.chol,
        br.P,
        br.M,
        br.v,
        jnp.trace(CU.T @ br.M @ CU),
        br.info,
    )


@full_precision
def follower_value(game: LQRGame, resp: GameResponse, s: Array, a: Array) -> Array:
    """V_F(s, a) = -(s^T Qbar s + (A s + C a)^T M (A s + C a) + v_w) (Proposition 2).

    The follower's soft value V_F^{theta dagger}(s, a) weighting the score terms of
    Eq. (nablaQF_MG).

    Args:
      game: the LQR game.
      resp: the follower's :class:`GameResponse`.
      s: [..., n] states.
      a: [..., k] leader actions.
    Returns:
      [...] values.
    """
    A, C, Q = (jnp.asarray(x, s.dtype) for x in (game.A, game.C, game.Qbar))
    x = s @ A.T + a @ C.T
    return -(_quad(Q, s) + _quad(resp.M, x) + resp.v)


@full_precision
def follower_state_value(game: LQRGame, resp: GameResponse, theta: Array, s: Array) -> Array:
    """E_{a ~ f_theta(.|s)} V_F(s, a) = -(s^T P s + tr((CU)^T M CU) + v_w) (closed form).

    A state-only baseline of the influence sums (unbiased).

    Args:
      game: the LQR game.
      resp: the follower's :class:`GameResponse` (computed for this theta).
      theta: [k * n] leader parameters (unused: ``resp`` already encodes them).
      s: [..., n] states.
    Returns:
      [...] values.
    """
    return -(_quad(resp.P, s) + resp.c_next + resp.v)


@full_precision
def follower_q(
    game: LQRGame, resp: GameResponse, theta: Array, s: Array, a: Array, b: Array
) -> Array:
    """Q_F(s, a, b) = r_F(s, b) + gamma_F E_{a' ~ f} V_F(s', a'), s' = A s + B b + C a.

    Its action-gradient grad_a Q_F enters Theorem 3's (deterministic leader) FollowerQGrad,
    Eq. (nablaQF_MG_det).

    Args:
      game: the LQR game.
      resp: the follower's :class:`GameResponse`.
      theta: [k * n] leader parameters (passed on to :func:`follower_state_value`).
      s: [..., n] states.
      a: [..., k] leader actions.
      b: [..., m] follower actions.
    Returns:
      [...] soft Q-values.
    """
    s2 = transition(game, s, a, b)
    return follower_reward(game, s, b) + game.gamma_F * follower_state_value(game, resp, theta, s2)
