"""Exact references for tabular Markov games (the ground truth of the estimator tests).

* :func:`best_response`: the follower's soft-Q fixed point for a leader policy f, solved to
  a tight tolerance (soft Q-iteration, then Newton: :func:`newton_polish`) and differentiable
  in f by the implicit function theorem (``custom_root``).
* :func:`leader_return`: the leader's expected return from ``init_dist`` under (f, g) by
  propagating the state distribution of the joint Markov chain: ``horizon`` steps, undiscounted
  or discounted (``gamma``), exactly (no sampling).
* :func:`leader_values`: infinite-horizon V_L(s), Q_L(s, a, b) under (f, g) (linear solve).
* :func:`soft_policy_evaluation`: the follower's entropy-regularised values Q^g, V^g of a fixed
  policy g against f (linear solve): what the leader pairs with a follower that is not at its
  best response (:mod:`bchg_jax.games.tabular.follower_models`).
* References for followers that are not at their best response (``docs/followers.md``):
  :func:`as_if_optimal_hypergradient` (Theorem 2's formula at the follower's current policy, as
  if it were optimal), :func:`k_step_hypergradient` (through K unrolled soft-Q backups) and
  :func:`lag_hypergradient` (through the lagging follower's mix).
"""

from __future__ import annotations

import warnings
from typing import Optional

import jax
import jax.numpy as jnp
import numpy as np

from bchg_jax.core.eager import cached_when_eager
from bchg_jax.core.follower_model import lag_mix, mix_in_range
from bchg_jax.core.maxent_lqr import nan_unless
from bchg_jax.core.precision import full_precision
from bchg_jax.core.rounding import refuse_unless_within
from bchg_jax.core.softmax import follower_softmax
from bchg_jax.core.validate import (
    check_beta_if_concrete,
    check_count,
    check_discount,
    check_finite_if_concrete,
    check_if_concrete,
    check_mix_if_concrete,
    check_shape,
    check_solver_settings,
    is_concrete,
    warn_float32_logit_rounding,
    warn_float32_long_horizon,
)
from bchg_jax.games.estimators import check_policy_fn_on_simplex
from bchg_jax.games.tabular.follower import (
    BACKUPS,
    GameBestResponse,
    check_game,
    response_from_q,
    soft_q_backup,
    soft_q_backups,
    soft_q_iteration,
)
from bchg_jax.games.tabular.game import check_policy_shapes, compute_dtype

Array = jax.Array


# the fixed-point residual a best response must reach (or its rounding floor, or a looser ``tol``)
RESPONSE_TOL = 1e-6


def _check_response_args(game, f, beta, *_, newton_iters: int = 3, **__) -> None:
    """The checks of :func:`best_response` (and the eager check of a cached call's ``f``, whose
    probability rows are checked only when it is concrete)."""
    check_game(game)
    check_beta_if_concrete(beta)
    check_policy_shapes(game, f)
    if isinstance(newton_iters, bool) or not isinstance(newton_iters, int) or newton_iters < 0:
        raise ValueError(f"newton_iters must be a non-negative integer, got {newton_iters!r}")


def _warn_rounded_logits(br, game, f, beta, *_, **__) -> None:
    """The plain eager :func:`best_response`'s float32 logits warning, after a cached call."""
    warn_float32_logit_rounding("games.tabular.best_response", br.Q, beta, stacklevel=4)


def _warn_rounded_logits_at(_out, game, f, beta, backup: str = "reference") -> None:
    """The same for :func:`leader_objective` in float32 (its best response, cached, warns)."""
    if compute_dtype(game, f, beta) == jnp.float32:
        best_response(game, f, beta, backup)


