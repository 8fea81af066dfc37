"""Actor-critic leaders in the bi-level LQR Markov game: ``make_train_lqr_game``.

The leader is linear, ``K_theta = theta.reshape(k, n)``: Gaussian ``N(K s, U U^T)`` for the
stochastic methods, ``a = K s`` for the deterministic ones. The follower is Proposition 2's best
response, re-solved (warm-started Riccati) every iteration. One outer iteration
(``spec/lqr_game.md``, reference settings):

  1. ``episodes`` episodes of ``horizon`` steps from s0 (while fewer than ``warmup_steps`` env
     steps have been taken, the leader acts N(0, warmup_std^2) at random), added to the buffer
     (``"on"``: the newest batch only; ``"off"``: every episode);
  2. ``critic_steps`` updates of the MLP critic Q_L(s, a, b) on uniform minibatches with target
     ``r_L(s) + gamma_L Q_targ(s', K_targ s', mean of g(.|s', K_targ s'))``;
  3. ``actor_steps`` updates on minibatches drawn with probability ~ gamma_L^t (skipped during the
     warm-up), the gradient clipped to ``clip`` (global norm) before Adam:
     * ``bchg`` / ``naive`` (Theorem 2, score-function form): direct term
       ``grad log f(a|s) (Q(s,a,b) - base)``; ``bchg`` adds ``(1/beta) Ben(s,a,b) I`` with
       ``Ben = Q(s,a,b) - mean_j Q(s,a,b_j)``, ``b_j ~ g(.|s,a)`` and the influence
       ``I = sum_{k>=0} gF^k grad log f(a_{t+k}|s_{t+k}) adv_F(s_{t+k}, a_{t+k})`` over the rest of
       the episode;
     * ``bchg_det`` / ``naive_det`` (the appendix theorem): ``grad_a Q(s,a,b)|_{a=Ks} s^T`` and, for
       ``bchg_det``, ``(1/beta) Ben(s,Ks,b) sum_k gF^k grad_a Q_F(s_k, K s_k, b_k) s_k^T``
       (grad_a Q_F from the white-box follower);
     * ``exact``: gradient ascent on the exact discounted return (the reference curve);
  4. soft update (``tau``) of the target critic and the target leader; the follower re-solves
     (an actor update after which the Riccati iteration does not converge within
     ``follower_max_iters`` is skipped and counted in the ``update_skipped`` metric).

Options that the paper leaves open or where the reference deviates (``spec/lqr_game.md``):
``direct_baseline="reference"`` subtracts ``mean_i Q(s, a'_i, b)``, a'_i ~ f(.|s), with the *same*
b (biased: b depends on a); ``"same_noise"`` keeps the follower's noise instead,
``b'_i = mean_g(s, a'_i) + (b - mean_g(s, a))`` (unbiased: the noise is independent of a);
``"none"``. ``influence="raw"`` uses V_F(s_k, a_k) (the reference); ``"baseline"`` subtracts
``E_a' V_F(s_k, a')`` (unbiased, far lower variance with U = 1e-3).
``shuffle_benefit=True`` (a control experiment, not a method) pairs every influence sum with the
Benefit of another minibatch element: the guiding term keeps its noise but loses its mean.
Metrics per iteration: the exact undiscounted return over the horizon (``J``, the paper's y-axis),
the discounted one, the batch's sampled return, theta, the follower's Riccati status.
"""
from __future__ import annotations

import dataclasses
from typing import Dict, NamedTuple, Tuple

import jax
import jax.numpy as jnp
import numpy as np
import optax

from bchg_jax.buffers import (EpisodeBuffer, buffer_add, buffer_init, sample_discounted,
                              sample_uniform)
from bchg_jax.exact_lqr_game import leader_return
from bchg_jax.networks import MLP
from bchg_jax.problems.lqr_game import (LQRGame, best_response, follower_q, follower_state_value,
                                        follower_value, leader_gain, leader_log_prob,
                                        leader_reward, rollout)
from bchg_jax.train import Trainer, scan_loop
from bchg_jax.train_game import validate_game_hparams

Array = jax.Array
LQR_GAME_METHODS = ("bchg", "naive", "bchg_det", "naive_det", "exact")
DETERMINISTIC = ("bchg_det", "naive_det")


