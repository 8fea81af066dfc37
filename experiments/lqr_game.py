"""The bi-level LQR Markov game with actor-critic leaders: ``python -m experiments.lqr_game``.

Two presets, defined in the library (``bchg_jax/games/lqr/presets.py``; ``docs/experiments.md``,
"Bi-level LQR Markov game"):

* ``--preset explore`` (default): the learned-critic design. Every iteration collects 2 episodes
  of the leader's own policy (the actor's data) and 6 episodes of a behaviour leader
  ``a = K s + 0.5 eps`` that the follower observes (critic data only, ``--explore-episodes``);
  the critic evaluates the target policy off-policy from a replay ring of the last 80 episodes
  (``--replay``: 10 iterations), 20 updates per iteration (``--critic-steps``), with
  standardised inputs, follower actions sampled in its TD target and target networks updated
  at rate 0.2 (``--tau``); a 160,000-step (200-iteration) critic-only warm-up; unbiased
  estimators with the control variate of the guiding term; every method clipped; Adam 0.02 for
  theta with a cosine decay to 0 over the actor updates after the warm-up; 2000 iterations.
  ``all`` = bchg, bchg_det, naive, naive_det, exact, exact_direct.
* ``--preset reference``: the reference implementation's settings (on-policy buffer of 400
  steps, the reference estimator, 4000 random warm-up steps, only BC-HG clipped, 500
  iterations); ``all`` = bchg, naive_on, naive_off, bchg_det. Its result is documented as not
  reproducing the paper.

Method variants: ``bchg`` (BC-HG, Gaussian leader), ``naive`` = ``naive_on`` / ``naive_off``
(Naive-PGD with the same critic and data, on-policy / off-policy actor buffer), ``bchg_det`` /
``naive_det`` (the appendix theorem for a deterministic linear leader, with and without the
guiding term), ``exact`` (Adam on the exact hypergradient) and ``exact_direct`` (Adam on its
direct part only: the follower's policy held fixed, what Naive-PGD estimates).
``--grid paper`` runs actor_steps in {1, 2, 5, 10} per variant as one vmapped program. The
metric of every iteration is the *exact* undiscounted 100-step leader return of the current
leader against its best response (``J``), with the discounted one, the batch's sampled return,
K_theta (``K1``, ``K2``: ``bchg_jax.problems.lqr_game.gain_metrics``) and skipped updates.
``--estimator unbiased`` (the default, set by the explore preset) subtracts only baselines that
keep the estimate unbiased; ``--estimator reference`` (the reference preset's default) is the
reference implementation's estimator (``docs/experiments.md``); the control that pairs each
influence with another sample's Benefit is ``python -m benchmarks.lqr_game_controls``. Every
variant runs under either preset (BC-HG's control variate, which needs the on-policy buffer,
does not concern Naive-PGD). Every method's gradient is clipped (``--clip-scope all``, the
explore preset's default); the reference preset clips only BC-HG's (``--clip-scope
reference``). A run whose ``--iterations`` end inside the critic-only warm-up
(``--warmup-steps``) never updates the leader: the CLI warns.
``--follower k_step --follower-steps K`` simulates a follower that takes K Riccati steps per
iteration from its last value instead of its best response (``docs/followers.md``): the leader
reads its policy with the value of that fixed policy, ``J`` is the return against the policy
it plays, and the runs add ``follower_gap`` (the largest gain difference from the best
response). The exact methods ascend the best response's exact hypergradient whatever the
follower. ``--track-reference`` adds the cosine and projection of the leader's hypergradient
estimate on the two exact references (``cos_target``, ``proj_target``, ``cos_through``,
``proj_through``).
Outputs as for the other experiments.
"""

from __future__ import annotations

import os

import numpy as np

from experiments.cli import FOLLOWER_SETTINGS, SHARED_SETTINGS

