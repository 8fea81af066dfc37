"""Tabular 2-player Markov games (paper Section "2-Player Markov Games (Discrete)", Theorem 2):
the leader acts with a policy f_theta(a|s), the follower observes (s, a) and answers with
b ~ g(b|s, a).

A :class:`TabularGame` holds fixed arrays (the leader's parameters are its policy's):
``transition [S, A, B, S]``, ``init_dist [S]``, ``follower_reward [S, A, B]``,
``leader_reward [S, A, B]``, the discounts and the episode length (a time-out, not a terminal).

**dtype.** The family's pure functions compute in :func:`compute_dtype`: JAX's promotion
(``jnp.result_type``) of the policies and beta they are given and the game's four tables, so a
float64 game with a float32 leader policy computes in float64, as a float32 game with a float64
policy does (a Python number does not widen it). Warm starts and given solutions (``Q0``,
``Q_star``, ``Q_prev``, ``g_prev``, ``log_g``) and the discounts are cast to that dtype, so
the solvers' loop carries keep one dtype. Until 2026-12-03 the tables were cast to the policy's
dtype: a float64 game with a float32 policy computed silently in float32 (the toy game's exact
hypergradient 6.8% off at beta 0.05, 27% at 1e-3). The trainer instead computes in its
``config.dtype`` and casts the game to it once (:meth:`TabularGame.astype`).
"""

from __future__ import annotations

import dataclasses
from typing import Optional

import jax
import jax.numpy as jnp
import numpy as np

from bchg_jax.core.validate import (
    check_probability_rows_if_concrete,
    check_problem_settings,
    check_shape,
    probability_tolerance,
    shape_property,
    transition_sizes,
)

Array = jax.Array


@dataclasses.dataclass(frozen=True, eq=False)
class TabularGame:
    """A finite 2-player Markov game (S, (A, B), p, rho_0, (r_L, r_F), (gamma_L, gamma_F)).

    Attributes:
      transition: [S, A, B, S] p(s'|s, a, b).
      init_dist: [S] rho_0.
      follower_reward: [S, A, B] r_F(s, a, b).
      leader_reward: [S, A, B] r_L(s, a, b).
      gamma_F: the follower's discount in [0, 1).
      gamma_L: the leader's discount in [0, 1).
      time_limit: episode length T (a time-out, not a terminal), or None.
      name: label used in error messages.
    """

    transition: Array  # [S, A, B, S]
    init_dist: Array  # [S]
    follower_reward: Array  # [S, A, B]
    leader_reward: Array  # [S, A, B]
    gamma_F: float
    gamma_L: float
    time_limit: Optional[int] = None
    name: str = "tabular_game"

    num_states = shape_property("transition", 0, "S, the number of states")
    num_leader_actions = shape_property("transition", 1, "A, the leader's number of actions")
    num_follower_actions = shape_property("transition", 2, "B, the follower's number of actions")

    def validate(self) -> "TabularGame":
        """Clear ValueErrors for bad shapes, probabilities or discounts (host side).

        S, A, B are read from ``transition`` [S, A, B, S]; every other array is checked against
        them and an error names the array at fault.

        Returns:
          ``self``.
        Raises:
          ValueError: a bad shape, a non-stochastic ``transition`` / ``init_dist`` (a negative
            entry is named, with its index), a non-finite entry, a discount outside [0, 1) or a
            bad ``time_limit``.
        """
        check_problem_settings(self)
        P = np.asarray(self.transition, np.float64)
        S, A, B = transition_sizes(f"{self.name}: transition", P, "[S, A, B, S]")
        src = f"S={S}, A={A}, B={B} from transition [S, A, B, S]"
        # at most 1e-6 (this family's bound before), tighter near gamma = 1 (the sampler
        # normalises the rows, the solvers do not: core.validate.probability_tolerance)
        tol = probability_tolerance(
            max(float(self.gamma_F), float(self.gamma_L)),
            np.result_type(np.asarray(self.transition).dtype, np.float32),
            cap=1e-6,
        )
        if not np.all(np.isfinite(P)):
            at = np.argwhere(~np.isfinite(P))[0].tolist()
            raise ValueError(
                f"{self.name}: transition has non-finite entries (first at (s, a, b, s') = "
                f"{at}: {P[tuple(at)]})"
            )
        if np.any(P < -1e-9):
            # named first: normalising a row with a negative entry would not make it a
            # probability vector, and its sum may well be 1
            at = np.argwhere(P < -1e-9)[0].tolist()
            raise ValueError(
                f"{self.name}: transition rows must be probability vectors (entries >= 0); "
                f"transition[{', '.join(map(str, at))}] (s, a, b, s') = {P[tuple(at)]:.3g} is "
                f"negative (its row sums to {P[tuple(at[:-1])].sum():.9g}; negative entries in "
                f"all: {int(np.sum(P < -1e-9))})"
            )
        off = np.abs(P.sum(-1) - 1.0)
        if np.any(off > tol):
            raise ValueError(
                f"{self.name}: transition rows must be probability vectors summing to 1 within "
                f"{tol:.2g} (largest |row sum - 1|: {off.max():.3g}; normalise them, e.g. "
                "P / P.sum(-1, keepdims=True))"
            )
        rho = np.asarray(self.init_dist, np.float64)
        if rho.shape != (S,):
            raise ValueError(
                f"{self.name}: init_dist must have shape ({S},) ({src}), got {rho.shape}"
            )
        if not np.all(np.isfinite(rho)):
            raise ValueError(f"{self.name}: init_dist must be finite, got {rho}")
        if np.any(rho < -1e-9):
            at = int(np.argmax(rho < -1e-9))
            raise ValueError(
                f"{self.name}: init_dist must be a probability vector (entries >= 0); "
                f"init_dist[{at}] = {rho[at]:.3g} is negative (sum {rho.sum():.9g})"
            )
        if abs(rho.sum() - 1.0) > tol:
            raise ValueError(
                f"{self.name}: init_dist must be a probability vector summing to 1 within "
                f"{tol:.2g}, got sum {rho.sum():.9g}"
            )
        for name in ("follower_reward", "leader_reward"):
            r = np.asarray(getattr(self, name), np.float64)
            if r.shape != (S, A, B):
                raise ValueError(
                    f"{self.name}: {name} must have shape {(S, A, B)} ({src}), got {r.shape}"
                )
            if not np.all(np.isfinite(r)):
                raise ValueError(f"{self.name}: {name} must be finite")
        return self

    def astype(self, dtype) -> "TabularGame":
        """This game with its four tables (``transition``, ``init_dist``, ``follower_reward``,
        ``leader_reward``) cast to ``dtype`` (the trainer's ``config.dtype``); the discounts,
        ``time_limit`` and ``name`` are kept. Narrowing float64 tables to float32 rounds them
        once (the tolerance of :meth:`validate` follows the dtype)."""
        return dataclasses.replace(
            self,
            **{name: jnp.asarray(getattr(self, name), dtype) for name in TABLES},
        )


