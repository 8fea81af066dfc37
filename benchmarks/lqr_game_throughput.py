"""Bi-level LQR game throughput: compile time and per-outer-iteration time, 1 and 20 vmapped seeds.

``python -m benchmarks.lqr_game_throughput [--preset explore|reference] [--iterations N]
[--methods bchg,naive,...] [--seeds 1 20] [--actor-steps N]``

Each method is built exactly as ``python -m experiments.lqr_game --preset P --method M`` builds
it (the preset's TrainConfig and flag defaults), except that the warm-up is set to 0 so that
every timed iteration takes its actor steps. One outer iteration of ``--preset explore`` (the
default) = 2 target-policy + 6 behaviour episodes x 100 steps, 20 critic minibatch steps on the
replay ring and 1 actor step on a minibatch of 64 steps; of ``--preset reference`` = 4 episodes,
5 critic steps and 10 actor steps on minibatches of 64 (BC-HG's Benefit uses 256 follower
samples and the direct baseline 32 leader samples per minibatch element). The first call of the
jitted chunk (compile + run) is measured separately and the compile time excluded from the
per-iteration figures.
"""

from __future__ import annotations

import argparse
import datetime
import platform

import jax

from bchg_jax.core.health import solver_health
from benchmarks._timing import report_unhealthy, time_chunks, unhealthy


def measure(name: str, seeds: int, iterations: int, preset: str, actor_steps=None):
    """(compile s, s per outer iteration, solver health of the timed runs) of variant ``name``
    for ``seeds`` vmapped seeds."""
    from bchg_jax.games import lqr
    from bchg_jax.problems.lqr_game import gain_metrics, lqr_game
    from experiments import lqr_game as cli

    argv = ["--preset", preset, "--warmup-steps", "0", "--method", name]
    if actor_steps is not None:
        argv += ["--actor-steps", str(actor_steps)]
    a = cli.parse_args(argv)
    config = cli.train_config(a, name)
    trainer = lqr.make_train(lqr_game(), cli.VARIANTS[name][0], config, metrics_fn=gain_metrics)
    comp, per, m = time_chunks(trainer, cli.method_grid(a), seeds, iterations, with_metrics=True)
    return comp, per, solver_health(m)


def main(argv=None):
    from experiments.lqr_game import ALL

    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--preset", choices=tuple(ALL), default="explore")
    p.add_argument("--iterations", type=int, default=50)
    p.add_argument("--actor-steps", type=int, help="override the preset's actor steps")
    p.add_argument("--methods", help="comma-separated variants (default: the preset's 'all')")
    p.add_argument("--seeds", type=int, nargs="+", default=[1, 20])
    a = p.parse_args(argv)
    if a.iterations < 1 or min(a.seeds) < 1:
        p.error("--iterations and --seeds must be >= 1")
    methods = a.methods.split(",") if a.methods else list(ALL[a.preset])
    print(
        f"# {platform.processor() or platform.machine()}, jax {jax.__version__}, "
        f"devices {jax.devices()}, {datetime.date.today()}, preset {a.preset}, "
        f"{a.iterations} timed iterations"
    )
    print(
        "| method | seeds | compile (s) | s / outer iteration | s / iteration / seed | capped "
        "| skipped |"
    )
    print("|---|---|---|---|---|---|---|")
    bad = []
    for name in methods:
        for seeds in a.seeds:
            comp, per, h = measure(name, seeds, a.iterations, a.preset, a.actor_steps)
            print(
                f"| {name} | {seeds} | {comp:.1f} | {per:.4f} | {per / seeds:.4f} | "
                f"{h['capped_share']:.2%} | {h['update_skipped']} |",
                flush=True,
            )
            if unhealthy(h):
                bad.append(f"{name} {seeds} seeds")
    report_unhealthy(bad, fail_on_cap=False)


if __name__ == "__main__":
    main()
