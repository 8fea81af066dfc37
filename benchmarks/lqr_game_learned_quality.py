"""Quality of the LQR game's hypergradient estimators with *learned* critics (explore preset).

``python -m benchmarks.lqr_game_learned_quality [--critics 4] [--train 200] [--batches 50]
[--critic-steps N] [--same-data]``

At each leader gain K (held fixed: ``actor_steps = 0``) ``--critics`` independent critics are
trained for ``--train`` iterations (``--critic-steps`` updates each, default the preset's) on
the explore preset's data (2 target-policy episodes and the preset's behaviour episodes
``a = K s + 0.5 eps`` per iteration, its replay ring and target rate). The tables in
``benchmarks/results/lqr_game/`` were made with the preset values of their time: the
``learned_quality_start_c10`` / ``_start_c20`` tables and ``learned_quality_edge`` /
``_guide_bound`` with 2 behaviour episodes, a ring of 40 and 10 critic steps (today:
``--set explore_episodes=2 replay=40 --critic-steps 10``; ``_start_c20`` with 20 and
``_start_explore6_c20`` with 6 behaviour episodes, as their first lines say), the older ones
also with ``replay=200 tau=0.05``; each table's first line names its minibatch and, in the
tables made since the flag exists, its critic steps. Then each estimator (the trainer's
own ``actor_grad`` on a fresh batch of 2 target-policy episodes (``a = K s`` for the
deterministic methods since 2026-11-28, as their trainer collects; the Gaussian leader's
before, which at U = 1e-3 moves the actions by ~1e-3) and the preset's actor
minibatch of steps drawn ~ gamma_L^t) is computed on ``--batches`` batches per critic and
multiplied by ``sum_{t<T} gamma_L^t`` (the minibatch averages over the discounted state
distribution). Reported per estimator and K: the exact hypergradient (of the discounted
100-step return, float64) and its direct part, the mean estimate, the bias
``|mean - exact| / |exact|`` over all critics and batches, the spread of the per-critic means
(``critic sd / norm``: what one training run sees as a persistent bias), the per-batch
std / norm, the mean cosine of a batch to the exact gradient, the cosine of the mean, for the
Naive-PGD rows the cosine of the mean to the *direct* part (what Naive-PGD estimates), and per
coordinate of theta the signal-to-noise ratio ``mean / std`` over all batches (what sets the
pace of a per-coordinate normalised step such as Adam's). ``--methods`` picks estimators;
``--set minibatch=256`` changes the actor's minibatch; ``--same-data`` trains every critic on
the same stream of episodes and minibatches, so that their spread is that of the
initialisation alone.
Machine and jax version are printed first.
"""

from __future__ import annotations

import argparse
import dataclasses
import platform
import time

import jax
import jax.numpy as jnp
import numpy as np

from bchg_jax.core.buffers import buffer_add, sample_discounted
from bchg_jax.games import lqr
from bchg_jax.games.lqr.train import DETERMINISTIC
from bchg_jax.problems.lqr_game import lqr_game
from benchmarks.lqr_game_controls import median_bound, with_guide

GAINS = ((-1.0, 0.0), (-4.0, 0.0), (-7.0, 0.0), (-9.0, -9.0))
METHODS = ("bchg", "bchg_det", "naive", "naive_det")


# the flat TrainConfig field names of the commands in benchmarks/RESULTS.md (before the config
# was nested) -> their place today
FIELDS = {
    "explore_episodes": "exploration.episodes",
    "explore_std": "exploration.std",
    "warmup_steps": "exploration.warmup_steps",
    "replay": "critic.replay",
    "critic_lr": "critic.lr",
    "critic_minibatch": "critic.minibatch",
    "target_samples": "critic.target_samples",
    "normalize": "critic.normalize",
    "q_scale": "critic.q_scale",
    "actor_lr": "actor.lr",
    "influence_cv": "estimator.influence_cv",
    "benefit_samples": "estimator.benefit_samples",
    "baseline_samples": "estimator.baseline_samples",
    "direct_baseline": "estimator.direct_baseline",
    "influence": "estimator.influence",
}


