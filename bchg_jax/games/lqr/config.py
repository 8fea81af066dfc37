"""The static settings of the LQR-game trainer: ``TrainConfig`` and its four parts.

``TrainConfig`` holds what every method shares (the game trainers' common
:class:`~bchg_jax.games.actor_critic.LeaderConfig`: sizes, buffer, target rate, the follower's
solver, dtype) and nests the leader's actor (:class:`ActorConfig`), its critic
(:class:`CriticConfig`), the data collection beyond the leader's own episodes
(:class:`ExplorationConfig`) and the hypergradient estimator's options
(:class:`EstimatorConfig`). Named settings: :mod:`bchg_jax.games.lqr.presets`.
"""

from __future__ import annotations

import dataclasses
from typing import Optional, Tuple

import jax.numpy as jnp
import optax

from bchg_jax.core.follower_model import FollowerSettings
from bchg_jax.core.loop import clip_by_global_norm
from bchg_jax.games.actor_critic import LeaderConfig, validate_checks


@dataclasses.dataclass(frozen=True)
class ActorConfig:
    """The linear leader theta [k * n] (``K_theta = theta.reshape(k, n)``) and its Adam.

    Attributes:
      lr: Adam learning rate of theta.
      lr_schedule: ``"constant"`` or ``"cosine"`` (cosine decay from ``lr`` to 0 over the
        run's actor updates: ``actor_steps`` per iteration after the critic-only warm-up,
        :func:`~bchg_jax.games.lqr.train.actor_updates`; the last update's rate is
        ~ lr (pi / 2 n)^2 for n updates, none is 0).
      clip: global-norm clip of the actor gradient before Adam (0: none).
      theta0_std: std of the N(0, theta0_std^2) initial theta.
    """

    lr: float = 0.1
    lr_schedule: str = "constant"
    clip: float = 1.0
    theta0_std: float = 1.0

    CHECKS = dict(
        positive=("lr",),
        nonneg=("clip", "theta0_std"),
        choices={"lr_schedule": ("constant", "cosine")},
    )
    validate = validate_checks

    def learning_rate(self, updates):
        """``lr``, or for ``"cosine"`` the schedule ``count -> lr (1 + cos(pi min(count, n) / n))
        / 2`` over ``updates`` = n optimizer steps (an int or a traced int scalar: the run's
        actor updates depend on the traced ``actor_steps``)."""
        if self.lr_schedule == "constant":
            return self.lr

        def schedule(count):
            n = jnp.maximum(jnp.asarray(updates), 1)
            return self.lr * 0.5 * (1.0 + jnp.cos(jnp.pi * jnp.minimum(count, n) / n))

        return schedule

    def optimizer(self, updates):
        """The leader's optax transformation: the clip (if any;
        :func:`~bchg_jax.core.loop.clip_by_global_norm`, optax's, which also clips a finite
        gradient whose float32 sum of squares overflows where optax's zeroes it), then Adam at
        :meth:`learning_rate` (``updates``: the run's optimizer steps, which a ``"cosine"``
        schedule spans)."""
        clip = [clip_by_global_norm(self.clip)] if self.clip > 0 else []
        return optax.chain(*clip, optax.adam(self.learning_rate(updates)))


