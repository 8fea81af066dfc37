"""Outer loop for linear-Gaussian configurable MDPs (building thermal control): ``make_train_lq``.

One outer iteration i (Algorithm 1 with the continuous modules):
  1. follower best response g^{theta_i dagger}: max-ent LQR (Proposition 1), Riccati iteration
     warm-started from P of iteration i-1 (a non-converged solve is flagged ``ok = 0`` and the
     update is skipped, never a silent NaN);
  2. ``num_episodes`` episodes of ``problem.horizon`` steps under g;
  3. the leader critic on the batch: ``quadratic`` (LSTD, exact function class), ``mlp`` (the
     paper's 64-64 TD network, re-initialised every iteration, ``mlp_steps`` Adam steps) or
     ``exact`` (closed-form Q_L; isolates estimator noise);
  4. the hypergradient: ``bchg`` (Benefit guide), ``hpgd_td`` / ``hpgd_mc`` (Q_L x (dQF - dVF) with a
     learned vector dVF ~ grad V_F; TD critic / Monte Carlo returns for Q_L and V_L), ``naive``
     (partial term only) or ``exact`` (autodiff of the closed-form J_L);
  5. SGD ascent after clipping to ``clip_norm``.
Metrics of iteration i: exact 100-step J_L(theta_i) and its components (``exact_lq``).

Hyperparameters a grid may vary (``lr``, ``beta``) are traced; everything else is static.
"""
from __future__ import annotations

import dataclasses
from typing import Dict, NamedTuple, Tuple

import jax
import jax.numpy as jnp
import numpy as np
import optax

from bchg_jax import critics_mlp, critics_quadratic, exact_lq
from bchg_jax.estimators_continuous import (continuous_hypergradient, discounted_returns,
                                            per_step_follower_grad,
                                            per_step_follower_grad_pathwise)
from bchg_jax.followers.maxent_lqr import soft_q, soft_value
from bchg_jax.problems.lq_cmdp import LQConfigurableMDP
from bchg_jax.rollout_continuous import rollout_continuous
from bchg_jax.train import Trainer, scan_loop

Array = jax.Array

# method -> (guide, leader critic source)
LQ_METHOD_SPECS = {
    "bchg": ("benefit", "critic"),
    "hpgd_td": ("hpgd", "critic"),
    "hpgd_mc": ("hpgd", "mc"),
    "naive": ("none", "critic"),
    "exact": (None, None),
}
LQ_METHODS = tuple(LQ_METHOD_SPECS)
CRITICS = ("quadratic", "mlp", "exact")
FOLLOWER_GRADS = ("score", "pathwise")


