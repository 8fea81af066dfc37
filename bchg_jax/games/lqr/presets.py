"""Named settings of the LQR-game trainer: :func:`explore` and :func:`reference`.

A :class:`Preset` is a complete :class:`~bchg_jax.games.lqr.config.TrainConfig`, the traced
hyperparameters (:class:`~bchg_jax.games.lqr.train.HParams`) and which methods' gradients are
clipped. ``python -m experiments.lqr_game --preset NAME`` and the benchmarks read them here
(``docs/experiments.md``, "Bi-level LQR Markov game", tells how each was measured):

* :func:`explore` (the CLI's default): learned critics with exploration. Every iteration
  collects 2 episodes of the leader's own policy and 6 behaviour episodes
  ``a = K s + 0.5 eps`` for the critic, which trains off-policy on a replay ring of the last 80
  episodes (20 steps per iteration, standardised inputs, 8 sampled follower actions in its TD
  target, target rate 0.2) after a 160,000-step critic-only warm-up; unbiased estimators with
  the guiding term's control variate; every method clipped; Adam 0.02 with a cosine decay;
  2000 iterations.
* :func:`reference`: the reference implementation's settings (on-policy buffer of 400 steps,
  the reference estimator, 4000 random warm-up steps, only BC-HG clipped, 500 iterations;
  10 actor steps, the largest of the paper's grid {1, 2, 5, 10}, and 5 critic steps per
  iteration).
"""

from __future__ import annotations

import dataclasses
from typing import NamedTuple

from bchg_jax.games.lqr.config import (
    ActorConfig,
    CriticConfig,
    EstimatorConfig,
    ExplorationConfig,
    TrainConfig,
)
from bchg_jax.games.lqr.train import HParams

# the two forms of the estimate (``--estimator``): the reference code's, and one whose
# baselines keep it unbiased; each sets these EstimatorConfig fields
ESTIMATORS = {
    "reference": dict(direct_baseline="reference", influence="raw"),
    "unbiased": dict(direct_baseline="same_noise", influence="baseline"),
}


class Preset(NamedTuple):
    """A named setting of the trainer.

    Attributes:
      config: the :class:`~bchg_jax.games.lqr.config.TrainConfig` (``actor.clip`` is the clip
        of the methods that :attr:`clip_scope` clips).
      hparams: the traced hyperparameters (actor steps, critic steps, beta).
      estimator: the name in :data:`ESTIMATORS` of ``config.estimator``'s form.
      clip_scope: ``"all"`` (every method's gradient is clipped) or ``"reference"`` (only
        BC-HG's, as the reference code does).
    """

    config: TrainConfig
    hparams: HParams
    estimator: str
    clip_scope: str

    def config_for(self, method: str) -> TrainConfig:
        """``config`` for ``method``: without a clip if :attr:`clip_scope` does not clip it."""
        if clipped(method, self.clip_scope):
            return self.config
        actor = dataclasses.replace(self.config.actor, clip=0.0)
        return dataclasses.replace(self.config, actor=actor)


def clipped(method: str, clip_scope: str) -> bool:
    """Whether ``method``'s gradient is clipped under ``clip_scope``: ``"all"``, or
    ``"reference"`` (BC-HG's only, as the reference code does)."""
    return clip_scope == "all" or method.startswith("bchg")


def explore() -> Preset:
    """Learned critics with exploration, replay and unbiased estimators (module docstring)."""
    return Preset(
        TrainConfig(
            iterations=2000,
            episodes=2,
            minibatch=64,
            max_steps=20,
            tau=0.2,
            actor=ActorConfig(lr=0.02, lr_schedule="cosine", clip=1.0),
            critic=CriticConfig(
                lr=1e-3,
                minibatch=256,
                replay=80,
                target_samples=8,
                normalize=True,
                q_scale=10.0,
            ),
            exploration=ExplorationConfig(warmup_steps=160000, episodes=6, std=0.5),
            estimator=EstimatorConfig(
                baseline_samples=16, benefit_samples=64, influence_cv=True, **ESTIMATORS["unbiased"]
            ),
        ),
        HParams(actor_steps=1, critic_steps=20, beta=0.1),
        "unbiased",
        "all",
    )


def reference() -> Preset:
    """The reference implementation's settings (module docstring): ``TrainConfig``'s defaults
    (their critic at full precision, as PyTorch, the reference's framework, keeps float32
    matmuls off TF32 by default; ``CriticConfig.precision`` says why it matters here)."""
    return Preset(
        TrainConfig(),
        HParams(actor_steps=10, critic_steps=5, beta=0.1),
        "reference",
        "reference",
    )


PRESETS = {"explore": explore, "reference": reference}