def with_settings(config: lqr.TrainConfig, changes: dict) -> lqr.TrainConfig:
    """``config`` with ``changes`` {field or part.field (or a name of :data:`FIELDS`): value},
    each value converted to the field's type."""
    for name, value in changes.items():
        part, _, field = FIELDS.get(name, name).rpartition(".")
        holder = getattr(config, part) if part else config
        old = getattr(holder, field)
        value = (value == "True") if isinstance(old, bool) else type(old)(value)
        holder = dataclasses.replace(holder, **{field: value})
        config = dataclasses.replace(config, **{part: holder}) if part else holder
    return config.validate()


def explore_config(iterations: int, changes: dict) -> lqr.TrainConfig:
    """The explore preset's TrainConfig (``bchg_jax.games.lqr.presets.explore``; no warm-up, a
    constant actor step: the gains are held fixed here), with ``changes``."""
    c = lqr.presets.explore().config
    c = dataclasses.replace(
        c,
        iterations=iterations,
        actor=dataclasses.replace(c.actor, lr_schedule="constant"),
        exploration=dataclasses.replace(c.exploration, warmup_steps=0),
    )
    return with_settings(c, changes)


def exact_parts(game, theta):
    """(full, direct) exact hypergradient of the discounted 100-step return, in float64."""
    jax.config.update("jax_enable_x64", True)
    try:
        full, direct = lqr.hypergradient_split(
            game, jnp.asarray(theta, jnp.float64), 0.1, gamma=game.gamma_L
        )
        return np.asarray(full), np.asarray(direct)
    finally:
        jax.config.update("jax_enable_x64", False)


