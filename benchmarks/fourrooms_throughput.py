"""Four-Rooms throughput: ms per outer iteration of one run and of the paper's 240-run grid, for
each follower/metric solver side by side (compile time reported separately).

    python -m benchmarks.fourrooms_throughput [--iterations 500] [--single-iterations 10000]
        [--betas 1e-3 (default; the tables: 1e-3 3e-3 5e-3)] [--solvers dense sparse]
        [--seeds 10] [--method bchg] [--steps scan (default) parallel]

For every beta and solver (``TrainConfig.solver``): (a) one run, the jitted single-run scan
over ``--single-iterations`` iterations (a whole 10,000-iteration run by default), and (b) the
paper's grid, 24 (lr, SARSA alpha) points x ``--seeds`` seeds vmapped (240 runs), over
``--iterations`` iterations from the initial state. Each timed call follows a compiling call
of identical shapes. Semantics match the experiment (batch 100, follower solved warm-started
to the soft-sweep tolerance 1e-6, exact J_L evaluated every iteration). The last column is the
ratio of the first row's time to each row's (same process, same machine). ``--steps`` adds
rows of ``TrainConfig.parallel_steps`` (``parallel``: the rollout in log depth, the SARSA pass
one triangular solve) beside the scans (``scan``); the grid's mean final J is printed beside
each row, and a parallel row whose mean J is off the scan row's (same beta and solver) by more
than ``J_SE`` standard errors fails the call (exit status 3). Only the distributions of the two
forms' runs can be compared this way, not the runs: the forms differ by float rounding in the
critic, and within tens to hundreds of iterations a sampled action flips somewhere and a run's
path parts from its twin's (CPU, the 240-run grid: 9 runs had parted after 50 iterations, 60
after 500, when the mean J were -0.42139 and -0.41393, 0.16 standard errors apart). So this
catches a broken form, not a slightly wrong one: the tight check is
``benchmarks.fourrooms_parts --parallel-steps`` (the same batch bit for bit and the same critic
within 1e-5, on the device). The ``capped``
column is the share of run-iterations (one run and grid together) whose follower or metric
solve hit its sweep cap: a speed figure with capped solves is not a valid one, and
``--fail-on-cap`` then exits with status 3 after the table.
"""

from __future__ import annotations

import argparse
import datetime
import platform

import jax
import numpy as np

from bchg_jax import product_grid, seed_keys
from bchg_jax.core.health import solver_health
from bchg_jax.core.host_tests import steps_per_test
from bchg_jax.core.sweep import grid_functions
from bchg_jax.core.unroll import scan_unroll
from bchg_jax.problems import fourrooms
from bchg_jax.tabular import HParams, TrainConfig, make_train
from benchmarks._timing import report_unhealthy, time_call, unhealthy
from experiments.fourrooms import PAPER_ALPHA, PAPER_LR

J_SE = 4.0  # a parallel row's grid mean J against the scan row's, in standard errors


def measure(
    method: str,
    solver: str,
    beta: float,
    single_iterations: int,
    iterations: int,
    seeds: int,
    parallel_steps: bool = False,
):
    """(compile s, ms/it) of one run and of the 240-run grid; the grid's runs count; the solver
    health of both (:func:`~bchg_jax.core.health.solver_health`); the grid's final J per run."""
    problem = fourrooms("reference")
    cfg = dict(solver=solver, parallel_steps=parallel_steps)
    one = make_train(problem, method, TrainConfig(iterations=single_iterations, **cfg))
    c1, t1, (_, m1) = time_call(
        jax.jit(one.train), jax.random.key(0), HParams(0.1, 0.5, beta), repeats=2, with_output=True
    )
    trainer = make_train(problem, method, TrainConfig(iterations=iterations, **cfg))
    hp = HParams.from_grid(product_grid(lr=PAPER_LR, sarsa_alpha=PAPER_ALPHA, beta=[beta]))
    init, run = grid_functions(trainer)
    state = init(seed_keys(seeds), hp)
    c2, t2, (_, m2) = time_call(run, state, hp, iterations, with_output=True)
    flags = {
        k: np.concatenate([np.ravel(m1[k]), np.ravel(m2[k])])
        for k in ("solve_capped", "update_skipped")
    }
    return (
        c1,
        1e3 * t1 / single_iterations,
        c2,
        1e3 * t2 / iterations,
        len(PAPER_LR) * len(PAPER_ALPHA) * seeds,
        solver_health(flags),
        np.asarray(m2["J"], np.float64)[..., -1].ravel(),
    )


