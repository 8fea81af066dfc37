"""Followers that are not at their best response, in a tabular Markov game.

The tabular game trainer simulates the follower that its ``TrainConfig.follower`` names
(:class:`~bchg_jax.core.follower_model.FollowerModel`; ``docs/followers.md``). With f_i the
leader's policy after outer iteration i:

* ``best_response``: not here; the trainer keeps the soft Q-iteration of before
  (:func:`~bchg_jax.games.tabular.follower.soft_q_iteration`, warm-started).
* ``k_step``: ``Q_i = T_{f_i}^K Q_{i-1}`` (K soft Bellman backups of the config's form,
  :func:`~bchg_jax.games.tabular.follower.soft_q_backups`), ``g_i = softmax(Q_i / beta)``.
* ``lag``: ``g_i = (1 - mix) g_{i-1} + mix g^dagger(f_i)``, the best response solved as before
  (warm-started soft Q-iteration).
* ``q_learning``: soft Q-learning on the follower's own transitions (s, a, b, r_F, s') of the
  batch the leader collects (:func:`q_learning_update`), ``g_i = explore_mix(softmax(Q_i /
  beta), explore)``.

Every model starts at the best response to the leader's initial policy (its Q, or its policy for
``lag``), so the followers differ only in how they track the leader.

What the leader knows (Assumption 1's white box): the follower's policy g, as before, paired
with ``V_F = V^g``, the entropy-regularised value of that *fixed* policy g against the leader's
f on the known model (:func:`~bchg_jax.games.tabular.exact.soft_policy_evaluation`), never the
follower's private table. At the best response V^g is Theorem 2's V_F.

Every model also solves the best response g^dagger(f_i) (warm-started), for ``lag``'s update and
for the ``follower_gap`` metric ``max |g_i - g^dagger(f_i)|``; ``solve_capped`` flags that solve
(the K backups of ``k_step`` have no tolerance to miss).
"""

from __future__ import annotations

from typing import Callable, NamedTuple, Optional

import jax
import jax.numpy as jnp

from bchg_jax.core.follower_model import FollowerModel, explore_mix, lag_mix, soft_q_learning
from bchg_jax.games.tabular.exact import soft_policy_evaluation
from bchg_jax.games.tabular.follower import next_value, soft_q_backups, soft_q_iteration
from bchg_jax.games.tabular.game import compute_dtype

Array = jax.Array


class FollowerResponse(NamedTuple):
    """A follower's play against the leader's policy f, what the leader sees of it, and its
    memory (the whole tuple is :attr:`~bchg_jax.games.actor_critic.LeaderState.follower`).

    Attributes:
      policy: [S, A, B] g(b|s, a), the policy the follower plays.
      log_policy: [S, A, B] log g, computed in log space (finite where g underflows to 0 at a
        small beta; :func:`~bchg_jax.games.tabular.exact.soft_policy_evaluation` needs it).
      Q: [S, A, B] Q^g, the soft policy evaluation of g against f (the leader's view).
      V: [S, A] V^g(s, a) = sum_b g (Q^g - beta log g) (the leader's V_F).
      sweeps: [] int32, sweeps of the best-response solve (soft Q-iteration to f).
      residual: [] its last sup-norm change.
      own: [S, A, B] the follower's private table: its soft Q (``k_step``, ``q_learning``) or
        its policy (``lag``).
      best: [S, A, B] the soft Q of the best response g^dagger(f) (the next solve's warm start).
      gap: [] max |g - g^dagger(f)|.
    """

    policy: Array
    log_policy: Array
    Q: Array
    V: Array
    sweeps: Array
    residual: Array
    own: Array
    best: Array
    gap: Array


def played_policy(model: FollowerModel, own: Array, beta) -> Array:
    """The policy [S, A, B] a follower plays from its private table ``own`` (module docstring)."""
    if model.kind == "lag":
        return own
    g = jax.nn.softmax(own / beta, -1)
    return explore_mix(g, model.explore) if model.kind == "q_learning" else g


def played_log_policy(
    model: FollowerModel, own: Array, beta, best_q: Array, previous: Optional[Array] = None
) -> Array:
    """log of :func:`played_policy`, in log space: exact where the policy underflows to 0.

    ``best_q``: the best response's soft Q (``lag`` mixes in ``log_softmax(best_q / beta)``);
    ``previous``: ``lag``'s log policy before this reaction (None: the start, at the best
    response)."""
    if model.kind == "lag":
        log_best = jax.nn.log_softmax(best_q / beta, -1)
        if previous is None:
            return log_best
        mix = jnp.asarray(model.mix, own.dtype)
        return jnp.logaddexp(jnp.log1p(-mix) + previous, jnp.log(mix) + log_best)
    log_g = jax.nn.log_softmax(own / beta, -1)
    if model.kind == "q_learning" and model.explore:
        e = jnp.asarray(model.explore, own.dtype)
        return jnp.logaddexp(jnp.log1p(-e) + log_g, jnp.log(e / own.shape[-1]))
    return log_g


