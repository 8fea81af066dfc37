"""The toy Markov game (R = 2) with actor-critic leaders: ``python -m experiments.toy_game``.

Method variants: ``bchg`` (BC-HG, on-policy buffer), ``bchg_off``, ``naive_on`` / ``naive_off``
(Naive-PGD), ``biac_on`` / ``biac_off`` (Bi-AC critic target); ``all`` = bchg, naive_on,
naive_off, biac_on, biac_off. ``--grid paper`` runs actor_steps x critic_steps in
{1, 2, 5, 10, 20}^2 (25 settings) per variant as one vmapped program. The metric of every
iteration is the *exact* undiscounted 150-step leader return of (f_theta, g) (``J``), with the
discounted one, the batch's sampled return, p = f(0|A) and g(.|S) (``p``, ``g_S``:
``bchg_jax.problems.toy_game.toy_game_metrics``). Outputs as
for the other experiments (``experiments/run_folder.py``).

``--follower`` simulates a follower that is not at its best response (``k_step``, ``lag``,
``q_learning``; ``docs/followers.md``): its runs add ``follower_gap``, the sup-norm distance
of its policy from the best response. ``--track-reference`` adds the cosine and projection of
the leader's hypergradient estimate on the exact references (``cos_target``, ``proj_target``,
``cos_through``, ``proj_through``; the references are those of ``--backup``).
"""

from __future__ import annotations

import dataclasses
import os

import numpy as np

from experiments.cli import FOLLOWER_SETTINGS, SHARED_SETTINGS

PAPER_STEPS = (1, 2, 5, 10, 20)
VARIANTS = {
    "bchg": ("bchg", "on"),
    "bchg_off": ("bchg", "off"),
    "naive_on": ("naive", "on"),
    "naive_off": ("naive", "off"),
    "biac_on": ("biac", "on"),
    "biac_off": ("biac", "off"),
}
ALL = ("bchg", "naive_on", "naive_off", "biac_on", "biac_off")
SUMMARY_WINDOW = 50
TRACK_MINIBATCH = 1024  # bchg_jax.games.tabular.train.TRACK_MINIBATCH (not imported: fast --help)
SETTING_KEYS = (
    "seeds",
    "seed",
    "grid",
    "actor_steps",
    "critic_steps",
    "iterations",
    "R",
    "backup",
    "critic_target",
    "actor",
    "beta",
    "direct_baseline",
    "init",
)
SETTING_KEYS += FOLLOWER_SETTINGS + SHARED_SETTINGS


def parse_args(argv=None):
    from experiments.cli import add_follower_args, base_parser

    p = base_parser(
        "toy_game",
        __doc__,
        seeds=10,
        iterations=500,
        chunk=50,
        methods=ALL,
        noun="variant",
        also="also bchg_off (BC-HG, off-policy buffer)",
        grid_flags="--actor-steps and --critic-steps",
        grid_help="actor x critic steps in {" + ", ".join(map(str, PAPER_STEPS)) + "}^2",
        smoke=(6, 3),
    )
    g = p.add_argument_group("toy game options")
    g.add_argument(
        "--actor-steps",
        type=int,
        nargs="+",
        default=[1],
        help="actor updates per outer iteration (0 to 20); several values form a grid",
    )
    g.add_argument(
        "--critic-steps",
        type=int,
        nargs="+",
        default=[1],
        help="critic updates per outer iteration (0 to 20); several values form a grid",
    )
    g.add_argument("--R", type=float, default=2.0, help="the game's reward R (paper figure: 2)")
    g.add_argument("--beta", type=float, default=0.05, help="follower entropy coefficient")
    g.add_argument(
        "--backup",
        choices=["reference", "paper"],
        default="reference",
        help="follower soft-Q backup (reference code / Theorem 2); the estimator is "
        "Theorem 2's, unbiased for the paper backup's hypergradient only",
    )
    g.add_argument(
        "--critic-target",
        choices=["reference", "paper"],
        default="reference",
        help="critic target: modes of target actor and g / sampled next actions",
    )
    g.add_argument(
        "--direct-baseline",
        choices=["reference", "state", "none"],
        default="reference",
        help="'reference': subtract sum_a' f(a'|s) Q(s,a',b) in the direct term, with the "
        "sampled b, which depends on a (the reference code's; biased: 8%% of the direct "
        "term's norm on this game); 'state': subtract the critic's V_L(s) = "
        "sum_a',b' f g Q (unbiased); 'none': no baseline",
    )
    g.add_argument(
        "--actor",
        choices=["mlp", "tabular"],
        default="mlp",
        help="leader actor: a 64-64 ReLU MLP on one-hot(s) or softmax logits per state",
    )
    g.add_argument(
        "--init",
        choices=["torch", "flax"],
        default="torch",
        help="network initialisation: PyTorch's nn.Linear default (the reference) or "
        "flax's lecun_normal",
    )
    add_follower_args(
        p,
        estimate=f"the leader's estimate (its surrogate's gradient on {TRACK_MINIBATCH} segment "
        "starts drawn ~ gamma_L^t, at the iteration's start, times sum_t gamma_L^t; the "
        "references take --backup, and under the reference backup Theorem 2's estimator is "
        "not unbiased for them)",
        exact_method=False,
    )
    return p.parse_args(argv)