def main(argv=None):
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--critics", type=int, default=4, help="independently trained critics per K")
    p.add_argument("--train", type=int, default=200, help="critic training iterations at K")
    p.add_argument("--batches", type=int, default=50, help="estimates per critic")
    p.add_argument(
        "--critic-steps",
        type=int,
        default=int(lqr.presets.explore().hparams.critic_steps),
        help="critic updates per training iteration (default: the preset's)",
    )
    p.add_argument(
        "--same-data",
        action="store_true",
        help="train every critic on the same episodes and minibatches (only the "
        "initialisations differ): the critic sd then measures the part of the "
        "per-critic error that comes from the initialisation",
    )
    p.add_argument(
        "--gains",
        default=";".join(f"{k1:g},{k2:g}" for k1, k2 in GAINS),
        help="leader gains K1,K2 separated by ';'",
    )
    p.add_argument(
        "--methods",
        default=",".join(METHODS),
        help="estimators, comma-separated, from " + ", ".join(METHODS),
    )
    p.add_argument(
        "--set",
        nargs="*",
        default=[],
        metavar="FIELD=VALUE",
        help="TrainConfig fields to change from the explore preset (e.g. "
        "estimator.influence_cv=False, critic.replay=40; the flat names of older commands "
        "too, e.g. replay=40; guide_bound=B adds benchmarks.lqr_game_controls.median_bound(B))",
    )
    a = p.parse_args(argv)
    methods = a.methods.split(",")
    if a.critic_steps < 1:
        p.error("--critic-steps must be >= 1")
    unknown = sorted(set(methods) - set(METHODS))
    if unknown:
        p.error(f"unknown --methods {unknown}; choose from {', '.join(METHODS)}")
    game, beta = lqr_game(), jnp.float32(0.1)
    gains = [tuple(float(x) for x in g.split(",")) for g in a.gains.split(";")]
    exact = {K: exact_parts(game, K) for K in gains}
    changes = dict(item.split("=", 1) for item in a.set)
    bound = changes.pop("guide_bound", None)
    config = explore_config(a.train, {"max_steps": max(10, a.critic_steps), **changes})
    est = lqr.estimator(config.estimator)
    if bound is not None and float(bound) > 0:
        est = with_guide(est, median_bound(float(bound)))
    trainers = {
        m: lqr.make_train(game, m, config, estimator_pieces=est) for m in ("bchg",) + tuple(methods)
    }
    hp = lqr.HParams(actor_steps=0, critic_steps=a.critic_steps, beta=0.1)
    T = game.horizon
    Z = float(np.sum(game.gamma_L ** np.arange(T)))
    print(
        f"# {platform.processor() or platform.machine()}, jax {jax.__version__}, "
        f"{time.strftime('%Y-%m-%d')}; {a.critics} critics x {a.train} training iterations "
        f"({a.critic_steps} critic steps each{', same data' if a.same_data else ''}), "
        f"{a.batches} batches each (2 episodes, minibatch {config.minibatch})"
    )
    print(
        "| K | estimator | exact (full; direct) | mean estimate | bias / norm | "
        "critic sd / norm | std / norm | mean cosine | cosine of mean | "
        "cosine of mean to direct | SNR per coordinate |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    print(f"# changes from the explore preset: {a.set or 'none'}")
    for K in gains:
        theta = jnp.asarray(K, jnp.float32)
        tr0 = trainers["bchg"]
        resp = tr0.steps["follower"](theta, beta)

        def trained(key):
            s0 = tr0.init(key, hp)._replace(actor=theta, actor_targ=theta, follower=resp.P)
            if a.same_data:  # one stream of episodes and minibatches; the inits differ
                s0 = s0._replace(key=jax.random.key(2))
            return tr0.run(s0, hp, a.train)[0]

        states = jax.jit(jax.vmap(trained))(jax.random.split(jax.random.key(0), a.critics))
        full, direct = exact[K]
        for m in methods:
            st = trainers[m].steps

            def est(state, key):
                k1, k2, k3 = jax.random.split(key, 3)
                stochastic = m not in DETERMINISTIC  # each method's own leader, as its trainer
                trj = lqr.rollout(k1, game, theta, resp, config.episodes, T, stochastic=stochastic)
                buf = buffer_add(state.buffer, trj.s, trj.a, trj.b, "on")
                e, t = sample_discounted(k2, buf, config.minibatch, game.gamma_L)
                return st["actor_grad"](theta, state.critic, resp, beta, k3, e, t, buf)

            g = jax.jit(
                jax.vmap(
                    lambda s, k: jax.vmap(lambda kk: est(s, kk))(jax.random.split(k, a.batches))
                )
            )(states, jax.random.split(jax.random.key(1), a.critics))
            g = Z * np.asarray(g, np.float64)  # [critics, batches, 2]
            nf = np.linalg.norm(full)
            flat = g.reshape(-1, g.shape[-1])
            mean = flat.mean(0)
            cos = flat @ full / (np.linalg.norm(flat, axis=1) * nf + 1e-300)
            cm = mean @ full / (np.linalg.norm(mean) * nf)
            cd = mean @ direct / (np.linalg.norm(mean) * np.linalg.norm(direct))
            # the spread of the per-critic means, a sample standard deviation (ddof=1) over the
            # few critics (4 by default: ddof=0 would read it 13% low)
            critic_sd = np.linalg.norm(g.mean(1).std(0, ddof=1)) / nf if len(g) > 1 else np.nan
            std = np.linalg.norm(np.sqrt(((g - g.mean(1, keepdims=True)) ** 2).mean((0, 1)))) / nf
            vec = lambda v: "(" + ", ".join(f"{x:+.3g}" for x in v) + ")"  # noqa: E731
            print(
                f"| ({K[0]:g},{K[1]:g}) | {m} | {vec(full)}; {vec(direct)} | {vec(mean)} | "
                f"{np.linalg.norm(mean - full) / nf:.3f}"
                f" | {critic_sd:.3f} | {std:.3f} | {cos.mean():+.3f} | {cm:+.3f} | "
                + (f"{cd:+.3f} |" if m.startswith("naive") else "- |")
                + f" {vec(mean / (flat.std(0) + 1e-300))} |",
                flush=True,
            )


if __name__ == "__main__":
    main()