@cached_when_eager(_check_response_args, _warn_rounded_logits)
@full_precision
def best_response(
    game,
    f: Array,
    beta,
    backup: str = "reference",
    tol: float = 1e-12,
    max_sweeps: int = 100_000,
    newton_iters: int = 3,
) -> GameBestResponse:
    """The follower's best response g^{theta dagger} to ``f``, differentiable in ``f`` and beta.

    Soft Q-iteration (:func:`~bchg_jax.games.tabular.follower.soft_q_iteration`, not
    differentiated) to ``tol``, then ``newton_iters`` Newton steps on the soft Bellman fixed
    point ``F(Q) = backup(Q; f, beta) - Q = 0`` (:func:`newton_polish`); ``lax.custom_root``
    on it attaches the implicit-function-theorem derivative, so gradients of quantities built
    from the response include the follower's reaction to the leader.

    The Newton steps matter near gamma_F = 1: soft Q-iteration contracts by gamma_F per sweep
    along the constant direction of Q, so at gamma_F = 0.9999 the sweep cap left Q (and V) off
    by a constant 0.32 on a random 3-state game (residual 3e-5, float64); the policy and the
    hypergradient, which a constant does not move, were right. Three steps bring the residual
    to the rounding floor.

    Args:
      game: a :class:`~bchg_jax.games.tabular.game.TabularGame`.
      f: [S, A] leader policy f(a|s).
      beta: the follower's entropy weight (> 0), scalar.
      backup: the soft-Q backup, ``"reference"`` or ``"paper"`` (see
        :mod:`bchg_jax.games.tabular.follower`).
      tol: sup-norm tolerance of the forward iteration.
      max_sweeps: sweep cap of the forward iteration.
      newton_iters: Newton steps after it (each a dense [SAB, SAB] Jacobian and solve, the
        size of the implicit derivative's own; 0: none).
    Returns:
      :class:`~bchg_jax.games.tabular.follower.GameBestResponse` (``policy`` g(b|s, a)
      [S, A, B], ``Q`` [S, A, B], ``V`` [S, A]); ``sweeps`` is reported as 0 and ``residual``
      is the fixed-point residual [] at the solution. A residual above ``max(tol,
      RESPONSE_TOL, rounding floor)`` (:func:`~bchg_jax.core.rounding.within_tolerance`) under
      a trace (``jit`` / ``vmap`` / ``grad``) makes ``policy``, ``Q``, ``V`` (and their
      derivatives) NaN, never numbers from an unconverged solve.
    Raises:
      ValueError: a concrete ``beta`` not finite and > 0, a bad scalar setting of ``game`` (a
        discount outside [0, 1), ...), ``f`` not [S, A], an unknown ``backup``,
        ``newton_iters`` not a non-negative integer, or a concrete solve whose residual missed
        the tolerance (``max_sweeps`` and ``newton_iters`` set too low).
    """
    _check_response_args(game, f, beta, newton_iters=newton_iters)
    sg = jax.lax.stop_gradient
    Q_star = soft_q_iteration(game, sg(f), sg(beta), backup, tol=tol, max_sweeps=max_sweeps).Q
    Q_star = newton_polish(game, sg(f), sg(beta), Q_star, backup, newton_iters)
    br = implicit_response(game, f, beta, Q_star, backup)
    warn_float32_logit_rounding("games.tabular.best_response", br.Q, beta)
    ok = refuse_unless_within(
        br.residual,
        br.Q,
        max(tol, RESPONSE_TOL),
        "games.tabular.best_response",
        f"max_sweeps={max_sweeps}, newton_iters={newton_iters}: raise them (the defaults are "
        "100000 and 3)",
    )
    return br._replace(
        policy=nan_unless(ok, br.policy), Q=nan_unless(ok, br.Q), V=nan_unless(ok, br.V)
    )


def _bellman_residual(game, f: Array, beta, backup: str):
    """F(Q) = backup(Q; f, beta) - Q on [S, A, B] soft Q tables, and its Jacobian [n, n] in the
    flattened Q (n = S A B)."""
    dtype = compute_dtype(game, f, beta)
    f, beta, gamma_F = (jnp.asarray(x, dtype) for x in (f, beta, game.gamma_F))
    P = jnp.asarray(game.transition, dtype)
    r = jnp.asarray(game.follower_reward, dtype)

    def F(Q):
        return soft_q_backup(P, r, Q, f, beta, gamma_F, backup) - Q

    def jacobian(Q):
        return jax.jacfwd(lambda x: F(x.reshape(Q.shape)).reshape(-1))(Q.reshape(-1))

    return F, jacobian


@full_precision
def newton_polish(game, f: Array, beta, Q: Array, backup: str = "reference", iters: int = 3):
    """``iters`` Newton steps ``Q <- Q - J(Q)^{-1} F(Q)`` on the soft Bellman equation
    ``F(Q) = backup(Q; f, beta) - Q = 0`` (Theorem 2's; ``backup`` as in
    :mod:`bchg_jax.games.tabular.follower`) from ``Q`` [S, A, B], e.g. soft Q-iteration's
    answer (quadratic convergence near the fixed point). Not differentiated; returns [S, A, B].
    """
    check_solver_settings("games.tabular.newton_polish", iters=(iters, 0))
    F, jacobian = _bellman_residual(game, f, beta, backup)
    Q = jnp.asarray(Q, compute_dtype(game, f, beta))  # the scan's carry: F's dtype

    def step(Q, _):
        dQ = jnp.linalg.solve(jacobian(Q), F(Q).reshape(-1)).reshape(Q.shape)
        return Q - dQ, None

    return jax.lax.scan(step, Q, None, length=iters)[0] if iters else Q


