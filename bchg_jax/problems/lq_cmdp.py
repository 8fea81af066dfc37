"""Continuous configurable MDPs with linear-Gaussian dynamics (the max-ent LQR setting).

A leader parameter ``theta`` (unconstrained weights; problems may map them through a sigmoid)
configures ``s' = A(theta) s + B(theta) b + w``, ``w ~ N(0, U U^T)``, ``s_0 ~ N(0, Sigma_0)``. The
follower maximises ``r_F(s, b) = -(s^T Qbar s + b^T Rbar b)`` with entropy weight ``beta``
(its best response is Proposition 1, :mod:`bchg_jax.followers.maxent_lqr`). The leader's reward is
a quadratic ``r_L(theta, s, b) = -s^T Ms(theta) s - b^T Mb(theta) b + c(theta)``, so J_L(theta) has a
closed form (:mod:`bchg_jax.exact_lq`).

The generic continuous configurable-MDP interface the estimators use is pure functions of theta:
``sample_init(key, theta, num)``, ``step(key, theta, s, b)``, ``log_transition(theta, s, b, s2)``
(grad_theta log p_theta comes from autodiff), ``follower_reward(theta, s, b)`` and
``leader_reward(theta, s, b)``.
"""
from __future__ import annotations

import dataclasses
from typing import Callable, Optional, Tuple

import jax
import jax.numpy as jnp
import numpy as np

from bchg_jax.followers.maxent_lqr import GaussianBestResponse, is_stabilizable, maxent_lqr

Array = jax.Array


def _quad(M, z):
    return jnp.einsum("...i,ij,...j->...", z, M, z)


def check_discounts(name: str, gamma_F, gamma_L, horizon) -> None:
    """Host-side: both discounts in [0, 1) and a positive integer horizon, else ValueError."""
    for label, g in (("gamma_F", gamma_F), ("gamma_L", gamma_L)):
        if not 0.0 <= float(g) < 1.0:
            raise ValueError(f"{name}: {label} must be in [0, 1), got {g!r}")
    if not isinstance(horizon, (int, np.integer)) or horizon < 1:
        raise ValueError(f"{name}: horizon must be a positive integer, got {horizon!r}")


def check_costs(name: str, Q: np.ndarray, R: np.ndarray) -> None:
    """Host-side: Qbar symmetric PSD and Rbar symmetric PD (the follower's LQR costs)."""
    if not np.allclose(Q, Q.T) or np.linalg.eigvalsh(Q).min() < -1e-10:
        raise ValueError(f"{name}: Qbar must be symmetric positive semi-definite")
    if not np.allclose(R, R.T) or np.linalg.eigvalsh(R).min() <= 0:
        raise ValueError(f"{name}: Rbar must be symmetric positive definite")


