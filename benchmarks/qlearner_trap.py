"""Why HPGD (oracle) beats the best-response optimum against the soft Q-learner in Four-Rooms.

The follower study (``benchmarks/RESULTS.md``, "Followers off their best response") found HPGD
(oracle) at J_L ~ 6 against ``--follower q_learning --follower-lr 0.1`` at beta 1e-3, nine times
what any leader gets from a best responder. This script measures the mechanism:

1. **The leader's run.** HPGD (oracle) against the Q-learner (lr 0.1, 10% random actions), the
   study's settings (batch 1 x 100, lr 0.1, SARSA 0.5, beta 1e-3), with theta saved at
   ``--early`` (150) and ``--iterations`` (3000) iterations.
2. **What the data sees.** At theta0 with the learner's first (uniform) policy: visits to the
   leader's target cell T in the learner's own batch (100 steps from S) and in HPGD (oracle)'s
   extra segments (50 x 200 steps from uniformly random states).
3. **The learner alone against a fixed theta** for ``--batches`` batches (the trainer's batches
   and update, no leader): theta0, the leader's theta at ``--early`` and at the end, and at the
   early theta two controls: Q started at the entropy ceiling ``beta log B / (1 - gamma)`` instead
   of 0, and a hard-max target (``max_b Q(s', b)``, no entropy bonus) instead of
   ``beta logsumexp(Q(s') / beta)``.

For each learner: J_L at the policy it plays (the trainer's metric: the exact value on the
follower's model), the chance that its policy reaches the goal G within 100 steps of the sampled
MDP, the visits to T per batch over the last 500 batches, and how many seeds are *trapped*
(P(G) < 0.1).

Usage (repository root; about 2 minutes on a CPU: 81 s on one core, 2026-12-04)::

    python -m benchmarks.qlearner_trap [--seeds 10] [--early 150] [--iterations 3000]
        [--batches 3000] [--follower-lr 0.1] [--out benchmarks/results/qlearner_trap]
"""

from __future__ import annotations

import argparse
import functools
import os
import time

import jax
import jax.numpy as jnp
import numpy as np

from bchg_jax.core.follower_model import FollowerModel, soft_q_learning
from bchg_jax.core.io import atomic_write_bytes
from bchg_jax.core.sweep import run_grid
from bchg_jax.problems.fourrooms import fourrooms, fourrooms_cells
from bchg_jax.tabular.exact import leader_objective, leader_values, policy_matrix
from bchg_jax.tabular.follower_models import q_learning_policy, q_learning_update
from bchg_jax.tabular.rollout import rollout
from bchg_jax.tabular.train import TrainConfig, make_train

BETA, EXPLORE = 1e-3, 0.1
NUM_STEPS = 100  # the study's batch: 1 stream x 100 steps
TRAPPED_BELOW = 0.1  # P(reach G within 100 steps) below this: the learner is trapped


def leader_run(problem, seeds: int, early: int, iterations: int, follower_lr: float):
    """HPGD (oracle) against the Q-learner: theta [seeds, d] at ``early`` and at ``iterations``,
    the learner's final table [seeds, S, B], J [seeds, iterations] and the config."""
    config = TrainConfig(
        num_envs=1,
        num_steps=NUM_STEPS,
        iterations=iterations,
        follower=FollowerModel("q_learning", lr=follower_lr, explore=EXPLORE),
    )
    trainer = make_train(problem, "hpgd_oracle", config)
    grid = {"lr": [0.1], "sarsa_alpha": [0.5], "beta": [BETA]}
    saved = {}

    def on_chunk(state, metrics, done):
        saved[done] = np.asarray(state.theta)[0]

    state, metrics = run_grid(trainer, grid, seeds, iterations, early, on_chunk=on_chunk)
    Q = np.asarray(state.follower)[0]
    return saved[early], saved[iterations], Q, np.asarray(metrics["J"])[0], config


