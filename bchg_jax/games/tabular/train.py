"""Actor-critic leaders in tabular Markov games: ``make_train``.

Algorithm 1 with the Markov-game modules: the TD critic (Algorithm 3, with target networks), the
direct term (Algorithm 5, "PartialDerivative") and the influence sums (Algorithm 7,
"FollowerQGrad", Eq. (nablaQF_MG)) of Theorem 2's hypergradient (Eq. (hg_MG)).

One outer iteration (the reference implementation's settings, ``docs/experiments.md``):
  1. ``episodes`` episodes of ``time_limit`` steps with (f_theta, g) (the very first batch with
     uniformly random leader actions), appended to the buffer (``buffer="on"``: only the newest
     batch; ``"off"``: every episode so far);
  2. ``critic_steps`` critic updates: minibatches drawn uniformly, target
     ``y = r_L + gamma_L Q_targ(s', a*, b*)`` (``critic_target="reference"``: a* / b* the modes of
     the target actor and of g; ``"paper"``: sampled from f and g; method ``biac``:
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
of (f_theta, g) (:func:`bchg_jax.games.tabular.exact.leader_return`), the batch's mean
undiscounted return, p = f(0|s=1) and g(.|s=0, a=0).
"""

from __future__ import annotations

import dataclasses
from typing import NamedTuple, Tuple

import jax
import jax.numpy as jnp
import optax

from bchg_jax.core.buffers import (
    EpisodeBuffer,
    buffer_add,
    buffer_init,
    sample_discounted,
    sample_uniform,
)
from bchg_jax.core.loop import Trainer, adam_step, build_trainer, check_setup, masked_steps, polyak
from bchg_jax.core.networks import MLP
from bchg_jax.core.validate import check_config
from bchg_jax.games.estimators import influence_weights, score_objective
from bchg_jax.games.hparams import game_hparams
from bchg_jax.games.tabular.exact import leader_return
from bchg_jax.games.tabular.follower import BACKUPS, soft_q_iteration
from bchg_jax.games.tabular.game import TabularGame
from bchg_jax.games.tabular.rollout import rollout

Array = jax.Array
# bchg: BC-HG (Theorem 2); naive: Naive-PGD (direct term only); biac: the paper's Bi-AC variant
# (Stackelberg-operator critic target, direct-term actor)
METHODS = ("bchg", "naive", "biac")


@dataclasses.dataclass(frozen=True)
class TrainConfig:
    """Static (non-traced) settings of the tabular game trainer; ``validate()`` checks them.

    Attributes:
      iterations: number of outer iterations of ``train``.
      episodes: E, episodes collected per iteration (``game.time_limit`` steps, default 150).
      buffer: ``"on"`` (the newest batch only) or ``"off"`` (every episode so far).
      minibatch: M, transitions / segment starts per critic or actor step.
      max_steps: upper bound of the traced ``actor_steps`` / ``critic_steps``.
      actor: ``"mlp"`` (network on one-hot states) or ``"tabular"`` (softmax logits [S, A]).
      hidden: hidden layer sizes of the actor and critic networks.
      init: ``"torch"`` (U(+-1/sqrt(fan_in)) kernels, the reference) or ``"flax"``.
      actor_lr: Adam learning rate of the actor.
      critic_lr: Adam learning rate of the critic.
      tau: Polyak factor of the target networks, in (0, 1].
      critic_target: ``"reference"`` (modes of the target actor and of g) or ``"paper"``
        (sampled next actions).
      direct_baseline: ``"reference"`` (sum_a' f(a'|s) Q(s, a', b)) or ``"none"``.
      backup: the follower's soft-Q backup (:mod:`bchg_jax.games.tabular.follower`).
      follower_tol: sup-norm tolerance of the follower's soft Q-iteration.
      follower_max_sweeps: its sweep cap.
      dtype: dtype of the actor, the critic and every computed quantity.
    """

    iterations: int = 500
    episodes: int = 3
    buffer: str = "on"  # "on": the newest batch only; "off": every episode so far
    minibatch: int = 64
    max_steps: int = 20  # upper bound of the actor / critic step grids
    actor: str = "mlp"  # "mlp" (64-64 on one-hot s) or "tabular" (softmax logits)
    hidden: Tuple[int, ...] = (64, 64)
    init: str = "torch"  # "torch": U(+-1/sqrt(fan_in)) kernels (the reference);
    # "flax": flax's lecun_normal default
    actor_lr: float = 1e-4
    critic_lr: float = 1e-3
    tau: float = 0.01
    critic_target: str = "reference"  # "reference" (modes) or "paper" (sampled next actions)
    direct_baseline: str = "reference"  # "reference": sum_a' f(a'|s) Q(s,a',b); "none"
    backup: str = "reference"  # the follower's soft-Q backup (games/tabular/follower.py)
    follower_tol: float = 1e-6
    follower_max_sweeps: int = 1000
    dtype: str = "float32"  # of the actor, the critic and every computed quantity

    def validate(self) -> "TrainConfig":
        """Host-side range and choice checks; returns ``self`` (``ValueError`` otherwise)."""
        check_config(
            self,
            positive_ints=(
                "iterations",
                "episodes",
                "minibatch",
                "max_steps",
                "follower_max_sweeps",
            ),
            positive=("actor_lr", "critic_lr", "follower_tol"),
            unit=("tau",),
            choices={
                "buffer": ("on", "off"),
                "actor": ("mlp", "tabular"),
                "init": ("torch", "flax"),
                "critic_target": ("reference", "paper"),
                "direct_baseline": ("reference", "none"),
                "backup": BACKUPS,
            },
        )
        return self


