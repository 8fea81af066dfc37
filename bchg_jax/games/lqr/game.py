"""The bi-level LQR Markov game: the problem type and the leader (paper Section "2-Player Markov
Games (Continuous)" and the appendix "Bi-Level LQR Task in 2-Player Markov Games").

Dynamics ``s' = A s + B b + C a`` (no process noise, Eq. (bilevel_lqr_mg_transition)),
follower reward ``r_F(s, a, b) = -(s^T Qbar s + b^T Rbar b)``, leader reward the Gaussian bump
``r_L(s, a, b) = exp(-1/2 (s - s*)^T Sigma (s - s*))`` at the pre-transition state.
The leader is linear: ``f_theta(a|s) = N(K_theta s, U U^T)`` with ``K_theta = theta.reshape(k, n)``
(a distrax distribution, :func:`leader_policy`); the deterministic leader is ``a = K_theta s``.

The follower observes ``a`` before acting. Writing ``a = K s + w`` with ``w ~ N(0, U U^T)``, the
game is an LQR with dynamics ``A + C K`` and an *observable* disturbance ``C w``, so the best
response is Proposition 2 (:func:`bchg_jax.games.lqr.follower.best_response`,
Eq. (lqr_opt_follower_mg)):
``g(b|s, a) = N(-K_s s - K_a a, (beta/2) S^{-1})``, ``K_s = gamma S^{-1} B^T P A``,
``K_a = gamma S^{-1} B^T P C``, ``P = Riccati(A + C K, B, Qbar, Rbar, gamma_F)``;
``V_F(s, a) = -(s^T Qbar s + (A s + C a)^T M (A s + C a) + v_w)`` (Proposition 2 with
``A s + w -> A s + C a``) and ``Q_F(s, a, b) = r_F + gamma E_{a' ~ f} V_F(s', a')``
(:func:`bchg_jax.games.lqr.follower.follower_value`,
:func:`bchg_jax.games.lqr.follower.follower_q`). For the deterministic leader ``U = 0``.
"""

from __future__ import annotations

import dataclasses

import distrax
import jax
import jax.numpy as jnp
import numpy as np

from bchg_jax.core.maxent_lqr import gaussian_log_density, is_stabilizable
from bchg_jax.core.maxent_lqr import quad_form as _quad
from bchg_jax.core.precision import full_precision
from bchg_jax.core.validate import (
    check_costs,
    check_discounts,
    check_theta,
    is_concrete,
    shape_property,
)

Array = jax.Array


