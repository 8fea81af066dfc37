"""Two LQR-game studies that are not methods, written as estimator pieces: the shuffled-Benefit
control and the median-relative bound of the guiding term.

``python -m benchmarks.lqr_game_controls [--seeds 20] [--iterations 500] [--actor-steps 10]`` runs
the control: BC-HG under the reference preset (``bchg_jax.games.lqr.presets.reference``) whose
guiding term pairs each sample's influence sum with the Benefit of another minibatch sample
(:func:`shuffled`, a random permutation): the term keeps its noise and loses its mean. It prints the
mean +- SE over seeds of the exact return over the last 50 iterations next to plain BC-HG's on the
same seeds. (Before the estimator options became pieces, 2026-11-28, this was ``python -m
experiments.lqr_game --estimator shuffled``; the permutation now draws from the Benefit's key, so
the numbers are the same control with other random draws.) Finding (``benchmarks/RESULTS.md``, 20
seeds x 500 iterations, 2026-11-28): 0.098 +- 0.033 against BC-HG's 0.174 +- 0.112 (medians 0.020; 5
and 6 of 20 seeds above 0.05).

:func:`median_bound` (before the estimator options became pieces, 2026-11-28:
``TrainConfig.guide_bound``) shrinks every sample's guiding gradient to at most ``b`` times the
minibatch median norm; ``python -m benchmarks.lqr_game_learned_quality --set guide_bound=3``
measures it (finding: it removes the K_2 signal on the slope, ``benchmarks/RESULTS.md``).
"""

from __future__ import annotations

import argparse
import dataclasses

import jax
import jax.numpy as jnp
import numpy as np

from bchg_jax.games import guide, lqr
from bchg_jax.games.lqr.estimator import Estimator

WINDOW = 50


def shuffled(benefit):
    """The Benefit piece ``benefit`` with its values permuted across the minibatch (the control:
    each influence sum gets another sample's Benefit)."""

    def piece(Q, resp, key, s, a, b, q):
        return jax.random.permutation(jax.random.fold_in(key, 1), benefit(Q, resp, key, s, a, b, q))

    return piece


def median_bound(b: float):
    """A guide piece: every sample's guiding gradient shrunk to norm at most ``b`` times the
    minibatch median (:func:`bchg_jax.games.guide.shrink`; a robust mean, biased)."""
    return guide.shrink(lambda norm: b * jnp.median(norm))


def with_guide(est: Estimator, *pieces) -> Estimator:
    """``est`` with ``pieces`` run after its own guide pieces."""
    return est._replace(guide=tuple(est.guide) + pieces)


def main(argv=None):
    from bchg_jax.core.sweep import run_grid
    from bchg_jax.problems.lqr_game import lqr_game

    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--seeds", type=int, default=20)
    p.add_argument("--seed", type=int, default=0, help="base seed")
    p.add_argument("--iterations", type=int, default=500)
    p.add_argument("--actor-steps", type=int, default=10)
    a = p.parse_args(argv)
    if min(a.seeds, a.iterations, a.actor_steps) < 1:
        p.error("--seeds, --iterations and --actor-steps must be >= 1")
    preset = lqr.presets.reference()
    config = dataclasses.replace(preset.config_for("bchg"), iterations=a.iterations)
    est = lqr.estimator(config.estimator)
    grid = {"actor_steps": [a.actor_steps], "critic_steps": [int(preset.hparams.critic_steps)]}
    grid["beta"] = [float(preset.hparams.beta)]
    control = est._replace(benefit=shuffled(est.benefit))
    for label, pieces in (("BC-HG", est), ("BC-HG, Benefit shuffled", control)):
        trainer = lqr.make_train(lqr_game(), "bchg", config, estimator_pieces=pieces)
        _, m = run_grid(
            trainer, grid, seeds=a.seeds, iterations=a.iterations, base_seed=a.seed, verbose=False
        )
        final = np.asarray(m["J"])[0, :, -WINDOW:].mean(-1)
        se = final.std(ddof=1) / np.sqrt(len(final)) if len(final) > 1 else float("nan")
        print(
            f"{label}: {final.mean():.3f} +- {se:.3f} (mean +- SE of the last {WINDOW}), "
            f"median {np.median(final):.3f}, seeds > 0.05: {int((final > 0.05).sum())}/{len(final)}"
        )


if __name__ == "__main__":
    main()
