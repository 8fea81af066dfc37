"""``while_loop`` with fewer host tests: several steps per trip, the same iterates.

On a GPU (and a TPU) XLA runs a ``lax.while_loop`` whose trip count it cannot know by copying
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
``lax.while_loop`` (the same steps, bit for bit; under ``vmap`` per lane), with ``steps`` times
fewer host tests, for at most ``steps - 1`` steps of masked device work at the end of the loop.
The CPU has no host test to save (its loop test is a branch in the same thread), so the default
(:func:`steps_per_test`) is one step per trip there and :data:`ACCELERATOR_STEPS_PER_TEST`
elsewhere; ``BCHG_STEPS_PER_TEST`` in the environment sets it for every backend (read when a
solver is traced: a function already compiled keeps its value).
"""

from __future__ import annotations

import os
from typing import Callable, Optional

import jax
import jax.numpy as jnp

#: steps per loop test on an accelerator (GPU, TPU): a trip of 4 saves 3 device-to-host waits,
#: and a loop pays at most 3 masked steps at its end (a solver sweep: a few small kernels, less
#: than one wait); what it saves on a GPU is not measured yet
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
    given = os.environ.get(ENV_VAR)
    if given is not None:
        try:
            steps = int(given)
        except ValueError:
            steps = 0
        if steps < 1 or str(steps) != given.strip():
            raise ValueError(f"{ENV_VAR} must be a positive integer, got {given!r}")
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
      body_fun: ``carry -> carry``.
      init_val: the initial carry (a pytree).
      steps: steps per trip (>= 1), or None for :func:`steps_per_test`.
    Returns:
      the final carry, as ``lax.while_loop`` returns it.
    Raises:
      ValueError: ``steps`` not a positive integer.
    """
    steps = steps_per_test() if steps is None else steps
    if isinstance(steps, bool) or not isinstance(steps, int) or steps < 1:
        raise ValueError(f"steps must be a positive integer, got {steps!r}")
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
