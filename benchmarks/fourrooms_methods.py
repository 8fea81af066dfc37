"""Per-method throughput on Four-Rooms: ms per outer iteration, compile time separate.

    python -m benchmarks.fourrooms_methods [--iterations 300] [--seeds 10] [--batch 100]

For every method: one grid point x ``--seeds`` seeds vmapped (the unit of the paper's grid), from
the initial state; each timed call follows a compiling call of identical shapes. HPGD (oracle)
is listed separately: its 10,000 extra oracle steps per iteration dominate its cost.
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
from experiments.fourrooms import batch_shape

ORDER = ("bchg", "hpgd_sa", "hpgd_mc", "sobirl", "naive", "exact", "hpgd_oracle")


def main(argv=None):
    p = argparse.ArgumentParser()
    p.add_argument("--iterations", type=int, default=300)
    p.add_argument("--seeds", type=int, default=10)
    p.add_argument("--batch", type=int, default=100)
    p.add_argument("--beta", type=float, default=1e-3)
    a = p.parse_args(argv)
    envs, steps = batch_shape(a.batch)
    print(
        f"# Four-Rooms per-method throughput  {datetime.date.today()}  "
        f"{platform.machine()}  jax {jax.__version__}  batch {a.batch}  {a.seeds} seeds vmapped"
    )
    print(
        f"{'method':>12} {'compile s':>10} {'ms / iteration':>15} {'ms / run-iteration':>19}  "
        "solver health of the timed runs"
    )
    hp = HParams.from_grid({"lr": [0.1], "sarsa_alpha": [0.5], "beta": [a.beta]})
    keys = seed_keys(a.seeds)
    for method in ORDER:
        trainer = make_train(
            fourrooms("reference"),
            method,
            TrainConfig(num_envs=envs, num_steps=steps, iterations=a.iterations),
        )
        init, run = grid_functions(trainer)
        state = init(keys, hp)
        t0 = time.perf_counter()
        jax.block_until_ready(run(state, hp, a.iterations))
        first = time.perf_counter() - t0
        t0 = time.perf_counter()
        _, metrics = jax.block_until_ready(run(state, hp, a.iterations))
        t = time.perf_counter() - t0
        if method == "hpgd_oracle":
            print("  (oracle: + 10,000 extra steps per iteration)")
        print(
            f"{method:>12} {first - t:10.2f} {1e3 * t / a.iterations:15.3f} "
            f"{1e3 * t / a.iterations / a.seeds:19.3f}  {health_text(solver_health(metrics))}"
        )


if __name__ == "__main__":
    main()
