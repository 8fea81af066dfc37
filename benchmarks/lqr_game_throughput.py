"""Bi-level LQR game throughput: compile time and per-outer-iteration time, 1 and 20 vmapped seeds.

``python -m benchmarks.lqr_game_throughput [--iterations N] [--methods bchg,naive,...]``

One outer iteration = 4 episodes x 100 steps, 5 critic steps and ``--actor-steps`` actor steps
(default 10, the largest of the paper's grid; BC-HG's Benefit uses 256 follower samples and the
direct baseline 32 leader samples per minibatch element). The first call of the jitted chunk
(compile + run) is measured separately and the compile time excluded from the per-iteration
figures. The warm-up is set to 0 so that every timed iteration takes its actor steps.
"""
from __future__ import annotations

import argparse
import platform

import jax
import numpy as np

from benchmarks._timing import time_chunks
from bchg_jax.problems.lqr_game import lqr_game
from bchg_jax.games import lqr


def measure(method, seeds, iterations, actor_steps):
    trainer = lqr.make_train(lqr_game(), method, lqr.TrainConfig(warmup_steps=0))
    return time_chunks(trainer, {"actor_steps": np.array([actor_steps])}, seeds, iterations)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--iterations", type=int, default=50)
    p.add_argument("--actor-steps", type=int, default=10)
    p.add_argument("--methods", default="bchg,naive,bchg_det,exact")
    p.add_argument("--seeds", type=int, nargs="+", default=[1, 20])
    a = p.parse_args(argv)
    print(f"# {platform.processor() or platform.machine()}, jax {jax.__version__}, "
          f"devices {jax.devices()}, actor steps {a.actor_steps}")
    print("| method | seeds | compile (s) | s / outer iteration | s / iteration / seed |")
    print("|---|---|---|---|---|")
    for method in a.methods.split(","):
        for seeds in a.seeds:
            comp, per = measure(method, seeds, a.iterations, a.actor_steps)
            print(f"| {method} | {seeds} | {comp:.1f} | {per:.4f} | {per / seeds:.4f} |",
                  flush=True)


if __name__ == "__main__":
    main()
