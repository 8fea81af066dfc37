"""Exact references for linear-Gaussian configurable MDPs (the ground truth of the estimator
tests): J_L of Eq. (leader-utility) in closed form and its hypergradient by autodiff.

Under the max-ent LQR best response ``b = -K s + eps``, ``eps ~ N(0, Sigma_b)``, the closed loop is
``s' = F s + B eps + w`` with ``F = A - B K``: the state stays zero-mean Gaussian with covariance
``Sigma_{t+1} = F Sigma_t F^T + W``, ``W = B Sigma_b B^T + U U^T``, ``Sigma_0 = init_cov``.
A quadratic leader reward ``r = -s^T Ms s - b^T Mb b + c`` has the per-step expectation
``E r_t = -tr(G Sigma_t) - tr(Mb Sigma_b) + c`` with ``G = Ms + K^T Mb K``, so

* finite horizon H (the metric; episodes of H steps):
  ``J_L = sum_{t<H} gamma^t E r_t`` (a scan over covariances);
* infinite horizon: ``J_L = -tr(G X) + (c - tr(Mb Sigma_b)) / (1 - gamma)`` with the discounted
  Lyapunov equation ``X = Sigma_0 + gamma F X F^T + gamma W / (1 - gamma)``.

``leader_value_quadratic`` gives the exact V_L(s) = -s^T Pv s + v0 and Q_L(s, b) (infinite horizon),
the critics' exact counterparts used in tests. Gradients are ``jax.grad`` through the Riccati
solution (implicit differentiation) - the references every estimator is tested against.
"""

from __future__ import annotations

import inspect
from typing import Dict, NamedTuple, Optional

import jax
import jax.numpy as jnp
import numpy as np

from bchg_jax.core.eager import cached_when_eager, theta_precheck
from bchg_jax.core.maxent_lqr import GaussianBestResponse, nan_unless, nan_unless_converged
from bchg_jax.core.precision import full_precision
from bchg_jax.core.stability import (  # noqa: F401 (re-exported: lq.exact's own names before)
    discounted_lyapunov,
    is_discounted_stable,
    log_spectral_radius,
)
from bchg_jax.core.validate import (
    check_beta_if_concrete,
    check_constants_once,
    check_count,
    check_problem_settings,
    check_shape,
    check_theta,
    is_concrete,
)
from bchg_jax.lq.cmdp import LQConfigurableMDP, check_policy_fits

Array = jax.Array


@full_precision
def closed_loop_matrix(problem: LQConfigurableMDP, theta: Array, K: Array) -> Array:
    """F = A(theta) - B(theta) K: the closed loop of the follower's gain K [m, n] -> [n, n]
    (at full precision: the trainers' stability flag reads it)."""
    return problem.A_fn(theta) - problem.B_fn(theta) @ K


def _closed_loop(problem: LQConfigurableMDP, theta: Array, br: GaussianBestResponse):
    B = problem.B_fn(theta)
    U = jnp.asarray(problem.U, theta.dtype)
    F = closed_loop_matrix(problem, theta, br.K)
    W = B @ br.cov @ B.T + U @ U.T
    return F, W


@full_precision
def discounted_state_covariance(
    problem: LQConfigurableMDP, theta: Array, br: GaussianBestResponse, horizon: Optional[int]
) -> Array:
    """X = sum_{t<H} gamma_L^t Sigma_t (``horizon=None``: H = infinity).

    Args:
      problem: the configurable MDP. theta: [d] leader parameters.
      br: the follower's Gaussian best response at theta.
      horizon: H, or None for the infinite horizon (discounted Lyapunov equation).
    Returns:
      [n, n] discounted sum of the state covariances Sigma_t (Sigma_0 = init_cov).
    """
    F, W = _closed_loop(problem, theta, br)
    g = problem.gamma_L
    C0 = jnp.asarray(problem.init_cov, theta.dtype)
    if horizon is None:
        return discounted_lyapunov(F, C0 + g / (1.0 - g) * W, g)

    def body(c, _):
        Sig, X, d = c
        return (F @ Sig @ F.T + W, X + d * Sig, d * g), None

    (_, X, _), _ = jax.lax.scan(
        body, (C0, jnp.zeros_like(C0), jnp.ones((), theta.dtype)), None, length=horizon
    )
    return X


