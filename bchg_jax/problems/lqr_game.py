"""The bi-level LQR Markov game (paper Section "2-Player Markov Games (Continuous)", appendix).

Dynamics ``s' = A s + B b + C a`` (no process noise), follower reward
``r_F(s, a, b) = -(s^T Qbar s + b^T Rbar b)``, leader reward the Gaussian bump
``r_L(s, a, b) = exp(-1/2 (s - s*)^T Sigma (s - s*))`` at the pre-transition state.
The leader is linear: ``f_theta(a|s) = N(K_theta s, U U^T)`` with ``K_theta = theta.reshape(k, n)``
(a distrax distribution, :func:`leader_policy`); the deterministic leader is ``a = K_theta s``.

The follower observes ``a`` before acting. Writing ``a = K s + w`` with ``w ~ N(0, U U^T)``, the
game is an LQR with dynamics ``A + C K`` and an *observable* disturbance ``C w``, so the best
response is Proposition 2 (:func:`best_response`):
``g(b|s, a) = N(-K_s s - K_a a, (beta/2) S^{-1})``, ``K_s = gamma S^{-1} B^T P A``,
``K_a = gamma S^{-1} B^T P C``, ``P = Riccati(A + C K, B, Qbar, Rbar, gamma_F)``;
``V_F(s, a) = -(s^T Qbar s + (A s + C a)^T M (A s + C a) + v_w)`` (Proposition 2 with
``A s + w -> A s + C a``) and ``Q_F(s, a, b) = r_F + gamma E_{a' ~ f} V_F(s', a')``
(:func:`follower_value`, :func:`follower_q`). For the deterministic leader ``U = 0``.
"""
from __future__ import annotations

import dataclasses
from typing import NamedTuple

import distrax
import jax
import jax.numpy as jnp
import numpy as np

from bchg_jax.followers.maxent_lqr import (GaussianBestResponse, RiccatiInfo, is_stabilizable,
                                           maxent_lqr_observable)
from bchg_jax.problems.lq_cmdp import check_costs, check_discounts

Array = jax.Array


def _quad(M, z):
    return jnp.einsum("...i,ij,...j->...", z, M, z)


@dataclasses.dataclass(frozen=True, eq=False)
class LQRGame:
    """A linear 2-player Markov game with a Gaussian-bump leader reward (module docstring)."""

    A: np.ndarray        # [n, n]
    B: np.ndarray        # [n, m] follower input
    C: np.ndarray        # [n, k] leader input
    Qbar: np.ndarray     # [n, n] follower state cost
    Rbar: np.ndarray     # [m, m] follower action cost
    s0: np.ndarray       # [n] fixed initial state
    s_star: np.ndarray   # [n] centre of the leader's reward bump
    Sigma: np.ndarray    # [n, n] sharpness (precision) of the bump
    U: np.ndarray        # [k, k] the Gaussian leader's scale (lower-triangular)
    gamma_F: float = 0.95
    gamma_L: float = 0.99
    horizon: int = 100
    name: str = "lqr_game"

    @property
    def state_dim(self) -> int:
        return int(np.shape(self.A)[0])

    @property
    def leader_dim(self) -> int:
        return int(np.shape(self.C)[1])

    @property
    def follower_dim(self) -> int:
        return int(np.shape(self.B)[1])

    @property
    def num_params(self) -> int:
        return self.leader_dim * self.state_dim

    def arrays(self, dtype=jnp.float32):
        """(A, B, C, Qbar, Rbar) as jnp arrays of ``dtype``."""
        return tuple(jnp.asarray(x, dtype) for x in (self.A, self.B, self.C, self.Qbar, self.Rbar))

    def validate(self, theta=None) -> "LQRGame":
        """Host-side checks with clear errors, before anything compiles."""
        n = self.state_dim
        A, B, C, Q, R, s0, ss, Sig, U = (np.asarray(x, np.float64) for x in (
            self.A, self.B, self.C, self.Qbar, self.Rbar, self.s0, self.s_star, self.Sigma,
            self.U))
        k, m = C.shape[-1] if C.ndim == 2 else -1, B.shape[-1] if B.ndim == 2 else -1
        shapes = {"A": (A, (n, n)), "B": (B, (n, m)), "C": (C, (n, k)), "Qbar": (Q, (n, n)),
                  "Rbar": (R, (m, m)), "s0": (s0, (n,)), "s_star": (ss, (n,)),
                  "Sigma": (Sig, (n, n)), "U": (U, (k, k))}
        for name, (x, shape) in shapes.items():
            if x.shape != shape or min(shape + (1,)) < 1:
                raise ValueError(f"{self.name}: {name} must have shape {shape}, got {x.shape}")
            if not np.all(np.isfinite(x)):
                raise ValueError(f"{self.name}: {name} is not finite")
        check_discounts(self.name, self.gamma_F, self.gamma_L, self.horizon)
        check_costs(self.name, Q, R)
        if not np.allclose(Sig, Sig.T) or np.linalg.eigvalsh(Sig).min() < -1e-10:
            raise ValueError(f"{self.name}: Sigma must be symmetric positive semi-definite")
        if not np.allclose(U, np.tril(U)) or np.any(np.diagonal(U) < 0):
            raise ValueError(f"{self.name}: U must be lower-triangular with a non-negative "
                             "diagonal (a Cholesky factor of the leader's covariance)")
        if theta is not None:
            th = np.asarray(theta, np.float64)
            if th.shape[-1:] != (k * n,) or not np.all(np.isfinite(th)):
                raise ValueError(f"{self.name}: theta must be finite with last axis {k * n} "
                                 f"(K is [{k}, {n}]), got shape {th.shape}")
            for row in th.reshape(-1, k * n):
                Acl = A + C @ row.reshape(k, n)
                if not is_stabilizable(Acl, B, self.gamma_F):
                    raise ValueError(f"{self.name}: (sqrt(gamma_F) (A + C K), B) is not "
                                     f"stabilisable at theta={row.tolist()}: the follower's "
                                     "Riccati equation has no stabilising solution")
        return self


