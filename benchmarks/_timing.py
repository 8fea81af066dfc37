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