def _check_args(problem: LQConfigurableMDP, beta=None, horizon="default", theta=None) -> None:
    """The problem's scalar settings, a concrete beta (> 0; None: not checked), ``horizon``
    (``"default"``, None or a positive integer) and ``theta`` (shaped like theta0, finite)."""
    check_problem_settings(problem)
    check_constants_once(problem)
    if theta is not None:
        check_theta(problem, theta)
    if beta is not None:
        check_beta_if_concrete(beta)
    if not (horizon is None or (isinstance(horizon, str) and horizon == "default")):
        check_count('horizon ("default", None or a positive integer)', horizon)


def leader_pieces(problem: LQConfigurableMDP, theta: Array):
    """``problem.leader_quadratic(theta)`` = (Ms [n, n], Mb [m, m], c []), its shapes checked
    (also under a trace) against n, m of Qbar, Rbar: a wrong one failed inside JAX.

    Raises:
      ValueError: a piece of the wrong shape, naming it.
    """
    Ms, Mb, c = problem.leader_quadratic(theta)
    n, m = np.shape(problem.Qbar)[0], np.shape(problem.Rbar)[0]
    for label, x, shape in (("Ms", Ms, (n, n)), ("Mb", Mb, (m, m)), ("c", c, ())):
        label = f"{problem.name}: leader_quadratic(theta)'s {label}"
        check_shape(label, x, shape, f"n={n} from Qbar, m={m} from Rbar")
    return Ms, Mb, c


def refuse_divergence(
    problem: LQConfigurableMDP, theta: Array, br: GaussianBestResponse, horizon, value, caller: str
) -> None:
    """A concrete non-finite ``value`` (a return, gradient or value matrix) from a finite
    follower: the closed loop ``F = A(theta) - B(theta) K`` grows faster than gamma_L discounts
    it (``horizon=None``: the discounted sum diverges) or the state's covariance overflowed
    the dtype within the finite ``horizon``. Raises, naming the spectral radius, rather than
    returning NaN or -inf (or naming ``A(theta)``, ``B(theta)`` or the leader's quadratic when
    one of them is not finite); a traced value is left as it is (NaN)."""
    if not is_concrete(value, theta, br) or np.all(np.isfinite(np.asarray(value))):
        return
    if not np.all(np.isfinite(np.asarray(br.K))):
        return  # the follower's own failure: nan_unless_converged names it
    # a non-finite input is named first: a NaN in the leader's quadratic would otherwise be
    # reported as a diverging closed loop (a problem that was never validated)
    pieces = zip(("Ms", "Mb", "c"), problem.leader_quadratic(theta), strict=False)
    for label, x in (("A(theta)", problem.A_fn(theta)), ("B(theta)", problem.B_fn(theta))) + tuple(
        (f"leader_quadratic(theta)'s {k}", v) for k, v in pieces
    ):
        if not np.all(np.isfinite(np.asarray(x, np.float64))):
            raise ValueError(
                f"{caller}: {problem.name}: {label} is not finite at this theta, so neither "
                "is the result (LQConfigurableMDP.validate(theta) checks a problem's pieces)"
            )
    F = np.asarray(closed_loop_matrix(problem, theta, br.K), np.float64)
    rho = float(np.max(np.abs(np.linalg.eigvals(F))))
    g, gF = float(problem.gamma_L), float(problem.gamma_F)
    if gF * rho**2 >= 1:
        # a played policy (not a best response, whose loop is stable under gamma_F by
        # construction): its own value, a Lyapunov sum under gamma_F, diverges first
        raise ValueError(
            f"{caller}: {problem.name}: the follower's closed loop A(theta) - B(theta) K has "
            f"spectral radius {rho:.4g} under this theta; gamma_F rho^2 = {gF * rho**2:.4g} "
            ">= 1, so the follower's value of this policy (a discounted sum under gamma_F) "
            "diverges. Take a follower policy whose closed loop is stable under gamma_F"
        )
    why = (
        f"gamma_L rho^2 = {g * rho**2:.4g} >= 1, so the infinite-horizon return diverges"
        if horizon is None
        else f"the state's covariance grows like rho^(2t) and overflows "
        f"{jnp.result_type(value)} within the horizon {horizon}"
    )
    raise ValueError(
        f"{caller}: {problem.name}: the follower's closed loop A(theta) - B(theta) K has "
        f"spectral radius {rho:.4g} under this theta; {why}. Take a theta whose closed loop is "
        "stable under gamma_L (LQConfigurableMDP.validate checks theta0's), a shorter horizon, "
        "or float64"
    )


