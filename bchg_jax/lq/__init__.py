"""Linear-Gaussian configurable MDPs (e.g. building thermal control): a max-ent LQR follower.

The follower's best response is Proposition 1 (unobservable disturbance); the leader ascends
Theorem 1's hypergradient (Eq. (hg_configurable)) estimated from sampled episodes. See
``docs/architecture.md``.

Family protocol: ``best_response``, ``rollout``, ``hypergradient``, ``leader_objective``,
``exact_hypergradient``, ``make_train``, ``TrainConfig``, ``HParams``, ``METHODS``;
``check_problem`` (an estimator against the exact hypergradient on your problem).
"""

from bchg_jax.lq.check import check_problem
from bchg_jax.lq.cmdp import LQConfigurableMDP
from bchg_jax.lq.critics import fit_quadratic_q, fit_quadratic_vector_value, td_fit
from bchg_jax.lq.estimators import (
    hypergradient,
    per_step_follower_grad,
    per_step_follower_grad_pathwise,
)
from bchg_jax.lq.exact import (
    components,
    exact_hypergradient,
    leader_objective,
    objective_and_components,
)
from bchg_jax.lq.follower import GaussianBestResponse, best_response, riccati, soft_q, soft_value
from bchg_jax.lq.follower_models import (
    first_policy,
    k_step_response,
    lag_response,
    observed_follower,
    policy_value,
)
from bchg_jax.lq.follower_references import (
    as_if_optimal_hypergradient,
    k_step_hypergradient,
    lag_hypergradient,
)
from bchg_jax.lq.fused_td import td_fit_fused
from bchg_jax.lq.rollout import Trajectories, rollout
from bchg_jax.lq.train import METHODS, HParams, TrainConfig, make_train

__all__ = [
    "LQConfigurableMDP",
    "fit_quadratic_q",
    "fit_quadratic_vector_value",
    "td_fit",
    "td_fit_fused",
    "hypergradient",
    "per_step_follower_grad",
    "per_step_follower_grad_pathwise",
    "components",
    "exact_hypergradient",
    "leader_objective",
    "objective_and_components",
    "GaussianBestResponse",
    "best_response",
    "riccati",
    "soft_q",
    "soft_value",
    "first_policy",
    "k_step_response",
    "lag_response",
    "observed_follower",
    "policy_value",
    "as_if_optimal_hypergradient",
    "k_step_hypergradient",
    "lag_hypergradient",
    "Trajectories",
    "rollout",
    "METHODS",
    "HParams",
    "TrainConfig",
    "make_train",
    "check_problem",
]
