"""Exact leader return and hypergradient of the bi-level LQR Markov game (the references of
Theorem 2's and Theorem 3's estimators).

Under the leader ``a = K s + U eps_a`` and the best response ``b = -K_s s - K_a a + L eps_b`` the
closed loop is linear-Gaussian (:func:`closed_loop`):
``s' = F s + (C - B K_a) U eps_a + B L eps_b``, ``F = A + C K - B (K_s + K_a K)``,
so from the fixed ``s0`` the state is ``N(mu_t, Sigma_t)`` with ``mu_{t+1} = F mu_t``,
``Sigma_{t+1} = F Sigma_t F^T + N`` (:func:`state_moments`). The Gaussian bump has the closed-form
expectation (:func:`expected_bump`)
``E exp(-1/2 (s - s*)^T W (s - s*))
= det(I + Sigma_t W)^{-1/2} exp(-1/2 d^T (I + W Sigma_t)^{-1} W d)``
with ``d = mu_t - s*``. Summing over the horizon gives the leader's return
(:func:`leader_objective`);
its gradient by autodiff through the moments and the Riccati solution (implicit) is the exact
hypergradient (:func:`exact_hypergradient`). :func:`leader_q` gives exact finite-horizon critics
``Q_L^(h)(s, a, b) = r_L(s) + gamma V_L^(h-1)(A s + B b + C a)`` for any batch of samples (the
conditional mean from a state ``x`` is ``F^t x`` and the covariance does not depend on ``x``).

**Square-root form.** The game is valid whenever the follower can answer (``gamma_F rho(F)^2 <
1``), so ``F`` itself may be unstable (``rho(F) > 1``): the leader's return stays finite because
the bump's expectation decays as the state spreads. ``Sigma_t`` then grows like ``rho^(2t)``
while its other eigenvalues stay O(1), and the plain recursion ``F Sigma F^T + N`` loses them to
rounding (float64: an eigenvalue -1.5 next to 1.5e16 at step 80 of a game with rho(F) = 1.285,
and det(I + W Sigma) < 0: NaN). The moments are therefore carried as a square root
``Sigma_t = L_t L_t^T`` (:func:`state_factors`), ``L_{t+1}`` the triangular factor of the QR of
``[F L_t, N^(1/2)]^T`` (:func:`closed_loop_factor`), and the bump is evaluated through the QR of
``[I; (V^T L_t)^T]``, ``V V^T = W``: its ``R`` has ``R^T R = I + V^T Sigma_t V``, positive
definite by construction, so ``log det(I + W Sigma_t) = 2 sum log|R_ii|`` and the quadratic form
``|R^{-T} V^T d|^2`` never see a cancellation. Only ``L_t L_t^T`` enters the result, so the
factor step's derivative is taken as ``dL = dX Q`` (Q of the same QR), which is exact for
``Sigma`` also where the factor is singular (a deterministic leader: N of rank m < n).
"""

from __future__ import annotations

import math
import warnings

import jax
import jax.numpy as jnp
import numpy as np

from bchg_jax.core.eager import cached_when_eager
from bchg_jax.core.maxent_lqr import nan_unless_converged
from bchg_jax.core.precision import full_precision
from bchg_jax.core.validate import (
    check_beta_if_concrete,
    check_constants_once,
    check_count,
    check_discount,
    check_if_concrete,
    check_int_range,
    check_problem_settings,
    check_shape,
    is_concrete,
)
from bchg_jax.games.estimators import (
    continuous_hypergradient,
    deterministic_hypergradient,
    game_score_weights,
)
from bchg_jax.games.lqr.follower import (
    GameResponse,
    best_response,
    follower_q,
    follower_state_value,
    follower_value,
)
from bchg_jax.games.lqr.game import (
    LQRGame,
    check_game_theta,
    leader_gain,
    leader_log_prob,
    leader_reward,
    transition,
)
from bchg_jax.games.lqr.rollout import rollout

# exact_critic_estimate warns when the follower's influence sums lose more discount weight than
# this to the end of the episodes (gamma_F ** extra_steps): they stand for infinite sums
INFLUENCE_CUT_WARN = 1e-3

# the float32 exact hypergradient warns (float32_cancellation) above this eps * cancellation *
# |F|_2^2. Calibrated on the preset game (problems/lqr_game.py, beta 0.1) over 990 valid gains
# |K_1| <= 100, |K_2| <= 60: every gain whose float32 gradient is > 1% off the float64 one has
# an indicator >= 9.2e-4 (331 gains, all |K| >= 56), every |K| <= 20 (the paper's region) one
# <= 5.9e-5; the error is 0.9x the indicator (median) to 15x (99%)
FLOAT32_CANCELLATION_WARN = 3e-4


def influence_steps(game: LQRGame) -> int:
    """The fewest extra steps k whose cut leaves at most :data:`INFLUENCE_CUT_WARN` of the
    follower's influence sums' discount weight (``gamma_F ** k``): what
    :func:`exact_critic_estimate` needs to stay quiet, and ``check_problem``'s default."""
    gF = float(game.gamma_F)
    return 0 if gF == 0 else math.ceil(math.log(INFLUENCE_CUT_WARN) / math.log(gF))


Array = jax.Array


def _as_count(name: str, value):
    """``value`` as a Python int when it is a concrete integer scalar of numpy or JAX (a
    ``jnp.int32(10)`` horizon), checked as a positive integer
    (:func:`~bchg_jax.core.validate.check_count`); None stays None.

    Raises:
      ValueError: anything but an integer >= 1 (a float, a bool, an array of several entries).
    """
    if value is None:
        return None
    if (
        isinstance(value, (np.ndarray, np.generic, jax.Array))
        and is_concrete(value)
        and np.ndim(value) == 0
        and jnp.issubdtype(jnp.result_type(value), jnp.integer)
    ):
        value = int(value)
    check_count(name, value)
    return value


def _check_args(game: LQRGame, beta=None, horizon=None, gamma=None, theta=None):
    """The game's scalar settings, a concrete beta (> 0), a horizon (a positive integer, also a
    numpy / JAX integer scalar), a concrete return discount gamma (in [0, 1]: a finite-horizon
    sum may be undiscounted) and theta ([k * n], finite, an array); None skips an argument.
    Returns the horizon as a Python int (None stays None)."""
    check_problem_settings(game)
    check_constants_once(game)
    if theta is not None:
        check_game_theta(game, theta)
    if beta is not None:
        check_beta_if_concrete(beta)
    horizon = _as_count("horizon", horizon)
    if gamma is not None:
        check_if_concrete(check_discount, "gamma (the leader return's discount)", gamma, True)
    return horizon


