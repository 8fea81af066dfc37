"""Four-Rooms with BC-HG and the paper's baselines: ``python -m experiments.fourrooms``.

Every (grid point, seed) of a method trains as one vmapped program, in jitted chunks. A run
folder (``<out>/fourrooms/<timestamp>/`` or exactly ``--out`` with ``--exact-out``) holds
``config.json`` and one sub-folder per method with ``config.json``, ``metrics.npz`` and
``checkpoint/<iteration>/`` (an orbax checkpoint folder; both rewritten atomically after every
chunk), ``metrics.jsonl`` (one line appended per chunk), ``summary.csv`` and ``curve.png``;
with several methods also ``summary.csv`` (best hyperparameters per method) and ``figure.png``
(methods as curves). ``--resume DIR`` continues a stopped run from its last chunk.
"""

from __future__ import annotations

import dataclasses
import os

import numpy as np

from experiments.cli import FOLLOWER_SETTINGS, SHARED_SETTINGS

PAPER_LR = (0.5, 0.1, 0.05, 0.01)
PAPER_ALPHA = (0.1, 0.3, 0.5, 0.7, 0.9, 1.0)
SUMMARY_WINDOW = 1000
ALL_METHODS = ("bchg", "hpgd_oracle", "hpgd_mc", "hpgd_sa", "sobirl", "naive")
# arguments that define a run folder's setting: a second invocation may add methods, not change
# these
SETTING_KEYS = (
    "seeds",
    "seed",
    "beta",
    "batch",
    "grid",
    "iterations",
    "slip_model",
    "lr",
    "sarsa_alpha",
    "solver",
    "parallel_steps",
)
SETTING_KEYS += FOLLOWER_SETTINGS + SHARED_SETTINGS


def batch_shape(batch: int):
    """Transitions per outer iteration -> (num_envs, num_steps): 100=1x100, 200=1x200, 400=2x200."""
    if batch < 1:
        raise ValueError(f"--batch must be >= 1, got {batch}")
    if batch <= 200:
        return 1, batch
    if batch % 200:
        raise ValueError(
            f"--batch above 200 must be a multiple of 200 (streams of 200 steps), got {batch}"
        )
    return batch // 200, 200


def parse_args(argv=None):
    from experiments.cli import add_follower_args, base_parser

    p = base_parser(
        "fourrooms",
        __doc__,
        seeds=10,
        iterations=10_000,
        chunk=500,
        methods=ALL_METHODS,
        also="also 'exact' (ascent on the exact hypergradient)",
        grid_flags="--lr and --sarsa-alpha",
        grid_help="lr in {"
        + ", ".join(map(str, PAPER_LR))
        + "} (x SARSA step size in {"
        + ", ".join(map(str, PAPER_ALPHA))
        + "} for the SARSA critics)",
        smoke=(20, 10),
    )
    g = p.add_argument_group("Four-Rooms options")
    g.add_argument("--beta", type=float, default=1e-3, help="follower entropy coefficient (> 0)")
    g.add_argument(
        "--batch",
        type=int,
        default=100,
        help="transitions per outer iteration: 1 to 200 (one stream of BATCH steps) "
        "or a multiple of 200 (BATCH/200 streams of 200 steps); the paper uses "
        "100, 200, 400 and 1000",
    )
    g.add_argument(
        "--lr",
        type=float,
        nargs="+",
        default=[0.1],
        help="leader learning rate(s); several values form a grid",
    )
    g.add_argument(
        "--sarsa-alpha",
        type=float,
        nargs="+",
        default=[0.5],
        help="SARSA critic step size(s) (bchg, hpgd_sa); several values form a grid",
    )
    g.add_argument(
        "--slip-model",
        choices=["reference", "paper"],
        default="reference",
        help="'reference': the follower's model slips with 0.56 / 0.1467 while the "
        "samples use 2/3 / 1/9 (the authors' setting); 'paper': 2/3 and 1/9 "
        "everywhere (docs/experiments.md)",
    )
    g.add_argument(
        "--solver",
        choices=["auto", "dense", "sparse"],
        default="auto",
        help="the follower's and the J_L metric's solvers: 'dense' sweeps on the "
        "[S, B, S] table, 'sparse' modified soft policy iteration on the "
        "successor table (same tolerance), 'auto' sparse when every state has at "
        "most S/4 successors, as in Four-Rooms (docs/performance.md)",
    )
    g.add_argument(
        "--parallel-steps",
        action="store_true",
        help="draw each rollout in log depth and make the SARSA pass one triangular solve "
        "(TrainConfig.parallel_steps): the same batches and, up to float rounding, the same "
        "critic in tens of dependent steps per iteration instead of one per transition; for a "
        "GPU, slower on a CPU (docs/performance.md)",
    )
    add_follower_args(p, estimate="the estimate (before clipping)")
    return p.parse_args(argv)


