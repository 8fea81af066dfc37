"""Sparse-successor solvers: the follower's best response and policy evaluation on a successor
table.

Most tabular environments reach a few states from each state (Four-Rooms: at most 4 of 104), so
a dense Bellman sweep, a [S*B, S] x [S] product, does ~S/J times the work the maths needs. Here
the support is a fixed integer table ``index`` [S, J] (the states reachable from s under any
action, padded with a valid state of probability 0); the probabilities are still read from
``transition(theta)`` at every call, so a theta-dependent model keeps working as long as its
support stays inside the table.

The rule (support): the table is built once, as the union of the supports seen at a finite set
of probe thetas (:func:`probe_support`: theta0 and 12 random thetas), so it cannot know where
the support goes elsewhere. :func:`outside_support` tests whether a table P has a non-zero
entry outside it (exact: a count of non-zero entries per row); :func:`lost_mass` measures the
probability mass that falls outside (per (s, b) row: the row sum of P minus the sum over the
table's entries; the largest over rows; :func:`lost_mass_tolerance` is its rounding level).
Both solvers return the mass with ``return_lost_mass=True``, and without it refuse a concrete
``P`` with an entry outside the table (:func:`check_holds_support`; a traced one is the
caller's to check). The tabular trainer tests it at every iteration (unless ``transition``
does not depend on theta at all), flags it (metric ``support_lost``) and takes that
iteration's follower and metric from the dense solvers (:func:`cond_on_any_lane`), so its J
is never that of a truncated model; a sampler table that lost mass draws that iteration's
rollouts from the whole transition.

Two solvers, both run-last batched (:mod:`bchg_jax.core.run_last`: under ``vmap`` the run axis is
the minor, contiguous one):

* :func:`sparse_soft_value_iteration`: the best response of Eq. (lower) by *modified* soft policy
  iteration (Puterman and Shin's modified policy iteration with the soft Bellman operator): each
  soft sweep (the one with ``exp``) gives the Boltzmann policy and the stopping residual, and is
  followed by ``linear_sweeps`` cheap sweeps of the entropy-regularised Bellman *expectation*
  operator of that policy (no ``exp``). It stops on the same test as
  :func:`~bchg_jax.tabular.follower.soft_value_iteration` (sup-norm change of a soft sweep
  ``<= tol``) and returns the same fixed point; ``linear_sweeps=0`` is plain soft value iteration.
  In floating point each operator has a fixed point of its own, a few rounding units
  (~eps |V|) from the other's; once they differ by more than ``tol`` (float32, tol 1e-6: from
  |V| ~12 on a random model with 3 successors per state; Four-Rooms from beta ~0.05, |V| ~7)
  every round of expectation sweeps pulls V back to its own fixed point and the soft sweep after
  it never gets within ``tol``. So a lane drops its expectation sweeps for good once a round of
  them fails to reduce the soft residual (below ``EXPECTATION_MIN_REDUCTION`` times the last
  one) *at the rounding floor* (within ``EXPECTATION_FLOOR_MULTIPLE`` times
  :func:`~bchg_jax.core.rounding.rounding_floor`; the failures measured there sat at 0.1 to 0.5
  floors) and finishes with plain soft sweeps, which converge as the dense solver does (S = 40,
  3 successors, beta 0.5, gamma 0.9, |V| 45: 125 sweeps, dense 151; before, every such solve
  ran to ``max_sweeps``). Far above the floor a round can fail for a while as values spread:
  on Four-Rooms without its terminal state (the goal absorbing, reward forever), cold, the
  residual went 1.00, 0.58, 0.84 in the first three rounds as the goal's value front switched
  the policy of 62 states; counting that as the floor sent the solve to plain sweeps (float64,
  beta 1e-3: 1270 sweeps instead of 545; float32: 1399 instead of 763). With its terminal
  state Four-Rooms never fails a round before it converges (beta 1e-3: 103 sweeps, plain 149).
  Where ``tol`` is below the soft sweep's own rounding (Four-Rooms at beta 0.1, |V| ~14: ~2
  ulps; beta 0.3: every solve), plain soft sweeps of either solver can still cycle above
  ``tol``; both then stop once the change has stalled at the rounding floor
  (:mod:`bchg_jax.core.rounding`).
* :func:`sparse_policy_evaluation`: V^g by warm-started expectation sweeps to tolerance (the
  exact J_L metric of the training loops); unbatched, the stopping test runs after every
  ``ONE_RUN_SWEEPS_PER_TEST`` sweeps (the same test, on the last sweep's change; every sweep
  when ``max_sweeps`` is not a multiple of it, so that no solve passes the cap).

The expectation sweeps (of both solvers) are *multi-colour Gauss-Seidel* sweeps with the
self-transition solved exactly: the states are coloured so that no state's successors share its
colour (:func:`colour_classes`, greedy; Four-Rooms: 3 colours), and a sweep updates one colour
class after the other, each from the latest values, as
``V(s) = (r_g(s) + sum_{s' != s} A(s, s') V(s')) / (1 - A(s, s))`` with
``A = gamma cont P_g``. It has the same fixed point, is a gamma-contraction in the sup norm like
a plain (Jacobi) sweep (so the stopping test ``change <= tol`` bounds the error as before), and
converges no slower (the comparison theorem for regular splittings of the M-matrix I - A; on
Four-Rooms at beta 5e-3 the metric needs 71 sweeps instead of 152). The states are permuted
once per solve so that every class is a contiguous block of rows.

Forward-only (no derivative rule): use :func:`~bchg_jax.tabular.exact.best_response` for
derivatives in theta.
"""

from __future__ import annotations

import functools
import os
from typing import Callable, NamedTuple, Optional, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from jax.custom_batching import custom_vmap
from jax.extend import core as jax_core

from bchg_jax.core.eager import running_eagerly
from bchg_jax.core.precision import full_precision
from bchg_jax.core.rounding import (
    keep_sweeping,
    progress_init,
    progress_update,
    rounding_floor,
    stall_window,
)
from bchg_jax.core.run_last import (
    add_run_axis,
    callers_precision,
    compacting_while_loop,
    in_callers_precision,
    run_last,
)
from bchg_jax.core.validate import (
    check_discount,
    check_if_concrete,
    check_int_range,
    check_shape,
    check_solver_settings,
    is_concrete,
    transition_sizes,
)
from bchg_jax.tabular.cmdp import TabularCMDP
from bchg_jax.tabular.follower import (
    BestResponse,
    boltzmann,
    check_follower_inputs,
    continuation,
)

Array = jax.Array