@full_precision
def closed_loop_factor(game: LQRGame, theta: Array, resp: GameResponse, stochastic: bool = True):
    """(F, N^(1/2)): the closed-loop matrix and a square root of the per-step noise covariance.

    Args:
      game: the LQR game. theta: [k * n] leader parameters.
      resp: the follower's best response at theta.
      stochastic: include the leader's noise U (False: deterministic leader, zero columns).
    Returns:
      (F [n, n] = A + C K - B (K_s + K_a K), G [n, k + m] = [(C - B K_a) U, B chol(cov)]
      with ``N = G G^T``).
    """
    dt = theta.dtype
    A, B, C, _, _ = game.arrays(dt)
    K = leader_gain(game, theta)
    F = A + C @ K - B @ (resp.K_s + resp.K_a @ K)
    G = (C - B @ resp.K_a) @ jnp.asarray(game.U, dt) * (1.0 if stochastic else 0.0)
    return F, jnp.concatenate([G, B @ resp.chol], -1)


@full_precision
def closed_loop(game: LQRGame, theta: Array, resp: GameResponse, stochastic: bool = True):
    """(F, N): the closed-loop matrix and the per-step noise covariance.

    Args:
      game: the LQR game. theta: [k * n] leader parameters.
      resp: the follower's best response at theta.
      stochastic: include the leader's noise U (False: deterministic leader).
    Returns:
      (F [n, n] = A + C K - B (K_s + K_a K), N [n, n] symmetric noise covariance; N = G G^T
      with G from :func:`closed_loop_factor`).
    """
    F, G = closed_loop_factor(game, theta, resp, stochastic)
    return F, G @ G.T


def householder_qr(Y: Array, with_q: bool = True):
    """Reduced QR of ``Y`` [..., r, n] (r >= n, n small) by Householder reflections written as
    array operations (a Python loop over the n columns): Q [..., r, n] (None unless
    ``with_q``), R [..., n, n] upper-triangular, ``Y = Q R``. No LAPACK call, so it runs inside
    the moments' scan on any backend without a kernel launch per step (jaxlib's CPU QR costs
    ~8 us a call there, cuSOLVER more). Each column's norm is taken after scaling by its largest
    entry (no overflow of the squares); a zero column gives a zero row of R. Differentiable
    where Y has full column rank."""
    r, n = Y.shape[-2:]
    A, reflectors = Y, []
    for j in range(n):
        x = A[..., j:, j]
        m = jax.lax.stop_gradient(jnp.max(jnp.abs(x), -1, keepdims=True))
        m = jnp.where(m > 0, m, 1.0)
        alpha = m[..., 0] * jnp.sqrt(jnp.sum((x / m) ** 2, -1))
        sign = jnp.where(x[..., 0] >= 0, 1.0, -1.0).astype(Y.dtype)
        v = x.at[..., 0].add(sign * alpha) / m  # scaled: H = I - 2 v v^T / |v|^2 is unchanged
        vv = jnp.sum(v * v, -1)
        beta = jnp.where(vv > 0, 2.0 / jnp.where(vv > 0, vv, 1.0), 0.0)
        sub = A[..., j:, :]
        sub = (
            sub
            - (beta[..., None] * v)[..., :, None]
            * jnp.einsum("...i,...ij->...j", v, sub)[..., None, :]
        )
        A = A.at[..., j:, :].set(sub)
        reflectors.append((v, beta))
    R = jnp.triu(A[..., :n, :])
    if not with_q:
        return None, R
    Q = jnp.broadcast_to(jnp.eye(r, n, dtype=Y.dtype), Y.shape)
    for j in reversed(range(n)):
        v, beta = reflectors[j]
        sub = Q[..., j:, :]
        sub = (
            sub
            - (beta[..., None] * v)[..., :, None]
            * jnp.einsum("...i,...ij->...j", v, sub)[..., None, :]
        )
        Q = Q.at[..., j:, :].set(sub)
    return Q, R


def upper_inverse(R: Array) -> Array:
    """R^{-1} [..., n, n] of an upper-triangular, non-singular ``R`` by back substitution written
    as array operations (a Python loop over the n rows; no LAPACK call)."""
    n = R.shape[-1]
    eye = jnp.broadcast_to(jnp.eye(n, dtype=R.dtype), R.shape)
    rows = [None] * n
    for i in reversed(range(n)):
        rest = eye[..., i, :]
        if i + 1 < n:
            done = jnp.stack(rows[i + 1 :], -2)  # [..., n - i - 1, n]
            rest = rest - jnp.einsum("...k,...kj->...j", R[..., i, i + 1 :], done)
        rows[i] = rest / R[..., i, i : i + 1]
    return jnp.stack(rows, -2)


@jax.custom_jvp
@full_precision
def square_factor(X: Array) -> Array:
    """L [n, n] with ``L L^T = X X^T`` for ``X`` [n, r], r >= n: the transposed R of the QR of
    ``X^T`` (:func:`householder_qr`; the covariance step ``F S F^T + N`` in square-root form,
    with ``X = [F L, G]``).

    PSD by construction, and backward stable: an eigenvalue of ``X X^T`` far below the largest
    keeps its value, where forming ``F S F^T + N`` loses it. Derivative: ``dL = dX Q`` (Q of the
    same QR): ``L L^T`` has the exact derivative ``dX X^T + X dX^T`` (``Q Q^T X^T = X^T``), and
    nothing downstream depends on L other than through ``L L^T``; it exists where the factor is
    singular (the QR's own derivative needs an invertible R). Batched over leading axes.
    """
    return jnp.swapaxes(householder_qr(jnp.swapaxes(X, -1, -2), with_q=False)[1], -1, -2)


@square_factor.defjvp
@full_precision  # traced when a jaxpr holding it is differentiated: after any caller's scope
def _square_factor_jvp(primals, tangents):
    (X,), (dX,) = primals, tangents
    q, r = householder_qr(jnp.swapaxes(X, -1, -2))
    return jnp.swapaxes(r, -1, -2), dX @ q


@full_precision
def state_factors(F: Array, G: Array, s0: Array, horizon: int):
    """Means [T, n] and square roots [T, n, n] of the covariances of s_0..s_{T-1} from ``s0``.

    ``Sigma_t = L_t L_t^T`` with ``L_0 = 0`` and ``L_{t+1} = square_factor([F L_t, G])``
    (module docstring, "Square-root form").

    Args:
      F: [n, n] closed-loop matrix. G: [n, r] square root of the noise covariance (N = G G^T).
      s0: [n] initial state. horizon: T.
    Returns:
      (mu [T, n], L [T, n, n]).
    """

    def body(c, _):
        mu, L = c
        return (F @ mu, square_factor(jnp.concatenate([F @ L, G], -1))), (mu, L)

    n = s0.shape[-1]
    _, (mu, L) = jax.lax.scan(body, (s0, jnp.zeros((n, n), s0.dtype)), None, length=horizon)
    return mu, L


