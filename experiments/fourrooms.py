"""Four-Rooms with BC-HG and the paper's baselines: ``python -m experiments.fourrooms``.

Every (grid point, seed) of a method trains as one vmapped program, in jitted chunks. A run
folder (``<out>/fourrooms/<timestamp>/`` or exactly ``--out`` with ``--exact-out``) holds
``config.json`` and one sub-folder per method with ``config.json``, ``metrics.npz``,
``checkpoint.npz`` (both rewritten atomically after every chunk), ``summary.csv`` and
``curve.png``; with several methods also ``summary.csv`` (best hyperparameters per method) and
``figure.png`` (methods as curves). ``--resume DIR`` continues a stopped run from its last chunk.
"""
from __future__ import annotations

import argparse
import os

import numpy as np

PAPER_LR = (0.5, 0.1, 0.05, 0.01)
PAPER_ALPHA = (0.1, 0.3, 0.5, 0.7, 0.9, 1.0)
SUMMARY_WINDOW = 1000
ALL_METHODS = ("bchg", "hpgd_oracle", "hpgd_mc", "hpgd_sa", "sobirl", "naive")
# arguments that define a run folder's setting: a second invocation may add methods, not change these
SETTING_KEYS = ("seeds", "seed", "beta", "batch", "grid", "iterations", "slip_model", "lr",
                "sarsa_alpha")


def batch_shape(batch: int):
    """Transitions per outer iteration -> (num_envs, num_steps): 100=1x100, 200=1x200, 400=2x200."""
    if batch < 1:
        raise ValueError(f"--batch must be >= 1, got {batch}")
    if batch <= 200:
        return 1, batch
    if batch % 200:
        raise ValueError(f"--batch above 200 must be a multiple of 200 (streams of 200 steps), got {batch}")
    return batch // 200, 200


def parse_args(argv=None):
    p = argparse.ArgumentParser(prog="python -m experiments.fourrooms", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--seeds", type=int, default=10, help="number of seeds (default 10)")
    p.add_argument("--seed", type=int, default=0, help="base seed (default 0)")
    p.add_argument("--beta", type=float, default=1e-3, help="follower entropy coefficient")
    p.add_argument("--batch", type=int, default=100, help="transitions per outer iteration (100/200/400/1000)")
    p.add_argument("--method", default="bchg",
                   help="a method, a comma-separated list, or 'all' (" + ", ".join(ALL_METHODS) + ", exact)")
    p.add_argument("--lr", type=float, nargs="+", default=[0.1], help="leader learning rate(s)")
    p.add_argument("--sarsa-alpha", type=float, nargs="+", default=[0.5], help="SARSA step size(s)")
    p.add_argument("--grid", choices=["none", "paper"], default="none",
                   help="'paper': lr in {0.5,0.1,0.05,0.01} (x alpha in {0.1,...,1.0} for SARSA critics)")
    p.add_argument("--iterations", type=int, default=10_000)
    p.add_argument("--chunk", type=int, default=500, help="iterations per jitted chunk (progress, checkpoints)")
    p.add_argument("--slip-model", choices=["reference", "paper"], default="reference")
    p.add_argument("--out", default="results", help="results root (default ./results)")
    p.add_argument("--exact-out", action="store_true", help="write into --out itself, no subfolder")
    p.add_argument("--resume", metavar="DIR", default=None, help="continue the stopped run in DIR")
    from experiments.common import add_scale_args
    add_scale_args(p)
    p.add_argument("--smoke", action="store_true", help="tiny run: 2 seeds, 20 iterations")
    a = p.parse_args(argv)
    if a.smoke:
        a.seeds, a.iterations, a.chunk = min(a.seeds, 2), min(a.iterations, 20), 10
    return a


def methods_of(spec: str):
    from bchg_jax.train import METHODS
    from experiments.common import parse_methods
    return parse_methods(spec, ALL_METHODS, METHODS)


def validate_args(a):
    methods_of(a.method)
    if a.seeds < 1:
        raise ValueError(f"--seeds must be >= 1, got {a.seeds}")
    if a.iterations < 1 or a.chunk < 1:
        raise ValueError("--iterations and --chunk must be >= 1")
    if a.beta <= 0:
        raise ValueError(f"--beta must be > 0, got {a.beta}")
    batch_shape(a.batch)


def method_grid(method: str, a):
    from bchg_jax.sweep import product_grid
    from bchg_jax.train import SARSA_METHODS
    lrs, alphas = (PAPER_LR, PAPER_ALPHA) if a.grid == "paper" else (a.lr, a.sarsa_alpha)
    if method not in SARSA_METHODS:
        alphas = alphas[:1]  # no SARSA critic: the step size is unused
    return product_grid(lr=lrs, sarsa_alpha=alphas, beta=[a.beta])


def summarize(J: np.ndarray, window: int = SUMMARY_WINDOW):
    """Per seed mean of the last 1000 iterations -> (final [G,N], mean [G], se [G], best)."""
    from experiments.common import summarize as _summarize
    return _summarize(J, window)


def run_method(method: str, a, run_dir: str):
    """Trains (or resumes, or skips if complete) one method's grid; returns its summary dict."""
    from bchg_jax.problems.fourrooms import fourrooms
    from bchg_jax.train import TrainConfig, make_train
    from experiments.common import run_method_folder
    from experiments.plot import YLABEL

    grid = method_grid(method, a)  # validated by main() before any method ran
    envs, steps = batch_shape(a.batch)
    config = TrainConfig(num_envs=envs, num_steps=steps, iterations=a.iterations)
    trainer = make_train(fourrooms(a.slip_model), method, config)
    return run_method_folder(
        os.path.join(run_dir, method), method, trainer, grid, a,
        record={"train_config": vars(config)},
        title=f"Four-Rooms [{a.slip_model}]  beta={a.beta:g}  batch={a.batch}  ({a.seeds} seeds)",
        window=SUMMARY_WINDOW, ylabel=YLABEL,
        describe=f"Four-Rooms [{a.slip_model}] beta={a.beta} batch={a.batch} ({envs}x{steps})")


def validate_all(a):
    """Arguments and every method's grid, checked before anything compiles; -> method names."""
    from bchg_jax.train import validate_hparams
    validate_args(a)
    methods = methods_of(a.method)
    for m in methods:
        validate_hparams(method_grid(m, a))
    return methods


def main(argv=None) -> str:
    from experiments.common import run_experiment
    return run_experiment("fourrooms", argv, parse_args, validate_all, run_method, SETTING_KEYS,
                          SUMMARY_WINDOW)


if __name__ == "__main__":
    main()