# the automatic solver choice takes the successor form when J <= S * SPARSE_MAX_FRACTION
SPARSE_MAX_FRACTION = 0.25
# sweeps per stopping test of the unbatched policy evaluation (one run: 4 sweeps per loop trip
# cut one Four-Rooms iteration at beta 5e-3 from 0.26 to 0.20 ms; 6 no better; 1 per trip under
# vmap)
ONE_RUN_SWEEPS_PER_TEST = 4
#: the environment variable that forces a form of the soft solver's rounds (:func:`round_form`)
ROUND_ENV_VAR = "BCHG_SPARSE_ROUND"
ROUND_FORMS = ("auto", "loop", "unrolled")
#: the most successor terms (sweeps x colour classes x successors per state) that the unrolled
#: form of a round puts in one loop trip, each a gather of its own: XLA's compile time grows
#: with them (for the H200 target, jax 0.10.2: 16 sweeps of S 500, 20 successors, 15 colours
#: compiled in 9.4 s unrolled and 1.6 s as the loop; S 2000, 40 successors, 26 colours in 135 s
#: and 2.4 s). Four-Rooms' round (16 x 3 x 4 = 192) fits whole; a larger one unrolls fewer sweeps
#: per trip, and one where fewer than two fit is the loop on every platform
ROUND_UNROLL_TERMS = 256
# the probes of the support (:func:`probe_support`): theta0, then PROBE_DRAWS random thetas
# theta0 + scale N(0, I) at each of PROBE_SCALES
PROBE_SCALES = (1.0, 3.0, 10.0)
PROBE_DRAWS = 4
# the sparse soft solver keeps its expectation sweeps while each round of them brings the soft
# residual below this fraction of the last one (1: any reduction; module docstring). Rounds cut
# it by 0.67 (Four-Rooms, beta 0.02) to 0.001; at the float rounding floor they do not (ratios
# 0.5 to 2, 1 exactly most often), and a fraction of 0.9 or gamma^(1 + linear_sweeps) already
# switched some Four-Rooms solves at beta 1e-3 to plain sweeps (103 -> up to 149 sweeps)
EXPECTATION_MIN_REDUCTION = 1.0
# ... and a round counts as failed only when its soft residual is within this multiple of the
# rounding floor (core.rounding). Far above it a round can fail by wave propagation: Four-Rooms
# without its terminal state, cold start, round 3 (sweep 34) raised the residual 0.58 -> 0.84
# (2.6e13 floors in float64, 4.8e4 in float32) as the goal's value front switched the policy of
# 62 states, and the solve fell back to plain sweeps (float64 1270 sweeps instead of 545). The
# rounding-level failures measured sat at 0.11 to 0.46 floors; any multiple from 1 to 1e4 gave
# the same sweeps on every case measured. The two fixed points' gap grows like 1 / (1 - gamma)
# (those cases: gamma 0.9 to 0.99); a float32 problem with a discount far above 0.99 (which the
# trainers warn of) could fail its rounds above 64 floors, and its solve would then run to
# max_sweeps and be flagged solve_capped, not pass unconverged.
EXPECTATION_FLOOR_MULTIPLE = 64.0
# mass outside the table above max(LOST_MASS_ULPS, J) * eps(dtype) per row is lost mass
# (:func:`lost_mass_tolerance`): float32 7.6e-6 for J <= 64, float64 1.4e-14
LOST_MASS_ULPS = 64


class Successors(NamedTuple):
    """A fixed successor table: ``index`` [S, J] int32 (padded), ``valid`` [S, J] bool.

    Row s lists the states reachable from s; entries with ``valid`` False are padding (read as
    probability 0, but still a state in [0, S)). The valid entries of a row must be distinct
    (a repeated one would count its probability twice). The builders
    (:func:`successors_from_support`, :func:`successors_from_transition`,
    :func:`problem_successors`) also keep them in increasing order, which makes
    :func:`~bchg_jax.tabular.rollout.rollout` draw the same states as the dense sampler; every
    public function that takes a table (the sparse solvers, ``rollout``, :func:`colour_classes`)
    checks it with :meth:`check`.
    """

    index: np.ndarray
    valid: np.ndarray

    @property
    def width(self) -> int:
        """J, the most successors of any state."""
        return int(self.index.shape[1])

    def check(self, num_states: int, src: str = "") -> None:
        """Raises ValueError unless this is a successor table of ``num_states`` states: ``index``
        an integer [S, J] array (J >= 1) of states in [0, S), ``valid`` a boolean array of the
        same shape, and no state listed twice among a row's valid entries. ``src`` says where
        S came from (shown in the error)."""
        index, valid = np.asarray(self.index), np.asarray(self.valid)
        S, at = int(num_states), f" ({src})" if src else ""
        if not np.issubdtype(index.dtype, np.integer):
            raise ValueError(f"successors.index must be an integer array, got dtype {index.dtype}")
        check_shape("successors.index", index, (S, index.shape[-1] if index.ndim else 0), src)
        if index.shape[1] < 1:
            raise ValueError(f"successors.index must have at least one column, got {index.shape}")
        if valid.dtype != np.bool_ or valid.shape != index.shape:
            raise ValueError(
                f"successors.valid must be a bool array shaped like successors.index "
                f"{index.shape}, got dtype {valid.dtype} shape {valid.shape}"
            )
        bad = (index < 0) | (index >= S)
        if np.any(bad):
            s, j = np.argwhere(bad)[0]
            raise ValueError(
                f"successors.index[{s}, {j}] = {index[s, j]} is not a state in [0, {S}){at} "
                "(padding too must name a state; mark it invalid instead)"
            )
        keyed = np.where(valid, index, -1 - np.arange(index.shape[1]))  # padding never repeats
        ordered = np.sort(keyed, axis=1)
        repeated = ordered[:, 1:] == ordered[:, :-1]
        if np.any(repeated):
            s, j = np.argwhere(repeated)[0]
            raise ValueError(
                f"successors: state {ordered[s, j + 1]} is listed twice among row {s}'s valid "
                "entries (its probability would count twice); list each successor once"
            )


def successors_from_support(support: np.ndarray) -> Successors:
    """The successor table of a boolean support ``support`` [S, S'] (s' reachable from s).

    Args:
      support: [S, S] bool (any action).
    Returns:
      :class:`Successors` with J = the largest row count (at least 1); padding repeats the row's
      first successor (or s itself for a row without any) and is marked invalid.
    """
    support = np.asarray(support, bool)
    S = support.shape[0]
    rows = [np.flatnonzero(support[s]) for s in range(S)]
    J = max(1, max(len(r) for r in rows))
    index = np.empty((S, J), np.int32)
    valid = np.zeros((S, J), bool)
    for s, row in enumerate(rows):
        pad = row[0] if len(row) else s
        index[s] = np.concatenate([row, np.full(J - len(row), pad)]).astype(np.int32)
        valid[s, : len(row)] = True
    return Successors(index, valid)


