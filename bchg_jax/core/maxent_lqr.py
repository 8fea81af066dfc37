"""Entropy-regularised (max-ent) LQR follower: Riccati solution and Gaussian best response.

Follower problem (paper, appendix "Entropy-Regularized LQR with Observable and Unobservable
Disturbance", Propositions 1 and 2): dynamics ``s' = A s + B b + w``, ``w ~ N(0, U U^T)``
(Eq. (lqr_with_disturbance)), reward ``r_F(s, b) = -(s^T Qbar s + b^T Rbar b)``, discount
``gamma``, entropy weight ``beta``. Shapes: A [n, n], B [n, m], Qbar [n, n], Rbar [m, m],
U [n, d] (a factor of the disturbance covariance).

* :func:`riccati`: the stabilising solution of the discounted Riccati equation
  (Eq. (riccati_equation))
  ``P = Qbar + g A^T P A - g^2 A^T P B (Rbar + g B^T P B)^{-1} B^T P A`` by Riccati iteration from
  ``P = Qbar`` (or a warm start) until the relative change is below ``tol``. It is differentiable
  by the implicit function theorem (``jax.lax.custom_root``): the tangent solves the linearised
  fixed-point equation, never unrolls the loop.
* :func:`maxent_lqr`: Proposition 1, Eq. (lqr_opt_follower_cmdp) (disturbance unobservable
  when the follower acts):
  ``g(b|s) = N(-K s, (beta/2) S^{-1})``, ``S = Rbar + g B^T P B``, ``K = g S^{-1} B^T P A``,
  ``V_F(s) = -(s^T P s + v)`` with
  ``v = (-(beta m / 2) log(pi beta) + (beta/2) log det S + g tr(U^T P U)) / (1 - g)``.
* :func:`maxent_lqr_observable`: Proposition 2, Eq. (lqr_opt_follower_mg) (the follower sees
  ``w`` before acting, used by the bi-level LQR Markov game):
  ``g(b|s, w) = N(-K s - K_w w, (beta/2) S^{-1})``, ``K_w = g S^{-1} B^T P`` and
  ``V_F(s, w) = -(s^T Qbar s + (A s + w)^T M (A s + w) + v_w)`` with
  ``M = g P - g^2 P B S^{-1} B^T P`` and
  ``v_w = (-(beta m/2) log(pi beta) + (beta/2) log det S + g tr(U^T M U)) / (1 - g)``.

Values here are *rewards* (the paper's propositions state costs, V_cost = -V_F).
Non-convergence (an unstabilisable pair, ``max_iters`` too small, a rounding floor above
``tol``, or a solution too ill-conditioned for the dtype, below) is never silent: every
solution carries ``converged`` (finite, below tolerance, and the stabilising solution: its closed
loop ``A - B K`` stable under ``gamma``, :mod:`bchg_jax.core.stability`; ``unstable`` when only
that failed: the relative-change test also passes while P grows slowly without bound, and the
Newton steps below then reach a non-stabilising root) and ``residual``; callers decide
whether to raise (:func:`check_solution`) or to skip an update; the exact references
(:mod:`bchg_jax.lq.exact`, :mod:`bchg_jax.games.lqr.exact`) go through
:func:`nan_unless_converged`: an error for concrete arguments, NaN (value and gradient) when traced.

``converged`` means the *relative step change* of the last iteration is below ``tol``. Near the
fixed point the steps shrink by about ``rate = gamma rho(A - B K)^2`` per iteration, so the
iteration's remaining error is roughly ``tol / (1 - rate)``: near a marginal closed loop
(``sqrt(gamma) rho(A - B K) -> 1``) it can be far more than ``tol`` (a 2-d problem at rate
0.99984 stopped after 46,166 iterations 0.64% off, relative). :func:`riccati` therefore ends
with ``newton_iters`` (2) Newton steps on ``riccati_map(P) - P = 0``, whose convergence is
quadratic whatever the rate: on that problem 0.64% -> 3.7e-5 -> 1.2e-9 (float64). What they
cannot remove is rounding: float32 P is a fixed point of the *rounded* map to about
``eps / (1 - rate)`` (there 8.8e-4, with the residual exactly 0), so near a marginal closed loop
use float64.

Conditioning. Near an unstabilisable pair (a mode with ``sqrt(gamma) |lambda| >= 1`` that ``B``
barely reaches) the stabilising solution exists but is huge and hangs on digits of the data
that rounding decides: in the LQR game at the leader gain ``K = (15, -10)``, ``A + C K`` has the
coupling ``1 - 0.1 * 10``, exactly 0 when rounded term by term (an unstabilisable pair: no
solution, P overflows) and ``-5.6e-17`` when ``jit`` fuses it into a multiply-add (a
stabilisable pair with P ~ 1e34, its closed loop stable): the same call converged under ``jit``
and failed eagerly. Each iterate met the tests above; what was wrong is that the answer is not
determined by the data at this precision. :func:`relative_condition` measures that (the first-
order relative change of P per relative change of ``A, B, Qbar, Rbar``, one Newton-sized
solve), and a solution with ``eps * condition > ILL_CONDITIONED`` (1%) is flagged
``ill_conditioned`` and not converged. On the paper's problems the product stays far below it:
at most 7e-5 on 2000 random thermal leader weights (float32, drawn up to N(0, 10^2)) and 3.3e-4
on 2000 random LQR-game gains in [-30, 30]^2; it reaches 5e-3 at the game's gain (15, -9.999),
whose float32 P is 3.3e-4 off, and is infinite at (15, -9.999999), whose float32 P is 180% off
(float64 solves both, at 9e-12 and 9e-9).

Rounding also sets a floor under the relative change itself. :func:`riccati_map` evaluates the
map as ``Qbar + g (A - B K)^T P (A - B K) + K^T Rbar K``, a sum of PSD terms: the textbook form
subtracts two terms of size ``g |A|^2 |P|``, and a large gain cancels most of them (a leader
gain of 200 in a 2-d LQR game: float32 changes wandered at 1e-3 for all 50,000 iterations, 0.7%
off; in the stabilised form they reach 1e-4, 6e-5 off). Where the floor still lies above
``tol`` the iteration stops once the change has set no new minimum for :data:`STALL_ITERS`
iterations while P went nowhere (a net move of at most :data:`STALL_NET_SHARE` of the path
it travelled: a slowly growing mode, whose change rises for thousands of iterations before it
falls, moves one way), flagged ``stalled`` (not converged), and :func:`check_solution` says to use
float64.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from bchg_jax.core.eager import cached_when_eager
from bchg_jax.core.host_tests import chunked_while_loop
from bchg_jax.core.precision import full_precision
from bchg_jax.core.stability import is_discounted_stable
from bchg_jax.core.validate import (
    check_discount,
    check_if_concrete,
    check_shape,
    check_solver_settings,
    is_concrete,
)

Array = jax.Array


def held_policy(policy, dtype):
    """A follower's policy (any pytree, e.g. a Gaussian gain and covariance) held fixed for an
    exact reference: ``stop_gradient``, its floating leaves in ``dtype`` (theta's: a float64
    policy beside a float32 theta would widen the reference's sums and loop carries)."""
    return jax.tree_util.tree_map(
        lambda x: x.astype(dtype) if jnp.issubdtype(x.dtype, jnp.floating) else x,
        jax.lax.stop_gradient(policy),
    )


@full_precision
def check_value_matrix(owner: str, P_prev, n: int, value: str = "V(s) = -s^T P s") -> None:
    """A learner's value matrix ``P_prev`` (the learner's value ``value``): [n, n] (static, so
    traced values too) and, when concrete, finite, symmetric and positive semi-definite (the
    costs are, so every Riccati step from such a P is). ``-I`` (a sign slip: V = s^T s) gave a
    played covariance with negative eigenvalues, a NaN factor and yet a finite J and gradient.

    Args:
      owner: the problem's name, for the messages. P_prev: the matrix. n: the state dimension.
      value: what ``P`` stands for, for the messages.
    Raises:
      ValueError: another shape, a non-finite entry, an asymmetric or indefinite matrix.
    """
    check_shape("P_prev", P_prev, (n, n), f"n={n} from {owner}")
    if not is_concrete(P_prev):
        return
    P = np.asarray(P_prev, np.float64)
    scale = max(1.0, float(np.max(np.abs(P)))) if np.all(np.isfinite(P)) else np.nan
    if not np.max(np.abs(P - P.T)) <= 1e-6 * scale:  # NaN (a non-finite entry) fails too
        raise ValueError(f"{owner}: P_prev must be a finite symmetric matrix, got {P}")
    low = float(np.linalg.eigvalsh(P)[0])
    if low < -1e-6 * scale:
        raise ValueError(
            f"{owner}: P_prev must be positive semi-definite (the learner's value is "
            f"{value}), got smallest eigenvalue {low:.3g}"
        )


@full_precision
def riccati_map(P: Array, A: Array, B: Array, Qbar: Array, Rbar: Array, gamma) -> Array:
    """One Riccati iteration step (the right-hand side of Eq. (riccati_equation)).

    Args:
      P: [n, n] current iterate.
      A, B, Qbar, Rbar: the follower's LQR: [n, n] dynamics, [n, m] input, [n, n] state cost,
        [m, m] action cost.
      gamma: discount (scalar).
    Returns:
      [n, n] Qbar + g A^T P A - g^2 A^T P B (Rbar + g B^T P B)^{-1} B^T P A (symmetrised),
      computed in the stabilised form ``Qbar + g (A - B K)^T P (A - B K) + K^T Rbar K`` with the
      greedy gain ``K = g S^{-1} B^T P A`` (:func:`riccati_gain`): the same matrix for every
      ``P`` (expand it), but a sum of PSD terms instead of a difference of two large ones, so
      its rounding error is that of the answer, not of ``g A^T P A`` (module docstring).
    """
    K = riccati_gain(P, A, B, Rbar, gamma)
    Acl = A - B @ K
    out = Qbar + gamma * Acl.T @ P @ Acl + K.T @ Rbar @ K
    return 0.5 * (out + out.T)


def _rel_change(P_new, P):
    return jnp.max(jnp.abs(P_new - P)) / jnp.maximum(jnp.max(jnp.abs(P_new)), 1e-30)


# Newton steps after the Riccati iteration (module docstring)
NEWTON_ITERS = 2


class RiccatiInfo(NamedTuple):
    """Convergence record of :func:`riccati` (all scalars, or [...] under vmap)."""

    iterations: Array
    residual: Array  # relative change of the last iteration
    converged: Array  # bool: finite, residual <= tol, and the stabilising solution (below)
    # bool: the iteration met its test, but at a P whose closed loop A - B K is not stable under
    # gamma (gamma rho^2 >= 1): not the stabilising solution (module docstring)
    unstable: Array
    # bool: stopped before max_iters because the relative change had not reached a new minimum
    # for STALL_ITERS iterations, above tol, while P went nowhere: the rounding floor of the
    # dtype (module docstring)
    stalled: Array
    # bool: the iteration met its test at the stabilising solution, but one so sensitive to its
    # data that rounding them alone may move it by more than ILL_CONDITIONED (relative):
    # eps * relative_condition > ILL_CONDITIONED, a pair on the edge of stabilisability
    # (module docstring, "Conditioning")
    ill_conditioned: Array
    # relative_condition of the answer (0 where no Riccati iteration ran; inf / NaN when it
    # overflows)
    condition: Array


#: Iterations without a new smallest relative change after which :func:`riccati` looks for a
#: stall: the change then wanders at the rounding floor of the map and ``max_iters`` would not
#: help.
STALL_ITERS = 1000
#: A stall also needs P to have gone nowhere over those iterations: a net move (relative to P at
#: the window's start) of at most this share of the path it travelled (the sum of its relative
#: changes). Rounding noise walks back and forth (net ~ path / sqrt(STALL_ITERS), 0.03 of it); a
#: slow mode still growing (its change rising for thousands of iterations before it falls to
#: ``tol``) moves one way (net ~ path), and a P growing without bound (no stabilising solution)
#: moves by many times itself.
STALL_NET_SHARE = 0.25
#: A stabilising solution whose :func:`relative_condition` times the dtype's epsilon exceeds
#: this is flagged ``ill_conditioned`` and not converged: rounding the data alone may move P by
#: more than 1% (module docstring, "Conditioning").
ILL_CONDITIONED = 1e-2


def _iterate(A, B, Qbar, Rbar, gamma, P0, tol, max_iters):
    def cond(c):
        _, res, it, _, _, _, _, stalled = c
        going = (res > tol) & (it < max_iters) & jnp.isfinite(res) & ~stalled
        return (it == 0) | going

    def body(c):
        P, _, it, best, since, P_ref, path, _ = c
        P2 = riccati_map(P, A, B, Qbar, Rbar, gamma)
        res = _rel_change(P2, P)
        new_min = res < best
        since = jnp.where(new_min, 0, since + 1)
        path = path + res
        # a window of STALL_ITERS without a new minimum: a stall if P went nowhere along its
        # path (rounding noise), else a slow drift: start a new window from here
        window_end = since >= STALL_ITERS
        # (the net move relative to the window's start: relative to P2, a P that grows
        # geometrically - no stabilising solution - would read as one that went nowhere)
        stalled = window_end & (_rel_change(P_ref, P2) <= STALL_NET_SHARE * path)
        restart = new_min | (window_end & ~stalled)
        since = jnp.where(window_end & ~stalled, 0, since)
        P_ref = jnp.where(restart, P2, P_ref)
        path = jnp.where(restart, 0.0, path)
        return P2, res, it + 1, jnp.minimum(res, best), since, P_ref, path, stalled

    inf = jnp.asarray(jnp.inf, P0.dtype)
    zero = jnp.asarray(0, jnp.int32)
    no = jnp.zeros((), bool)
    init = (P0, inf, zero, inf, zero, P0, jnp.zeros((), P0.dtype), no)
    P, res, it, _, _, _, _, stalled = chunked_while_loop(cond, body, init)
    ok = jnp.isfinite(res) & (res <= tol) & jnp.all(jnp.isfinite(P))
    no = jnp.zeros((), bool)
    return P, RiccatiInfo(it, res, ok, no, stalled & ~ok, no, jnp.zeros((), P.dtype))


def riccati_gain(P: Array, A: Array, B: Array, Rbar: Array, gamma) -> Array:
    """K = gamma (Rbar + gamma B^T P B)^{-1} B^T P A [m, n]: the greedy gain of the value matrix
    ``P`` (Proposition 1's mean action is -K s)."""
    S = Rbar + gamma * B.T @ P @ B
    return gamma * jnp.linalg.solve(0.5 * (S + S.T), B.T @ P @ A)


def _fixed_point_jacobian(F, P: Array) -> Array:
    """[n^2, n^2] Jacobian of the matrix map ``F`` at ``P`` [n, n] (``jacfwd``, flattened)."""
    n = P.shape[0]
    return jax.jacfwd(lambda x: F(x.reshape(n, n)).reshape(-1))(P.reshape(-1))


def _newton_polish(A, B, Qbar, Rbar, gamma, P: Array, iters: int) -> Array:
    """``iters`` Newton steps ``P <- P - J(P)^{-1} F(P)`` on ``F(P) = riccati_map(P) - P = 0``
    from the converged iteration's answer (quadratic convergence near the fixed point, whatever
    the closed loop's rate; module docstring). A step that is not finite (a singular Jacobian: a
    closed loop on the edge of stability) leaves ``P`` as it was."""

    def F(X):
        return riccati_map(X, A, B, Qbar, Rbar, gamma) - X

    def step(X, _):
        dX = jnp.linalg.solve(_fixed_point_jacobian(F, X), F(X).reshape(-1)).reshape(X.shape)
        X_new = X - dX
        return jnp.where(jnp.all(jnp.isfinite(X_new)), 0.5 * (X_new + X_new.T), X), None

    return jax.lax.scan(step, P, None, length=iters)[0] if iters else P


@full_precision
def relative_condition(P: Array, A: Array, B: Array, Qbar: Array, Rbar: Array, gamma) -> Array:
    """Normwise relative condition number of the Riccati solution ``P`` in its data.

    At the fixed point, a change ``dX`` of ``X in (A, B, Qbar, Rbar)`` moves ``P`` by
    ``dP = -J^{-1} (d riccati_map / dX) dX`` to first order, ``J`` the Jacobian of
    ``riccati_map(P) - P`` in ``P`` (the implicit function theorem, as in :func:`riccati`'s
    derivative; the greedy gain is stationary, so ``d riccati_map / dX`` is taken at fixed
    ``K``). Returned: ``||[X_A |A|, X_B |B|, X_Q |Qbar|, X_R |Rbar|]||_F / |P|_F`` with
    ``X_. = J^{-1} d riccati_map / d.`` and Frobenius norms: an upper bound (by at most a
    factor ``n``) of ``sup |dP|_F / |P|_F`` over relative changes of size 1 of the data. Times
    the dtype's epsilon, it bounds how far rounding the data alone moves ``P`` (module
    docstring, "Conditioning"). One ``[n^2, n^2]`` Jacobian and solve, the size of a Newton
    step. Not differentiated.

    Args:
      P: [n, n] a Riccati solution.
      A, B, Qbar, Rbar, gamma: its LQR ([n, n], [n, m], [n, n], [m, m], scalar).
    Returns:
      [] the condition number (0 when P does not move to first order, e.g. P = 0; ``inf`` /
      NaN when ``J`` is singular or the products overflow).
    """
    sg = jax.lax.stop_gradient
    P, A, B, Qbar, Rbar = (sg(x) for x in (P, A, B, Qbar, Rbar))
    data = (A, B, Qbar, Rbar)

    def map_of(i):
        def f(x):
            args = list(data)
            args[i] = x.reshape(data[i].shape)
            return riccati_map(P, *args, gamma).reshape(-1)

        return f

    cols = [jax.jacfwd(map_of(i))(x.reshape(-1)) * _frobenius(x) for i, x in enumerate(data)]
    J = _fixed_point_jacobian(lambda X: riccati_map(X, *data, gamma) - X, P)
    X = jnp.linalg.solve(J, jnp.concatenate(cols, axis=1))
    moved, size = _frobenius(X), _frobenius(P)
    # P = 0 (Qbar = 0 and a closed loop that needs no cost): every column is 0 as well (each
    # term of the map's derivative carries P or |Qbar| = 0), and nothing moves: 0, not 0 / 0
    return jnp.where(moved == 0, jnp.zeros((), P.dtype), moved / size)


def _frobenius(x: Array) -> Array:
    """|x|_F computed on ``x / max|x|`` (no overflow of the squares; 0 for x = 0)."""
    m = jnp.max(jnp.abs(x))
    safe = jnp.where(m > 0, m, 1.0)
    return m * jnp.sqrt(jnp.sum((x / safe) ** 2))


def _riccati_checks(
    A, B, Qbar, Rbar, gamma, P0=None, tol=1e-6, max_iters=50_000, newton_iters=NEWTON_ITERS
) -> None:
    """:func:`riccati`'s checks of a concrete ``gamma`` and of its solver settings (an eager
    call's precheck, and its body's)."""
    check_if_concrete(check_discount, "gamma (the Riccati discount)", gamma)
    check_solver_settings("riccati", tol, max_iters=(max_iters, 1), newton_iters=(newton_iters, 0))


# a flagged P is returned as is (info.converged): the program's, without a plain recomputation
@cached_when_eager(_riccati_checks, recheck=False, problem_free=True)
@full_precision
def riccati(
    A: Array,
    B: Array,
    Qbar: Array,
    Rbar: Array,
    gamma,
    P0=None,
    tol: float = 1e-6,
    max_iters: int = 50_000,
    newton_iters: int = NEWTON_ITERS,
):
    """Solution ``P`` of the discounted Riccati equation and a :class:`RiccatiInfo`.

    P = Riccati(A, B, Qbar, Rbar, gamma) of Eq. (riccati_equation).
    Differentiable in every argument (implicit differentiation at the fixed point); vmappable
    (under vmap the loop runs until the slowest lane has converged). ``tol`` is the relative
    sup-norm change of one iteration (the reference uses 1e-6, at most 5e4 iterations).

    Args:
      A: [n, n] state matrix.
      B: [n, m] input matrix.
      Qbar: [n, n] state cost (symmetric PSD).
      Rbar: [m, m] action cost (symmetric PD).
      gamma: discount (scalar).
      P0: [n, n] warm start, or None for ``Qbar``.
      tol: relative sup-norm change at which the iteration stops.
      max_iters: cap on iterations.
      newton_iters: Newton steps on the fixed-point equation after the iteration (each an
        [n^2, n^2] Jacobian and solve, the implicit derivative's size; 0: none). They take P
        from about ``tol / (1 - rate)`` of the solution to the rounding floor (module
        docstring): 2 reach 1e-9 where the iteration stopped 0.6% off.
    Returns:
      (P, info): [n, n] Riccati solution and its :class:`RiccatiInfo` of the iteration (check
      ``info.converged``: the iteration met ``tol`` and the closed loop ``A - B K`` of the
      answer is stable under ``gamma``; ``info.unstable``: it met ``tol`` at a solution that is
      not the stabilising one; ``info.stalled``: it stopped early because rounding kept its
      change above ``tol`` for :data:`STALL_ITERS` iterations; ``info.ill_conditioned``: it
      met ``tol`` at the stabilising solution, but ``eps * info.condition`` (
      :func:`relative_condition`) exceeds :data:`ILL_CONDITIONED`; a non-converged P is
      returned as is).
    Raises:
      ValueError: a concrete ``gamma`` outside [0, 1) (1.5 "converged" to a meaningless P), a
        concrete ``tol`` not finite and > 0, ``max_iters`` not an integer >= 1 or
        ``newton_iters`` not an integer >= 0.
    """
    _riccati_checks(A, B, Qbar, Rbar, gamma, P0, tol, max_iters, newton_iters)
    A, B, Qbar, Rbar = (jnp.asarray(x) for x in (A, B, Qbar, Rbar))
    P0 = Qbar if P0 is None else jnp.asarray(P0, Qbar.dtype)
    n = A.shape[0]
    sg = jax.lax.stop_gradient
    # gamma in the matrices' dtype (a Python float would be float64 under jax_enable_x64)
    fixed = (sg(A), sg(B), sg(Qbar), sg(Rbar), sg(jnp.asarray(gamma, A.dtype)))
    P_star, info = _iterate(*fixed, sg(P0), tol, max_iters)
    # polish only a converged iteration: Newton from far away can reach another solution of
    # the Riccati equation (not the stabilising one); an unconverged P is flagged as it is
    P_star = jnp.where(info.converged, _newton_polish(*fixed, P_star, newton_iters), P_star)
    # the stopping test (a small relative change) also passes while P diverges slowly (the
    # change ~ 1 / t, or a growth rate below tol), and Newton then lands on a non-stabilising
    # root (module docstring): only a P whose closed loop is stable under gamma is converged
    A_, B_, Q_, R_, g_ = fixed
    stable = is_discounted_stable(A_ - B_ @ riccati_gain(P_star, A_, B_, R_, g_), g_)
    # a stabilising solution is converged only when its data determine it at this precision:
    # near an unstabilisable pair P is huge and rounding A alone moves it by more than itself
    # (module docstring, "Conditioning"); a NaN / inf estimate counts as ill-conditioned
    cond = relative_condition(P_star, A_, B_, Q_, R_, g_)
    eps = jnp.finfo(P_star.dtype).eps
    well = eps * cond <= ILL_CONDITIONED
    info = info._replace(
        converged=info.converged & stable & well,
        unstable=info.converged & ~stable,
        ill_conditioned=info.converged & stable & ~well,
        condition=cond,
    )

    def f(P):
        return riccati_map(P, A, B, Qbar, Rbar, gamma) - P

    def tangent_solve(g, y):
        # g is linear in an [n, n] matrix: materialise its n^2 x n^2 Jacobian and solve.
        J = _fixed_point_jacobian(g, jnp.zeros((n, n), y.dtype))
        return jnp.linalg.solve(J, y.reshape(-1)).reshape(n, n)

    # the loop above already converged: custom_root only attaches the implicit derivative
    P = jax.lax.custom_root(f, P_star, lambda _f, x: x, tangent_solve)
    return P, info


class GaussianBestResponse(NamedTuple):
    """The max-ent LQR follower: ``b ~ N(-K s [- K_w w], cov)``, ``V_F(s) = -(s^T P s + v)``.

    Propositions 1 and 2 (n states, m follower actions). For a solution of Proposition 2
    (:func:`maxent_lqr_observable`), ``v`` is v_w and the value is
    :func:`soft_value_observable`, not :meth:`value`.
    """

    P: Array  # Riccati solution [n, n]
    S: Array  # Rbar + gamma B^T P B [m, m]
    K: Array  # state gain [m, n]
    K_w: Array  # disturbance gain [m, n] (zeros for Proposition 1)
    cov: Array  # (beta / 2) S^{-1} [m, m]
    chol: Array  # Cholesky factor of cov
    M: Array  # gamma P - gamma^2 P B S^{-1} B^T P (the post-decision value matrix)
    v: Array  # constant of -V_F
    info: RiccatiInfo

    @property
    def converged(self):
        """Bool (or [...] under vmap): the Riccati iteration converged (``info.converged``)."""
        return self.info.converged

    @full_precision
    def mean(self, s: Array, w: Array | None = None) -> Array:
        """Mean action -K s [- K_w w] for ``s`` [..., n] and optional ``w`` [..., n] -> [..., m]."""
        out = -s @ self.K.T
        return out if w is None else out - w @ self.K_w.T

    @full_precision
    def sample(self, key: Array, s: Array, w: Array | None = None) -> Array:
        """b ~ N(mean(s, w), cov) for ``s`` [..., n] (``w`` [..., n] or None) -> [..., m]."""
        eps = jax.random.normal(key, s.shape[:-1] + (self.K.shape[0],), s.dtype)
        return self.mean(s, w) + eps @ self.chol.T

    @full_precision
    def value(self, s: Array) -> Array:
        """V_F(s) = -(s^T P s + v) (Proposition 1; see :func:`soft_value`)."""
        return soft_value(self, s)

    @full_precision
    def log_prob(self, s: Array, b: Array, w: Array | None = None) -> Array:
        """log g(b|s[, w]) for ``s`` [..., n], ``b`` [..., m] (``w`` [..., n] or None) -> [...]."""
        return gaussian_log_density(self.chol, b - self.mean(s, w))


def _response(P, A, B, Rbar, U, gamma, beta, info, observable: bool):
    m = B.shape[1]
    S = Rbar + gamma * B.T @ P @ B
    S = 0.5 * (S + S.T)
    Sinv_BtP = jnp.linalg.solve(S, B.T @ P)
    K = gamma * Sinv_BtP @ A
    M = gamma * P - gamma**2 * P @ B @ Sinv_BtP
    M = 0.5 * (M + M.T)
    cov = 0.5 * beta * jnp.linalg.inv(S)
    cov = 0.5 * (cov + cov.T)
    ent = -0.5 * beta * m * jnp.log(jnp.pi * beta) + 0.5 * beta * jnp.linalg.slogdet(S)[1]
    if observable:
        K_w = gamma * Sinv_BtP
        v = (ent + gamma * jnp.trace(U.T @ M @ U)) / (1.0 - gamma)
    else:
        K_w = jnp.zeros_like(K)
        v = (ent + gamma * jnp.trace(U.T @ P @ U)) / (1.0 - gamma)
    return GaussianBestResponse(P, S, K, K_w, cov, jnp.linalg.cholesky(cov), M, v, info)


@full_precision
def response_from_value(P, A, B, Rbar, U, gamma, beta, observable: bool = False):
    """The Boltzmann policy of ``Q = r_F + gamma E V_P(s')`` for any value matrix ``P`` [n, n]
    (``V_P(s) = -s^T P s``), packed as a :class:`GaussianBestResponse`: at the Riccati solution
    it is Proposition 1's (``observable``: 2's) best response; at an iterate, a learner's policy
    (:mod:`bchg_jax.lq.follower_models`). ``info`` records no iteration."""
    zero = jnp.zeros((), P.dtype)
    no = jnp.zeros((), bool)
    info = RiccatiInfo(jnp.zeros((), jnp.int32), zero, jnp.isfinite(jnp.sum(P)), no, no, no, zero)
    A, B, Rbar, U = (jnp.asarray(x, P.dtype) for x in (A, B, Rbar, U))
    return _response(P, A, B, Rbar, U, gamma, beta, info, observable=observable)


def _solve(A, B, Qbar, Rbar, U, gamma, beta, P0, tol, max_iters, observable: bool):
    """The Riccati solution and the best response of Proposition 1 or 2 built from it."""
    P, info = riccati(A, B, Qbar, Rbar, gamma, P0, tol, max_iters)
    A, B, Rbar, U = (jnp.asarray(x) for x in (A, B, Rbar, U))
    return _response(P, A, B, Rbar, U, gamma, beta, info, observable=observable)


@full_precision
def maxent_lqr(
    A, B, Qbar, Rbar, U, gamma, beta, P0=None, tol: float = 1e-6, max_iters: int = 50_000
) -> GaussianBestResponse:
    """Proposition 1: best response with an unobservable disturbance.

    g(b|s) = N(-K s, (beta/2) S^{-1}) of Eq. (lqr_opt_follower_cmdp), with
    P = Riccati(A, B, Qbar, Rbar, gamma).

    Args:
      A, B, Qbar, Rbar: the follower's LQR: [n, n] dynamics, [n, m] input, [n, n] state cost,
        [m, m] action cost.
      U: [n, d] disturbance factor (w ~ N(0, U U^T)).
      gamma: the follower's discount (scalar).
      beta: the follower's entropy weight (> 0).
      P0, tol, max_iters: passed to :func:`riccati` (``P0``: [n, n] or None).
    Returns:
      :class:`GaussianBestResponse` (``P``, ``S``, ``M`` ..., ``K`` [m, n], ``K_w`` = 0
      [m, n], ``cov`` and ``chol`` [m, m], ``v`` [], ``info``).
    """
    return _solve(A, B, Qbar, Rbar, U, gamma, beta, P0, tol, max_iters, observable=False)


@full_precision
def maxent_lqr_observable(
    A, B, Qbar, Rbar, U, gamma, beta, P0=None, tol: float = 1e-6, max_iters: int = 50_000
) -> GaussianBestResponse:
    """Proposition 2: best response when the disturbance ``w`` is observed before acting.

    g(b|s, w) = N(-K s - K_w w, (beta/2) S^{-1}) of Eq. (lqr_opt_follower_mg), with
    P = Riccati(A, B, Qbar, Rbar, gamma).

    Args:
      A, B, Qbar, Rbar, U, gamma, beta, P0, tol, max_iters: as :func:`maxent_lqr`.
    Returns:
      :class:`GaussianBestResponse` (``K`` [m, n], ``K_w`` [m, n], ``M`` [n, n], ``cov`` and
      ``chol`` [m, m], ``v`` = v_w [], ``info``).
    """
    return _solve(A, B, Qbar, Rbar, U, gamma, beta, P0, tol, max_iters, observable=True)


@full_precision
def soft_value(br: GaussianBestResponse, s: Array) -> Array:
    """V_F(s) = -(s^T P s + v) (Proposition 1), for any batch shape of ``s``.

    Args:
      br: a :class:`GaussianBestResponse` of :func:`maxent_lqr`.
      s: [..., n] states.
    Returns:
      [...] soft values (rewards).
    """
    return -(jnp.einsum("...i,ij,...j->...", s, br.P, s) + br.v)


@full_precision
def soft_value_observable(
    br: GaussianBestResponse, Qbar: Array, A: Array, s: Array, w: Array
) -> Array:
    """V_F(s, w) = -(s^T Qbar s + (A s + w)^T M (A s + w) + v_w) (Proposition 2).

    Args:
      br: a :class:`GaussianBestResponse` of :func:`maxent_lqr_observable`.
      Qbar: [n, n] state cost.
      A: [n, n] state matrix.
      s: [..., n] states.
      w: [..., n] observed disturbances.
    Returns:
      [...] soft values (rewards).
    """
    x = s @ A.T + w
    return -(
        jnp.einsum("...i,ij,...j->...", s, Qbar, s)
        + jnp.einsum("...i,ij,...j->...", x, br.M, x)
        + br.v
    )


@full_precision
def soft_q(br: GaussianBestResponse, A, B, Qbar, Rbar, U, gamma, s: Array, b: Array) -> Array:
    """Q_F(s, b) = r_F(s, b) + gamma E_w V_F(A s + B b + w) (Proposition 1).

    Args:
      br: a :class:`GaussianBestResponse` of :func:`maxent_lqr` (uses ``P``, ``v``).
      A, B, Qbar, Rbar: the follower's LQR: [n, n] dynamics, [n, m] input, [n, n] state cost,
        [m, m] action cost.
      U: [n, d] disturbance factor.
      gamma: discount (scalar).
      s: [..., n] states.
      b: [..., m] follower actions.
    Returns:
      [...] soft action values (rewards).
    """
    x = s @ A.T + b @ B.T
    quad = lambda M, z: jnp.einsum("...i,ij,...j->...", z, M, z)  # noqa: E731
    EV = -(quad(br.P, x) + jnp.trace(U.T @ br.P @ U) + br.v)
    return -(quad(Qbar, s) + quad(Rbar, b)) + gamma * EV


def is_stabilizable(A, B, gamma=1.0, tol: float = 1e-9) -> bool:
    """PBH test for (sqrt(gamma) A, B): every eigenvalue with |lambda| >= 1 is controllable.

    Host-side (numpy) check for validating problems before compilation (the stabilisability
    assumption of Propositions 1 and 2, for the discounted problem).

    Args:
      A: [n, n] state matrix.
      B: [n, m] input matrix.
      gamma: discount (scalar); the test is on sqrt(gamma) A.
      tol: eigenvalues with |lambda| >= 1 - tol are tested.
    Returns:
      bool, True when (sqrt(gamma) A, B) is stabilisable.
    """
    A = np.sqrt(float(gamma)) * np.asarray(A, np.float64)
    B = np.asarray(B, np.float64)
    n = A.shape[0]
    for lam in np.linalg.eigvals(A):
        if abs(lam) >= 1.0 - tol:
            M = np.concatenate([A - lam * np.eye(n), B], axis=1)
            if np.linalg.matrix_rank(M, tol=1e-8 * max(1.0, np.abs(M).max())) < n:
                return False
    return True


def check_solution(
    br: GaussianBestResponse, what: str = "Riccati iteration"
) -> GaussianBestResponse:
    """Host-side: raise a clear error when a (non-traced) solution did not converge.

    Args:
      br: a :class:`GaussianBestResponse` (concrete, possibly batched).
      what: the solver's name for the message.
    Returns:
      ``br`` unchanged.
    Raises:
      ValueError: some entry of ``br.info.converged`` is False (the message names the cause:
        a non-stabilising solution, an ill-conditioned one, a stall at the rounding floor, or
        the iteration cap).
    """
    info = jax.device_get(br.info)
    ok = np.asarray(info.converged)
    if np.any(np.asarray(info.unstable)):
        raise ValueError(
            f"{what} met its tolerance at a solution that is not the stabilising one: the "
            "follower's closed loop A - B K diverges under its discount (sqrt(gamma) rho > 1). "
            "Either no stabilising solution exists (the pair (sqrt(gamma) A, B) is "
            "unstabilisable; in an LQR game A is A + C K, the dynamics under the leader's gain "
            "K) or the iteration from Qbar stops at another one (a growing mode that Qbar does "
            "not penalise); raising max_iters does not help"
        )
    ill = np.asarray(info.ill_conditioned)
    if np.any(ill):
        dt = np.asarray(br.P).dtype
        conds = np.asarray(info.condition)[ill]
        size = (
            f"its relative condition number is {conds.max():.3g}, so rounding the data alone "
            f"may move it by {np.finfo(dt).eps * conds.max():.3g} (relative; the limit is "
            f"{ILL_CONDITIONED:g})"
            if np.all(np.isfinite(conds))
            else "its relative condition number overflows the dtype"
        )
        raise ValueError(
            f"{what} met its tolerance at the stabilising solution, but one too ill-conditioned "
            f"for {dt} to determine: {size}, and its value matrix reaches "
            f"{np.abs(np.asarray(br.P)).max():.3g}. The pair (sqrt(gamma) A, B) is on the "
            "edge of stabilisability (a mode that B barely reaches; in an LQR game A is "
            "A + C K, the dynamics under the leader's gain K): "
            + (
                "float64 may resolve it (jax.config.update('jax_enable_x64', True) and float64 "
                "arrays), else the problem itself is the cause"
                if np.finfo(dt).eps > np.finfo(np.float64).eps
                else "the problem itself is the cause"
            )
        )
    if not np.all(ok):
        res = np.asarray(info.residual)[~ok].max()
        its = int(np.asarray(info.iterations)[~ok].max())
        if np.all(np.asarray(info.stalled)[~ok]):
            dt = np.asarray(br.P).dtype
            raise ValueError(
                f"{what} stalled at a relative change of {res:.3g} ({its} iterations, the last "
                f"{STALL_ITERS} without getting closer): the rounding floor of {dt} for this "
                f"problem (its value matrix reaches {np.abs(np.asarray(br.P)).max():.3g}) lies "
                "above the tolerance, and more iterations do not help; "
                + (
                    "compute in float64 (jax.config.update('jax_enable_x64', True) and float64 "
                    "arrays)"
                    if dt == np.float32 or dt.itemsize < 4
                    else "loosen tol"
                )
            )
        if not (np.isfinite(res) and np.all(np.isfinite(np.asarray(br.P)))):
            raise ValueError(
                f"{what} did not converge: its value matrix grew until it overflowed "
                f"{np.asarray(br.P).dtype} ({its} iterations), as it does when the follower's "
                "pair (sqrt(gamma) A, B) is unstabilisable (in an LQR game A is A + C K, the "
                "dynamics under the leader's gain K); validate(theta) checks the pair"
            )
        raise ValueError(
            f"{what} did not converge (relative change {res:.3g} after {its} iterations): the "
            "follower's pair (sqrt(gamma) A, B) may be unstabilisable (in an LQR game A is "
            "A + C K, the dynamics under the leader's gain K), or raise max_iters"
        )
    return br


def nan_unless(ok, x: Array) -> Array:
    """``x`` where ``ok``, else NaN, and so is every derivative of it (works under ``jit``,
    ``vmap`` and ``grad``): ``x * where(ok, 1, NaN)``. A ``jnp.where(ok, x, nan)`` would give a
    zero gradient, not NaN, where ``ok`` is False.

    Args:
      ok: bool [] (or broadcastable to ``x``).
      x: an array.
    Returns:
      ``x`` (bitwise, where ``ok``) or NaN.
    """
    x = jnp.asarray(x)
    return x * jnp.where(ok, 1.0, jnp.nan).astype(x.dtype)


def nan_unless_converged(br, x: Array, what: str) -> Array:
    """An exact reference's output ``x`` computed from the solution ``br`` (anything with an
    ``info`` :class:`RiccatiInfo`): with a concrete ``br``, :func:`check_solution` raises on a
    non-converged solve; traced, ``x`` becomes NaN (:func:`nan_unless`), never a number from an
    unconverged solve.

    Raises:
      ValueError: a concrete ``br`` that did not converge (naming ``what``).
    """
    if is_concrete(br.info):
        check_solution(br, what)
    return nan_unless(br.info.converged, x)


@full_precision
def whiten(L: Array, d: Array) -> Array:
    """z = L^{-1} d for a lower-triangular ``L`` [k, k] and vectors ``d`` [..., k] -> [..., k].

    The inverse factor is computed once (a triangular solve against the identity, batched only
    over ``L``'s own batch under ``vmap``) and applied as a product, rather than one triangular
    solve per vector: jaxlib 0.10.x runs a batched LAPACK solve by splitting the batch over
    XLA:CPU's intra-op thread pool and blocking until the pieces are done, so two such solves
    over a batch of samples, run at once by the executor on a 2-thread pool, wait on each other
    forever (docs/performance.md, "The XLA:CPU stall"). The factors here are small and well
    conditioned (Cholesky factors of covariances), so the product loses nothing measurable.

    Args:
      L: [k, k] lower-triangular, non-singular.
      d: [..., k] vectors.
    Returns:
      [..., k] the solutions.
    """
    eye = jnp.eye(L.shape[-1], dtype=L.dtype)
    L_inv = jax.scipy.linalg.solve_triangular(L, eye, lower=True)
    return d @ L_inv.T


def gaussian_log_density(L: Array, d: Array) -> Array:
    """log N(d; 0, L L^T) for a lower-triangular factor ``L`` [k, k] and ``d`` [..., k] -> [...].

    ``-|L^{-1} d|^2 / 2 - (k / 2) log(2 pi) - sum_i log|L_ii|``: the Gaussian densities of the
    follower's best response, the LQ transition and the game leader (their scores are the
    hypergradients' score terms). ``L^{-1} d`` goes through :func:`whiten` (no LAPACK call
    batched over ``d``), and the constant is cast to ``d``'s dtype, so a float32 density stays
    float32 under ``jax_enable_x64`` (a numpy float64 constant would promote it).

    Args:
      L: [k, k] lower-triangular, non-singular (a Cholesky factor; a diagonal of either sign).
      d: [..., k] deviations from the mean.
    Returns:
      [...] log-densities.
    """
    z = whiten(L, d)
    log_det = jnp.sum(jnp.log(jnp.abs(jnp.diagonal(L)))).astype(d.dtype)  # log|L| = log|LL^T| / 2
    log_2pi = jnp.asarray(0.5 * L.shape[-1] * np.log(2 * np.pi), d.dtype)
    return -0.5 * jnp.sum(z**2, -1) - log_det - log_2pi


def quad_form(M: Array, z: Array) -> Array:
    """z^T M z over the last axis of ``z`` [..., d] (``M`` [d, d]) -> [...].

    Args:
      M: [d, d] matrix.
      z: [..., d] vectors.
    Returns:
      [...] quadratic forms.
    """
    return jnp.einsum("...i,ij,...j->...", z, M, z)