@full_precision
def implicit_response(game, f: Array, beta, Q_star: Array, backup: str = "reference"):
    """The best response at an already solved soft-Q fixed point ``Q_star`` [S, A, B] (its value
    as given), with the implicit-function-theorem derivative in ``f`` and beta attached
    (``lax.custom_root`` on ``Q = backup(Q; f, beta)``; :func:`best_response` without the
    forward solve: a trainer passes the solution it already has).

    Returns:
      :class:`~bchg_jax.games.tabular.follower.GameBestResponse` (``sweeps`` 0, ``residual``
      the fixed-point residual at ``Q_star``).
    """
    F, _ = _bellman_residual(game, f, beta, backup)
    Q_star = jnp.asarray(Q_star, compute_dtype(game, f, beta))  # F's dtype: custom_root's

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
    dtype = compute_dtype(game, f, g)
    pi = jnp.asarray(f, dtype)[:, :, None] * jnp.asarray(g, dtype)  # [S, A, B]
    P = jnp.asarray(game.transition, dtype)
    rL = jnp.asarray(game.leader_reward, dtype)
    return jnp.einsum("sab,sabt->st", pi, P), jnp.sum(pi * rL, axis=(1, 2))


def _check_returns_args(game, f, g, gammas, horizon, caller: str) -> int:
    """The checks of :func:`_returns` (game, horizon, each gamma, policy shapes and, concrete,
    rows); returns the horizon."""
    check_game(game)
    H = game.time_limit if horizon is None else horizon
    check_count("horizon (or game.time_limit when horizon is None)", H)
    for gamma in gammas:
        if gamma is None or np.ndim(gamma) != 0:
            raise ValueError(
                f"games.tabular.{caller}: gamma must be a scalar discount, got {gamma!r}"
            )
        check_if_concrete(check_discount, "gamma", gamma, True)
    check_policy_shapes(game, f, g)
    return H


def _check_return(game, f, g, horizon=None, gamma=1.0) -> None:
    """:func:`leader_return`'s checks, eagerly before a cached call."""
    _check_returns_args(game, f, g, (gamma,), horizon, "leader_return")


def _gammas_tuple(gammas, caller: str) -> tuple:
    """``gammas`` as a tuple: a non-empty tuple or list (of scalars, checked later)."""
    if not isinstance(gammas, (tuple, list)) or not gammas:
        raise ValueError(
            f"{caller}: gammas must be a non-empty tuple or list of scalar discounts, got "
            f"{gammas!r}"
        )
    return tuple(gammas)


def _check_returns(game, f, g, gammas, horizon=None) -> None:
    """:func:`leader_returns`'s checks, eagerly before a cached call."""
    gammas = _gammas_tuple(gammas, "games.tabular.leader_returns")
    _check_returns_args(game, f, g, gammas, horizon, "leader_returns")


@cached_when_eager(_check_returns)
@full_precision
def leader_returns(game, f: Array, g: Array, gammas, horizon: Optional[int] = None) -> Array:
    """[G] exact returns ``sum_{t < horizon} gamma^t E[r_L(s_t, a_t, b_t)]`` from ``init_dist``,
    one per discount in ``gammas``, from one pass over the joint chain (:func:`leader_return`
    with each gamma, at the cost of one: the trainer's undiscounted and discounted metrics run
    one scan of ``horizon`` steps, not two; XLA does not merge two such loops in its program).

    Args:
      game, f, g, horizon: as :func:`leader_return`.
      gammas: a non-empty tuple or list of scalar discounts (concrete ones in [0, 1]).
    Returns:
      [G] the returns, in the order of ``gammas``.
    Raises:
      ValueError: as :func:`leader_return`, and ``gammas`` that is not a non-empty tuple or list
        of scalars.
    """
    gammas = _gammas_tuple(gammas, "games.tabular.leader_returns")
    return _returns(game, f, g, gammas, horizon, "leader_returns")