@dataclasses.dataclass(frozen=True)
class LQTrainConfig:
    num_episodes: int = 100
    iterations: int = 2000
    clip_norm: float = 1.0
    weights_init_std: float = 0.01     # reference: N(0, 0.01^2); the paper's text says N(0, 1)
    critic: str = "quadratic"
    control_variates: bool = True      # subtract E[V(s')|s,b] in the score-function terms
    follower_grad: str = "pathwise"    # FollowerQGrad per step: "score" (Eq. (nablaQF)) or "pathwise"
    state_baseline: bool = True        # bchg: subtract a learned h(s) ~ grad V_F(s) (unbiased)
    mlp_hidden: Tuple[int, ...] = (64, 64)
    mlp_steps: int = 5000
    mlp_lr: float = 1e-4
    mlp_warm_start: bool = False       # True: start each iteration from the last fit (cheaper)
    mlp_normalize: bool = False        # scale inputs / outputs of the MLP critics (not the paper's)
    mlp_minibatch: int = 0             # 0: full-batch Adam steps (the paper); else samples per step
    value_samples: int = 256           # MLP critic: V_L(s) = mean of Q_L(s, b_j), b_j ~ g(.|s)
    ridge: float = 1e-6
    riccati_tol: float = 1e-6
    riccati_max_iters: int = 50_000

    def validate(self) -> "LQTrainConfig":
        for name in ("num_episodes", "iterations", "mlp_steps", "value_samples",
                     "riccati_max_iters"):
            v = getattr(self, name)
            if not isinstance(v, (int, np.integer)) or v < 1:
                raise ValueError(f"LQTrainConfig.{name} must be a positive integer, got {v!r}")
        if not isinstance(self.mlp_minibatch, (int, np.integer)) or self.mlp_minibatch < 0:
            raise ValueError(f"mlp_minibatch must be an integer >= 0, got {self.mlp_minibatch!r}")
        for name in ("clip_norm", "mlp_lr", "riccati_tol"):
            if not getattr(self, name) > 0:
                raise ValueError(f"LQTrainConfig.{name} must be > 0, got {getattr(self, name)!r}")
        if not self.weights_init_std >= 0 or not self.ridge >= 0:
            raise ValueError("weights_init_std and ridge must be >= 0")
        if self.follower_grad not in FOLLOWER_GRADS:
            raise ValueError(f"follower_grad must be one of {FOLLOWER_GRADS}, got "
                             f"{self.follower_grad!r}")
        if self.critic not in CRITICS:
            raise ValueError(f"critic must be one of {CRITICS}, got {self.critic!r}")
        if not self.mlp_hidden or any(int(h) < 1 for h in self.mlp_hidden):
            raise ValueError(f"mlp_hidden must be positive layer sizes, got {self.mlp_hidden!r}")
        return self


class LQTrainState(NamedTuple):
    theta: Array        # leader weights (unconstrained)
    P: Array            # follower Riccati solution (warm start)
    critic: object      # MLP critics' starting parameters (q, dVF) for the next iteration, or ()
    key: Array
    step: Array


def make_lq_hparams(lr, beta=0.1, dtype=jnp.float32) -> Dict[str, Array]:
    validate_lq_hparams({"lr": lr, "beta": beta})
    return {"lr": jnp.asarray(lr, dtype), "beta": jnp.asarray(beta, dtype)}


def validate_lq_hparams(hp) -> None:
    for k in ("lr", "beta"):
        if k not in hp:
            raise ValueError(f"hparams is missing {k!r}; expected keys ('lr', 'beta')")
        v = np.asarray(hp[k], np.float64)
        if v.size == 0 or not np.all(np.isfinite(v)) or np.any(v <= 0):
            raise ValueError(f"{k} must be finite and > 0, got {hp[k]!r}")


