"""Continuous configurable MDPs with linear-Gaussian dynamics (the max-ent LQR setting).

A leader parameter ``theta`` (unconstrained weights; problems may map them through a sigmoid)
configures ``s' = A(theta) s + B(theta) b + w``, ``w ~ N(0, U U^T)``, ``s_0 ~ N(0, Sigma_0)``. The
follower maximises ``r_F(s, b) = -(s^T Qbar s + b^T Rbar b)`` with entropy weight ``beta``
(its best response is Proposition 1, :mod:`bchg_jax.core.maxent_lqr`). The leader's reward is
a quadratic ``r_L(theta, s, b) = -s^T Ms(theta) s - b^T Mb(theta) b + c(theta)``, so J_L(theta)
has a closed form (:mod:`bchg_jax.lq.exact`). Paper: Eq. (bilevel_lqr_cmdp_transition), the
building thermal control task of the appendix.

The generic continuous configurable-MDP interface the estimators use is pure functions of theta:
``sample_init(key, theta, num)``, ``step(key, theta, s, b)``, ``log_transition(theta, s, b, s2)``
(grad_theta log p_theta comes from autodiff), ``follower_reward(theta, s, b)`` and
``leader_reward(theta, s, b)``.
"""

from __future__ import annotations

import dataclasses
from typing import Callable, ClassVar, Optional, Tuple

import jax
import jax.numpy as jnp
import numpy as np

from bchg_jax.core.maxent_lqr import GaussianBestResponse, gaussian_log_density, is_stabilizable
from bchg_jax.core.maxent_lqr import quad_form as _quad
from bchg_jax.core.precision import full_precision, full_precision_fields
from bchg_jax.core.validate import (
    check_costs,
    check_discounts,
    check_dtype_available,
    check_floating,
    check_indexing_once,
    check_not_wider,
    check_shape,
    check_theta_array,
    is_concrete,
    shape_property,
)

Array = jax.Array


def _riccati_gain(A, B, Q, R, gamma, tol: float = 1e-12, max_doublings: int = 64):
    """Host-side K = gamma S^{-1} B^T P A of Proposition 1 at the limit P of the Riccati iteration
    of Eq. (riccati_equation) from P = Q (the limit the trainer's solver reaches: the stabilising
    solution, or another one when a growing mode costs nothing), float64 numpy; None when the
    iteration diverges.

    By doubling: with ``A_g = sqrt(gamma) A``, ``B_g = sqrt(gamma) B``, the structure-preserving
    doubling recursion (``W = I + G H``)
    ``A <- A W^{-1} A``, ``G <- G + A W^{-1} G A^T``, ``H <- H + A^T H W^{-1} A`` from
    ``(A_g, B_g R^{-1} B_g^T, Q)`` gives in H the iteration's value after 2^k steps, so k ~ 60
    doublings reach its limit however slowly the iteration itself converges (a plain iteration
    capped at 50,000 steps skipped the check near a marginal closed loop).
    """
    n = A.shape[0]
    Ak = np.sqrt(gamma) * A
    Bg = np.sqrt(gamma) * B
    G = Bg @ np.linalg.solve(R, Bg.T)
    H = Q
    for _ in range(max_doublings):
        W = np.eye(n) + G @ H
        WiA, WiG = np.linalg.solve(W, Ak), np.linalg.solve(W, G)
        H_new = H + Ak.T @ H @ WiA
        G, Ak = G + Ak @ WiG @ Ak.T, Ak @ WiA
        H_new, G = 0.5 * (H_new + H_new.T), 0.5 * (G + G.T)
        if not np.all(np.isfinite(H_new)):
            return None
        done = np.max(np.abs(H_new - H)) <= tol * max(np.max(np.abs(H_new)), 1e-300)
        H = H_new
        if done:
            S = R + gamma * B.T @ H @ B
            return gamma * np.linalg.solve(S, B.T @ H @ A)
    return None


