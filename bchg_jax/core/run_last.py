"""Run-last batching: a per-run solver that, under ``vmap``, runs on arrays whose run axis is last.

``jax.vmap`` puts the mapped axis first ([R, S] for a value table of R runs). Small gather-heavy
solvers (the sparse successor sweeps of :mod:`bchg_jax.tabular.sparse`) run several times faster
on XLA:CPU when the run axis is the minor, contiguous one ([S, R]): a successor gather then copies
whole rows of R values. :func:`run_last` turns an implementation written for that layout into a
per-run function whose batching rule (``jax.custom_batching.custom_vmap``) moves every mapped
axis to the end; nested ``vmap``s (a grid of hyperparameters x seeds) merge into one run axis.

The implementation ``impl(has_run, *args)`` receives ``has_run``, a static tuple of bools: True
where that argument carries a trailing run axis of a common size R (absent in an unbatched call),
False where it is shared by all runs. It must return a tuple of arrays that all end in the run
axis (size R, or 1 when no argument has one). Forward-only: a :func:`run_last` function has no
derivative rule (the training loops use it for solves they do not differentiate).

``impl`` is traced when ``vmap`` reaches the call, which inside a ``scan`` or ``while_loop``
body is after the body was traced, outside whatever matmul precision scope
(``jax.default_matmul_precision``, :func:`~bchg_jax.core.precision.full_precision`) surrounded
the call. :func:`run_last` therefore records the precision in force where the function is
called and re-enters it around ``impl`` and the batching rule (:func:`in_callers_precision`):
``impl`` computes at the caller's precision wherever ``vmap`` traces it.
"""

from __future__ import annotations

import contextlib
import functools
from typing import Callable, Optional, Tuple

import jax
import jax.numpy as jnp
from jax.custom_batching import custom_vmap

from bchg_jax.core.host_tests import chunked_while_loop
from bchg_jax.core.validate import check_count


def _merge(x, batched: bool, has_run: bool, r_out: int, r_in: int):
    """One argument in the merged layout [..., r_out * r_in] (run index r_o * r_in + r_i), or
    unchanged when it is shared at both levels."""
    if batched and has_run:  # [r_out, ..., r_in] -> [..., r_out, r_in]
        x = jnp.moveaxis(x, 0, -2)
        return x.reshape(x.shape[:-2] + (r_out * r_in,))
    if batched:  # [r_out, ...] -> [..., r_out] -> repeat each r_in times
        return jnp.repeat(jnp.moveaxis(x, 0, -1), r_in, axis=-1)
    if has_run:  # [..., r_in] -> tiled r_out times
        return jnp.tile(x, (1,) * (x.ndim - 1) + (r_out,))
    return x


def callers_precision() -> Optional[str]:
    """The matmul precision in force where this is called (``jax.default_matmul_precision``'s
    scope, else the global ``jax_default_matmul_precision``; ``None``: the backend's default)."""
    return jax.config.jax_default_matmul_precision


def in_callers_precision(precision: Optional[str]):
    """A context that re-enters a precision recorded by :func:`callers_precision`: a custom
    batching rule traced later (when ``vmap`` reaches it, outside the caller's scope) computes
    as its caller would have."""
    if precision is None and jax.config.jax_default_matmul_precision is None:
        return contextlib.nullcontext()
    return jax.default_matmul_precision(precision)


