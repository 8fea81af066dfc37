"""Figures and tables from saved results: ``python -m experiments.plot RUN_DIR [RUN_DIR ...]``.

A run folder holds one sub-folder per method (``<method>/metrics.npz``); each method is drawn
with its best grid point (best mean over seeds of the last 1000 iterations), mean +- standard
error over seeds of the rolling mean (window 100). Several run folders (e.g. three values of
beta) become the panels of one figure, and a table of final values is printed (markdown).
"""
from __future__ import annotations

import argparse
import json
import os
from typing import Sequence

import numpy as np

from experiments.summary import summarize

METHOD_LABELS = {"bchg": "BC-HG", "hpgd_oracle": "HPGD (oracle)", "hpgd_mc": "HPGD (MC)",
                 "hpgd_sa": "HPGD (SA)", "hpgd_td": "HPGD (TD)", "sobirl": "SoBiRL",
                 "naive": "Naive-PGD", "bchg_off": "BC-HG (off-policy)",
                 "naive_on": "Naive-PGD (on-policy)", "naive_off": "Naive-PGD (off-policy)",
                 "biac_on": "Bi-AC (on-policy)", "biac_off": "Bi-AC (off-policy)",
                 "bchg_det": "BC-HG (deterministic leader)",
                 "naive_det": "Naive-PGD (deterministic leader)",
                 "exact": "exact hypergradient"}
METHOD_ORDER = tuple(METHOD_LABELS)
YLABEL = "upper-level objective  $V_L(S)$"
YLABELS = {"fourrooms": YLABEL, "thermal": "leader objective $J_L$ (exact, 100 steps)",
           "toy_game": "leader return (exact, undiscounted, 150 steps)",
           "lqr_game": "leader return (exact, undiscounted, 100 steps)"}


def _config(run_dir: str) -> dict:
    path = os.path.join(run_dir, "config.json")
    return json.load(open(path)) if os.path.exists(path) else {}


def rolling_mean(x: np.ndarray, window: int) -> np.ndarray:
    """Trailing rolling mean along the last axis (shorter windows at the start)."""
    if window <= 1:
        return x
    c = np.cumsum(x, axis=-1, dtype=np.float64)
    out = np.empty_like(c)
    out[..., :window] = c[..., :window] / np.arange(1, min(window, x.shape[-1]) + 1)
    out[..., window:] = (c[..., window:] - c[..., :-window]) / window
    return out


def mean_se(curves: np.ndarray):
    """Mean and standard error over axis 0 (seeds)."""
    n = curves.shape[0]
    se = curves.std(axis=0, ddof=1) / np.sqrt(n) if n > 1 else np.zeros(curves.shape[1:])
    return curves.mean(axis=0), se


def _plt():
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    return plt


def draw_curves(ax, curves: dict, window: int = 100, colors: dict | None = None):
    for label, c in curves.items():
        m, se = mean_se(rolling_mean(np.asarray(c, np.float64), window))
        x = np.arange(1, m.shape[0] + 1)
        color = None if colors is None else colors.get(label)
        ax.plot(x, m, label=label, lw=1.4, color=color)
        ax.fill_between(x, m - se, m + se, alpha=0.25, color=color)
    ax.set_xlabel("outer iteration")
    ax.grid(alpha=0.3)


def learning_curve_figure(curves: dict, title: str = "", window: int = 100, ylabel: str = YLABEL):
    """``curves``: label -> [seeds, iterations] array. Returns a matplotlib figure."""
    plt = _plt()
    fig, ax = plt.subplots(figsize=(5.5, 3.8))
    draw_curves(ax, curves, window)
    ax.set_ylabel(ylabel)
    ax.set_title(title, fontsize=10)
    ax.legend(fontsize=8)
    fig.tight_layout()
    return fig


def load_run(run_dir: str, metric: str = "J"):
    """{method: (best curves [seeds, iters] of ``metric``, summary dict)} for the method folders in
    run_dir; the best grid point is chosen on J over the run's summary window."""
    out = {}
    for method in METHOD_ORDER:
        path = os.path.join(run_dir, method, "metrics.npz")
        if not os.path.exists(path):
            continue
        d = np.load(path)
        J = d["J"]
        window = int(d["summary_window"]) if "summary_window" in d else 1000
        final, mean, se, best = summarize(J, window)
        hp = {k[5:]: float(d[k][best]) for k in d.files if k.startswith("grid_")}
        out[method] = (d[metric][best], {"mean": float(mean[best]), "se": float(se[best]),
                                         **hp, "iterations": int(J.shape[-1]),
                                         "window": window})
    return out


def _title(run_dir: str) -> str:
    cfg = _config(run_dir)
    args = cfg.get("args", {})
    if cfg.get("experiment") == "thermal":
        return f"thermal: critic={args.get('critic')}, follower grad={args.get('follower_grad')}"
    if cfg.get("experiment") == "toy_game":
        return f"toy game R={args.get('R', 2):g}, {args.get('backup')} backup"
    if "beta" in args:
        return f"beta={args['beta']:g}, batch={args.get('batch')}"
    return os.path.basename(os.path.normpath(run_dir))


def _ylabel(run_dirs) -> str:
    return YLABELS.get(_config(run_dirs[0]).get("experiment", "fourrooms"), YLABEL)


def method_colors() -> dict:
    """A distinct, fixed colour per method label (tab10, then the dark half of tab20b)."""
    plt = _plt()
    cmap10, cmap20 = plt.get_cmap("tab10"), plt.get_cmap("tab20b")
    return {METHOD_LABELS[m]: (cmap10(i) if i < 10 else cmap20(4 * (i - 10) % 20))
            for i, m in enumerate(METHOD_ORDER)}


