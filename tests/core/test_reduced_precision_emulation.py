"""``core.reduced_precision`` against hand-rounded references: the default block rounds both
operands to TF32 exactly as ``round_mantissa(., 10)`` does, float64 products are left exact and
counted as full, ``mantissa_bits`` 0 is refused, and ``round_mantissa`` keeps NaNs (whatever
their payload) and is the identity at float32's own 23 bits."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from bchg_jax.core.reduced_precision import emulate_reduced_precision, round_mantissa


def test_default_block_rounds_both_operands_to_tf32():
    """Inside ``emulate_reduced_precision()`` a default float32 product equals the float64
    product of both operands rounded to 10 mantissa bits (up to float32 accumulation), and is
    farther from it with either operand left unrounded or rounded to bfloat16."""
    a = jax.random.normal(jax.random.key(3), (32, 48), jnp.float32)
    b = jax.random.normal(jax.random.key(4), (48, 16), jnp.float32)
    f64 = lambda x: np.asarray(x, np.float64)  # noqa: E731
    want = f64(round_mantissa(a, 10)) @ f64(round_mantissa(b, 10))
    one_side = f64(round_mantissa(a, 10)) @ f64(b)
    bf16 = f64(round_mantissa(a, 7)) @ f64(round_mantissa(b, 7))
    with emulate_reduced_precision() as counts:
        got = f64(jax.jit(lambda x, y: x @ y)(a, b))
    assert counts == {"rounded": 1, "full": 0}
    err = np.abs(got - want).max()
    assert err < 1e-5, err
    assert np.abs(one_side - want).max() > 100 * err
    assert np.abs(bf16 - want).max() > 100 * err


def test_float64_products_are_left_exact_and_counted_full(x64):
    """A float64 product at default precision inside the block is not float32: it is lowered
    as it is and counted under ``full``."""
    a = jnp.asarray(np.random.default_rng(0).normal(size=(8, 8)), jnp.float64)
    with emulate_reduced_precision() as counts:
        got = jax.jit(lambda x: x @ x)(a)
    assert counts == {"rounded": 0, "full": 1}
    np.testing.assert_allclose(got, np.asarray(a) @ np.asarray(a), rtol=1e-13)


def test_zero_mantissa_bits_is_refused():
    """``mantissa_bits`` must be in 1..22: 0 is refused before anything is replaced."""
    with pytest.raises(ValueError, match="mantissa_bits"):
        with emulate_reduced_precision(0):
            pass


def test_round_mantissa_keeps_nans_with_low_payload_bits():
    """A NaN whose payload lies only in the bits rounded away (0x7F800001) stays NaN, not inf;
    at 23 bits round_mantissa is the identity."""
    bits = jnp.asarray([0x7F800001, 0xFF800003], jnp.uint32)
    nan = jax.lax.bitcast_convert_type(bits, jnp.float32)
    assert np.all(np.isnan(np.asarray(nan)))
    assert np.all(np.isnan(np.asarray(round_mantissa(nan, 10))))
    x = jnp.asarray([1.0 + 2.0**-23, -3.3, 1e-30], jnp.float32)
    np.testing.assert_array_equal(round_mantissa(x, 23), x)
