"""The XLA:CPU stall of large vmapped programs, and the flag that avoids it.

On XLA:CPU (jaxlib 0.10.2, 2 cores) the *concurrency-optimized scheduler* deadlocks large vmapped
training programs: the thermal trainer with 1000 runs (8.5 GB of temporaries per iteration)
compiles and runs a chunk of two iterations (a scan that short is unrolled), but a chunk of three
or more never finishes, every thread waiting on a futex with no CPU use; the LQR game at 1000
runs likewise. With ``--xla_cpu_enable_concurrency_optimized_scheduler=false`` in ``XLA_FLAGS``
the same chunk completes (3 iterations in 19-35 s). The option has no effect when passed per
program (``jax.jit(..., compiler_options=...)``, tried): it must be in ``XLA_FLAGS`` before the
CPU backend starts. jaxlib 0.11.2 and 0.12.0.1 run the same chunk without the flag (thermal at
1000 runs: 3.5 and 4.1 s per iteration, 2026-11-28), so only 0.10.x gets it.

:func:`configure_xla_cpu` (called when :mod:`bchg_jax` is imported) appends the flag to
``XLA_FLAGS`` when all of these hold: the variable does not mention the option already (a
user's own setting wins), ``BCHG_JAX_KEEP_XLA_FLAGS`` is not set, no JAX backend has started yet,
and the installed jaxlib is one of the releases that stall, whose flag list was checked to
contain the option (an unknown flag in ``XLA_FLAGS`` aborts the process). Otherwise it leaves
the environment alone; with a 0.10.x jaxlib started before the import, set the flag yourself
(docs/performance.md).
"""

from __future__ import annotations

import os

FLAG = "--xla_cpu_enable_concurrency_optimized_scheduler=false"
OPTION = "xla_cpu_enable_concurrency_optimized_scheduler"
# jaxlib versions that stall without OPTION (and whose XLA_FLAGS parser was checked to know it)
CHECKED_JAXLIB_PREFIXES = ("0.10.",)


def _backends_started() -> bool:
    try:
        from jax._src import xla_bridge

        return bool(xla_bridge.backends_are_initialized())
    except Exception:  # noqa: BLE001 - a private API: assume started (do nothing)
        return True


def configure_xla_cpu() -> bool:
    """Appends :data:`FLAG` to ``XLA_FLAGS`` when safe (module docstring); True if it did."""
    flags = os.environ.get("XLA_FLAGS", "")
    if OPTION in flags or os.environ.get("BCHG_JAX_KEEP_XLA_FLAGS"):
        return False
    try:
        import jaxlib

        version = jaxlib.__version__
    except Exception:  # noqa: BLE001
        return False
    if not version.startswith(CHECKED_JAXLIB_PREFIXES) or _backends_started():
        return False
    os.environ["XLA_FLAGS"] = (flags + " " + FLAG).strip()
    return True