def _returns(game, f, g, gammas, horizon, caller: str):
    """:func:`leader_returns` for a tuple ``gammas``; checks in the order game, horizon, each
    gamma, policy shapes (``caller`` names the public function)."""
    H = _check_returns_args(game, f, g, gammas, horizon, caller)
    P_pi, r_pi = joint_chain(game, f, g)
    dtype = P_pi.dtype  # compute_dtype(game, f, g): the scan's carry
    gamma = jnp.stack([jnp.asarray(x, dtype) for x in gammas])

    def body(c, _):
        d, disc, total = c  # disc, total: [G], one per discount
        return (d @ P_pi, disc * gamma, total + disc * jnp.dot(d, r_pi)), None

    init = (jnp.asarray(game.init_dist, dtype), jnp.ones_like(gamma), jnp.zeros_like(gamma))
    (_, _, total), _ = jax.lax.scan(body, init, None, length=H)
    return total


@cached_when_eager(_check_return)
@full_precision
def leader_return(
    game, f: Array, g: Array, horizon: Optional[int] = None, gamma: float = 1.0
) -> Array:
    """sum_{t < horizon} gamma^t E[r_L(s_t, a_t, b_t)] from ``init_dist`` (exact).

    Propagates the state distribution of the joint chain under (f, g); no sampling. Several
    discounts at once: :func:`leader_returns`.

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
    return _returns(game, f, g, (gamma,), horizon, "leader_return")[0]


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
    check_game(game)
    check_policy_shapes(game, f, g)
    P_pi, r_pi = joint_chain(game, f, g)
    S, dtype = r_pi.shape[0], r_pi.dtype  # compute_dtype(game, f, g)
    gamma_L = jnp.asarray(game.gamma_L, dtype)
    V = jnp.linalg.solve(jnp.eye(S, dtype=dtype) - gamma_L * P_pi, r_pi)
    P = jnp.asarray(game.transition, dtype)
    Q = jnp.asarray(game.leader_reward, dtype) + gamma_L * jnp.einsum("sabt,t->sab", P, V)
    return V, Q


@cached_when_eager(_check_response_args, _warn_rounded_logits_at)
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
    check_game(game)
    check_beta_if_concrete(beta)
    br = best_response(game, f, beta, backup)
    return leader_objective_at(game, f, br.policy)


@full_precision
def leader_objective_at(game, f: Array, g: Array) -> Array:
    """J_L(f, g) = sum_s rho_0(s) V_L(s) under the given follower policy g [S, A, B]
    (infinite-horizon, discounted by gamma_L; differentiable in f and g)."""
    V, _ = leader_values(game, f, g)
    return jnp.dot(jnp.asarray(game.init_dist, V.dtype), V)


def _check_hypergradient_args(policy_fn, theta, game, beta, *_, **__) -> None:
    """The checks of :func:`exact_hypergradient` (a concrete theta's ``policy_fn(theta)`` on the
    simplex: eagerly before a cached call, where theta is traced)."""
    if not callable(policy_fn):  # the game first, as best_response takes it: a raw TypeError
        raise ValueError(
            "games.tabular.exact_hypergradient takes (policy_fn, theta, game, beta): the "
            f"first argument must be the leader's policy_fn (theta -> f [S, A]), got "
            f"{type(policy_fn).__name__}"
        )
    check_game(game)
    check_beta_if_concrete(beta)
    # first: it refuses a non-floating theta before policy_fn is traced with it
    check_policy_fn_on_simplex(policy_fn, theta, "games.tabular.exact_hypergradient", game)


def _warn_rounded_logits_inside(policy_fn, theta, game, beta, backup, Q_star) -> None:
    """The float32 logits warning of the best response a hypergradient solves (the plain call
    differentiates eagerly, so its solve sees a concrete Q and warns; the cached program's
    does not): from the cached :func:`best_response` at ``policy_fn(theta)``."""
    if Q_star is None:
        f = policy_fn(theta)
        if compute_dtype(game, f, beta) == jnp.float32:
            best_response(game, f, beta, backup)


def _warn_after_hypergradient(
    _out, policy_fn, theta, game, beta, backup="reference", Q_star=None, tol=None
) -> None:
    """:func:`exact_hypergradient`'s value-dependent warning after a cached call."""
    _warn_rounded_logits_inside(policy_fn, theta, game, beta, backup, Q_star)