@dataclasses.dataclass(frozen=True)
class CriticConfig:
    """The leader's critic Q_L(s, a, b) (an MLP with target network, Algorithm 3).

    Attributes:
      hidden: hidden layer sizes.
      init: ``"torch"`` or ``"flax"`` initialisation.
      lr: Adam learning rate.
      minibatch: transitions per critic step (0: ``TrainConfig.minibatch``).
      replay: episodes the critic trains on, the newest kept in a ring (0: the critic trains on
        the actor's buffer, the reference); a multiple of the episodes per iteration.
      target_samples: follower actions b' ~ g(.|s', a') averaged in the TD target (0: the
        follower's mean action, the reference).
      normalize: standardise the inputs (s, a, b) by the mean and std of the data the critic
        trains on (recomputed every iteration; the target critic uses the same scales).
      q_scale: the network outputs ``q_scale * Q_L``.
      precision: the network's matmul precision: ``"highest"`` (the default) is full float32,
        ``None`` follows ``jax_default_matmul_precision`` (TF32 on a GPU). The Gaussian leader's
        score-function estimate takes differences Q(s, a', b) - Q(s, a, b) over actions
        U = 1e-3 apart, which TF32's rounding of the inputs swamps as the gains grow
        (docs/performance.md): choose ``None`` only for a deterministic leader (``grad_a Q``,
        ~1e-3 relative under TF32) or a critic large enough for TF32's speed to matter.
    """

    hidden: Tuple[int, ...] = (64, 64)
    init: str = "torch"
    lr: float = 0.1
    minibatch: int = 0
    replay: int = 0
    target_samples: int = 0
    normalize: bool = False
    q_scale: float = 1.0
    precision: Optional[str] = "highest"

    CHECKS = dict(
        nonneg_ints=("minibatch", "replay", "target_samples"),
        positive=("lr", "q_scale"),
        choices={"init": ("torch", "flax"), "precision": (None, "highest")},
    )
    validate = validate_checks


@dataclasses.dataclass(frozen=True)
class ExplorationConfig:
    """Data beyond the leader's own episodes: a random warm-up and behaviour episodes.

    Attributes:
      warmup_steps: environment steps with random leader actions N(0, warmup_std^2) at the
        start (no actor updates meanwhile).
      warmup_std: std of the random warm-up actions.
      episodes: behaviour episodes ``a = K s + std * eps`` per iteration that feed only the
        critic (0: none, the reference; more needs ``CriticConfig.replay``).
      std: std of the behaviour leader's exploration noise.
    """

    warmup_steps: int = 4000
    warmup_std: float = 1.0
    episodes: int = 0
    std: float = 0.5

    CHECKS = dict(nonneg_ints=("warmup_steps", "episodes"), positive=("warmup_std", "std"))
    validate = validate_checks


@dataclasses.dataclass(frozen=True)
class EstimatorConfig:
    """The options of Theorem 2's / Theorem 3's estimate (:mod:`bchg_jax.games.lqr.estimator`).

    Attributes:
      direct_baseline: the direct term's baseline, ``"reference"`` (``mean_i Q(s, a'_i, b)``,
        a'_i ~ f(.|s), with the *same* b: biased), ``"same_noise"`` (the follower's noise kept:
        ``b'_i = mean_g(s, a'_i) + (b - mean_g(s, a))``, unbiased) or ``"none"``.
      baseline_samples: leader actions a'_i in the direct baseline.
      benefit_samples: follower actions b_j ~ g(.|s, a) averaged in the Benefit.
      influence: ``"raw"`` (V_F(s_k, a_k), the reference) or ``"baseline"`` (V_F - E_a' V_F:
        unbiased, far lower variance).
      influence_cv: subtract a cross-fitted control variate from the guiding term's influence
        sums (:func:`bchg_jax.games.guide.control_variate`; for BC-HG it needs the actor's
        buffer ``"on"`` with at least 2 episodes).
      reaction: the deterministic leader's follower reaction (``bchg_det``):
        ``"q_gradient"`` (Theorem 3: ``grad_a Q_F``; exact at the best response) or
        ``"policy_score"`` (the follower's own score at the sample's step and ``grad_a V_F``
        after it: unbiased for the as-if-optimal gradient of a follower off its best response
        too; :func:`~bchg_jax.games.lqr.estimator.policy_score_reaction`).
    """

    direct_baseline: str = "reference"
    baseline_samples: int = 32
    benefit_samples: int = 256
    influence: str = "raw"
    influence_cv: bool = False
    reaction: str = "q_gradient"

    CHECKS = dict(
        positive_ints=("baseline_samples", "benefit_samples"),
        choices={
            "direct_baseline": ("reference", "same_noise", "none"),
            "influence": ("raw", "baseline"),
            "reaction": ("q_gradient", "policy_score"),
        },
    )
    validate = validate_checks