def methods_of(spec: str):
    from experiments.cli import parse_methods

    return parse_methods(spec, ALL, tuple(VARIANTS))


def method_grid(a):
    from bchg_jax.core.sweep import product_grid

    actor, critic = (
        (PAPER_STEPS, PAPER_STEPS) if a.grid == "paper" else (a.actor_steps, a.critic_steps)
    )
    g = product_grid(actor_steps=actor, critic_steps=critic)
    g["beta"] = np.full(len(g["actor_steps"]), a.beta)
    return g


def train_config(a, buffer: str):
    from bchg_jax.games import tabular as games
    from experiments.cli import follower_model

    return games.TrainConfig(
        iterations=a.iterations,
        buffer=buffer,
        actor=a.actor,
        critic_target=a.critic_target,
        direct_baseline=a.direct_baseline,
        backup=a.backup,
        init=a.init,
        follower=follower_model(a),
        track_reference=a.track_reference,
        dtype=a.dtype,
    ).validate()


def validate_args(a):
    from bchg_jax.games.tabular.train import HParams
    from bchg_jax.problems.toy_game import toy_game
    from experiments.cli import check_counts, refuse_unread

    methods = methods_of(a.method)
    check_counts(a, "seeds", "iterations", "chunk")
    if all(VARIANTS[m][0] == "biac" for m in methods):  # its own Stackelberg TD target
        refuse_unread(a, {"critic_target": "Bi-AC's critic takes max_a' Q(s', a', b*(a'))"})
    with np.errstate(over="ignore"):  # 1e39 is a finite float, inf in the game's float32
        if not np.isfinite(np.asarray(a.R, a.dtype)):
            big = {"float32": "3.4e38", "float64": "1.8e308"}[a.dtype]  # the dtype's max
            raise ValueError(f"--R must be finite in {a.dtype} (|R| < {big}), got {a.R}")
    try:
        toy_game(a.R, dtype=a.dtype).validate()
    except ValueError as e:
        raise ValueError(f"--R {a.R}: {e}") from None
    HParams.from_grid(method_grid(a), max_steps=train_config(a, "on").max_steps)
    for m in methods:
        train_config(a, VARIANTS[m][1])
    return methods


def run_method(name: str, a, run_dir: str):
    from bchg_jax.games import tabular as games
    from bchg_jax.problems.toy_game import toy_game, toy_game_metrics
    from experiments.cli import follower_note
    from experiments.plot import YLABELS, pretty_label
    from experiments.run_folder import run_method_folder

    method, buffer = VARIANTS[name]
    config = train_config(a, buffer)
    trainer = games.make_train(
        toy_game(a.R, dtype=a.dtype), method, config, metrics_fn=toy_game_metrics
    )
    return run_method_folder(
        os.path.join(run_dir, name),
        name,
        trainer,
        method_grid(a),
        a,
        record={"train_config": dataclasses.asdict(config)},
        title=f"toy Markov game (R={a.R:g}), {pretty_label(name)}: β={a.beta:g}, {a.seeds} seeds"
        + follower_note(config, ", follower "),
        window=SUMMARY_WINDOW,
        ylabel=YLABELS["toy_game"],
        describe=f"toy game R={a.R:g} {method} buffer={buffer}"
        + follower_note(config, " follower="),
    )


def main(argv=None) -> str:
    from experiments.run_folder import run_experiment

    return run_experiment(
        "toy_game", argv, parse_args, validate_args, run_method, SETTING_KEYS, SUMMARY_WINDOW
    )


if __name__ == "__main__":
    main()