def run_last(impl: Callable) -> Callable:
    """A per-run function ``f(*arrays) -> tuple of arrays`` from a run-last ``impl`` (module doc).

    Args:
      impl: ``impl(has_run, *arrays) -> tuple`` of arrays each ending in the run axis.
    Returns:
      ``f(*arrays)``: the per-run result (the trailing run axis of size 1 removed); under
      ``vmap`` (any nesting) ``impl`` runs once on the merged run axis, at the matmul
      precision in force where ``f`` was called (module doc).
    """

    @functools.lru_cache(maxsize=None)
    def level(has_run: Tuple[bool, ...], precision: Optional[str]):
        @custom_vmap
        def f(*args):
            with in_callers_precision(precision):
                return tuple(impl(has_run, *args))

        @f.def_vmap
        def rule(axis_size, in_batched, *args):
            with in_callers_precision(precision):
                return batched(axis_size, in_batched, *args)

        def batched(axis_size, in_batched, *args):
            sizes = {a.shape[-1] for a, h in zip(args, has_run, strict=False) if h}
            r_in = sizes.pop() if sizes else 1
            new = tuple(
                _merge(a, b, h, axis_size, r_in)
                for a, b, h in zip(args, in_batched, has_run, strict=False)
            )
            merged = tuple(b or h for b, h in zip(in_batched, has_run, strict=False))
            outs = level(merged, precision)(*new)
            outs = tuple(
                jnp.moveaxis(o.reshape(o.shape[:-1] + (axis_size, r_in)), -2, 0) for o in outs
            )
            return outs, tuple(True for _ in outs)

        return f

    def per_run(*args):
        args = tuple(jnp.asarray(a) for a in args)
        unbatched = level(tuple(False for _ in args), callers_precision())
        return tuple(o[..., 0] for o in unbatched(*args))

    return per_run


def add_run_axis(x, has_run: bool):
    """``x`` with a trailing run axis (size 1 when it has none): [..., R] or [..., 1]."""
    return x if has_run else x[..., None]


def stage_sizes(runs: int, smallest: int = 16):
    """Lane counts of :func:`compacting_while_loop`'s stages: ``runs``, then halving while
    above ``smallest`` (240 -> 240, 120, 60, 30, 15).

    Raises:
      ValueError: ``smallest`` not an integer >= 1 (halving, rounded up, never goes below 1:
        0 looped for ever).
    """
    check_count("smallest (lanes of the last stage)", smallest)
    sizes = [int(runs)]
    while sizes[-1] > smallest:
        sizes.append(-(-sizes[-1] // 2))
    return sizes


def compacting_while_loop(active, body, carry, smallest: int = 16, steps=None):
    """``while any(active(carry)): carry = body(carry)`` over a run axis, on fewer lanes as they
    finish.

    A vmapped while loop runs every lane until the slowest one is done. Here ``carry`` is a
    pytree of arrays that all end in the run axis R (per-lane state and per-lane constants); the
    loop runs in stages of :func:`stage_sizes` lanes: a stage loops until at most the next stage's
    number of lanes is active, then the active lanes are moved to the front and the next stage
    runs on them alone. ``body`` must leave an inactive lane unchanged (so that the lanes that
    ride along in a stage are not altered); a lane's result then does not depend on the others.

    Args:
      active: ``carry -> [R] bool``, the lanes still to be iterated.
      body: ``carry -> carry`` (one iteration of every lane, inactive lanes unchanged).
      carry: pytree of arrays [..., R].
      smallest: the last stage's lane count is at most this (R itself when R is smaller).
      steps: steps per loop test (:func:`~bchg_jax.core.host_tests.chunked_while_loop`; None:
        its default): 1 where ``body`` holds a ``lax.cond``, itself a host test per step, which
        the masked steps would only add to.
    Returns:
      the final carry (same shapes, lanes in their original order).
    """
    R = jax.tree.leaves(carry)[0].shape[-1]
    sizes = stage_sizes(R, smallest)
    order = jnp.arange(R)
    for i, n in enumerate(sizes):
        after = sizes[i + 1] if i + 1 < len(sizes) else 0
        if i == 0:
            carry = chunked_while_loop(
                lambda c, after=after: jnp.sum(active(c)) > after, body, carry, steps
            )
        else:
            lanes = order[:n]
            sub = jax.tree.map(lambda x, lanes=lanes: jnp.take(x, lanes, axis=-1), carry)
            sub = chunked_while_loop(
                lambda c, after=after: jnp.sum(active(c)) > after, body, sub, steps
            )
            carry = jax.tree.map(lambda x, y, lanes=lanes: x.at[..., lanes].set(y), carry, sub)
        if after:
            order = jnp.argsort(~active(carry), stable=True)  # active lanes first
    return carry


__all__ = [
    "run_last",
    "callers_precision",
    "in_callers_precision",
    "add_run_axis",
    "stage_sizes",
    "compacting_while_loop",
]
