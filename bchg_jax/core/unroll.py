"""Steps per trip of the fixed-length scans that chain a Four-Rooms iteration (``lax.scan``'s
``unroll``): the rollout's environment steps and the SARSA pass's updates, 100 each at batch 100.

A scan of known length runs its trips without a host test, but each trip of its ``while`` loop
still launches the body's kernels one after another, plus the loop's own copies of the carry on
a GPU. ``unroll`` steps per trip make fewer trips and let XLA fuse across the steps of a trip;
the steps and their results are the same (bit for bit on the CPU, checked in
``tests/core/test_unroll.py``). :data:`DEFAULT_UNROLL` = 4 was the fastest on this 2-core CPU
(one Four-Rooms run: 0.175 -> 0.14 ms per iteration against 1; 8 was slower). On a GPU, where a
Four-Rooms iteration is bound by these chains (docs/performance.md, "What bounds them"), the
best value is not measured yet: ``BCHG_SCAN_UNROLL`` in the environment sets it on every backend
(read when the rollout or the SARSA pass is traced: a function already compiled keeps its
value), and ``benchmarks/gpu_session.sh`` compares 4 with 25 when time is left.
"""

from __future__ import annotations

from bchg_jax.core.validate import env_count

#: steps per trip of the rollout's and the SARSA pass's scans unless ``BCHG_SCAN_UNROLL`` is set
DEFAULT_UNROLL = 4
#: the environment variable that sets :func:`scan_unroll`
ENV_VAR = "BCHG_SCAN_UNROLL"


def scan_unroll() -> int:
    """``$BCHG_SCAN_UNROLL`` if set, else :data:`DEFAULT_UNROLL`.

    Raises:
      ValueError: ``BCHG_SCAN_UNROLL`` set to anything but a positive integer.
    """
    given = env_count(ENV_VAR)
    return DEFAULT_UNROLL if given is None else given
