"""``while_loop`` with fewer host tests: several steps per trip, the same iterates.

On a GPU XLA runs a ``lax.while_loop`` whose trip count it cannot know by copying
the predicate to the host after every evaluation of the loop test: the host waits there until
the device has finished everything queued, and only then launches the next trip's kernels. A
solver loop of a small problem (a soft value iteration sweep, a Riccati step) is a few
microseconds of kernels per trip, so on an accelerator these waits can outweigh its arithmetic
(``benchmarks/loop_trips.py`` counts them per outer iteration: 300 to 570 in the toy game's
follower solves, 42 to 50 in thermal's Riccati solve; docs/performance.md, "On an NVIDIA
H200").

:func:`chunked_while_loop` makes ``steps`` steps per trip: the first as ``lax.while_loop``
would (the test has just passed), each later one only where the test still holds (a
``select`` on the device, no host test). It returns the same final carry as
``lax.while_loop`` (the same steps; under ``vmap`` per lane), with ``steps`` times fewer host
tests, for at most ``steps - 1`` steps of masked device work at the end of the loop. On the CPU
the carry is bit for bit the plain loop's; on a GPU XLA may fuse the steps of a trip otherwise,
so it can differ by rounding (a thermal run's J by ~1e-6 of itself on an H200, 2026-12-04).
Measured there: the toy game 2.5 times faster per iteration at one run and 2.0 at 100 runs,
thermal 1.26 times at 100 runs and no faster at one run, whose time is set by its fixed-length
loops (``benchmarks/results/device_h200/gpu_session_2026-12-04_evening.md``).

The masked steps run ``body_fun`` on states the plain loop never reaches (past the last step,
their results discarded), so the body must be pure and must finish on any state: no
``jax.debug.print`` / callbacks (they would fire for the masked steps too), no ``checkify``
checks (a NaN of a discarded step would be reported), and no inner loop that could run forever
on a state past the end (a test that a NaN keeps true). Every solver loop of the library is such
a body.
The CPU has no host test to save (its loop test is a branch in the same thread), so the default
(:func:`steps_per_test`) is one step per trip there and :data:`ACCELERATOR_STEPS_PER_TEST`
elsewhere; ``BCHG_STEPS_PER_TEST`` in the environment sets it for every backend (read when a
solver is traced: a function already compiled keeps its value).
"""

from __future__ import annotations

from typing import Callable, Optional

import jax
import jax.numpy as jnp

from bchg_jax.core.validate import check_count, env_count

#: steps per loop test on any backend but the CPU: a trip of 4 saves 3 device-to-host waits on a
#: GPU, and a loop pays at most 3 masked steps at its end (a solver sweep: a few small kernels,
#: less than one wait); H200, 2026-12-04: the toy game 2.0-2.5x faster per iteration
ACCELERATOR_STEPS_PER_TEST = 4
#: the environment variable that overrides :func:`steps_per_test` on every backend
ENV_VAR = "BCHG_STEPS_PER_TEST"


def steps_per_test(backend: Optional[str] = None) -> int:
    """Steps per host test of :func:`chunked_while_loop`: ``$BCHG_STEPS_PER_TEST`` if set, else 1
    on the CPU and :data:`ACCELERATOR_STEPS_PER_TEST` on any other backend.

    Args:
      backend: the platform name, or None for ``jax.default_backend()``.
    Raises:
      ValueError: ``BCHG_STEPS_PER_TEST`` set to anything but a positive integer.
    """
    steps = env_count(ENV_VAR)
    if steps is not None:
        return steps
    backend = jax.default_backend() if backend is None else backend
    return 1 if backend == "cpu" else ACCELERATOR_STEPS_PER_TEST


def chunked_while_loop(
    cond_fun: Callable, body_fun: Callable, init_val, steps: Optional[int] = None
):
    """``lax.while_loop(cond_fun, body_fun, init_val)``, testing ``cond_fun`` on the host once
    every ``steps`` steps (module docstring); the same result.

    Args:
      cond_fun: ``carry -> bool []``.
      body_fun: ``carry -> carry``, pure and finishing on any state (module docstring).
      init_val: the initial carry (a pytree).
      steps: steps per trip (an integer >= 1), or None for :func:`steps_per_test`.
    Returns:
      the final carry, as ``lax.while_loop`` returns it.
    Raises:
      ValueError: ``steps`` not a positive integer.
    """
    steps = steps_per_test() if steps is None else steps
    check_count("steps", steps)
    steps = int(steps)
    if steps == 1:
        return jax.lax.while_loop(cond_fun, body_fun, init_val)

    def body(carry):
        carry = body_fun(carry)  # the loop test has just passed
        for _ in range(steps - 1):
            going = cond_fun(carry)
            new = body_fun(carry)
            carry = jax.tree.map(lambda a, b, g=going: jnp.where(g, a, b), new, carry)
        return carry

    return jax.lax.while_loop(cond_fun, body, init_val)


__all__ = ["ACCELERATOR_STEPS_PER_TEST", "ENV_VAR", "steps_per_test", "chunked_while_loop"]
