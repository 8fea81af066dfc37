"""The actor-critic leader of Algorithm 1 in 2-player Markov games, shared by both game families.

One outer iteration (Algorithm 1 with the Markov-game modules: the TD critic with target networks,
Algorithm 3; the direct term, Algorithm 5; FollowerQGrad, Algorithm 7, Eq. (nablaQF_MG)):

  1. ``respond``: the follower's best response to the current leader (warm-started);
  2. ``collect``: episodes into the actor's buffer (and the critic's replay ring, if any); a
     follower that learns from samples (``learn``) updates its memory from them;
  3. ``update_critic``: ``critic_steps`` Adam steps of the critic on uniform minibatches;
     optional ``diagnostics`` of the iteration's start (e.g. the estimate against exact
     references), which touch neither the state nor the training's random draws;
  4. ``update_actor``: ``actor_steps`` Adam steps of the leader along the gradient of a
     surrogate objective (Theorem 2, Eq. (hg_MG), or Theorem 3, Eq. (hg_MG_det)) on minibatches
     drawn with probability ~ gamma_L^t;
  5. the follower re-solves at the new leader (an update it cannot answer may be undone);
     Polyak (``tau``) updates of the target actor and the target critic; metrics.

:func:`assemble` builds the trainer (``init``, ``step`` and the per-phase functions) from a
:class:`Leader`: the pure pieces a family supplies (its follower, ``collect``, critic loss,
actor objective and metrics). :func:`critic_steps` and :func:`actor_steps` are the two
minibatch loops (a traced number of steps, :func:`bchg_jax.core.loop.masked_steps`); the state
of every game trainer is one :class:`LeaderState`.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, NamedTuple, Optional

import jax
import jax.numpy as jnp
import numpy as np

from bchg_jax.core.buffers import EpisodeBuffer, buffer_add
from bchg_jax.core.loop import (
    Trainer,
    adam_step,
    build_trainer,
    global_norm,
    masked_steps,
    polyak,
)
from bchg_jax.core.validate import check_config, check_dtype_available

Array = jax.Array
# fold_in constant of the diagnostics' key (the actor's minibatch loop folds 0 .. max_steps - 1
# and 10_000 + i into the same key)
DIAGNOSTICS_KEY = 1 << 20


@dataclasses.dataclass(frozen=True)
class LeaderConfig:
    """The static settings every game trainer has; each family's ``TrainConfig`` extends it
    (with its own defaults) and its ``validate()`` checks these fields too.

    Attributes:
      iterations: number of outer iterations of ``train``.
      episodes: E, episodes of the leader's own policy collected per iteration.
      buffer: the actor's buffer, ``"on"`` (the newest batch only) or ``"off"`` (every episode).
      minibatch: M, segment starts per actor step (and transitions per critic step).
      max_steps: upper bound of the traced ``actor_steps`` / ``critic_steps``.
      tau: Polyak factor of the target actor and the target critic, in (0, 1].
      follower_tol: stopping tolerance of the follower's best-response solver.
      dtype: dtype of the leader, the critic and every computed quantity.
    """

    iterations: int = 500
    episodes: int = 4
    buffer: str = "on"
    minibatch: int = 64
    max_steps: int = 10
    tau: float = 0.01
    follower_tol: float = 1e-6
    dtype: str = "float32"

    # check_config arguments (the fields of this class); a part config lists its own
    CHECKS = dict(
        positive_ints=("iterations", "episodes", "minibatch", "max_steps"),
        positive=("follower_tol",),
        unit=("tau",),
        choices={"buffer": ("on", "off")},
    )

    def validate(self):
        """Host-side checks of every class's ``CHECKS`` up the class tree; returns ``self``
        (``ValueError`` naming the field otherwise)."""
        return validate_checks(self)

    def iteration_limit(self):
        """The most outer iterations a run of this config trains as configured, or None: an
        off-policy buffer holds ``episodes * iterations`` episodes, and past that every batch
        overwrote the last slots (``run_grid`` refuses a longer run)."""
        return self.iterations if self.buffer == "off" else None


def validate_checks(config):
    """``check_config`` with the ``CHECKS`` of ``config``'s class and of every base class that
    has them (most general first); returns ``config``."""
    for cls in reversed(type(config).__mro__):
        if "CHECKS" in vars(cls):
            check_config(config, **vars(cls)["CHECKS"])
    name = type(config).__name__
    if getattr(config, "dtype", None) is not None:  # float16 trained on NaN
        try:
            ok = jnp.dtype(config.dtype).name in ("float32", "float64")
        except TypeError:
            ok = False
        if not ok:
            raise ValueError(f"{name}.dtype must be float32 or float64, got {config.dtype!r}")
        check_dtype_available(f"{name}.dtype", config.dtype)
    hidden = getattr(config, "hidden", None)
    if hidden is not None and (
        not hidden or any(not isinstance(h, (int, np.integer)) or h < 1 for h in hidden)
    ):
        raise ValueError(f"{name}.hidden must be positive layer sizes, got {hidden!r}")
    return config


class Critic(NamedTuple):
    """The leader's critic Q_L(s, a, b): the network's parameters and its input scales.

    Attributes:
      params: the network's parameters (the only part the critic's Adam updates).
      scale: ``None`` (raw inputs) or ``(mean, std)`` of the inputs, which the critic then
        standardises as ``(x - mean) / std`` (the LQR game's ``CriticConfig.normalize``).
    """

    params: Any
    scale: Any = None


class LeaderState(NamedTuple):
    """The carry of the outer ``lax.scan`` of every game trainer.

    Attributes:
      actor: the leader's parameters (a policy network or logits; theta [k * n] in the LQR game).
      actor_targ: its Polyak-averaged target.
      critic: the :class:`Critic`.
      critic_targ: the target critic's parameters.
      actor_opt, critic_opt: the two Adam states.
      follower: the follower's warm start (soft Q_F [S, A, B]; the Riccati solution P [n, n]),
        or the memory of a follower model that is not at its best response (a pytree: the
        tabular game's :class:`~bchg_jax.games.tabular.follower_models.FollowerResponse`).
      buffer: the actor's :class:`~bchg_jax.core.buffers.EpisodeBuffer`.
      replay: the critic's replay ring (an EpisodeBuffer), or None (the critic uses ``buffer``).
      key: the PRNG key. step: [] int32, outer iterations done.
    """

    actor: Any
    actor_targ: Any
    critic: Critic
    critic_targ: Any
    actor_opt: Any
    critic_opt: Any
    follower: Any
    buffer: EpisodeBuffer
    replay: Any
    key: Array
    step: Array

    # (new path, old path) of the leaves of checkpoints saved before the two game trainers
    # shared this state (tabular: GameTrainState, LQR: TrainState); core.io.load_state reads a
    # missing leaf from its old path, so such runs resume
    LEGACY_PATHS = (
        (".actor", ".theta"),
        (".actor_targ", ".theta_targ"),
        (".follower", ".P"),
        (".follower", ".Q_F"),
        (".critic.params", ".critic"),
    )


class Leader(NamedTuple):
    """The pieces of one family's actor-critic leader: pure functions closed over its static
    settings (no hidden state). ``response`` is the family's follower response object.

    Attributes:
      init_actor: ``init_actor(key)`` -> the leader's initial parameters.
      init_critic: ``init_critic(key)`` -> the initial :class:`Critic`.
      buffers: ``buffers()`` -> (the actor's empty buffer, the critic's empty ring or None).
      follower: ``follower(actor, beta, warm)`` -> the follower's best response to the leader
        ``actor``, warm-started from ``warm`` (None: a cold start).
      warm: ``warm(response)`` -> what :attr:`LeaderState.follower` keeps of it.
      respond: ``respond(state, beta)`` -> the response to ``state.actor`` at the iteration's
        start.
      collect: ``collect(key, state, response)`` -> (state with the new episodes in its buffers,
        the episodes).
      critic: ``critic(state, response)`` -> (the :class:`Critic` to train, ``loss(params,
        batch, key)``, ``draw(key)`` -> batch), or None (no learned critic).
      actor: ``actor(state, critic, response, beta)`` -> (``objective(params, batch, key)``
        to ascend, ``draw(key)`` -> batch or None (no minibatch), [] bool whether to update).
      metrics: ``metrics(state, response, episodes, beta, grad_norm, accepted)`` -> dict of
        [] arrays, from the new state and the new response (``accepted``: [] bool, the actor
        update was kept).
      accepted: ``accepted(response)`` -> [] bool: keep the actor update only if the
        follower's response to it is usable (else the update is undone and the response is
        the one before, or with :attr:`keeps_learning` the follower's answer to the leader
        that stays); None: no condition on the response. Every family's update is also
        undone when some actor step's gradient is not finite (a non-finite global norm:
        :func:`actor_steps`), before the follower answers when ``accepted`` is None.
        Not with ``learn``: an undone update would drop what the follower learnt.
      answer: ``answer(response)`` -> dict of [] arrays read from the follower's answer to the
        actor update before it is undone (with ``accepted``: why it refused the update), passed
        to ``metrics`` as the keyword ``answer``; None: nothing (``metrics`` gets no keyword).
      learn: ``learn(state, response, episodes, beta)`` -> the follower's memory after learning from
        the batch just collected (passed to ``follower`` as its warm start); None: the follower
        learns nothing from samples and ``warm(response)`` is passed.
      diagnostics: ``diagnostics(key, state, critic, response, beta)`` -> dict of [] arrays
        added to the metrics, from the iteration's start (``state`` after ``collect``, with the
        actor before its update), the updated :class:`Critic` and the response the batch was
        collected with; ``key`` is its own (the training's draws do not change); None: none.
      keeps_learning: the follower has a clock of its own (a learner taking K steps per
        iteration): when ``accepted`` refuses its answer to an update, it answers the leader
        that stays from the same memory (K more steps there), and that answer is kept if
        ``accepted`` takes it, else the answer before, and the metric ``follower_stalled`` is
        1 (its clock stopped this iteration). False (the best response, whose answer to the
        same leader is the one before): the answer before. With ``accepted`` None the
        follower always answers the leader that stays.
    """

    init_actor: Callable
    init_critic: Callable
    buffers: Callable
    follower: Callable
    warm: Callable
    respond: Callable
    collect: Callable
    critic: Optional[Callable]
    actor: Callable
    metrics: Callable
    accepted: Optional[Callable] = None
    learn: Optional[Callable] = None
    diagnostics: Optional[Callable] = None
    answer: Optional[Callable] = None
    keeps_learning: bool = False


def store(state: LeaderState, episodes, mode: str, ring_episodes=None) -> LeaderState:
    """Adds ``episodes`` (``.s`` [E, T+1, ...], ``.a``, ``.b`` [E, T, ...]) to the actor's buffer
    (``mode`` ``"on"`` / ``"off"``) and ``ring_episodes`` (default: the same) to the critic's
    replay ring, if the state has one."""
    buffer = buffer_add(state.buffer, episodes.s, episodes.a, episodes.b, mode)
    replay = state.replay
    if replay is not None:
        ring = episodes if ring_episodes is None else ring_episodes
        replay = buffer_add(replay, ring.s, ring.a, ring.b, "ring")
    return state._replace(buffer=buffer, replay=replay)


def critic_data(state: LeaderState) -> EpisodeBuffer:
    """The episodes the critic trains on: its replay ring, or the actor's buffer."""
    return state.buffer if state.replay is None else state.replay


def transitions(buf: EpisodeBuffer, e: Array, t: Array):
    """(s, a, b, s') of the minibatch (episode ``e``, step ``t``) [M] of ``buf``."""
    return buf.s[e, t], buf.a[e, t], buf.b[e, t], buf.s[e, t + 1]


def critic_steps(opt, loss, draw, key, params, opt_state, num_steps, max_steps: int):
    """``num_steps`` (traced, <= ``max_steps``) Adam steps of the critic (Algorithm 3).

    Step i minimises ``loss(params, draw(fold_in(key, i)), fold_in(key, 10_000 + i))``: a
    minibatch and the key of the loss's own draws (e.g. sampled TD targets).

    Returns:
      (params, opt_state).
    """

    def body(i, c):
        params, o = c
        batch = draw(jax.random.fold_in(key, i))
        grads = jax.grad(loss)(params, batch, jax.random.fold_in(key, 10_000 + i))
        return adam_step(opt, params, o, grads)

    return masked_steps(body, max_steps, num_steps, (params, opt_state))


def actor_steps(opt, objective, draw, key, params, opt_state, num_steps, max_steps, active=True):
    """``num_steps`` (traced, <= ``max_steps``) Adam steps of the leader up ``objective``.

    Step i ascends ``objective(params, batch, fold_in(key, 10_000 + i))`` with ``batch =
    draw(fold_in(key, i))`` (None when ``draw`` is None): the gradient of the objective is the
    hypergradient estimate on the minibatch (Theorem 2 / 3). The loss is the negated objective
    (differentiating it, rather than negating the gradient, keeps XLA's arithmetic that of a
    plain loss minimisation). ``active`` False: no step.

    Returns:
      (params, opt_state, global norm of the last step's gradient, or the first non-finite
      one: NaN / inf once some step's gradient was not finite). The norm is finite for every
      finite gradient (:func:`~bchg_jax.core.loop.global_norm`: a float32 sum of squares that
      overflows is taken through the largest entry), so a non-finite norm means a non-finite
      gradient.
    """

    def body(i, c):
        params, o, last = c
        batch = None if draw is None else draw(jax.random.fold_in(key, i))
        k = jax.random.fold_in(key, 10_000 + i)
        grads = jax.grad(lambda p: -objective(p, batch, k))(params)
        params, o = adam_step(opt, params, o, grads)
        norm = global_norm(grads)
        return params, o, jnp.where(jnp.isfinite(last), norm, last)

    gnorm = jnp.zeros((), jax.tree.leaves(params)[0].dtype)
    return masked_steps(body, max_steps, num_steps, (params, opt_state, gnorm), active)


def assemble(
    problem, method: str, config, leader: Leader, hparams, actor_opt, critic_opt, steps
) -> Trainer:
    """The :class:`~bchg_jax.core.loop.Trainer` of Algorithm 1 (module docstring) from a family's
    :class:`Leader`: ``init`` and ``step``, and the per-phase pure functions ``update_critic`` /
    ``update_actor`` added to ``steps``.

    Args:
      problem, method: recorded on the trainer.
      config: the family's frozen config (``max_steps``: the static bound of the traced step
        counts; ``tau``: the Polyak factor of both targets; ``dtype``).
      leader: the family's pieces.
      hparams: the family's HParams class (``actor_steps``, ``critic_steps``, ``beta``).
      actor_opt, critic_opt: optax transformations of the leader and the critic; ``actor_opt``
        may also be a function ``actor_opt(actor_steps)`` -> the leader's transformation for
        the traced ``hp.actor_steps`` (e.g. a learning-rate schedule over the run's updates;
        its state's structure must not depend on the count).
      steps: the family's named pure steps (for inspection and tests).
    Returns:
      the :class:`~bchg_jax.core.loop.Trainer`.
    """
    if leader.accepted is not None and leader.learn is not None:
        raise ValueError(
            "a Leader with both accepted and learn: an update the follower's response refuses "
            "would drop what the follower learnt from the batch (set one of them)"
        )
    if leader.answer is not None and leader.accepted is None:
        raise ValueError("a Leader's answer pieces read why accepted refused: set accepted too")
    dtype, max_steps, tau = jnp.dtype(config.dtype), config.max_steps, config.tau
    # a plain optax transformation is a NamedTuple (not callable)
    leader_opt = actor_opt if callable(actor_opt) else (lambda _: actor_opt)

    def init(key, hp):
        hp = hp.cast(dtype)
        ka, kc, kr = jax.random.split(key, 3)
        actor, critic = leader.init_actor(ka), leader.init_critic(kc)
        buffer, replay = leader.buffers()
        warm = leader.warm(leader.follower(actor, hp.beta, None))
        a_state, c_state = leader_opt(hp.actor_steps).init(actor), critic_opt.init(critic.params)
        step = jnp.zeros((), jnp.int32)
        return LeaderState(
            actor, actor, critic, critic.params, a_state, c_state, warm, buffer, replay, kr, step
        )

    def update_critic(key, state, resp, num_steps):
        """``num_steps`` critic steps -> (:class:`Critic`, Adam state)."""
        if leader.critic is None:
            return state.critic, state.critic_opt
        critic, loss, draw = leader.critic(state, resp)
        params, c_state = critic_steps(
            critic_opt, loss, draw, key, critic.params, state.critic_opt, num_steps, max_steps
        )
        return critic._replace(params=params), c_state

    def update_actor(key, state, critic, resp, beta, num_steps):
        """``num_steps`` actor steps -> (actor, Adam state, last gradient norm)."""
        objective, draw, active = leader.actor(state, critic, resp, beta)
        params, opt_state = state.actor, state.actor_opt
        opt = leader_opt(num_steps)
        return actor_steps(
            opt, objective, draw, key, params, opt_state, num_steps, max_steps, active
        )

    def step(state: LeaderState, hp):
        hp = hp.cast(dtype)
        key, k_roll, k_c, k_a = jax.random.split(state.key, 4)
        resp = leader.respond(state, hp.beta)
        state, episodes = leader.collect(k_roll, state, resp)
        learnt = None if leader.learn is None else leader.learn(state, resp, episodes, hp.beta)
        critic, c_state = update_critic(k_c, state, resp, hp.critic_steps)
        extra = {}
        if leader.diagnostics is not None:  # its own key: fold_in leaves k_a's draws alone
            k_d = jax.random.fold_in(k_a, DIAGNOSTICS_KEY)
            extra = leader.diagnostics(k_d, state, critic, resp, hp.beta)
        actor, a_state, gnorm = update_actor(k_a, state, critic, resp, hp.beta, hp.actor_steps)
        memory = leader.warm(resp) if learnt is None else learnt
        # an update from a gradient that was not finite, or one the follower cannot answer, is
        # undone (the leader and its Adam state as they were)
        ok = jnp.isfinite(gnorm)
        keep = lambda x, y: jnp.where(ok, x, y)  # noqa: E731
        undo = lambda: jax.tree.map(keep, (actor, a_state), (state.actor, state.actor_opt))  # noqa: E731
        said = {}  # what the follower's answer says (Leader.answer), before an undo
        if leader.accepted is None:  # undone before the follower answers: it answers the leader
            actor, a_state = undo()  # that stays (and keeps what it learnt from the batch)
            new = leader.follower(actor, hp.beta, memory)
        else:  # the follower's answer to the update decides; undone, it is the answer before
            new = leader.follower(actor, hp.beta, memory)
            if leader.answer is not None:  # read before the undo below replaces it
                said = {"answer": leader.answer(new)}
            ok = ok & leader.accepted(new)
            actor, a_state = undo()
            before = resp
            if leader.keeps_learning:  # its clock runs: it answers the leader that stays

                def again():
                    kept = leader.follower(actor, hp.beta, memory)
                    fine = leader.accepted(kept)
                    return jax.tree.map(lambda x, y: jnp.where(fine, x, y), kept, resp), fine

                before, fine = jax.lax.cond(ok, lambda: (resp, jnp.asarray(True)), again)
                # refused there too: the learner keeps its state before (its clock stopped)
                extra["follower_stalled"] = (~fine).astype(jnp.int32)
            new = jax.tree.map(keep, new, before)
        state = LeaderState(
            actor,
            polyak(actor, state.actor_targ, tau),
            critic,
            polyak(critic.params, state.critic_targ, tau),
            a_state,
            c_state,
            leader.warm(new),
            state.buffer,
            state.replay,
            key,
            state.step + 1,
        )
        return state, {**leader.metrics(state, new, episodes, hp.beta, gnorm, ok, **said), **extra}

    steps = {**steps, "init": init, "step": step}
    steps.update(update_critic=update_critic, update_actor=update_actor)
    unread = ("critic_steps",) if leader.critic is None else ()  # no critic to update
    return build_trainer(
        problem, method, config, init, step, hparams, dtype, steps, unread, max_steps=max_steps
    )


def problem_metrics(metrics_fn: Optional[Callable], leader, response) -> dict:
    """``metrics_fn(leader, response)`` (a problem's own metrics, e.g. the toy game's p), or
    ``{}`` without one."""
    return {} if metrics_fn is None else dict(metrics_fn(leader, response))