@cached_when_eager(_check_hypergradient_args, _warn_after_hypergradient)
@full_precision
def exact_hypergradient(
    policy_fn,
    theta,
    game,
    beta,
    backup: str = "reference",
    Q_star: Optional[Array] = None,
    tol: Optional[float] = RESPONSE_TOL,
):
    """d J_L(policy_fn(theta)) / d theta exactly (autodiff through :func:`leader_objective`).

    With ``backup="paper"`` (Theorem 2's Bellman equation) this is what Theorem 2's estimate
    (Eq. (hg_MG), :func:`bchg_jax.games.estimators.hypergradient`, the trainer's surrogate) is
    unbiased for and tested against. With ``backup="reference"`` it is not: the estimator's
    influence (V_F along (f, g)) is the paper backup's derivative of Q_F, and in exact
    expectation (exact critics) it differs from this gradient by 2.5% of its norm on the toy
    game (R = 2, beta 0.05, p = 0.45; 93% at p = 0.51 near the optimum, where the gradient is
    small, with the same sign: the estimate's zero is p = 0.5088, the optimum's 0.5094) and
    by 76% (cosine 0.66) on a random 5-state game (``tests/games/test_backup_expectation.py``,
    ``docs/followers.md``).

    Args:
      policy_fn: theta -> f [S, A] (rows on the simplex).
      theta: the leader's parameters (pytree).
      game: a :class:`~bchg_jax.games.tabular.game.TabularGame`.
      beta: the follower's entropy weight (> 0), scalar.
      backup: the follower's soft-Q backup (``"reference"`` or ``"paper"``).
      Q_star: optional [S, A, B] soft-Q fixed point at ``policy_fn(theta)`` already solved (a
        trainer's warm-started solution): no forward solve (:func:`implicit_response`);
        None: solved here to 1e-12 (:func:`best_response`).
      tol: the fixed-point residual a given ``Q_star`` must reach (or its rounding floor):
        one that misses it raises (NaN under a trace); None: taken as it is (the trainer,
        which flags its own capped solves).
    Returns:
      a pytree like ``theta``.
    Raises:
      ValueError: a concrete ``beta`` not finite and > 0, a bad scalar setting of ``game``, a
        concrete ``Q_star`` that misses ``tol``, a ``policy_fn`` whose row sums move with a
        concrete theta (:func:`~bchg_jax.games.estimators.check_policy_fn_on_simplex`), or
        as :func:`best_response` for ``policy_fn(theta)``.
    Warns:
      float32 with a discount above :data:`~bchg_jax.core.validate.FLOAT32_GAMMA_WARN`.
    """
    _check_hypergradient_args(policy_fn, theta, game, beta)
    # the computation's dtype: policy_fn's output promoted with beta and the game's tables
    dtype = compute_dtype(game, jax.eval_shape(policy_fn, theta), beta)
    warn_float32_long_horizon(
        "games.tabular.exact_hypergradient", dtype, game.gamma_F, game.gamma_L
    )

    def J(th):
        f = policy_fn(th)
        br = _response(game, f, beta, backup, Q_star, tol, "games.tabular.exact_hypergradient")
        return leader_objective_at(game, f, br.policy)

    return jax.grad(J)(theta)


def _response(game, f, beta, backup, Q_star, tol, caller):
    """The differentiable best response to f, solved here or at the given ``Q_star``; a given
    ``Q_star`` whose fixed-point residual misses ``tol`` (None: not checked) is refused as
    :func:`best_response` refuses a capped solve (concrete: ValueError; traced: NaN)."""
    check_solver_settings(caller, tol)
    if Q_star is None:
        return best_response(game, f, beta, backup)
    br = implicit_response(game, f, beta, jax.lax.stop_gradient(Q_star), backup)
    if tol is None:
        return br
    ok = refuse_unless_within(
        br.residual,
        br.Q,
        tol,
        caller,
        "a Q_star that is not the soft-Q fixed point at policy_fn(theta) (pass tol=None to "
        "take it as it is)",
    )
    return br._replace(policy=nan_unless(ok, br.policy))


def safe_log(p: Array) -> Array:
    """log p with p clipped at the dtype's smallest normal number (a policy's zeros give a large
    negative finite number, so ``0 * log 0`` terms vanish instead of giving NaN)."""
    return jnp.log(jnp.maximum(p, jnp.finfo(p.dtype).tiny))


def _log_policy(g: Array, log_g: Optional[Array], backup: str, caller: str) -> Array:
    """``log_g`` (checked against g's shape) or log g clipped (:func:`safe_log`), with a warning
    when the ``reference`` backup gets a concrete g that has underflowed and no ``log_g``."""
    if log_g is not None:
        check_shape("log_g", log_g, g.shape, "g's shape")
        if is_concrete(log_g) and not np.all(np.isfinite(np.asarray(log_g))):
            # 0 * log 0 is NaN in the entropy terms and in the reference backup's geometric mean
            bad = int(np.size(log_g) - np.count_nonzero(np.isfinite(np.asarray(log_g))))
            raise ValueError(
                f"games.tabular.{caller}: log_g must be finite, got {bad} of {np.size(log_g)} "
                "entries not finite (jnp.log of a g with zeros?): pass "
                "jax.nn.log_softmax(Q / beta, -1), finite where g underflows, or leave log_g out"
            )
        return jnp.asarray(log_g, g.dtype)
    # numpy: a concrete g may still be closed over by a trace (jnp would stage the comparison)
    if backup == "reference" and is_concrete(g) and np.any(np.asarray(g) < np.finfo(g.dtype).tiny):
        warnings.warn(
            f"games.tabular.{caller}: g has entries that underflowed to 0 (a softmax at a small "
            "beta?); the reference backup's geometric mean then uses log g clipped at "
            f"{np.log(np.finfo(g.dtype).tiny):.0f} and Q^g can be off by a few percent: "
            "pass log_g (e.g. jax.nn.log_softmax(Q / beta, -1))",
            stacklevel=3,
        )
    return safe_log(g)


