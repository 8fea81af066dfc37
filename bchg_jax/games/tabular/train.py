"""Actor-critic leaders in tabular Markov games: ``make_train``.

Algorithm 1 with the Markov-game modules: the TD critic (Algorithm 3, with target networks), the
direct term (Algorithm 5, "PartialDerivative") and the influence sums (Algorithm 7,
"FollowerQGrad", Eq. (nablaQF_MG)) of Theorem 2's hypergradient (Eq. (hg_MG)), on the shared
actor-critic skeleton (:mod:`bchg_jax.games.actor_critic`).

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
     (V_F(s_{t+k}, a_{t+k}) - sum_a' f(a'|s_{t+k}) V_F(s_{t+k}, a'))`` over the rest of the episode
     (the derivative of Q_F under the ``paper`` backup: under the default ``reference`` backup
     the estimate is biased for that backup's exact hypergradient, ``docs/followers.md``);
  4. soft update of the target networks (tau); 5. the follower re-solves (soft Q-iteration,
     warm-started).
States and actions are discrete, so the actor and the critic are evaluated as tables
([S, A] and [S, A, B]) once per step and every per-sample quantity is a lookup. The number of
actor / critic steps are traced hyperparameters (masked loops up to ``max_steps``), so the whole
paper grid is one vmapped program. Metrics: the exact undiscounted and discounted leader returns
of (f_theta, g) (:func:`bchg_jax.games.tabular.exact.leader_return`), the batch's mean
undiscounted return, and what the caller's ``metrics_fn`` adds (the toy game's CLI: p = f(0|A)
and g(.|S)).

The follower is the best response of the paper unless ``TrainConfig.follower`` names another
model (``k_step``, ``lag``, ``q_learning``: :mod:`bchg_jax.games.tabular.follower_models`,
``docs/followers.md``). The leader then still reads the follower's policy g (Assumption 1)
and pairs it with V_F = V^g, the soft value of that fixed g against f on the known model
(:func:`~bchg_jax.games.tabular.exact.soft_policy_evaluation`), never the follower's private
table; at the best response V^g is Theorem 2's V_F, and the best-response path is the code of
before (bit-identical runs).
"""

from __future__ import annotations

import dataclasses
import warnings
from typing import Callable, Optional, Tuple

import jax
import jax.numpy as jnp
import optax

from bchg_jax.core.bias_check import discount_weight_beyond
from bchg_jax.core.buffers import buffer_init, index_dtype, sample_discounted, sample_uniform
from bchg_jax.core.follower_model import FollowerSettings, agreement
from bchg_jax.core.loop import Trainer, check_setup
from bchg_jax.core.networks import MLP
from bchg_jax.core.rounding import within_tolerance
from bchg_jax.core.validate import logits_rounded, warn_float32_long_horizon
from bchg_jax.games.actor_critic import (
    Critic,
    Leader,
    LeaderConfig,
    assemble,
    problem_metrics,
    store,
    transitions,
    validate_checks,
)
from bchg_jax.games.estimators import influence_weights, score_objective
from bchg_jax.games.hparams import game_hparams
from bchg_jax.games.tabular.exact import (
    as_if_optimal_hypergradient,
    exact_hypergradient,
    k_step_hypergradient,
    lag_hypergradient,
    leader_return,
    leader_returns,
)
from bchg_jax.games.tabular.follower import BACKUPS, response_from_q, soft_q_iteration
from bchg_jax.games.tabular.follower_models import follower_pieces
from bchg_jax.games.tabular.game import TabularGame
from bchg_jax.games.tabular.rollout import log_probs, rollout

Array = jax.Array
# bchg: BC-HG (Theorem 2); naive: Naive-PGD (direct term only); biac: the paper's Bi-AC variant
# (Stackelberg-operator critic target, direct-term actor)
METHODS = ("bchg", "naive", "biac")
# the direct term's baseline: "reference" sum_a' f(a'|s) Q(s, a', b) with the sampled b (the
# reference implementation's; biased, b depends on a), "state" the critic's V_L(s) =
# sum_{a', b'} f(a'|s) g(b'|s, a') Q(s, a', b') (unbiased), "none"
DIRECT_BASELINES = ("reference", "state", "none")


