"""A new 2-player Markov game in a few dozen lines: a road toll.

Two states (road free / congested). Each step the city (leader) sets a toll, low or high; the
driver (follower, who sees the toll) drives or takes transit. Driving pays 1 minus the toll,
minus 1.2 on a congested road, and congests the road with probability 0.8; transit pays 0.2 and
frees it with probability 0.8. The city wants a free road and some toll revenue. The leader's
parameters are the logits of a tabular softmax policy f_theta(a|s); the follower plays the
soft-Q best response (Theorem 2's Bellman equation).

    python examples/custom_game.py [--iterations 300]     (from anywhere: give its path)

Prints the exact hypergradient (implicit differentiation through the follower's fixed point),
the part of it that comes from the follower re-optimising (what Naive-PGD leaves out: the
leader's gradient with the follower's policy g(b|s,a) held fixed is the rest), the mean BC-HG
estimate with exact critics (Theorem 2) with its cosine and relative error
||mean - exact|| / ||exact|| to the exact one, and the exact leader return after actor-critic
training with BC-HG and with Naive-PGD.
"""

from __future__ import annotations

import argparse

import jax
import jax.numpy as jnp
import numpy as np

from bchg_jax.games import tabular as games
from bchg_jax.games.tabular import TabularGame

FREE, CONGESTED = 0, 1
LOW, HIGH = 0, 1
DRIVE, TRANSIT = 0, 1


def road_toll() -> TabularGame:
    P = np.zeros((2, 2, 2, 2))  # [s, a, b, s']
    P[:, :, DRIVE] = [0.2, 0.8]
    P[:, :, TRANSIT] = [0.8, 0.2]
    toll = np.array([0.0, 0.8])
    rF = np.zeros((2, 2, 2))  # [s, a, b]
    rF[:, :, DRIVE] = 1.0 - toll[None, :] - 1.2 * np.array([0.0, 1.0])[:, None]
    rF[:, :, TRANSIT] = 0.2
    rL = np.zeros((2, 2, 2))
    rL[FREE] += 1.0  # a free road
    rL[:, :, DRIVE] += 0.5 * toll[None, :]  # toll revenue
    return TabularGame(
        jnp.asarray(P, jnp.float32),
        jnp.asarray([1.0, 0.0]),
        jnp.asarray(rF, jnp.float32),
        jnp.asarray(rL, jnp.float32),
        gamma_F=0.9,
        gamma_L=0.9,
        time_limit=100,
        name="road_toll",
    ).validate()


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--iterations", type=int, default=300)
    p.add_argument("--beta", type=float, default=0.1)
    a = p.parse_args(argv)
    if a.iterations < 1 or not a.beta > 0:  # before the checks below spend their seconds
        p.error(f"need --iterations >= 1 and --beta > 0, got {a.iterations} and {a.beta}")
    game, beta = road_toll(), a.beta
    theta = jnp.zeros((2, 2))  # logits of f(a|s): uniform tolls
    policy = lambda th: jax.nn.softmax(th, -1)  # noqa: E731

    def J(th):  # exact discounted leader objective
        br = games.best_response(game, policy(th), beta, backup="paper")
        V, _ = games.leader_values(game, policy(th), br.policy)
        return jnp.dot(game.init_dist, V)

    exact = jax.jit(jax.grad(J))(theta)  # jitted: one compiled program

    def J_follower_fixed(th):  # the follower's policy held at theta's
        br = games.best_response(game, policy(theta), beta, backup="paper")
        return jnp.dot(game.init_dist, games.leader_values(game, policy(th), br.policy)[0])

    response_part = exact - jax.jit(jax.grad(J_follower_fixed))(theta)
    # Theorem 2's estimate with exact critics, 20 batches of 200 episodes of 100 steps, against
    # the exact hypergradient (the library's check for a new game)
    (row,) = games.check_problem(
        game, policy, [theta], beta, backup="paper", episodes=200, batches=20, verbose=False
    )
    est, cos, rel = row["mean"].reshape(theta.shape), row["cosine"], row["rel_error"]

    finals = {}
    for method in ("bchg", "naive"):
        config = games.TrainConfig(
            iterations=a.iterations, actor="tabular", backup="paper", actor_lr=0.05
        )
        trainer = games.make_train(game, method, config)
        hp = games.HParams(actor_steps=2, critic_steps=5, beta=beta)
        _, m = trainer.train(jax.random.key(2), hp)
        finals[method] = (float(m["J"][0]), float(np.asarray(m["J"])[-20:].mean()))
    print(f"exact hypergradient (logits [s, a]):\n{np.round(np.asarray(exact), 4)}")
    print(f"  of which the follower's re-optimisation:\n{np.round(np.asarray(response_part), 4)}")
    print(
        f"BC-HG estimate (20 x 200 episodes):\n{np.round(np.asarray(est), 4)}  cosine {cos:.3f}"
        f"  relative error {100 * rel:.1f}%"
    )
    for method, (j0, j1) in finals.items():
        print(
            f"{method:>6}: leader return {j0:.2f} after the first update -> {j1:.2f} (the last "
            "20 iterations; exact, undiscounted, 100 steps)"
        )
    return {
        "exact": np.asarray(exact),
        "response_part": np.asarray(response_part),
        "estimate": np.asarray(est),
        "cosine": cos,
        "rel_error": rel,
        "finals": finals,
    }


if __name__ == "__main__":
    main()
