"""The bi-level LQR Markov game: a linear (Gaussian or deterministic) leader and Proposition 2's
follower, which observes the leader's action.

Family protocol: ``best_response``, ``rollout``, ``hypergradient``, ``leader_objective``,
``exact_hypergradient``, ``make_train``, ``TrainConfig``, ``HParams``, ``METHODS``; and
``check_problem`` (the estimators with exact critics against the exact gradient). The trainer's
settings nest ``ActorConfig``, ``CriticConfig``, ``ExplorationConfig`` and ``EstimatorConfig``;
the estimate's options are the pieces of an ``Estimator`` (``estimator(config)``); named
settings are in ``presets`` (``explore``, ``reference``).
``hypergradient`` is Theorem 2's whole-episode score form for continuous actions
(:func:`bchg_jax.games.estimators.continuous_hypergradient`), ``deterministic_hypergradient`` the
appendix theorem for a deterministic leader (Theorem 3, Eq. (hg_MG_det)). The task is the paper's
bi-level LQR game (Section "2-Player Markov Games (Continuous)").
"""

from bchg_jax.games.estimators import continuous_hypergradient as hypergradient
from bchg_jax.games.estimators import deterministic_hypergradient, game_score_weights
from bchg_jax.games.lqr import presets
from bchg_jax.games.lqr.check import check_problem
from bchg_jax.games.lqr.config import (
    ActorConfig,
    CriticConfig,
    EstimatorConfig,
    ExplorationConfig,
    TrainConfig,
)
from bchg_jax.games.lqr.estimator import Estimator, estimator
from bchg_jax.games.lqr.exact import (
    exact_critic_estimate,
    exact_hypergradient,
    hypergradient_split,
    influence_steps,
    leader_objective,
    leader_q,
    leader_returns,
    leader_state_values,
)
from bchg_jax.games.lqr.follower import (
    GameResponse,
    best_response,
    follower_q,
    follower_state_value,
    follower_value,
)
from bchg_jax.games.lqr.follower_models import (
    LearnerResponse,
    gain_gap,
    k_step_response,
    policy_view,
)
from bchg_jax.games.lqr.follower_references import (
    as_if_optimal_hypergradient,
    fixed_policy_value,
    k_step_hypergradient,
)
from bchg_jax.games.lqr.game import (
    LQRGame,
    leader_gain,
    leader_log_prob,
    leader_policy,
    leader_reward,
    transition,
)
from bchg_jax.games.lqr.rollout import GameTrajectories, rollout
from bchg_jax.games.lqr.train import METHODS, HParams, make_train

__all__ = [
    "check_problem",
    "hypergradient",
    "deterministic_hypergradient",
    "game_score_weights",
    "exact_critic_estimate",
    "exact_hypergradient",
    "hypergradient_split",
    "influence_steps",
    "leader_objective",
    "leader_returns",
    "leader_q",
    "leader_state_values",
    "GameResponse",
    "best_response",
    "follower_q",
    "follower_state_value",
    "follower_value",
    "LearnerResponse",
    "gain_gap",
    "k_step_response",
    "policy_view",
    "as_if_optimal_hypergradient",
    "fixed_policy_value",
    "k_step_hypergradient",
    "LQRGame",
    "leader_gain",
    "leader_log_prob",
    "leader_policy",
    "leader_reward",
    "transition",
    "GameTrajectories",
    "rollout",
    "METHODS",
    "HParams",
    "TrainConfig",
    "ActorConfig",
    "CriticConfig",
    "ExplorationConfig",
    "EstimatorConfig",
    "Estimator",
    "estimator",
    "presets",
    "make_train",
]