@dataclasses.dataclass(frozen=True)
class TrainConfig(FollowerSettings, LeaderConfig):
    """Static (non-traced) settings of the tabular game trainer; ``validate()`` checks them.

    Attributes:
      iterations, episodes, buffer, minibatch, max_steps, tau, follower_tol, dtype: as
        :class:`~bchg_jax.games.actor_critic.LeaderConfig` (``episodes`` of ``game.time_limit``
        steps, default 150; ``minibatch`` for the actor and the critic; ``follower_tol``: the
        sup-norm tolerance of the follower's soft Q-iteration).
      actor: ``"mlp"`` (network on one-hot states) or ``"tabular"`` (softmax logits [S, A]).
      hidden: hidden layer sizes of the actor and critic networks.
      init: ``"torch"`` (U(+-1/sqrt(fan_in)) kernels, the reference) or ``"flax"``.
      actor_lr: Adam learning rate of the actor.
      critic_lr: Adam learning rate of the critic.
      critic_target: ``"reference"`` (modes of the target actor and of g) or ``"paper"``
        (sampled next actions).
      direct_baseline: the direct term's baseline (:data:`DIRECT_BASELINES`):
        ``"reference"`` (sum_a' f(a'|s) Q(s, a', b), the reference implementation's) uses the
        sampled b ~ g(.|s, a), which depends on a, so it is biased: in exact expectation the
        bias is 8% of the direct term's norm on the toy game (R = 2, beta 0.05; 0.8% of the
        exact hypergradient's norm at p = 0.45, 3.5 times it at p = 0.51, where the gradient is
        small; it pushes p down) and 50% of the exact hypergradient's norm on
        ``problems.random_tabular_game`` (beta 0.5); ``"state"`` (the critic's
        V_L(s) = sum_{a', b'} f(a'|s) g(b'|s, a') Q(s, a', b'), unbiased) or ``"none"``.
      backup: the follower's soft-Q backup (:mod:`bchg_jax.games.tabular.follower`);
        Theorem 2's estimator is unbiased (exact critics) for the ``"paper"`` backup's
        hypergradient only: under ``"reference"`` (the reference implementation's, the
        default) its expectation differs from ``exact_hypergradient(..., "reference")`` (2.5%
        on the toy game at p = 0.45; 76% on a random 5-state game).
      follower_max_sweeps: the soft Q-iteration's sweep cap.
      follower: the simulated follower
        (:class:`~bchg_jax.core.follower_model.FollowerModel`; default: the best response, the
        paper's setting; the others: :mod:`bchg_jax.games.tabular.follower_models`).
      track_reference: add per-iteration metrics comparing the leader's hypergradient estimate
        with the exact references of the config's ``backup`` (``cos_target``,
        ``proj_target``, ``cos_through``, ``proj_through``; :func:`make_train`).
    """

    episodes: int = 3
    max_steps: int = 20  # upper bound of the actor / critic step grids
    actor: str = "mlp"  # "mlp" (64-64 on one-hot s) or "tabular" (softmax logits)
    hidden: Tuple[int, ...] = (64, 64)
    init: str = "torch"  # "torch": U(+-1/sqrt(fan_in)) kernels (the reference);
    # "flax": flax's lecun_normal default
    actor_lr: float = 1e-4
    critic_lr: float = 1e-3
    critic_target: str = "reference"  # "reference" (modes) or "paper" (sampled next actions)
    direct_baseline: str = "reference"  # DIRECT_BASELINES: "reference" (biased), "state", "none"
    backup: str = "reference"  # the follower's soft-Q backup (games/tabular/follower.py)
    follower_max_sweeps: int = 1000

    CHECKS = dict(
        positive_ints=("follower_max_sweeps",),
        positive=("actor_lr", "critic_lr"),
        choices={
            "actor": ("mlp", "tabular"),
            "init": ("torch", "flax"),
            "critic_target": ("reference", "paper"),
            "direct_baseline": DIRECT_BASELINES,
            "backup": BACKUPS,
        },
    )

    def validate(self) -> "TrainConfig":
        """Host-side checks of every field, the nested ``follower`` included; returns ``self``
        (``ValueError`` naming the field otherwise, e.g. ``FollowerModel.steps``)."""
        validate_checks(self)
        self.check_follower()
        return self