@dataclasses.dataclass(frozen=True, eq=False)
class LQRGame:
    """A linear 2-player Markov game with a Gaussian-bump leader reward (module docstring).

    Attributes:
      A: [n, n] state transition matrix.
      B: [n, m] the follower's input matrix.
      C: [n, k] the leader's input matrix.
      Qbar: [n, n] follower state cost (positive semi-definite).
      Rbar: [m, m] follower action cost (positive definite).
      s0: [n] fixed initial state.
      s_star: [n] centre s* of the leader's reward bump.
      Sigma: [n, n] sharpness (precision) of the bump.
      U: [k, k] lower-triangular scale of the Gaussian leader, f_theta = N(K s, U U^T).
      gamma_F: the follower's discount in [0, 1).
      gamma_L: the leader's discount in [0, 1).
      horizon: episode length T.
      name: label used in error messages.
    """

    A: np.ndarray  # [n, n]
    B: np.ndarray  # [n, m] follower input
    C: np.ndarray  # [n, k] leader input
    Qbar: np.ndarray  # [n, n] follower state cost
    Rbar: np.ndarray  # [m, m] follower action cost
    s0: np.ndarray  # [n] fixed initial state
    s_star: np.ndarray  # [n] centre of the leader's reward bump
    Sigma: np.ndarray  # [n, n] sharpness (precision) of the bump
    U: np.ndarray  # [k, k] the Gaussian leader's scale (lower-triangular)
    gamma_F: float = 0.95
    gamma_L: float = 0.99
    horizon: int = 100
    name: str = "lqr_game"

    state_dim = shape_property("A", 0, "n, the state dimension")
    leader_dim = shape_property("C", 1, "k, the leader's action dimension")
    follower_dim = shape_property("B", 1, "m, the follower's action dimension")

    @property
    def num_params(self) -> int:
        """d = k * n, the size of theta (the flattened leader gain K_theta [k, n])."""
        return self.leader_dim * self.state_dim

    def arrays(self, dtype=jnp.float32):
        """(A, B, C, Qbar, Rbar) as jnp arrays of ``dtype``."""
        return tuple(jnp.asarray(x, dtype) for x in (self.A, self.B, self.C, self.Qbar, self.Rbar))

    def validate(self, theta=None) -> "LQRGame":
        """Host-side checks with clear errors, before anything compiles.

        Checks every array's shape and finiteness, discounts and horizon, the costs, Sigma
        (symmetric PSD) and U (lower-triangular, non-negative diagonal); that some leader gain
        makes the follower's problem solvable ((sqrt(gamma_F) A, [B C]) stabilisable, the same
        as (sqrt(gamma_F) (A + C K), B) stabilisable for some K); with ``theta``, that
        (sqrt(gamma_F) (A + C K_theta), B) is stabilisable for every row of theta.

        Args:
          theta: optional [k * n] or [..., k * n] leader parameters to check.
        Returns:
          ``self``.
        Raises:
          ValueError: the first failed check.
        """
        for label in ("A", "B", "C", "Qbar", "Rbar", "s0", "s_star", "Sigma", "U"):
            if np.iscomplexobj(getattr(self, label)):  # np.asarray(float64) drops the imaginary
                raise ValueError(  # part with only a ComplexWarning
                    f"{self.name}: {label} must be real, got a complex array "
                    f"(dtype {np.asarray(getattr(self, label)).dtype})"
                )
        A, B, C, Q, R, s0, ss, Sig, U = (
            np.asarray(x, np.float64)
            for x in (
                self.A,
                self.B,
                self.C,
                self.Qbar,
                self.Rbar,
                self.s0,
                self.s_star,
                self.Sigma,
                self.U,
            )
        )
        if A.ndim != 2 or A.shape[0] != A.shape[1] or A.shape[0] < 1:
            raise ValueError(f"{self.name}: A must have shape [n, n], got {A.shape}")
        n = A.shape[0]
        for name, x in (("B", B), ("C", C)):  # m, k: from B [n, m] and C [n, k]
            if x.ndim != 2 or x.shape[0] != n or x.shape[1] < 1:
                raise ValueError(
                    f"{self.name}: {name} must have shape [n={n}, "
                    f"{'m' if name == 'B' else 'k'}] (n from A), got {x.shape}"
                )
        k, m = C.shape[1], B.shape[1]
        shapes = {
            "A": (A, (n, n)),
            "B": (B, (n, m)),
            "C": (C, (n, k)),
            "Qbar": (Q, (n, n)),
            "Rbar": (R, (m, m)),
            "s0": (s0, (n,)),
            "s_star": (ss, (n,)),
            "Sigma": (Sig, (n, n)),
            "U": (U, (k, k)),
        }
        for name, (x, shape) in shapes.items():
            if x.shape != shape:
                raise ValueError(
                    f"{self.name}: {name} must have shape {shape} (n={n} from A, "
                    f"m={m} from B, k={k} from C), got {x.shape}"
                )
            if not np.all(np.isfinite(x)):
                raise ValueError(f"{self.name}: {name} is not finite")
        check_discounts(self.name, self.gamma_F, self.gamma_L, self.horizon)
        check_costs(self.name, Q, R)
        if not np.allclose(Sig, Sig.T) or np.linalg.eigvalsh(Sig).min() < -1e-10:
            raise ValueError(f"{self.name}: Sigma must be symmetric positive semi-definite")
        if not np.allclose(U, np.tril(U)) or np.any(np.diagonal(U) < 0):
            raise ValueError(
                f"{self.name}: U must be lower-triangular with a non-negative "
                "diagonal (a Cholesky factor of the leader's covariance)"
            )
        if not is_stabilizable(A, np.concatenate([B, C], 1), self.gamma_F):
            raise ValueError(
                f"{self.name}: no leader gain K makes (sqrt(gamma_F) (A + C K), B) "
                "stabilisable ((sqrt(gamma_F) A, [B C]) is not): the follower's Riccati "
                "equation has no stabilising solution at any theta"
            )
        if theta is not None:
            th = np.asarray(theta, np.float64)
            if th.shape[-1:] != (k * n,) or not np.all(np.isfinite(th)):
                raise ValueError(
                    f"{self.name}: theta must be finite with last axis {k * n} "
                    f"(K is [{k}, {n}]), got shape {th.shape}"
                )
            for row in th.reshape(-1, k * n):
                Acl = A + C @ row.reshape(k, n)
                if not is_stabilizable(Acl, B, self.gamma_F):
                    raise ValueError(
                        f"{self.name}: (sqrt(gamma_F) (A + C K), B) is not "
                        f"stabilisable at theta={row.tolist()}: the follower's "
                        "Riccati equation has no stabilising solution"
                    )
        return self

    def check_constants(self) -> "LQRGame":
        """Every check of :meth:`validate` (all of the game's arrays are theta-independent);
        what the exact references and the best response run once per game object
        (:func:`bchg_jax.core.validate.check_constants_once`).

        Returns:
          ``self``.
        Raises:
          ValueError: the first failed check.
        """
        return self.validate()

    def check_gaussian_leader(self, what: str, instead: str) -> None:
        """U with a positive diagonal, so that U U^T is positive definite: ``what`` uses the
        Gaussian leader's score grad_theta log f_theta(a|s) (Theorem 2), undefined along a
        direction without leader noise (a concrete U only).

        Args:
          what: the caller, named in the error.
          instead: what to use for a leader without noise, appended to the error.
        Raises:
          ValueError: a zero or negative diagonal entry of U.
        """
        if is_concrete(self.U) and not np.all(np.diagonal(np.asarray(self.U, np.float64)) > 0):
            raise ValueError(
                f"{self.name}: {what} needs a Gaussian leader with a positive-definite "
                f"covariance U U^T (a positive diagonal of U), got U={np.asarray(self.U).tolist()}"
                f": its score log f_theta(a|s) is undefined; {instead}"
            )


