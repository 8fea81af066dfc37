"""Actor-critic leaders in the bi-level LQR Markov game: ``make_train``.

Algorithm 1 with the Markov-game modules (TD critic with target networks, Algorithm 3; direct
term, Algorithm 5; FollowerQGrad, Algorithm 7) for Theorem 2 (Eq. (hg_MG)) and, for the
deterministic methods, the appendix's Theorem 3 (Eq. (hg_MG_det)), on the shared actor-critic
skeleton (:mod:`bchg_jax.games.actor_critic`).

The leader is linear, ``K_theta = theta.reshape(k, n)``: Gaussian ``N(K s, U U^T)`` for the
stochastic methods, ``a = K s`` for the deterministic ones, and each method's episodes come from
its own leader. (Before, every method collected with the Gaussian leader, as the reference
implementation does; Theorem 3's estimate then evaluated the critic and the influence sums at
``a = K s`` on states and follower actions that answered the noisy ``a``: not measurable at the
paper's U = 1e-3, 15% of the norm (11 SE over 400 batches) on a random 3-d game with U ~ 0.3
and exact critics; ``tests/games/lqr/test_det_episodes.py``.)
The deterministic methods' critic sees the leader's actions vary only through the warm-up's
random leader and the behaviour episodes (``exploration.episodes``), as in off-policy DPG.
The follower is Proposition 2's best response, re-solved (warm-started Riccati) every
iteration, unless ``TrainConfig.follower`` is a K-step learner
(:mod:`bchg_jax.games.lqr.follower_models`, ``docs/followers.md``): the leader then plays
against the learner's policy paired with ``V^g`` (the value of that fixed policy), and the best
response is still solved beside it for ``follower_gap`` and ``solve_capped``. One outer
iteration (the reference implementation's settings,
``docs/experiments.md``):

  1. ``episodes`` episodes of ``horizon`` steps from s0 with the leader's own policy (while
     fewer than ``exploration.warmup_steps`` env steps have been taken, the leader acts
     N(0, warmup_std^2) at random), added to the actor's buffer (``"on"``: the newest batch;
     ``"off"``: every episode); with ``exploration.episodes`` behaviour episodes
     ``a = K s + std * eps`` as well, which feed only the critic's replay ring;
  2. ``critic_steps`` updates of the MLP critic Q_L(s, a, b) on uniform minibatches with target
     ``r_L(s) + gamma_L Q_targ(s', K_targ s', b')``, b' the follower's mean action (or the
     mean over ``critic.target_samples`` draws b' ~ g(.|s', K_targ s'));
  3. ``actor_steps`` updates on minibatches drawn with probability ~ gamma_L^t (skipped during the
     warm-up, by every method: ``exact`` and ``exact_direct`` wait too, so that every curve
     starts its ascent at the same iteration), the gradient clipped to ``actor.clip`` (global
     norm) before Adam, along the estimate of :mod:`bchg_jax.games.lqr.estimator`:
     * ``bchg`` / ``naive`` (Theorem 2, score-function form): the direct term and, for
       ``bchg``, the guiding term ``(1/beta) Ben(s,a,b) I`` with the influence
       ``I = sum_{k>=0} gF^k grad log f(a_{t+k}|s_{t+k}) V_F(s_{t+k}, a_{t+k})``;
     * ``bchg_det`` / ``naive_det`` (Theorem 3): ``grad_a Q(s,a,b)|_{a=Ks} s^T`` and, for
       ``bchg_det``, ``(1/beta) Ben(s,Ks,b) sum_k gF^k grad_a Q_F(s_k, K s_k, b_k) s_k^T``
       (grad_a Q_F from the white-box follower);
     * ``exact``: ascent on the exact discounted return (the reference curve); ``exact_direct``
       on its direct part only (the follower's policy held at the iteration's start: what
       Naive-PGD estimates);
  4. soft update (``tau``) of the target critic and the target leader; the follower re-solves
     (an actor update after which the Riccati iteration does not converge within
     ``follower_max_iters``, or from a gradient that was not finite, is undone and counted in
     the ``update_skipped`` metric).

Metrics per iteration: the exact undiscounted return over the horizon (``J``, the paper's
y-axis), the discounted one, the batch's sampled return, the last gradient norm, the follower's
Riccati status, the health flags (``update_skipped``, ``solve_capped``, ``metric_nonfinite``),
and what the caller's ``metrics_fn`` adds (the CLI: the gains K1, K2).
"""