def main(argv=None):
    p = argparse.ArgumentParser(
        prog="python -m benchmarks.fourrooms_throughput",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument(
        "--iterations", type=int, default=500, help="timed iterations of the grid (default: 500)"
    )
    p.add_argument(
        "--single-iterations",
        type=int,
        default=10_000,
        help="timed iterations of the single run (default: 10000, a whole run)",
    )
    p.add_argument("--seeds", type=int, default=10, help="seeds per grid point (default: 10)")
    p.add_argument(
        "--betas",
        type=float,
        nargs="+",
        default=[1e-3],
        help="follower entropy weights (default: 1e-3)",
    )
    p.add_argument(
        "--solvers",
        nargs="+",
        default=["dense", "sparse"],
        help="TrainConfig.solver values, the first is the ratio's base (default: dense sparse)",
    )
    p.add_argument(
        "--steps",
        nargs="+",
        default=["scan"],
        choices=["scan", "parallel"],
        help="the rollout's and SARSA pass's forms, rows for each solver: 'scan' one step after "
        "the other, 'parallel' TrainConfig.parallel_steps (default: scan)",
    )
    p.add_argument("--method", default="bchg", help="tabular method (default: bchg)")
    p.add_argument(
        "--fail-on-cap",
        action="store_true",
        help="exit 3 if any solve hit its sweep cap or an update was skipped",
    )
    a = p.parse_args(argv)
    print(
        f"# Four-Rooms {a.method} throughput  {datetime.date.today()}  "
        f"{platform.processor() or platform.machine()}  jax {jax.__version__}  "
        f"devices {jax.devices()}  a solver loop test every {steps_per_test()} steps  "
        f"{scan_unroll()} steps per trip of the rollout and SARSA scans"
    )
    print(
        "| beta | solver | steps | 1 run: compile s | 1 run: ms/it | grid: runs | "
        "grid: compile s | grid: ms/it | speed-up 1 run | speed-up grid | grid: mean J | "
        "capped | skipped |"
    )
    print("|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    bad, off = [], []
    for beta in a.betas:
        base = None
        for solver in a.solvers:
            J_scan = None
            for steps in a.steps:
                c1, t1, c2, t2, runs, health, J = measure(
                    a.method,
                    solver,
                    beta,
                    a.single_iterations,
                    a.iterations,
                    a.seeds,
                    steps == "parallel",
                )
                base = base or (t1, t2)
                J_mean = float(np.mean(J))
                print(
                    f"| {beta:g} | {solver} | {steps} | {c1:.1f} | {t1:.3f} | {runs} | {c2:.1f} | "
                    f"{t2:.1f} | {base[0] / t1:.2f}x | {base[1] / t2:.2f}x | {J_mean:.5f} | "
                    f"{health['capped_share']:.2%} | {health['update_skipped']} |",
                    flush=True,
                )
                if unhealthy(health):
                    bad.append(f"beta {beta:g} {solver} {steps}")
                if steps == "scan":
                    J_scan = J
                elif J_scan is not None:
                    se = np.sqrt(np.var(J, ddof=1) / J.size + np.var(J_scan, ddof=1) / J_scan.size)
                    gap = abs(J_mean - float(np.mean(J_scan)))
                    if not gap <= J_SE * se:
                        off.append(f"beta {beta:g} {solver}: mean J off by {gap:.2g} (SE {se:.2g})")
    report_unhealthy(bad, a.fail_on_cap)
    if off:
        print(
            f"FAILED: parallel steps trained another leader than the scans (mean J off by more "
            f"than {J_SE:g} standard errors) in: " + "; ".join(off),
            flush=True,
        )
        raise SystemExit(3)


if __name__ == "__main__":
    main()