@full_precision
def state_moments(F: Array, N: Array, s0: Array, horizon: int):
    """Means [T, n] and covariances [T, n, n] of s_0..s_{T-1} from the fixed state ``s0``.

    Propagated in square-root form (:func:`state_factors`; ``N`` is factored once, by ``eigh``:
    not differentiable where N has a repeated eigenvalue, e.g. a singular N; the exact functions
    take N's factor from :func:`closed_loop_factor` instead), so every covariance is positive
    semi-definite whatever the closed loop's spectral radius. (``expected_bump`` given these
    covariances as matrices still forms ``I + V^T Sigma V``: pass ``factor=`` for an unstable F.)

    Args:
      F: [n, n] closed-loop matrix. N: [n, n] per-step noise covariance (PSD).
      s0: [n] initial state. horizon: T.
    Returns:
      (mu [T, n], Sigma [T, n, n]).
    """
    lam, vec = jnp.linalg.eigh(0.5 * (N + N.T))
    mu, L = state_factors(F, vec * jnp.sqrt(jnp.maximum(lam, 0.0)), s0, horizon)
    return mu, L @ jnp.swapaxes(L, -1, -2)


def bump_root(game: LQRGame, dtype) -> Array:
    """V [n, n] with ``V V^T = Sigma`` (the bump's precision W, symmetric PSD by ``validate``):
    its symmetric square root, computed on the host in float64 for a concrete Sigma."""
    if is_concrete(game.Sigma):
        lam, vec = np.linalg.eigh(np.asarray(game.Sigma, np.float64))
        return jnp.asarray(vec * np.sqrt(np.maximum(lam, 0.0)), dtype)
    W = jnp.asarray(game.Sigma, dtype)
    lam, vec = jnp.linalg.eigh(0.5 * (W + W.T))
    return vec * jnp.sqrt(jnp.maximum(lam, 0.0))


def _bump_given_r(game: LQRGame, mu: Array, V: Array, R: Array) -> Array:
    """E exp(-1/2 d^T W d), d = s - s*, for s ~ N(mu, Sigma) given the upper-triangular R with
    ``R^T R = I + V^T Sigma V`` ([..., n, n], broadcast against ``mu``'s batch): ``|R_ii|``
    gives the determinant, and ``z = R^{-T} V^T d`` the exponent ``|z|^2`` (the push-through
    identity ``(I + W Sigma)^{-1} W = V (I + V^T Sigma V)^{-1} V^T``). R^{-1} is computed once
    per R (:func:`upper_inverse`) and applied as a product (nothing batched over the means:
    ``core.maxent_lqr.whiten``)."""
    R_inv = upper_inverse(R)
    half_logdet = jnp.sum(jnp.log(jnp.abs(jnp.diagonal(R, axis1=-2, axis2=-1))), -1)
    d = mu - jnp.asarray(game.s_star, mu.dtype)
    z = jnp.einsum("...i,...ij->...j", d @ V, R_inv)
    return jnp.exp(-0.5 * jnp.sum(z * z, -1) - half_logdet)


@full_precision
def expected_bump(game: LQRGame, mu: Array, cov: Array = None, *, factor: Array = None) -> Array:
    """E[r_L(s)] for s ~ N(mu, cov) (any batch shape; ``cov`` broadcasts against ``mu``).

    Args:
      game: the LQR game (``s_star``, ``Sigma``).
      mu: [..., n] means.
      cov: [..., n, n] covariances (broadcast against ``mu``'s batch shape), symmetric PSD.
      factor: instead of ``cov``: [..., n, n] square roots L with ``cov = L L^T``
        (:func:`state_factors`): the bump through the QR of ``[I; (V^T L)^T]``, positive
        definite by construction (module docstring), which the exact return uses.
    Returns:
      [...] expected leader rewards.
    Raises:
      ValueError: neither or both of ``cov`` and ``factor``.
    """
    if (cov is None) == (factor is None):
        raise ValueError("expected_bump: pass exactly one of cov and factor")
    V = bump_root(game, mu.dtype)
    n = mu.shape[-1]
    if factor is not None:
        P = jnp.swapaxes(V.T @ factor, -1, -2)  # (V^T L)^T: [..., n, n]
        Y = jnp.concatenate([jnp.broadcast_to(jnp.eye(n, dtype=mu.dtype), P.shape), P], -2)
        R = householder_qr(Y, with_q=False)[1]  # R^T R = I + V^T L L^T V: invertible
    else:  # a covariance given as such (PSD to rounding): its Cholesky factor
        H = jnp.eye(n, dtype=mu.dtype) + V.T @ cov @ V
        R = jnp.swapaxes(jnp.linalg.cholesky(0.5 * (H + jnp.swapaxes(H, -1, -2))), -1, -2)
    return _bump_given_r(game, mu, V, R)


def _bump_terms(game: LQRGame, theta: Array, resp: GameResponse, stochastic: bool, x0, T: int):
    """(r [T] the expected bump of each step, F, G): the exact return's per-step terms."""
    F, G = closed_loop_factor(game, theta, resp, stochastic)
    mu, L = state_factors(F, G, x0, T)
    return expected_bump(game, mu, factor=L), F, G


def _check_leader_returns(game, theta, beta, gammas, *, horizon=None, s0=None, **_) -> None:
    """:func:`leader_returns`'s checks, eagerly before a cached call (theta, the gammas and s0
    are traced in it)."""
    gammas = _gammas_tuple(gammas)
    _check_returns_args(game, theta, beta, gammas, "leader_returns", horizon, s0)


def _gammas_tuple(gammas) -> tuple:
    """``gammas`` as a tuple: a non-empty tuple or list (of scalars, checked later)."""
    if not isinstance(gammas, (tuple, list)) or not gammas:
        raise ValueError(
            "games.lqr.leader_returns: gammas must be a non-empty tuple or list of scalar "
            f"discounts, got {gammas!r}"
        )
    return tuple(gammas)


