"""The outer loop: ``make_train(problem, method, config) -> Trainer`` (Algorithm 1 under lax.scan).

One outer iteration i (Algorithm 1 / 7):
  1. follower best response g^{theta_i dagger}: soft value iteration, warm-started from V_F of i-1;
  2. a batch of ``num_envs x num_steps`` transitions under g (all streams reset to rho_0);
  3. the leader critic update (SARSA, Algorithm 2) on the batch;
  4. the hypergradient estimate (``estimators.hypergradient`` with the method's critic and guide,
     see ``METHOD_SPECS``), or the exact one for ``exact``;
  5. SGD ascent after clipping to global norm ``clip_norm`` (optax).
The metric of iteration i is the exact J_L(theta_i) under g^{theta_i dagger} (policy evaluation on
the follower's model, warm-started sweeps to tolerance).

Static choices (sizes, method, tolerances) live in the frozen :class:`TrainConfig`; numbers a
grid varies (``lr``, ``sarsa_alpha``, ``beta``) are traced scalars in ``hparams``, so
``jax.vmap`` over hparams and seeds never retraces.
"""
from __future__ import annotations

import dataclasses
from typing import Dict, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import optax

from bchg_jax import critics, estimators
from bchg_jax.exact import exact_hypergradient, policy_evaluation_sweeps
from bchg_jax.followers.soft_vi import BestResponse, continuation, soft_value_iteration
from bchg_jax.problems.tabular import TabularCMDP, validate_beta
from bchg_jax.rollout import rollout

Array = jax.Array

# method -> (leader critic, guiding term, oracle segments); Algorithm 5 of the paper
METHOD_SPECS = {
    "bchg": ("sarsa", "benefit", False),        # BC-HG (ours)
    "hpgd_sa": ("sarsa", "hpgd", False),        # HPGD (SA)
    "hpgd_mc": ("mc", "hpgd", False),           # HPGD (MC), the authors' implementation
    "hpgd_oracle": ("mc", "hpgd", True),        # HPGD (oracle): extra rollouts from random states
    "sobirl": ("mc", "sobirl", False),          # SoBiRL (one-step truncation)
    "naive": ("mc", "none", False),             # Naive-PGD (partial derivative only)
    "exact": (None, None, False),               # ascent on the exact hypergradient (exact.py)
}
METHODS = tuple(METHOD_SPECS)
SARSA_METHODS = tuple(m for m, spec in METHOD_SPECS.items() if spec[0] == "sarsa")
HPARAM_NAMES = ("lr", "sarsa_alpha", "beta")


@dataclasses.dataclass(frozen=True)
class TrainConfig:
    """Static configuration of one training run (hashable; changing it recompiles)."""

    num_envs: int = 1
    num_steps: int = 100
    iterations: int = 10_000
    clip_norm: float = 1.0
    theta_init_std: float = 0.01
    critic_init_std: float = 1.0
    vi_tol: float = 1e-6
    vi_max_sweeps: int = 3000
    grouping: str = "every_visit"
    partial: str = "every_visit"
    oracle_envs: int = 50       # HPGD (oracle): 50 x 200 = 10,000 extra steps per iteration
    oracle_steps: int = 200

    def validate(self) -> "TrainConfig":
        for name in ("num_envs", "num_steps", "iterations", "vi_max_sweeps", "oracle_envs",
                     "oracle_steps"):
            v = getattr(self, name)
            if not isinstance(v, (int, np.integer)) or v < 1:
                raise ValueError(f"TrainConfig.{name} must be a positive integer, got {v!r}")
        for name in ("clip_norm", "vi_tol"):
            if not getattr(self, name) > 0:
                raise ValueError(f"TrainConfig.{name} must be > 0, got {getattr(self, name)!r}")
        for name in ("theta_init_std", "critic_init_std"):
            if not getattr(self, name) >= 0:
                raise ValueError(f"TrainConfig.{name} must be >= 0, got {getattr(self, name)!r}")
        if self.grouping not in estimators.GROUPINGS:
            raise ValueError(f"grouping must be one of {estimators.GROUPINGS}, got {self.grouping!r}")
        if self.partial not in estimators.PARTIALS:
            raise ValueError(f"partial must be one of {estimators.PARTIALS}, got {self.partial!r}")
        return self


class TrainState(NamedTuple):
    theta: Array
    critic: Array   # leader critic Q_L [S, B]
    V_F: Array      # follower soft value (warm start of soft VI)
    V_L: Array      # leader value (warm start of the exact evaluation)
    key: Array
    step: Array


def make_hparams(lr, sarsa_alpha=0.5, beta=1e-3, dtype=jnp.float32) -> Dict[str, Array]:
    """hparams pytree; each entry may be a scalar or an array (a grid axis to vmap over)."""
    validate_hparams({"lr": lr, "sarsa_alpha": sarsa_alpha, "beta": beta})
    return {"lr": jnp.asarray(lr, dtype), "sarsa_alpha": jnp.asarray(sarsa_alpha, dtype),
            "beta": jnp.asarray(beta, dtype)}


def validate_hparams(hparams) -> None:
    missing = [k for k in HPARAM_NAMES if k not in hparams]
    if missing:
        raise ValueError(f"hparams is missing {missing}; expected keys {HPARAM_NAMES}")
    lr = np.asarray(hparams["lr"], np.float64)
    alpha = np.asarray(hparams["sarsa_alpha"], np.float64)
    if lr.size == 0 or not np.all(np.isfinite(lr)) or np.any(lr <= 0):
        raise ValueError(f"lr must be > 0, got {hparams['lr']!r}")
    if alpha.size == 0 or np.any(alpha <= 0) or np.any(alpha > 1):
        raise ValueError(f"sarsa_alpha must be in (0, 1], got {hparams['sarsa_alpha']!r}")
    validate_beta(hparams["beta"])


