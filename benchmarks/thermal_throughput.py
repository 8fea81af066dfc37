"""Thermal-control throughput: compile time and per-outer-iteration time, 1 and 10 vmapped seeds.

``python -m benchmarks.thermal_throughput [--iterations N] [--mlp-iterations M]``

Modes: the fast quadratic (LSTD) critic and the paper's faithful MLP critics (64-64, 5000 Adam
steps from the same initial parameters every iteration). Compile time is measured on a first
call of the same jitted chunk and excluded from the per-iteration figures.
"""
from __future__ import annotations

import argparse
import platform

import jax
import numpy as np

from benchmarks._timing import time_chunks
from bchg_jax.problems.thermal import thermal
from bchg_jax import lq


def measure(method, config, seeds, iterations):
    trainer = lq.make_train(thermal(), method, config)
    return time_chunks(trainer, {"lr": np.array([0.1])}, seeds, iterations)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--iterations", type=int, default=50)
    p.add_argument("--mlp-iterations", type=int, default=2)
    p.add_argument("--methods", default="bchg,naive,hpgd_td,hpgd_mc")
    p.add_argument("--skip-mlp", action="store_true")
    a = p.parse_args(argv)
    print(f"# {platform.processor() or platform.machine()}, jax {jax.__version__}, "
          f"devices {jax.devices()}")
    print("| method | critic | seeds | compile (s) | s / outer iteration | s / iteration / seed |")
    print("|---|---|---|---|---|---|")
    modes = [("quadratic", lq.TrainConfig(), a.iterations)]
    if not a.skip_mlp:
        modes.append(("mlp (faithful)", lq.TrainConfig(critic="mlp", follower_grad="score",
                                                      state_baseline=False,
                                                      control_variates=False), a.mlp_iterations))
    for name, config, its in modes:
        for method in a.methods.split(","):
            for seeds in (1, 10):
                comp, per = measure(method, config, seeds, its)
                print(f"| {method} | {name} | {seeds} | {comp:.1f} | {per:.4f} | {per / seeds:.4f} |",
                      flush=True)


if __name__ == "__main__":
    main()