@dataclasses.dataclass(frozen=True, eq=False)
class LQConfigurableMDP:
    """A linear-Gaussian configurable MDP with quadratic rewards (see module docstring).

    ``A_fn(theta) -> [n, n]``, ``B_fn(theta) -> [n, m]``, ``leader_quadratic(theta) -> (Ms, Mb, c)``
    are pure jnp functions. ``horizon`` is the episode length used for sampling and for the metric.
    """

    A_fn: Callable[[Array], Array]
    B_fn: Callable[[Array], Array]
    U: Array
    Qbar: Array
    Rbar: Array
    leader_quadratic: Callable[[Array], Tuple[Array, Array, Array]]
    init_cov: Array
    gamma_F: float
    gamma_L: float
    theta0: Array
    horizon: int = 100
    name: str = "lq_cmdp"
    # optional: theta -> {name: (Ms, Mb, c)}, reward terms reported per iteration as metrics
    components: Optional[Callable[[Array], dict]] = None

    # ---- sizes -----------------------------------------------------------------------------
    @property
    def state_dim(self) -> int:
        return int(np.shape(self.Qbar)[0])

    @property
    def action_dim(self) -> int:
        return int(np.shape(self.Rbar)[0])

    # ---- the generic continuous configurable-MDP interface ----------------------------------
    def sample_init(self, key: Array, theta: Array, num: int) -> Array:
        L = jnp.linalg.cholesky(jnp.asarray(self.init_cov, theta.dtype))
        return jax.random.normal(key, (num, self.state_dim), theta.dtype) @ L.T

    def mean_next(self, theta: Array, s: Array, b: Array) -> Array:
        return s @ self.A_fn(theta).T + b @ self.B_fn(theta).T

    def step(self, key: Array, theta: Array, s: Array, b: Array) -> Array:
        w = jax.random.normal(key, s.shape, s.dtype) @ jnp.asarray(self.U, s.dtype).T
        return self.mean_next(theta, s, b) + w

    def log_transition(self, theta: Array, s: Array, b: Array, s2: Array) -> Array:
        """log N(s2; A(theta) s + B(theta) b, U U^T) (differentiable in theta)."""
        U = jnp.asarray(self.U, s.dtype)
        d = s2 - self.mean_next(theta, s, b)
        z = jax.scipy.linalg.solve_triangular(U, d[..., None], lower=True)[..., 0]
        n = self.state_dim
        logdet = jnp.sum(jnp.log(jnp.abs(jnp.diagonal(U))))
        return -0.5 * jnp.sum(z ** 2, -1) - logdet - 0.5 * n * jnp.log(2 * jnp.pi)

    def follower_reward(self, theta: Array, s: Array, b: Array) -> Array:
        return -(_quad(jnp.asarray(self.Qbar, s.dtype), s) + _quad(jnp.asarray(self.Rbar, s.dtype), b))

    def leader_reward(self, theta: Array, s: Array, b: Array) -> Array:
        Ms, Mb, c = self.leader_quadratic(theta)
        return -_quad(Ms, s) - _quad(Mb, b) + c

    # ---- the follower ------------------------------------------------------------------------
    def best_response(self, theta: Array, beta, P0=None, tol: float = 1e-6,
                      max_iters: int = 50_000) -> GaussianBestResponse:
        dt = theta.dtype
        return maxent_lqr(self.A_fn(theta), self.B_fn(theta), jnp.asarray(self.Qbar, dt),
                          jnp.asarray(self.Rbar, dt), jnp.asarray(self.U, dt), self.gamma_F, beta,
                          P0=P0, tol=tol, max_iters=max_iters)

    # ---- validation (host side, before anything compiles) ------------------------------------
    def validate(self, theta=None) -> "LQConfigurableMDP":
        theta = np.asarray(self.theta0 if theta is None else theta)
        check_discounts(self.name, self.gamma_F, self.gamma_L, self.horizon)
        n, m = self.state_dim, self.action_dim
        Q, R, U, C0 = (np.asarray(x, np.float64) for x in (self.Qbar, self.Rbar, self.U,
                                                            self.init_cov))
        if Q.shape != (n, n) or R.shape != (m, m) or U.shape != (n, n) or C0.shape != (n, n):
            raise ValueError(f"{self.name}: Qbar must be [n,n], Rbar [m,m], U [n,n], init_cov "
                             f"[n,n]; got {Q.shape}, {R.shape}, {U.shape}, {C0.shape}")
        check_costs(self.name, Q, R)
        if not np.allclose(U, np.tril(U)) or np.any(np.abs(np.diagonal(U)) <= 0):
            raise ValueError(f"{self.name}: U must be lower-triangular with a non-zero diagonal "
                             "(a Cholesky factor of the noise covariance)")
        if not np.allclose(C0, C0.T) or np.linalg.eigvalsh(C0).min() <= 0:
            raise ValueError(f"{self.name}: init_cov must be symmetric positive definite")
        A = np.asarray(self.A_fn(jnp.asarray(theta)), np.float64)
        B = np.asarray(self.B_fn(jnp.asarray(theta)), np.float64)
        if A.shape != (n, n) or B.shape != (n, m):
            raise ValueError(f"{self.name}: A(theta) must be [{n},{n}] and B(theta) [{n},{m}], got "
                             f"{A.shape} and {B.shape}")
        Ms, Mb, c = (np.asarray(x, np.float64) for x in self.leader_quadratic(jnp.asarray(theta)))
        if Ms.shape != (n, n) or Mb.shape != (m, m) or c.shape != ():
            raise ValueError(f"{self.name}: leader_quadratic must return ([n,n], [m,m], scalar)")
        if not np.all(np.isfinite(A)) or not np.all(np.isfinite(B)):
            raise ValueError(f"{self.name}: A(theta) or B(theta) is not finite at theta")
        if not is_stabilizable(A, B, self.gamma_F):
            raise ValueError(f"{self.name}: (sqrt(gamma_F) A(theta), B(theta)) is not stabilisable "
                             "at the initial theta: the follower's Riccati equation has no "
                             "stabilising solution")
        return self
