"""Trajectory-segment machinery shared by critics and estimators.

A *segment* is the part of a stream from a step k to the end of its episode (or of the batch).
``discounted_suffix_sum`` gives every segment's discounted sum in one associative scan;
``forward_discounted_sum`` is its adjoint (weights of segments -> coefficients of steps);
``regroup`` / ``group_mean`` implement every-visit grouping of segments by (s, b) or s as a
scatter-add over a table (DESIGN principle 3).
"""
from __future__ import annotations

import jax
import jax.numpy as jnp

Array = jax.Array


def forward_discounted_sum(w: Array, gamma, done: Array) -> Array:
    """Omega_j = w_j + gamma (1 - done_{j-1}) Omega_{j-1} along the last axis (per stream).

    The adjoint of a discounted suffix sum that stops at episode ends: ``sum_k w_k G_k`` with
    ``G_k = sum_{j>=k, same episode} gamma^{j-k} x_j`` equals ``sum_j Omega_j x_j``.
    """
    decay = gamma * (1.0 - jnp.concatenate([jnp.ones_like(done[..., :1]), done[..., :-1]],
                                           axis=-1).astype(w.dtype))

    def combine(a, b):
        return a[0] * b[0], b[0] * a[1] + b[1]

    _, out = jax.lax.associative_scan(combine, (decay, w), axis=w.ndim - 1)
    return out


def discounted_suffix_sum(x: Array, gamma, done: Array) -> Array:
    """G_k = x_k + gamma (1 - done_k) G_{k+1} along axis 1 of ``x`` [E, T, ...] (segment returns).

    The discounted sum of a trajectory segment from step k to its episode's end (or the batch end).
    """
    keep = gamma * (1.0 - done.astype(x.dtype))
    keep = keep.reshape(keep.shape + (1,) * (x.ndim - keep.ndim))
    keep = jnp.broadcast_to(keep, x.shape)

    def combine(a, b):  # reverse scan: a is the later element
        return a[0] * b[0], b[1] + b[0] * a[1]

    _, out = jax.lax.associative_scan(combine, (keep, x), reverse=True, axis=1)
    return out


def regroup(w: Array, group: Array, target_group: Array, num_groups: int) -> Array:
    """Per target step j: (sum of w over source steps of j's group) / (visits of the group in target).

    With ``target_group = group`` this is the every-visit group mean; with a separate (oracle)
    batch as target it moves the weights of the main batch onto the oracle's segments.
    """
    total = jax.ops.segment_sum(w.reshape(-1), group.reshape(-1), num_groups)
    count = jax.ops.segment_sum(jnp.ones(target_group.size, w.dtype), target_group.reshape(-1),
                                num_groups)
    return (total / jnp.maximum(count, 1.0))[target_group]


def group_mean(w: Array, group: Array, num_groups: int) -> Array:
    """Replaces each w_k by the mean of w over its group (every-visit grouping by (s,b) or s)."""
    return regroup(w, group, group, num_groups)