PAPER_STEPS = (1, 2, 5, 10)
VARIANTS = {
    "bchg": ("bchg", "on"),
    "naive": ("naive", "on"),
    "naive_on": ("naive", "on"),
    "naive_off": ("naive", "off"),
    "bchg_det": ("bchg_det", "on"),
    "naive_det": ("naive_det", "on"),
    "exact": ("exact", "on"),
    "exact_direct": ("exact_direct", "on"),
}
ALL = {
    "explore": ("bchg", "bchg_det", "naive", "naive_det", "exact", "exact_direct"),
    "reference": ("bchg", "naive_on", "naive_off", "bchg_det"),
}
# the flag that sets each nested TrainConfig field (errors of the library's checks name it)
CONFIG_FLAGS = {
    "ActorConfig.lr": "actor_lr",
    "ActorConfig.lr_schedule": "actor_lr_schedule",
    "ActorConfig.clip": "clip",
    "CriticConfig.lr": "critic_lr",
    "CriticConfig.init": "init",
    "CriticConfig.replay": "replay",
    "ExplorationConfig.warmup_steps": "warmup_steps",
    "ExplorationConfig.episodes": "explore_episodes",
    "ExplorationConfig.std": "explore_std",
    "EstimatorConfig.influence_cv": "influence_cv",
}
SUMMARY_WINDOW = 50
SETTING_KEYS = (
    "seeds",
    "seed",
    "grid",
    "actor_steps",
    "critic_steps",
    "iterations",
    "beta",
    "estimator",
    "warmup_steps",
    "clip",
    "clip_scope",
    "init",
    "preset",
    "actor_lr",
    "critic_lr",
    "explore_std",
    "actor_lr_schedule",
    "replay",
    "tau",
    "minibatch",
    "explore_episodes",
    "reaction",
    "influence_cv",
)
SETTING_KEYS += FOLLOWER_SETTINGS + SHARED_SETTINGS