class Trainer(NamedTuple):
    """Pure functions of one run: ``init(key, hp)``, ``run(state, hp, n)``, ``train(key, hp)``."""

    problem: TabularCMDP
    method: str
    config: TrainConfig
    init: callable
    run: callable
    train: callable
    hparams: callable = None   # grid dict -> hparams pytree (None: the tabular ``make_hparams``)


def make_train(problem: TabularCMDP, method: str = "bchg", config: TrainConfig = TrainConfig()) -> Trainer:
    """Builds the pure training functions for ``problem`` and ``method`` (validated eagerly)."""
    if method not in METHODS:
        raise ValueError(f"method must be one of {METHODS}, got {method!r}")
    if not isinstance(problem, TabularCMDP):
        raise ValueError(f"problem must be a TabularCMDP, got {type(problem).__name__}")
    problem.validate()
    config.validate()
    S, B = problem.num_states, problem.num_actions
    terminal = problem.terminal_mask
    critic_kind, guide, use_oracle = METHOD_SPECS[method]
    if guide == "hpgd" and config.grouping != "every_visit":
        raise ValueError("HPGD methods need grouping='every_visit' (dV_F comes from other segments)")
    dtype = jnp.asarray(problem.theta0).dtype

    def init(key: Array, hp) -> TrainState:
        k_theta, k_critic, k_run = jax.random.split(key, 3)
        theta0 = jnp.asarray(problem.theta0, dtype)
        theta = theta0 + config.theta_init_std * jax.random.normal(k_theta, theta0.shape, dtype)
        critic = critics.init_tabular_critic(k_critic, S, B, config.critic_init_std, dtype)
        zeros = jnp.zeros((S,), dtype)
        return TrainState(theta, critic, zeros, zeros, k_run, jnp.zeros((), jnp.int32))

    def step(state: TrainState, hp):
        theta, beta = state.theta, hp["beta"]
        key, k_roll, k_sarsa = jax.random.split(state.key, 3)
        k_oracle = jax.random.fold_in(k_roll, 1)
        P = problem.transition(theta)
        cont = continuation(terminal, S, dtype)
        rF, rL = problem.follower_reward(theta), problem.leader_reward(theta)
        br = soft_value_iteration(P, rF, beta, problem.gamma_F, terminal, V0=state.V_F,
                                  tol=config.vi_tol, max_sweeps=config.vi_max_sweeps)
        V_L = policy_evaluation_sweeps(P, rL, br.policy, problem.gamma_L, cont, state.V_L,
                                       config.vi_tol, config.vi_max_sweeps)
        J = jnp.dot(problem.init_dist(theta), V_L) + problem.regularizer(theta)
        critic = state.critic
        if method == "exact":
            grad = exact_hypergradient(problem, theta, beta, V0=br.V, newton_iters=0,
                                       polish_sweeps=3)
        else:
            P_sample = problem.sampler_transition(theta)
            batch = rollout(k_roll, br.policy, P_sample, problem.init_dist(theta), terminal,
                            problem.time_limit, config.num_envs, config.num_steps)
            segments = None
            if use_oracle:  # oracle access: every reset from a uniformly random state
                segments = rollout(k_oracle, br.policy, P_sample, jnp.full((S,), 1.0 / S, dtype),
                                   terminal, problem.time_limit, config.oracle_envs,
                                   config.oracle_steps)
            if critic_kind == "sarsa":
                critic = critics.sarsa_update(k_sarsa, critic, batch, rL, problem.gamma_L,
                                              hp["sarsa_alpha"])
                Q_L, V_L_hat = critic, None          # V_L = sum_b g Q_L (Algorithm 8)
            else:                                    # Monte Carlo (Algorithm 6)
                Q_L, V_L_hat = critics.monte_carlo_critic(
                    batch if segments is None else segments, rL, problem.gamma_L)
            grad = estimators.hypergradient(
                problem, theta, batch, br, Q_L, beta, guide=guide, grouping=config.grouping,
                partial=config.partial, V_L=V_L_hat, guide_batch=segments)
        opt = optax.chain(optax.clip_by_global_norm(config.clip_norm), optax.sgd(hp["lr"]))
        updates, _ = opt.update(jax.tree.map(jnp.negative, grad), opt.init(theta), theta)
        new_theta = optax.apply_updates(theta, updates)
        grad_norm = jnp.sqrt(sum(jnp.sum(x ** 2) for x in jax.tree.leaves(grad)))
        metrics = {"J": J, "grad_norm": grad_norm, "sweeps": br.sweeps}
        return TrainState(new_theta, critic, br.V, V_L, key, state.step + 1), metrics

    run, train = scan_loop(init, step, config.iterations)
    return Trainer(problem, method, config, init, run, train)


def scan_loop(init, step, iterations: int):
    """(run, train) of a trainer from its ``init(key, hp)`` and ``step(state, hp) -> (state,
    metrics)``: ``run(state, hp, n)`` is n outer iterations as one lax.scan (no host sync
    inside); ``train(key, hp)`` runs ``iterations`` from ``init``."""
    def run(state, hp, num_iterations: int):
        return jax.lax.scan(lambda s, _: step(s, hp), state, None, length=num_iterations)

    def train(key, hp):
        return run(init(key, hp), hp, iterations)

    return run, train