@dataclasses.dataclass(frozen=True)
class LQRGameTrainConfig:
    iterations: int = 500
    episodes: int = 4
    buffer: str = "on"                 # "on": newest batch (400 steps); "off": every episode
    minibatch: int = 64
    max_steps: int = 10                # upper bound of the actor / critic step grids
    hidden: Tuple[int, ...] = (64, 64)
    init: str = "torch"
    actor_lr: float = 0.1
    critic_lr: float = 0.1
    tau: float = 0.01
    clip: float = 1.0                  # global-norm clip of the actor gradient (0: none)
    warmup_steps: int = 4000
    warmup_std: float = 1.0
    benefit_samples: int = 256
    baseline_samples: int = 32
    direct_baseline: str = "reference"  # "reference" | "same_noise" | "none"
    influence: str = "raw"             # "raw" (V_F) | "baseline" (V_F - E_a' V_F)
    shuffle_benefit: bool = False      # control experiment: pair each influence with the
                                       # Benefit of another minibatch element (mean ~0, same noise)
    theta0_std: float = 1.0
    follower_tol: float = 1e-6
    follower_max_iters: int = 1000

    def validate(self) -> "LQRGameTrainConfig":
        for name in ("iterations", "episodes", "minibatch", "max_steps", "benefit_samples",
                     "baseline_samples", "follower_max_iters"):
            v = getattr(self, name)
            if not isinstance(v, (int, np.integer)) or v < 1:
                raise ValueError(f"LQRGameTrainConfig.{name} must be a positive integer, got {v!r}")
        if not isinstance(self.warmup_steps, (int, np.integer)) or self.warmup_steps < 0:
            raise ValueError(f"warmup_steps must be an integer >= 0, got {self.warmup_steps!r}")
        choices = {"buffer": ("on", "off"), "init": ("torch", "flax"),
                   "direct_baseline": ("reference", "same_noise", "none"),
                   "influence": ("raw", "baseline")}
        for name, ok in choices.items():
            if getattr(self, name) not in ok:
                raise ValueError(f"{name} must be one of {ok}, got {getattr(self, name)!r}")
        for name in ("actor_lr", "critic_lr", "follower_tol", "warmup_std"):
            if not getattr(self, name) > 0:
                raise ValueError(f"LQRGameTrainConfig.{name} must be > 0")
        if not 0 < self.tau <= 1:
            raise ValueError(f"tau must be in (0, 1], got {self.tau!r}")
        if not self.clip >= 0 or not self.theta0_std >= 0:
            raise ValueError("clip and theta0_std must be >= 0")
        return self


class LQRGameTrainState(NamedTuple):
    theta: Array
    theta_targ: Array
    critic: object
    critic_targ: object
    actor_opt: object
    critic_opt: object
    P: Array            # the follower's Riccati solution (warm start)
    buffer: EpisodeBuffer
    key: Array
    step: Array


def validate_lqr_game_hparams(hp, max_steps: int = 10) -> None:
    """actor_steps / critic_steps integers in [0, max_steps], beta > 0 (the toy game's rules)."""
    validate_game_hparams(hp, max_steps)


def make_lqr_game_hparams(actor_steps, critic_steps=5, beta=0.1):
    validate_lqr_game_hparams({"actor_steps": actor_steps, "critic_steps": critic_steps,
                               "beta": beta}, max_steps=np.inf)
    return {"actor_steps": jnp.asarray(actor_steps, jnp.int32),
            "critic_steps": jnp.asarray(critic_steps, jnp.int32),
            "beta": jnp.asarray(beta, jnp.float32)}