@dataclasses.dataclass(frozen=True, eq=False)
class LQConfigurableMDP:
    """A linear-Gaussian configurable MDP with quadratic rewards (see module docstring).

    The configurable MDP of Eq. (bilevel_lqr_cmdp_transition): ``s' = A(theta) s + B(theta) b + w``,
    ``w ~ N(0, U U^T)``, with ``r_F(s, b) = -(s^T Qbar s + b^T Rbar b)`` (Qbar, Rbar do not depend
    on theta here) and a quadratic leader reward, the leader's utility Eq. (leader-utility).
    ``A_fn(theta) -> [n, n]``, ``B_fn(theta) -> [n, m]``, ``leader_quadratic(theta) -> (Ms, Mb, c)``
    are pure jnp functions. ``horizon`` is the episode length used for sampling and for the metric.

    Attributes:
      A_fn: theta [d] -> A(theta) [n, n], the state transition matrix.
      B_fn: theta [d] -> B(theta) [n, m], the follower's control input matrix.
      U: [n, n] lower-triangular Cholesky factor of the process-noise covariance U U^T.
      Qbar: [n, n] follower state cost (positive semi-definite).
      Rbar: [m, m] follower action cost (positive definite).
      leader_quadratic: theta [d] -> (Ms [n, n], Mb [m, m], c []) of
        ``r_L(s, b) = -s^T Ms s - b^T Mb b + c``.
      init_cov: [n, n] covariance Sigma_0 of the zero-mean initial state (does not depend on
        theta, so rho_0 contributes no score term).
      gamma_F: the follower's discount in [0, 1).
      gamma_L: the leader's discount in [0, 1).
      theta0: [d] initial (unconstrained) leader parameters.
      horizon: episode length T (sampling and the exact metric).
      name: label used in error messages.
      components: optional theta [d] -> {name: (Ms, Mb, c)}, reward terms reported as metrics.
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
    # theta is one vector [d] (validate(); core.validate.check_theta refuses a scalar by name)
    theta_ndim: ClassVar[int] = 1

    def __post_init__(self):
        for label in ("Qbar", "Rbar", "U", "init_cov"):
            if callable(getattr(self, label)):  # np.asarray of a function: a bare TypeError
                raise ValueError(
                    f"{self.name}: {label} must be an array: the follower's costs, the noise "
                    "and the start covariance do not depend on theta in this family (theta "
                    "acts through A_fn, B_fn and leader_quadratic)"
                )
        full_precision_fields(self, ("A_fn", "B_fn", "leader_quadratic", "components"))

    # ---- sizes -----------------------------------------------------------------------------
    state_dim = shape_property("Qbar", 0, "n, the state dimension")
    action_dim = shape_property("Rbar", 0, "m, the follower's action dimension")

    # ---- the generic continuous configurable-MDP interface ----------------------------------
    @full_precision
    def sample_init(self, key: Array, theta: Array, num: int) -> Array:
        """Initial states s_0 ~ N(0, init_cov) (rho_0 does not depend on theta).

        Args:
          key: PRNG key.
          theta: [d] leader parameters (only their dtype is used).
          num: number of states to draw.
        Returns:
          [num, n] initial states of ``theta.dtype``.
        """
        L = jnp.linalg.cholesky(jnp.asarray(self.init_cov, theta.dtype))
        return jax.random.normal(key, (num, self.state_dim), theta.dtype) @ L.T

    @full_precision
    def mean_next(self, theta: Array, s: Array, b: Array) -> Array:
        """The noise-free next state A(theta) s + B(theta) b.

        Args:
          theta: [d] leader parameters.
          s: [..., n] states.
          b: [..., m] follower actions (same batch shape as ``s``).
        Returns:
          [..., n] mean of s' given (s, b).
        """
        return s @ self.A_fn(theta).T + b @ self.B_fn(theta).T

    @full_precision
    def step(self, key: Array, theta: Array, s: Array, b: Array) -> Array:
        """Samples s' ~ p_theta(.|s, b) = N(A(theta) s + B(theta) b, U U^T).

        Args:
          key: PRNG key.
          theta: [d] leader parameters.
          s: [..., n] states.
          b: [..., m] follower actions.
        Returns:
          [..., n] next states.
        """
        return self.stepper(theta)(key, s, b)

    def stepper(self, theta: Array) -> Callable[[Array, Array, Array], Array]:
        """:meth:`step` at a fixed ``theta``: ``(key, s, b) -> s'``, the same draws, with A(theta)
        and B(theta) formed once, here. A scan over time (:func:`bchg_jax.lq.rollout.rollout`)
        calls it at every step: XLA:GPU does not move the matrices' construction (thermal's A:
        17 scatter kernels) out of the loop by itself (``benchmarks.gpu_kernels``: 32 -> 13
        kernels per step of thermal's rollout).

        Args:
          theta: [d] leader parameters.
        Returns:
          ``step(key, s [..., n], b [..., m]) -> [..., n]`` next states.
        """
        A, B = self.A_fn(theta), self.B_fn(theta)

        @full_precision
        def step(key: Array, s: Array, b: Array) -> Array:
            w = jax.random.normal(key, s.shape, s.dtype) @ jnp.asarray(self.U, s.dtype).T
            return (s @ A.T + b @ B.T) + w

        return step

    def log_transition(self, theta: Array, s: Array, b: Array, s2: Array) -> Array:
        """log p_theta(s2|s, b) = log N(s2; A(theta) s + B(theta) b, U U^T), differentiable.

        Its theta-gradient is the score ``grad_theta log p_theta`` of Eq. (hg_configurable) and
        Eq. (nablaQF).

        Args:
          theta: [d] leader parameters.
          s: [..., n] states.
          b: [..., m] follower actions.
          s2: [..., n] next states.
        Returns:
          [...] log-densities.
        """
        d = s2 - self.mean_next(theta, s, b)
        return gaussian_log_density(jnp.asarray(self.U, d.dtype), d)

    @full_precision
    def follower_reward(self, theta: Array, s: Array, b: Array) -> Array:
        """r_F(s, b) = -(s^T Qbar s + b^T Rbar b) (does not depend on theta here).

        Args:
          theta: [d] leader parameters (unused; part of the interface).
          s: [..., n] states.
          b: [..., m] follower actions.
        Returns:
          [...] follower rewards.
        """
        return -(
            _quad(jnp.asarray(self.Qbar, s.dtype), s) + _quad(jnp.asarray(self.Rbar, s.dtype), b)
        )

    @full_precision
    def leader_reward(self, theta: Array, s: Array, b: Array) -> Array:
        """r_L^theta(s, b) = -s^T Ms(theta) s - b^T Mb(theta) b + c(theta) (``leader_quadratic``).

        Args:
          theta: [d] leader parameters (differentiable).
          s: [..., n] states.
          b: [..., m] follower actions.
        Returns:
          [...] leader rewards.
        """
        Ms, Mb, c = self.leader_quadratic(theta)
        return -_quad(Ms, s) - _quad(Mb, b) + c

    # ---- the follower ------------------------------------------------------------------------
    def best_response(
        self, theta: Array, beta, P0=None, tol: float = 1e-6, max_iters: int = 50_000
    ) -> GaussianBestResponse:
        """The follower's best response at theta: Proposition 1, Eq. (lqr_opt_follower_cmdp).

        Delegates to :func:`bchg_jax.lq.follower.best_response`.

        Args:
          theta: [d] leader parameters.
          beta: the follower's entropy weight (> 0), scalar.
          P0: optional [n, n] warm start of the Riccati iteration (default Qbar).
          tol: relative-change stopping tolerance of the Riccati iteration.
          max_iters: maximum number of Riccati iterations.
        Returns:
          :class:`~bchg_jax.core.maxent_lqr.GaussianBestResponse` (``P`` [n, n], ``K`` [m, n],
          ``cov`` [m, m], ...; check ``.converged``).
        """
        from bchg_jax.lq.follower import best_response

        return best_response(self, theta, beta, P0=P0, tol=tol, max_iters=max_iters)

    # ---- validation (host side, before anything compiles) ------------------------------------
    def validate(self, theta=None) -> "LQConfigurableMDP":
        """Host-side checks with clear ``ValueError`` messages, before anything compiles.

        Checks that theta0 (and ``theta``, shaped like it) is one finite floating [d] vector,
        discounts and horizon; the shapes of A(theta) [n, n] and B(theta) [n, m] (the
        dynamics define n and m), of Qbar [n, n], Rbar [m, m], U [n, n], init_cov [n, n] and
        of ``leader_quadratic(theta)`` and each ``components(theta)`` term (finite) against
        them (an error names the array at fault);
        the costs, that U is a lower-triangular Cholesky factor, that init_cov is positive
        definite, that (sqrt(gamma_F) A(theta), B(theta)) is stabilisable, and that the
        follower's closed loop F = A(theta) - B(theta) K at theta (Proposition 1) has
        ``gamma rho(F)^2 < 1`` for both discounts (a Riccati solve at theta).

        Args:
          theta: [d] parameters to check at (default ``theta0``).
        Returns:
          ``self``.
        Raises:
          ValueError: the first failed check.
        """
        where = "theta0" if theta is None else "the theta given"
        check_theta_array(self.name, self.theta0, "theta0", ndim=1)
        # theta0's dtype is the run's (make_train): float64 only with jax_enable_x64
        check_dtype_available(f"{self.name}: theta0", np.asarray(self.theta0).dtype)
        if theta is not None:
            check_theta_array(self.name, theta, "theta", ndim=1)
            if np.shape(theta) != np.shape(self.theta0):  # A(t) read t[1] of a [1] theta as t[0]
                raise ValueError(
                    f"{self.name}: theta must be shaped like theta0 {np.shape(self.theta0)}, "
                    f"got {np.shape(theta)}"
                )
        theta = np.asarray(self.theta0 if theta is None else theta)
        check_discounts(self.name, self.gamma_F, self.gamma_L, self.horizon)
        th = jnp.asarray(theta)
        raw_A, raw_B = self.A_fn(th), self.B_fn(th)
        raw_quad = self.leader_quadratic(th)
        check_indexing_once(
            self,
            {
                "A(theta)": self.A_fn,
                "B(theta)": self.B_fn,
                "leader_quadratic(theta)": self.leader_quadratic,
                "components(theta)": self.components,
            },
            th,
        )
        # the Riccati loops carry theta's dtype: a matrix of a wider dtype (a float64 numpy
        # constant under jax_enable_x64 with a float32 theta) failed deep inside a while_loop
        # ("carry input and carry output must have equal types"); narrower is fine, and so is
        # the scalar c (it is only added to J)
        for label, x in (("A(theta)", raw_A), ("B(theta)", raw_B)) + tuple(
            (f"leader_quadratic(theta)'s {k}", v)
            for k, v in zip(("Ms", "Mb"), raw_quad, strict=False)
        ):
            check_not_wider(self.name, label, x, th.dtype)
        for label, x in (("A(theta)", raw_A), ("B(theta)", raw_B)):  # differentiated, carried
            check_floating(self.name, label, x)
        A = np.asarray(raw_A, np.float64)
        B = np.asarray(raw_B, np.float64)
        if A.ndim != 2 or A.shape[0] != A.shape[1] or A.shape[0] < 1:
            raise ValueError(f"{self.name}: A(theta) must have shape [n, n], got {A.shape}")
        n = A.shape[0]
        if B.ndim != 2 or B.shape[0] != n or B.shape[1] < 1:
            raise ValueError(
                f"{self.name}: A(theta) is {A.shape} and B(theta) is {B.shape}: B must be [n, m] "
                f"with A's n={n} (one of the two has the wrong state dimension; Qbar is "
                f"{np.shape(self.Qbar)}, init_cov {np.shape(self.init_cov)})"
            )
        m = B.shape[1]
        src = f"n={n} from A(theta), m={m} from B(theta)"
        self._check_constant_arrays(n, m, src)
        quadratics = {"leader_quadratic(theta)": raw_quad}
        if self.components is not None:  # a diagonal given as a vector broadcast, unsaid
            quadratics.update(
                (f"components(theta)[{name!r}]", q) for name, q in self.components(th).items()
            )
        for what, quad in quadratics.items():
            if len(quad) != 3:
                raise ValueError(f"{self.name}: {what} must be (Ms, Mb, c), got {len(quad)} items")
            for label, x, shape in zip(("Ms", "Mb", "c"), quad, ((n, n), (m, m), ()), strict=True):
                x = np.asarray(x, np.float64)
                check_shape(f"{self.name}: {what}'s {label}", x, shape, src)
                if not np.all(np.isfinite(x)):
                    raise ValueError(f"{self.name}: {what}'s {label} is not finite at {where}")
        if not np.all(np.isfinite(A)) or not np.all(np.isfinite(B)):
            raise ValueError(f"{self.name}: A(theta) or B(theta) is not finite at {where}")
        if not is_stabilizable(A, B, self.gamma_F):
            raise ValueError(
                f"{self.name}: (sqrt(gamma_F) A(theta), B(theta)) is not stabilisable "
                f"at {where}: the follower's Riccati equation has no stabilising solution"
            )
        self._check_closed_loop(theta, A, B)
        return self

    def check_constants(self) -> "LQConfigurableMDP":
        """The checks that do not depend on theta (no call of ``A_fn`` / ``B_fn``): discounts
        and horizon, Qbar [n, n] and Rbar [m, m] square (they give n and m here), U and
        init_cov [n, n], every array finite, the costs (Qbar PSD, Rbar PD), U a Cholesky
        factor and init_cov positive definite.

        The exact references and the best response run it once per problem object
        (:func:`bchg_jax.core.validate.check_constants_once`); :meth:`validate` runs it too,
        with n and m from the dynamics.

        Returns:
          ``self``.
        Raises:
          ValueError: the first failed check.
        """
        check_discounts(self.name, self.gamma_F, self.gamma_L, self.horizon)
        dims = []
        for label, x in (("Qbar", self.Qbar), ("Rbar", self.Rbar)):
            shape = np.shape(x)
            if len(shape) != 2 or shape[0] != shape[1] or shape[0] < 1:
                raise ValueError(f"{self.name}: {label} must be a square matrix, got {shape}")
            dims.append(shape[0])
        n, m = dims
        self._check_constant_arrays(n, m, f"n={n} from Qbar, m={m} from Rbar")
        return self

    def _check_constant_arrays(self, n: int, m: int, src: str) -> None:
        """Qbar, Rbar, U, init_cov: shapes against (n, m), finite, the costs, U a Cholesky
        factor, init_cov positive definite."""
        Q, R, U, C0 = (
            np.asarray(x, np.float64) for x in (self.Qbar, self.Rbar, self.U, self.init_cov)
        )
        for label, x, shape in (
            ("Qbar", Q, (n, n)),
            ("Rbar", R, (m, m)),
            ("U", U, (n, n)),
            ("init_cov", C0, (n, n)),
        ):
            check_shape(f"{self.name}: {label}", x, shape, src)
            if not np.all(np.isfinite(x)):
                raise ValueError(f"{self.name}: {label} is not finite")
        check_costs(self.name, Q, R)
        if not np.allclose(U, np.tril(U)) or np.any(np.abs(np.diagonal(U)) <= 0):
            raise ValueError(
                f"{self.name}: U must be lower-triangular with a non-zero diagonal "
                "(a Cholesky factor of the noise covariance)"
            )
        if not np.allclose(C0, C0.T) or np.linalg.eigvalsh(C0).min() <= 0:
            raise ValueError(f"{self.name}: init_cov must be symmetric positive definite")

    def _check_closed_loop(self, theta, A: np.ndarray, B: np.ndarray) -> None:
        """The follower's closed loop F = A - B K at theta (Proposition 1; K does not depend on
        beta) must be stable under both discounts: ``gamma rho(F)^2 < 1``, so that the
        infinite-horizon sums behind J_L, the critics and the follower's values converge
        (:func:`bchg_jax.core.stability.discounted_lyapunov`). The iteration's limit is found
        by doubling
        (numpy, float64, from Qbar like the trainer's); skipped only when it diverges (an
        unstabilisable pair, refused before this)."""
        K = _riccati_gain(
            A,
            B,
            np.asarray(self.Qbar, np.float64),
            np.asarray(self.Rbar, np.float64),
            float(self.gamma_F),
        )
        if K is None:
            return
        rho = float(np.max(np.abs(np.linalg.eigvals(A - B @ K))))
        for label, g, why in (
            (
                "gamma_F",
                self.gamma_F,
                "the follower's Riccati solution does not stabilise the system (a growing mode "
                "that Qbar does not penalise: (Qbar^(1/2), sqrt(gamma_F) A) is not detectable); "
                "penalise that mode in Qbar",
            ),
            (
                "gamma_L",
                self.gamma_L,
                "the state grows faster than the leader discounts it, so the infinite-horizon "
                "J_L and the leader's critics diverge; use a smaller gamma_L or a theta at "
                "which the follower's closed loop is stable",
            ),
        ):
            if float(g) * rho**2 >= 1.0:
                raise ValueError(
                    f"{self.name}: the follower's closed loop A(theta) - B(theta) K diverges "
                    f"under {label}: spectral radius {rho:.4g}, {label} rho^2 = "
                    f"{float(g) * rho**2:.4g} >= 1: {why}"
                )


def check_policy_fits(problem: LQConfigurableMDP, policy, what: str = "policy") -> None:
    """Trace-time check that a Gaussian follower ``policy`` (gain ``K`` [m, n], ``cov``
    [m, m]) fits ``problem``'s sizes: a response of another problem is named, not a matmul
    error deep inside.

    When concrete, the gain must be finite and the covariance a covariance: finite, symmetric
    and positive definite (``-cov`` gave a finite gradient of no policy, and ``0`` an error
    that blamed a stable closed loop's overflow).

    Raises:
      ValueError: ``K`` or ``cov`` of another shape; concrete: a non-finite ``K``, or a ``cov``
        that is not finite, symmetric and positive definite.
    """
    n, m = problem.state_dim, problem.action_dim
    src = f"n={n}, m={m} from {problem.name}"
    check_shape(f"{what}.K (the follower's gain)", policy.K, (m, n), src)
    check_shape(f"{what}.cov", policy.cov, (m, m), src)
    if not is_concrete(policy.K, policy.cov):
        return
    K, C = np.asarray(policy.K, np.float64), np.asarray(policy.cov, np.float64)
    if not np.all(np.isfinite(K)):
        raise ValueError(f"{problem.name}: {what}.K (the follower's gain) must be finite, got {K}")
    scale = float(np.max(np.abs(C))) if np.all(np.isfinite(C)) else np.nan
    if not np.max(np.abs(C - C.T)) <= 1e-5 * scale:  # NaN (a non-finite entry) fails too
        raise ValueError(f"{problem.name}: {what}.cov must be a finite symmetric matrix, got {C}")
    low = float(np.linalg.eigvalsh(C)[0])
    if not low > 0:
        raise ValueError(
            f"{problem.name}: {what}.cov must be positive definite (the covariance of the "
            f"follower's Gaussian policy), got smallest eigenvalue {low:.3g}"
        )