def q_learning_update(game, Q: Array, episodes, f: Array, beta, backup: str, lr) -> Array:
    """Soft Q-learning on the follower's own transitions of a batch (time-major order: the E
    episodes' step t, then step t + 1, ...), :func:`bchg_jax.core.follower_model.soft_q_learning`.

    Transition (s, a, b, s') moves ``Q(s, a, b)`` by ``lr`` towards
    ``r_F(s, a, b) + gamma_F v(s')`` with ``v`` the soft next-state value of the follower's
    ``backup`` form (:func:`~bchg_jax.games.tabular.follower.next_value`) on its current table
    and the leader's policy f. Episodes end at a time-out, so every s' is bootstrapped.

    Args:
      game: the tabular game (``follower_reward``, ``gamma_F``).
      Q: [S, A, B] the follower's soft Q.
      episodes: ``s`` [E, T+1], ``a``, ``b`` [E, T] int (s[:, t + 1] is step t's s').
      f: [S, A] the leader's policy that acted in the batch.
      beta: the follower's entropy weight. backup: ``"reference"`` or ``"paper"``.
      lr: the step size.
    Returns:
      [S, A, B] the updated table.
    """
    S, A, B = Q.shape
    s, a, b = (jnp.asarray(x, jnp.int32) for x in (episodes.s, episodes.a, episodes.b))
    s0, s1 = s[:, :-1].T.reshape(-1), s[:, 1:].T.reshape(-1)
    a, b = a.T.reshape(-1), b.T.reshape(-1)
    reward = jnp.asarray(game.follower_reward, Q.dtype)[s0, a, b]

    def value(Q_flat, j):  # v(s'_j) on the current table, the one state only
        s2 = s1[j]
        return next_value(Q_flat.reshape(S, A, B)[s2][None], f[s2][None], beta, backup)[0]

    cont = jnp.ones_like(reward)
    index = (s0 * A + a) * B + b
    flat = soft_q_learning(Q.reshape(-1), index, reward, value, cont, lr, game.gamma_F)
    return flat.reshape(S, A, B)


class FollowerPieces(NamedTuple):
    """A follower model's pieces for the actor-critic skeleton
    (:class:`~bchg_jax.games.actor_critic.Leader`'s ``follower`` and ``learn``) as functions of
    the leader's policy f [S, A] (the trainer composes them with its actor; the memory is the
    whole :class:`FollowerResponse`, so ``warm`` is the identity and ``respond`` reads it back)."""

    follower: Callable  # (f, beta, memory | None) -> FollowerResponse
    learn: Optional[Callable]  # (f_behaviour, memory, episodes, beta) -> memory, or None


def follower_pieces(game, model: FollowerModel, backup: str, tol, max_sweeps) -> FollowerPieces:
    """The pieces of a follower that is not at its best response (module docstring).

    Args:
      game: the tabular game.
      model: the validated :class:`~bchg_jax.core.follower_model.FollowerModel` (not
        ``best_response``).
      backup: the follower's soft-Q backup form.
      tol, max_sweeps: the best-response solve's tolerance and sweep cap.
    Returns:
      :class:`FollowerPieces`; ``learn`` is None except for ``q_learning``.
    Raises:
      ValueError: ``model.kind == "best_response"`` (the trainer's own path).
    """
    if model.best_response:
        raise ValueError("follower_pieces is for followers that are not at their best response")

    def follower(f, beta, memory: Optional[FollowerResponse] = None) -> FollowerResponse:
        """The follower's new play after the leader moved to f (``memory`` None: the start, at
        the best response)."""
        best = soft_q_iteration(
            game, f, beta, backup, None if memory is None else memory.best, tol, max_sweeps
        )
        if memory is None:
            own = best.policy if model.kind == "lag" else best.Q
        elif model.kind == "k_step":
            # the backups' loop carries the promoted dtype (games.tabular.game.compute_dtype)
            dtype = compute_dtype(game, f, beta)
            fd, b, gamma_F = (jnp.asarray(x, dtype) for x in (f, beta, game.gamma_F))
            P = jnp.asarray(game.transition, dtype)
            r = jnp.asarray(game.follower_reward, dtype)
            own = jnp.asarray(memory.own, dtype)
            own = soft_q_backups(P, r, own, fd, b, gamma_F, backup, model.steps)
        elif model.kind == "lag":
            own = lag_mix(memory.own, best.policy, model.mix)
        else:  # q_learning: its table changes only when it learns from a batch
            own = memory.own
        g = played_policy(model, own, beta)
        previous = None if memory is None else memory.log_policy
        log_g = played_log_policy(model, own, beta, best.Q, previous)
        Q, V = soft_policy_evaluation(game, f, g, beta, backup, log_g=log_g)
        gap = jnp.max(jnp.abs(g - best.policy))
        return FollowerResponse(g, log_g, Q, V, best.sweeps, best.residual, own, best.Q, gap)

    def learn(f, memory: FollowerResponse, episodes, beta) -> FollowerResponse:
        """``q_learning``: the memory after learning from the batch its policy just played."""
        Q = q_learning_update(game, memory.own, episodes, f, beta, backup, model.lr)
        return memory._replace(own=Q)

    return FollowerPieces(follower, learn if model.kind == "q_learning" else None)