@cached_when_eager(_check_leader_returns)
@full_precision
def leader_returns(
    game: LQRGame,
    theta: Array,
    beta,
    gammas,
    *,
    horizon: int | None = None,
    stochastic: bool = True,
    resp: GameResponse | None = None,
    s0: Array | None = None,
    tol: float = 1e-6,
    max_iters: int = 50_000,
) -> Array:
    """[G] exact returns ``sum_{t < horizon} gamma^t E[r_L(s_t)]``, one per discount in
    ``gammas``, from one pass over the state's moments (:func:`leader_objective` with each
    gamma, at the cost of one).

    The trainers' metrics take the undiscounted return (the figures' y-axis) and the
    ``gamma_L``-discounted one (the leader's objective) at every iteration: a scan of
    ``horizon`` steps with a QR per step (module docstring), shared here where two calls of
    :func:`leader_objective` ran it twice (XLA does not merge two such loops inside the
    trainer's program).

    Args:
      game, theta, beta, horizon, stochastic, resp, s0, tol, max_iters: as
        :func:`leader_objective`.
      gammas: a non-empty tuple or list of discounts (each a scalar, concrete ones in [0, 1]).
    Returns:
      [G] the returns, in the order of ``gammas``; NaN and raises as :func:`leader_objective`.
    Raises:
      ValueError: as :func:`leader_objective`, and ``gammas`` that is not a non-empty tuple or
        list of scalars.
    """
    gammas = _gammas_tuple(gammas)
    kw = dict(horizon=horizon, stochastic=stochastic, resp=resp, s0=s0, tol=tol)
    return _returns(game, theta, beta, gammas, "leader_returns", max_iters=max_iters, **kw)


def _check_returns_args(game, theta, beta, gammas, caller: str, horizon, s0):
    """The checks of :func:`_returns`, in the order theta, beta, horizon, each gamma, s0;
    returns the horizon as a Python int (None stays None)."""
    horizon = _check_args(game, beta, horizon, theta=theta)
    for g in gammas:
        if g is None or np.ndim(g) != 0:
            raise ValueError(
                f"games.lqr.{caller}: gamma (the leader return's discount) must be a scalar, "
                f"got {g!r}"
            )
        _check_args(game, gamma=g)
    if s0 is not None:  # the game's own s0 is validated; an override is checked here
        check_shape("s0", s0, (game.state_dim,), f"n={game.state_dim} from {game.name}")
        if is_concrete(s0) and not np.all(np.isfinite(np.asarray(s0))):
            raise ValueError(f"{game.name}: s0 must be finite, got {np.asarray(s0)}")
    return horizon


def _returns(
    game, theta, beta, gammas, caller: str, *, horizon, stochastic, resp, s0, tol, max_iters
):
    """:func:`leader_returns` for a tuple ``gammas``, its checks in the order theta, beta,
    horizon, each gamma, s0 (``caller`` names the public function in its messages)."""
    horizon = _check_returns_args(game, theta, beta, gammas, caller, horizon, s0)
    T = int(game.horizon if horizon is None else horizon)
    solved = resp is None
    if solved:
        resp = best_response(game, theta, beta, stochastic=stochastic, tol=tol, max_iters=max_iters)
    x0 = jnp.asarray(game.s0 if s0 is None else s0, theta.dtype)
    r, F, G = _bump_terms(game, theta, resp, stochastic, x0, T)
    t = jnp.arange(T, dtype=theta.dtype)
    J = jnp.stack([jnp.sum(r * jnp.asarray(g, theta.dtype) ** t) for g in gammas])
    if not solved:  # the response given is evaluated as it is (the trainer flags its solves)
        return J
    J = nan_unless_converged(resp, J, f"lqr.{caller}: the follower's Riccati iteration")
    refuse_overflow(J if len(gammas) > 1 else J[0], F, G, x0, T, f"games.lqr.{caller}")
    return J


def _check_leader_objective(game, theta, beta, *, horizon=None, gamma=1.0, s0=None, **_):
    """:func:`leader_objective`'s checks, eagerly before a cached call."""
    _check_returns_args(game, theta, beta, (gamma,), "leader_objective", horizon, s0)


@cached_when_eager(_check_leader_objective)
@full_precision
def leader_objective(
    game: LQRGame,
    theta: Array,
    beta,
    *,
    horizon: int | None = None,
    gamma=1.0,
    stochastic: bool = True,
    resp: GameResponse | None = None,
    s0: Array | None = None,
    tol: float = 1e-6,
    max_iters: int = 50_000,
) -> Array:
    """sum_{t < horizon} gamma^t E[r_L(s_t)] from ``s0`` (default the game's): exact.

    ``gamma=1`` (default) is the paper's y-axis (undiscounted 100-step return); the leader's
    training objective is ``gamma=game.gamma_L`` (both from one pass: :func:`leader_returns`).
    Differentiable in theta. The moments are
    propagated in square-root form (module docstring), so a closed loop with rho(F) > 1 that the
    follower still answers (gamma_F rho(F)^2 < 1) has a finite return as long as the state's
    mean and covariance factor (~ rho(F)^t) fit the dtype.

    Args:
      game: the :class:`~bchg_jax.games.lqr.game.LQRGame`.
      theta: [k * n] leader parameters.
      beta: the follower's entropy weight (> 0), scalar.
      horizon: number of steps (default ``game.horizon``; a Python or a concrete numpy / JAX
        integer).
      gamma: discount of the return (default 1.0, undiscounted).
      stochastic: Gaussian (True) or deterministic (False) leader.
      resp: the follower's response; solved at theta (Proposition 2) when None, so that the
        gradient includes the follower's reaction.
      s0: [n] start state (default ``game.s0``).
      tol: Riccati stopping tolerance. max_iters: Riccati iteration cap (when ``resp`` is None).
    Returns:
      [] the expected leader return. NaN (and a NaN gradient) when the arguments are traced
      (under ``jit`` / ``vmap`` / ``grad``) and either ``resp`` is None and the Riccati
      iteration here did not converge, or the state's moments overflow the dtype within the
      horizon (rho(F)^t beyond the dtype's range; the trainers flag a non-finite ``J`` as
      ``metric_nonfinite``). A ``resp`` given is evaluated as it is (check ``resp.converged``).
    Raises:
      ValueError: a concrete ``beta`` not finite and > 0, a ``horizon`` that is not a positive
        integer, a concrete ``gamma`` outside [0, 1], a bad scalar setting of ``game`` (a
        discount outside [0, 1), ...), ``theta`` not [k * n], an ``s0`` not a finite [n], a
        concrete solve here that did not converge, or a concrete return that is not finite
        (the moments overflowed the dtype: :func:`refuse_overflow`).
    """
    kw = dict(horizon=horizon, stochastic=stochastic, resp=resp, s0=s0, tol=tol)
    return _returns(game, theta, beta, (gamma,), "leader_objective", max_iters=max_iters, **kw)[0]


