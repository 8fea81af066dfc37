"""chunked_while_loop's default steps per test (read from the environment when ``steps`` is
None) and compacting_while_loop's stage sizes (bchg_jax.core.host_tests, bchg_jax.core.run_last)."""

import jax
import jax.numpy as jnp
import pytest

from bchg_jax.core.host_tests import ENV_VAR, chunked_while_loop
from bchg_jax.core.run_last import compacting_while_loop, stage_sizes


def test_chunked_while_loop_default_reads_the_environment(monkeypatch):
    """steps=None takes steps_per_test(): with BCHG_STEPS_PER_TEST=4, 10 steps make 3 trips (4
    host tests), not 11, and the same final carry."""
    from benchmarks.loop_trips import HOST_TEST, counting

    monkeypatch.setenv(ENV_VAR, "4")
    cond = lambda c: c[0] < 10  # noqa: E731
    body = lambda c: (c[0] + 1, c[1] * 1.5)  # noqa: E731
    with counting() as counts:
        out = jax.jit(lambda c: chunked_while_loop(cond, body, c))((jnp.int32(0), jnp.float32(1)))
        jax.block_until_ready(out)
        jax.effects_barrier()
    assert int(out[0]) == 10 and float(out[1]) == 1.5**10
    assert [kind for _, kind in counts] == [HOST_TEST] and sum(counts.values()) == 4


def test_stage_sizes_halve_rounding_up():
    """The docstring's example (240 -> 240, 120, 60, 30, 15), odd counts rounded up, and a run
    count at or below ``smallest`` is one stage."""
    assert stage_sizes(240) == [240, 120, 60, 30, 15]
    assert stage_sizes(35) == [35, 18, 9]
    assert stage_sizes(33, smallest=8) == [33, 17, 9, 5]
    assert stage_sizes(16) == [16] and stage_sizes(3) == [3]
    for smallest in (0, -2, 1.5):  # 0 looped for ever (halving rounded up stays at 1)
        with pytest.raises(ValueError, match="smallest"):
            stage_sizes(40, smallest)


def test_compacting_while_loop_odd_lanes_in_their_order():
    """37 lanes (stages 37, 19, 10) with trip counts in shuffled order: every lane ends at its
    own count, in its original position, whatever the stage split."""
    limits = jnp.asarray([(7 * i) % 37 for i in range(37)], jnp.int32)
    carry = {"n": jnp.zeros(37, jnp.int32), "limit": limits}
    active = lambda c: c["n"] < c["limit"]  # noqa: E731

    def body(c):
        return {**c, "n": c["n"] + active(c).astype(jnp.int32)}

    out = jax.jit(lambda c: compacting_while_loop(active, body, c, smallest=10))(carry)
    assert out["n"].tolist() == limits.tolist()