from __future__ import annotations

import dataclasses
import warnings
from typing import Callable, Optional

import jax
import jax.numpy as jnp
import numpy as np
import optax

from bchg_jax.core.buffers import (
    EpisodeBuffer,
    buffer_init,
    sample_discounted,
    sample_uniform,
    stored,
)
from bchg_jax.core.follower_model import agreement
from bchg_jax.core.loop import Trainer, check_setup
from bchg_jax.core.networks import MLP
from bchg_jax.games.actor_critic import (
    Critic,
    Leader,
    assemble,
    critic_data,
    problem_metrics,
    store,
    transitions,
)
from bchg_jax.games.hparams import game_hparams
from bchg_jax.games.lqr.config import TrainConfig
from bchg_jax.games.lqr.estimator import (
    Estimator,
    deterministic_surrogate,
    estimator,
    follower_mean_q,
    score_surrogate,
)
from bchg_jax.games.lqr.exact import exact_hypergradient, leader_objective, leader_returns
from bchg_jax.games.lqr.follower import best_response
from bchg_jax.games.lqr.follower_models import LearnerResponse, gain_gap, k_step_response
from bchg_jax.games.lqr.follower_references import (
    as_if_optimal_hypergradient,
    k_step_hypergradient,
)
from bchg_jax.games.lqr.game import LQRGame, leader_mean, leader_reward
from bchg_jax.games.lqr.rollout import rollout

Array = jax.Array
# bchg / naive: Gaussian leader (Theorem 2 / direct term only); *_det: deterministic leader
# (Theorem 3); exact: ascent on the exact discounted return; exact_direct: on its direct part
# only (the follower's policy held fixed: what Naive-PGD estimates)
METHODS = ("bchg", "naive", "bchg_det", "naive_det", "exact", "exact_direct")
DETERMINISTIC = ("bchg_det", "naive_det")
EXACT = ("exact", "exact_direct")
GUIDED = ("bchg", "bchg_det")  # the methods with Theorem 2's / 3's guiding term
SCORE = ("bchg", "naive")  # the score-function methods: need a non-singular leader scale U

# segment starts of the one minibatch (drawn ~ gamma_L^t) of track_reference's estimate
TRACK_MINIBATCH = 1024

# the traced hyperparameters (actor_steps, critic_steps, beta), see bchg_jax.games.hparams
HParams = game_hparams("LQR game", __name__, actor_steps=1, critic_steps=5, beta=0.1)


