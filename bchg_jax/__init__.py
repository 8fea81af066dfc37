"""bchg-jax: Boltzmann Covariance HyperGradient (BC-HG) for decentralized bi-level RL in JAX.

Public API (see README.md):
  problems:   TabularCMDP, fourrooms, random_tabular_cmdp
  follower:   soft_value_iteration, BestResponse
  sampling:   rollout, Batch
  critics:    init_tabular_critic, sarsa_update, monte_carlo_critic, benefit, state_value
  segments:   forward_discounted_sum, discounted_suffix_sum, group_mean, regroup
  estimators: hypergradient, follower_q_grad_cotangents, partial_cotangents, sobirl_cotangent
  exact:      best_response, leader_values, leader_objective, exact_hypergradient,
              policy_evaluation
  training:   TrainConfig, make_train, make_hparams, run_grid, product_grid, seed_keys
  continuous (linear-Gaussian configurable MDPs, max-ent LQR follower):
              LQConfigurableMDP, thermal, riccati, maxent_lqr, maxent_lqr_observable,
              GaussianBestResponse, rollout_continuous, Trajectories, continuous_hypergradient,
              per_step_follower_grad, per_step_follower_grad_pathwise, fit_quadratic_q,
              lq_leader_objective, lq_exact_hypergradient, LQTrainConfig, make_train_lq
  Markov games (tabular): TabularGame, toy_game, soft_q_iteration, best_response_exact,
              leader_return, leader_values_game, rollout_game, game_hypergradient
  Markov games (continuous, bi-level LQR): LQRGame, lqr_game, lqr_best_response,
              lqr_leader_return, lqr_exact_hypergradient_game, game_score_weights,
              continuous_game_hypergradient, deterministic_game_hypergradient,
              LQRGameTrainConfig, make_train_lqr_game
"""
from bchg_jax.critics import (benefit, init_tabular_critic, monte_carlo_critic, sarsa_update,
                              state_value)
from bchg_jax.estimators import (follower_q_grad_cotangents, hypergradient, partial_cotangents,
                                 sobirl_cotangent)
from bchg_jax.segments import discounted_suffix_sum, forward_discounted_sum, group_mean, regroup
from bchg_jax.exact import (best_response, exact_hypergradient, leader_objective, leader_values,
                            policy_evaluation)
from bchg_jax.followers.soft_vi import BestResponse, soft_value_iteration
from bchg_jax.problems.fourrooms import fourrooms
from bchg_jax.problems.random_tabular import random_tabular_cmdp
from bchg_jax.problems.tabular import TabularCMDP
from bchg_jax.rollout import Batch, rollout
from bchg_jax.sweep import product_grid, run_grid, seed_keys
from bchg_jax.train import METHODS, TrainConfig, make_hparams, make_train
from bchg_jax.followers.maxent_lqr import (GaussianBestResponse, maxent_lqr,
                                           maxent_lqr_observable, riccati)
from bchg_jax.problems.lq_cmdp import LQConfigurableMDP
from bchg_jax.problems.thermal import thermal
from bchg_jax.rollout_continuous import Trajectories, rollout_continuous
from bchg_jax.estimators_continuous import (continuous_hypergradient, per_step_follower_grad,
                                            per_step_follower_grad_pathwise)
from bchg_jax.critics_quadratic import fit_quadratic_q
from bchg_jax.exact_lq import exact_hypergradient as lq_exact_hypergradient
from bchg_jax.exact_lq import leader_objective as lq_leader_objective
from bchg_jax.train_lq import LQ_METHODS, LQTrainConfig, make_train_lq
from bchg_jax.problems.tabular_game import TabularGame
from bchg_jax.problems.toy_game import toy_game
from bchg_jax.followers.soft_q_game import soft_q_iteration
from bchg_jax.exact_game import best_response_exact, leader_return, leader_values_game
from bchg_jax.estimators_game import (continuous_game_hypergradient,
                                      deterministic_game_hypergradient, game_hypergradient,
                                      game_score_weights, rollout_game)
from bchg_jax.problems.lqr_game import LQRGame, lqr_game
from bchg_jax.problems.lqr_game import best_response as lqr_best_response
from bchg_jax.exact_lqr_game import exact_hypergradient as lqr_exact_hypergradient_game
from bchg_jax.exact_lqr_game import leader_return as lqr_leader_return
from bchg_jax.train_lqr_game import LQR_GAME_METHODS, LQRGameTrainConfig, make_train_lqr_game

__version__ = "0.1.0"

__all__ = [
    "TabularCMDP", "fourrooms", "random_tabular_cmdp", "soft_value_iteration", "BestResponse",
    "rollout", "Batch", "init_tabular_critic", "sarsa_update", "monte_carlo_critic", "benefit",
    "state_value", "hypergradient", "follower_q_grad_cotangents", "partial_cotangents",
    "sobirl_cotangent", "forward_discounted_sum", "discounted_suffix_sum", "group_mean", "regroup", "best_response", "leader_values", "leader_objective",
    "exact_hypergradient", "policy_evaluation", "TrainConfig", "make_train", "make_hparams",
    "METHODS", "run_grid", "product_grid", "seed_keys",
    "LQConfigurableMDP", "thermal", "riccati", "maxent_lqr", "maxent_lqr_observable",
    "GaussianBestResponse", "rollout_continuous", "Trajectories", "continuous_hypergradient",
    "per_step_follower_grad", "per_step_follower_grad_pathwise", "fit_quadratic_q",
    "lq_leader_objective", "lq_exact_hypergradient", "LQ_METHODS", "LQTrainConfig",
    "make_train_lq", "TabularGame", "toy_game", "soft_q_iteration", "best_response_exact",
    "leader_return", "leader_values_game", "rollout_game", "game_hypergradient",
    "game_score_weights", "continuous_game_hypergradient", "deterministic_game_hypergradient",
    "LQRGame", "lqr_game", "lqr_best_response", "lqr_exact_hypergradient_game",
    "lqr_leader_return", "LQR_GAME_METHODS", "LQRGameTrainConfig", "make_train_lqr_game",
]
