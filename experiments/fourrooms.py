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
import datetime
import json
import os
import sys
import time

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
    p.add_argument("--shard", action="store_true", help="split the runs over all JAX devices")
    p.add_argument("--smoke", action="store_true", help="tiny run: 2 seeds, 20 iterations")
    a = p.parse_args(argv)
    if a.smoke:
        a.seeds, a.iterations, a.chunk = min(a.seeds, 2), min(a.iterations, 20), 10
    return a


def methods_of(spec: str):
    from bchg_jax.train import METHODS
    names = list(ALL_METHODS) if spec == "all" else [m.strip() for m in spec.split(",") if m.strip()]
    bad = [m for m in names if m not in METHODS]
    if bad or not names:
        raise ValueError(f"--method must be 'all' or names from {METHODS}, got {spec!r}")
    return names


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


def summarize(J: np.ndarray):
    """Per seed mean of the last 1000 iterations -> (final [G,N], mean [G], se [G], best)."""
    final = J[..., -min(SUMMARY_WINDOW, J.shape[-1]):].mean(-1)
    n = final.shape[1]
    se = final.std(-1, ddof=1) / np.sqrt(n) if n > 1 else np.zeros(final.shape[0])
    mean = final.mean(-1)
    return final, mean, se, int(np.argmax(mean))


def run_method(method: str, a, run_dir: str):
    """Trains (or resumes, or skips if complete) one method's grid; returns its summary dict."""
    from bchg_jax.io import load_state, save_json, save_npz, save_state
    from bchg_jax.problems.fourrooms import fourrooms
    from bchg_jax.sweep import grid_functions, run_grid, seed_keys
    from bchg_jax.train import TrainConfig, make_hparams, make_train

    out = os.path.join(run_dir, method)
    grid = method_grid(method, a)  # validated by main() before any method ran
    envs, steps = batch_shape(a.batch)
    config = TrainConfig(num_envs=envs, num_steps=steps, iterations=a.iterations)
    trainer = make_train(fourrooms(a.slip_model), method, config)
    metrics_path, ckpt_path = os.path.join(out, "metrics.npz"), os.path.join(out, "checkpoint.npz")
    G = len(grid["lr"])

    state, start, metrics = None, 0, None
    if os.path.exists(metrics_path):
        data = dict(np.load(metrics_path))
        if data["J"].shape[-1] >= a.iterations:
            print(f"[{method}] complete in {out}; skipped")
            return _finish(method, grid, data, a, out, write=False)
        if os.path.exists(ckpt_path):
            init, _ = grid_functions(trainer)
            hp = make_hparams(grid["lr"], grid["sarsa_alpha"], grid["beta"])
            like = init(seed_keys(a.seeds, a.seed), hp)
            state = load_state(ckpt_path, like)
            start = int(np.asarray(state.step).reshape(-1)[0])
            metrics = {k: data[k][..., :start] for k in ("J", "grad_norm", "sweeps")}
            print(f"[{method}] resuming at iteration {start}")
    if state is None:
        save_json(os.path.join(out, "config.json"), {
            "method": method, "args": vars(a), "train_config": vars(config),
            "grid": {k: v.tolist() for k, v in grid.items()}, "num_grid_points": G})
    print(f"[{method}] Four-Rooms [{a.slip_model}] beta={a.beta} batch={a.batch} ({envs}x{steps}) "
          f"grid points={G} seeds={a.seeds} iterations={a.iterations} -> {out}", flush=True)

    def on_chunk(st, m, done):  # metrics first: a checkpoint never runs ahead of the metrics
        save_npz(metrics_path, {**m, **{f"grid_{k}": v for k, v in grid.items()},
                                "completed": np.asarray(done)})
        if done < a.iterations:
            save_state(ckpt_path, st)

    t0 = time.perf_counter()
    _, metrics = run_grid(trainer, grid, a.seeds, a.iterations, a.chunk, a.seed, state=state,
                          start=start, metrics=metrics, on_chunk=on_chunk, shard=a.shard)
    wall = time.perf_counter() - t0
    if os.path.exists(ckpt_path):
        os.remove(ckpt_path)
    data = {**metrics, **{f"grid_{k}": v for k, v in grid.items()}}
    summary = _finish(method, grid, data, a, out, write=True)
    summary["wall_s"] = wall
    print(f"[{method}] wall time {wall:.1f}s")
    return summary