def hard_q_learning_update(Q, batch, r, gamma, lr):
    """The control without the entropy bonus: the target bootstraps ``max_b Q(s', b)``."""
    S, B = Q.shape
    s, b, s2 = (x.T.reshape(-1) for x in (batch.s, batch.b, batch.s_next))
    cont = 1.0 - batch.terminal.T.reshape(-1).astype(Q.dtype)

    def next_value(flat, j):
        return jnp.max(flat.reshape(S, B)[s2[j]])

    return soft_q_learning(Q.reshape(-1), s * B + b, r[s, b], next_value, cont, lr, gamma).reshape(
        S, B
    )


@functools.partial(jax.jit, static_argnames=("problem", "batches", "hard"))
def learner_alone(problem, theta, Q0, keys, lr, batches: int, hard: bool = False):
    """The trainer's Q-learner against a fixed theta, one lane per seed.

    Args:
      theta: [N, d] a theta per seed. Q0: [N, S, B] starting tables. keys: [N] PRNG keys.
      lr: the learner's step size.
    Returns:
      (final Q [N, S, B], visits to T per batch [N, batches]).
    """
    _, marks = fourrooms_cells()
    terminal = jnp.asarray(problem.terminal)

    def one(theta, Q, key):
        P = problem.sampler_transition(theta)
        rho, r = problem.init_dist(theta), problem.follower_reward(theta)

        def step(Q, k):
            policy = q_learning_policy(Q, BETA, EXPLORE)
            batch = rollout(k, policy, P, rho, terminal, problem.time_limit, 1, NUM_STEPS)
            if hard:
                Q = hard_q_learning_update(Q, batch, r, problem.gamma_F, lr)
            else:
                Q = q_learning_update(Q, batch, r, BETA, problem.gamma_F, lr)
            return Q, jnp.sum(batch.s == marks["T"])

        return jax.lax.scan(step, Q, jax.random.split(key, batches))

    return jax.vmap(one)(theta, Q0, keys)


@functools.partial(jax.jit, static_argnames=("problem",))
def describe(problem, theta, Q):
    """Per seed: J_L at the played policy (the trainer's metric: exact, infinite horizon, on the
    follower's model), the same policy's expected leader return in the *sampled* MDP over one
    ``time_limit``-step episode (what the environment pays, computed apart from the metric's
    solver by propagating the state distribution), and the chance that the played policy reaches
    G within ``NUM_STEPS`` steps of the sampled MDP."""
    _, marks = fourrooms_cells()
    cont = 1.0 - jnp.asarray(problem.terminal, Q.dtype)

    def one(theta, Q):
        policy = q_learning_policy(Q, BETA, EXPLORE)
        V_L, _ = leader_values(problem, theta, policy)
        J = jnp.dot(problem.init_dist(theta), V_L) + problem.regularizer(theta)
        M = cont[:, None] * policy_matrix(problem.sampler_transition(theta), policy)
        r = jnp.sum(policy * problem.leader_reward(theta), -1)

        def step(carry, t):  # mass still moving; G pays once and absorbs (cont 0)
            d, ret = carry
            return (d @ M, ret + problem.gamma_L**t * jnp.dot(d, r)), None

        start = (problem.init_dist(theta), jnp.zeros((), Q.dtype))
        (_, episode), _ = jax.lax.scan(step, start, jnp.arange(problem.time_limit))
        _, at_goal = jax.lax.scan(lambda d, _: (d @ M, d[marks["G"]]), start[0], None, NUM_STEPS)
        return J, episode + problem.regularizer(theta), jnp.sum(at_goal)

    return jax.vmap(one)(theta, Q)


def penalty_map(problem, theta):
    """Mean over seeds of: the mean penalty on T and its 8 neighbours, the mean on the other
    cells (G excluded), and how many cells' penalty is below the learner's entropy bonus
    ``gamma beta log B`` (module docstring), for theta [N, d]."""
    cells, marks = fourrooms_cells()
    tr, tc = cells[marks["T"]]
    near = np.array([max(abs(r - tr), abs(c - tc)) <= 1 for r, c in cells])
    other = ~near
    other[marks["G"]] = False
    B = problem.transition(problem.theta0).shape[1]
    bonus = problem.gamma_F * BETA * np.log(B)
    pen = -np.asarray(jax.vmap(problem.follower_reward)(theta))[:, :, 0]  # [N, S]
    below = np.sum((pen < bonus) & (near | other)[None], axis=1)
    return pen[:, near].mean(), pen[:, other].mean(), below.mean(), bonus