@dataclasses.dataclass(frozen=True)
class TrainConfig(FollowerSettings, LeaderConfig):
    """Static (non-traced) settings of the LQR game trainer; ``validate()`` checks them. The
    defaults are the reference implementation's settings (the ``reference`` preset).

    Attributes:
      iterations, episodes, buffer, minibatch, max_steps, tau, follower_tol, dtype: as
        :class:`~bchg_jax.games.actor_critic.LeaderConfig` (``follower_tol``: the relative-change
        tolerance of the follower's Riccati iteration; ``minibatch``: also the critic's unless
        ``critic.minibatch``).
      follower_max_iters: the Riccati iteration's cap.
      actor: :class:`ActorConfig`. critic: :class:`CriticConfig`.
      exploration: :class:`ExplorationConfig`. estimator: :class:`EstimatorConfig`.
      follower: the simulated follower (:class:`~bchg_jax.core.follower_model.FollowerModel`):
        the best response (default, the paper's) or ``k_step`` (K Riccati steps per iteration
        from its last value; :mod:`bchg_jax.games.lqr.follower_models`).
      track_reference: add per-iteration metrics comparing the leader's hypergradient estimate
        with the two exact references (``cos_target``, ``proj_target``: the follower's policy
        as if optimal; ``cos_through``, ``proj_through``: through its update;
        :mod:`bchg_jax.games.lqr.follower_references`; both the exact hypergradient for the
        best response). Two exact gradients per iteration.
    """

    follower_max_iters: int = 1000
    actor: ActorConfig = ActorConfig()
    critic: CriticConfig = CriticConfig()
    exploration: ExplorationConfig = ExplorationConfig()
    estimator: EstimatorConfig = EstimatorConfig()

    CHECKS = dict(positive_ints=("follower_max_iters",))
    FOLLOWER_KINDS = ("best_response", "k_step")  # the follower models of this family

    def iteration_limit(self):
        """As :meth:`LeaderConfig.iteration_limit`; a ``"cosine"`` learning rate also decays to
        0 over ``iterations`` (a longer run takes no step past them)."""
        if self.actor.lr_schedule == "cosine":
            return self.iterations
        return super().iteration_limit()

    def validate(self) -> "TrainConfig":
        """Host-side range, choice and consistency checks of every part; returns ``self``
        (``ValueError`` naming the field otherwise, e.g. ``CriticConfig.replay``)."""
        validate_checks(self)
        self.check_follower()
        for part in (self.actor, self.critic, self.exploration, self.estimator):
            part.validate()
        per_iteration = self.episodes + self.exploration.episodes
        if self.critic.replay and self.critic.replay % per_iteration:
            raise ValueError(
                f"CriticConfig.replay ({self.critic.replay} episodes) must be a multiple of the "
                f"{per_iteration} episodes collected per iteration (TrainConfig.episodes + "
                "ExplorationConfig.episodes)"
            )
        if self.exploration.episodes and not self.critic.replay:
            raise ValueError(
                "ExplorationConfig.episodes > 0 needs a replay ring (CriticConfig.replay > 0): "
                "the exploration episodes feed only the critic"
            )
        return self

    def check_guide(self) -> None:
        """The checks of a method with a guiding term (``make_train`` runs them for BC-HG):
        the control variate groups the samples by the episodes of the newest batch."""
        if self.estimator.influence_cv and self.buffer != "on":
            raise ValueError(
                "EstimatorConfig.influence_cv needs TrainConfig.buffer='on' (the newest "
                "episodes are the control variate's groups)"
            )
        if self.estimator.influence_cv and self.episodes < 2:
            raise ValueError(
                "EstimatorConfig.influence_cv needs TrainConfig.episodes >= 2: the control "
                "variate of an episode's samples is fitted on the other episodes"
            )