# the game's arrays, whose dtypes join a computation's (compute_dtype)
TABLES = ("transition", "init_dist", "follower_reward", "leader_reward")


def _dtype_operand(x):
    """``x`` as ``jnp.result_type`` takes it: arrays, tracers and Python numbers (weakly typed)
    as they are, anything else (a nested list) as a numpy array."""
    if hasattr(x, "dtype") or isinstance(x, (int, float, complex)):
        return x
    return np.asarray(x)


def compute_dtype(game: TabularGame, *values):
    """The float dtype a pure function of this family computes in: JAX's promotion
    (``jnp.result_type``) of ``values`` (the policies and beta it is given; None skipped; a
    Python number is weakly typed and does not widen it) and ``game``'s four tables (module
    docstring). Integer or bool operands alone give float32 promoted with them.

    Args:
      game: the :class:`TabularGame` (its tables may be traced: only dtypes are read).
      values: the function's policies, beta, ... (arrays, tracers or numbers).
    Returns:
      a numpy dtype (float32 or float64; float64 only with ``jax_enable_x64``).
    """
    operands = [_dtype_operand(v) for v in values if v is not None]
    operands += [_dtype_operand(getattr(game, name)) for name in TABLES]
    dtype = jnp.result_type(*operands)
    if not jnp.issubdtype(dtype, jnp.inexact):
        dtype = jnp.promote_types(dtype, jnp.float32)
    return np.dtype(dtype)


def check_policy_shapes(game: TabularGame, f=None, g=None, g_label="g (follower policy)") -> None:
    """The leader policy ``f`` [S, A] and the follower policy ``g`` [S, A, B] against the sizes
    of ``game.transition`` [S, A, B, S] (static shapes, so traced policies are checked too).

    Args:
      game: the tabular game.
      f: [S, A] leader policy, or None (not checked).
      g: [S, A, B] follower policy, or None.
      g_label: the name the errors give ``g`` (the caller's argument name).
    Returns:
      None.
    Raises:
      ValueError: ``game.transition`` not [S, A, B, S], ``f`` / ``g`` of another shape, or a
        concrete ``f`` / ``g`` whose rows are not distributions (an entry below 0 or a row sum
        off 1 by more than ``core.validate.POLICY_ROW_TOL``: a number computed from them would be no
        policy's); the error names the policy at fault.
    """
    S, A, B = transition_sizes(f"{game.name}: transition", game.transition, "[S, A, B, S]")
    src = f"S={S}, A={A}, B={B} from {game.name}'s transition [S, A, B, S]"
    for label, table, shape in (
        ("f (leader policy)", f, (S, A)),
        (g_label, g, (S, A, B)),
    ):
        if table is None:
            continue
        check_shape(label, table, shape, src)
        check_probability_rows_if_concrete(label, table)
