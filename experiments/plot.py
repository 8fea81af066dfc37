"""Plots from saved results: learning curves (mean +- standard error over seeds)."""
from __future__ import annotations

import argparse
import os

import numpy as np


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


def learning_curve_figure(curves: dict, title: str = "", window: int = 100,
                          ylabel: str = "upper-level objective  $V_L(S)$"):
    """``curves``: label -> [seeds, iterations] array. Returns a matplotlib figure."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(5.5, 3.8))
    for label, c in curves.items():
        m, se = mean_se(rolling_mean(np.asarray(c, np.float64), window))
        x = np.arange(1, m.shape[0] + 1)
        ax.plot(x, m, label=label, lw=1.4)
        ax.fill_between(x, m - se, m + se, alpha=0.25)
    ax.set_xlabel("outer iteration")
    ax.set_ylabel(ylabel)
    ax.set_title(title, fontsize=10)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    return fig


def main(argv=None):
    from bchg_jax.io import save_figure

    p = argparse.ArgumentParser(description="Learning curve of the best grid point of a results folder.")
    p.add_argument("results", help="a results folder with metrics.npz")
    p.add_argument("--window", type=int, default=100)
    p.add_argument("--out", default=None, help="PNG path (default: <results>/curve.png)")
    a = p.parse_args(argv)
    data = np.load(os.path.join(a.results, "metrics.npz"))
    J, best = data["J"], int(data["best_index"])
    fig = learning_curve_figure({"best grid point": J[best]}, os.path.basename(a.results), a.window)
    save_figure(a.out or os.path.join(a.results, "curve.png"), fig)


if __name__ == "__main__":
    main()