def lqr_game(**overrides) -> LQRGame:
    """The paper's instance (``spec/lqr_game.md``): n = 2, k = m = 1, s0 = (1, 0),
    s* = (-0.8, 0), Sigma = diag(5, 100)^2, U = 1e-3, gamma_F = 0.95, gamma_L = 0.99, 100 steps."""
    base = dict(A=np.array([[0.0, 1.0], [0.0, 0.0]]), B=np.array([[0.0], [0.1]]),
                C=np.array([[0.1], [0.0]]), Qbar=np.eye(2), Rbar=np.eye(1),
                s0=np.array([1.0, 0.0]), s_star=np.array([-0.8, 0.0]),
                Sigma=np.diag([5.0, 100.0]) ** 2, U=np.array([[1e-3]]))
    base.update(overrides)
    return LQRGame(**base).validate()


# ---- the leader -----------------------------------------------------------------------------
def leader_gain(game: LQRGame, theta: Array) -> Array:
    """K_theta [k, n] from theta [k * n] (row-major)."""
    return theta.reshape(theta.shape[:-1] + (game.leader_dim, game.state_dim))


def leader_policy(game: LQRGame, theta: Array, s: Array) -> distrax.Distribution:
    """f_theta(.|s) = N(K_theta s, U U^T) for a batch of states ``s`` [..., n]."""
    K = leader_gain(game, theta)
    U = jnp.asarray(game.U, s.dtype)
    loc = s @ K.T
    return distrax.MultivariateNormalTri(loc, jnp.broadcast_to(U, loc.shape[:-1] + U.shape))


def leader_log_prob(game: LQRGame, theta: Array, s: Array, a: Array) -> Array:
    """log f_theta(a|s) (differentiable in theta)."""
    return leader_policy(game, theta, s).log_prob(a)


def leader_reward(game: LQRGame, s: Array) -> Array:
    """r_L = exp(-1/2 (s - s*)^T Sigma (s - s*)) (depends on the pre-transition state only)."""
    d = s - jnp.asarray(game.s_star, s.dtype)
    return jnp.exp(-0.5 * _quad(jnp.asarray(game.Sigma, s.dtype), d))


def follower_reward(game: LQRGame, s: Array, b: Array) -> Array:
    return -(_quad(jnp.asarray(game.Qbar, s.dtype), s) + _quad(jnp.asarray(game.Rbar, s.dtype), b))


def transition(game: LQRGame, s: Array, a: Array, b: Array) -> Array:
    """s' = A s + B b + C a."""
    A, B, C = (jnp.asarray(x, s.dtype) for x in (game.A, game.B, game.C))
    return s @ A.T + b @ B.T + a @ C.T


# ---- the follower (Proposition 2) -----------------------------------------------------------
class GameResponse(NamedTuple):
    """Proposition 2's best response to the leader gain K, in the game's (s, a) coordinates."""

    K_s: Array      # [m, n]  gamma S^{-1} B^T P A
    K_a: Array      # [m, k]  gamma S^{-1} B^T P C
    cov: Array      # (beta/2) S^{-1}
    chol: Array
    P: Array        # Riccati solution on A + C K
    M: Array        # gamma P - gamma^2 P B S^{-1} B^T P
    v: Array        # constant of -V_F(s, a) (v_w of Proposition 2 with disturbance C U)
    c_next: Array   # tr((C U)^T M (C U)): E_a' of the leader's noise term in -V_F(s', a')
    info: RiccatiInfo

    @property
    def converged(self):
        return self.info.converged

    def mean(self, s: Array, a: Array) -> Array:
        return -(s @ self.K_s.T + a @ self.K_a.T)

    def sample(self, key: Array, s: Array, a: Array) -> Array:
        eps = jax.random.normal(key, s.shape[:-1] + (self.K_s.shape[0],), s.dtype)
        return self.mean(s, a) + eps @ self.chol.T

    def log_prob(self, s: Array, a: Array, b: Array) -> Array:
        d = b - self.mean(s, a)
        z = jax.scipy.linalg.solve_triangular(self.chol, d[..., None], lower=True)[..., 0]
        m = self.K_s.shape[0]
        logdet = 2.0 * jnp.sum(jnp.log(jnp.diagonal(self.chol)))
        return -0.5 * (jnp.sum(z ** 2, -1) + m * jnp.log(2 * jnp.pi) + logdet)


