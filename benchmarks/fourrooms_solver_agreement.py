"""Agreement of two Four-Rooms BC-HG runs of the same seeds (e.g. the dense and the sparse solvers).

    python -m benchmarks.fourrooms_solver_agreement RUN_A RUN_B

RUN_A, RUN_B: run folders of ``python -m experiments.fourrooms --method bchg --grid paper
--seeds 10 --solver ...``, or a kept ``summary.csv`` of one (then only the grid points are
compared). Prints, per run, |final J_B - final J_A| (final = mean of the last
1000 iterations) against the seed SE of its grid point in A, and per grid point the z-score of
the difference of the seed means, (mean_B - mean_A) / sqrt(SE_A^2 + SE_B^2).
"""

from __future__ import annotations

import argparse
import os

import numpy as np


def seed_se(final):
    """[G] standard error over the seed axis of ``final`` [G, N]."""
    return final.std(1, ddof=1) / np.sqrt(final.shape[1])


def load(path: str) -> dict:
    """A run folder (its ``bchg/metrics.npz``: per-run finals) or a ``summary.csv`` (grid-point
    means and SEs only, as kept in ``benchmarks/results``)."""
    if path.endswith(".csv"):
        rows = np.genfromtxt(path, delimiter=",", names=True)
        return {
            "lr": rows["lr"],
            "alpha": rows["sarsa_alpha"],
            "mean": rows["mean_last1000"],
            "se": rows["se"],
            "final": None,
            "sweeps": None,
        }
    d = np.load(os.path.join(path, "bchg", "metrics.npz"))
    return {
        "lr": d["grid_lr"],
        "alpha": d["grid_sarsa_alpha"],
        "mean": d["final"].mean(1),
        "se": seed_se(d["final"]),
        "final": d["final"],
        "sweeps": d["sweeps"].mean(),
    }


def main(argv=None):
    p = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("run_a", help="run folder (or kept summary.csv) A")
    p.add_argument("run_b", help="run folder (or kept summary.csv) B, compared against A")
    args = p.parse_args(argv)
    run_a, run_b = args.run_a, args.run_b
    a, b = load(run_a), load(run_b)
    if not (np.allclose(a["lr"], b["lr"]) and np.allclose(a["alpha"], b["alpha"])):
        raise SystemExit("error: the two runs have different grids")
    ma, mb, sa, sb = a["mean"], b["mean"], a["se"], b["se"]
    z = (mb - ma) / np.sqrt(sa**2 + sb**2 + 1e-24)
    per_run = a["final"] is not None and b["final"] is not None
    if per_run:
        d = np.abs(b["final"] - a["final"])
        print(
            f"final J per run: |B - A| max {d.max():.4f}, mean {d.mean():.4f}; seed SE per "
            f"grid point: min {sa.min():.4f}, median {np.median(sa):.4f}"
        )
        print(f"runs within their grid point's seed SE: {(d <= sa[:, None]).sum()} / {d.size}")
    print(
        f"best grid point: A {ma.argmax()} ({ma.max():.4f} +- {sa[ma.argmax()]:.4f}), "
        f"B {mb.argmax()} ({mb.max():.4f} +- {sb[mb.argmax()]:.4f})"
    )
    if a["sweeps"] is not None and b["sweeps"] is not None:
        print(f"follower sweeps per iteration, mean: A {a['sweeps']:.1f}, B {b['sweeps']:.1f}")
    print(
        "| lr | SARSA alpha | A mean +- SE | B mean +- SE | z |"
        + (" runs within SE |" if per_run else "")
    )
    print("|---:|---:|---:|---:|---:|" + ("---:|" if per_run else ""))
    for i, (lr, al) in enumerate(zip(a["lr"], a["alpha"], strict=False)):
        print(
            f"| {lr:g} | {al:g} | {ma[i]:.4f} +- {sa[i]:.4f} | {mb[i]:.4f} +- {sb[i]:.4f} | "
            f"{z[i]:+.2f} |" + (f" {(d[i] <= sa[i]).sum()}/{d.shape[1]} |" if per_run else "")
        )
    print(f"grid points with |z| <= 2: {(np.abs(z) <= 2).sum()} / {len(z)}; mean z {z.mean():+.2f}")


if __name__ == "__main__":
    main()
