"""Reduced-precision matrix products emulated on the CPU: what a GPU or TPU run computes.

On Ampere / Hopper GPUs a float32 ``dot_general`` at JAX's default precision rounds its operands
to TF32 (10 explicit mantissa bits, unit roundoff 2^-11 ~ 4.9e-4) and accumulates in float32; on
TPUs the default pass is bfloat16 (7 bits, 2^-8 ~ 3.9e-3). A CPU computes every product in full
float32, so a CPU run cannot show what that rounding does to a solver's stopping test, to a
sampled estimate whose signal is below 1e-3 of its operands, or to a training curve.
:func:`emulate_reduced_precision` makes it show: inside the block, every float32 ``dot_general``
compiled for the CPU whose precision is not ``HIGHEST`` has both operands rounded to
``mantissa_bits`` (round to nearest, ties to even) before an exact float32 product; a product at
``HIGHEST`` (:func:`~bchg_jax.core.precision.full_precision`) is left as it is. ::

    from bchg_jax.core.reduced_precision import emulate_reduced_precision

    with emulate_reduced_precision() as counts:    # TF32; mantissa_bits=7 for bfloat16
        out = my_jitted_program(*args)             # compiled inside the block
    print(counts)                                  # {'rounded': ..., 'full': ...} products

It is a worst case of the GPU: XLA:GPU may compute a small product (a matrix-vector one, say)
in a fused loop at full float32, and here every default product is rounded. The test suite uses
it on whole trainers (every solve converges and the results match the CPU's), and
``python -m benchmarks.reduced_precision MODULE ARGS`` (``benchmarks/reduced_precision.py``)
runs any experiment or benchmark under it.

How: the CPU lowering rule of ``dot_general`` is replaced for the duration of the block (a JAX
internal, ``jax._src.interpreters.mlir``; a JAX without it raises ``RuntimeError`` here rather
than emulating nothing), and JAX's in-memory compilation caches are cleared on entry and on
exit, so that programs compiled inside the block are rounded and those compiled outside are
not. Not thread-safe; the persistent compilation cache is not affected (the rounded program's
HLO differs, so it has a key of its own).
"""

from __future__ import annotations

import contextlib
from typing import Dict, Iterator

import jax
import jax.numpy as jnp

from bchg_jax.core.precision import is_highest

TF32_BITS = 10
BF16_BITS = 7


def round_mantissa(x, mantissa_bits: int):
    """``x`` (float32) rounded to ``mantissa_bits`` explicit mantissa bits, to nearest with ties
    to even; other dtypes are returned unchanged. Infinities and NaNs stay so (a NaN's payload
    may change); a value whose rounding overflows becomes infinite, as on the hardware."""
    x = jnp.asarray(x)
    if x.dtype != jnp.float32 or mantissa_bits >= 23:
        return x
    drop = 23 - int(mantissa_bits)
    u = jax.lax.bitcast_convert_type(x, jnp.uint32)
    odd = (u >> drop) & jnp.uint32(1)
    u = (u + jnp.uint32((1 << (drop - 1)) - 1) + odd) & jnp.uint32(0xFFFFFFFF ^ ((1 << drop) - 1))
    out = jax.lax.bitcast_convert_type(u, jnp.float32)
    return jnp.where(jnp.isfinite(x), out, x)


def _internals():
    try:
        from jax._src.interpreters import mlir
        from jax._src.lax import lax as lax_internal

        entry = mlir._platform_specific_lowerings["cpu"][lax_internal.dot_general_p]
        rule = entry.rule
    except (ImportError, AttributeError, KeyError) as e:  # pragma: no cover - JAX internals
        raise RuntimeError(
            "emulate_reduced_precision needs JAX's CPU lowering table "
            f"(jax._src.interpreters.mlir), which this JAX ({jax.__version__}) does not have"
        ) from e
    return mlir, lax_internal.dot_general_p, entry, rule


@contextlib.contextmanager
def emulate_reduced_precision(mantissa_bits: int = TF32_BITS) -> Iterator[Dict[str, int]]:
    """Context manager: programs compiled for the CPU inside it round the operands of every
    float32 product that is not at ``HIGHEST`` to ``mantissa_bits`` (module docstring).

    Args:
      mantissa_bits: explicit mantissa bits kept, 1-22: 10 for TF32 (GPU), 7 for bfloat16 (TPU).
    Yields:
      a dict counting the products lowered inside the block so far: ``rounded`` (default or
      reduced precision, emulated) and ``full`` (``HIGHEST``, or not float32: left exact).
    Raises:
      ValueError: ``mantissa_bits`` outside 1-22.
      RuntimeError: a JAX without the internal lowering table this relies on, or a default
        backend other than the CPU (programs would compile for the device, unrounded: there,
        run on the device itself, or set ``JAX_PLATFORMS=cpu``).
    """
    if not (isinstance(mantissa_bits, int) and 1 <= mantissa_bits <= 22):
        raise ValueError(f"mantissa_bits must be an integer in 1..22, got {mantissa_bits!r}")
    if jax.default_backend() != "cpu":
        raise RuntimeError(
            "emulate_reduced_precision rounds programs compiled for the CPU, but JAX's default "
            f"backend is {jax.default_backend()!r}: run there without it, or set JAX_PLATFORMS=cpu"
        )
    mlir, dot_general_p, entry, original = _internals()
    counts = {"rounded": 0, "full": 0}

    emulating = []  # non-empty while lowering the rounded product itself (not counted)

    def rule(ctx, lhs, rhs, *, precision, **params):
        if is_highest(precision) or ctx.avals_in[0].dtype != jnp.float32:
            counts["full"] += 0 if emulating else 1
            return original(ctx, lhs, rhs, precision=precision, **params)
        counts["rounded"] += 1
        highest = (jax.lax.Precision.HIGHEST, jax.lax.Precision.HIGHEST)

        def rounded(a, b):
            a, b = round_mantissa(a, mantissa_bits), round_mantissa(b, mantissa_bits)
            return dot_general_p.bind(a, b, precision=highest, **params)

        emulating.append(True)
        try:
            return mlir.lower_fun(rounded, multiple_results=False)(ctx, lhs, rhs)
        finally:
            emulating.pop()

    jax.clear_caches()
    mlir.register_lowering(dot_general_p, rule, platform="cpu", inline=entry.inline)
    try:
        yield counts
    finally:
        mlir._platform_specific_lowerings["cpu"][dot_general_p] = entry
        jax.clear_caches()