def panel_figure(run_dirs, window: int = 100):
    """One panel per run folder, methods as curves (the paper's Four-Rooms figure layout)."""
    plt = _plt()
    n = len(run_dirs)
    fig, axes = plt.subplots(1, n, figsize=(5.2 * n, 3.8), squeeze=False)
    colors = method_colors()  # the same colour for a method in every panel
    for ax, run_dir in zip(axes[0], run_dirs):
        runs = load_run(run_dir)
        draw_curves(ax, {METHOD_LABELS[m]: c for m, (c, _) in runs.items()}, window, colors)
        ax.set_title(_title(run_dir), fontsize=10)
        ax.legend(fontsize=7)
    axes[0][0].set_ylabel(_ylabel(run_dirs))
    fig.tight_layout()
    return fig


def components_figure(run_dir: str, metrics: Sequence[str], window: int = 20):
    """One panel per metric (e.g. the objective and its reward components), methods as curves,
    each at its best grid point on J (the paper's thermal-control appendix figure)."""
    plt = _plt()
    fig, axes = plt.subplots(1, len(metrics), figsize=(4.2 * len(metrics), 3.6), squeeze=False)
    colors = method_colors()
    for ax, name in zip(axes[0], metrics):
        runs = load_run(run_dir, name)
        draw_curves(ax, {METHOD_LABELS[m]: c for m, (c, _) in runs.items()}, window, colors)
        ax.set_title(name, fontsize=10)
    axes[0][0].legend(fontsize=7)
    fig.tight_layout()
    return fig


def final_table(run_dirs) -> str:
    """Markdown table: mean +- SE of the last 1000 iterations of each method's best grid point."""
    runs = [load_run(d) for d in run_dirs]
    methods = [m for m in METHOD_ORDER if any(m in r for r in runs)]
    lines = ["| method | " + " | ".join(_title(d) for d in run_dirs) + " |",
             "|---|" + "---|" * len(run_dirs)]
    for m in methods:
        cells = []
        for d, r in zip(run_dirs, runs):
            if m in r:
                s = r[m][1]
                planned = _config(d).get("args", {}).get("iterations", s["iterations"])
                hp = (f"lr {s['lr']:g}" if "lr" in s else
                      f"actor {s.get('actor_steps', 0):g}, critic {s.get('critic_steps', 0):g}")
                cells.append(f"{s['mean']:.3f} +- {s['se']:.3f} ({hp}"
                             + (f", a {s['sarsa_alpha']:g}" if m in ("bchg", "hpgd_sa")
                                and "sarsa_alpha" in s else "")
                             + (f"; {s['iterations']} it" if s["iterations"] < planned else "")
                             + ")")
            else:
                cells.append("-")
        lines.append(f"| {METHOD_LABELS[m]} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def export_best(run_dir: str, dest: str) -> None:
    """Writes a compact copy of a run folder: per method only its best grid point (G = 1).

    The copy is itself a run folder (plots and tables work on it); it is small enough to keep
    in the repository (``benchmarks/results``), unlike full grids.
    """
    import shutil
    from bchg_jax.core.io import save_npz
    os.makedirs(dest, exist_ok=True)
    if os.path.exists(os.path.join(run_dir, "config.json")):
        shutil.copyfile(os.path.join(run_dir, "config.json"), os.path.join(dest, "config.json"))
    for method in METHOD_ORDER:
        src = os.path.join(run_dir, method)
        if not os.path.exists(os.path.join(src, "metrics.npz")):
            continue
        d = dict(np.load(os.path.join(src, "metrics.npz")))
        window = int(d["summary_window"]) if "summary_window" in d else 1000
        best = summarize(d["J"], window)[3]
        keep = {k: v[best:best + 1].astype(np.float32) for k, v in d.items()
                if isinstance(v, np.ndarray) and v.ndim == 3 and k not in ("grad_norm", "sweeps",
                                                                            "riccati_iters", "ok")}
        keep.update({k: v[best:best + 1] for k, v in d.items() if k.startswith("grid_")})
        keep["summary_window"] = np.asarray(window)
        keep["completed"] = np.asarray(d["J"].shape[-1])
        save_npz(os.path.join(dest, method, "metrics.npz"), keep)
        for name in ("summary.csv", "curve.png"):
            if os.path.exists(os.path.join(src, name)):
                shutil.copyfile(os.path.join(src, name), os.path.join(dest, method, name))


def main(argv=None):
    from bchg_jax.core.io import save_figure
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("runs", nargs="+", help="run folders (each with <method>/metrics.npz)")
    p.add_argument("--window", type=int, default=100, help="rolling-mean window (default 100)")
    p.add_argument("--out", default=None, help="figure path (default <first run>/figure.png)")
    p.add_argument("--export", metavar="DEST", default=None,
                   help="with one run folder: write its compact copy (best grid points) to DEST")
    a = p.parse_args(argv)
    if a.export is not None:
        if len(a.runs) != 1:
            raise SystemExit("error: --export takes exactly one run folder")
        export_best(a.runs[0], a.export)
        a.runs = [a.export]
    for d in a.runs:
        if not load_run(d):
            raise SystemExit(f"error: no <method>/metrics.npz under {d}")
    out = a.out or os.path.join(a.runs[0], "figure.png")
    save_figure(out, panel_figure(a.runs, a.window))
    print(final_table(a.runs))
    print(f"\nfigure: {out}")


if __name__ == "__main__":
    main()