def _finish(method, grid, data, a, out, write):
    from bchg_jax.io import save_csv, save_figure, save_npz
    from experiments.plot import learning_curve_figure
    J = data["J"]
    final, mean, se, best = summarize(J)
    if write:
        save_npz(os.path.join(out, "metrics.npz"), {**data, "final": final,
                                                    "best_index": np.asarray(best),
                                                    "completed": np.asarray(J.shape[-1])})
        rows = [(grid["lr"][g], grid["sarsa_alpha"][g], a.beta, f"{mean[g]:.4f}", f"{se[g]:.4f}",
                 int(g == best)) for g in range(len(mean))]
        save_csv(os.path.join(out, "summary.csv"),
                 ["lr", "sarsa_alpha", "beta", "mean_last1000", "se", "best"], rows)
        label = f"{method} lr={grid['lr'][best]:g}" + (
            f" alpha={grid['sarsa_alpha'][best]:g}" if len(set(grid["sarsa_alpha"])) > 1 else "")
        save_figure(os.path.join(out, "curve.png"), learning_curve_figure(
            {label: J[best]}, f"Four-Rooms [{a.slip_model}]  beta={a.beta:g}  batch={a.batch}  "
                              f"({a.seeds} seeds)"))
        print(f"\n{'lr':>6} {'alpha':>6}  mean(last {SUMMARY_WINDOW})      se")
        for g in np.argsort(-mean):
            mark = "  <- best" if g == best else ""
            print(f"{grid['lr'][g]:6g} {grid['sarsa_alpha'][g]:6g}  {mean[g]:+.4f}  {se[g]:.4f}{mark}")
    return {"method": method, "lr": float(grid["lr"][best]),
            "sarsa_alpha": float(grid["sarsa_alpha"][best]), "mean": float(mean[best]),
            "se": float(se[best])}


def main(argv=None) -> str:
    a = parse_args(argv)
    if a.resume is not None:
        cfg_path = os.path.join(a.resume, "config.json")
        if not os.path.exists(cfg_path):
            print(f"error: --resume {a.resume}: no config.json there", file=sys.stderr)
            raise SystemExit(2)
        saved = json.load(open(cfg_path))["args"]
        resume, shard = a.resume, a.shard
        a = argparse.Namespace(**{**vars(a), **saved})
        a.resume, a.shard, a.out, a.exact_out = resume, shard, resume, True
    from bchg_jax.train import validate_hparams
    try:
        validate_args(a)
        methods = methods_of(a.method)
        for m in methods:  # every method's grid is checked before anything compiles
            validate_hparams(method_grid(m, a))
    except ValueError as err:
        print(f"error: {err}", file=sys.stderr)
        raise SystemExit(2)
    from bchg_jax.io import save_csv, save_figure, save_json
    from experiments.plot import panel_figure

    stamp = datetime.datetime.now().strftime("%Y%m%d-%H%M%S")
    run_dir = a.out if a.exact_out else os.path.join(a.out, "fourrooms", stamp)
    cfg_path = os.path.join(run_dir, "config.json")
    if a.resume is None:
        command = "python -m experiments.fourrooms " + " ".join(argv if argv is not None else sys.argv[1:])
        all_methods = methods
        if os.path.exists(cfg_path):  # adding methods to an existing run folder
            old = json.load(open(cfg_path))
            diff = [k for k in SETTING_KEYS if old["args"].get(k) != vars(a).get(k)]
            if diff:
                print(f"error: {run_dir} holds a run with other settings ({', '.join(diff)}); "
                      "use another --out", file=sys.stderr)
                raise SystemExit(2)
            all_methods = old["methods"] + [m for m in methods if m not in old["methods"]]
        save_json(cfg_path, {"experiment": "fourrooms", "methods": all_methods,
                             "args": {**vars(a), "method": ",".join(all_methods)},
                             "command": command})
    summaries = [run_method(m, a, run_dir) for m in methods]
    if len(methods) > 1:
        save_csv(os.path.join(run_dir, "summary.csv"), ["method", "lr", "sarsa_alpha", "mean_last1000", "se"],
                 [(s["method"], s["lr"], s["sarsa_alpha"], f"{s['mean']:.4f}", f"{s['se']:.4f}")
                  for s in summaries])
        save_figure(os.path.join(run_dir, "figure.png"), panel_figure([run_dir]))
    print(f"\n{'method':>12} {'lr':>6} {'alpha':>6}  mean(last {SUMMARY_WINDOW})      se")
    for s in summaries:
        print(f"{s['method']:>12} {s['lr']:6g} {s['sarsa_alpha']:6g}  {s['mean']:+.4f}  {s['se']:.4f}")
    print(f"\nresults in {run_dir}")
    return run_dir


if __name__ == "__main__":
    main()