# track_reference warns when the discount weight beyond the episodes' cut exceeds this
TRUNCATION_WARN = 1e-3
# segment starts of the one minibatch (drawn ~ gamma_L^t) of track_reference's estimate
TRACK_MINIBATCH = 1024

# the traced hyperparameters (actor_steps, critic_steps, beta), see bchg_jax.games.hparams
HParams = game_hparams("tabular game", __name__, actor_steps=1, critic_steps=1, beta=0.05)


def td_target(method: str, critic_target: str, Qt, f_targ, g, s2, key):
    """Q_targ at the next state s' [M] of the TD target ``r_L + gamma_L Q_targ(s', a*, b*)``.

    ``critic_target="reference"``: a* / b* the modes of the target actor ``f_targ`` [S, A] and of
    g [S, A, B]; ``"paper"``: sampled from them (``key``); method ``biac``: the Stackelberg
    operator ``max_a' Q_targ(s', a', b*(a'))``. ``Qt`` [S, A, B] is the target critic's table.
    """
    if method == "biac":
        b_star = jnp.argmax(g[s2], -1)  # [M, A]
        return jnp.max(jnp.take_along_axis(Qt[s2], b_star[..., None], -1)[..., 0], -1)
    if critic_target == "reference":
        a_star = jnp.argmax(f_targ[s2], -1)
        return Qt[s2, a_star, jnp.argmax(g[s2, a_star], -1)]
    ka, kb = jax.random.split(key)
    a2 = jax.random.categorical(ka, log_probs(f_targ[s2]))
    return Qt[s2, a2, jax.random.categorical(kb, log_probs(g[s2, a2]))]


def surrogate(logf, Q, g, V_F, beta, e, t, buf, gamma_F, direct_baseline: str, guide: str):
    """Theorem 2's surrogate (:func:`~bchg_jax.games.estimators.score_objective`) on the
    minibatch of segment starts (e, t) [M] of ``buf``: its gradient in the leader's parameters
    (through ``logf`` = log f [S, A]) is the hypergradient estimate.

    ``Q`` [S, A, B] is the critic's table, ``g`` [S, A, B] and ``V_F`` [S, A] the follower's
    policy and soft value; ``direct_baseline`` (:data:`DIRECT_BASELINES`) ``"reference"``
    subtracts ``sum_a' f(a'|s) Q(s, a', b)`` in the direct term (biased: the sampled b depends
    on a), ``"state"`` ``sum_{a', b'} f(a'|s) g(b'|s, a') Q(s, a', b')`` (unbiased), ``"none"``
    nothing; the influence uses the baseline ``sum_a' f(a'|s_k) V_F(s_k, a')``; ``guide``
    ``"none"``: the direct term alone.
    """
    T = buf.a.shape[1]
    bs, ba, bb = (x.astype(jnp.int32) for x in (buf.s, buf.a, buf.b))
    fs = jax.lax.stop_gradient(jnp.exp(logf))
    s, a, b = bs[e, t], ba[e, t], bb[e, t]
    q = Q[s, a, b]
    base = 0.0
    if direct_baseline == "reference":  # the sampled b depends on a: biased
        base = jnp.sum(fs[s] * Q[s, :, b], -1)
    elif direct_baseline == "state":  # the critic's V_L(s) = sum_{a', b'} f g Q: unbiased
        base = jnp.sum(fs[s][..., None] * g[s] * Q[s], (-2, -1))
    ben = q - jnp.sum(g[s, a] * Q[s, a], -1)
    adv_F = V_F - jnp.sum(fs * V_F, -1, keepdims=True)  # [S, A]
    se, ae = bs[e, :T], ba[e, :T]  # [M, T]
    W = influence_weights(t, T, gamma_F, logf.dtype)
    return score_objective(logf[s, a], q - base, ben, logf[se, ae], adv_F[se, ae], W, beta, guide)


