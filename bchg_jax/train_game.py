"""Actor-critic leaders in tabular Markov games (Algorithms 4 and 8): ``make_train_game``.

One outer iteration (``spec/toy_game.md``, reference settings):
  1. ``episodes`` episodes of ``time_limit`` steps with (f_theta, g) (the very first batch with
     uniformly random leader actions), appended to the buffer (``buffer="on"``: only the newest
     batch; ``"off"``: every episode so far);
  2. ``critic_steps`` critic updates: minibatches drawn uniformly, target
     ``y = r_L + gamma_L Q_targ(s', a*, b*)`` (``critic_target="reference"``: a* / b* the modes of the
     target actor and of g; ``"paper"``: sampled from f and g; method ``biac``:
     ``max_a' Q_targ(s', a', b*(a'))``);
  3. ``actor_steps`` actor updates on minibatches drawn with probability ~ gamma_L^t: the direct
     term ``log f(a|s) (Q_L(s,a,b) - baseline)`` and, for ``bchg``, Theorem 2's guiding term
     ``(1/beta) Ben(s,a,b) I`` with the influence ``I = sum_{k>=0} gamma_F^k log f(a_{t+k}|s_{t+k})
     (V_F(s_{t+k}, a_{t+k}) - sum_a' f(a'|s_{t+k}) V_F(s_{t+k}, a'))`` over the rest of the episode;
  4. soft update of the target networks (tau); 5. the follower re-solves (soft Q-iteration,
     warm-started).
States and actions are discrete, so the actor and the critic are evaluated as tables
([S, A] and [S, A, B]) once per step and every per-sample quantity is a lookup. The number of
actor / critic steps are traced hyperparameters (masked loops up to ``max_steps``), so the whole
paper grid is one vmapped program. Metrics: the exact undiscounted and discounted leader returns
of (f_theta, g) (``exact_game``), the batch's mean undiscounted return, p = f(0|s=1) and g(.|s=0, a=0).
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
from bchg_jax.estimators_game import rollout_game
from bchg_jax.exact_game import leader_return
from bchg_jax.followers.soft_q_game import BACKUPS, soft_q_iteration
from bchg_jax.networks import MLP
from bchg_jax.problems.tabular_game import TabularGame
from bchg_jax.train import Trainer, scan_loop

Array = jax.Array
GAME_METHODS = ("bchg", "naive", "biac")


@dataclasses.dataclass(frozen=True)
class GameTrainConfig:
    iterations: int = 500
    episodes: int = 3
    buffer: str = "on"                 # "on": the newest batch only; "off": every episode so far
    minibatch: int = 64
    max_steps: int = 20                # upper bound of the actor / critic step grids
    actor: str = "mlp"                 # "mlp" (64-64 on one-hot s) or "tabular" (softmax logits)
    hidden: Tuple[int, ...] = (64, 64)
    init: str = "torch"                # "torch": U(+-1/sqrt(fan_in)) kernels (the reference);
                                       # "flax": flax's lecun_normal default
    actor_lr: float = 1e-4
    critic_lr: float = 1e-3
    tau: float = 0.01
    critic_target: str = "reference"   # "reference" (modes) or "paper" (sampled next actions)
    direct_baseline: str = "reference"  # "reference": sum_a' f(a'|s) Q(s,a',b); "none"
    backup: str = "reference"          # the follower's soft-Q backup (see followers/soft_q_game)
    follower_tol: float = 1e-6
    follower_max_sweeps: int = 1000

    def validate(self) -> "GameTrainConfig":
        for name in ("iterations", "episodes", "minibatch", "max_steps", "follower_max_sweeps"):
            v = getattr(self, name)
            if not isinstance(v, (int, np.integer)) or v < 1:
                raise ValueError(f"GameTrainConfig.{name} must be a positive integer, got {v!r}")
        choices = {"buffer": ("on", "off"), "actor": ("mlp", "tabular"), "init": ("torch", "flax"),
                   "critic_target": ("reference", "paper"),
                   "direct_baseline": ("reference", "none"), "backup": BACKUPS}
        for name, ok in choices.items():
            if getattr(self, name) not in ok:
                raise ValueError(f"{name} must be one of {ok}, got {getattr(self, name)!r}")
        for name in ("actor_lr", "critic_lr", "follower_tol"):
            if not getattr(self, name) > 0:
                raise ValueError(f"GameTrainConfig.{name} must be > 0")
        if not 0 < self.tau <= 1:
            raise ValueError(f"tau must be in (0, 1], got {self.tau!r}")
        return self


class GameTrainState(NamedTuple):
    actor: object
    actor_targ: object
    critic: object
    critic_targ: object
    actor_opt: object
    critic_opt: object
    Q_F: Array          # follower soft Q (warm start)
    buffer: EpisodeBuffer
    key: Array
    step: Array


def make_game_hparams(actor_steps, critic_steps, beta=0.05):
    validate_game_hparams({"actor_steps": actor_steps, "critic_steps": critic_steps,
                           "beta": beta})
    return {"actor_steps": jnp.asarray(actor_steps, jnp.int32),
            "critic_steps": jnp.asarray(critic_steps, jnp.int32),
            "beta": jnp.asarray(beta, jnp.float32)}


def validate_game_hparams(hp, max_steps: int = 20) -> None:
    for k in ("actor_steps", "critic_steps"):
        v = np.asarray(hp[k])
        if v.size == 0 or np.any(v < 0) or np.any(v > max_steps) or np.any(v != np.round(v)):
            raise ValueError(f"{k} must be integers in [0, {max_steps}], got {hp[k]!r}")
    b = np.asarray(hp["beta"], np.float64)
    if b.size == 0 or np.any(b <= 0) or not np.all(np.isfinite(b)):
        raise ValueError(f"beta must be > 0, got {hp['beta']!r}")


def make_train_game(game: TabularGame, method: str = "bchg",
                    config: GameTrainConfig = GameTrainConfig()) -> Trainer:
    if method not in GAME_METHODS:
        raise ValueError(f"method must be one of {GAME_METHODS}, got {method!r}")
    game.validate()
    config.validate()
    S, A, B = game.num_states, game.num_leader_actions, game.num_follower_actions
    T = int(game.time_limit or 150)
    E = config.episodes
    N = E if config.buffer == "on" else E * config.iterations
    gL, gF = game.gamma_L, game.gamma_F
    P = jnp.asarray(game.transition, jnp.float32)
    rL_tab = jnp.asarray(game.leader_reward, jnp.float32)
    eyeS, eyeB = jnp.eye(S), jnp.eye(B)
    actor_net = MLP(tuple(config.hidden), A, config.init == "torch")
    critic_net = MLP(tuple(config.hidden), A, config.init == "torch")
    sb_inputs = jnp.concatenate([jnp.repeat(eyeS, B, 0), jnp.tile(eyeB, (S, 1))], -1)  # [S*B, S+B]
    a_opt, c_opt = optax.adam(config.actor_lr), optax.adam(config.critic_lr)
    steps_ahead = jnp.arange(T)

    def log_policy(params):
        logits = params if config.actor == "tabular" else actor_net.apply(params, eyeS)
        return jax.nn.log_softmax(logits, -1)                               # [S, A]

    def policy(params):
        return jnp.exp(log_policy(params))

    def q_table(params):
        return critic_net.apply(params, sb_inputs).reshape(S, B, A).transpose(0, 2, 1)  # [S,A,B]

    def init(key, hp):
        ka, kc, kr = jax.random.split(key, 3)
        actor = (jnp.zeros((S, A)) if config.actor == "tabular"
                 else actor_net.init(ka, jnp.zeros((1, S))))
        critic = critic_net.init(kc, jnp.zeros((1, S + B)))
        f0 = policy(actor)
        br = soft_q_iteration(game, f0, hp["beta"], config.backup, tol=config.follower_tol,
                              max_sweeps=config.follower_max_sweeps)
        return GameTrainState(actor, actor, critic, critic, a_opt.init(actor), c_opt.init(critic),
                              br.Q, buffer_init(N, T), kr, jnp.zeros((), jnp.int32))

    def critic_loss(params, targ_actor, targ_critic, g, s, a, b, s2, key):
        Qt = q_table(targ_critic)
        if method == "biac":
            b_star = jnp.argmax(g[s2], -1)                                  # [M, A]
            nxt = jnp.max(jnp.take_along_axis(Qt[s2], b_star[..., None], -1)[..., 0], -1)
        elif config.critic_target == "reference":
            a_star = jnp.argmax(policy(targ_actor)[s2], -1)
            b_star = jnp.argmax(g[s2, a_star], -1)
            nxt = Qt[s2, a_star, b_star]
        else:
            ka, kb = jax.random.split(key)
            a2 = jax.random.categorical(ka, jnp.log(policy(targ_actor)[s2]))
            b2 = jax.random.categorical(kb, jnp.log(g[s2, a2]))
            nxt = Qt[s2, a2, b2]
        y = jax.lax.stop_gradient(rL_tab[s, a, b] + gL * nxt)
        return jnp.mean((q_table(params)[s, a, b] - y) ** 2)

    def actor_loss(params, Q, g, V_F, beta, e, t, buf):
        logf = log_policy(params)
        fs = jax.lax.stop_gradient(jnp.exp(logf))
        s, a, b = buf[0][e, t], buf[1][e, t], buf[2][e, t]
        q = Q[s, a, b]
        base = jnp.sum(fs[s] * Q[s, :, b], -1) if config.direct_baseline == "reference" else 0.0
        loss = -jnp.mean(logf[s, a] * (q - base))
        if method == "bchg":
            ben = q - jnp.sum(g[s, a] * Q[s, a], -1)
            AF = V_F - jnp.sum(fs * V_F, -1, keepdims=True)                   # [S, A]
            se, ae = buf[0][e, :T], buf[1][e, :T]                            # [M, T]
            k = steps_ahead[None, :] - t[:, None]
            W = jnp.where(k >= 0, gF ** jnp.maximum(k, 0).astype(jnp.float32), 0.0)
            influence = jnp.sum(W * logf[se, ae] * AF[se, ae], -1)
            loss = loss - jnp.mean(jax.lax.stop_gradient(ben) * influence) / beta
        return loss

    def step(state: GameTrainState, hp):
        beta = hp["beta"]
        key, k_roll, k_c, k_a = jax.random.split(state.key, 4)
        f = policy(state.actor)
        g = jax.nn.softmax(state.Q_F / beta, -1)
        V_F = beta * jax.nn.logsumexp(state.Q_F / beta, -1)
        f_roll = jnp.where(state.step == 0, jnp.full_like(f, 1.0 / A), f)
        ep = rollout_game(k_roll, game, f_roll, g, E, T)
        s_last = jax.vmap(lambda k, s, a, b: jax.random.categorical(k, jnp.log(P[s, a, b])))(
            jax.random.split(jax.random.fold_in(k_roll, 7), E), ep.s[:, -1], ep.a[:, -1],
            ep.b[:, -1])
        s_full = jnp.concatenate([ep.s, s_last[:, None]], 1)
        buf = buffer_add(state.buffer, s_full, ep.a, ep.b, config.buffer)
        bs, ba, bb = (x.astype(jnp.int32) for x in (buf.s, buf.a, buf.b))

        def critic_body(i, c):
            params, opt = c
            e, t = sample_uniform(jax.random.fold_in(k_c, i), buf, config.minibatch)
            grads = jax.grad(critic_loss)(params, state.actor_targ, state.critic_targ, g,
                                          bs[e, t], ba[e, t], bb[e, t], bs[e, t + 1],
                                          jax.random.fold_in(k_c, 10_000 + i))
            upd, opt2 = c_opt.update(grads, opt, params)
            new = (optax.apply_updates(params, upd), opt2)
            return jax.tree.map(lambda x, y: jnp.where(i < hp["critic_steps"], x, y), new, c)

        critic, c_state = jax.lax.fori_loop(0, config.max_steps, critic_body,
                                            (state.critic, state.critic_opt))
        Q = jax.lax.stop_gradient(q_table(critic))

        def actor_body(i, c):
            params, opt = c
            e, t = sample_discounted(jax.random.fold_in(k_a, i), buf, config.minibatch, gL)
            grads = jax.grad(actor_loss)(params, Q, g, V_F, beta, e, t, (bs, ba, bb))
            upd, opt2 = a_opt.update(grads, opt, params)
            new = (optax.apply_updates(params, upd), opt2)
            return jax.tree.map(lambda x, y: jnp.where(i < hp["actor_steps"], x, y), new, c)

        actor, a_state = jax.lax.fori_loop(0, config.max_steps, actor_body,
                                           (state.actor, state.actor_opt))
        soft = lambda new, old: jax.tree.map(  # noqa: E731
            lambda x, y: config.tau * x + (1 - config.tau) * y, new, old)
        f_new = policy(actor)
        br = soft_q_iteration(game, f_new, beta, config.backup, Q0=state.Q_F,
                              tol=config.follower_tol, max_sweeps=config.follower_max_sweeps)
        actor_targ = soft(actor, state.actor_targ)
        metrics = {
            "J": leader_return(game, f_new, br.policy),
            # the slowly moving target actor against the same follower (the reference's
            # evaluation policy is its target actor: "AverageTargetReturn")
            "J_target_actor": leader_return(game, policy(actor_targ), br.policy),
            "J_discounted": leader_return(game, f_new, br.policy, gamma=gL),
            "batch_return": jnp.mean(jnp.sum(rL_tab[ep.s, ep.a, ep.b], -1)),
            "p": f_new[1, 0] if S > 1 else f_new[0, 0],
            "g_S": br.policy[0, 0],
            "follower_sweeps": br.sweeps,
        }
        new_state = GameTrainState(actor, actor_targ, critic,
                                   soft(critic, state.critic_targ), a_state, c_state, br.Q,
                                   buf, key, state.step + 1)
        return new_state, metrics

    run, train = scan_loop(init, step, config.iterations)

    def hparams(grid: Dict[str, np.ndarray]):
        n = len(np.atleast_1d(grid["actor_steps"]))
        beta = np.broadcast_to(np.asarray(grid.get("beta", 0.05), np.float64), (n,))
        validate_game_hparams({**grid, "beta": beta}, config.max_steps)
        return make_game_hparams(grid["actor_steps"], grid["critic_steps"], beta)

    return Trainer(game, method, config, init, run, train, hparams)
