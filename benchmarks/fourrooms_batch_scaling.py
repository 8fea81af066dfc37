"""How Four-Rooms cost grows with the batch size: per-method ms per outer iteration at batch
100, 200, 400 and 1000 (one grid point x 10 seeds vmapped, measured back to back so that the
ratios share the machine's conditions). Used to extrapolate the whole figure's wall time from
the measured batch-100 grids: ``wall(beta, b) ~ wall(beta, 100) x ms(b) / ms(100)``.

    python -m benchmarks.fourrooms_batch_scaling [--iterations 200]
"""

from __future__ import annotations

import argparse
import datetime
import platform
import time

import jax

from bchg_jax import seed_keys
from bchg_jax.core.health import health_text, solver_health
from bchg_jax.core.sweep import grid_functions
from bchg_jax.problems import fourrooms
from bchg_jax.tabular import HParams, TrainConfig, make_train
from experiments.fourrooms import ALL_METHODS, batch_shape

BATCHES = (100, 200, 400, 1000)


def ms_per_iteration(method, batch, iterations, seeds, beta):
    """(ms per outer iteration, solver health of the timed runs)."""
    envs, steps = batch_shape(batch)
    trainer = make_train(
        fourrooms("reference"),
        method,
        TrainConfig(num_envs=envs, num_steps=steps, iterations=iterations),
    )
    init, run = grid_functions(trainer)
    hp = HParams.from_grid({"lr": [0.1], "sarsa_alpha": [0.5], "beta": [beta]})
    state = init(seed_keys(seeds), hp)
    jax.block_until_ready(run(state, hp, iterations))  # compile
    t0 = time.perf_counter()
    _, metrics = jax.block_until_ready(run(state, hp, iterations))
    return 1e3 * (time.perf_counter() - t0) / iterations, solver_health(metrics)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--iterations", type=int, default=200)
    p.add_argument("--seeds", type=int, default=10)
    p.add_argument("--beta", type=float, default=1e-3)
    a = p.parse_args(argv)
    print(
        f"# {datetime.date.today()} {platform.machine()} jax {jax.__version__}, "
        f"{a.seeds} seeds, {a.iterations} iterations, beta {a.beta}"
    )
    print(
        "| method | "
        + " | ".join(f"batch {b} (ms/it)" for b in BATCHES)
        + " | "
        + " | ".join(f"x{b}/100" for b in BATCHES[1:])
        + " | solver health (worst batch) |"
    )
    print("|---|" + "---|" * (2 * len(BATCHES)))
    for method in ALL_METHODS:
        rows = [ms_per_iteration(method, b, a.iterations, a.seeds, a.beta) for b in BATCHES]
        ms = [x for x, _ in rows]
        worst = max((h for _, h in rows), key=lambda h: (h["capped_share"], h["update_skipped"]))
        print(
            f"| {method} | "
            + " | ".join(f"{x:.2f}" for x in ms)
            + " | "
            + " | ".join(f"{x / ms[0]:.2f}" for x in ms[1:])
            + f" | {health_text(worst)} |",
            flush=True,
        )


if __name__ == "__main__":
    main()
