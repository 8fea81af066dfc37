"""The XLA:CPU flags of jaxlib 0.10.x: a stall of large vmapped programs, a fusion that fails to
compile and one that computes a wrong sum, and the flags that avoid them.

On XLA:CPU (jaxlib 0.10.2, 2 cores) the *concurrency-optimized scheduler* deadlocks large vmapped
training programs: the thermal trainer with 1000 runs (8.5 GB of temporaries per iteration)
compiles and runs a chunk of two iterations (a scan that short is unrolled), but a chunk of three
or more never finishes, every thread waiting on a futex with no CPU use; the LQR game at 1000
runs likewise. With ``--xla_cpu_enable_concurrency_optimized_scheduler=false`` in ``XLA_FLAGS``
the same chunk completes (3 iterations in 19-35 s). The option has no effect when passed per
program (``jax.jit(..., compiler_options=...)``, tried): it must be in ``XLA_FLAGS`` before the
CPU backend starts. jaxlib 0.11.2 and 0.12.0.1 run the same chunk without the flag (thermal at
1000 runs: 3.5 and 4.1 s per iteration, 2026-11-28), so only 0.10.x gets it.

The cause (native stacks, 2026-12-02): jaxlib 0.10.x's batched LAPACK kernels split their batch
over the intra-op pool and block until the pieces finish, so as many concurrent kernels as pool
threads wait on each other forever. The scheduler flag makes that rarer, not impossible; the
per-sample densities therefore avoid sample-batched LAPACK calls altogether
(:func:`bchg_jax.core.maxent_lqr.whiten`, docs/performance.md).

:func:`configure_xla_cpu` (called when :mod:`bchg_jax` is imported) appends the flag to
``XLA_FLAGS`` when all of these hold: the variable does not mention the option already (a
user's own setting wins), ``BCHG_JAX_KEEP_XLA_FLAGS`` is not set, no JAX backend has started yet,
and the installed jaxlib is one of the releases that stall, whose flag list was checked to
contain the option (an unknown flag in ``XLA_FLAGS`` aborts the process). Otherwise it leaves
the environment alone; with a 0.10.x jaxlib started before the import, set the flag yourself
(docs/performance.md).

The same import also turns off XLA:CPU's fusion emitters on 0.10.x
(``--xla_cpu_use_fusion_emitters=false``): jaxlib 0.10.2 names the LLVM function of a fused
instruction after the instruction with '-' and '_' both mapped to '_', so a fusion holding a
``dynamic_slice.N`` (JAX's ``dynamic_slice``) and a ``dynamic-slice.N`` (XLA's rewrite of a
one-index gather) fails to compile ("Failed to translate module to LLVM IR"; the chain example
in ``examples/custom_cmdp.py``, whether a program hits it depends on XLA's numbering). Without
the emitters the same programs compile, with the same results (the golden values of
``tests/tabular/test_follower_models.py`` to 1e-6) and speed (the main job 13.1 s either way);
jaxlib 0.11.2 compiles the example with them.

And it turns off the ``reduce`` kind of XLA:CPU's YNNPACK library fusions on 0.10.x
(``--xla_cpu_experimental_ynn_fusion_type=-LIBRARY_FUSION_TYPE_REDUCE``; the dot and elementwise
kinds stay): jaxlib 0.10.2 hands a broadcast product summed over its last axis to a YNNPACK
``reduce`` fusion that computes it wrongly when the array has a leading axis of length 1, the
leading grid axis of every vmapped trainer (``core.sweep.grid_functions`` with one grid point).
``jnp.sum(r[..., None, :] * w, -1)`` for ``r`` [1, R, 100] and ``w`` [2, 100] returned the first
row's sums in place of the second's (an error of 21.6 on values of ~50) for every R from 24 to
1,000 tried (and at 50 steps), and right ones for R up to 20, for [2, 100, 100], [1, 1, 100, 100]
or a 2-d ``r`` (2026-12-04; ``tests/core/test_compile_options.py`` keeps the case). The library's
own programs were not measurably hit (every experiment's trainer, 1 and 100 runs, 10
iterations: the same metrics up to rounding, relative 1e-6 to 4e-5, with the fusions on or off),
but a new line of code can be (the LQR game's two returns, first written that way, came out
equal). Without these fusions the trainers are as fast or faster on this machine
(docs/performance.md). jaxlib 0.10.0 and 0.10.1 know the option, its '-' form and the type name
(their flag lists were checked; the project needs 0.10.2 or later anyway); whether 0.11.x still
has the fault is not known here (no CPU wheel of it in reach).
"""

from __future__ import annotations

import os

# (option, flag) pairs appended on the jaxlib releases that need them (module docstring)
FLAGS = (
    (
        "xla_cpu_enable_concurrency_optimized_scheduler",
        "--xla_cpu_enable_concurrency_optimized_scheduler=false",
    ),
    ("xla_cpu_use_fusion_emitters", "--xla_cpu_use_fusion_emitters=false"),
    (
        "xla_cpu_experimental_ynn_fusion_type",
        "--xla_cpu_experimental_ynn_fusion_type=-LIBRARY_FUSION_TYPE_REDUCE",
    ),
)
FLAG = " ".join(flag for _, flag in FLAGS)  # what the import appends to an empty XLA_FLAGS
# jaxlib versions that stall / mis-compile without them (and whose XLA_FLAGS parser was checked
# to know every option)
CHECKED_JAXLIB_PREFIXES = ("0.10.",)


def _backends_started() -> bool:
    try:
        from jax._src import xla_bridge

        return bool(xla_bridge.backends_are_initialized())
    except Exception:  # noqa: BLE001 - a private API: assume started (do nothing)
        return True


def configure_xla_cpu() -> bool:
    """Appends each flag of :data:`FLAGS` whose option ``XLA_FLAGS`` does not mention, when
    safe (module docstring); True if it appended any."""
    flags = os.environ.get("XLA_FLAGS", "")
    missing = [flag for option, flag in FLAGS if option not in flags]
    if not missing or os.environ.get("BCHG_JAX_KEEP_XLA_FLAGS"):
        return False
    try:
        import jaxlib

        version = jaxlib.__version__
    except Exception:  # noqa: BLE001
        return False
    if not version.startswith(CHECKED_JAXLIB_PREFIXES) or _backends_started():
        return False
    os.environ["XLA_FLAGS"] = " ".join([flags, *missing]).strip()
    return True