def successors_from_transition(P) -> Successors:
    """The successor table of one transition table ``P`` [S, B, S] (entries != 0 under any b)."""
    P = np.asarray(P)
    transition_sizes("P (transition)", P)
    return successors_from_support(np.any(P != 0, axis=1))


class SupportProbe(NamedTuple):
    """What :func:`probe_support` saw: ``successors`` (the union table), ``fixed`` (every probe
    had the same support), ``probes`` (thetas used), ``skipped`` (probes with a non-finite
    table, left out)."""

    successors: Successors
    fixed: bool
    probes: int
    skipped: int


def probe_support(
    problem: TabularCMDP,
    draws: int = PROBE_DRAWS,
    scales: Sequence[float] = PROBE_SCALES,
    seed: int = 0,
    sampler: bool = False,
) -> SupportProbe:
    """The supports of ``problem.transition`` (``problem.sampler_transition`` with
    ``sampler=True``) at ``theta0`` and at ``draws`` random thetas ``theta0 + scale N(0, I)``
    for each scale of ``scales`` (evaluated eagerly, before any jit; 13 thetas by default).

    A probe whose table has a non-finite entry (outside the model's domain) is skipped.

    Args:
      problem: the tabular CMDP.
      draws: random thetas per scale.
      scales: the noise scales.
      seed: seed of the numpy generator of the draws.
      sampler: probe the sampler's table instead of the follower's model.
    Raises:
      ValueError: ``draws`` not an integer >= 0, a scale not finite and > 0, or a table that is
        not finite at every probe.
    Returns:
      :class:`SupportProbe`: the union's :class:`Successors` table and whether every probe
      had the same support (``fixed``); a support that differs between probes depends on theta,
      so the union of finitely many probes need not hold it everywhere.
    """
    check_int_range("draws (random thetas per scale)", draws, 0, float("inf"))  # -3: 1 probe
    draws = int(draws)
    scales = [float(x) for x in np.atleast_1d(np.asarray(scales, np.float64))]
    if not all(np.isfinite(x) and x > 0 for x in scales):
        raise ValueError(f"scales must be finite and > 0, got {scales}")
    theta0 = np.asarray(problem.theta0)
    rng = np.random.default_rng(seed)
    table = problem.sampler_transition if sampler else problem.transition
    thetas = [theta0] + [
        theta0 + scale * rng.standard_normal(theta0.shape) for scale in scales for _ in range(draws)
    ]
    union, first, fixed, skipped = None, None, True, 0
    for theta in thetas:
        P = np.asarray(table(jnp.asarray(theta, theta0.dtype)))
        if not np.all(np.isfinite(P)):
            skipped += 1
            continue
        support = np.any(P != 0, axis=1)
        if union is None:
            union, first = support, support
        else:
            union = union | support
            fixed = fixed and bool(np.array_equal(support, first))
    if union is None:
        raise ValueError(
            f"{problem.name}: the transition table is non-finite at theta0 and at "
            f"every probed theta"
        )
    return SupportProbe(successors_from_support(union), fixed, len(thetas) - skipped, skipped)


def problem_successors(problem: TabularCMDP, **probe) -> Successors:
    """The successor table of ``problem.transition`` (of ``problem.sampler_transition`` with
    ``sampler=True``): the union of the supports at ``theta0`` and at ``draws`` random thetas
    ``theta0 + scale N(0, I)`` per scale of ``scales`` (:func:`probe_support`; ``**probe``, its
    ``draws``, ``scales``, ``seed`` and ``sampler``, are passed on to it by keyword).

    The rule: the table holds every state reachable at a probed theta, nothing more. A model
    whose support moves with theta may put mass outside it at other thetas; the solvers measure
    that mass at every call (:func:`lost_mass`), and the tabular trainer flags it
    (``support_lost``) and solves that iteration densely. ``TrainConfig(solver="auto")`` takes
    the sparse form only when every probe had the same support (and J <= S/4).
    """
    return probe_support(problem, **probe).successors


def prefers_sparse(successors: Successors, num_states: int) -> bool:
    """The automatic rule: the successor form when J <= S / 4 (``SPARSE_MAX_FRACTION``)."""
    return successors.width <= SPARSE_MAX_FRACTION * num_states


def colour_classes(successors: Successors) -> np.ndarray:
    """A colouring of the states in which no state shares its colour with a successor or a
    predecessor (greedy, highest degree first): [S] int colours 0..K-1.

    The states of one colour do not depend on each other in a Bellman sweep, so a Gauss-Seidel
    sweep can update a whole class at once from the latest values of the others.

    Raises:
      ValueError: ``successors`` is not a successor table of its S states
        (:meth:`Successors.check`).
    """
    index = np.asarray(successors.index)
    successors.check(index.shape[0] if index.ndim else 0, "colour_classes: S from its index")
    return _colour(index)


def _colour(index: np.ndarray) -> np.ndarray:
    """:func:`colour_classes` of a checked ``index`` [S, J] (padding included: a neighbour too
    many only costs a colour, never a wrong class)."""
    S = index.shape[0]
    neighbours = [set() for _ in range(S)]
    for s in range(S):
        for t in index[s]:
            if t != s:
                neighbours[s].add(int(t))
                neighbours[int(t)].add(s)
    colour = np.full(S, -1, np.int64)
    for s in sorted(range(S), key=lambda s: (-len(neighbours[s]), s)):
        used = {colour[t] for t in neighbours[s]}
        colour[s] = next(k for k in range(S) if k not in used)
    return colour


class _Order(NamedTuple):
    """The state order of the Gauss-Seidel sweeps: ``perm`` [S] (row i holds state perm[i]),
    ``inv`` [S] (state s sits at row inv[s]), ``bounds`` (the colour classes' row ranges),
    ``index`` [S, J] the successor table in row numbers, ``self_mask`` [S, J] index == row."""

    perm: np.ndarray
    inv: np.ndarray
    bounds: tuple
    index: np.ndarray
    self_mask: np.ndarray


def _gauss_seidel_order(index: np.ndarray) -> _Order:
    colour = _colour(index)
    perm = np.argsort(colour, kind="stable").astype(np.int32)  # int32: same under x64 or not
    inv = np.empty_like(perm)
    inv[perm] = np.arange(len(perm), dtype=np.int32)
    ends = np.cumsum(np.bincount(colour))
    bounds = tuple(
        (int(lo), int(hi)) for lo, hi in zip(np.concatenate([[0], ends[:-1]]), ends, strict=False)
    )
    new_index = inv[index[perm]].astype(np.int32)
    return _Order(perm, inv, bounds, new_index, new_index == np.arange(len(perm))[:, None])