@full_precision
def soft_policy_evaluation(
    game, f: Array, g: Array, beta, backup: str = "reference", log_g: Optional[Array] = None
):
    """The follower's entropy-regularised values of a *fixed* policy g against the leader's f.

    The linear Bellman equation of policy g (solved exactly, a dense [SAB, SAB] system):

        Q^g(s, a, b) = r_F(s, a, b) + gamma_F sum_{s'} p(s'|s, a, b) v^g(s')
        V^g(s, a)    = sum_b g(b|s, a) (Q^g(s, a, b) - beta log g(b|s, a))

    with the next-state value in the form of the follower's ``backup``
    (:mod:`bchg_jax.games.tabular.follower`):

    * ``"paper"``: ``v^g(s') = sum_{a'} f(a'|s') V^g(s', a')``, the soft value of g in the game;
    * ``"reference"``: ``v^g(s') = sum_{b'} h(b'|s') (sum_{a'} f(a'|s') Q^g(s', a', b') - beta
      log h(b'|s'))`` with ``h(.|s') = softmax_b'(sum_{a'} f(a'|s') log g(b'|s', a'))``, the
      policy the reference backup's follower plays at s' (it acts on the f-averaged Q; written
      in g, that policy is the f-weighted geometric mean of g).

    Each form's fixed point at the best response ``g = softmax(Q_F / beta)`` is the soft
    Q-iteration's Q_F (and V^g is ``beta logsumexp(Q_F / beta)``, Theorem 2's V_F), and the
    derivatives in f agree there too (the entropy terms are stationary at the softmax), so a
    follower at its best response gets the values of before. Differentiable in f and g.

    The ``reference`` form needs log g where g has underflowed to 0 (a softmax at a small beta:
    float32 below ~1e-38): clipped there, the geometric mean h is wrong, by up to ~3% of Q on a
    3-state game at beta 0.01. Pass ``log_g`` (e.g. ``log_softmax(Q / beta)``) when g is a
    softmax; without it a concrete g with such zeros gets a warning.

    Args:
      game: a :class:`~bchg_jax.games.tabular.game.TabularGame`.
      f: [S, A] leader policy. g: [S, A, B] follower policy (rows on the simplex).
      beta: the follower's entropy weight (> 0). backup: ``"reference"`` or ``"paper"``.
      log_g: optional [S, A, B] log g, exact where g underflows (default: log g clipped at the
        dtype's smallest normal number).
    Returns:
      (Q^g [S, A, B], V^g [S, A]).
    Raises:
      ValueError: an unknown ``backup``, a bad scalar setting of ``game``, a concrete ``beta``
        not finite and > 0, ``f`` / ``g`` / ``log_g`` not shaped by ``game.transition``, or a
        concrete ``log_g`` not finite (``jnp.log`` of a g with zeros: ``0 * log 0`` is NaN).
    """
    if backup not in BACKUPS:
        raise ValueError(f"backup must be one of {BACKUPS}, got {backup!r}")
    check_game(game)
    check_beta_if_concrete(beta)
    check_policy_shapes(game, f, g)
    dtype = compute_dtype(game, f, g, beta)
    f, g, beta, gamma_F = (jnp.asarray(x, dtype) for x in (f, g, beta, game.gamma_F))
    P = jnp.asarray(game.transition, dtype)
    r = jnp.asarray(game.follower_reward, dtype)
    S, A, B = r.shape
    log_g = _log_policy(g, log_g, backup, "soft_policy_evaluation")
    if backup == "paper":  # v(s') = sum_{a'b'} w Q(s', a', b') + c(s')
        w = f[:, :, None] * g
        c = -beta * jnp.sum(w * log_g, (1, 2))
    else:
        log_h = jax.nn.log_softmax(jnp.einsum("sa,sab->sb", f, log_g), -1)  # [S, B]
        h = jnp.exp(log_h)
        w = f[:, :, None] * h[:, None, :]
        c = -beta * jnp.sum(h * log_h, -1)
    n = S * A * B
    M = (P.reshape(n, S, 1) * w.reshape(1, S, A * B)).reshape(n, n)
    rhs = r.reshape(n) + gamma_F * P.reshape(n, S) @ c
    Q = jnp.linalg.solve(jnp.eye(n, dtype=dtype) - gamma_F * M, rhs).reshape(S, A, B)
    return Q, jnp.sum(g * (Q - beta * log_g), -1)


