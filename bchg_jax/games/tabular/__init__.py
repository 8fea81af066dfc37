"""Tabular 2-player Markov games with an actor-critic leader and a soft-Q follower.

The leader ascends Theorem 2's hypergradient (Eq. (hg_MG)); ``hypergradient`` is the shared
whole-episode estimator :func:`bchg_jax.games.estimators.hypergradient`. The paper's toy Markov
game (Section "2-Player Markov Games (Discrete)") is one instance.

Family protocol: ``best_response``, ``rollout``, ``hypergradient``, ``leader_objective``,
``exact_hypergradient``, ``make_train``, ``TrainConfig``, ``HParams``, ``METHODS``; and
``check_problem`` (Theorem 2's estimator against the exact hypergradient on your game) with
``truncated_hypergradient`` (what its estimates target on episodes cut at a horizon).
"""

from bchg_jax.games.estimators import hypergradient
from bchg_jax.games.tabular.check import check_problem, truncated_hypergradient
from bchg_jax.games.tabular.exact import (
    as_if_optimal_hypergradient,
    best_response,
    exact_hypergradient,
    k_step_hypergradient,
    lag_hypergradient,
    leader_objective,
    leader_return,
    leader_returns,
    leader_values,
    soft_policy_evaluation,
)
from bchg_jax.games.tabular.follower import GameBestResponse, soft_q_iteration
from bchg_jax.games.tabular.follower_models import FollowerResponse
from bchg_jax.games.tabular.game import TabularGame
from bchg_jax.games.tabular.rollout import GameEpisodes, rollout
from bchg_jax.games.tabular.train import METHODS, HParams, TrainConfig, make_train

__all__ = [
    "hypergradient",
    "check_problem",
    "truncated_hypergradient",
    "best_response",
    "exact_hypergradient",
    "leader_objective",
    "leader_return",
    "leader_returns",
    "leader_values",
    "soft_policy_evaluation",
    "as_if_optimal_hypergradient",
    "k_step_hypergradient",
    "lag_hypergradient",
    "GameBestResponse",
    "FollowerResponse",
    "soft_q_iteration",
    "TabularGame",
    "GameEpisodes",
    "rollout",
    "METHODS",
    "HParams",
    "TrainConfig",
    "make_train",
]