def successor_probs(P: Array, successors: Successors) -> Array:
    """p(index[s, j] | s, b) gathered from ``P`` [S, B, S] -> [S, B, J] (0 at padding)."""
    index = jnp.asarray(successors.index)
    S, B = P.shape[:2]
    probs = jnp.take_along_axis(
        P, jnp.broadcast_to(index[:, None, :], (S, B, index.shape[1])), axis=2
    )
    return jnp.where(jnp.asarray(successors.valid)[:, None, :], probs, 0.0)


def lost_mass(P: Array, successors: Successors, probs: Optional[Array] = None) -> Array:
    """The probability mass of ``P`` outside the successor table: the largest over (s, b) rows
    of ``sum_s' P[s, b, s'] - sum_j probs[s, b, j]`` (the row sum from ``P`` itself, not 1).

    Cheap next to a solve: one pass over ``P``, which the caller's model has just built.

    Args:
      P: [S, B, S] transition table.
      successors: the :class:`Successors` table.
      probs: ``successor_probs(P, successors)`` if already gathered, or None.
    Returns:
      [] in ``P``'s dtype; compare with :func:`lost_mass_tolerance`.
    """
    if probs is None:
        probs = successor_probs(P, successors)
    return jnp.max(jnp.sum(P, axis=-1) - jnp.sum(probs, axis=-1))


def outside_support(P: Array, successors: Successors, probs: Optional[Array] = None) -> Array:
    """[] bool: some (s, b) row of ``P`` has a non-zero entry (or a NaN) that the successor table
    does not hold: more non-zero entries in the row than among its table entries (which are
    distinct states; the padding is zeroed by :func:`successor_probs`).

    The table is the support of ``P``, its non-zero entries, so this is the exact test of a
    truncated model, at any dtype and whatever the size of the mass left out. A test of
    :func:`lost_mass` against a rounding tolerance let a float32 row lose up to 7.6e-6 unflagged,
    which moved J by 0.7% at gamma_L 0.99 (a transition to a high-reward state growing from 0
    with theta, 2026-12-06), and flagged float32 tables of a float64 run at every iteration.
    """
    if probs is None:
        probs = successor_probs(P, successors)
    in_row = jnp.sum(P != 0, axis=-1)
    in_table = jnp.sum(probs != 0, axis=-1)
    return jnp.any(in_row > in_table)


def check_holds_support(label: str, P, successors: Successors, remedy: str) -> None:
    """Refuse a concrete ``P`` with a non-zero entry outside ``successors``
    (:func:`outside_support`): what is computed from the table would be that of a truncated
    model, unsaid. A traced ``P`` is not checked (the trainer checks it per iteration); a
    constant one inside a caller's ``jit`` is, at trace time.

    Raises:
      ValueError: naming the mass lost and ``remedy``.
    """
    if not is_concrete(P):
        return
    with jax.ensure_compile_time_eval():  # a constant table inside a caller's jit
        P = jnp.asarray(P)
        outside = bool(outside_support(P, successors))
        lost = float(lost_mass(P, successors)) if outside else 0.0
    if outside:
        raise ValueError(
            f"{label} puts mass {lost:.3g} outside the successor table (its support moved "
            "where the table does not list; bchg_jax.tabular.sparse.successors_from_transition "
            f"builds the table of this transition): {remedy}"
        )


def depends_on_input(fn: Callable, x) -> bool:
    """Whether ``fn(x)`` may depend on ``x``: the data flow of its jaxpr, conservatively (an
    equation with any input that depends on ``x`` makes all its outputs depend on it).

    The trainer skips the per-iteration :func:`lost_mass` check of a transition table that does
    not depend on theta (Four-Rooms): its support is then the one at theta0, which the table
    holds by construction.
    """
    jaxpr = jax.make_jaxpr(fn)(x).jaxpr
    dependent = set(jaxpr.invars)
    for eqn in jaxpr.eqns:
        if any(v in dependent for v in eqn.invars if not isinstance(v, jax_core.Literal)):
            dependent.update(eqn.outvars)
    return any(v in dependent for v in jaxpr.outvars if not isinstance(v, jax_core.Literal))


def lost_mass_tolerance(dtype, successors: Successors) -> float:
    """The largest :func:`lost_mass` that is rounding, not a truncated model:
    ``max(LOST_MASS_ULPS, J) * eps(dtype)`` (float32: 7.6e-6 for J <= 64; float64: 1.4e-14).

    When the table holds a row's support, both sums add the same J non-zero entries (the other
    S - J entries are exact zeros, and adding a zero is exact), only in another order; each
    float sum of n non-negative terms is within (n - 1) eps / 2 of its exact value times the
    sum, so the two differ by at most (J - 1) eps for a row summing to 1. The floor of 64 eps
    leaves room for rows that sum to slightly more than 1 and is still below the rounding of
    the model's own row sums (a float32 row of S = 100 entries carries ~S eps / 2 = 6e-6, the
    same order, and the dense solvers live with that).
    """
    return float(max(LOST_MASS_ULPS, successors.width) * jnp.finfo(dtype).eps)


def cond_on_any_lane(pred, true_fn: Callable, false_fn: Callable, *operands):
    """``true_fn(*operands)`` if ``pred`` else ``false_fn(*operands)``, per run, where under
    ``vmap`` ``true_fn`` runs only in the calls in which some run's ``pred`` holds.

    ``jax.lax.cond`` under ``vmap`` with a batched predicate becomes a ``select``: both branches
    run for every run at every call. Here the batching rule (``custom_vmap``; nested ``vmap``s
    merge into one lane axis, as in :func:`~bchg_jax.core.run_last.run_last`) runs ``false_fn``
    on every lane and, only when ``any(pred)``, ``true_fn`` on every lane too, then selects per
    lane; with a predicate shared by all lanes it is a plain ``lax.cond``. Meant for a rare
    fallback (the dense solves of an iteration that lost mass, :func:`lost_mass`).

    Forward-only (no derivative rule). ``true_fn`` and ``false_fn`` must not close over traced
    values (pass them in ``operands``) and must return the same pytree of shapes and dtypes.

    Args:
      pred: [] bool.
      true_fn, false_fn: ``fn(*operands) -> pytree``.
      operands: arrays or pytrees of arrays.
    Returns:
      the chosen branch's output.
    """
    leaves, in_tree = jax.tree.flatten(operands)
    leaves = [jnp.asarray(x) for x in leaves]
    out_tree = []

    def flat(fn):
        def g(*xs):
            out = fn(*jax.tree.unflatten(in_tree, xs))
            out_tree[:] = [jax.tree.structure(out)]
            return tuple(jax.tree.leaves(out))

        return g

    level = _lane_cond_levels(flat(true_fn), flat(false_fn), callers_precision())
    outs = level((False,) * (len(leaves) + 1))(jnp.asarray(pred, bool), *leaves)
    return jax.tree.unflatten(out_tree[0], outs)