def parse_args(argv=None):
    import argparse
    import sys

    from bchg_jax.games.lqr.presets import ESTIMATORS, PRESETS
    from bchg_jax.games.lqr.train import TRACK_MINIBATCH
    from experiments.cli import add_follower_args, base_parser, smoke_requested

    pre = argparse.ArgumentParser(add_help=False)
    pre.add_argument("--preset", choices=tuple(PRESETS), default="explore")
    preset = pre.parse_known_args(sys.argv[1:] if argv is None else list(argv))[0].preset
    p = base_parser(
        "lqr_game",
        __doc__,
        seeds=20,
        iterations=PRESETS[preset]().config.iterations,
        chunk=50,
        methods=ALL[preset],
        noun="variant",
        also="also any of " + ", ".join(v for v in VARIANTS if v not in ALL[preset]),
        grid_flags="--actor-steps",
        grid_help="actor steps in {" + ", ".join(map(str, PAPER_STEPS)) + "}",
        smoke=(6, 3),
        smoke_help="at most 800 warm-up steps",
    )
    g = p.add_argument_group("LQR game options")
    g.add_argument(
        "--preset",
        choices=tuple(PRESETS),
        default="explore",
        help="'explore': learned critics with exploration, replay and unbiased "
        "estimators (the default design); 'reference': the reference "
        "implementation's settings (bchg_jax/games/lqr/presets.py); each sets the defaults "
        "of the flags below",
    )
    g.add_argument("--actor-lr", type=float, help="Adam learning rate of theta")
    g.add_argument(
        "--actor-lr-schedule",
        choices=["constant", "cosine"],
        help="theta's learning rate: constant, or cosine decay to 0 over the run's actor "
        "updates (--actor-steps per iteration after the critic-only warm-up)",
    )
    g.add_argument("--critic-lr", type=float, help="Adam learning rate of the critic")
    g.add_argument(
        "--explore-std",
        type=float,
        help="std of the behaviour leader's exploration noise (explore preset)",
    )
    g.add_argument(
        "--explore-episodes",
        type=int,
        help="behaviour-leader episodes per iteration, critic data only (0: none; "
        "more than 0 needs --replay)",
    )
    g.add_argument(
        "--replay",
        type=int,
        help="episodes in the critic's replay ring, newest kept (0: the critic trains "
        "on the actor's buffer); a multiple of the episodes per iteration",
    )
    g.add_argument(
        "--tau", type=float, help="Polyak rate of the target critic and target leader, in (0, 1]"
    )
    g.add_argument(
        "--minibatch",
        type=int,
        help="steps (segment starts, drawn ~ gamma_L^t from the iteration's "
        "episodes) per actor update, and per critic update where the preset's critic "
        "minibatch is 0 (--preset reference)",
    )
    g.add_argument(
        "--actor-steps",
        type=int,
        nargs="+",
        default=[10],
        help="actor updates per outer iteration (0 to max(10, --critic-steps)); "
        "several values form a grid",
    )
    g.add_argument(
        "--critic-steps",
        type=int,
        default=5,
        help="critic updates per outer iteration (0: the critic is never trained, so the "
        "learned-critic estimators read the untrained network: an ablation; the exact "
        "methods do not read it)",
    )
    g.add_argument("--beta", type=float, default=0.1, help="follower entropy coefficient")
    g.add_argument(
        "--reaction",
        choices=["q_gradient", "policy_score"],
        default="q_gradient",
        help="bchg_det's follower reaction: 'q_gradient' (Theorem 3: grad_a Q_F, exact at the "
        "best response) or 'policy_score' (the follower's own score at each sample's step and "
        "grad_a V_F after it: unbiased off the best response too, docs/followers.md)",
    )
    g.add_argument(
        "--influence-cv",
        choices=["on", "off"],
        help="BC-HG's control variate on the guiding term's influence sums: each sample's sum "
        "less its prediction from (s, a), fitted on the iteration's other episodes "
        "(unbiased; needs 2 or more episodes per iteration); the explore preset's is 'on', "
        "the reference preset's 'off'",
    )
    g.add_argument(
        "--estimator",
        choices=tuple(ESTIMATORS),
        default="reference",
        help="'reference': the reference code's estimator; 'unbiased': only "
        "baselines that keep it unbiased (default: the preset's, %(default)s)",
    )
    g.add_argument(
        "--warmup-steps",
        type=int,
        default=4000,
        help="env steps with random leader actions N(0, 1) at the start (critic "
        "only: the leader is not updated) (default: the preset's, %(default)s)",
    )
    g.add_argument("--clip", type=float, default=1.0, help="actor gradient norm clip (0: off)")
    g.add_argument(
        "--clip-scope",
        choices=["reference", "all"],
        default="reference",
        help="'reference': only BC-HG's gradients are clipped (the reference code); "
        "'all': every method's (the paper's text) (default: the preset's, "
        "%(default)s)",
    )
    g.add_argument(
        "--init",
        choices=["torch", "flax"],
        default="torch",
        help="network initialisation: PyTorch's nn.Linear default (the reference) or "
        "flax's lecun_normal",
    )
    from bchg_jax.games.lqr.config import TrainConfig  # its follower models: FOLLOWER_KINDS

    add_follower_args(
        p,
        TrainConfig.FOLLOWER_KINDS,
        estimate=f"the leader's estimate (its surrogate's gradient on {TRACK_MINIBATCH} segment "
        "starts drawn ~ gamma_L^t at the iteration's start, times sum_t gamma_L^t, with its "
        "learned critic; the exact methods' own gradient)",
    )
    p.set_defaults(**preset_flags(preset))
    a = p.parse_args(argv)
    if getattr(a, "config", None) and "preset" in a._explicit:
        from experiments.cli import fail, read_run_config

        saved = read_run_config(a.config, "--config")["args"].get("preset", a.preset)
        if saved != a.preset:  # FILE's flags with the other preset's fixed settings: neither
            fail(
                f"--config {a.config} holds a --preset {saved} run (its flags are that "
                f"preset's values); --preset {a.preset} would run a mix of the two presets: "
                f"drop --preset, or start from --preset {a.preset} without --config"
            )
    if smoke_requested(a):  # not from a --config file: its values are reduced already
        a.warmup_steps = min(a.warmup_steps, 800)
    return a


