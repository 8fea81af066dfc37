"""Quality of the bi-level LQR game's hypergradient estimators against the exact gradient.

``python -m benchmarks.lqr_game_estimator_quality [--batches N] [--episodes E]``

On the paper's instance (U = 1e-3, beta = 0.1, gamma_L = 0.99, gamma_F = 0.95) at a few leader
gains, every estimator is computed with *exact* critics (``exact_critic_estimate``: exact
Q_L^(h), exact follower quantities, Benefit from 16 follower samples) on batches of ``E``
episodes (default 4: one training iteration's data) of 100 leader steps, plus the steps the
follower's influence sums need to lose at most 1e-3 of their discount weight (135 at gamma_F =
0.95: ``influence_steps``). Reported per estimator: the exact hypergradient's norm, the bias
|mean - exact| / |exact| (with the standard error of that mean), the per-batch standard
deviation / |exact| and the mean cosine between a batch's estimate and the exact gradient.
The learned critic of the training runs can only make these numbers worse.
"""

from __future__ import annotations

import argparse
import platform

import jax
import jax.numpy as jnp
import numpy as np

from bchg_jax.games.lqr.exact import (
    exact_critic_estimate,
    exact_hypergradient,
    influence_steps,
)
from bchg_jax.problems.lqr_game import lqr_game

VARIANTS = {  # name: (stochastic, guide, direct_baseline, influence)
    "BC-HG, reference estimator (same-b baseline, raw V_F)": (True, "benefit", "same_b", "raw"),
    "BC-HG, unbiased (same-noise baseline, V_F baseline)": (
        True,
        "benefit",
        "same_noise",
        "baseline",
    ),
    "BC-HG, exact V_L baseline": (True, "benefit", "value", "baseline"),
    "Naive-PGD (same-b baseline)": (True, "none", "same_b", "raw"),
    "BC-HG, deterministic leader": (False, "benefit", "value", "baseline"),
    "Naive-PGD, deterministic leader": (False, "none", "value", "baseline"),
}


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--batches", type=int, default=50)
    p.add_argument("--episodes", type=int, default=4)
    p.add_argument("--gains", default="-1,0;-4,0;-7,0")
    a = p.parse_args(argv)
    jax.config.update("jax_enable_x64", True)  # in main: importing the module changes nothing
    game, beta = lqr_game(), 0.1
    print(
        f"# {platform.processor() or platform.machine()}, jax {jax.__version__}, "
        f"{a.batches} batches x {a.episodes} episodes of 100 + {influence_steps(game)} steps, "
        "exact critics"
    )
    print("| K | estimator | exact norm | bias / norm | SE of bias | std / norm | mean cosine |")
    print("|---|---|---|---|---|---|---|")
    for gain in a.gains.split(";"):
        th = jnp.array([float(x) for x in gain.split(",")])
        for name, (stoch, guide, base, infl) in VARIANTS.items():
            exact = np.asarray(exact_hypergradient(game, th, beta, stochastic=stoch))
            one = lambda key: exact_critic_estimate(  # noqa: E731
                game,
                th,
                beta,
                key,
                episodes=a.episodes,
                leader_steps=100,
                extra_steps=influence_steps(game),
                stochastic=stoch,
                guide=guide,
                direct_baseline=base,
                influence=infl,
            )
            est = np.asarray(
                jax.jit(lambda ks: jax.lax.map(one, ks))(
                    jax.random.split(jax.random.PRNGKey(0), a.batches)
                )
            )
            norm = np.linalg.norm(exact)
            bias = np.linalg.norm(est.mean(0) - exact) / norm
            se = np.linalg.norm(est.std(0, ddof=1)) / np.sqrt(a.batches) / norm
            std = np.sqrt(np.sum(est.var(0, ddof=1))) / norm
            cos = np.mean(est @ exact / (np.linalg.norm(est, axis=1) * norm + 1e-300))
            print(
                f"| ({gain}) | {name} | {norm:.2e} | {bias:.3f} | {se:.3f} | {std:.3g} | "
                f"{cos:+.3f} |",
                flush=True,
            )


if __name__ == "__main__":
    main()