def make_train(
    game: TabularGame,
    method: str = "bchg",
    config: TrainConfig = TrainConfig(),
    metrics_fn: Optional[Callable] = None,
) -> Trainer:
    """Pure training functions of an actor-critic leader in a tabular Markov game.

    Algorithm 1 under ``lax.scan`` (module docstring) on the shared actor-critic skeleton; the
    actor ascends Theorem 2's estimate (:func:`surrogate`) for ``bchg``, the direct term alone
    for ``naive`` and ``biac``.

    Args:
      game: a :class:`TabularGame` (validated here). method: one of :data:`METHODS`.
      config: the static :class:`TrainConfig`; ``config.dtype`` is the dtype of the leader's
        parameters, the critic and every computed quantity: the game's tables are cast to it
        once, here (:meth:`~bchg_jax.games.tabular.game.TabularGame.astype`), so a float64
        game under the default float32 config trains in float32 (pass
        ``dtype=jnp.float64``, with ``jax_enable_x64``, for a float64 run), and a float32 game
        under a float64 config trains in float64 on its float32 tables' values. (The family's
        pure functions instead promote the game with the policy:
        :func:`~bchg_jax.games.tabular.game.compute_dtype`.)
      metrics_fn: optional ``metrics_fn(f, response)`` -> dict of [] arrays added to every
        iteration's metrics, from the leader's policy f [S, A] and the follower's response (a
        :class:`~bchg_jax.games.tabular.follower.GameBestResponse` for the paper's follower, a
        :class:`~bchg_jax.games.tabular.follower_models.FollowerResponse` for the others; both
        have ``policy``, ``Q`` and ``V``) (the problem's own, e.g.
        :func:`bchg_jax.problems.toy_game.toy_game_metrics`).
    Returns:
      a :class:`~bchg_jax.core.loop.Trainer`; its ``hparams(grid)`` builds :class:`HParams`
      and ``run`` yields per-iteration metrics (``J``, ``J_target_actor``, ``J_discounted``:
      exact returns of the leader's f and the follower's actual g; ``batch_return``,
      ``follower_sweeps``, ``solve_capped`` (1: the best response's soft Q-iteration hit
      ``follower_max_sweeps`` before ``follower_tol`` or the float rounding floor of
      :mod:`bchg_jax.core.rounding`: the follower's own solve, or for
      ``k_step`` / ``q_learning`` the one behind ``follower_gap``; K backups have no tolerance
      to miss), ``update_skipped`` (1: some actor step's gradient was not finite, e.g. a diverged
      critic, and the iteration's actor update was undone), and those of
      ``metrics_fn``). A follower that is not the best response adds ``follower_gap``
      (max |g - g^dagger(f)|). ``config.track_reference`` adds, from each iteration's start,
      the cosine ``cos_<ref>`` and the projection ``proj_<ref>`` = <est, ref> / |ref|^2 of the
      estimate ``est`` (Z = sum_{t<T} gamma_L^t times the gradient of the method's own actor
      objective at the starting actor with the iteration's updated critic, on one minibatch of
      :data:`TRACK_MINIBATCH` segment starts ~ gamma_L^t / Z drawn from a key of its own: the
      same for every method; so ``proj`` is 1 for an unbiased estimate)
      against ``target`` (:func:`~bchg_jax.games.tabular.exact.as_if_optimal_hypergradient`
      at the follower's current g) and ``through`` (the derivative through the follower's
      actual reaction: :func:`~bchg_jax.games.tabular.exact.exact_hypergradient` for the best
      response, :func:`~bchg_jax.games.tabular.exact.k_step_hypergradient` from its current
      Q, :func:`~bchg_jax.games.tabular.exact.lag_hypergradient` from its current g; NaN for
      ``q_learning``, whose update is sample-based). The references are exact (the known
      model) in the config's dtype and ``backup``, at the follower's warm-started solution;
      under the ``reference`` backup Theorem 2's estimator is not unbiased for them (nor is
      the ``reference`` direct baseline under either backup), so ``proj`` then also measures
      that bias.
    Raises:
      ValueError: an unknown method, a game without ``time_limit``, or a failed ``validate()``
        of the game or the config.
    Warns:
      UserWarning: ``track_reference`` with a discount weight beyond ``time_limit``
        (:func:`~bchg_jax.core.bias_check.discount_weight_beyond`) above
        :data:`TRUNCATION_WARN` (the references have no time limit; the toy game's 150 steps at
        0.99 leave 0.55).
    """
    check_setup(game, method, config, METHODS)
    warn_float32_long_horizon(
        f"{game.name}: games.tabular.make_train", config.dtype, game.gamma_F, game.gamma_L
    )
    if game.time_limit is None:  # the episodes' length and the exact J's horizon
        raise ValueError(
            "make_train needs game.time_limit: the trainer's episodes have that many steps "
            "(e.g. dataclasses.replace(game, time_limit=150))"
        )
    cut = discount_weight_beyond(game.gamma_L, game.gamma_F, int(game.time_limit))
    if config.track_reference and cut > TRUNCATION_WARN:
        warnings.warn(
            f"{game.name}: track_reference compares the estimates with infinite-horizon exact "
            f"references, but the episodes end at time_limit {game.time_limit}, which leaves "
            f"{cut:.3g} of the discount weight beyond it: the estimates target the gradient "
            "truncated there, so cos_* / proj_* also measure the truncation (a longer "
            "time_limit removes it)",
            stacklevel=2,
        )
    dtype, model = jnp.dtype(config.dtype), config.follower
    # the run's dtype is the config's, not the promotion of the pure functions
    # (games.tabular.game.compute_dtype): the game's tables are cast to it once, so the
    # follower's warm start, the buffers and every metric keep one dtype (the trainer records
    # the game as given)
    given, game = game, game.astype(dtype)
    S, A, B = game.num_states, game.num_leader_actions, game.num_follower_actions
    T, E, M, gL = int(game.time_limit), config.episodes, config.minibatch, game.gamma_L
    N = E if config.buffer == "on" else E * config.iterations
    P, rL = jnp.asarray(game.transition, dtype), jnp.asarray(game.leader_reward, dtype)
    eyeS, eyeB = jnp.eye(S, dtype=dtype), jnp.eye(B, dtype=dtype)
    net = MLP(tuple(config.hidden), A, config.init == "torch", dtype)  # the actor's and critic's
    sb_inputs = jnp.concatenate([jnp.repeat(eyeS, B, 0), jnp.tile(eyeB, (S, 1))], -1)  # [S*B, S+B]
    guide = "benefit" if method == "bchg" else "none"

    def log_policy(params):
        logits = params if config.actor == "tabular" else net.apply(params, eyeS)
        return jax.nn.log_softmax(logits, -1)  # [S, A]

    def policy(params):
        return jnp.exp(log_policy(params))

    def q_table(params):
        return net.apply(params, sb_inputs).reshape(S, B, A).transpose(0, 2, 1)  # [S, A, B]

    def init_actor(key):
        tabular = config.actor == "tabular"
        return jnp.zeros((S, A), dtype) if tabular else net.init(key, jnp.zeros((1, S), dtype))

    def follower(actor, beta, Q0=None):
        """The follower's best response to f: soft Q-iteration, warm-started from Q0."""
        tol, cap = config.follower_tol, config.follower_max_sweeps
        return soft_q_iteration(game, policy(actor), beta, config.backup, Q0, tol, cap)

    def behaviour(state):
        """The leader's policy in the batch: f, or uniform actions in the very first batch."""
        return jnp.where(state.step == 0, 1.0 / A, policy(state.actor))

    def collect(key, state, resp):
        """Episodes under (f, g) (uniform leader actions in the very first batch) -> buffer;
        returns them with the last next state (``s`` [E, T+1])."""
        ep = rollout(key, game, behaviour(state), resp.policy, E, T)
        s_last = jax.vmap(lambda k, s, a, b: jax.random.categorical(k, log_probs(P[s, a, b])))(
            jax.random.split(jax.random.fold_in(key, 7), E), ep.s[:, -1], ep.a[:, -1], ep.b[:, -1]
        )
        full = ep._replace(s=jnp.concatenate([ep.s, s_last[:, None]], 1))
        return store(state, full, config.buffer), full

    def critic_task(state, resp):
        """The critic, its TD loss and uniform minibatches of transitions."""
        ints = jax.tree.map(lambda x: x.astype(jnp.int32), state.buffer)
        Qt, f_targ = q_table(state.critic_targ), policy(state.actor_targ)

        def loss(params, batch, key):
            s, a, b, s2 = batch
            nxt = td_target(method, config.critic_target, Qt, f_targ, resp.policy, s2, key)
            y = jax.lax.stop_gradient(rL[s, a, b] + gL * nxt)
            return jnp.mean((q_table(params)[s, a, b] - y) ** 2)

        return state.critic, loss, lambda k: transitions(ints, *sample_uniform(k, ints, M))

    def actor_objective(params, Q, g, V_F, beta, e, t, buf):
        """:func:`surrogate` of the leader ``params``."""
        args = (game.gamma_F, config.direct_baseline, guide)
        return surrogate(log_policy(params), Q, g, V_F, beta, e, t, buf, *args)

    def actor_task(state, critic, resp, beta):
        """Theorem 2's surrogate with the critic's table, on minibatches ~ gamma_L^t."""
        Q, buf = jax.lax.stop_gradient(q_table(critic.params)), state.buffer

        def objective(params, et, _):
            return actor_objective(params, Q, resp.policy, resp.V, beta, *et, buf)

        return objective, lambda key: sample_discounted(key, buf, M, gL), True

    def metrics(state, br, ep, beta, grad_norm, accepted):
        f = policy(state.actor)
        # converged: the last change within follower_tol or at the rounding floor (core.rounding)
        solved = br.Q if model.best_response else br.best  # the Q of the best-response solve
        capped = ~within_tolerance(br.residual, solved, config.follower_tol)
        gap = {} if model.best_response else {"follower_gap": br.gap}
        J, J_discounted = leader_returns(game, f, br.policy, (1.0, gL))  # one scan for both
        return {
            "J": J,
            # the slowly moving target actor against the same follower (the reference's
            # evaluation policy is its target actor: "AverageTargetReturn")
            "J_target_actor": leader_return(game, policy(state.actor_targ), br.policy),
            "J_discounted": J_discounted,
            "batch_return": jnp.mean(jnp.sum(rL[ep.s[:, :T], ep.a, ep.b], -1)),
            "follower_sweeps": br.sweeps,
            "solve_capped": capped.astype(jnp.int32),  # at its sweep cap (the answer still used)
            # an actor update from a gradient that was not finite is undone (a diverged critic)
            "update_skipped": (~accepted).astype(jnp.int32),
            "logits_rounded": logits_rounded(solved, beta),  # float32 and a small beta
            **gap,
            **problem_metrics(metrics_fn, f, br),
        }

    def through_reference(actor, resp, beta):
        """The exact derivative of J_L through the simulated follower's reaction to the leader
        (None for ``q_learning``, whose update is sample-based)."""
        args = (policy, actor, game)
        if model.kind == "best_response":
            # tol=None: the trainer flags its own capped solves (solve_capped)
            return exact_hypergradient(*args, beta, config.backup, Q_star=resp.Q, tol=None)
        if model.kind == "k_step":
            return k_step_hypergradient(*args, resp.own, beta, model.steps, config.backup)
        if model.kind == "lag":
            g = resp.policy
            return lag_hypergradient(*args, g, beta, model.mix, config.backup, resp.best, tol=None)
        return None

    # Z = sum_{t<T} gamma_L^t: the actor's minibatch mean over segment starts drawn with
    # probability gamma_L^t / Z estimates the gradient over Z (Theorem 2's sum over t)
    Z = jnp.sum(gL ** jnp.arange(T, dtype=dtype))

    def reference_metrics(key, actor, Q, resp, beta, buf):
        """``track_reference``'s metrics of the leader ``actor`` with the critic's table ``Q``
        [S, A, B] and the follower's ``resp`` on the episodes of ``buf`` (:func:`make_train`):
        the estimate is Z times the gradient of the actor objective on one minibatch, so that
        its mean is the gradient the surrogate targets and ``proj`` is 1 for an unbiased one."""
        e, t = sample_discounted(key, buf, TRACK_MINIBATCH, gL)
        grad = jax.grad(actor_objective)(actor, Q, resp.policy, resp.V, beta, e, t, buf)
        est = jax.tree.map(lambda x: Z * x, grad)
        # log g in log space (a best response's log_softmax(Q_F / beta)): exact where g underflows
        log_g = getattr(resp, "log_policy", None)
        log_g = jax.nn.log_softmax(resp.Q / beta, -1) if log_g is None else log_g
        target = as_if_optimal_hypergradient(
            policy, actor, game, resp.policy, beta, config.backup, log_g=log_g
        )
        through = through_reference(actor, resp, beta)
        return {**agreement(est, target, "target"), **agreement(est, through, "through")}

    def diagnostics(key, state, critic, resp, beta):
        """``track_reference``: the estimate against the exact references (:func:`make_train`)."""
        Q = jax.lax.stop_gradient(q_table(critic.params))
        return reference_metrics(key, state.actor, Q, resp, beta, state.buffer)

    def follower_model():
        """(follower, warm, respond, learn) pieces of ``config.follower``."""
        if model.best_response:  # the paper's follower: the code path of before
            zero = jnp.zeros((), jnp.int32)
            # g and V_F of the follower's soft Q, kept from the last solve
            respond = lambda state, beta: response_from_q(state.follower, beta, zero, 0.0)  # noqa: E731
            return follower, (lambda br: br.Q), respond, None
        tol, cap = config.follower_tol, config.follower_max_sweeps
        pieces = follower_pieces(game, model, config.backup, tol, cap)

        def follow(actor, beta, memory=None):
            return pieces.follower(policy(actor), beta, memory)

        def learn(state, resp, episodes, beta):  # under the f that acted in the batch
            return pieces.learn(behaviour(state), resp, episodes, beta)

        # the memory is the whole FollowerResponse
        respond = lambda state, beta: state.follower  # noqa: E731
        return follow, (lambda resp: resp), respond, (None if pieces.learn is None else learn)

    follow, warm, respond, learn = follower_model()
    leader = Leader(
        init_actor=init_actor,
        init_critic=lambda key: Critic(net.init(key, jnp.zeros((1, S + B), dtype))),
        buffers=lambda: (buffer_init(N, T, index_dtype(S, A, B)), None),
        follower=follow,
        warm=warm,
        respond=respond,
        collect=collect,
        critic=critic_task,
        actor=actor_task,
        metrics=metrics,
        learn=learn,
        diagnostics=diagnostics if config.track_reference else None,
    )
    a_opt, c_opt = optax.adam(config.actor_lr), optax.adam(config.critic_lr)
    steps = dict(log_policy=log_policy, policy=policy, q_table=q_table, follower=follow)
    steps.update(collect=collect, actor_objective=actor_objective, diagnostics=diagnostics)
    steps["reference_metrics"] = reference_metrics
    steps["critic_task"] = critic_task  # (critic, loss, draw), as the LQR game's
    steps["actor_grad"] = jax.grad(actor_objective)
    return assemble(given, method, config, leader, HParams, a_opt, c_opt, steps)
