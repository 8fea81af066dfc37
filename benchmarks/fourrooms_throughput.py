"""Four-Rooms BC-HG throughput: ms per outer iteration, compile time reported separately.

    python -m benchmarks.fourrooms_throughput [--iterations 500] [--seeds 10]

Measures (a) one run (jit of the single-run scan, a whole 10,000-iteration run) and (b) the paper's grid, 24 hparam points x
``--seeds`` seeds vmapped (240 runs), both from the initial state; each timed call is preceded
by a compiling call of identical shapes. Semantics match the experiment (beta = 1e-3, batch 100,
soft VI warm-started to tol 1e-6, exact J_L evaluated every iteration).
"""
from __future__ import annotations

import argparse
import datetime
import platform

import jax

from bchg_jax.tabular import HParams, TrainConfig, make_train

from bchg_jax.problems import fourrooms

from bchg_jax import product_grid, seed_keys
from bchg_jax.core.sweep import grid_functions
from benchmarks._timing import time_call
from experiments.fourrooms import PAPER_ALPHA, PAPER_LR


def main(argv=None):
    p = argparse.ArgumentParser()
    p.add_argument("--iterations", type=int, default=500, help="timed iterations of the grid")
    p.add_argument("--single-iterations", type=int, default=10_000,
                   help="timed iterations of the single run (a whole run by default)")
    p.add_argument("--seeds", type=int, default=10)
    p.add_argument("--method", default="bchg")
    a = p.parse_args(argv)
    n = a.iterations
    trainer = make_train(fourrooms("reference"), a.method, TrainConfig(iterations=n))
    print(f"# Four-Rooms {a.method} throughput  {datetime.date.today()}  "
          f"{platform.processor() or platform.machine()}  jax {jax.__version__}  "
          f"devices {jax.devices()}")

    hp1 = HParams(0.1, 0.5, 1e-3)
    n1 = a.single_iterations
    single = jax.jit(make_train(fourrooms("reference"), a.method, TrainConfig(iterations=n1)).train)
    c, t = time_call(single, jax.random.key(0), hp1, repeats=2)
    print(f"one run:   compile {c:6.2f} s   {1e3 * t / n1:8.3f} ms / outer iteration  ({n1} iterations)")

    grid = product_grid(lr=PAPER_LR, sarsa_alpha=PAPER_ALPHA, beta=[1e-3])
    hp = HParams.from_grid(grid)
    init, run = grid_functions(trainer)
    state = init(seed_keys(a.seeds), hp)
    c, t = time_call(run, state, hp, n)
    runs = len(grid["lr"]) * a.seeds
    print(f"grid {runs}: compile {c:6.2f} s   {1e3 * t / n:8.3f} ms / outer iteration  "
          f"({n} iterations, {1e3 * t / n / runs:.3f} ms per run-iteration)")


if __name__ == "__main__":
    main()