def warmup_iterations(config: TrainConfig, horizon: int) -> int:
    """Outer iterations of the critic-only warm-up: ``exploration.warmup_steps`` environment
    steps over the ``(episodes + exploration.episodes) * horizon`` collected per iteration,
    rounded up (the leader takes no actor step in them)."""
    per_iteration = (config.episodes + config.exploration.episodes) * int(horizon)
    return -(-config.exploration.warmup_steps // per_iteration)


def actor_updates(config: TrainConfig, horizon: int, actor_steps):
    """The leader's optimizer steps in a run of ``config.iterations``: ``actor_steps`` (cut
    at ``max_steps``; may be traced) in every iteration after the warm-up (at least 1). A
    ``"cosine"`` learning rate decays over them (:meth:`ActorConfig.learning_rate`); an update
    the follower cannot answer is undone with its optimizer step, so such a run takes fewer."""
    after = max(config.iterations - warmup_iterations(config, horizon), 1)
    return after * jnp.minimum(jnp.asarray(actor_steps, jnp.int32), config.max_steps)


def input_scale(buf: EpisodeBuffer, floor: float = 1e-3):
    """(mean, std) [n+k+m] of the (s, a, b) transitions stored in ``buf`` (its filled slots).

    The critic's input normalisation (``CriticConfig.normalize``); ``std`` is at least ``floor``.
    """
    n_slots = buf.s.shape[0]
    w = (jnp.arange(n_slots) < stored(buf)).astype(buf.s.dtype)[:, None, None]
    x = jnp.concatenate([buf.s[:, :-1], buf.a, buf.b], -1)  # [N, T, n+k+m]
    tot = jnp.sum(w) * x.shape[1]
    mean = jnp.sum(w * x, (0, 1)) / tot
    var = jnp.sum(w * (x - mean) ** 2, (0, 1)) / tot
    return jax.lax.stop_gradient(mean), jax.lax.stop_gradient(jnp.sqrt(var) + floor)


def critic_value(net, q_scale: float, critic: Critic, s, a, b):
    """Q_L(s, a, b) [...] of a :class:`~bchg_jax.games.actor_critic.Critic` (inputs standardised
    by ``critic.scale``; the network ``net`` outputs ``q_scale * Q_L``)."""
    x = jnp.concatenate([s, a, b], -1)
    if critic.scale is not None:
        x = (x - critic.scale[0]) / critic.scale[1]
    return net.apply(critic.params, x)[..., 0] / q_scale


def td_loss(Q, game, samples: int, params, state, scale, resp, s, a, b, s2, key):
    """TD loss of the critic ``Q(Critic, s, a, b)`` (Algorithm 3) on the transitions (s, a, b, s')
    [M] against ``r_L(s) + gamma_L E_b' Q_targ(s', K_targ s', b')``, b' the follower's mean
    action (``samples`` = 0) or the mean over ``samples`` draws b' ~ g(.|s', K_targ s')."""
    targ = Critic(state.critic_targ, scale)
    a2 = leader_mean(game, state.actor_targ, s2)
    if samples:
        nxt = follower_mean_q(lambda *x: Q(targ, *x), resp, key, s2, a2, samples)
    else:
        nxt = Q(targ, s2, a2, resp.mean(s2, a2))
    y = leader_reward(game, s) + game.gamma_L * nxt
    return jnp.mean((Q(Critic(params, scale), s, a, b) - jax.lax.stop_gradient(y)) ** 2)


def make_train(
    game: LQRGame,
    method: str = "bchg",
    config: TrainConfig = TrainConfig(),
    metrics_fn: Optional[Callable] = None,
    estimator_pieces: Optional[Estimator] = None,
) -> Trainer:
    """Pure training functions of a linear leader in the bi-level LQR game (module docstring).

    Args:
      game: an :class:`~bchg_jax.games.lqr.game.LQRGame` (validated here).
      method: one of :data:`METHODS`.
      config: the static :class:`~bchg_jax.games.lqr.config.TrainConfig`; ``config.dtype`` is
        the dtype of theta, the critic, the buffers and every computed quantity.
      metrics_fn: optional ``metrics_fn(theta, response)`` -> dict of [] arrays added to every
        iteration's metrics (the problem's own, e.g.
        :func:`bchg_jax.problems.lqr_game.gain_metrics`).
      estimator_pieces: the :class:`~bchg_jax.games.lqr.estimator.Estimator` (default: the one
        of ``config.estimator``).
    Returns:
      a :class:`~bchg_jax.core.loop.Trainer`; its ``hparams(grid)`` builds :class:`HParams`
      and ``run`` yields per-iteration metrics (``J``, ``J_discounted``, ``batch_return``,
      ``grad_norm``, ``update_skipped`` (1 when the update was undone: the follower's Riccati
      iteration at the new theta did not converge, or some actor step's gradient was not
      finite: a non-finite ``grad_norm``; a finite gradient with a huge norm is clipped, not
      skipped), ``solve_capped`` (1 when a Riccati solve failed: the follower's at the new
      theta or at the kept one, or the exact methods' own solve), ``metric_nonfinite`` (1
      when the exact return ``J`` or ``J_discounted`` is not finite: the state's moments
      overflowed the dtype, a closed loop with rho(F)^t beyond its range;
      :mod:`bchg_jax.core.health` counts it),
      ``riccati_iterations``, and those of ``metrics_fn``; with ``config.follower`` k_step
      also ``follower_gap`` (max |K - K^dagger| of the gains) and ``diverging`` (1 when the
      update was undone because the value V^g of the learner's new policy diverged under
      gamma_F, its best-response solve converged: counted in ``update_skipped``, not in
      ``solve_capped``); with ``config.track_reference`` ``cos_target``, ``proj_target``,
      ``cos_through``, ``proj_through``).
    Raises:
      ValueError: an unknown method, a failed ``validate()`` of the game or the config, a
        start theta = 0 (``theta0_std`` 0) at which the follower's problem is not
        stabilisable, or a singular leader scale U (a zero diagonal entry) with a
        Gaussian-leader score method (``bchg``, ``naive``: log f_theta(a|s) is undefined).
    Warns:
      UserWarning: a deterministic method (``bchg_det``, ``naive_det``) without behaviour
        episodes (``config.exploration.episodes`` = 0): its critic never sees the leader's
        action vary after the warm-up, so its ``grad_a Q_L`` is not identified by the data.
    """
    check_setup(game, method, config, METHODS)
    if config.actor.theta0_std == 0:  # every run starts at theta = 0: one the follower answers
        try:
            game.validate(np.zeros(game.leader_dim * game.state_dim))
        except ValueError as e:  # every iteration's update was undone there, the J NaN
            raise ValueError(
                f"ActorConfig(theta0_std=0) starts every run at theta = 0, where the follower "
                f"cannot answer: {e} (start from random gains, theta0_std > 0)"
            ) from None
    if method in SCORE:
        game.check_gaussian_leader(
            f"method {method!r}",
            "use a deterministic method (bchg_det, naive_det) or an exact one for a leader "
            "without noise",
        )
    guide, det = method in GUIDED, method in DETERMINISTIC
    if guide:
        config.check_guide()
    if det and not config.exploration.episodes:
        dropped = " (the on-policy buffer drops them after it)" if config.buffer == "on" else ""
        warnings.warn(
            f"{game.name}: {method} collects its actor's episodes with a = K s and "
            "config.exploration.episodes = 0, so the critic sees the leader's action vary "
            f"only in the warm-up's random episodes{dropped}: the data do not identify "
            "grad_a Q_L, which Theorem 3's estimate uses. Add behaviour episodes "
            "(ExplorationConfig.episodes with a replay ring, as the explore preset does).",
            stacklevel=2,
        )
    est = estimator(config.estimator) if estimator_pieces is None else estimator_pieces
    dtype, ax, cc, ex = jnp.dtype(config.dtype), config.actor, config.critic, config.exploration
    n, k, m, gL = game.state_dim, game.leader_dim, game.follower_dim, game.gamma_L
    T, E, Ex, M = int(game.horizon), config.episodes, ex.episodes, config.minibatch
    N = E if config.buffer == "on" else E * config.iterations
    warmup_iters = warmup_iterations(config, T)
    explore_game = dataclasses.replace(game, U=ex.std * np.eye(k))
    net = MLP(tuple(cc.hidden), 1, cc.init == "torch", dtype, cc.precision)

    def Q(critic: Critic, s, a, b):
        return critic_value(net, cc.q_scale, critic, s, a, b)

    def init_critic(key):
        scale = (jnp.zeros(n + k + m, dtype), jnp.ones(n + k + m, dtype)) if cc.normalize else None
        return Critic(net.init(key, jnp.zeros((1, n + k + m), dtype)), scale)

    def buffers():
        ring = buffer_init(cc.replay, T, dtype, (n, k, m)) if cc.replay else None
        return buffer_init(N, T, dtype, (n, k, m)), ring

    def follower(theta, beta, P0=None):
        """Proposition 2's best response (warm-started Riccati iteration from P0)."""
        tol, cap = config.follower_tol, config.follower_max_iters
        return best_response(game, theta, beta, stochastic=not det, P0=P0, tol=tol, max_iters=cap)

    fm = config.follower
    learner = fm.kind == "k_step"

    def k_step_follower(theta, beta, memory=None):
        """The K-step learner's reaction to theta (``memory`` None: the start, from the best
        response's value) and the best response beside it (the gap, the next warm start)."""
        best = follower(theta, beta, None if memory is None else memory.best.P)
        own = best.P if memory is None else memory.own
        played, own = k_step_response(game, theta, beta, own, fm.steps, stochastic=not det)
        return LearnerResponse(played, own, best, gain_gap(played, best))

    # what the leader plays against (the policy with V^g for the learner) and the solve it flags
    view = (lambda r: r.played) if learner else (lambda r: r)  # noqa: E731
    solved = (lambda r: r.best) if learner else (lambda r: r)  # noqa: E731

    def collect(key, state, resp):
        """The leader's episodes (its own policy: ``a ~ N(K s, U U^T)``, or ``a = K s`` for the
        deterministic methods; random actions during the warm-up) and, for the critic's ring
        only, the behaviour episodes ``a = K s + std * eps``."""
        warm = dict(random_leader=state.step < warmup_iters, random_std=ex.warmup_std)
        resp = view(resp)
        tr = ring = rollout(key, game, state.actor, resp, E, T, stochastic=not det, **warm)
        if Ex:
            tx = rollout(jax.random.fold_in(key, 1), explore_game, state.actor, resp, Ex, T, **warm)
            ring = jax.tree.map(lambda x, y: jnp.concatenate([x, y], 0), tr, tx)
        return store(state, tr, config.buffer, ring), tr

    def critic_task(state, resp):
        """The critic to train (inputs scaled by its data), its TD loss and minibatches."""
        buf = critic_data(state)
        scale = input_scale(buf) if cc.normalize else None
        resp = view(resp)

        def draw(key):  # a minibatch of transitions
            return transitions(buf, *sample_uniform(key, buf, cc.minibatch or M))

        def loss(params, batch, key):  # key: the TD targets' draws, independent of the batch's
            s, a, b, s2 = batch
            return td_loss(Q, game, cc.target_samples, params, state, scale, resp, s, a, b, s2, key)

        return Critic(state.critic.params, scale), loss, draw

    def actor_objective(theta, critic, resp, beta, key, e, t, buf):
        """Theorem 2's (or Theorem 3's) surrogate on the minibatch (e, t) of ``buf``."""
        Q_L = lambda s, a, b: Q(critic, s, a, b)  # noqa: E731
        return surrogate(theta, Q_L, resp, beta, key, e, t, buf)

    def surrogate(theta, Q_L, resp, beta, key, e, t, buf):
        """The surrogate with the leader critic ``Q_L(s, a, b)`` (a function)."""
        form = deterministic_surrogate if det else score_surrogate
        return form(est, game, theta, Q_L, resp, beta, key, e, t, buf, guide)

    def actor_task(state, critic, resp, beta):
        """What the leader ascends (the exact return for the exact methods; ``exact_direct``
        holds the follower's policy at the iteration's start), on minibatches ~ gamma_L^t,
        after the warm-up."""
        critic, buf = jax.lax.stop_gradient(critic), state.buffer
        resp = view(resp)
        fixed = dict(resp=resp) if method == "exact_direct" else {}
        solve = dict(tol=config.follower_tol, max_iters=config.follower_max_iters)

        def objective(theta, et, key):
            if method in EXACT:  # NaN (so the update is undone) when its solve does not converge
                return leader_objective(
                    game, theta, beta, gamma=gL, stochastic=True, **solve, **fixed
                )
            return actor_objective(theta, critic, resp, beta, key, *et, buf)

        draw = None if method in EXACT else (lambda key: sample_discounted(key, buf, M, gL))
        return objective, draw, state.step >= warmup_iters

    def metrics(state, resp, tr, beta, grad_norm, ok, answer=None):
        # skipped: any undone update (a failed solve at the new theta or a gradient that was not
        # finite). capped: a Riccati solve failed - the follower's at the new theta after a
        # finite gradient, or (the exact methods) the objective's own solve: its NaN gradient,
        # where the exact return at the kept theta is finite (a return that is not finite
        # means the state's moments overflowed the dtype: metric_nonfinite, not a solve).
        theta, skipped = state.actor, (~ok).astype(jnp.int32)
        gap = {"follower_gap": resp.gap} if learner else {}
        best, resp = solved(resp), view(resp)
        # one pass over the state's moments for both returns (leader_returns)
        J_undiscounted, J_discounted = leader_returns(
            game, theta, beta, (1.0, gL), stochastic=not det, resp=resp
        )
        moments_ok = jnp.isfinite(J_undiscounted) & jnp.isfinite(J_discounted)
        finite_grad = jnp.isfinite(grad_norm)
        capped = ~ok & (finite_grad | moments_ok) if method in EXACT else ~ok & finite_grad
        # the follower's solve at the kept theta failed (the iteration's start, its update
        # undone): the run stays there, and its NaN J is that solve, not overflowing moments
        capped = capped | ~best.converged
        diverging = {}
        if learner:  # refused because V^g of the learner's new policy diverged: not a solve
            refused = ~ok & answer["diverging"]
            capped = capped & ~refused
            diverging = {"diverging": refused.astype(jnp.int32)}
        return {
            "J": J_undiscounted,
            "J_discounted": J_discounted,
            "batch_return": jnp.mean(jnp.sum(leader_reward(game, tr.s[:, :T]), -1)),
            "grad_norm": grad_norm,
            "update_skipped": skipped,
            "solve_capped": capped.astype(jnp.int32),
            "metric_nonfinite": (~moments_ok).astype(jnp.int32),
            "riccati_iterations": best.info.iterations,
            **gap,
            **diverging,
            **problem_metrics(metrics_fn, theta, resp),
        }

    # Z = sum_{t<T} gamma_L^t: the minibatch mean over segment starts drawn with probability
    # gamma_L^t / Z estimates the gradient over Z (Theorem 2's sum over t)
    Z = jnp.sum(gL ** jnp.arange(T, dtype=dtype))
    ref_kw = dict(gamma=gL, stochastic=not det)  # the exact methods' objective's discount

    def references(theta, resp, beta):
        """(as-if-optimal reference, reference through the follower's update) at theta: both
        the exact hypergradient for the best response."""
        if learner:
            target = as_if_optimal_hypergradient(game, theta, resp.played, beta, **ref_kw)
            return target, k_step_hypergradient(game, theta, resp.own, beta, fm.steps, **ref_kw)
        solve = dict(tol=config.follower_tol, max_iters=config.follower_max_iters)
        exact = exact_hypergradient(game, theta, beta, **solve, **ref_kw)
        return exact, exact

    def reference_metrics(key, theta, Q_L, resp, beta, buf):
        """``track_reference``'s metrics of the leader theta with the critic ``Q_L(s, a, b)``
        and the follower's ``resp`` on the episodes of ``buf``: the estimate is Z times the
        surrogate's gradient on one minibatch of :data:`TRACK_MINIBATCH` segment starts, so
        that its mean is the gradient the surrogate targets and ``proj`` is 1 for an unbiased
        one."""
        e, t = sample_discounted(key, buf, TRACK_MINIBATCH, gL)
        k = jax.random.fold_in(key, 1)
        grad = jax.grad(surrogate)(theta, Q_L, view(resp), beta, k, e, t, buf)
        target, through = references(theta, resp, beta)
        return {**agreement(Z * grad, target, "target"), **agreement(Z * grad, through, "through")}

    def diagnostics(key, state, critic, resp, beta):
        """``track_reference``: the estimate against the exact references (:func:`make_train`);
        the exact methods' own gradient (no minibatch) for them."""
        if method in EXACT:
            objective, _, _ = actor_task(state, critic, resp, beta)
            grad = jax.grad(lambda th: objective(th, None, key))(state.actor)
            target, through = references(state.actor, resp, beta)
            return {**agreement(grad, target, "target"), **agreement(grad, through, "through")}
        fixed = jax.lax.stop_gradient(critic)
        Q_L = lambda s, a, b: Q(fixed, s, a, b)  # noqa: E731
        return reference_metrics(key, state.actor, Q_L, resp, beta, state.buffer)

    leader = Leader(
        init_actor=lambda key: ax.theta0_std * jax.random.normal(key, (k * n,), dtype),
        init_critic=init_critic,
        buffers=buffers,
        # the best response keeps its Riccati solution (the warm start) and re-solves; the
        # learner's memory is the whole LearnerResponse (its reaction is not re-taken)
        follower=k_step_follower if learner else follower,
        warm=(lambda resp: resp) if learner else (lambda resp: resp.P),
        respond=(lambda state, beta: state.follower)
        if learner
        else (lambda state, beta: follower(state.actor, beta, state.follower)),
        collect=collect,
        critic=None if method in EXACT else critic_task,
        actor=actor_task,
        metrics=metrics,
        # the learner: its best-response solve converged and V^g of its policy is finite
        accepted=(lambda r: r.best.converged & r.played.converged)
        if learner
        else (lambda resp: resp.converged),
        diagnostics=diagnostics if config.track_reference else None,
        # the learner's K steps per iteration go on at a theta whose update was undone
        keeps_learning=learner,
        # why the learner's answer was refused: its policy's V^g diverged (its solve converged)
        answer=(lambda r: {"diverging": r.best.converged & ~r.played.converged})
        if learner
        else None,
    )
    # the leader's Adam, its schedule (if any) over the run's actor updates (a traced count)
    a_opt = lambda actor_steps: ax.optimizer(actor_updates(config, T, actor_steps))  # noqa: E731
    c_opt = optax.adam(cc.lr)
    follow = k_step_follower if learner else follower
    steps = dict(Q=Q, follower=follow, collect=collect, critic_task=critic_task, estimator=est)
    steps["actor_objective"] = actor_objective
    steps["actor_grad"] = jax.grad(actor_objective)
    steps.update(surrogate=surrogate, reference_metrics=reference_metrics, diagnostics=diagnostics)
    steps["accepted"] = leader.accepted
    return assemble(game, method, config, leader, HParams, a_opt, c_opt, steps)