def preset_flags(name: str) -> dict:
    """The flags' defaults under the library's preset ``name``
    (:mod:`bchg_jax.games.lqr.presets`)."""
    from bchg_jax.games.lqr.presets import PRESETS

    p = PRESETS[name]()
    c = p.config
    return dict(
        iterations=c.iterations,
        actor_steps=[int(p.hparams.actor_steps)],
        critic_steps=int(p.hparams.critic_steps),
        beta=float(p.hparams.beta),
        estimator=p.estimator,
        warmup_steps=c.exploration.warmup_steps,
        clip=c.actor.clip,
        clip_scope=p.clip_scope,
        init=c.critic.init,
        actor_lr=c.actor.lr,
        actor_lr_schedule=c.actor.lr_schedule,
        critic_lr=c.critic.lr,
        explore_std=c.exploration.std,
        explore_episodes=c.exploration.episodes,
        replay=c.critic.replay,
        tau=c.tau,
        minibatch=c.minibatch,
        influence_cv="on" if c.estimator.influence_cv else "off",
    )


def methods_of(spec: str, preset: str = "explore"):
    from experiments.cli import parse_methods

    return parse_methods(spec, ALL[preset], tuple(VARIANTS))


def method_grid(a):
    steps = PAPER_STEPS if a.grid == "paper" else tuple(a.actor_steps)
    n = len(steps)
    return {
        "actor_steps": np.asarray(steps),
        "critic_steps": np.full(n, a.critic_steps),
        "beta": np.full(n, a.beta),
    }


def train_config(a, name: str):
    """The TrainConfig of variant ``name``: the preset's, with the flags' values."""
    from dataclasses import replace

    from bchg_jax.games.lqr.presets import ESTIMATORS, PRESETS, clipped
    from experiments.cli import follower_model

    method, buffer = VARIANTS[name]
    c = PRESETS[a.preset]().config
    return replace(
        c,
        iterations=a.iterations,
        buffer=buffer,
        minibatch=a.minibatch,
        max_steps=max(10, a.critic_steps),
        tau=a.tau,
        dtype=a.dtype,
        actor=replace(
            c.actor,
            lr=a.actor_lr,
            lr_schedule=a.actor_lr_schedule,
            clip=a.clip if clipped(method, a.clip_scope) else 0.0,
        ),
        critic=replace(c.critic, init=a.init, lr=a.critic_lr, replay=a.replay),
        exploration=replace(
            c.exploration,
            warmup_steps=a.warmup_steps,
            episodes=a.explore_episodes,
            std=a.explore_std,
        ),
        estimator=replace(
            c.estimator,
            **ESTIMATORS[a.estimator],
            reaction=a.reaction,
            influence_cv=a.influence_cv == "on",
        ),
        follower=follower_model(a),
        track_reference=a.track_reference,
    ).validate()


def unread_flags(a, methods) -> dict:
    """{flag dest: why} for the flags no method of ``methods`` reads with these settings
    (:func:`experiments.cli.refuse_unread`): the exact methods train no critic and draw no
    minibatch or behaviour episode, the behaviour episodes' noise needs behaviour episodes,
    and ``--clip`` a method that ``--clip-scope`` clips."""
    from bchg_jax.games.lqr.presets import clipped
    from bchg_jax.games.lqr.train import DETERMINISTIC, EXACT, GUIDED

    algos = [VARIANTS[m][0] for m in methods]
    unread = {}
    if all(x in EXACT for x in algos):
        why = "the exact methods ascend the exact return: no critic, minibatch or estimator"
        keys = ("critic_lr", "critic_steps", "replay", "tau", "minibatch", "estimator", "init")
        unread.update(dict.fromkeys(keys + ("explore_episodes", "explore_std"), why))
    else:
        if a.explore_episodes == 0:
            unread["explore_std"] = "the behaviour episodes' noise, and this run has none"
        if all(x in EXACT + DETERMINISTIC for x in algos):
            unread["estimator"] = (
                "it sets the score-function estimator's direct baseline and influence, and "
                "Theorem 3's deterministic-leader estimate of this run's methods has neither"
            )
    if not any(x in GUIDED for x in algos):
        unread["influence_cv"] = "it acts on BC-HG's guiding term, and this run has no BC-HG"
    if "bchg_det" not in algos:
        unread["reaction"] = "it sets the deterministic BC-HG's (bchg_det) follower reaction"
    if not any(clipped(x, a.clip_scope) for x in algos):
        unread["clip"] = f"--clip-scope {a.clip_scope} clips none of this run's methods"
    return unread


