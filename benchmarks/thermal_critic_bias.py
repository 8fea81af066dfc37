"""The thermal leader critic's bias, paired against the exact critic on the same samples.

``python -m benchmarks.thermal_critic_bias [--batches 1000] [--episodes 100] [--critic
quadratic_loo]``: in float64, at theta0 and at a second theta, the trainer's BC-HG ``estimate``
step is run on ``--batches`` independent batches with the chosen leader critic and with the
exact one, each pair on the same keys (same episodes), and the mean of the differences is
reported relative to the exact hypergradient's norm, with its standard error and the largest
|z| over the 8 components. A learned critic whose estimate agrees with the exact critic's in
expectation adds no bias of its own (``docs/experiments.md``, "The LSTD leader critic's
in-sample bias").
"""

from __future__ import annotations

import argparse
import time

import jax
import jax.numpy as jnp
import numpy as np

from bchg_jax import lq
from bchg_jax.problems.thermal import thermal

# a second leader parameter, away from theta0 (the tests' W_BASE)
OTHER_THETA = (0.3, -0.5, 0.1, 0.8, -0.2, 0.4, -0.7, 0.0)
CHUNK = 100  # batches per vmapped call


def paired_bias(problem, theta, beta, critic, batches, episodes):
    """(relative mean difference, its SE, max |z|) of ``critic`` against the exact critic."""
    br = problem.best_response(theta, beta)
    g = np.asarray(lq.exact_hypergradient(problem, theta, beta, horizon=None))
    out = {}
    for name in (critic, "exact"):
        tr = lq.make_train(problem, "bchg", lq.TrainConfig(num_episodes=episodes, critic=name))
        step = tr.steps["estimate"]
        est = jax.jit(jax.vmap(lambda k1, k2, s=step: s(k1, k2, theta, beta, br, ())[0]))
        parts = []
        for c in range(0, batches, CHUNK):
            keys = jax.random.split(jax.random.key(c), 2 * CHUNK).reshape(2, CHUNK)
            parts.append(np.asarray(est(keys[0], keys[1])))
        out[name] = np.concatenate(parts)[:batches]
    d = out[critic] - out["exact"]
    mean, se = d.mean(0), d.std(0, ddof=1) / np.sqrt(len(d))
    norm = np.linalg.norm(g)
    return np.linalg.norm(mean) / norm, np.linalg.norm(se) / norm, float(np.abs(mean / se).max())


def main(argv=None):
    p = argparse.ArgumentParser(
        prog="python -m benchmarks.thermal_critic_bias", description=__doc__.split("\n\n")[0]
    )
    p.add_argument("--batches", type=int, default=1000)
    p.add_argument("--episodes", type=int, default=100)
    p.add_argument("--critic", default="quadratic_loo", choices=("quadratic_loo", "quadratic"))
    a = p.parse_args(argv)
    jax.config.update("jax_enable_x64", True)
    problem = thermal(dtype=jnp.float64)
    print(f"| theta | {a.critic} - exact, / norm | SE | max abs z |")
    print("|---|---|---|---|")
    t0 = time.perf_counter()
    for label, theta in (("theta0", problem.theta0), ("other", jnp.asarray(OTHER_THETA))):
        rel, se, z = paired_bias(problem, theta, 0.1, a.critic, a.batches, a.episodes)
        print(f"| {label} | {100 * rel:.2f}% | {100 * se:.2f}% | {z:.1f} |")
    print(f"({a.batches} batches of {a.episodes} episodes, {time.perf_counter() - t0:.0f} s)")


if __name__ == "__main__":
    main()
