"""Thermal-control throughput: compile time and per-outer-iteration time, 1 and 10 vmapped seeds.

``python -m benchmarks.thermal_throughput [--iterations N] [--mlp-iterations M]
[--methods bchg,...] [--seeds 1 10] [--skip-mlp | --only-mlp] [--mlp-kernel xla fused]
[--mlp-steps S] [--fail-on-cap] [--profile]``

Modes: the fast quadratic (LSTD) critic and the paper's faithful MLP critics (64-64, 5000 Adam
steps from the same initial parameters every iteration), fitted by XLA's program or by the
fused Pallas kernels (``--mlp-kernel``, one row each: ``lq.TrainConfig.mlp_kernel``; the fused
form is for a CUDA GPU and runs in Pallas' interpreter elsewhere; ``--mlp-steps`` fewer Adam
steps, for trying the plumbing on a CPU, the row then named by them). Compile time is measured on
a first call of the same jitted chunk and excluded from the per-iteration figures. Each row also
gives the share of run-iterations whose Riccati solve hit its cap and the skipped updates;
``--fail-on-cap`` exits with status 3 after the table if any row has either. ``--profile`` calls
each row's chunk once more under the profiler and prints what bounds it (kernels and copies per
iteration, the device's busy share, the costliest kernels: :mod:`benchmarks.profile_trace`).
"""

from __future__ import annotations

import argparse
import platform

import jax
import numpy as np

from bchg_jax import lq
from bchg_jax.core.health import solver_health
from bchg_jax.core.host_tests import steps_per_test
from bchg_jax.problems.thermal import thermal
from benchmarks._timing import report_unhealthy, time_chunks, unhealthy
from benchmarks.profile_trace import HEADER, profile_row


def measure(method, config, seeds, iterations, profile=False):
    """(compile s, s per iteration, solver health, profile summary, its failure text or None)
    of ``seeds`` vmapped runs."""
    trainer = lq.make_train(thermal(), method, config)
    comp, per, m, *prof = time_chunks(
        trainer, {"lr": np.array([0.1])}, seeds, iterations, with_metrics=True, profile=profile
    )
    return comp, per, solver_health(m), (prof[0] if prof else None)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--iterations", type=int, default=50)
    p.add_argument("--mlp-iterations", type=int, default=2)
    p.add_argument("--methods", default="bchg,naive,hpgd_td,hpgd_mc")
    p.add_argument("--seeds", type=int, nargs="+", default=[1, 10])
    p.add_argument("--skip-mlp", action="store_true")
    p.add_argument("--only-mlp", action="store_true", help="only the faithful MLP-critic mode")
    p.add_argument(
        "--mlp-kernel",
        nargs="+",
        choices=("xla", "fused"),
        default=["xla"],
        help="the MLP critic's fit, a row each (lq.TrainConfig.mlp_kernel; default xla)",
    )
    p.add_argument(
        "--mlp-steps",
        type=int,
        default=lq.TrainConfig().mlp_steps,
        help="Adam steps per MLP critic fit (the paper's by default; fewer only to try the "
        "script on a CPU: the row is then not the faithful run's time)",
    )
    p.add_argument(
        "--fail-on-cap",
        action="store_true",
        help="exit 3 if any Riccati solve hit its cap or an update was skipped",
    )
    p.add_argument(
        "--profile",
        action="store_true",
        help="call each row's chunk once more under jax.profiler and print what bounds it",
    )
    a = p.parse_args(argv)
    if a.mlp_steps < 1:
        p.error(f"--mlp-steps must be >= 1, got {a.mlp_steps}")
    paper = a.mlp_steps == lq.TrainConfig().mlp_steps
    faithful = "mlp (faithful" + ("" if paper else f", {a.mlp_steps} Adam steps") + ")"
    print(
        f"# {platform.processor() or platform.machine()}, jax {jax.__version__}, "
        f"devices {jax.devices()}, a solver loop test every {steps_per_test()} steps"
    )
    print(
        "| method | critic | seeds | compile (s) | s / outer iteration | s / iteration / seed |"
        " capped | skipped |"
    )
    print("|---|---|---|---|---|---|---|---|")
    modes = [] if a.only_mlp else [("quadratic_loo", lq.TrainConfig(), a.iterations)]
    if not a.skip_mlp:
        modes += [
            (
                faithful + ("" if kernel == "xla" else f", {kernel} fit"),
                lq.TrainConfig(
                    critic="mlp",
                    follower_grad="score",
                    state_baseline=False,
                    control_variates=False,
                    mlp_kernel=kernel,
                    mlp_steps=a.mlp_steps,
                ),
                a.mlp_iterations,
            )
            for kernel in a.mlp_kernel
        ]
    bad, profiles = [], []
    for name, config, its in modes:
        for method in a.methods.split(","):
            for seeds in a.seeds:
                comp, per, h, prof = measure(method, config, seeds, its, a.profile)
                critic = "none (exact)" if method == "exact" else name
                if prof is not None:
                    profiles.append(profile_row(f"{method} {name} x{seeds}", prof))
                print(
                    f"| {method} | {critic} | {seeds} | {comp:.1f} | {per:.4f} | "
                    f"{per / seeds:.4f} | {h['capped_share']:.2%} | {h['update_skipped']} |",
                    flush=True,
                )
                if unhealthy(h):
                    bad.append(f"{method} {name} {seeds} seeds")
    if profiles:
        print("\nProfiled (one more call of the same chunk under jax.profiler):\n" + HEADER)
        print("\n".join(profiles), flush=True)
    report_unhealthy(bad, a.fail_on_cap)


if __name__ == "__main__":
    main()
