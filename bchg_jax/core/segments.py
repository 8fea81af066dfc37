"""Trajectory-segment machinery shared by critics and estimators.

One time-axis convention for every family: trajectories are [E, T, ...] (episodes or streams on
axis 0, time on axis 1), and every function here works along axis 1.

A *segment* is the part of a stream from a step k to the end of its episode (or of the batch).
``discounted_suffix_sum`` gives every segment's discounted sum in one associative scan;
``forward_discounted_sum`` is its adjoint (weights of segments -> coefficients of steps);
``regroup`` / ``group_mean`` implement every-visit grouping of segments by (s, b) or s as a
scatter-add over a table.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from bchg_jax.core.validate import check_discount, check_if_concrete

Array = jax.Array


def forward_discounted_sum(w: Array, gamma, done: Array) -> Array:
    """Omega_j = w_j + gamma (1 - done_{j-1}) Omega_{j-1} along axis 1 (time) of ``w`` [E, T, ...].

    The adjoint of :func:`discounted_suffix_sum`: ``sum_k w_k G_k`` with
    ``G_k = sum_{j>=k, same episode} gamma^{j-k} x_j`` equals ``sum_j Omega_j x_j``. This is how
    the estimators weight the segment sums of Eq. (nablaQF) (Algorithm 6) without
    materialising a [|theta|] vector per segment.

    Args:
      w: [E, T, ...] weights of segments (one per start step).
      gamma: discount (scalar).
      done: [E, T] bool, the episode ends after step t.
    Returns:
      [E, T, ...] per-step coefficients.
    Raises:
      ValueError: a concrete ``gamma`` outside [0, 1] (1: an undiscounted finite sum).
    """
    check_if_concrete(check_discount, "gamma (segment discount)", gamma, True)
    started = jnp.concatenate([jnp.ones_like(done[:, :1]), done[:, :-1]], axis=1)
    decay = _broadcast_time(gamma * (1.0 - started.astype(w.dtype)), w)

    def combine(a, b):
        return a[0] * b[0], b[0] * a[1] + b[1]

    _, out = jax.lax.associative_scan(combine, (decay, w), axis=1)
    return out


def _broadcast_time(x: Array, like: Array) -> Array:
    """[E, T] -> the shape of ``like`` [E, T, ...] (trailing axes broadcast)."""
    return jnp.broadcast_to(x.reshape(x.shape + (1,) * (like.ndim - x.ndim)), like.shape)


def discounted_suffix_sum(x: Array, gamma, done: Array) -> Array:
    """G_k = x_k + gamma (1 - done_k) G_{k+1} along axis 1 (time) of ``x`` [E, T, ...].

    The discounted sum of a trajectory segment from step k to its episode's end (or the batch
    end): the return of every segment in one associative scan (e.g. the Monte Carlo returns of
    Algorithm 9, or the segment sums of Eq. (nablaQF) in Algorithms 6 and 7).

    Args:
      x: [E, T, ...] per-step values.
      gamma: discount (scalar).
      done: [E, T] bool, the episode ends after step t.
    Returns:
      [E, T, ...] segment sums.
    Raises:
      ValueError: a concrete ``gamma`` outside [0, 1] (1: an undiscounted finite sum).
    """
    check_if_concrete(check_discount, "gamma (segment discount)", gamma, True)
    keep = _broadcast_time(gamma * (1.0 - done.astype(x.dtype)), x)

    def combine(a, b):  # reverse scan: a is the later element
        return a[0] * b[0], b[1] + b[0] * a[1]

    _, out = jax.lax.associative_scan(combine, (keep, x), reverse=True, axis=1)
    return out


def regroup(w: Array, group: Array, target_group: Array, num_groups: int) -> Array:
    """Per target step j: (sum of w over source steps of j's group) / (its visits in target).

    With ``target_group = group`` this is the every-visit group mean; with a separate (oracle)
    batch as target it moves the weights of the main batch onto the oracle's segments.
    Every-visit grouping is the segment set B_sb of Algorithm 1 line 12 (or B_s).

    Args:
      w: [E, T] weights on the source steps.
      group: [E, T] int group id (e.g. s * B + b) of each source step, in [0, num_groups).
      target_group: [E', T'] int group id of each target step.
      num_groups: number of groups (e.g. S * B).
    Returns:
      [E', T'] per-target-step weights (groups unseen in the target get nothing).
    """
    total = jax.ops.segment_sum(w.reshape(-1), group.reshape(-1), num_groups)
    count = jax.ops.segment_sum(
        jnp.ones(target_group.size, w.dtype), target_group.reshape(-1), num_groups
    )
    return (total / jnp.maximum(count, 1.0))[target_group]


def group_mean(w: Array, group: Array, num_groups: int) -> Array:
    """Replaces each w_k by the mean of w over its group (every-visit grouping by (s,b) or s).

    Args:
      w: [E, T] weights.
      group: [E, T] int group id of each step, in [0, num_groups).
      num_groups: number of groups.
    Returns:
      [E, T] group means.
    """
    return regroup(w, group, group, num_groups)
