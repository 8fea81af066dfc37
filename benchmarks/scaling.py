"""Scaling with the number of vmapped runs, for every experiment's trainer.

``python -m benchmarks.scaling [--experiments fourrooms,thermal,toy_game,lqr_game]
[--runs 1 10 100 1000] [--iterations K] [--fail-on-cap] [--profile-runs 1 1000]``

For each experiment one method's trainer (the paper's main setting, BC-HG) is run for R vmapped
seeds (one grid point): the first call of the jitted chunk (compile + K iterations) and a second
call (K iterations, timed) give the compile time and the time per outer iteration; the table
also gives run-iterations per second (R / time per iteration), i.e. how far vmapping amortises.
The LQR game uses Naive-PGD above 100 runs (BC-HG's 256-sample Benefit per minibatch element
needs ~4 GB of activations at 1000 runs).

A speed figure counts only with its correctness beside it: each row also gives the share of
run-iterations whose follower (or metric) solve hit its cap, the skipped updates and the mean
final J over the runs; ``--fail-on-cap`` exits with status 3 once the table is printed if any
lane of any row hit its cap, skipped an update or ended with a non-finite J (what
``benchmarks/device_check.sh`` relies on).
"""

from __future__ import annotations

import argparse
import datetime
import platform

import jax
import numpy as np

from bchg_jax.core.health import health_text, solver_health
from benchmarks._timing import report_unhealthy, time_chunks, unhealthy
from benchmarks.profile_trace import HEADER, summary_row


def trainer_for(name: str, runs: int):
    """(method, trainer, one-point grid) of an experiment's row at ``runs`` vmapped runs."""
    if name == "fourrooms":
        from bchg_jax.problems.fourrooms import fourrooms
        from bchg_jax.tabular.train import TrainConfig, make_train

        return (
            "bchg",
            make_train(fourrooms(), "bchg", TrainConfig(num_steps=100)),
            {"lr": np.array([0.1]), "sarsa_alpha": np.array([0.5]), "beta": np.array([1e-3])},
        )
    if name == "thermal":
        from bchg_jax import lq
        from bchg_jax.problems.thermal import thermal

        return "bchg", lq.make_train(thermal(), "bchg", lq.TrainConfig()), {"lr": np.array([0.1])}
    if name == "toy_game":
        from bchg_jax.games import tabular as games
        from bchg_jax.problems.toy_game import toy_game

        return (
            "bchg",
            games.make_train(toy_game(), "bchg", games.TrainConfig()),
            {"actor_steps": np.array([1]), "critic_steps": np.array([10])},
        )
    if name == "lqr_game":
        from bchg_jax.games import lqr
        from bchg_jax.problems.lqr_game import lqr_game

        method = "bchg" if runs <= 100 else "naive"
        return (
            method,
            lqr.make_train(
                lqr_game(),
                method,
                lqr.TrainConfig(exploration=lqr.ExplorationConfig(warmup_steps=0)),
            ),
            {"actor_steps": np.array([10])},
        )
    raise ValueError(f"unknown experiment {name!r}")


def measure(name: str, runs: int, iterations: int, profile: bool = False):
    """(method, compile s, s per iteration, health dict, mean final J, profile summary or None)
    of one row."""
    method, trainer, grid = trainer_for(name, runs)
    comp, per, m, *prof = time_chunks(
        trainer, grid, runs, iterations, with_metrics=True, profile=profile
    )
    J = float(np.mean(m["J"][..., -1]))
    return method, comp, per, solver_health(m), J, (prof[0] if prof else None)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--experiments", default="fourrooms,thermal,toy_game,lqr_game")
    p.add_argument("--runs", type=int, nargs="+", default=[1, 10, 100, 1000])
    p.add_argument("--iterations", type=int, default=3)
    p.add_argument(
        "--fail-on-cap",
        action="store_true",
        help="exit 3 if any run's solve hit its cap, an update was skipped or J is not finite",
    )
    p.add_argument(
        "--profile-runs",
        type=int,
        nargs="*",
        default=[],
        help="rows (numbers of runs) whose chunk is called once more under the profiler; a "
        "second table gives their kernels, device busy time and costliest kernels per "
        "iteration (benchmarks.profile_trace)",
    )
    a = p.parse_args(argv)
    print(
        f"# {platform.processor() or platform.machine()}, jax {jax.__version__}, devices "
        f"{jax.devices()}, {datetime.date.today()}, {a.iterations} timed iterations"
    )
    print(
        "| experiment | method | vmapped runs | compile (s) | s / outer iteration | "
        "run-iterations / s | capped | skipped | mean J |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    bad, profiles, lines_read = [], [], set()
    for name in a.experiments.split(","):
        for runs in a.runs:
            method, comp, per, health, J, prof = measure(
                name, runs, a.iterations, profile=runs in a.profile_runs
            )
            if isinstance(prof, str):
                profiles.append(f"| {name} {method} x{runs} | no profile: {prof} |")
            elif prof is not None:
                profiles.append(summary_row(f"{name} {method} x{runs}", prof))
                lines_read.update(prof["where"])
            print(
                f"| {name} | {method} | {runs} | {comp:.1f} | {per:.4f} | {runs / per:.0f} | "
                f"{health.get('capped_share', 0.0):.2%} | {health.get('update_skipped', 0)} | "
                f"{J:.4g} |",
                flush=True,
            )
            if unhealthy(health) or not np.isfinite(J):
                bad.append(f"{name} at {runs} runs ({health_text(health)}, J {J:.4g})")
    if profiles:
        print("\nProfiled (one more call of the same chunk under jax.profiler):\n" + HEADER)
        print("\n".join(profiles))
        print("trace lines read: " + ", ".join(sorted(lines_read)), flush=True)
    report_unhealthy(bad, a.fail_on_cap)


if __name__ == "__main__":
    main()