class GameTrainState(NamedTuple):
    """The carry of the outer ``lax.scan``: actor / critic parameters, their targets and Adam
    states, the follower's soft Q [S, A, B] (warm start), the episode buffer, the PRNG key and
    the iteration counter."""

    actor: object
    actor_targ: object
    critic: object
    critic_targ: object
    actor_opt: object
    critic_opt: object
    Q_F: Array  # follower soft Q (warm start)
    buffer: EpisodeBuffer
    key: Array
    step: Array


# the traced hyperparameters (actor_steps, critic_steps, beta), see bchg_jax.games.hparams
HParams = game_hparams("tabular game", __name__, actor_steps=1, critic_steps=1, beta=0.05)


def make_train(
    game: TabularGame, method: str = "bchg", config: TrainConfig = TrainConfig()
) -> Trainer:
    """Pure training functions of an actor-critic leader in a tabular Markov game.

    Algorithm 1 under ``lax.scan`` (module docstring); the actor ascends Theorem 2's estimate
    (:func:`bchg_jax.games.estimators.score_objective`) for ``bchg``, the direct term alone for
    ``naive`` and ``biac``.

    Args:
      game: a :class:`TabularGame` (validated here). method: one of :data:`METHODS`.
      config: the static :class:`TrainConfig`; ``config.dtype`` is the dtype of the leader's
        parameters, the critic and every computed quantity.
    Returns:
      a :class:`~bchg_jax.core.loop.Trainer`; its ``hparams(grid)`` builds :class:`HParams`
      and ``run`` yields per-iteration metrics (``J``, ``J_target_actor``, ``J_discounted``,
      ``batch_return``, ``p``, ``g_S``, ``follower_sweeps``, ``solve_capped`` (1: the
      follower's soft Q-iteration hit ``follower_max_sweeps`` before ``follower_tol``),
      ``update_skipped`` (always 0: no update is dropped)).
    Raises:
      ValueError: an unknown method or a failed ``validate()`` of the game or the config.
    """
    check_setup(game, method, config, METHODS)
    dtype = jnp.dtype(config.dtype)
    S, A, B = game.num_states, game.num_leader_actions, game.num_follower_actions
    T = int(game.time_limit or 150)
    E = config.episodes
    N = E if config.buffer == "on" else E * config.iterations
    gL, gF = game.gamma_L, game.gamma_F
    P = jnp.asarray(game.transition, dtype)
    rL_tab = jnp.asarray(game.leader_reward, dtype)
    eyeS, eyeB = jnp.eye(S, dtype=dtype), jnp.eye(B, dtype=dtype)
    actor_net = MLP(tuple(config.hidden), A, config.init == "torch", dtype)
    critic_net = MLP(tuple(config.hidden), A, config.init == "torch", dtype)
    sb_inputs = jnp.concatenate([jnp.repeat(eyeS, B, 0), jnp.tile(eyeB, (S, 1))], -1)  # [S*B, S+B]
    a_opt, c_opt = optax.adam(config.actor_lr), optax.adam(config.critic_lr)
    guide = "benefit" if method == "bchg" else "none"

    def log_policy(params):
        logits = params if config.actor == "tabular" else actor_net.apply(params, eyeS)
        return jax.nn.log_softmax(logits, -1)  # [S, A]

    def policy(params):
        return jnp.exp(log_policy(params))

    def q_table(params):
        return critic_net.apply(params, sb_inputs).reshape(S, B, A).transpose(0, 2, 1)  # [S,A,B]

    def init(key, hp: HParams):
        hp = hp.cast(dtype)
        ka, kc, kr = jax.random.split(key, 3)
        actor = (
            jnp.zeros((S, A), dtype)
            if config.actor == "tabular"
            else actor_net.init(ka, jnp.zeros((1, S), dtype))
        )
        critic = critic_net.init(kc, jnp.zeros((1, S + B), dtype))
        br = follower(policy(actor), hp.beta)
        return GameTrainState(
            actor,
            actor,
            critic,
            critic,
            a_opt.init(actor),
            c_opt.init(critic),
            br.Q,
            buffer_init(N, T),
            kr,
            jnp.zeros((), jnp.int32),
        )

    def follower(f, beta, Q0=None):
        """The follower's best response to f: soft Q-iteration, warm-started from Q0."""
        return soft_q_iteration(
            game,
            f,
            beta,
            config.backup,
            Q0=Q0,
            tol=config.follower_tol,
            max_sweeps=config.follower_max_sweeps,
        )

    def collect(key, state, f, g):
        """Episodes under (f, g) (uniform leader actions in the very first batch) -> buffer."""
        f_roll = jnp.where(state.step == 0, jnp.full_like(f, 1.0 / A), f)
        ep = rollout(key, game, f_roll, g, E, T)
        s_last = jax.vmap(lambda k, s, a, b: jax.random.categorical(k, jnp.log(P[s, a, b])))(
            jax.random.split(jax.random.fold_in(key, 7), E), ep.s[:, -1], ep.a[:, -1], ep.b[:, -1]
        )
        s_full = jnp.concatenate([ep.s, s_last[:, None]], 1)
        return ep, buffer_add(state.buffer, s_full, ep.a, ep.b, config.buffer)

    def critic_loss(params, targ_actor, targ_critic, g, s, a, b, s2, key):
        Qt = q_table(targ_critic)
        if method == "biac":
            b_star = jnp.argmax(g[s2], -1)  # [M, A]
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

    def critic_update(key, state, g, buf, num_steps):
        """``num_steps`` Adam steps of the critic on uniform minibatches."""
        bs, ba, bb = (x.astype(jnp.int32) for x in (buf.s, buf.a, buf.b))

        def body(i, c):
            params, opt = c
            e, t = sample_uniform(jax.random.fold_in(key, i), buf, config.minibatch)
            grads = jax.grad(critic_loss)(
                params,
                state.actor_targ,
                state.critic_targ,
                g,
                bs[e, t],
                ba[e, t],
                bb[e, t],
                bs[e, t + 1],
                jax.random.fold_in(key, 10_000 + i),
            )
            return adam_step(c_opt, params, opt, grads)

        return masked_steps(body, config.max_steps, num_steps, (state.critic, state.critic_opt))

    def actor_objective(params, Q, g, V_F, beta, e, t, buf):
        """Theorem 2's surrogate on the minibatch of segment starts (e, t)
        (:func:`score_objective`): its gradient in ``params`` is the hypergradient estimate."""
        bs, ba, bb = (x.astype(jnp.int32) for x in (buf.s, buf.a, buf.b))
        logf = log_policy(params)
        fs = jax.lax.stop_gradient(jnp.exp(logf))
        s, a, b = bs[e, t], ba[e, t], bb[e, t]
        q = Q[s, a, b]
        base = jnp.sum(fs[s] * Q[s, :, b], -1) if config.direct_baseline == "reference" else 0.0
        ben = q - jnp.sum(g[s, a] * Q[s, a], -1)
        adv_F = V_F - jnp.sum(fs * V_F, -1, keepdims=True)  # [S, A]
        se, ae = bs[e, :T], ba[e, :T]  # [M, T]
        return score_objective(
            logf[s, a],
            q - base,
            ben,
            logf[se, ae],
            adv_F[se, ae],
            influence_weights(t, T, gF, dtype),
            beta,
            guide,
        )

    def actor_grad(params, Q, g, V_F, beta, e, t, buf):
        """Theorem 2's estimate on the minibatch (an ascent direction, pytree of params)."""
        return jax.grad(actor_objective)(params, Q, g, V_F, beta, e, t, buf)

    def actor_update(key, state, Q, g, V_F, beta, buf, num_steps):
        """``num_steps`` Adam steps of the actor along Theorem 2's estimate (minibatches drawn
        with probability ~ gamma_L^t)."""

        def body(i, c):
            params, opt = c
            e, t = sample_discounted(jax.random.fold_in(key, i), buf, config.minibatch, gL)
            # the loss is the negated surrogate (differentiating it, rather than negating the
            # gradient, keeps XLA's arithmetic identical to a plain loss minimisation)
            grads = jax.grad(lambda p: -actor_objective(p, Q, g, V_F, beta, e, t, buf))(params)
            return adam_step(a_opt, params, opt, grads)

        return masked_steps(body, config.max_steps, num_steps, (state.actor, state.actor_opt))

    def step(state: GameTrainState, hp: HParams):
        hp = hp.cast(dtype)
        beta = hp.beta
        key, k_roll, k_c, k_a = jax.random.split(state.key, 4)
        f = policy(state.actor)
        g = jax.nn.softmax(state.Q_F / beta, -1)
        V_F = beta * jax.nn.logsumexp(state.Q_F / beta, -1)
        ep, buf = collect(k_roll, state, f, g)
        critic, c_state = critic_update(k_c, state, g, buf, hp.critic_steps)
        Q = jax.lax.stop_gradient(q_table(critic))
        actor, a_state = actor_update(k_a, state, Q, g, V_F, beta, buf, hp.actor_steps)
        f_new = policy(actor)
        br = follower(f_new, beta, state.Q_F)
        actor_targ = polyak(actor, state.actor_targ, config.tau)
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
            # the follower's soft Q-iteration stopped at its sweep cap (its answer still used)
            "solve_capped": (~(br.residual <= config.follower_tol)).astype(jnp.int32),
            "update_skipped": jnp.zeros((), jnp.int32),  # this trainer never drops one
        }
        new_state = GameTrainState(
            actor,
            actor_targ,
            critic,
            polyak(critic, state.critic_targ, config.tau),
            a_state,
            c_state,
            br.Q,
            buf,
            key,
            state.step + 1,
        )
        return new_state, metrics

    steps = {
        "log_policy": log_policy,
        "policy": policy,
        "q_table": q_table,
        "follower": follower,
        "collect": collect,
        "critic_update": critic_update,
        "actor_objective": actor_objective,
        "actor_grad": actor_grad,
        "actor_update": actor_update,
    }
    return build_trainer(
        game,
        method,
        config,
        init,
        step,
        lambda grid: HParams.from_grid(grid, dtype, max_steps=config.max_steps),
        lambda hp: HParams.validate(hp, max_steps=config.max_steps),
        steps,
    )
