"""``core.softmax.follower_softmax``'s derivative in float32 under a tangent with a large part
common to each row (the leader moving all of a row's Q_F together): it must match the float64
derivative of the same float32 inputs, which a plain softmax rule misses by ~eps * |dz|."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from bchg_jax.core.softmax import follower_softmax


def _reference(z, dz):
    """float64 numpy value and JVP of softmax along the last axis."""
    z, dz = np.asarray(z, np.float64), np.asarray(dz, np.float64)
    e = np.exp(z - z.max(-1, keepdims=True))
    g = e / e.sum(-1, keepdims=True)
    return g, g * (dz - (g * dz).sum(-1, keepdims=True))


def test_float32_tangent_with_a_large_common_part_matches_float64():
    """Rows of logits Q / beta with a tangent 1e4 (common) + O(0.3) (per action): the float32
    JVP agrees with float64 to ~1e-6 of its size (a plain rule is ~1e-2 off)."""
    rng = np.random.default_rng(0)
    z = jnp.asarray(rng.normal(size=(6, 4)) * 2.0, jnp.float32)
    dz = jnp.asarray(1e4 + 0.3 * rng.normal(size=(6, 4)), jnp.float32)
    val, tan = jax.jvp(follower_softmax, (z,), (dz,))
    want_val, want_tan = _reference(z, dz)
    assert val.dtype == jnp.float32 and tan.dtype == jnp.float32
    np.testing.assert_allclose(val, want_val, rtol=1e-5, atol=1e-7)
    err = np.max(np.abs(np.asarray(tan, np.float64) - want_tan)) / np.max(np.abs(want_tan))
    assert err < 1e-4, err


def test_a_dominant_action_with_its_own_large_tangent_matches_float64():
    """A row whose most likely action (probability 1 - 1e-5) alone moves by 1e4: the tangent
    (~0.1) must not be the difference of two ~1e4 float32 numbers. Centring at the most likely
    action keeps it to ~1e-6 relative; centring elsewhere (or not at all) loses ~1e-2."""
    z = jnp.asarray([[12.0, 0.0, 0.0], [0.0, 12.5, 1.0]], jnp.float32)
    dz = jnp.asarray([[1e4, 0.0, 0.0], [0.0, -1e4, 0.0]], jnp.float32)
    _, tan = jax.jvp(follower_softmax, (z,), (dz,))
    _, want = _reference(z, dz)
    np.testing.assert_allclose(np.asarray(tan, np.float64), want, rtol=1e-4)


def test_second_derivative_is_softmax_s(x64):
    """Differentiating the custom rule again (a Hessian, a JVP of a gradient) gives softmax's own
    second derivative: float64, against ``jax.nn.softmax``."""
    rng = np.random.default_rng(2)
    z = jnp.asarray(rng.normal(size=(3, 4)), jnp.float64)
    w = jnp.asarray(rng.normal(size=(3, 4)), jnp.float64)
    f = lambda sm: lambda x: jnp.sum(w * sm(x) ** 2)  # noqa: E731
    got = jax.hessian(f(follower_softmax))(z)
    want = jax.hessian(f(lambda x: jax.nn.softmax(x, axis=-1)))(z)
    np.testing.assert_allclose(got, want, rtol=1e-10, atol=1e-12)