def _discount_mass(gamma, horizon, dtype):
    if horizon is None:
        return jnp.asarray(1.0 / (1.0 - gamma), dtype)
    return jnp.asarray((1.0 - gamma**horizon) / (1.0 - gamma), dtype)


@full_precision
def quadratic_return(Ms, Mb, c, br: GaussianBestResponse, X: Array, mass) -> Array:
    """sum_t gamma^t E[-s^T Ms s - b^T Mb b + c] given X = sum_t gamma^t Sigma_t.

    Args:
      Ms: [n, n]. Mb: [m, m]. c: [] the quadratic reward's terms.
      br: the follower's Gaussian best response (``K`` [m, n], ``cov`` [m, m]).
      X: [n, n] from :func:`discounted_state_covariance`.
      mass: [] sum_t gamma^t over the same horizon.
    Returns:
      [] discounted expected return.
    """
    G = Ms + br.K.T @ Mb @ br.K
    return -jnp.trace(G @ X) + mass * (c - jnp.trace(Mb @ br.cov))


def _objective_precheck(*args, **kwargs) -> None:
    """:func:`leader_objective`'s eager checks before a cached call: theta, and a ``br`` given
    (traced in the program, so its values are checked here)."""
    bound = inspect.signature(leader_objective.__wrapped__).bind(*args, **kwargs).arguments
    theta_precheck(bound["problem"], bound["theta"])
    if bound.get("br") is not None:
        check_policy_fits(bound["problem"], bound["br"], "br")


@cached_when_eager(_objective_precheck)
@full_precision
def leader_objective(
    problem: LQConfigurableMDP,
    theta: Array,
    beta,
    horizon="default",
    br: Optional[GaussianBestResponse] = None,
    tol: float = 1e-6,
    max_iters: int = 50_000,
) -> Array:
    """Exact J_L(theta, g^{theta dagger}) (Eq. (leader-utility)) under the follower's best response.

    The closed loop under Proposition 1 is linear-Gaussian, so the discounted leader return is
    ``-tr(G X) + mass (c - tr(Mb Sigma_b))`` (module docstring). Differentiable in theta
    (implicitly through the Riccati solution when ``br`` is None).

    Args:
      problem: the :class:`~bchg_jax.lq.cmdp.LQConfigurableMDP`.
      theta: [d] leader parameters.
      beta: the follower's entropy weight (> 0), scalar.
      horizon: ``"default"`` (the problem's episode length), an int H, or None (infinite).
      br: the follower's best response at theta; solved here (Proposition 1) when None.
      tol: Riccati stopping tolerance. max_iters: Riccati iteration cap.
    Returns:
      [] the leader's discounted (gamma_L) expected return from s_0 ~ N(0, init_cov); when
      ``br`` is None, NaN (and a NaN gradient) if the solve here did not converge and the
      arguments are traced (under ``jit`` / ``vmap`` / ``grad``); NaN (traced) where the closed
      loop diverges under gamma_L (``horizon=None``) or the covariance overflows. A ``br``
      given is evaluated as it is (check ``br.converged``).
    Raises:
      ValueError: a concrete ``beta`` not finite and > 0, a bad ``horizon``, a bad scalar
        setting of ``problem`` (a discount outside [0, 1), ...), a ``br`` whose gain or
        covariance does not fit the problem, a concrete solve here that did not converge, or
        a concrete return that is not finite (:func:`refuse_divergence`).
    """
    _check_args(problem, beta, horizon, theta)
    H = problem.horizon if horizon == "default" else horizon
    solved = br is None
    if not solved:
        check_policy_fits(problem, br, "br")
    br = problem.best_response(theta, beta, tol=tol, max_iters=max_iters) if solved else br
    X = discounted_state_covariance(problem, theta, br, H)
    Ms, Mb, c = leader_pieces(problem, theta)
    J = quadratic_return(Ms, Mb, c, br, X, _discount_mass(problem.gamma_L, H, theta.dtype))
    if not solved:  # the policy given is evaluated as it is (the trainer flags its own solves)
        refuse_divergence(problem, theta, br, H, J, "lq.leader_objective")
        return J
    J = nan_unless_converged(br, J, "lq.leader_objective: the follower's Riccati iteration")
    refuse_divergence(problem, theta, br, H, J, "lq.leader_objective")
    return J