@full_precision
def as_if_optimal_hypergradient(
    policy_fn, theta, game, g: Array, beta, backup="reference", log_g: Optional[Array] = None
):
    """Theorem 2's hypergradient at the follower's *current* policy g, as if g were optimal.

    Theorem 2 (Eq. (hg_MG)) differentiates ``J_L(f_theta, g^{theta dagger})`` with the
    follower's response ``d log g = (1/beta) (dQ_F - E_g dQ_F)``. Here the same formula is
    evaluated at a policy g that need not be the best response, with g's own soft values: the
    gradient of ``J_L(f_theta, g_theta)`` where

        g_theta = softmax_b(log g + (Q^g_theta - stop_gradient(Q^g_theta)) / beta),

    ``Q^g_theta`` the soft policy evaluation of the fixed g against ``f_theta``
    (:func:`soft_policy_evaluation`): ``g_theta`` equals g, and its derivative is
    ``(1/beta) g (dQ^g - E_g dQ^g)``. With ``backup="paper"`` this is what the leader's
    estimator (Theorem 2's) targets when it reads g and pairs it with V^g (the ``target``
    reference of the trainer's ``track_reference``, in the config's backup); at the best
    response it equals :func:`exact_hypergradient` of the same backup, so with
    ``backup="reference"`` the estimator does not target it (see there).

    Args:
      policy_fn: theta -> f [S, A]. theta: the leader's parameters (pytree).
      game: the tabular game. g: [S, A, B] the follower's policy (held fixed).
      beta: the follower's entropy weight (> 0). backup: the follower's backup form.
      log_g: optional [S, A, B] log g, finite (as in :func:`soft_policy_evaluation`).
    Returns:
      a pytree like ``theta``.
    Raises:
      ValueError: as :func:`soft_policy_evaluation`, and a ``policy_fn`` whose rows leave the
        simplex.
    """
    check_game(game)
    check_beta_if_concrete(beta)
    g, sg = jax.lax.stop_gradient(g), jax.lax.stop_gradient

    log_g = sg(_log_policy(g, log_g, backup, "as_if_optimal_hypergradient"))
    check_policy_fn_on_simplex(policy_fn, theta, "games.tabular.as_if_optimal_hypergradient", game)

    def J(th):
        f = policy_fn(th)
        Q, _ = soft_policy_evaluation(game, f, g, beta, backup, log_g=log_g)
        g_th = follower_softmax(log_g + (Q - sg(Q)) / beta)
        return leader_objective_at(game, f, g_th)

    return jax.grad(J)(theta)


def _check_k_step_args(policy_fn, theta, game, Q_prev, beta, K, *_, **__) -> None:
    """The checks of :func:`k_step_hypergradient` (eagerly before a cached call: ``Q_prev``
    finite, ``policy_fn`` on the simplex at a concrete theta)."""
    check_game(game)
    check_beta_if_concrete(beta)
    check_count("K", K)
    S, A, B = np.shape(game.transition)[:3]
    check_shape("Q_prev", Q_prev, (S, A, B), f"S={S}, A={A}, B={B} from {game.name}")
    check_finite_if_concrete("Q_prev", Q_prev)
    check_policy_fn_on_simplex(policy_fn, theta, "games.tabular.k_step_hypergradient", game)


