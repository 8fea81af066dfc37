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
(``docs/experiments.md``); ``--estimator unbiased`` subtracts only baselines that keep the estimate
unbiased; ``--estimator shuffled`` is a control (the reference estimator whose guiding term keeps
its noise but loses its mean; see README, "Bi-level LQR Markov game"). Outputs as for the other
experiments.
"""
from __future__ import annotations

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
    from experiments.common import base_parser
    p = base_parser(
        "lqr_game", __doc__, seeds=20, iterations=500, chunk=50, methods=ALL, noun="variant",
        also="also naive_det (Naive-PGD, deterministic leader) and exact (Adam on the "
             "exact hypergradient; run it on its own)",
        grid_flags="--actor-steps",
        grid_help="actor steps in {" + ", ".join(map(str, PAPER_STEPS)) + "}", smoke=(6, 3),
        smoke_help="at most 800 warm-up steps")
    g = p.add_argument_group("LQR game options")
    g.add_argument("--actor-steps", type=int, nargs="+", default=[10],
                   help="actor updates per outer iteration (0 to max(10, --critic-steps)); "
                        "several values form a grid")
    g.add_argument("--critic-steps", type=int, default=5,
                   help="critic updates per outer iteration")
    g.add_argument("--beta", type=float, default=0.1, help="follower entropy coefficient")
    g.add_argument("--estimator", choices=tuple(ESTIMATORS), default="reference",
                   help="'reference': the reference code's estimator; 'unbiased': only "
                        "baselines that keep it unbiased; 'shuffled': a control (the guiding "
                        "term keeps its noise, loses its mean)")
    g.add_argument("--warmup-steps", type=int, default=4000,
                   help="env steps with random leader actions N(0, 1) at the start")
    g.add_argument("--clip", type=float, default=1.0, help="actor gradient norm clip (0: off)")
    g.add_argument("--clip-scope", choices=["reference", "all"], default="reference",
                   help="'reference': only BC-HG's gradients are clipped (the reference code); "
                        "'all': every method's (the paper's text)")
    g.add_argument("--init", choices=["torch", "flax"], default="torch",
                   help="network initialisation: PyTorch's nn.Linear default (the reference) or "
                        "flax's lecun_normal")
    a = p.parse_args(argv)
    if a.smoke:
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
    from bchg_jax.games import lqr
    method, buffer = VARIANTS[name]
    clip = a.clip if (a.clip_scope == "all" or method.startswith("bchg")) else 0.0
    return lqr.TrainConfig(iterations=a.iterations, buffer=buffer, warmup_steps=a.warmup_steps,
                           clip=clip, init=a.init, max_steps=max(10, a.critic_steps),
                           **ESTIMATORS[a.estimator]).validate()


def validate_args(a):
    from bchg_jax.problems.lqr_game import lqr_game
    from bchg_jax.games.lqr.train import HParams
    methods = methods_of(a.method)
    if a.seeds < 1 or a.iterations < 1 or a.chunk < 1:
        raise ValueError("--seeds, --iterations and --chunk must be >= 1")
    for m in methods:
        config = train_config(a, m)
    HParams.from_grid(method_grid(a), max_steps=config.max_steps)
    lqr_game()
    return methods


def run_method(name: str, a, run_dir: str):
    from bchg_jax.problems.lqr_game import lqr_game
    from bchg_jax.games import lqr
    from experiments.common import run_method_folder
    from experiments.plot import YLABELS, pretty_label
    method, buffer = VARIANTS[name]
    config = train_config(a, name)
    trainer = lqr.make_train(lqr_game(), method, config)
    return run_method_folder(
        os.path.join(run_dir, name), name, trainer, method_grid(a), a,
        record={"train_config": {k: (list(v) if isinstance(v, tuple) else v)
                                 for k, v in vars(config).items()}},
        title=f"bi-level LQR game, {pretty_label(name)}: β={a.beta:g}, {a.seeds} seeds",
        window=SUMMARY_WINDOW,
        ylabel=YLABELS["lqr_game"],
        describe=f"bi-level LQR game {method} buffer={buffer} estimator={a.estimator}")


def main(argv=None) -> str:
    from experiments.common import run_experiment
    return run_experiment("lqr_game", argv, parse_args, validate_args, run_method, SETTING_KEYS,
                          SUMMARY_WINDOW)


if __name__ == "__main__":
    main()