def methods_of(spec: str):
    from bchg_jax.tabular.train import METHODS
    from experiments.cli import parse_methods

    return parse_methods(spec, ALL_METHODS, METHODS)


def unread_flags(methods) -> dict:
    """{flag dest: why} for the flags no method of ``methods`` reads
    (:func:`experiments.cli.refuse_unread`)."""
    from bchg_jax.tabular.train import SARSA_METHODS

    unread = {}
    if not set(methods) & set(SARSA_METHODS):
        unread["sarsa_alpha"] = (
            f"the step size of the SARSA critic of {', '.join(SARSA_METHODS)}, and this run has "
            "none of them"
        )
    return unread


def validate_args(a):
    from experiments.cli import check_counts, follower_model, refuse_unread

    methods = methods_of(a.method)
    check_counts(a, "seeds", "iterations", "chunk")
    refuse_unread(a, unread_flags(methods))
    if a.beta <= 0:
        raise ValueError(f"--beta must be > 0, got {a.beta}")
    batch_shape(a.batch)
    follower_model(a)


def method_grid(method: str, a):
    from bchg_jax.core.sweep import product_grid
    from bchg_jax.tabular.train import SARSA_METHODS

    lrs, alphas = (PAPER_LR, PAPER_ALPHA) if a.grid == "paper" else (a.lr, a.sarsa_alpha)
    if method not in SARSA_METHODS:  # no SARSA critic: the step size is not a hyperparameter
        return product_grid(lr=lrs, beta=[a.beta])
    return product_grid(lr=lrs, sarsa_alpha=alphas, beta=[a.beta])


def summarize(J: np.ndarray, window: int = SUMMARY_WINDOW):
    """Per seed mean of the last 1000 iterations -> (final [G,N], mean [G], se [G], best)."""
    from experiments.summary import summarize as _summarize

    return _summarize(J, window)


def run_method(method: str, a, run_dir: str):
    """Trains (or resumes, or skips if complete) one method's grid; returns its summary dict."""
    from bchg_jax.problems.fourrooms import fourrooms
    from bchg_jax.tabular.train import TrainConfig, make_train
    from experiments.cli import follower_model, follower_note
    from experiments.plot import YLABEL, pretty_label
    from experiments.run_folder import run_method_folder

    grid = method_grid(method, a)  # validated by main() before any method ran
    envs, steps = batch_shape(a.batch)
    config = TrainConfig(
        num_envs=envs,
        num_steps=steps,
        iterations=a.iterations,
        solver=a.solver,
        parallel_steps=a.parallel_steps,
        follower=follower_model(a),
        track_reference=a.track_reference,
    )
    trainer = make_train(fourrooms(a.slip_model, dtype=a.dtype), method, config)
    follower = follower_note(config, ", follower ")
    return run_method_folder(
        os.path.join(run_dir, method),
        method,
        trainer,
        grid,
        a,
        record={"train_config": dataclasses.asdict(config)},
        title=f"Four-Rooms, {pretty_label(method)}: β={a.beta:g}, batch {a.batch}, "
        f"slip model {a.slip_model}, {a.seeds} seeds{follower}",
        window=SUMMARY_WINDOW,
        ylabel=YLABEL,
        describe=f"Four-Rooms [{a.slip_model}] beta={a.beta} batch={a.batch} ({envs}x{steps})"
        + follower,
    )


def validate_all(a):
    """Arguments and every method's grid, checked before anything compiles; -> method names."""
    from bchg_jax.tabular.train import HParams

    validate_args(a)
    methods = methods_of(a.method)
    for m in methods:
        HParams.from_grid(method_grid(m, a))
    return methods


def main(argv=None) -> str:
    from experiments.run_folder import run_experiment

    return run_experiment(
        "fourrooms", argv, parse_args, validate_all, run_method, SETTING_KEYS, SUMMARY_WINDOW
    )


if __name__ == "__main__":
    main()