def refuse_overflow(value, F, G, s0, horizon: int, caller: str) -> None:
    """A concrete non-finite return (or gradient) from a converged follower: raise, saying why.

    The state's mean ``F^t s0`` and covariance factor grow like rho(F)^t when the closed loop
    ``F`` is unstable (the follower only needs gamma_F rho(F)^2 < 1). The moments are
    re-propagated here in float64 on the host: when they (or, for a gradient, their
    derivatives, ~ t rho^t) exceed the range of ``value``'s dtype within the horizon, the error
    says so, with the step and the radius; the true return is finite (the bump's expectation
    there is about 0) but not computable in that dtype. Otherwise the error says that the value
    is not finite although the moments fit the dtype. A traced value is left as it is (NaN).
    """
    if not is_concrete(value, F, G, s0) or np.all(np.isfinite(np.asarray(value))):
        return
    F64, G64 = np.asarray(F, np.float64), np.asarray(G, np.float64)
    rho = float(np.max(np.abs(np.linalg.eigvals(F64)))) if np.all(np.isfinite(F64)) else np.nan
    dtype = jnp.result_type(value)
    big = float(np.finfo(dtype).max)
    mu, L, peak, first = np.asarray(s0, np.float64), np.zeros_like(F64), 0.0, None
    with np.errstate(all="ignore"):
        for t in range(int(horizon)):
            size = max(np.max(np.abs(mu)), np.max(np.abs(L))) * (t + 1)  # (t + 1): derivatives
            peak = max(peak, size) if np.isfinite(size) else np.inf
            if first is None and not size < big:
                first = t
                break
            mu = F64 @ mu
            L = np.linalg.qr(np.concatenate([F64 @ L, G64], 1).T, mode="r").T
    if first is not None:
        raise ValueError(
            f"{caller}: the state's mean and covariance factor overflow {dtype} within the "
            f"horizon {horizon} (from step {first}: t times their largest entry passes the "
            f"dtype's largest value {big:.3g}, a gradient's range ~t rho^t included): the "
            f"closed loop's spectral radius is {rho:.4g}, so they grow like {rho:.4g}^t (the "
            "follower only needs gamma_F rho^2 < 1). The bump's expectation there is about 0, "
            "but this closed form cannot reach it; take a shorter horizon, "
            + ("" if dtype == jnp.float64 else "float64, ")
            + "or a leader gain whose closed loop is stable"
        )
    raise ValueError(
        f"{caller}: the result is not finite ({np.asarray(value).tolist()}) although the "
        f"state's moments stay within {dtype} over the horizon {horizon} (largest entry times "
        f"t: {peak:.3g}; closed-loop spectral radius {rho:.4g}): not an overflow of the "
        "moments. Please report this with the game and theta"
    )


def _check_hypergradient_args(game, theta, beta, *, horizon=None, gamma=None, **_) -> None:
    """The checks of :func:`exact_hypergradient` and :func:`hypergradient_split`, eagerly
    before a cached call (theta finite)."""
    _check_args(game, beta, horizon, gamma, theta=theta)


@cached_when_eager()
@full_precision
def _direct_part(game: LQRGame, theta: Array, beta, resp: GameResponse, horizon, gamma, stochastic):
    """The exact hypergradient's direct part: the follower's response ``resp`` held fixed."""
    kw = dict(horizon=horizon, gamma=gamma, stochastic=stochastic, resp=resp)
    return jax.grad(lambda th: leader_objective(game, th, beta, **kw))(theta)


def _warn_cancellation_after(
    out, game, theta, beta, *, horizon=None, gamma=None, stochastic=True, tol=1e-6, max_iters=50_000
) -> None:
    """The float32 cancellation warning of the plain :func:`exact_hypergradient` (not float64)
    and :func:`hypergradient_split` (any dtype), after a cached call: the response and the
    direct part from cached programs."""
    split = isinstance(out, tuple)
    full = out[0] if split else out
    if not split and jnp.result_type(full) == jnp.float64:  # float64 never nears it
        return
    resp = best_response(game, theta, beta, stochastic=stochastic, tol=tol, max_iters=max_iters)
    g = game.gamma_L if gamma is None else gamma
    direct = out[1] if split else _direct_part(game, theta, beta, resp, horizon, g, stochastic)
    caller = "hypergradient_split" if split else "exact_hypergradient"
    _warn_cancellation(game, theta, resp, stochastic, full, direct, caller)


@cached_when_eager(_check_hypergradient_args, _warn_cancellation_after)
@full_precision
def exact_hypergradient(
    game: LQRGame,
    theta: Array,
    beta,
    *,
    horizon: int | None = None,
    gamma=None,
    stochastic: bool = True,
    tol: float = 1e-6,
    max_iters: int = 50_000,
) -> Array:
    """grad_theta of the discounted ``horizon``-step leader return (default gamma = gamma_L).

    The exact hypergradient (autodiff through the moments and the Riccati solution) that the
    Theorem 2 / Theorem 3 estimates are compared with.

    **float32 at large gains.** The gradient is the sum of a direct part and the follower's
    response (:func:`hypergradient_split`), which cancel more and more as the leader's gain
    grows: on the preset game at K = (200, 0) the parts are ~600x the sum, and float32 gives
    [-7.2e-7, 1.84e-5] for the float64 [-2.85e-9, 9.87e-6] (87% off), every solve converged.
    Over the preset's gains |K_1| <= 100, |K_2| <= 60, a third (331 of 990, all |K| >= 56)
    are more than 1% off in float32; every |K| <= 20 (the paper's region) is within 4e-5. A
    concrete float32 call therefore also computes the direct part and warns
    (:func:`float32_cancellation`) where the cancellation makes the float32 value unreliable;
    compute such references in float64. A traced call (a trainer's ``exact`` method) does not
    check.

    Args:
      game: the LQR game. theta: [k * n] leader parameters.
      beta: the follower's entropy weight (> 0), scalar.
      horizon: number of steps (default ``game.horizon``).
      gamma: discount (default ``game.gamma_L``).
      stochastic: Gaussian (True) or deterministic (False) leader.
      tol: Riccati stopping tolerance. max_iters: Riccati iteration cap.
    Returns:
      [k * n] gradient; NaN when traced and either the Riccati iteration did not converge or
      the state's moments overflowed the dtype within the horizon (:func:`leader_objective`).
    Raises:
      ValueError: as :func:`leader_objective` (a concrete non-finite gradient names the
        overflow, :func:`refuse_overflow`).
    Warns:
      UserWarning: a concrete call whose float32 cancellation indicator exceeds
        :data:`FLOAT32_CANCELLATION_WARN` (:func:`float32_cancellation`).
    """
    horizon = _check_args(game, beta, horizon, gamma, theta=theta)
    g = game.gamma_L if gamma is None else gamma

    def J(th):
        resp = best_response(game, th, beta, stochastic=stochastic, tol=tol, max_iters=max_iters)
        kw = dict(horizon=horizon, gamma=g, stochastic=stochastic, resp=resp)
        return leader_objective(game, th, beta, **kw), resp

    grad, resp = jax.grad(J, has_aux=True)(theta)
    what = "lqr.exact_hypergradient: the follower's Riccati iteration"
    grad = nan_unless_converged(resp, grad, what)
    _refuse_nonfinite(game, theta, resp, stochastic, horizon, grad, "exact_hypergradient")
    if is_concrete(grad) and jnp.result_type(grad) != jnp.float64:  # float64 never nears it
        fixed = jax.lax.stop_gradient(resp)  # the follower's policy held: the direct part
        kw = dict(horizon=horizon, gamma=g, stochastic=stochastic, resp=fixed)
        direct = jax.grad(lambda th: leader_objective(game, th, beta, **kw))(theta)
        _warn_cancellation(game, theta, resp, stochastic, grad, direct, "exact_hypergradient")
    return grad


