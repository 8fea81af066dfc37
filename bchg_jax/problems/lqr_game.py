"""The paper's bi-level LQR Markov game instance."""

from __future__ import annotations

import numpy as np

from bchg_jax.games.lqr.game import LQRGame


def lqr_game(**overrides) -> LQRGame:
    """The paper's instance (``docs/experiments.md``): n = 2, k = m = 1, s0 = (1, 0),
    s* = (-0.8, 0), Sigma = diag(5, 100)^2, U = 1e-3, gamma_F = 0.95, gamma_L = 0.99, 100 steps.

    Section "2-Player Markov Games (Continuous)" and the appendix "Bi-Level LQR Task in 2-Player
    Markov Games" (dynamics Eq. (bilevel_lqr_mg_transition)).

    Args:
      **overrides: replacements of :class:`~bchg_jax.games.lqr.game.LQRGame` fields: ``A``
        [n, n], ``B`` [n, m], ``C`` [n, k], ``Qbar`` [n, n], ``Rbar`` [m, m], ``s0`` [n],
        ``s_star`` [n], ``Sigma`` [n, n], ``U`` [k, k], ``gamma_F``, ``gamma_L``, ``horizon``,
        ``name``.
    Returns:
      the validated :class:`~bchg_jax.games.lqr.game.LQRGame`.
    Raises:
      ValueError: overrides that fail ``LQRGame.validate``.
    """
    base = dict(
        A=np.array([[0.0, 1.0], [0.0, 0.0]]),
        B=np.array([[0.0], [0.1]]),
        C=np.array([[0.1], [0.0]]),
        Qbar=np.eye(2),
        Rbar=np.eye(1),
        s0=np.array([1.0, 0.0]),
        s_star=np.array([-0.8, 0.0]),
        Sigma=np.diag([5.0, 100.0]) ** 2,
        U=np.array([[1e-3]]),
    )
    base.update(overrides)
    return LQRGame(**base).validate()


def gain_metrics(theta, response) -> dict:
    """The leader's gains as training metrics (``make_train(..., metrics_fn=gain_metrics)``):
    ``K1``, ``K2``, ... the entries of K_theta = theta.reshape(k, n), row-major (the paper's
    instance: K1 on the position s_1, K2 on the velocity s_2).

    Args:
      theta: [k * n] the leader's parameters.
      response: the follower's response (unused).
    Returns:
      ``{"K1": [], ..., "K<k n>": []}``.
    """
    return {f"K{i + 1}": theta[i] for i in range(theta.shape[0])}
