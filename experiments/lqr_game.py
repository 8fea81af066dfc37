"""The bi-level LQR Markov game with actor-critic leaders: ``python -m experiments.lqr_game``.

Method variants: ``bchg`` (BC-HG, Gaussian leader, on-policy buffer of 400 steps), ``naive_on`` /
``naive_off`` (Naive-PGD, on-policy / off-policy buffer), ``bchg_det`` / ``naive_det`` (the
appendix theorem for a deterministic linear leader, with and without the guiding term) and
``exact`` (Adam on the exact hypergradient: the reference curve); ``all`` = bchg, naive_on,
naive_off, bchg_det (``exact`` climbs to ~18, far above the
paper's axis, so it is run on its own). ``--grid paper`` runs actor_steps in {1, 2, 5, 10} (critic steps 5)
per variant as one vmapped program. The metric of every iteration is the *exact* undiscounted
100-step leader return of the current leader against its best response (``J``), with the
discounted one, the batch's sampled return, K_theta (``K1``, ``K2``) and skipped updates.
``--estimator reference`` (default) is the reference implementation's estimator
(``spec/lqr_game.md``); ``--estimator unbiased`` subtracts only baselines that keep the estimate
unbiased; ``--estimator shuffled`` is a control (the reference estimator whose guiding term keeps
its noise but loses its mean; see README, "Bi-level LQR Markov game"). Outputs as for the other
experiments.
"""
from __future__ import annotations

import argparse
import os

import numpy as np

PAPER_STEPS = (1, 2, 5, 10)
VARIANTS = {"bchg": ("bchg", "on"), "naive_on": ("naive", "on"), "naive_off": ("naive", "off"),
            "bchg_det": ("bchg_det", "on"), "naive_det": ("naive_det", "on"),
            "exact": ("exact", "on")}
ALL = ("bchg", "naive_on", "naive_off", "bchg_det")
ESTIMATORS = {"reference": dict(direct_baseline="reference", influence="raw"),
              "unbiased": dict(direct_baseline="same_noise", influence="baseline"),
              # control experiment: the reference estimator with the Benefit of another sample
              "shuffled": dict(direct_baseline="reference", influence="raw",
                               shuffle_benefit=True)}
SUMMARY_WINDOW = 50
SETTING_KEYS = ("seeds", "seed", "grid", "actor_steps", "critic_steps", "iterations", "beta",
                "estimator", "warmup_steps", "clip", "clip_scope", "init")


def parse_args(argv=None):
    p = argparse.ArgumentParser(prog="python -m experiments.lqr_game", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--seeds", type=int, default=20)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--method", default="bchg",
                   help="a variant, a comma-separated list, or 'all' (" + ", ".join(ALL) + ")")
    p.add_argument("--actor-steps", type=int, nargs="+", default=[10])
    p.add_argument("--critic-steps", type=int, default=5)
    p.add_argument("--grid", choices=["none", "paper"], default="none",
                   help="'paper': actor steps in {1, 2, 5, 10}")
    p.add_argument("--iterations", type=int, default=500)
    p.add_argument("--chunk", type=int, default=50)
    p.add_argument("--beta", type=float, default=0.1, help="follower entropy coefficient")
    p.add_argument("--estimator", choices=tuple(ESTIMATORS), default="reference")
    p.add_argument("--warmup-steps", type=int, default=4000,
                   help="env steps with random leader actions N(0, 1) at the start")
    p.add_argument("--clip", type=float, default=1.0, help="actor gradient norm clip (0: off)")
    p.add_argument("--clip-scope", choices=["reference", "all"], default="reference",
                   help="'reference': only BC-HG's gradients are clipped (the reference code); "
                        "'all': every method's (the paper's text)")
    p.add_argument("--init", choices=["torch", "flax"], default="torch")
    p.add_argument("--out", default="results")
    p.add_argument("--exact-out", action="store_true")
    p.add_argument("--resume", metavar="DIR", default=None)
    from experiments.common import add_scale_args
    add_scale_args(p)
    p.add_argument("--smoke", action="store_true", help="tiny run: 2 seeds, 6 iterations")
    a = p.parse_args(argv)
    if a.smoke:
        a.seeds, a.iterations, a.chunk = min(a.seeds, 2), min(a.iterations, 6), 3
        a.warmup_steps = min(a.warmup_steps, 800)
    return a


def methods_of(spec: str):
    from experiments.common import parse_methods
    return parse_methods(spec, ALL, tuple(VARIANTS))


def method_grid(a):
    steps = PAPER_STEPS if a.grid == "paper" else tuple(a.actor_steps)
    n = len(steps)
    return {"actor_steps": np.asarray(steps), "critic_steps": np.full(n, a.critic_steps),
            "beta": np.full(n, a.beta)}


def train_config(a, name: str):
    from bchg_jax.train_lqr_game import LQRGameTrainConfig
    method, buffer = VARIANTS[name]
    clip = a.clip if (a.clip_scope == "all" or method.startswith("bchg")) else 0.0
    return LQRGameTrainConfig(iterations=a.iterations, buffer=buffer, warmup_steps=a.warmup_steps,
                              clip=clip, init=a.init, max_steps=max(10, a.critic_steps),
                              **ESTIMATORS[a.estimator]).validate()


def validate_args(a):
    from bchg_jax.problems.lqr_game import lqr_game
    from bchg_jax.train_lqr_game import validate_lqr_game_hparams
    methods = methods_of(a.method)
    if a.seeds < 1 or a.iterations < 1 or a.chunk < 1:
        raise ValueError("--seeds, --iterations and --chunk must be >= 1")
    for m in methods:
        config = train_config(a, m)
    validate_lqr_game_hparams(method_grid(a), config.max_steps)
    lqr_game()
    return methods


def run_method(name: str, a, run_dir: str):
    from bchg_jax.problems.lqr_game import lqr_game
    from bchg_jax.train_lqr_game import make_train_lqr_game
    from experiments.common import run_method_folder
    from experiments.plot import YLABELS
    method, buffer = VARIANTS[name]
    config = train_config(a, name)
    trainer = make_train_lqr_game(lqr_game(), method, config)
    return run_method_folder(
        os.path.join(run_dir, name), name, trainer, method_grid(a), a,
        record={"train_config": {k: (list(v) if isinstance(v, tuple) else v)
                                 for k, v in vars(config).items()}},
        title=f"bi-level LQR game  {name}  ({a.seeds} seeds)", window=SUMMARY_WINDOW,
        ylabel=YLABELS["lqr_game"],
        describe=f"bi-level LQR game {method} buffer={buffer} estimator={a.estimator}")


def main(argv=None) -> str:
    from experiments.common import run_experiment
    return run_experiment("lqr_game", argv, parse_args, validate_args, run_method, SETTING_KEYS,
                          SUMMARY_WINDOW)


if __name__ == "__main__":
    main()