def float32_cancellation(game: LQRGame, theta, resp: GameResponse, full, direct, stochastic=True):
    """How unreliable a float32 (or any dtype's) exact hypergradient is from cancellation:
    ``eps * (|direct| + |full - direct|) / |full| * |F|_2^2``.

    ``eps`` is the machine epsilon of ``full``'s dtype, ``(|direct| + |response|) / |full|``
    how much the two parts cancel, ``|F|_2`` the spectral norm of the closed loop (the parts'
    own rounding error grows with it). The float32 error is ~0.9x this (median) to 15x (99th
    percentile) on the preset game; above :data:`FLOAT32_CANCELLATION_WARN` the exact
    functions warn (module constant's comment: calibration).

    Args:
      game: the LQR game. theta: [k * n] leader parameters (concrete).
      resp: the follower's response at theta. full, direct: the exact hypergradient and its
        direct part (:func:`hypergradient_split`), concrete.
      stochastic: Gaussian (True) or deterministic (False) leader.
    Returns:
      the indicator (a float; inf for a zero ``full``).
    """
    full64, direct64 = np.asarray(full, np.float64), np.asarray(direct, np.float64)
    size = np.linalg.norm(full64)
    parts = np.linalg.norm(direct64) + np.linalg.norm(full64 - direct64)
    F, _ = closed_loop_factor(game, theta, resp, stochastic)
    cond = float(np.linalg.norm(np.asarray(F, np.float64), 2)) ** 2
    eps = float(np.finfo(jnp.result_type(full)).eps)
    with np.errstate(divide="ignore", invalid="ignore"):
        return float(eps * parts / size * cond) if size > 0 else float("inf")


def _warn_cancellation(game, theta, resp, stochastic, full, direct, caller: str) -> None:
    """The warning of :func:`float32_cancellation` above :data:`FLOAT32_CANCELLATION_WARN`
    (concrete, finite values only)."""
    if not all(np.all(np.isfinite(np.asarray(x))) for x in (full, direct)):
        return
    x = float32_cancellation(game, theta, resp, full, direct, stochastic)
    if not x > FLOAT32_CANCELLATION_WARN:
        return
    full64, direct64 = np.asarray(full, np.float64), np.asarray(direct, np.float64)
    ratio = (np.linalg.norm(direct64) + np.linalg.norm(full64 - direct64)) / max(
        np.linalg.norm(full64), np.finfo(np.float64).tiny
    )
    dtype = jnp.result_type(full)
    warnings.warn(
        f"games.lqr.{caller}: the {dtype} exact hypergradient at theta="
        f"{np.asarray(theta).tolist()} is unreliable: its direct and follower-response parts "
        f"are {ratio:.3g}x the gradient and cancel (indicator eps * cancellation * |F|^2 = "
        f"{x:.3g} > {FLOAT32_CANCELLATION_WARN:g}; on the preset game the {dtype} error is "
        "~1x to 15x the indicator: large leader gains lost 1-160% there). Compute it in "
        "float64 (jax_enable_x64 and a float64 theta)",
        stacklevel=4,
    )


def _refuse_nonfinite(game, theta, resp, stochastic, horizon, value, caller: str) -> None:
    """:func:`refuse_overflow` for a concrete non-finite ``value`` (pytree) computed at theta
    with the converged ``resp`` (the closed loop rebuilt only then)."""
    leaves = jax.tree_util.tree_leaves(value)
    if not is_concrete(leaves) or all(np.all(np.isfinite(np.asarray(x))) for x in leaves):
        return
    F, G = closed_loop_factor(game, theta, resp, stochastic)
    T = int(game.horizon if horizon is None else horizon)
    bad = next(x for x in leaves if not np.all(np.isfinite(np.asarray(x))))
    x0 = jnp.asarray(game.s0, theta.dtype)
    refuse_overflow(bad, F, G, x0, T, f"games.lqr.{caller}")


@full_precision
def leader_state_values(
    game: LQRGame,
    theta: Array,
    resp: GameResponse,
    x: Array,
    remaining: Array,
    gamma,
    horizon: int,
    stochastic: bool = True,
) -> Array:
    """V_L^(h)(x) = sum_{t < h} gamma^t E[r_L(s_t) | s_0 = x] for ``x`` [..., n] and ``h =
    remaining`` [...] (per sample, at most ``horizon``).

    Args:
      game: the LQR game. theta: [k * n] leader parameters.
      resp: the follower's response at theta.
      x: [..., n] start states.
      remaining: [...] steps left h per sample (values above ``horizon`` are cut at it).
      gamma: the leader's discount. horizon: the scan length (max h).
      stochastic: Gaussian (True) or deterministic (False) leader.
    Returns:
      [...] finite-horizon leader values.
    Raises:
      ValueError: a bad scalar setting of ``game``, a ``horizon`` that is not a positive
        integer, or a concrete ``gamma`` outside [0, 1].
    """
    horizon = _check_args(game, horizon=horizon, gamma=gamma, theta=theta)
    F, G = closed_loop_factor(game, theta, resp, stochastic)

    def body(c, t):  # the covariance in square-root form (module docstring)
        Ft, L = c
        r = expected_bump(game, x @ Ft.T, factor=L)
        L2 = square_factor(jnp.concatenate([F @ L, G], -1))
        return (F @ Ft, L2), jnp.where(t < remaining, gamma**t * r, 0.0)

    n = x.shape[-1]
    init = (jnp.eye(n, dtype=x.dtype), jnp.zeros((n, n), x.dtype))
    _, rs = jax.lax.scan(body, init, jnp.arange(horizon, dtype=x.dtype))
    return jnp.sum(rs, 0)


