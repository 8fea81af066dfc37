"""Thermal-control throughput: compile time and per-outer-iteration time, 1 and 10 vmapped seeds.

``python -m benchmarks.thermal_throughput [--iterations N] [--mlp-iterations M]
[--methods bchg,...] [--seeds 1 10] [--skip-mlp | --only-mlp] [--fail-on-cap]``

Modes: the fast quadratic (LSTD) critic and the paper's faithful MLP critics (64-64, 5000 Adam
steps from the same initial parameters every iteration). Compile time is measured on a first
call of the same jitted chunk and excluded from the per-iteration figures. Each row also gives
the share of run-iterations whose Riccati solve hit its cap and the skipped updates;
``--fail-on-cap`` exits with status 3 after the table if any row has either.
"""

from __future__ import annotations

import argparse
import platform

import jax
import numpy as np

from bchg_jax import lq
from bchg_jax.core.health import solver_health
from bchg_jax.problems.thermal import thermal
from benchmarks._timing import report_unhealthy, time_chunks, unhealthy


def measure(method, config, seeds, iterations):
    """(compile s, s per iteration, solver health) of ``seeds`` vmapped runs."""
    trainer = lq.make_train(thermal(), method, config)
    comp, per, m = time_chunks(
        trainer, {"lr": np.array([0.1])}, seeds, iterations, with_metrics=True
    )
    return comp, per, solver_health(m)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--iterations", type=int, default=50)
    p.add_argument("--mlp-iterations", type=int, default=2)
    p.add_argument("--methods", default="bchg,naive,hpgd_td,hpgd_mc")
    p.add_argument("--seeds", type=int, nargs="+", default=[1, 10])
    p.add_argument("--skip-mlp", action="store_true")
    p.add_argument("--only-mlp", action="store_true", help="only the faithful MLP-critic mode")
    p.add_argument(
        "--fail-on-cap",
        action="store_true",
        help="exit 3 if any Riccati solve hit its cap or an update was skipped",
    )
    a = p.parse_args(argv)
    print(
        f"# {platform.processor() or platform.machine()}, jax {jax.__version__}, "
        f"devices {jax.devices()}"
    )
    print(
        "| method | critic | seeds | compile (s) | s / outer iteration | s / iteration / seed |"
        " capped | skipped |"
    )
    print("|---|---|---|---|---|---|---|---|")
    modes = [] if a.only_mlp else [("quadratic_loo", lq.TrainConfig(), a.iterations)]
    if not a.skip_mlp:
        modes.append(
            (
                "mlp (faithful)",
                lq.TrainConfig(
                    critic="mlp",
                    follower_grad="score",
                    state_baseline=False,
                    control_variates=False,
                ),
                a.mlp_iterations,
            )
        )
    bad = []
    for name, config, its in modes:
        for method in a.methods.split(","):
            for seeds in a.seeds:
                comp, per, h = measure(method, config, seeds, its)
                critic = "none (exact)" if method == "exact" else name
                print(
                    f"| {method} | {critic} | {seeds} | {comp:.1f} | {per:.4f} | "
                    f"{per / seeds:.4f} | {h['capped_share']:.2%} | {h['update_skipped']} |",
                    flush=True,
                )
                if unhealthy(h):
                    bad.append(f"{method} {name} {seeds} seeds")
    report_unhealthy(bad, a.fail_on_cap)


if __name__ == "__main__":
    main()
