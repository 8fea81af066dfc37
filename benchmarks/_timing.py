"""Shared timing helper of the benchmark scripts."""

from __future__ import annotations

import time

import jax

from bchg_jax.core.sweep import grid_functions, grid_hparams, seed_keys

# a chunk slower than this is not profiled (the profile would cost its time once more)
MAX_PROFILED_S = 10.0


def time_chunks(
    trainer, grid, runs: int, iterations: int, with_metrics: bool = False, profile: bool = False
):
    """(compile seconds, seconds per outer iteration) for ``runs`` vmapped seeds per grid point:
    the first call of the jitted chunk is compile + run, the second is timed on its own.
    ``with_metrics=True`` adds a third entry: the metrics of both calls (name -> numpy
    [G, runs, 2 * iterations]), to check the timed runs' solver health beside their speed.
    ``profile=True`` adds a last entry: a third call of the same chunk under the profiler
    (:func:`benchmarks.profile_trace.trace_summary`, nothing recompiled), or a text saying why
    there is none: profiling failed (a machine without the profiler's GPU tracing fails there,
    not the timing), or the chunk takes over :data:`MAX_PROFILED_S` (a time-limited step would
    pay for it)."""
    init, run = grid_functions(trainer)
    hp = grid_hparams(trainer, grid)
    state = init(seed_keys(runs), hp)
    t0 = time.perf_counter()
    state, m1 = run(state, hp, iterations)
    jax.block_until_ready(m1)
    first = time.perf_counter() - t0
    t0 = time.perf_counter()
    state, m2 = run(state, hp, iterations)
    jax.block_until_ready(m2)
    per_it = (time.perf_counter() - t0) / iterations
    out = (first - per_it * iterations, per_it)
    if with_metrics:
        import numpy as np

        out += ({k: np.concatenate([np.asarray(m1[k]), np.asarray(m2[k])], -1) for k in m1},)
    if profile:
        from benchmarks.profile_trace import trace_summary

        if per_it * iterations > MAX_PROFILED_S:
            out += (f"skipped: the chunk takes {per_it * iterations:.1f} s (> {MAX_PROFILED_S} s)",)
        else:
            try:
                out += (
                    trace_summary(
                        run, state, hp, iterations, iterations=iterations, untraced_s=per_it
                    ),
                )
            except Exception as err:  # a profile is a bonus beside the timing: never fatal
                out += (f"{type(err).__name__}: {err}",)
    return out


def time_call(fn, *args, repeats: int = 1, with_output: bool = False):
    """(first call's extra seconds: compile and first-run costs, best run seconds) of
    ``fn(*args)``: one untimed-as-run first call, then the best of ``repeats`` timed calls.
    ``with_output=True`` adds the last call's output (to check what the timed call computed)."""
    import numpy as np

    t0 = time.perf_counter()
    jax.block_until_ready(fn(*args))
    first = time.perf_counter() - t0
    best, out = np.inf, None
    for _ in range(repeats):
        t0 = time.perf_counter()
        out = jax.block_until_ready(fn(*args))
        best = min(best, time.perf_counter() - t0)
    return (max(first - best, 0.0), best) + ((out,) if with_output else ())


def unhealthy(health) -> bool:
    """A timed run whose solves hit their cap or whose updates were skipped
    (:func:`bchg_jax.core.health.solver_health`): its speed figure is not a valid one."""
    return bool(health.get("solve_capped", 0) or health.get("update_skipped", 0))


def report_unhealthy(bad, fail_on_cap: bool, checks_J: bool = False) -> None:
    """After a benchmark's table: name the rows in ``bad`` (capped solves, skipped updates; with
    ``checks_J``, also a J that was not finite or off the CPU reference) and, with
    ``fail_on_cap``, exit with status 3 (what ``benchmarks/device_check.sh`` relies on)."""
    if not bad:
        return
    what = "solves hit their cap or updates were skipped"
    if checks_J:
        what = (
            "solves hit their cap, updates were skipped, or J was not finite or off the CPU "
            "reference"
        )
    print(f"FAILED: {what} in: " + "; ".join(bad), flush=True)
    if fail_on_cap:
        raise SystemExit(3)