def _lane_cond_levels(true_fn, false_fn, precision):
    """``level(batched) -> f(pred, *xs)``: :func:`cond_on_any_lane` on arguments of which those
    marked in ``batched`` carry a leading lane axis (the lanes of the enclosing vmaps). The
    branches, traced when ``vmap`` reaches the call, compute at the caller's matmul
    ``precision`` (:func:`~bchg_jax.core.run_last.in_callers_precision`)."""

    def impl(batched, pred, xs):
        if not any(batched):
            return jax.lax.cond(pred, true_fn, false_fn, *xs)
        R = [x.shape[0] for x, b in zip((pred,) + xs, batched, strict=False) if b][0]
        axes = tuple(0 if b else None for b in batched[1:])

        def run(fn):
            return jax.vmap(fn, in_axes=axes, axis_size=R)(*xs)

        if not batched[0]:  # one predicate for all lanes: a real cond
            return jax.lax.cond(pred, lambda: run(true_fn), lambda: run(false_fn))
        base = run(false_fn)

        def both():
            return tuple(
                jnp.where(pred.reshape((R,) + (1,) * (b.ndim - 1)), t, b)
                for t, b in zip(run(true_fn), base, strict=False)
            )

        return jax.lax.cond(jnp.any(pred), both, lambda: base)

    @functools.lru_cache(maxsize=None)
    def level(batched):
        @custom_vmap
        def f(pred, *xs):
            with in_callers_precision(precision):
                return impl(batched, pred, xs)

        @f.def_vmap
        def rule(axis_size, in_batched, pred, *xs):
            with in_callers_precision(precision):
                return lanes_rule(axis_size, in_batched, pred, *xs)

        def lanes_rule(axis_size, in_batched, pred, *xs):
            args = (pred,) + xs
            inner = [
                a.shape[1] if b else a.shape[0]
                for a, b, h in zip(args, in_batched, batched, strict=False)
                if h
            ]
            r_in = inner[0] if inner else 1

            def merge(x, b, h):
                if b and h:  # [outer, inner, ...] -> [outer * inner, ...]
                    return x.reshape((axis_size * r_in,) + x.shape[2:])
                if b:  # [outer, ...]: each lane repeated r_in times
                    return jnp.repeat(x, r_in, axis=0) if inner else x
                if h:  # [inner, ...]: tiled over the outer lanes
                    return jnp.tile(x, (axis_size,) + (1,) * (x.ndim - 1))
                return x

            new = tuple(merge(a, b, h) for a, b, h in zip(args, in_batched, batched, strict=False))
            outs = level(tuple(b or h for b, h in zip(in_batched, batched, strict=False)))(*new)
            if inner:
                outs = tuple(o.reshape((axis_size, r_in) + o.shape[1:]) for o in outs)
            return outs, tuple(True for _ in outs)

        return f

    return level


# --- run-last implementations (arrays end in the run axis R) -----------------------------------


def _lanes(has_run, names, xs):
    """(R, per-lane arrays {name: [..., R]}, shared arrays {name: [..., 1]}): each argument with
    a trailing run axis (size 1 where shared by all runs)."""
    xs = [add_run_axis(x, h) for x, h in zip(xs, has_run, strict=False)]
    R = max(x.shape[-1] for x in xs)
    lanes = {n: x for n, x in zip(names, xs, strict=False) if R > 1 and x.shape[-1] == R}
    shared = {n: x for n, x in zip(names, xs, strict=False) if n not in lanes}
    return R, lanes, shared


def _expectation(probs, values_next):
    """sum_j probs[s, b, j] V(index[s, j]): probs [S, B, J(, R)] x values_next [S, J, R]."""
    if probs.ndim == 3:
        return jnp.einsum("sbj,sjr->sbr", probs, values_next)
    return jnp.sum(probs * values_next[:, None], axis=2)


def _policy_step(policy, probs, gc):
    """gamma cont(s) sum_b g(b|s) p(index[s, j] | s, b): [S, J, R]."""
    if probs.ndim == 3:
        return gc[:, None, :] * jnp.einsum("sbr,sbj->sjr", policy, probs)
    return gc[:, None, :] * jnp.sum(policy[:, :, None] * probs, axis=1)


def _in_order(order, d, names):
    """The arrays of ``d`` named in ``names`` (state-indexed) with their rows in sweep order."""
    return {n: (x[order.perm] if n in names else x) for n, x in d.items()}


def _diagonal_solved(reward, step, self_mask):
    """The Gauss-Seidel update with the self-transition solved: ``V(s) = reward'(s) + sum_j
    step'(s, j) V(index[s, j])`` with reward' = reward / (1 - A(s, s)) and step' = step off the
    diagonal / (1 - A(s, s)), A(s, s) = sum of ``step`` where ``self_mask`` [S, J]."""
    mask = jnp.asarray(self_mask)[:, :, None]
    scale = 1.0 / (1.0 - jnp.sum(jnp.where(mask, step, 0.0), axis=1))  # [S, R]
    return reward * scale, jnp.where(mask, 0.0, step) * scale[:, None, :]


def _gauss_seidel_sweep(order, reward, step, V):
    """One multi-colour Gauss-Seidel sweep (module docstring) of :func:`_diagonal_solved`'s
    update: the colour classes in turn, each from the latest V. [S, R] -> [S, R]."""
    for lo, hi in order.bounds:
        V = V.at[lo:hi].set(reward[lo:hi] + jnp.sum(step[lo:hi] * V[order.index[lo:hi]], axis=1))
    return V


def round_form() -> str:
    """The form of the sparse soft solver's rounds of expectation sweeps:
    ``$BCHG_SPARSE_ROUND`` if set, else ``"auto"`` (each platform its own, chosen when the
    solver is lowered: a loop on the CPU, unrolled elsewhere where two sweeps or more fit in
    :data:`ROUND_UNROLL_TERMS`); ``"loop"`` or ``"unrolled"``
    force one on every platform (an A/B on a GPU: ``benchmarks/gpu_session.sh``). Read when the
    solver is traced: a function already compiled keeps its value.

    Raises:
      ValueError: ``BCHG_SPARSE_ROUND`` set to anything else.
    """
    form = os.environ.get(ROUND_ENV_VAR, "auto")
    if form not in ROUND_FORMS:
        raise ValueError(f"{ROUND_ENV_VAR} must be one of {ROUND_FORMS}, got {form!r}")
    return form


