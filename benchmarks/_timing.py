"""Shared timing helper of the benchmark scripts."""
from __future__ import annotations

import time

import jax

from bchg_jax.core.sweep import grid_functions, grid_hparams, seed_keys


def time_chunks(trainer, grid, runs: int, iterations: int):
    """(compile seconds, seconds per outer iteration) for ``runs`` vmapped seeds per grid point:
    the first call of the jitted chunk is compile + run, the second is timed on its own."""
    init, run = grid_functions(trainer)
    hp = grid_hparams(trainer, grid)
    state = init(seed_keys(runs), hp)
    t0 = time.perf_counter()
    state, m = run(state, hp, iterations)
    jax.block_until_ready(m)
    first = time.perf_counter() - t0
    t0 = time.perf_counter()
    state, m = run(state, hp, iterations)
    jax.block_until_ready(m)
    per_it = (time.perf_counter() - t0) / iterations
    return first - per_it * iterations, per_it


def time_call(fn, *args, repeats: int = 1):
    """(first call's extra seconds: compile and first-run costs, best run seconds) of
    ``fn(*args)``: one untimed-as-run first call, then the best of ``repeats`` timed calls."""
    import numpy as np
    t0 = time.perf_counter()
    jax.block_until_ready(fn(*args))
    first = time.perf_counter() - t0
    best = np.inf
    for _ in range(repeats):
        t0 = time.perf_counter()
        jax.block_until_ready(fn(*args))
        best = min(best, time.perf_counter() - t0)
    return max(first - best, 0.0), best
