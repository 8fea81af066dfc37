"""Tabular configurable MDPs: the leader shapes a finite MDP that a soft-optimal follower solves.

Family protocol (shared by every family): ``best_response``, ``rollout``, ``hypergradient``,
``leader_objective``, ``exact_hypergradient``, ``make_train``, ``TrainConfig``, ``HParams``,
``METHODS``.
"""

from bchg_jax.tabular.check import check_problem, truncated_hypergradient
from bchg_jax.tabular.cmdp import TabularCMDP
from bchg_jax.tabular.critics import (
    benefit,
    init_tabular_critic,
    monte_carlo_critic,
    sarsa_update,
    state_value,
)
from bchg_jax.tabular.estimators import (
    first_episode_mask,
    follower_q_grad_cotangents,
    hypergradient,
    partial_cotangents,
    sobirl_cotangent,
)
from bchg_jax.tabular.exact import (
    best_response,
    exact_hypergradient,
    leader_objective,
    leader_values,
    policy_evaluation,
)
from bchg_jax.tabular.follower import BestResponse, soft_value_iteration
from bchg_jax.tabular.follower_models import (
    k_step_response,
    q_learning_policy,
    q_learning_update,
    soft_policy_value,
)
from bchg_jax.tabular.follower_references import (
    as_if_optimal_hypergradient,
    k_step_hypergradient,
    lag_hypergradient,
    policy_objective,
)
from bchg_jax.tabular.rollout import Batch, rollout
from bchg_jax.tabular.sparse import (
    Successors,
    colour_classes,
    problem_successors,
    sparse_policy_evaluation,
    sparse_soft_value_iteration,
)
from bchg_jax.tabular.train import METHODS, HParams, TrainConfig, make_train
from bchg_jax.tabular.unseen import score_visible, unseen_hypergradient

__all__ = [
    "TabularCMDP",
    "benefit",
    "init_tabular_critic",
    "monte_carlo_critic",
    "sarsa_update",
    "state_value",
    "follower_q_grad_cotangents",
    "hypergradient",
    "partial_cotangents",
    "sobirl_cotangent",
    "best_response",
    "exact_hypergradient",
    "leader_objective",
    "leader_values",
    "policy_evaluation",
    "BestResponse",
    "soft_value_iteration",
    "k_step_response",
    "q_learning_policy",
    "q_learning_update",
    "soft_policy_value",
    "as_if_optimal_hypergradient",
    "k_step_hypergradient",
    "lag_hypergradient",
    "policy_objective",
    "Batch",
    "rollout",
    "Successors",
    "colour_classes",
    "problem_successors",
    "sparse_policy_evaluation",
    "sparse_soft_value_iteration",
    "METHODS",
    "HParams",
    "TrainConfig",
    "make_train",
    "check_problem",
    "truncated_hypergradient",
    "first_episode_mask",
    "score_visible",
    "unseen_hypergradient",
]