# ---- the leader -----------------------------------------------------------------------------
def check_game_theta(game: LQRGame, theta) -> None:
    """The leader's parameters of an LQR game: one floating array [k * n] (the gain K
    flattened), finite when concrete. A Python list or tuple is refused by name, as the other
    families refuse it (``jnp.asarray`` it; it has no dtype to compute in).

    Raises:
      ValueError: a list / tuple, another shape, a non-floating dtype, or a NaN / inf entry.
    """
    if isinstance(theta, (list, tuple)):
        raise ValueError(
            f"{game.name}: theta must be one array [k * n = {game.num_params}], got a "
            f"{type(theta).__name__} of {len(theta)}; pass jnp.asarray(theta, jnp.float32) "
            "(or float64)"
        )
    check_theta(game, theta, last_axis=game.num_params)


def leader_gain(game: LQRGame, theta: Array) -> Array:
    """K_theta [k, n] from theta [k * n] (row-major); batched: [..., k * n] -> [..., k, n].

    Args:
      game: the LQR game (sizes k, n).
      theta: [..., k * n] leader parameters.
    Returns:
      [..., k, n] leader gains.
    Raises:
      ValueError: ``theta`` whose last axis is not k * n.
    """
    k, n = game.leader_dim, game.state_dim
    if np.ndim(theta) < 1 or np.shape(theta)[-1] != k * n:
        raise ValueError(
            f"{game.name}: theta must have last axis k * n = {k * n} (K_theta is "
            f"[k={k}, n={n}]), got shape {tuple(np.shape(theta))}"
        )
    return theta.reshape(theta.shape[:-1] + (game.leader_dim, game.state_dim))


@full_precision
def leader_mean(game: LQRGame, theta: Array, s: Array) -> Array:
    """K s, the deterministic leader's action and the Gaussian leader's mean, for ``s`` [..., n]
    -> [..., k] (full precision: the Gaussian leader's noise U = 1e-3 is below TF32's rounding
    of K s)."""
    return s @ leader_gain(game, theta).T


@full_precision
def leader_policy(game: LQRGame, theta: Array, s: Array) -> distrax.Distribution:
    """f_theta(.|s) = N(K_theta s, U U^T) for a batch of states ``s`` [..., n].

    Args:
      game: the LQR game (``U`` [k, k]).
      theta: [k * n] leader parameters.
      s: [..., n] states.
    Returns:
      a ``distrax.MultivariateNormalTri`` with batch shape [...] and event shape [k].
    """
    U = jnp.asarray(game.U, s.dtype)
    loc = leader_mean(game, theta, s)
    return distrax.MultivariateNormalTri(loc, jnp.broadcast_to(U, loc.shape[:-1] + U.shape))


@full_precision
def leader_log_prob(game: LQRGame, theta: Array, s: Array, a: Array) -> Array:
    """log f_theta(a|s) (differentiable in theta), the score term of Eq. (hg_MG).

    Args:
      game: the LQR game.
      theta: [k * n] leader parameters.
      s: [..., n] states.
      a: [..., k] leader actions.
    Returns:
      [...] log-densities (those of :func:`leader_policy`, computed with the inverse of U
      applied as a product: distrax's ``log_prob`` solves one triangular system per sample,
      a batched LAPACK call that can stall jaxlib 0.10.x, :func:`~bchg_jax.core.maxent_lqr.whiten`).
    """
    d = a - leader_mean(game, theta, s)
    return gaussian_log_density(jnp.asarray(game.U, d.dtype), d)


@full_precision
def leader_reward(game: LQRGame, s: Array) -> Array:
    """r_L = exp(-1/2 (s - s*)^T Sigma (s - s*)) (depends on the pre-transition state only).

    Args:
      game: the LQR game (``s_star`` [n], ``Sigma`` [n, n]).
      s: [..., n] states.
    Returns:
      [...] leader rewards in (0, 1].
    """
    d = s - jnp.asarray(game.s_star, s.dtype)
    return jnp.exp(-0.5 * _quad(jnp.asarray(game.Sigma, s.dtype), d))


@full_precision
def follower_reward(game: LQRGame, s: Array, b: Array) -> Array:
    """r_F(s, a, b) = -(s^T Qbar s + b^T Rbar b) for ``s`` [..., n], ``b`` [..., m] -> [...]."""
    return -(_quad(jnp.asarray(game.Qbar, s.dtype), s) + _quad(jnp.asarray(game.Rbar, s.dtype), b))


@full_precision
def transition(game: LQRGame, s: Array, a: Array, b: Array) -> Array:
    """s' = A s + B b + C a (Eq. (bilevel_lqr_mg_transition), deterministic).

    Args:
      game: the LQR game.
      s: [..., n] states.
      a: [..., k] leader actions.
      b: [..., m] follower actions.
    Returns:
      [..., n] next states.
    """
    A, B, C = (jnp.asarray(x, s.dtype) for x in (game.A, game.B, game.C))
    return s @ A.T + b @ B.T + a @ C.T