def best_response(game: LQRGame, theta: Array, beta, *, stochastic: bool = True, P0=None,
                  tol: float = 1e-6, max_iters: int = 1000) -> GameResponse:
    """Proposition 2 on ``(A + C K_theta, B)`` with the observable disturbance ``C (a - K s)``.

    ``stochastic=False``: the deterministic leader (no leader noise: U = 0). Differentiable in
    theta (implicit differentiation through the Riccati solution); check ``.converged``.
    """
    dt = theta.dtype
    A, B, C, Q, R = game.arrays(dt)
    K = leader_gain(game, theta)
    CU = C @ jnp.asarray(game.U, dt) * (1.0 if stochastic else 0.0)
    br: GaussianBestResponse = maxent_lqr_observable(A + C @ K, B, Q, R, CU, game.gamma_F, beta,
                                                     P0=P0, tol=tol, max_iters=max_iters)
    return GameResponse(br.K_w @ A, br.K_w @ C, br.cov, br.chol, br.P, br.M, br.v,
                        jnp.trace(CU.T @ br.M @ CU), br.info)


def follower_value(game: LQRGame, resp: GameResponse, s: Array, a: Array) -> Array:
    """V_F(s, a) = -(s^T Qbar s + (A s + C a)^T M (A s + C a) + v_w) (Proposition 2)."""
    A, C, Q = (jnp.asarray(x, s.dtype) for x in (game.A, game.C, game.Qbar))
    x = s @ A.T + a @ C.T
    return -(_quad(Q, s) + _quad(resp.M, x) + resp.v)


def follower_state_value(game: LQRGame, resp: GameResponse, theta: Array, s: Array) -> Array:
    """E_{a ~ f_theta(.|s)} V_F(s, a) = -(s^T P s + tr((CU)^T M CU) + v_w) (closed form)."""
    return -(_quad(resp.P, s) + resp.c_next + resp.v)


def follower_q(game: LQRGame, resp: GameResponse, theta: Array, s: Array, a: Array,
               b: Array) -> Array:
    """Q_F(s, a, b) = r_F(s, b) + gamma_F E_{a' ~ f} V_F(s', a'), s' = A s + B b + C a."""
    s2 = transition(game, s, a, b)
    return follower_reward(game, s, b) + game.gamma_F * follower_state_value(game, resp, theta, s2)


# ---- sampling -------------------------------------------------------------------------------
class GameTrajectories(NamedTuple):
    s: Array   # [E, T+1, n]
    a: Array   # [E, T, k]
    b: Array   # [E, T, m]


def rollout(key: Array, game: LQRGame, theta: Array, resp: GameResponse, num_episodes: int,
            horizon: int | None = None, *, stochastic: bool = True, random_leader=False,
            random_std: float = 1.0) -> GameTrajectories:
    """Episodes from ``s0``: a ~ f_theta(.|s) (``stochastic=False``: a = K s), b ~ g(.|s, a).

    ``random_leader`` (may be traced): the leader acts N(0, random_std^2) at random instead (the
    reference's warm-up exploration).
    """
    T = int(game.horizon if horizon is None else horizon)
    dt = theta.dtype
    K = leader_gain(game, theta)
    U = jnp.asarray(game.U, dt) * (1.0 if stochastic else 0.0)
    s0 = jnp.broadcast_to(jnp.asarray(game.s0, dt), (num_episodes, game.state_dim))

    def body(s, k):
        ka, kb = jax.random.split(k)
        eps = jax.random.normal(ka, (num_episodes, game.leader_dim), dt)
        a = jnp.where(random_leader, random_std * eps, s @ K.T + eps @ U.T)
        b = resp.sample(kb, s, a)
        s2 = transition(game, s, a, b)
        return s2, (s, a, b)

    s_last, (s, a, b) = jax.lax.scan(body, s0, jax.random.split(key, T))
    s = jnp.concatenate([s, s_last[None]], 0)
    return GameTrajectories(jnp.swapaxes(s, 0, 1), jnp.swapaxes(a, 0, 1), jnp.swapaxes(b, 0, 1))
