"""Stopping tests that a float iteration can meet: the rounding floor of the fixed-point solvers.

The tabular solvers (soft value iteration, policy evaluation, their sparse forms, the games'
soft Q-iteration) stop when one sweep changes the values by at most ``tol`` in the sup norm.
In floating point a sweep rounds every value to within a few ``eps |V|``, so once ``tol`` is
below that scale the change may never reach it: near the fixed point the iterates can enter a
cycle a few units in the last place wide. Measured in float32 with ``tol`` 1e-6 on Four-Rooms:
at beta 0.1 (max |V| 13.8) some cold solves cycle at ~2e-6; at beta 0.3 (max |V| 41) every
solve, dense and sparse, ran to its 3000-sweep cap with a change of ~1.7e-6 and was flagged as
unconverged. The soft sweeps (with their log-sum-exp) cycle; the linear sweeps of policy
evaluation reached a change of exactly 0 in every case measured (Four-Rooms, |V| up to 4500),
but nothing guarantees it, so they follow the same rule.

The rule, used by every tabular solver with a tolerance:

* keep sweeping while the change is ``> tol``, unless the solve has *stalled at the rounding
  floor*: its change is ``<= rounding_floor(V)`` (``ROUNDING_ULPS * eps * max |V|``) and it
  has not made a new smallest change for :func:`stall_window` sweeps;
* a solve counts as converged (the trainers' ``solve_capped`` flag is 0) when its last change
  is ``<= max(tol, rounding_floor(V))`` (:func:`within_tolerance`).

Why a stall and not just a floor: in exact arithmetic the change of a gamma-contraction shrinks
by a factor gamma every sweep, so it never stalls. In floating point the observed change is the
true one plus a few ulps of rounding noise, so near the floor it can go many sweeps without a
new minimum and still be converging: the toy game's follower and Four-Rooms at beta 1 reach a
change of exactly 0 (a fixed point of the rounded sweep) after ~1250 sweeps. Stopping at the
floor alone would cut those short. The window is the sweeps gamma^k takes to shrink a change
``STALL_HALVINGS`` times by half (gamma 0.99: 207). Measured in float32, against float64
solutions (12 toy-game and 12 Four-Rooms solves at beta 0.1 to 3): with one halving the solves
that reach 0 stopped 10 to 150 sweeps early with 2.5x the error (1.0e-3 instead of 4.1e-4 at
beta 1); with two or more every such solve ran exactly as before; at beta 0.3 the cycling
solves stopped after 1416 (two halvings) / 1485 (three) sweeps instead of the 3000 cap, with
the same error (8.8e-5). Three leaves a margin. In float64 the floor is ~4e-15 |V| and never
binds at the tolerances used here.

Limits: the floor is global (``max |V|``), so in a problem whose values differ by orders of
magnitude a large-valued block cycling at its rounding level can stop the solve while a
small-valued block is still converging (its error then up to ``floor / (1 - gamma)``, above its
own rounding level); and a solve that hit its cap with a change within the floor counts as
converged even if the change was still shrinking. Neither was seen in the problems measured.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from bchg_jax.core.host_tests import chunked_while_loop

Array = jax.Array

# the rounding floor in units of eps * max |V|. Stalled changes measured at 0.3 to 2.2 (Four-Rooms,
# float32, beta 0.1 / 0.3, dense and sparse); one sweep's rounding grows with the number of terms
# summed, so the floor leaves a margin. It is below 1e-6 for |V| <= 1.04 (the paper's Four-Rooms
# follower: max |V_F| 1.01). A solve whose last change is within the floor counts as converged
# even when it hit its cap: it is as close as the dtype resolves.
ROUNDING_ULPS = 8
# the stall window in halvings of the change (module docstring: 2 was the least that let every
# converging solve measured run as before)
STALL_HALVINGS = 3


def rounding_floor(values: Array, axis=None) -> Array:
    """``ROUNDING_ULPS * eps(dtype) * max |values|``: the smallest sup-norm change a sweep of
    values of this size can be trusted to resolve.

    Args:
      values: the iterate (any shape, floating dtype).
      axis: the axis or axes of the maximum (None: all), e.g. 0 for the sparse solvers'
        run-last [S, R] values.
    Returns:
      the floor, ``values``' shape without ``axis`` ([] for None); 0 where ``values`` hold a
      non-finite entry (a diverged solve is never at its floor).
    """
    eps = jnp.finfo(values.dtype).eps
    floor = ROUNDING_ULPS * eps * jnp.max(jnp.abs(values), axis=axis)
    return jnp.where(jnp.isfinite(floor), floor, 0.0)  # diverged values get no floor


def within_tolerance(residual: Array, values: Array, tol, axis=None) -> Array:
    """Whether a solve with last change ``residual`` is converged: ``residual <= max(tol,
    rounding_floor(values))``.

    Args:
      residual: the last sweep's sup-norm change ([] or per lane).
      values: the solve's values (V, or a game's Q).
      tol: the requested tolerance.
      axis: as :func:`rounding_floor` (the floor must have ``residual``'s shape).
    Returns:
      bool, ``residual``'s shape.
    """
    return residual <= jnp.maximum(jnp.asarray(tol, residual.dtype), rounding_floor(values, axis))


def stall_window(gamma) -> Array:
    """Sweeps a change may go without a new minimum before it counts as stalled:
    ``ceil(STALL_HALVINGS log 2 / log(1 / gamma))``, the sweeps gamma^k takes to halve it
    ``STALL_HALVINGS`` (3) times, and at least 1 (gamma 0.99: 207; 0.9: 20).

    Args:
      gamma: the contraction factor (discount), scalar or per lane, may be traced.
    Returns:
      int32, ``gamma``'s shape.
    """
    g = jnp.clip(jnp.asarray(gamma, jnp.float32), 0.0, 1.0 - 1e-7)
    return jnp.maximum(jnp.ceil(STALL_HALVINGS * jnp.log(0.5) / jnp.log(g)), 1.0).astype(jnp.int32)


class Progress(NamedTuple):
    """The smallest change seen so far and the sweeps since it was last beaten."""

    best: Array
    since: Array


def progress_init(shape, dtype) -> Progress:
    """No change seen yet (best inf, since 0), ``shape`` [] or [R]."""
    return Progress(jnp.full(shape, jnp.inf, dtype), jnp.zeros(shape, jnp.int32))


def progress_update(progress: Progress, residual: Array, sweeps=1) -> Progress:
    """Record a change: a new minimum resets ``since``, anything else adds ``sweeps`` to it."""
    better = residual < progress.best
    return Progress(
        jnp.minimum(residual, progress.best),
        jnp.where(better, 0, progress.since + sweeps).astype(jnp.int32),
    )


def keep_sweeping(residual: Array, values: Array, tol, progress: Progress, window, axis=None):
    """The solvers' loop test (module docstring): the change is above ``tol`` and the solve has
    not stalled at the rounding floor.

    Args:
      residual: the last sweep's change (inf before the first).
      values: the current iterate.
      tol: the requested tolerance.
      progress: the :class:`Progress` after the last sweep.
      window: :func:`stall_window` of the solve's discount.
      axis: as :func:`rounding_floor`.
    Returns:
      bool, ``residual``'s shape.
    """
    stalled = (residual <= rounding_floor(values, axis)) & (progress.since >= window)
    return (residual > tol) & ~stalled


def sweep_to_tolerance(sweep, x0: Array, tol, max_sweeps, gamma, min_sweeps: int = 0):
    """Apply ``sweep`` from ``x0`` in one ``while`` loop until the sup-norm change is ``<= tol``,
    the solve has stalled at the rounding floor (:func:`keep_sweeping`), or ``max_sweeps``
    sweeps: the loop of every dense tabular solver with a tolerance. The loop is
    :func:`~bchg_jax.core.host_tests.chunked_while_loop` (on an accelerator, a host test every
    few sweeps; the same iterates).

    Args:
      sweep: one fixed-point sweep, ``x -> x'`` (same shape and dtype).
      x0: the warm start (V [S], or a game's Q [S, A, B]); it sets the carry's dtype.
      tol: the requested tolerance (may be traced).
      max_sweeps: the sweep cap (may be traced).
      gamma: the contraction factor, for :func:`stall_window`.
      min_sweeps: sweeps made whatever the test says (the game's solver makes one, also at a
        traced ``tol`` of inf).
    Returns:
      ``(x, residual, sweeps)``: the last iterate, the sup-norm change of the last sweep (inf
      when no sweep ran) and the sweeps performed (int32 []).
    """
    window = stall_window(gamma)

    def cond(c):
        x, res, k, progress = c
        return (k < min_sweeps) | (keep_sweeping(res, x, tol, progress, window) & (k < max_sweeps))

    def body(c):
        x, _, k, progress = c
        x2 = sweep(x)
        res = jnp.max(jnp.abs(x2 - x))
        return x2, res, k + 1, progress_update(progress, res)

    inf = jnp.asarray(jnp.inf, x0.dtype)
    init = (x0, inf, jnp.zeros((), jnp.int32), progress_init((), x0.dtype))
    x, res, k, _ = chunked_while_loop(cond, body, init)
    return x, res, k


def refuse_unless_within(residual: Array, values: Array, tol, what: str, caps: str) -> Array:
    """Whether a differentiable solve met its tolerance (:func:`within_tolerance`), refusing a
    concrete miss: an exact best response never returns an unconverged solve silently.

    Args:
      residual: the solve's fixed-point residual [] (may be traced, or under an eager ``grad``).
      values: its values (V, or a game's Q), for the rounding floor.
      tol: the requested tolerance.
      what: the function, for the message.
      caps: the caller's iteration settings, for the message (e.g. ``"max_sweeps=5"``).
    Returns:
      ``ok`` [] bool: pass it to :func:`bchg_jax.core.maxent_lqr.nan_unless` so that a traced
      miss gives NaN values (and derivatives).
    Raises:
      ValueError: a concrete miss (also under an eager ``grad``, where ``ok`` is concrete); a
        non-finite residual or value is named as such, not as a short solve.
    """
    ok = within_tolerance(residual, values, tol)
    if not isinstance(ok, jax.core.Tracer) and not bool(ok):
        res, seen = jax.lax.stop_gradient((residual, values))
        if not (np.isfinite(float(res)) and np.all(np.isfinite(np.asarray(seen)))):
            raise ValueError(
                f"{what}: the solve gave non-finite values (residual {float(res):.3g}): an "
                f"overflow in {np.asarray(seen).dtype} (e.g. rewards / beta beyond its range "
                "at a tiny beta) or non-finite inputs, not a short solve: more iterations "
                "would not help"
            )
        raise ValueError(
            f"{what}: the solve missed its tolerance (residual {float(res):.3g} > max(tol="
            f"{float(tol):g}, rounding floor {float(rounding_floor(seen)):.3g})) with {caps}"
        )
    return ok
