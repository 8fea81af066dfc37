"""Agreement of two Four-Rooms BC-HG runs of the same seeds (e.g. the dense and the sparse solvers).

    python -m benchmarks.fourrooms_solver_agreement RUN_A RUN_B

RUN_A, RUN_B: run folders of ``python -m experiments.fourrooms --method bchg --grid paper
--seeds 10 --solver ...``. Prints, per run, |final J_B - final J_A| (final = mean of the last
1000 iterations) against the seed SE of its grid point in A, and per grid point the z-score of
the difference of the seed means, (mean_B - mean_A) / sqrt(SE_A^2 + SE_B^2).
"""
from __future__ import annotations

import os
import sys

import numpy as np


def seed_se(final):
    """[G] standard error over the seed axis of ``final`` [G, N]."""
    return final.std(1, ddof=1) / np.sqrt(final.shape[1])


def main(argv=None):
    run_a, run_b = (argv if argv is not None else sys.argv[1:])[:2]
    a = np.load(os.path.join(run_a, "bchg", "metrics.npz"))
    b = np.load(os.path.join(run_b, "bchg", "metrics.npz"))
    fa, fb = a["final"], b["final"]
    sa, sb = seed_se(fa), seed_se(fb)
    d = np.abs(fb - fa)
    ma, mb = fa.mean(1), fb.mean(1)
    z = (mb - ma) / np.sqrt(sa ** 2 + sb ** 2 + 1e-24)
    print(f"final J per run: |B - A| max {d.max():.4f}, mean {d.mean():.4f}; seed SE per grid "
          f"point: min {sa.min():.4f}, median {np.median(sa):.4f}")
    print(f"runs within their grid point's seed SE: {(d <= sa[:, None]).sum()} / {d.size}")
    print(f"best grid point: A {ma.argmax()} ({ma.max():.4f} +- {sa[ma.argmax()]:.4f}), "
          f"B {mb.argmax()} ({mb.max():.4f} +- {sb[mb.argmax()]:.4f})")
    print(f"follower sweeps per iteration, mean: A {a['sweeps'].mean():.1f}, "
          f"B {b['sweeps'].mean():.1f}")
    print("| lr | SARSA alpha | A mean +- SE | B mean +- SE | z | runs within SE |")
    print("|---:|---:|---:|---:|---:|---:|")
    for i, (lr, al) in enumerate(zip(a["grid_lr"], a["grid_sarsa_alpha"])):
        print(f"| {lr:g} | {al:g} | {ma[i]:.4f} +- {sa[i]:.4f} | {mb[i]:.4f} +- {sb[i]:.4f} | "
              f"{z[i]:+.2f} | {(d[i] <= sa[i]).sum()}/{fa.shape[1]} |")
    print(f"grid points with |z| <= 2: {(np.abs(z) <= 2).sum()} / {len(z)}; mean z {z.mean():+.2f}")


if __name__ == "__main__":
    main()