@full_precision
def leader_q(
    game: LQRGame,
    theta: Array,
    resp: GameResponse,
    s: Array,
    a: Array,
    b: Array,
    remaining: Array,
    gamma,
    horizon: int,
    stochastic: bool = True,
) -> Array:
    """Exact Q_L^(h)(s, a, b) = r_L(s) + gamma V_L^(h-1)(A s + B b + C a), h = ``remaining``.

    Args:
      game: the LQR game. theta: [k * n] leader parameters.
      resp: the follower's response at theta.
      s: [..., n] states. a: [..., k] leader actions. b: [..., m] follower actions.
      remaining: [...] steps left h per sample.
      gamma: the leader's discount. horizon: the scan length (max h).
      stochastic: Gaussian (True) or deterministic (False) leader.
    Returns:
      [...] exact finite-horizon leader Q-values.
    Raises:
      ValueError: as :func:`leader_state_values`.
    """
    horizon = _check_args(game, horizon=horizon, gamma=gamma, theta=theta)
    s2 = transition(game, s, a, b)
    return leader_reward(game, s) + gamma * leader_state_values(
        game, theta, resp, s2, remaining - 1, gamma, horizon, stochastic
    )


@full_precision
def exact_critic_estimate(
    game: LQRGame,
    theta: Array,
    beta,
    key: Array,
    *,
    episodes: int,
    leader_steps: int,
    extra_steps: int,
    gamma=None,
    stochastic: bool = True,
    guide: str = "benefit",
    direct_baseline: str = "value",
    influence: str = "baseline",
    samples: int = 16,
    tol: float = 1e-6,
    max_iters: int = 50_000,
    resp: GameResponse | None = None,
    reaction: str = "q_gradient",
) -> Array:
    """One batch's hypergradient estimate with *exact* critics (estimator studies and tests).

    Episodes of ``leader_steps + extra_steps`` steps from s0; the objective is the discounted
    ``leader_steps``-step return (exact critics Q_L^(h), h = steps left), the follower's influence
    sums run over the extra steps too (its horizon is infinite). The Benefit subtracts the mean of
    Q_L over ``samples`` follower actions. Stochastic leader (Theorem 2): ``direct_baseline`` in
    ``value`` (exact V_L^(h)(s)), ``same_b`` (mean of Q_L(s, a', b) over ``samples`` a' ~ f: the
    reference's, biased), ``same_noise`` (a' with the follower's noise kept), ``none``;
    ``influence`` in ``raw`` (V_F) or ``baseline`` (V_F - E_a' V_F). Deterministic leader:
    the appendix theorem (Theorem 3) with exact grad_a Q_L and grad_a Q_F.

    Args:
      game: the LQR game. theta: [k * n] leader parameters.
      beta: the follower's entropy weight (> 0), scalar.
      key: PRNG key (episodes, Benefit samples, baseline samples).
      episodes: E.
      leader_steps: T, the leader objective's horizon.
      extra_steps: extra steps that only the follower's influence sums see (a warning when
        ``gamma_F ** extra_steps`` exceeds :data:`INFLUENCE_CUT_WARN`).
      gamma: the leader's discount (default ``game.gamma_L``).
      stochastic: Gaussian leader (Theorem 2) or deterministic (Theorem 3).
      guide: ``"benefit"`` (BC-HG) or ``"none"`` (Naive-PGD).
      direct_baseline: ``"value"``, ``"same_b"``, ``"same_noise"`` or ``"none"``.
      influence: ``"raw"`` or ``"baseline"``.
      samples: Monte Carlo samples of the Benefit (and of the ``same_*`` baselines).
      tol: Riccati stopping tolerance. max_iters: Riccati iteration cap.
      resp: the follower's policy and values (default: the best response, solved here); a
        follower off its best response is given as the policy it plays with the values
        ``V^g`` of that fixed policy (:func:`~bchg_jax.games.lqr.follower_models.policy_view`,
        :func:`~bchg_jax.games.lqr.follower_models.k_step_response`): the estimate is then
        that of a leader who reads the policy (Assumption 1), and its mean is
        :func:`~bchg_jax.games.lqr.follower_references.as_if_optimal_hypergradient` (for the
        deterministic leader with ``reaction="policy_score"`` only).
      reaction: the deterministic leader's follower reaction, ``"q_gradient"`` (Theorem 3) or
        ``"policy_score"`` (:class:`~bchg_jax.games.lqr.config.EstimatorConfig`'s ``reaction``).
    Returns:
      [k * n] the estimate of grad_theta J_L (NaN when the Riccati iteration did not converge,
      or a given ``resp`` is not ``converged``, and the arguments are traced; an error when
      concrete).
    Raises:
      ValueError: an unknown ``direct_baseline``, ``influence`` or ``reaction``, a concrete
        ``beta`` not finite and > 0, a concrete ``gamma`` outside [0, 1], ``episodes`` /
        ``leader_steps`` / ``samples`` not positive integers or ``extra_steps`` not an integer
        >= 0, a bad scalar setting of ``game``, or an unknown ``guide``.
    """
    _check_args(game, beta, gamma=gamma, theta=theta)
    if stochastic:
        game.check_gaussian_leader(
            "exact_critic_estimate(stochastic=True)",
            "pass stochastic=False for a leader without noise (Theorem 3)",
        )
    if direct_baseline not in ("value", "same_b", "same_noise", "none"):
        raise ValueError(f"unknown direct_baseline {direct_baseline!r}")
    if influence not in ("raw", "baseline"):
        raise ValueError(f"influence must be 'raw' or 'baseline', got {influence!r}")
    if reaction not in ("q_gradient", "policy_score"):
        raise ValueError(f"reaction must be 'q_gradient' or 'policy_score', got {reaction!r}")
    check_count("episodes", episodes)
    check_count("leader_steps", leader_steps)
    check_count("samples", samples)
    check_int_range("extra_steps", extra_steps, 0, float("inf"))
    # gamma_F = 0: the influence sums have no terms after the step's own (0 ** 0 = 1 warned of
    # a cut at extra_steps 0, which influence_steps gives)
    gF = float(game.gamma_F)
    cut = 0.0 if gF == 0 else gF ** int(extra_steps)
    if cut > INFLUENCE_CUT_WARN:
        warnings.warn(
            f"lqr.exact_critic_estimate: extra_steps={extra_steps} cuts the follower's "
            f"influence sums (infinite in Theorem 2) at a discount weight gamma_F^{extra_steps} "
            f"= {cut:.3g} for the last leader step: the estimate is biased by about that share "
            f"of the follower-response term; take extra_steps >= {influence_steps(game)} "
            f"(log({INFLUENCE_CUT_WARN:g}) / log(gamma_F): games.lqr.exact.influence_steps)",
            stacklevel=2,
        )
    gL = game.gamma_L if gamma is None else gamma
    T = leader_steps
    if resp is None:
        resp = best_response(game, theta, beta, stochastic=stochastic, tol=tol, max_iters=max_iters)
    what = "lqr.exact_critic_estimate: the follower's Riccati iteration"
    checked = lambda grad: nan_unless_converged(resp, grad, what)  # noqa: E731

    def Qfn(s, a, b, rem):
        return leader_q(game, theta, resp, s, a, b, rem, gL, T, stochastic)

    k1, k2, k3 = jax.random.split(key, 3)
    tr = rollout(k1, game, theta, resp, episodes, T + extra_steps, stochastic=stochastic)
    s, a, b = tr.s[:, :-1], tr.a, tr.b
    rem = jnp.broadcast_to(jnp.maximum(T - jnp.arange(T + extra_steps), 1), s.shape[:2])
    q = Qfn(s, a, b, rem)
    bj = jax.vmap(lambda kk: resp.sample(kk, s, a))(jax.random.split(k2, samples))
    ben = q - jax.vmap(lambda bb: Qfn(s, a, bb, rem))(bj).mean(0)
    if not stochastic:
        dQL = jax.grad(lambda aa: Qfn(s, aa, b, rem).sum())(a)
        own = None
        if reaction == "policy_score":  # games.lqr.estimator.policy_score_reaction
            dQF = jax.grad(lambda aa: follower_value(game, resp, s, aa).sum())(a)
            score = jax.grad(lambda aa: resp.log_prob(s, aa, b).sum())(a)
            own = score - dQF / beta
        else:
            dQF = jax.grad(lambda aa: follower_q(game, resp, theta, s, aa, b).sum())(a)
        return checked(
            deterministic_hypergradient(
                lambda t_, s_: s_ @ leader_gain(game, t_).T,
                theta,
                s,
                dQL,
                ben,
                dQF,
                beta,
                gL,
                game.gamma_F,
                guide,
                leader_steps=T,
                own_step=own,
            )
        )
    if direct_baseline == "value":
        base = leader_state_values(game, theta, resp, s, rem, gL, T)
    elif direct_baseline == "none":
        base = 0.0
    elif direct_baseline in ("same_b", "same_noise"):
        K, U = leader_gain(game, theta), jnp.asarray(game.U, theta.dtype)
        eps = jax.random.normal(k3, (samples,) + a.shape, theta.dtype)
        a_alt = s @ K.T + eps @ U.T
        b_alt = (
            jnp.broadcast_to(b, a_alt.shape[:-1] + b.shape[-1:])
            if direct_baseline == "same_b"
            else resp.mean(s, a_alt) + (b - resp.mean(s, a))
        )
        base = jax.vmap(lambda aa, bb: Qfn(s, aa, bb, rem))(a_alt, b_alt).mean(0)
    else:
        raise ValueError(f"unknown direct_baseline {direct_baseline!r}")
    adv = follower_value(game, resp, s, a)
    if influence == "baseline":
        adv = adv - follower_state_value(game, resp, theta, s)
    elif influence != "raw":
        raise ValueError(f"influence must be 'raw' or 'baseline', got {influence!r}")
    w = game_score_weights(q, base, ben, adv, beta, gL, game.gamma_F, guide, leader_steps=T)
    return checked(
        continuous_hypergradient(
            lambda t_, s_, a_: leader_log_prob(game, t_, s_, a_), theta, s, a, w
        )
    )