def _gauss_seidel_round(order, reward, step, V, sweeps):
    """``sweeps`` sweeps of :func:`_gauss_seidel_sweep` from V, in the form :func:`round_form`
    names; by default the one that suits the platform the solver is compiled for
    (``lax.platform_dependent``, chosen when it is lowered): a ``fori_loop`` on the CPU,
    :func:`_unrolled_round` on any other unless fewer than two sweeps fit in
    :data:`ROUND_UNROLL_TERMS` or the round is one sweep (then the loop there too: one unrolled
    sweep per trip would launch as many kernels and take far longer to compile). The same
    iterates up to the rounding of each state's sum over its successors (summed in another
    order)."""

    def loop(reward, step, V):
        return jax.lax.fori_loop(
            0, sweeps, lambda _, W: _gauss_seidel_sweep(order, reward, step, W), V
        )

    def unrolled(reward, step, V):
        return _unrolled_round(order, reward, step, V, sweeps)

    form = round_form()
    if form == "unrolled":
        return unrolled(reward, step, V)
    if form == "loop" or _round_unroll(order, sweeps) < 2:  # one sweep a trip saves nothing
        return loop(reward, step, V)
    return jax.lax.platform_dependent(reward, step, V, cpu=loop, default=unrolled)


def _unrolled_round(order, reward, step, V, sweeps):
    """``sweeps`` sweeps of :func:`_gauss_seidel_sweep`'s update, written for few kernels on a
    GPU: unrolled (:func:`_round_unroll` sweeps per loop trip, all of them on small tables; the
    kernels a loop trip adds, copies of its carry and its counter, are what unrolling saves),
    V kept as its colour blocks, each block's new value one elementwise kernel
    (its gathers and its sum over successors, in successor order, in one fusion) that the next
    blocks read. The optimization barriers make XLA store each block once instead of recomputing
    it inside every later block (a chain that grows with the sweeps), and keep ``reward`` and
    ``step`` from being recomputed in each. Compiled for an H200, a Four-Rooms round of 16
    sweeps with its policy's tables is 53 kernels instead of the loop's 118
    (``benchmarks.gpu_kernels``). On the CPU it is slower than the loop (240 runs: the follower
    solve 4.8 instead of 3.8 ms, and 4 s more compile time). [S, R] -> [S, R]."""
    reward, step = jax.lax.optimization_barrier((reward, step))

    def sweep(_, blocks):
        blocks = list(blocks)
        for k, (lo, hi) in enumerate(order.bounds):
            W = jnp.concatenate(blocks, axis=0)
            new = reward[lo:hi]
            for j in range(order.index.shape[1]):
                new = new + step[lo:hi, j] * W[order.index[lo:hi, j]]
            blocks[k] = jax.lax.optimization_barrier(new)
        return tuple(blocks)

    blocks = tuple(V[lo:hi] for lo, hi in order.bounds)
    blocks = jax.lax.fori_loop(0, sweeps, sweep, blocks, unroll=_round_unroll(order, sweeps))
    return jnp.concatenate(blocks, axis=0)