def coverage(problem, config, samples: int = 200):
    """Mean visits to T at theta0 under the learner's first policy (Q = 0, so uniform): in its
    own batch and in HPGD (oracle)'s extra segments."""
    _, marks = fourrooms_cells()
    S, B = problem.transition(problem.theta0).shape[:2]
    theta = problem.theta0
    P, terminal = problem.sampler_transition(theta), jnp.asarray(problem.terminal)
    policy = jnp.full((S, B), 1.0 / B)
    uniform = jnp.full((S,), 1.0 / S)

    @jax.jit
    def visits(key):
        k1, k2 = jax.random.split(key)
        own = rollout(
            k1, policy, P, problem.init_dist(theta), terminal, problem.time_limit, 1, NUM_STEPS
        )
        extra = rollout(
            k2,
            policy,
            P,
            uniform,
            terminal,
            problem.time_limit,
            config.oracle_envs,
            config.oracle_steps,
        )
        return jnp.sum(own.s == marks["T"]), jnp.sum(extra.s == marks["T"])

    own, extra = jax.vmap(visits)(jax.random.split(jax.random.key(7), samples))
    return float(np.mean(own)), float(np.mean(extra)), config.oracle_envs, config.oracle_steps


def table_row(name, J, reach, visits):
    J, reach, visits = np.asarray(J, np.float64), np.asarray(reach), np.asarray(visits)
    se = J.std(ddof=1) / np.sqrt(len(J)) if len(J) > 1 else float("nan")
    trapped = int(np.sum(reach < TRAPPED_BELOW))
    return (
        f"| {name} | {J.mean():+.2f} +- {se:.2f} | {reach.mean():.2f} | "
        f"{visits[:, -500:].mean():.1f} | {trapped}/{len(J)} |"
    )


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", type=int, default=10)
    parser.add_argument("--early", type=int, default=150, help="the early theta's iteration")
    parser.add_argument("--iterations", type=int, default=3000, help="the leader's run")
    parser.add_argument("--batches", type=int, default=3000, help="the lone learner's batches")
    parser.add_argument("--follower-lr", type=float, default=0.1, help="the learner's step size")
    parser.add_argument(
        "--out",
        default="benchmarks/results/qlearner_trap",
        help="folder for table.md (default: the committed one's, benchmarks/results/"
        "qlearner_trap: a rerun regenerates it in place, and git diff shows what moved)",
    )
    args = parser.parse_args(argv)
    if args.seeds < 2 or args.early < 1 or args.batches < 500 or not 0 < args.follower_lr <= 1:
        parser.error("need --seeds >= 2, --early >= 1, --batches >= 500, 0 < --follower-lr <= 1")
    if args.iterations % args.early:
        parser.error("--iterations must be a multiple of --early (theta is saved per chunk)")

    problem = fourrooms("reference")
    t0 = time.time()
    lr = args.follower_lr
    early, final, Q_run, J_run, config = leader_run(
        problem, args.seeds, args.early, args.iterations, lr
    )
    J_end, episode_end, reach_run = describe(problem, jnp.asarray(final), jnp.asarray(Q_run))
    J_best = np.asarray(
        jax.vmap(lambda th: leader_objective(problem, th, BETA))(jnp.asarray(final))
    )
    lead_s = time.time() - t0
    own, extra, envs, steps = coverage(problem, config)

    S, B = problem.transition(problem.theta0).shape[:2]
    N = args.seeds
    zeros = jnp.zeros((N, S, B))
    ceiling = BETA * np.log(B) / (1.0 - problem.gamma_F)
    theta0 = jnp.broadcast_to(problem.theta0, (N,) + problem.theta0.shape)
    keys = jax.random.split(jax.random.key(123), N)
    cases = [
        ("theta0 (uniform penalty), Q0 = 0", theta0, zeros, False),
        (f"leader's theta at iteration {args.early}, Q0 = 0", jnp.asarray(early), zeros, False),
        (
            f"leader's theta at iteration {args.iterations}, Q0 = 0",
            jnp.asarray(final),
            zeros,
            False,
        ),
        (
            f"theta at {args.early}, Q0 = ceiling {ceiling:.4f}",
            jnp.asarray(early),
            jnp.full((N, S, B), ceiling),
            False,
        ),
        (f"theta at {args.early}, hard-max target, Q0 = 0", jnp.asarray(early), zeros, True),
    ]
    rows = []
    t1 = time.time()
    for name, theta, Q0, hard in cases:
        Q, visits = learner_alone(problem, theta, Q0, keys, lr, args.batches, hard)
        J, _, reach = describe(problem, theta, Q)
        rows.append(table_row(name, J, reach, visits))
        print(rows[-1], flush=True)
    alone_s = time.time() - t1

    maps = [
        ("theta0", penalty_map(problem, theta0)),
        (f"iteration {args.early}", penalty_map(problem, jnp.asarray(early))),
        (f"iteration {args.iterations}", penalty_map(problem, jnp.asarray(final))),
    ]
    bonus = maps[0][1][3]
    last = min(500, args.iterations)
    blocks = J_run.reshape(N, -1, args.early).mean(-1).mean(0)
    lines = [
        "# The soft Q-learner's trap (Four-Rooms, beta 1e-3)",
        "",
        f"`python -m benchmarks.qlearner_trap --seeds {N} --early {args.early} "
        f"--iterations {args.iterations} --batches {args.batches} --follower-lr {lr}`; "
        f"{time.strftime('%Y-%m-%d')}, "
        f"jax {jax.__version__}, {jax.default_backend()}; leader run {lead_s:.0f} s, lone "
        f"learners {alone_s:.0f} s.",
        "",
        f"HPGD (oracle) against the Q-learner (lr {lr}, {EXPLORE:.0%} random actions), "
        f"{N} seeds: J_L over its last {last} iterations "
        f"{J_run[:, -last:].mean():+.3f} +- {J_run[:, -last:].mean(1).std(ddof=1) / np.sqrt(N):.3f}"
        f"; mean J per {args.early}-iteration block: "
        + ", ".join(f"{v:+.2f}" for v in blocks)
        + f"; trapped at the end: {int(np.sum(np.asarray(reach_run) < TRAPPED_BELOW))}/{N} seeds.",
        "",
        f"At iteration {args.iterations}, mean over seeds: the metric (played policy, follower's "
        f"model, infinite horizon) {np.mean(J_end):+.3f}; the same policy's expected return over "
        f"one {problem.time_limit}-step episode of the sampled MDP {np.mean(episode_end):+.3f}; "
        f"a best responder at the leader's theta {np.mean(J_best):+.3f} (per seed: "
        + ", ".join(f"{v:+.2f}" for v in J_best)
        + ").",
        "",
        "Penalty per cell (mean over seeds; the learner's entropy bonus gamma beta log B = "
        f"{bonus:.2e}): "
        + "; ".join(
            f"{name}: {a:.2e} on T and its neighbours, {b:.2e} elsewhere, {c:.0f} cells below the "
            "bonus"
            for name, (a, b, c, _) in maps
        )
        + ".",
        "",
        f"Visits to T at theta0 under the learner's first (uniform) policy, mean of 200 draws: "
        f"{own:.2f} in its own batch (1 x {NUM_STEPS} steps from S), {extra:.1f} in HPGD "
        f"(oracle)'s extra segments ({envs} x {steps} steps from uniform states).",
        "",
        f"The learner alone against a fixed theta, {args.batches} batches, {N} seeds "
        "(J_L: exact, at the played policy, on the follower's model; P(G): its policy reaches G "
        f"within {NUM_STEPS} steps of the sampled MDP; trapped: P(G) < {TRAPPED_BELOW}):",
        "",
        "| fixed theta, learner | J_L | P(G) | T visits per batch (last 500) | trapped |",
        "|---|---|---|---|---|",
        *rows,
        "",
    ]
    os.makedirs(args.out, exist_ok=True)
    path = os.path.join(args.out, "table.md")
    atomic_write_bytes(path, "\n".join(lines).encode())
    print("\n".join(lines[:8]))
    print(f"table: {path}")


if __name__ == "__main__":
    main()