@cached_when_eager(theta_precheck)
@full_precision
def exact_hypergradient(
    problem: LQConfigurableMDP,
    theta: Array,
    beta,
    horizon="default",
    tol: float = 1e-6,
    max_iters: int = 50_000,
) -> Array:
    """Exact hypergradient grad_theta J_L(theta, g^{theta dagger}) by autodiff.

    The reference that Theorem 1's estimator (:func:`bchg_jax.lq.estimators.hypergradient`) is
    tested against: ``jax.grad`` of :func:`leader_objective` through the Riccati solution
    (implicit differentiation), so the follower's response to theta is included.

    Args:
      problem: the configurable MDP. theta: [d] leader parameters.
      beta: the follower's entropy weight, scalar.
      horizon: as :func:`leader_objective`.
      tol: Riccati stopping tolerance. max_iters: Riccati iteration cap.
    Returns:
      [d] gradient (like ``theta``); NaN when the Riccati iteration did not converge or J_L is
      not finite (traced).
    Raises:
      ValueError: as :func:`leader_objective` (a concrete ``theta`` and ``beta`` whose solve
        did not converge included).
    """
    _check_args(problem, beta, horizon, theta)

    what = "lq.exact_hypergradient: the follower's Riccati iteration"

    def J(th):
        br = problem.best_response(th, beta, tol=tol, max_iters=max_iters)
        # dynamics that do not depend on theta give a concrete solve inside grad: its failure
        # is named here (leader_objective's check of a br given blamed its NaN gain)
        if is_concrete(br.K, br.info):
            nan_unless_converged(br, br.K, what)
        return leader_objective(problem, th, beta, horizon, br=br), br

    (value, br), grad = jax.value_and_grad(J, has_aux=True)(theta)
    grad = nan_unless_converged(br, grad, what)
    # a J that is not finite has no gradient, though its pieces' derivatives may be finite
    # (c(theta) = log(theta_0 - 1) at theta_0 < 1): NaN, and refused below when concrete
    grad = nan_unless(jnp.isfinite(value), grad)
    H = problem.horizon if horizon == "default" else horizon
    refuse_divergence(problem, theta, br, H, grad, "lq.exact_hypergradient")
    return grad


def _signed_values(quadratics: Dict[str, tuple], br, X: Array, mass) -> Dict[str, Array]:
    """{name: value} of each quadratic term given X and the discount mass, with the sign of a
    reward for ``stability`` and of a cost (positive) otherwise (:func:`components`)."""
    out = {}
    for name, (Ms, Mb, c) in quadratics.items():
        val = quadratic_return(Ms, Mb, c, br, X, mass)
        out[name] = val if name == "stability" else -val
    return out


@full_precision
def components(
    problem: LQConfigurableMDP,
    theta: Array,
    br: GaussianBestResponse,
    quadratics: Dict[str, tuple],
    horizon="default",
) -> Dict[str, Array]:
    """Discounted cumulative value of each named quadratic reward term, reported as the
    magnitude of ``sum_t gamma^t E[s^T Ms s + b^T Mb b - c]`` with the sign of a *reward* for
    terms named ``stability`` (maximised) and of a *cost* otherwise (minimised, positive).

    Args:
      problem: the configurable MDP. theta: [d] leader parameters.
      br: the follower's best response at theta.
      quadratics: {name: (Ms [n, n], Mb [m, m], c [])}, e.g. ``problem.components(theta)``.
      horizon: as :func:`leader_objective`.
    Returns:
      {name: [] value}.
    Raises:
      ValueError: a bad ``horizon`` or a bad scalar setting of ``problem``.
    """
    _check_args(problem, None, horizon, theta)
    H = problem.horizon if horizon == "default" else horizon
    X = discounted_state_covariance(problem, theta, br, H)
    mass = _discount_mass(problem.gamma_L, H, theta.dtype)
    refuse_divergence(problem, theta, br, H, X, "lq.components")
    return _signed_values(quadratics, br, X, mass)


