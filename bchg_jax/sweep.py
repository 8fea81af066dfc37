"""Seeds x hyperparameter grids as one compiled program (DESIGN principle 4).

``run_grid`` vmaps a :class:`~bchg_jax.train.Trainer` over a grid of hparams (leading axis G) and
seeds (axis N) and drives it in jitted chunks of ``chunk`` iterations, so progress can be printed
between chunks while nothing inside a chunk syncs with the host. A new grid value never retraces:
hparams are traced arrays.
"""
from __future__ import annotations

import itertools
import time
from typing import Callable, Dict, Optional, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from bchg_jax.train import Trainer, make_hparams

Array = jax.Array


def seed_keys(seeds: Sequence[int] | int, base_seed: int = 0) -> Array:
    """Typed keys, one per seed index: fold_in(key(base_seed), i)."""
    idx = jnp.arange(seeds) if isinstance(seeds, (int, np.integer)) else jnp.asarray(seeds)
    if idx.size == 0:
        raise ValueError("at least one seed is required")
    return jax.vmap(lambda i: jax.random.fold_in(jax.random.key(base_seed), i))(idx)


def product_grid(**axes: Sequence[float]) -> Dict[str, np.ndarray]:
    """Cartesian product of named hyperparameter lists -> dict of flat arrays of length G."""
    for name, values in axes.items():
        if len(values) == 0:
            raise ValueError(f"hyperparameter grid axis {name!r} is empty")
    names = list(axes)
    rows = list(itertools.product(*(axes[n] for n in names)))
    return {n: np.asarray([r[i] for r in rows], np.float64) for i, n in enumerate(names)}


def grid_functions(trainer: Trainer):
    """(init, run): jitted functions over [G] hparams x [N] keys; state leaves are [G, N, ...]."""
    init = jax.jit(jax.vmap(jax.vmap(trainer.init, (0, None)), (None, 0)))
    run = jax.jit(jax.vmap(jax.vmap(trainer.run, (0, None, None)), (0, 0, None)),
                  static_argnums=2)
    return init, run


def run_grid(trainer: Trainer, grid: Dict[str, np.ndarray], seeds: int, iterations: int,
             chunk: int = 500, base_seed: int = 0, state=None, start: int = 0,
             on_chunk: Optional[Callable] = None, verbose: bool = True):
    """Runs ``iterations`` outer iterations of every (grid point, seed); returns (state, metrics).

    ``metrics`` is a dict of numpy arrays shaped [G, N, iterations - start]. ``state``/``start``
    continue an earlier run; ``on_chunk(state, metrics_so_far, done)`` is called after each chunk
    (e.g. to write results).
    """
    if chunk < 1 or iterations < 1:
        raise ValueError("chunk and iterations must be >= 1")
    hp = make_hparams(grid["lr"], grid["sarsa_alpha"], grid["beta"])
    init, run = grid_functions(trainer)
    if state is None:
        state = init(seed_keys(seeds, base_seed), hp)
    chunks, done, t0 = [], start, time.perf_counter()
    while done < iterations:
        n = min(chunk, iterations - done)
        state, m = run(state, hp, n)
        chunks.append(jax.tree.map(np.asarray, m))  # host copy once per chunk
        done += n
        metrics = {k: np.concatenate([c[k] for c in chunks], axis=-1) for k in chunks[0]}
        if verbose:
            last = metrics["J"][..., -min(1000, metrics["J"].shape[-1]):].mean(-1).mean(-1)
            print(f"  iter {done:6d}/{iterations}  best mean J (last <=1000) {last.max():+.4f}  "
                  f"elapsed {time.perf_counter() - t0:7.1f}s", flush=True)
        if on_chunk is not None:
            on_chunk(state, metrics, done)
    return state, metrics
