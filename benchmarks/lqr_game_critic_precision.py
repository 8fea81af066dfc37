"""How much TF32 blurs the LQR-game critic's action differences (why the explore preset's critic
runs at full precision).

``python -m benchmarks.lqr_game_critic_precision [--episodes 64]``: at a few leader gains K,
the Gaussian leader's episodes (noise U = 1e-3) are rolled out; a 64x64 critic MLP (the explore
preset's shape, random weights) is applied to its inputs standardised as the preset does (the
batch's mean and std), and the differences ``Q(s, a + U eps, b) - Q(s, a, b)`` that the
score-function estimate is built from are computed at full float32 and under TF32 emulated on
the CPU (``core.reduced_precision``). Prints the median relative error of the TF32 differences
and their correlation with the exact ones.
"""

from __future__ import annotations

import argparse

import jax
import jax.numpy as jnp
import numpy as np

from bchg_jax import games, problems
from bchg_jax.core.networks import MLP
from bchg_jax.core.reduced_precision import emulate_reduced_precision


def main(argv=None):
    p = argparse.ArgumentParser(
        prog="python -m benchmarks.lqr_game_critic_precision",
        description=__doc__.split("\n\n")[0],
    )
    p.add_argument("--episodes", type=int, default=64)
    p.add_argument("--gains", default="-1,0;-4,0;-9,-9", help="leader gains K, ';'-separated")
    a = p.parse_args(argv)
    game = problems.lqr_game()
    net = MLP((64, 64), 1)
    print("| K | std of a | median TF32 error / difference | correlation |")
    print("|---|---|---|---|")
    for gain in a.gains.split(";"):
        theta = jnp.asarray([float(v) for v in gain.split(",")])
        resp = games.lqr.best_response(game, theta, 0.1)
        tr = games.lqr.rollout(jax.random.key(0), game, theta, resp, a.episodes)
        s, act, b = tr.s[:, :-1].reshape(-1, 2), tr.a.reshape(-1, 1), tr.b.reshape(-1, 1)
        x = jnp.concatenate([s, act, b], -1)
        mean, std = x.mean(0), x.std(0) + 1e-3
        params = net.init(jax.random.key(1), x[:1])
        moved = act + jnp.asarray(game.U)[0, 0] * jax.random.normal(jax.random.key(2), act.shape)

        def difference(alt):
            def q(aa):
                return net.apply(params, (jnp.concatenate([s, aa, b], -1) - mean) / std)[:, 0]

            return q(alt) - q(act)

        exact = np.asarray(jax.jit(difference)(moved))
        with emulate_reduced_precision():
            tf32 = np.asarray(jax.jit(difference)(moved))
        rel = np.abs(tf32 - exact) / np.maximum(np.abs(exact), 1e-30)
        corr = np.corrcoef(tf32, exact)[0, 1]
        print(f"| ({gain}) | {float(std[2]):.3g} | {np.median(rel):.2f} | {corr:.3f} |")


if __name__ == "__main__":
    main()