def validate_args(a):
    from bchg_jax.games.lqr.train import GUIDED, HParams
    from bchg_jax.problems.lqr_game import lqr_game
    from experiments.cli import check_counts, refuse_unread

    methods = methods_of(a.method, a.preset)
    check_counts(a, "seeds", "iterations", "chunk")
    refuse_unread(a, unread_flags(a, methods))
    if a.critic_steps < 0:  # before the grid's check, whose bound max(10, critic_steps) it sets
        raise ValueError(f"--critic-steps must be an integer >= 0, got {a.critic_steps}")
    for m in methods:
        config = train_config(a, m)
        if VARIANTS[m][0] in GUIDED:
            config.check_guide()
    HParams.from_grid(method_grid(a), max_steps=config.max_steps)
    saved = getattr(a, "_saved_iterations", a.iterations)
    if a.iterations > saved and a.actor_lr_schedule == "cosine":
        raise ValueError(
            f"--iterations {a.iterations}: this run's cosine learning rate decays over its "
            f"{saved} iterations; extending it would restart the decay (not the longer run). "
            "Start a new run, or use --actor-lr-schedule constant"
        )
    lqr_game()
    warmup = warmup_iterations(config)
    if warmup >= a.iterations:  # every method waits, the exact ones too (curves line up)
        import sys

        print(
            f"WARNING: the critic-only warm-up (--warmup-steps {a.warmup_steps}) lasts "
            f"{warmup} iterations and this run has --iterations {a.iterations}: no method "
            "updates the leader (the exact ones wait too, so that every curve starts its "
            "ascent at the same iteration), so J stays at its start. Use more iterations or "
            "fewer --warmup-steps.",
            file=sys.stderr,
            flush=True,
        )
    return methods


def warmup_iterations(config) -> int:
    """Outer iterations of the critic-only warm-up of a learned-critic trainer: the
    ``warmup_steps`` environment steps over the steps collected per iteration (actor and
    behaviour episodes), rounded up (``games.lqr.train.warmup_iterations``, as ``make_train``
    counts them)."""
    from bchg_jax.games.lqr.train import warmup_iterations as iterations
    from bchg_jax.problems.lqr_game import lqr_game

    return iterations(config, lqr_game().horizon)


def run_method(name: str, a, run_dir: str):
    import dataclasses

    from bchg_jax.games import lqr
    from bchg_jax.games.lqr.train import SCORE
    from bchg_jax.problems.lqr_game import gain_metrics, lqr_game
    from experiments.cli import follower_note
    from experiments.plot import YLABELS, pretty_label
    from experiments.run_folder import run_method_folder

    method, buffer = VARIANTS[name]
    config = train_config(a, name)
    trainer = lqr.make_train(lqr_game(), method, config, metrics_fn=gain_metrics)
    return run_method_folder(
        os.path.join(run_dir, name),
        name,
        trainer,
        method_grid(a),
        a,
        record={"train_config": dataclasses.asdict(config)},
        title=f"bi-level LQR game, {pretty_label(name)}: β={a.beta:g}, {a.seeds} seeds"
        + follower_note(config, ", follower "),
        window=SUMMARY_WINDOW,
        ylabel=YLABELS["lqr_game"],
        describe=f"bi-level LQR game {method} buffer={buffer}"
        + (f" estimator={a.estimator}" if method in SCORE else "")
        + follower_note(config, " follower="),
    )


def main(argv=None) -> str:
    from experiments.run_folder import run_experiment

    steps = (parse_args, validate_args, run_method, SETTING_KEYS, SUMMARY_WINDOW)
    return run_experiment("lqr_game", argv, *steps, config_flags=CONFIG_FLAGS)


if __name__ == "__main__":
    main()