def make_train_lqr_game(game: LQRGame, method: str = "bchg",
                        config: LQRGameTrainConfig = LQRGameTrainConfig()) -> Trainer:
    if method not in LQR_GAME_METHODS:
        raise ValueError(f"method must be one of {LQR_GAME_METHODS}, got {method!r}")
    game.validate()
    config.validate()
    n, k, m = game.state_dim, game.leader_dim, game.follower_dim
    T, E = int(game.horizon), config.episodes
    N = E if config.buffer == "on" else E * config.iterations
    gL, gF = game.gamma_L, game.gamma_F
    det = method in DETERMINISTIC
    stochastic_follower = not det
    critic_net = MLP(tuple(config.hidden), 1, config.init == "torch")
    tx = [optax.clip_by_global_norm(config.clip)] if config.clip > 0 else []
    a_opt = optax.chain(*tx, optax.adam(config.actor_lr))
    c_opt = optax.adam(config.critic_lr)
    steps_ahead = jnp.arange(T)
    warmup_iters = -(-config.warmup_steps // (E * T))

    def Q(params, s, a, b):
        return critic_net.apply(params, jnp.concatenate([s, a, b], -1))[..., 0]

    def respond(theta, beta, P0=None):
        return best_response(game, theta, beta, stochastic=stochastic_follower, P0=P0,
                             tol=config.follower_tol, max_iters=config.follower_max_iters)

    def init(key, hp):
        kt, kc, kr = jax.random.split(key, 3)
        theta = config.theta0_std * jax.random.normal(kt, (k * n,), jnp.float32)
        critic = critic_net.init(kc, jnp.zeros((1, n + k + m)))
        resp = respond(theta, hp["beta"])
        return LQRGameTrainState(theta, theta, critic, critic, a_opt.init(theta),
                                 c_opt.init(critic), resp.P,
                                 buffer_init(N, T, jnp.float32, (n, k, m)), kr,
                                 jnp.zeros((), jnp.int32))

    def critic_loss(params, targ, theta_targ, resp, s, a, b, s2):
        a2 = s2 @ leader_gain(game, theta_targ).T
        y = leader_reward(game, s) + gL * Q(targ, s2, a2, resp.mean(s2, a2))
        return jnp.mean((Q(params, s, a, b) - jax.lax.stop_gradient(y)) ** 2)

    def influence_weights(t):
        kk = steps_ahead[None, :] - t[:, None]
        return jnp.where(kk >= 0, gF ** jnp.maximum(kk, 0).astype(jnp.float32), 0.0)  # [M, T]

    def stochastic_loss(theta, critic, resp, beta, key, e, t, buf):
        s, a, b = buf.s[e, t], buf.a[e, t], buf.b[e, t]
        kb, kj = jax.random.split(key)
        q = Q(critic, s, a, b)
        logf = leader_log_prob(game, theta, s, a)
        if config.direct_baseline == "none":
            base = 0.0
        else:
            a_alt = jax.vmap(lambda kk: leader_policy_sample(theta, kk, s))(
                jax.random.split(kb, config.baseline_samples))              # [I, M, k]
            if config.direct_baseline == "reference":
                b_alt = jnp.broadcast_to(b, a_alt.shape[:-1] + (m,))
            else:
                b_alt = resp.mean(s, a_alt) + (b - resp.mean(s, a))
            base = jnp.mean(Q(critic, jnp.broadcast_to(s, a_alt.shape[:-1] + (n,)), a_alt, b_alt), 0)
        loss = -jnp.mean(logf * jax.lax.stop_gradient(q - base))
        if method == "bchg":
            bj = jax.vmap(lambda kk: resp.sample(kk, s, a))(
                jax.random.split(kj, config.benefit_samples))               # [J, M, m]
            shp = bj.shape[:-1]
            ben = q - jnp.mean(Q(critic, jnp.broadcast_to(s, shp + (n,)),
                                 jnp.broadcast_to(a, shp + (k,)), bj), 0)
            se, ae = buf.s[e, :T], buf.a[e]                                  # [M, T, .]
            adv = follower_value(game, resp, se, ae)
            if config.influence == "baseline":
                adv = adv - follower_state_value(game, resp, theta, se)
            infl = jnp.sum(influence_weights(t) * leader_log_prob(game, theta, se, ae)
                           * jax.lax.stop_gradient(adv), -1)
            if config.shuffle_benefit:
                ben = jax.random.permutation(jax.random.fold_in(key, 1), ben)
            loss = loss - jnp.mean(jax.lax.stop_gradient(ben) * infl) / beta
        return loss

    def leader_policy_sample(theta, key, s):
        eps = jax.random.normal(key, s.shape[:-1] + (k,), s.dtype)
        return s @ leader_gain(game, theta).T + eps @ jnp.asarray(game.U, s.dtype).T

    def deterministic_loss(theta, critic, resp, beta, key, e, t, buf):
        K = leader_gain(game, theta)
        s, b = buf.s[e, t], buf.b[e, t]
        a_pi = jax.lax.stop_gradient(s @ K.T)
        dQL = jax.grad(lambda aa: jnp.sum(Q(critic, s, aa, b)))(a_pi)
        loss = -jnp.mean(jnp.sum((s @ K.T) * dQL, -1))
        if method == "bchg_det":
            bj = jax.vmap(lambda kk: resp.sample(kk, s, a_pi))(
                jax.random.split(key, config.benefit_samples))
            shp = bj.shape[:-1]
            ben = Q(critic, s, a_pi, b) - jnp.mean(
                Q(critic, jnp.broadcast_to(s, shp + (n,)), jnp.broadcast_to(a_pi, shp + (k,)), bj), 0)
            se, be = buf.s[e, :T], buf.b[e]
            ae = jax.lax.stop_gradient(se @ K.T)
            dQF = jax.grad(lambda aa: jnp.sum(follower_q(game, resp, theta, se, aa, be)))(ae)
            infl = jnp.sum(influence_weights(t) * jnp.sum((se @ K.T) * jax.lax.stop_gradient(dQF), -1), -1)
            loss = loss - jnp.mean(jax.lax.stop_gradient(ben) * infl) / beta
        return loss

    def exact_loss(theta, beta):
        return -leader_return(game, theta, beta, gamma=gL, stochastic=True)

    def step(state: LQRGameTrainState, hp):
        beta = hp["beta"]
        key, k_roll, k_c, k_a = jax.random.split(state.key, 4)
        resp = respond(state.theta, beta, state.P)
        warm = state.step < warmup_iters
        tr = rollout(k_roll, game, state.theta, resp, E, T, stochastic=True, random_leader=warm,
                     random_std=config.warmup_std)
        buf = buffer_add(state.buffer, tr.s, tr.a, tr.b, config.buffer)

        def critic_body(i, c):
            params, opt = c
            e, t = sample_uniform(jax.random.fold_in(k_c, i), buf, config.minibatch)
            grads = jax.grad(critic_loss)(params, state.critic_targ, state.theta_targ, resp,
                                          buf.s[e, t], buf.a[e, t], buf.b[e, t], buf.s[e, t + 1])
            upd, opt2 = c_opt.update(grads, opt, params)
            new = (optax.apply_updates(params, upd), opt2)
            return jax.tree.map(lambda x, y: jnp.where(i < hp["critic_steps"], x, y), new, c)

        critic, c_state = state.critic, state.critic_opt
        if method != "exact":
            critic, c_state = jax.lax.fori_loop(0, config.max_steps, critic_body, (critic, c_state))
        critic_sg = jax.lax.stop_gradient(critic)

        def actor_body(i, c):
            theta, opt, _ = c
            if method == "exact":
                grads = jax.grad(exact_loss)(theta, beta)
            else:
                e, t = sample_discounted(jax.random.fold_in(k_a, i), buf, config.minibatch, gL)
                loss_fn = deterministic_loss if det else stochastic_loss
                grads = jax.grad(loss_fn)(theta, critic_sg, resp, beta,
                                          jax.random.fold_in(k_a, 10_000 + i), e, t, buf)
            upd, opt2 = a_opt.update(grads, opt, theta)
            new = (optax.apply_updates(theta, upd), opt2, jnp.sqrt(jnp.sum(grads ** 2)))
            go = (i < hp["actor_steps"]) & ~warm
            return jax.tree.map(lambda x, y: jnp.where(go, x, y), new, c)

        theta, a_state, gnorm = jax.lax.fori_loop(
            0, config.max_steps, actor_body,
            (state.theta, state.actor_opt, jnp.zeros((), jnp.float32)))
        soft = lambda new, old: jax.tree.map(  # noqa: E731
            lambda x, y: config.tau * x + (1 - config.tau) * y, new, old)
        resp_new = respond(theta, beta, resp.P)
        # an update whose follower problem has no converged Riccati solution is skipped
        ok = resp_new.converged
        theta, a_state = jax.tree.map(lambda x, y: jnp.where(ok, x, y), (theta, a_state),
                                      (state.theta, state.actor_opt))
        resp_new = jax.tree.map(lambda x, y: jnp.where(ok, x, y), resp_new, resp)
        metrics = {
            "J": leader_return(game, theta, beta, stochastic=not det, resp=resp_new),
            "J_discounted": leader_return(game, theta, beta, gamma=gL, stochastic=not det,
                                          resp=resp_new),
            "batch_return": jnp.mean(jnp.sum(leader_reward(game, tr.s[:, :T]), -1)),
            "K1": theta[0], "K2": theta[1] if theta.shape[0] > 1 else theta[0],
            "grad_norm": gnorm,
            "update_skipped": (~ok).astype(jnp.float32),
            "riccati_iterations": resp_new.info.iterations,
        }
        new_state = LQRGameTrainState(theta, soft(theta, state.theta_targ), critic,
                                      soft(critic, state.critic_targ), a_state, c_state,
                                      resp_new.P, buf, key, state.step + 1)
        return new_state, metrics

    run, train = scan_loop(init, step, config.iterations)

    def hparams(grid: Dict[str, np.ndarray]):
        n_pts = len(np.atleast_1d(grid["actor_steps"]))
        bc = lambda v, d: np.broadcast_to(np.asarray(grid.get(v, d)), (n_pts,))  # noqa: E731
        hp = {"actor_steps": bc("actor_steps", 1), "critic_steps": bc("critic_steps", 5),
              "beta": bc("beta", 0.1).astype(np.float64)}
        validate_lqr_game_hparams(hp, config.max_steps)
        return make_lqr_game_hparams(hp["actor_steps"], hp["critic_steps"], hp["beta"])

    return Trainer(game, method, config, init, run, train, hparams)