def _round_unroll(order, sweeps: int) -> int:
    """Sweeps per loop trip of :func:`_unrolled_round`: as many as keep a trip within
    :data:`ROUND_UNROLL_TERMS` successor terms, at most ``sweeps`` and at least 1 (all of them,
    so no loop, for Four-Rooms: 16 x 3 x 4 = 192; a number that does not divide ``sweeps``
    leaves the remainder to a trip of its own, ``lax.fori_loop``'s ``unroll``)."""
    terms = max(len(order.bounds) * order.index.shape[1], 1)
    return max(1, min(int(sweeps), ROUND_UNROLL_TERMS // terms))


@full_precision  # traced by run_last's batching rule, maybe long after the caller's scope
def _soft_impl(order, tol, max_sweeps, linear_sweeps, has_run, probs, r, beta, gc, V0):
    """Modified soft policy iteration, run-last (module docstring), on fewer lanes as they
    converge (``compacting_while_loop``), the states in sweep order inside. Returns (V, Q,
    policy, sweeps, residual), each ending in R."""
    R, lanes, shared = _lanes(has_run, ("probs", "r", "beta", "gc", "V0"), (probs, r, beta, gc, V0))
    rows = ("probs", "r", "gc", "V0")
    lanes, shared = _in_order(order, lanes, rows), _in_order(order, shared, rows)
    index = order.index
    dtype = r.dtype
    S = r.shape[0]
    V0 = lanes.pop("V0") if "V0" in lanes else shared.pop("V0")
    V0 = jnp.broadcast_to(V0, (S, R)).astype(dtype)

    def tables(c):
        t = {**shared, **c["const"]}
        if t["probs"].shape[-1] == 1:
            t["probs"] = t["probs"][..., 0]
        return t

    def backup(t, V):
        return t["r"] + t["gc"][:, None, :] * _expectation(t["probs"], V[index])

    def soft_v(t, Q):
        return t["beta"] * jax.nn.logsumexp(Q / t["beta"], axis=1)

    def improve_and_evaluate(t, Q, V2):
        """``linear_sweeps`` expectation sweeps of the Boltzmann policy of Q from V2, with the
        entropy-regularised reward r - beta log g = r - (Q - V2)."""
        pol = boltzmann(Q, V2, t["beta"], axis=1)
        reward = jnp.sum(pol * (t["r"] - Q + V2[:, None, :]), axis=1)  # [S, R]
        step = _policy_step(pol, t["probs"], t["gc"])  # [S, J, R]
        reward, step = _diagonal_solved(reward, step, order.self_mask)
        return _gauss_seidel_round(order, reward, step, V2, linear_sweeps)

    def active(c):
        going = keep_sweeping(c["res"], c["V"], tol, c["progress"], c["window"], axis=0)
        return going & (c["n"] < max_sweeps)

    def body(c):
        t = tables(c)
        act = active(c)
        Q = backup(t, c["V"])
        V2 = soft_v(t, Q)
        res2 = jnp.max(jnp.abs(V2 - c["V"]), axis=0)
        # c["res"]: the soft residual before the last round of expectation sweeps. A round
        # that did not bring it below EXPECTATION_MIN_REDUCTION times that has reached the
        # rounding floor where the soft and the expectation sweeps' float fixed points differ
        # (module docstring): plain soft sweeps from here on (the first round compares with inf)
        # A failure far above the floor is a transient (EXPECTATION_FLOOR_MULTIPLE), not that.
        failed = res2 >= EXPECTATION_MIN_REDUCTION * c["res"]
        at_floor = res2 <= EXPECTATION_FLOOR_MULTIPLE * rounding_floor(V2, axis=0)
        mixed = c["mixed"] & ~(failed & at_floor)
        # no round that would reach max_sweeps: near the cap, plain soft sweeps up to it, so a
        # capped solve ends on a soft sweep and its residual is that sweep's change (a round
        # ending at the cap reported the residual from before it: 2.25 where 17 plain soft
        # sweeps change V by 0.89, 40 states, gamma 0.99, cap 17)
        fits = c["n"] + 1 + linear_sweeps < max_sweeps
        more = act & mixed & (res2 > tol) & fits
        if linear_sweeps > 0:
            W = jax.lax.cond(jnp.any(more), lambda: improve_and_evaluate(t, Q, V2), lambda: V2)
            V2 = jnp.where(more, W, V2)
        n = c["n"] + act.astype(jnp.int32) * (1 + linear_sweeps * more.astype(jnp.int32))
        progress = progress_update(c["progress"], res2)
        return {
            "V": jnp.where(act, V2, c["V"]),
            "res": jnp.where(act, res2, c["res"]),
            "n": n,
            "mixed": jnp.where(act, mixed, c["mixed"]),
            "progress": _where_lanes(act, progress, c["progress"]),
            "window": c["window"],
            "const": c["const"],
        }

    # the stall window (core.rounding) in soft sweeps, from each lane's discount max_s gamma cont
    gc = lanes["gc"] if "gc" in lanes else shared["gc"]
    carry = {
        "V": V0,
        "res": jnp.full((R,), jnp.inf, dtype),
        "n": jnp.zeros((R,), jnp.int32),
        "mixed": jnp.ones((R,), bool),
        "progress": progress_init((R,), dtype),
        "window": jnp.broadcast_to(stall_window(jnp.max(gc, axis=0)), (R,)),
        "const": lanes,
    }
    # one step per loop test: each step's lax.cond is a host test on a GPU anyway, and masked
    # steps after a lane's last would each add one (core.host_tests)
    carry = compacting_while_loop(active, body, carry, steps=1)
    t = tables(carry)
    Q = backup(t, carry["V"])
    V = soft_v(t, Q)
    policy = boltzmann(Q, V, t["beta"], axis=1)
    return V[order.inv], Q[order.inv], policy[order.inv], carry["n"], carry["res"]


@full_precision  # likewise
def _evaluation_impl(order, tol, max_sweeps, has_run, probs, r, policy, gc, V0):
    """Warm-started Gauss-Seidel expectation sweeps to tolerance, run-last, on fewer lanes as
    they converge, the states in sweep order inside. Returns (V, sweeps, residual)."""
    R, lanes, shared = _lanes(
        has_run, ("probs", "r", "policy", "gc", "V0"), (probs, r, policy, gc, V0)
    )
    t = _in_order(order, {**shared, **lanes}, ("probs", "r", "policy", "gc", "V0"))
    probs = t["probs"][..., 0] if t["probs"].shape[-1] == 1 else t["probs"]
    S = r.shape[0]
    reward = jnp.broadcast_to(jnp.sum(t["policy"] * t["r"], axis=1), (S, R))
    step = jnp.broadcast_to(_policy_step(t["policy"], probs, t["gc"]), (S, order.index.shape[1], R))
    reward, step = _diagonal_solved(reward, step, order.self_mask)
    V0 = jnp.broadcast_to(t["V0"], (S, R)).astype(r.dtype)

    def active(c):
        going = keep_sweeping(c["res"], c["V"], tol, c["progress"], c["window"], axis=0)
        return going & (c["n"] < max_sweeps)

    # one run: several sweeps per loop trip, the test on the last one's change (fewer trips;
    # batched, each lane would pay the extra sweeps); one per trip unless the trips end at
    # max_sweeps exactly (never past the cap)
    per_trip = ONE_RUN_SWEEPS_PER_TEST
    if R > 1 or max_sweeps % per_trip:
        per_trip = 1

    def body(c):
        act = active(c)
        V = c["V"]
        for _ in range(per_trip - 1):
            V = _gauss_seidel_sweep(order, c["reward"], c["step"], V)
        V2 = _gauss_seidel_sweep(order, c["reward"], c["step"], V)
        res = jnp.where(act, jnp.max(jnp.abs(V2 - V), axis=0), c["res"])
        progress = progress_update(c["progress"], res, per_trip)
        return {
            **c,
            "V": jnp.where(act, V2, c["V"]),
            "res": res,
            "n": c["n"] + per_trip * act.astype(jnp.int32),
            "progress": _where_lanes(act, progress, c["progress"]),
        }

    window = jnp.broadcast_to(stall_window(jnp.max(t["gc"], axis=0)), (R,))
    carry = compacting_while_loop(
        active,
        body,
        {
            "V": V0,
            "res": jnp.full((R,), jnp.inf, r.dtype),
            "n": jnp.zeros((R,), jnp.int32),
            "progress": progress_init((R,), r.dtype),
            "window": window,
            "reward": reward,
            "step": step,
        },
    )
    return carry["V"][order.inv], carry["n"], carry["res"]


def _where_lanes(act, new, old):
    """``new`` in the lanes still sweeping (``act`` [R]), ``old`` in the others, leaf by leaf."""
    return jax.tree.map(lambda a, b: jnp.where(act, a, b), new, old)


@functools.lru_cache(maxsize=64)
def _soft_solver(index_bytes, shape, tol, max_sweeps, linear_sweeps):
    order = _gauss_seidel_order(np.frombuffer(index_bytes, np.int32).reshape(shape))
    return run_last(functools.partial(_soft_impl, order, tol, max_sweeps, linear_sweeps))


@functools.lru_cache(maxsize=64)
def _evaluation_solver(index_bytes, shape, tol, max_sweeps):
    order = _gauss_seidel_order(np.frombuffer(index_bytes, np.int32).reshape(shape))
    return run_last(functools.partial(_evaluation_impl, order, tol, max_sweeps))


@functools.lru_cache(maxsize=64)
def _jitted(solve):
    """A solver as one ``jax.jit`` program, kept with it: called eagerly, its loops were traced
    anew and compiled on every call (a program per call, kept by JAX)."""
    return jax.jit(solve)


def _for_call(solve, *args):
    """``solve``, or its cached program when the call runs eagerly (under a trace the caller's
    program holds the loops)."""
    return _jitted(solve) if running_eagerly(*args) else solve


def _key(successors: Successors):
    index = np.ascontiguousarray(successors.index, np.int32)
    return index.tobytes(), index.shape


_TRUNCATED = (
    "pass that table, or return_lost_mass=True to solve the truncated model and get the mass "
    "it leaves out"
)


@full_precision
def sparse_soft_value_iteration(
    P: Array,
    r: Array,
    beta,
    gamma,
    successors: Successors,
    terminal: Optional[Array] = None,
    V0: Optional[Array] = None,
    tol: float = 1e-6,
    max_sweeps: int = 3000,
    linear_sweeps: int = 16,
    return_lost_mass: bool = False,
):
    """The follower's best response (Eq. (lower)) by modified soft policy iteration on a
    successor table (module docstring); same inputs, stopping test and result as
    :func:`~bchg_jax.tabular.follower.soft_value_iteration` with ``tol`` set.

    Args:
      P: [S, B, S] transition p^theta(s'|s, b); only the entries in ``successors`` are read.
      r: [S, B] follower reward r_F^theta.
      beta: entropy weight (> 0; scalar, may be traced).
      gamma: discount gamma_F (scalar).
      successors: the :class:`Successors` table of ``P``'s support.
      terminal: [S] bool mask of terminal states, or None.
      V0: [S] warm start, or None for zeros.
      tol: stop when a soft sweep changes V by at most ``tol`` (sup norm).
      max_sweeps: cap on the sweeps (soft and linear together; a round of expectation sweeps
        that would reach it is not started, plain soft sweeps run up to it instead, so the
        last counted sweep, whose change is ``residual``, is a soft one).
      linear_sweeps: expectation sweeps after each soft sweep (0: soft value iteration), until
        a round of them fails to reduce the soft residual (module docstring).
      return_lost_mass: also return :func:`lost_mass` of ``P`` (above
        :func:`lost_mass_tolerance`: ``P`` put mass outside ``successors``, and the result is
        that of a truncated model, not of ``P``). Without it a concrete ``P`` with an entry
        outside the table (:func:`outside_support`) is refused (a traced one cannot be
        checked: its result is then the truncated model's, unsaid).
    Returns:
      :class:`~bchg_jax.tabular.follower.BestResponse`; ``sweeps`` counts soft and linear
      sweeps, ``residual`` is the change of the last soft sweep. With ``return_lost_mass``:
      (that, lost mass []).
    Raises:
      ValueError: as ``soft_value_iteration``, ``linear_sweeps`` not an integer >= 0, a
        ``tol`` not finite and > 0 (it must be concrete), a successor table
        not of S rows, or (without ``return_lost_mass``) a concrete ``P`` with mass outside
        it.
    """
    S = check_follower_inputs(P, r, beta, gamma, terminal, V0, successors)
    check_solver_settings(
        "sparse_soft_value_iteration",
        tol,
        max_sweeps=(max_sweeps, 1),
        linear_sweeps=(linear_sweeps, 0),
    )
    if not return_lost_mass:
        check_holds_support("P (transition)", P, successors, _TRUNCATED)
    dtype = r.dtype
    gc = jnp.asarray(gamma, dtype) * continuation(terminal, S, dtype)
    V0 = jnp.zeros((S,), dtype) if V0 is None else jnp.asarray(V0, dtype)
    solve = _soft_solver(*_key(successors), float(tol), int(max_sweeps), int(linear_sweeps))
    probs = successor_probs(P, successors)
    solve = _for_call(solve, probs, r, beta, gc, V0)
    V, Q, policy, n, res = solve(probs.astype(dtype), r, jnp.asarray(beta, dtype), gc, V0)
    br = BestResponse(policy=policy, V=V, Q=Q, sweeps=n, residual=res)
    return (br, lost_mass(P, successors, probs)) if return_lost_mass else br


@full_precision
def sparse_policy_evaluation(
    P: Array,
    r: Array,
    policy: Array,
    gamma,
    cont: Array,
    V0: Array,
    successors: Successors,
    tol: float,
    max_sweeps: int = 3000,
    return_residual: bool = False,
    return_lost_mass: bool = False,
):
    """V^g by warm-started expectation sweeps on a successor table until the sup-norm change is
    ``<= tol`` (the sparse form of :func:`~bchg_jax.tabular.exact.policy_evaluation_sweeps`).

    Args:
      P: [S, B, S] transition; r: [S, B] reward; policy: [S, B] g(b|s); gamma: discount;
      cont: [S] continuation 1 - term(s); V0: [S] warm start; successors: the table of ``P``'s
      support; tol, max_sweeps: stopping test and cap; return_residual: also return the
      change of the last sweep (above ``tol``: the cap was hit first); return_lost_mass: also
      return :func:`lost_mass` of ``P`` (above :func:`lost_mass_tolerance`: V is that of a
      truncated model; without it a concrete ``P`` that loses mass is refused).
    Returns:
      [S] V^g (approximate), or a tuple (V, then residual [] with ``return_residual``, then
      lost mass [] with ``return_lost_mass``).
    Raises:
      ValueError: a concrete ``gamma`` outside [0, 1), an array not shaped by ``P``'s S, B, a
        ``tol`` not finite and > 0, ``max_sweeps`` not an integer >= 1, or (without
        ``return_lost_mass``) a concrete ``P`` with mass outside ``successors``.
    """
    check_if_concrete(check_discount, "gamma (policy evaluation discount)", gamma)
    S, B = transition_sizes("P (transition)", P)
    src = f"S={S}, B={B} from P [S, B, S]"
    for name, x, shape in (
        ("r (reward)", r, (S, B)),
        ("policy", policy, (S, B)),
        ("cont (continuation)", cont, (S,)),
        ("V0", V0, (S,)),
    ):
        check_shape(name, x, shape, src)
    successors.check(S, src)
    check_solver_settings("sparse_policy_evaluation", tol, max_sweeps=(max_sweeps, 1))
    if not return_lost_mass:
        check_holds_support("P (transition)", P, successors, _TRUNCATED)
    dtype = r.dtype
    solve = _evaluation_solver(*_key(successors), float(tol), int(max_sweeps))
    probs = successor_probs(P, successors)
    solve = _for_call(solve, probs, r, policy, gamma, cont, V0)
    V, _, res = solve(
        probs.astype(dtype),
        r,
        policy.astype(dtype),
        jnp.asarray(gamma, dtype) * cont.astype(dtype),
        jnp.asarray(V0, dtype),
    )
    extra = ((res,) if return_residual else ()) + (
        (lost_mass(P, successors, probs),) if return_lost_mass else ()
    )
    return (V,) + extra if extra else V