@cached_when_eager(_check_hypergradient_args, _warn_cancellation_after)
@full_precision
def hypergradient_split(
    game: LQRGame,
    theta: Array,
    beta,
    *,
    horizon: int | None = None,
    gamma=None,
    stochastic=True,
    tol: float = 1e-6,
    max_iters: int = 50_000,
):
    """(full, direct): the exact hypergradient and its part with the follower's policy held
    fixed (what Naive-PGD estimates); ``full - direct`` is the follower-response part, which the
    Benefit term of BC-HG estimates (the second term of Eq. (hg_MG)).

    "Held fixed" means the follower's policy g(b | s, a) as a function of (s, a): with the
    Gaussian leader (``stochastic=True``) that is Naive-PGD's part exactly. With the
    deterministic leader (``stochastic=False``) the follower still reacts to the leader's action
    a = K s through g(. | s, a), while ``naive_det``'s direct term (Theorem 3) holds the follower's
    action b itself fixed and leaves that reaction to the Benefit term: the two differ (on a
    random 3-d game, 31% of the norm, 36 SE). For the deterministic leader, ``direct`` is
    therefore not ``naive_det``'s target, only ``full`` is BC-HG's.

    Args:
      game, theta, beta, horizon, gamma, stochastic, tol, max_iters: as
        :func:`exact_hypergradient`.
    Returns:
      (full [k * n], direct [k * n]); traced: NaN when the Riccati iteration did not converge
      or the state's moments overflowed the dtype (:func:`leader_objective`).
    Raises:
      ValueError: as :func:`exact_hypergradient`: also a concrete result that is not finite
        (:func:`refuse_overflow` names the overflow; before, NaN came back with no error).
    Warns:
      UserWarning: as :func:`exact_hypergradient`: the two parts cancel so much that the
        float32 value is unreliable (:func:`float32_cancellation`).
    """
    horizon = _check_args(game, beta, horizon, gamma, theta=theta)
    g = game.gamma_L if gamma is None else gamma

    def J(th, th_follower):
        resp = best_response(
            game, th_follower, beta, stochastic=stochastic, tol=tol, max_iters=max_iters
        )
        kw = dict(horizon=horizon, gamma=g, stochastic=stochastic, resp=resp)
        return leader_objective(game, th, beta, **kw), resp

    full, resp = jax.grad(lambda th: J(th, th), has_aux=True)(theta)
    direct, _ = jax.grad(lambda th: J(th, jax.lax.stop_gradient(theta)), has_aux=True)(theta)
    what = "lqr.hypergradient_split: the follower's Riccati iteration"
    out = tuple(nan_unless_converged(resp, x, what) for x in (full, direct))
    _refuse_nonfinite(game, theta, resp, stochastic, horizon, out, "hypergradient_split")
    if is_concrete(out):
        _warn_cancellation(game, theta, resp, stochastic, *out, "hypergradient_split")
    return out
