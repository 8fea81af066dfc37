"""Four-Rooms with BC-HG (and the other tabular methods): ``python -m experiments.fourrooms``.

Trains every (grid point, seed) as one vmapped program, prints progress per chunk, and writes
``config.json``, ``metrics.npz``, ``summary.csv`` and ``curve.png`` to
``<out>/fourrooms/<timestamp>/`` (or exactly ``--out`` with ``--exact-out``).
"""
from __future__ import annotations

import argparse
import datetime
import os
import sys
import time

import numpy as np

PAPER_LR = (0.5, 0.1, 0.05, 0.01)
PAPER_ALPHA = (0.1, 0.3, 0.5, 0.7, 0.9, 1.0)
SUMMARY_WINDOW = 1000


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
    p.add_argument("--method", default="bchg", help="bchg | naive | exact")
    p.add_argument("--lr", type=float, nargs="+", default=[0.1], help="leader learning rate(s)")
    p.add_argument("--sarsa-alpha", type=float, nargs="+", default=[0.5], help="SARSA step size(s)")
    p.add_argument("--grid", choices=["none", "paper"], default="none",
                   help="'paper': lr in {0.5,0.1,0.05,0.01} x alpha in {0.1,...,1.0}")
    p.add_argument("--iterations", type=int, default=10_000)
    p.add_argument("--chunk", type=int, default=500, help="iterations per jitted chunk (progress)")
    p.add_argument("--slip-model", choices=["reference", "paper"], default="reference")
    p.add_argument("--out", default="results", help="results root (default ./results)")
    p.add_argument("--exact-out", action="store_true", help="write into --out itself, no subfolder")
    p.add_argument("--smoke", action="store_true", help="tiny run: 2 seeds, 20 iterations")
    a = p.parse_args(argv)
    if a.smoke:
        a.seeds, a.iterations, a.chunk = min(a.seeds, 2), min(a.iterations, 20), 10
    return a


def validate_args(a):
    from bchg_jax.train import METHODS
    if a.method not in METHODS:
        raise ValueError(f"--method must be one of {METHODS}, got {a.method!r}")
    if a.seeds < 1:
        raise ValueError(f"--seeds must be >= 1, got {a.seeds}")
    if a.iterations < 1 or a.chunk < 1:
        raise ValueError("--iterations and --chunk must be >= 1")
    if a.beta <= 0:
        raise ValueError(f"--beta must be > 0, got {a.beta}")
    batch_shape(a.batch)


def main(argv=None) -> str:
    a = parse_args(argv)
    try:
        validate_args(a)
    except ValueError as err:
        print(f"error: {err}", file=sys.stderr)
        raise SystemExit(2)
    from bchg_jax.io import save_csv, save_figure, save_json, save_npz
    from bchg_jax.problems.fourrooms import fourrooms
    from bchg_jax.sweep import product_grid, run_grid
    from bchg_jax.train import TrainConfig, make_train, validate_hparams
    from experiments.plot import learning_curve_figure

    lrs, alphas = (PAPER_LR, PAPER_ALPHA) if a.grid == "paper" else (a.lr, a.sarsa_alpha)
    if a.method in ("naive", "exact") and a.grid == "paper":
        # exact has no critic; naive's critic only enters through grad log p / grad rho_0 terms,
        # which vanish in Four-Rooms: the SARSA step size does not change the result
        alphas = alphas[:1]
    grid = product_grid(lr=lrs, sarsa_alpha=alphas, beta=[a.beta])
    try:
        validate_hparams(grid)
    except ValueError as err:
        print(f"error: {err}", file=sys.stderr)
        raise SystemExit(2)
    envs, steps = batch_shape(a.batch)
    config = TrainConfig(num_envs=envs, num_steps=steps, iterations=a.iterations)
    trainer = make_train(fourrooms(a.slip_model), a.method, config)

    stamp = datetime.datetime.now().strftime("%Y%m%d-%H%M%S")
    out = a.out if a.exact_out else os.path.join(a.out, "fourrooms", f"{stamp}-{a.method}")
    G = len(grid["lr"])
    save_json(os.path.join(out, "config.json"), {
        "experiment": "fourrooms", "args": vars(a), "train_config": vars(config),
        "grid": {k: v.tolist() for k, v in grid.items()}, "num_grid_points": G,
        "command": "python -m experiments.fourrooms " + " ".join(argv if argv is not None else sys.argv[1:])})
    print(f"Four-Rooms [{a.slip_model}] method={a.method} beta={a.beta} batch={a.batch} "
          f"({envs}x{steps}) grid points={G} seeds={a.seeds} iterations={a.iterations} -> {out}")

    t0 = time.perf_counter()
    _, metrics = run_grid(trainer, grid, a.seeds, a.iterations, a.chunk, a.seed)
    wall = time.perf_counter() - t0

    J = metrics["J"]                                     # [G, N, T]
    final = J[..., -min(SUMMARY_WINDOW, J.shape[-1]):].mean(-1)   # [G, N]
    mean = final.mean(-1)
    se = final.std(-1, ddof=1) / np.sqrt(a.seeds) if a.seeds > 1 else np.zeros(G)
    best = int(np.argmax(mean))
    save_npz(os.path.join(out, "metrics.npz"), {**metrics, **{f"grid_{k}": v for k, v in grid.items()},
                                                "final": final, "best_index": np.asarray(best)})
    rows = [(grid["lr"][g], grid["sarsa_alpha"][g], a.beta, f"{mean[g]:.4f}", f"{se[g]:.4f}",
             int(g == best)) for g in range(G)]
    save_csv(os.path.join(out, "summary.csv"),
             ["lr", "sarsa_alpha", "beta", "mean_last1000", "se", "best"], rows)
    fig = learning_curve_figure(
        {f"{a.method} lr={grid['lr'][best]:g} alpha={grid['sarsa_alpha'][best]:g}": J[best]},
        f"Four-Rooms [{a.slip_model}]  beta={a.beta:g}  batch={a.batch}  ({a.seeds} seeds)")
    save_figure(os.path.join(out, "curve.png"), fig)

    print(f"\n{'lr':>6} {'alpha':>6}  mean(last {SUMMARY_WINDOW})      se")
    for g in np.argsort(-mean):
        mark = "  <- best" if g == best else ""
        print(f"{grid['lr'][g]:6g} {grid['sarsa_alpha'][g]:6g}  {mean[g]:+.4f}  {se[g]:.4f}{mark}")
    print(f"\nwall time {wall:.1f}s; results in {out}")
    return out


if __name__ == "__main__":
    main()
