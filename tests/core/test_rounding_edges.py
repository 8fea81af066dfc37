"""Boundary cases of ``core.rounding`` that the solver tests do not pin: a change exactly at
``tol`` (converged and stopped), a decreasing sweep (the change is a sup-norm of |x' - x|),
``progress_update``'s sweep count, ``rounding_floor`` per lane, and ``refuse_unless_within``
naming non-finite values."""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
import pytest

from bchg_jax.core.rounding import (
    ROUNDING_ULPS,
    progress_init,
    progress_update,
    refuse_unless_within,
    rounding_floor,
    sweep_to_tolerance,
    within_tolerance,
)


def test_a_change_equal_to_tol_is_converged():
    """``within_tolerance`` is ``residual <= max(tol, floor)``: equality passes."""
    V = jnp.zeros((3,), jnp.float32)  # floor 0
    assert bool(within_tolerance(jnp.float32(0.25), V, 0.25))
    assert not bool(within_tolerance(jnp.float32(0.25), V, 0.125))
    W = jnp.asarray([4.0, -1.0], jnp.float32)
    floor = float(rounding_floor(W))
    assert bool(within_tolerance(jnp.float32(floor), W, 0.0))


def test_sweeps_stop_when_the_change_equals_tol():
    """x -> 0.5 x + 1 from 0: the change after sweep k is 2^-(k-1), exactly 2^-10 after 11
    sweeps, which meets ``tol`` = 2^-10 (the loop runs while the change is > tol)."""
    half = lambda x: 0.5 * x + 1.0  # noqa: E731
    _, res, k = sweep_to_tolerance(half, jnp.zeros((2,), jnp.float32), 2.0**-10, 100, 0.5)
    assert int(k) == 11 and float(res) == 2.0**-10


def test_a_decreasing_sweep_measures_the_absolute_change():
    """x -> 0.5 x - 1 from 0 moves every value down: the change is max |x' - x| (1, 0.5, ...),
    so 1e-3 is met after 11 sweeps, not after the first (whose signed change is -1)."""
    down = lambda x: 0.5 * x - 1.0  # noqa: E731
    x, res, k = sweep_to_tolerance(down, jnp.zeros((3,), jnp.float32), 1e-3, 100, 0.5)
    assert int(k) == 11 and float(res) == pytest.approx(2.0**-10)
    np.testing.assert_allclose(x, -(2.0 - 2.0**-10), rtol=1e-6)


def test_progress_update_adds_the_sweeps_of_a_chunk():
    """``progress_update(..., sweeps=n)`` adds n sweeps without a new minimum; a new minimum
    resets the count to 0."""
    p = progress_update(progress_init((2,), jnp.float32), jnp.asarray([1.0, 1.0], jnp.float32))
    p = progress_update(p, jnp.asarray([2.0, 0.5], jnp.float32), sweeps=4)
    np.testing.assert_array_equal(p.since, [4, 0])
    np.testing.assert_array_equal(p.best, [1.0, 0.5])
    p = progress_update(p, jnp.asarray([3.0, 3.0], jnp.float32), sweeps=3)
    np.testing.assert_array_equal(p.since, [7, 3])


def test_rounding_floor_along_an_axis_is_per_lane():
    """``rounding_floor(values [S, R], axis=0)`` is one floor per lane (the sparse solvers'
    run-last values), each from its own lane's max |V|."""
    V = jnp.asarray([[1.0, -100.0], [-2.0, 3.0]], jnp.float32)
    eps = float(np.finfo(np.float32).eps)
    np.testing.assert_allclose(
        rounding_floor(V, axis=0),
        [ROUNDING_ULPS * eps * 2.0, ROUNDING_ULPS * eps * 100.0],
        rtol=1e-6,
    )
    # lane 0's floor is 1.9e-6, lane 1's 9.5e-5: a change of 9e-5 is within lane 1's only
    ok = within_tolerance(jnp.asarray([9e-5, 9e-5], jnp.float32), V, 1e-6, axis=0)
    assert ok.tolist() == [False, True]


def test_refusal_names_non_finite_values_even_at_a_finite_residual():
    """``refuse_unless_within``: a miss whose values hold an inf is refused as non-finite values
    (more sweeps would not help), also when the residual itself is finite."""
    V = jnp.asarray([jnp.inf, 1.0], jnp.float32)
    with pytest.raises(ValueError, match="non-finite values"):
        refuse_unless_within(jnp.float32(0.5), V, 1e-6, "solve", "max_sweeps=5")
    with pytest.raises(ValueError, match=r"missed its tolerance .* with max_sweeps=5"):
        refuse_unless_within(jnp.float32(0.5), jnp.ones(2), 1e-6, "solve", "max_sweeps=5")
    assert bool(refuse_unless_within(jnp.float32(1e-7), jnp.ones(2, jnp.float32), 1e-6, "s", "c"))