@full_precision
def objective_and_components(
    problem: LQConfigurableMDP,
    theta: Array,
    br: GaussianBestResponse,
    quadratics: Dict[str, tuple],
    horizon="default",
):
    """(J, {name: value}): :func:`leader_objective` with the ``br`` given and
    :func:`components`, from one discounted state-covariance sum where the two ran it twice (a
    scan of ``horizon`` steps for a finite horizon; XLA does not merge two such loops inside a
    trainer's program). The trainer's metrics at every iteration.

    Args:
      problem, theta, br, quadratics, horizon: as :func:`components`.
    Returns:
      ([] the leader's return, {name: [] value}).
    Raises:
      ValueError: as :func:`leader_objective` and :func:`components`.
    """
    _check_args(problem, None, horizon, theta)
    check_policy_fits(problem, br, "br")
    H = problem.horizon if horizon == "default" else horizon
    X = discounted_state_covariance(problem, theta, br, H)
    mass = _discount_mass(problem.gamma_L, H, theta.dtype)
    J = quadratic_return(*problem.leader_quadratic(theta), br, X, mass)
    refuse_divergence(problem, theta, br, H, J, "lq.objective_and_components")
    return J, _signed_values(quadratics, br, X, mass)


class QuadraticValue(NamedTuple):
    """V_L(s) = -s^T Pv s + v0 and Q_L(s, b) = r_L(s, b) + gamma E V_L(A s + B b + w).

    Exact infinite-horizon leader critics; ``value(s)``: s [..., n] -> [...];
    ``q(s, b)``: s [..., n], b [..., m] -> [...].
    """

    Pv: Array
    v0: Array
    A: Array
    B: Array
    UUt: Array
    Ms: Array
    Mb: Array
    c: Array
    gamma: float

    @full_precision
    def value(self, s):
        return -jnp.einsum("...i,ij,...j->...", s, self.Pv, s) + self.v0

    @full_precision
    def q(self, s, b):
        x = s @ self.A.T + b @ self.B.T
        EV = (
            -jnp.einsum("...i,ij,...j->...", x, self.Pv, x)
            - jnp.trace(self.Pv @ self.UUt)
            + self.v0
        )
        r = (
            -jnp.einsum("...i,ij,...j->...", s, self.Ms, s)
            - jnp.einsum("...i,ij,...j->...", b, self.Mb, b)
            + self.c
        )
        return r + self.gamma * EV


@full_precision
def leader_value_quadratic(
    problem: LQConfigurableMDP, theta: Array, br: GaussianBestResponse
) -> QuadraticValue:
    """Exact infinite-horizon V_L and Q_L of the leader under the follower ``br``.

    Args:
      problem: the configurable MDP. theta: [d] leader parameters.
      br: the follower's Gaussian best response at theta.
    Returns:
      :class:`QuadraticValue` (``Pv`` [n, n], ``v0`` []).
    """
    F, W = _closed_loop(problem, theta, br)
    g = problem.gamma_L
    Ms, Mb, c = problem.leader_quadratic(theta)
    G = Ms + br.K.T @ Mb @ br.K
    Pv = discounted_lyapunov(F.T, G, g)  # Pv = G + g F^T Pv F
    refuse_divergence(problem, theta, br, None, Pv, "lq.leader_value_quadratic")
    v0 = (c - jnp.trace(Mb @ br.cov) - g * jnp.trace(Pv @ W)) / (1.0 - g)
    U = jnp.asarray(problem.U, theta.dtype)
    return QuadraticValue(Pv, v0, problem.A_fn(theta), problem.B_fn(theta), U @ U.T, Ms, Mb, c, g)