@cached_when_eager(_check_k_step_args)
@full_precision
def k_step_hypergradient(policy_fn, theta, game, Q_prev: Array, beta, K: int, backup="reference"):
    """The total derivative of ``J_L(f_theta, softmax(T_theta^K Q_prev / beta))`` with
    ``Q_prev`` [S, A, B] held fixed: the ``k_step`` follower's reaction to the leader, K soft
    Bellman backups (:func:`~bchg_jax.games.tabular.follower.soft_q_backups`) unrolled.

    K -> infinity gives :func:`exact_hypergradient` (the backups contract to the best
    response, whatever ``Q_prev``).

    Args:
      policy_fn: theta -> f [S, A]. theta: the leader's parameters (pytree).
      game: the tabular game. Q_prev: [S, A, B] the follower's soft Q before the backups.
      beta: the follower's entropy weight (> 0). K: backups (static int >= 1).
      backup: the follower's backup form.
    Returns:
      a pytree like ``theta``.
    Raises:
      ValueError: a bad scalar setting of ``game``, a concrete ``beta`` not finite and > 0,
        ``K`` not an integer >= 1, or ``Q_prev`` not [S, A, B] or (concrete) not finite.
    """
    _check_k_step_args(policy_fn, theta, game, Q_prev, beta, K)
    Q_prev = jax.lax.stop_gradient(Q_prev)

    def J(th):
        f = policy_fn(th)
        # in the promoted dtype (games.tabular.game.compute_dtype): the backups' loop carries it
        dtype = compute_dtype(game, f, beta)
        fd, b, gamma_F = (jnp.asarray(x, dtype) for x in (f, beta, game.gamma_F))
        P = jnp.asarray(game.transition, dtype)
        r = jnp.asarray(game.follower_reward, dtype)
        Q = soft_q_backups(P, r, jnp.asarray(Q_prev, dtype), fd, b, gamma_F, backup, K)
        return leader_objective_at(game, f, follower_softmax(Q / b))

    return jax.grad(J)(theta)


def _check_lag_args(policy_fn, theta, game, g_prev, beta, mix, *_, **__) -> None:
    """The checks of :func:`lag_hypergradient` (eagerly before a cached call: ``g_prev``'s
    rows, a concrete ``mix``, ``policy_fn`` on the simplex at a concrete theta)."""
    check_game(game)
    check_beta_if_concrete(beta)
    check_mix_if_concrete(mix)
    check_policy_shapes(game, g=g_prev, g_label="g_prev (the follower's previous policy)")
    check_policy_fn_on_simplex(policy_fn, theta, "games.tabular.lag_hypergradient", game)


def _warn_after_lag(
    _out, policy_fn, theta, game, g_prev, beta, mix, backup="reference", Q_star=None, tol=None
) -> None:
    """:func:`lag_hypergradient`'s value-dependent warning after a cached call."""
    _warn_rounded_logits_inside(policy_fn, theta, game, beta, backup, Q_star)


@cached_when_eager(_check_lag_args, _warn_after_lag)
@full_precision
def lag_hypergradient(
    policy_fn,
    theta,
    game,
    g_prev: Array,
    beta,
    mix,
    backup: str = "reference",
    Q_star: Optional[Array] = None,
    tol: Optional[float] = RESPONSE_TOL,
):
    """The total derivative of ``J_L(f_theta, (1 - mix) g_prev + mix g^{theta dagger})`` with
    ``g_prev`` [S, A, B] held fixed: the ``lag`` follower's reaction, ``mix`` times the best
    response's (implicit differentiation, :func:`best_response`; ``Q_star``: its fixed point
    at ``policy_fn(theta)`` if already solved). ``mix = 1`` gives :func:`exact_hypergradient`.

    Args:
      policy_fn: theta -> f [S, A]. theta: the leader's parameters (pytree).
      game: the tabular game. g_prev: [S, A, B] the follower's previous policy.
      beta: the follower's entropy weight (> 0). mix: the weight of the new best response.
      backup: the follower's backup form. Q_star: optional solved [S, A, B] fixed point.
      tol: as :func:`exact_hypergradient` (the residual a given ``Q_star`` must reach).
    Returns:
      a pytree like ``theta``; NaN where a traced ``mix`` is outside (0, 1].
    Raises:
      ValueError: a bad scalar setting of ``game``, a concrete ``beta`` not finite and > 0, a
        concrete ``mix`` outside (0, 1] (as ``FollowerModel``), a ``g_prev`` not [S, A, B]
        probability rows, or a concrete ``Q_star`` that misses ``tol``.
    """
    _check_lag_args(policy_fn, theta, game, g_prev, beta, mix)
    g_prev = jax.lax.stop_gradient(g_prev)

    def J(th):
        f = policy_fn(th)
        best = _response(game, f, beta, backup, Q_star, tol, "games.tabular.lag_hypergradient")
        best = best.policy
        return leader_objective_at(game, f, lag_mix(jnp.asarray(g_prev, best.dtype), best, mix))

    ok = mix_in_range(mix)  # a traced mix is not checked above: NaN, never an extrapolation
    return jax.tree.map(lambda x: nan_unless(ok, x), jax.grad(J)(theta))