def make_train_lq(problem: LQConfigurableMDP, method: str = "bchg",
                  config: LQTrainConfig = LQTrainConfig()) -> Trainer:
    """Pure training functions (``init``, ``run``, ``train``) for an LQ configurable MDP."""
    if method not in LQ_METHODS:
        raise ValueError(f"method must be one of {LQ_METHODS}, got {method!r}")
    if not isinstance(problem, LQConfigurableMDP):
        raise ValueError(f"problem must be an LQConfigurableMDP, got {type(problem).__name__}")
    problem.validate()
    config.validate()
    guide, source = LQ_METHOD_SPECS[method]
    n, m = problem.state_dim, problem.action_dim
    dtype = jnp.asarray(problem.theta0).dtype
    d = int(np.size(problem.theta0))
    E, T = config.num_episodes, problem.horizon
    use_mlp = config.critic == "mlp" and method != "exact"
    q_model = critics_mlp.MLP(tuple(config.mlp_hidden), 1)
    v_model = critics_mlp.MLP(tuple(config.mlp_hidden), d)
    comp_fn = getattr(problem, "components", None)

    def init(key, hp):
        k_theta, k_q, k_v, k_run = jax.random.split(key, 4)
        theta0 = jnp.asarray(problem.theta0, dtype)
        theta = theta0 + config.weights_init_std * jax.random.normal(k_theta, theta0.shape, dtype)
        critic_init = ()
        if use_mlp:
            critic_init = (q_model.init(k_q, jnp.zeros((1, n + m), dtype)),
                           v_model.init(k_v, jnp.zeros((1, n), dtype)))
        return LQTrainState(theta, jnp.asarray(problem.Qbar, dtype), critic_init, k_run,
                            jnp.zeros((), jnp.int32))

    def leader_critic(key, theta, br, traj, rL, critic_init):
        """(V_L [E,T+1], Q_L [E,T], EV_L [E,T] or None, fitted MLP params or None)."""
        s, b = traj.s, traj.b
        if source == "mc":
            G = discounted_returns(rL, problem.gamma_L)
            return jnp.concatenate([G, jnp.zeros((E, 1), dtype)], 1), G, None, None
        params = None
        if config.critic == "exact":
            qv = exact_lq.leader_value_quadratic(problem, theta, br)
            Q = qv.q(s[:, :-1], b[:, :-1])
            V = qv.value(s)
        elif config.critic == "quadratic":
            qf = critics_quadratic.fit_quadratic_q(s, b, rL, problem.gamma_L, config.ridge)
            Q = qf.q(s[:, :-1], b[:, :-1])
            V = qf.value(s, br.mean(s), br.cov)
        else:
            x = jnp.concatenate([s, b], -1)
            X, Xn = x[:, :-1].reshape(-1, n + m), x[:, 1:].reshape(-1, n + m)
            k_fit, k_val = jax.random.split(key)
            xs, ys = critics_mlp.scales(X, rL.reshape(-1), problem.gamma_L, config.mlp_normalize)
            params = critics_mlp.td_fit(q_model, critic_init[0], X, Xn, rL.reshape(-1),
                                        problem.gamma_L, config.mlp_steps, config.mlp_lr,
                                        k_fit, config.mlp_minibatch, xs, ys)
            Q = critics_mlp.apply_scaled(q_model, params, X, xs, ys)[:, 0].reshape(E, T)
            bs = br.sample(k_val, jnp.broadcast_to(s[None], (config.value_samples,) + s.shape))
            xv = jnp.concatenate([jnp.broadcast_to(s[None], bs.shape[:-1] + (n,)), bs], -1)
            V = jnp.mean(critics_mlp.apply_scaled(q_model, params, xv, xs, ys)[..., 0], 0)
        EV = (Q - rL) / problem.gamma_L if config.control_variates else None
        return V, Q, EV, params

    def fit_grad_vf(key, traj, y, critic_init):
        """(learned grad_theta V_F at s_0..s_{T-1}, fitted MLP params or None): TD on the per-step
        vector rewards ``y``."""
        if config.critic == "mlp" and guide == "hpgd":
            S = traj.s[:, :-1].reshape(-1, n)
            Sn = traj.s[:, 1:].reshape(-1, n)
            Y = y.reshape(-1, d)
            xs, ys = critics_mlp.scales(S, Y, problem.gamma_F, config.mlp_normalize)
            params = critics_mlp.td_fit(v_model, critic_init[1], S, Sn, Y, problem.gamma_F,
                                        config.mlp_steps, config.mlp_lr, key,
                                        config.mlp_minibatch, xs, ys)
            return critics_mlp.apply_scaled(v_model, params, S, xs, ys).reshape(E, T, d), params
        # BC-HG's state baseline is always this cheap LSTD fit (any baseline is unbiased), and
        # HPGD's dVF for the quadratic / exact critics (the class is exact for an LQ follower)
        f = critics_quadratic.fit_quadratic_vector_value(traj.s, y, problem.gamma_F, config.ridge)
        return f(traj.s[:, :-1]), None

    def step(state: LQTrainState, hp):
        theta, beta = state.theta, hp["beta"]
        critic = state.critic
        key, k_roll, k_crit = jax.random.split(state.key, 3)
        k_vf = jax.random.fold_in(k_crit, 1)
        br = problem.best_response(theta, beta, P0=state.P, tol=config.riccati_tol,
                                   max_iters=config.riccati_max_iters)
        ok = br.converged
        J = exact_lq.leader_objective(problem, theta, beta, br=br)
        metrics = {"J": J, "ok": ok.astype(jnp.int32), "riccati_iters": br.info.iterations}
        if comp_fn is not None:
            metrics.update(exact_lq.components(problem, theta, br, comp_fn(theta)))
        if method == "exact":
            grad = exact_lq.exact_hypergradient(problem, theta, beta, tol=config.riccati_tol,
                                                max_iters=config.riccati_max_iters)
        else:
            traj = rollout_continuous(k_roll, problem, theta, br, E, T)
            s, b = traj.s[:, :-1], traj.b[:, :-1]
            rL = problem.leader_reward(theta, s, b)
            V_L, Q_L, EV_L, q_params = leader_critic(k_crit, theta, br, traj, rL, state.critic)
            V_F = soft_value(br, traj.s)
            EV_F = None
            if config.control_variates:
                A, B = problem.A_fn(theta), problem.B_fn(theta)
                QF = soft_q(br, A, B, jnp.asarray(problem.Qbar, dtype),
                            jnp.asarray(problem.Rbar, dtype), jnp.asarray(problem.U, dtype),
                            problem.gamma_F, s, b)
                EV_F = (QF - problem.follower_reward(theta, s, b)) / problem.gamma_F
            kw, v_params = {}, None
            if guide is not None and guide != "none":
                need_vf = guide == "hpgd" or config.state_baseline
                if config.follower_grad == "pathwise":
                    br_fixed = jax.lax.stop_gradient(br)
                    y = per_step_follower_grad_pathwise(problem, theta, traj,
                                                        lambda x: soft_value(br_fixed, x))
                    kw["dQF"] = discounted_returns(y, problem.gamma_F)
                elif need_vf:
                    VFn = V_F[:, 1:] if EV_F is None else V_F[:, 1:] - EV_F
                    y = per_step_follower_grad(problem, theta, traj, VFn)
                if need_vf:
                    kw["dVF"], v_params = fit_grad_vf(k_vf, traj, y, state.critic)
                if guide == "benefit":
                    kw["benefit"] = Q_L - V_L[:, :-1]
                else:
                    kw["Q_L"] = Q_L
            grad = continuous_hypergradient(problem, theta, traj, beta, V_L, V_F, guide,
                                            EV_L=EV_L, EV_F=EV_F, **kw)
            if use_mlp and config.mlp_warm_start:
                critic = (state.critic[0] if q_params is None else q_params,
                          state.critic[1] if v_params is None else v_params)
        finite = jnp.all(jnp.isfinite(grad))
        ok = ok & finite
        grad = jnp.where(ok, grad, 0.0)        # flagged, skipped: never a silent NaN update
        opt = optax.chain(optax.clip_by_global_norm(config.clip_norm), optax.sgd(hp["lr"]))
        updates, _ = opt.update(-grad, opt.init(theta), theta)
        new_theta = optax.apply_updates(theta, updates)
        metrics["ok"] = ok.astype(jnp.int32)
        metrics["grad_norm"] = jnp.linalg.norm(grad)
        P_next = jnp.where(br.converged, jax.lax.stop_gradient(br.P),
                           jnp.asarray(problem.Qbar, dtype))
        return LQTrainState(new_theta, P_next, critic, key, state.step + 1), metrics

    run, train = scan_loop(init, step, config.iterations)

    def hparams(grid):
        lr = np.asarray(grid["lr"], np.float64)
        beta = np.broadcast_to(np.asarray(grid.get("beta", 0.1), np.float64), lr.shape)
        return make_lq_hparams(lr, beta, dtype)

    return Trainer(problem, method, config, init, run, train, hparams)
