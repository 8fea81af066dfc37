"""Followers that are not at their best response, in a tabular configurable MDP.

The updates of :class:`~bchg_jax.core.follower_model.FollowerModel`'s kinds on the tables of
M_theta (S states, B actions), and what the leader pairs with the policy it observes:

* ``k_step``: ``Q_i = T_theta^K Q_{i-1}`` with the soft Bellman operator of Eq. (lower), kept as
  the value ``V_{i-1} = beta logsumexp(Q_{i-1} / beta)``: K - 1 soft value-iteration sweeps from
  ``V_{i-1}`` and one backup give ``Q_i`` (:func:`k_step_response`).
* ``lag``: ``g_i = (1 - mix) g_{i-1} + mix g^{theta_i dagger}``.
* ``q_learning``: soft Q-learning on the follower's own sampled transitions
  (:func:`q_learning_update`); it acts with ``explore_mix(softmax(Q / beta), explore)``
  (:func:`q_learning_policy`). Its samples come from the sampler's table (Four-Rooms' real
  slip), not from the follower's model, so its target is the best response of the sampled MDP;
  with Q started at 0 and only the states its batches visit, it need not reach it (a leader
  can trap it: ``benchmarks.qlearner_trap``).

What the leader knows: as before (Assumption 1), the estimators read the follower's policy
``g_i``; the value they pair with it in FollowerQGrad (Eq. (nablaQF)) is ``V^{g_i}``, the
entropy-regularised value of that fixed policy on the model (:func:`soft_policy_value`), which the
leader computes itself; it never reads a learning follower's private Q or V. At the best response
``V^{g} = V_F^{theta dagger}``, so nothing changes there, and with ``V^{g}`` the segment estimator
is unbiased for ``d/dtheta Q^{g}`` at fixed g: the target of
:func:`~bchg_jax.tabular.follower_references.as_if_optimal_hypergradient`.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from jax.scipy.special import xlogy

from bchg_jax.core.eager import cached_when_eager
from bchg_jax.core.follower_model import explore_mix, soft_q_learning
from bchg_jax.core.precision import full_precision
from bchg_jax.core.validate import (
    check_beta_if_concrete,
    check_count,
    check_discount,
    check_finite_if_concrete,
    check_if_concrete,
    check_probability_rows_if_concrete,
    check_shape,
    check_unit_interval,
    is_concrete,
)
from bchg_jax.tabular.exact import policy_matrix
from bchg_jax.tabular.follower import (
    BestResponse,
    check_follower_inputs,
    soft_q,
    soft_v,
    soft_value_iteration,
)
from bchg_jax.tabular.rollout import Batch

Array = jax.Array


@full_precision
def soft_policy_value(P: Array, r: Array, policy: Array, beta, gamma, cont: Array) -> Array:
    """V^g: the entropy-regularised value of a fixed policy (a linear solve).

    ``V = sum_b g (r - beta log g) + gamma cont P_g V``, i.e.
    ``(I - gamma diag(cont) P_g) V = sum_b g r - beta sum_b g log g`` (0 log 0 = 0, so policies
    with zeros are fine). At the Boltzmann best response it is V_F^{theta dagger}.

    Args:
      P: [S, B, S] transition. r: [S, B] the follower's reward. policy: [S, B] g(b|s).
      beta: entropy weight. gamma: the follower's discount. cont: [S] continuation.
    Returns:
      [S] V^g.
    Raises:
      ValueError: a concrete ``beta`` not finite and > 0, a concrete ``gamma`` outside [0, 1),
        or a concrete ``policy`` whose rows are not distributions.
    """
    check_beta_if_concrete(beta)
    check_if_concrete(check_discount, "gamma (the follower's discount)", gamma)
    check_probability_rows_if_concrete("policy", policy)
    S = r.shape[0]
    A = jnp.eye(S, dtype=r.dtype) - (gamma * cont)[:, None] * policy_matrix(P, policy)
    rhs = jnp.sum(policy * r, -1) - beta * jnp.sum(xlogy(policy, policy), -1)
    return jnp.linalg.solve(A, rhs)


@full_precision
def observed_follower(P: Array, r: Array, policy: Array, beta, gamma, cont: Array, sweeps):
    """The :class:`~bchg_jax.tabular.follower.BestResponse`-shaped view the estimators get of a
    follower playing ``policy``: the policy, ``V^g`` (:func:`soft_policy_value`) and
    ``Q^g = r + gamma cont P V^g``; ``sweeps`` is recorded, ``residual`` is 0."""
    V = soft_policy_value(P, r, policy, beta, gamma, cont)
    Q = soft_q(P, r, V, gamma, cont)
    return BestResponse(policy, V, Q, jnp.asarray(sweeps), jnp.zeros((), r.dtype))


def _k_step_checks(P, r, beta, gamma, terminal, V_prev, K) -> None:
    """:func:`k_step_response`'s checks (an eager call's precheck)."""
    check_count("K (soft Bellman backups)", K)
    check_follower_inputs(P, r, beta, gamma, terminal, V_prev)
    # a NaN entry gave an all-NaN policy (k_step_hypergradient refused it)
    check_finite_if_concrete("V_prev (the learner's last soft value)", V_prev)


@cached_when_eager(_k_step_checks, recheck=False, problem_free=True)
@full_precision
def k_step_response(P: Array, r: Array, beta, gamma, terminal, V_prev: Array, K: int):
    """The K-step learner's new Q and policy: K soft Bellman backups from ``V_prev``.

    ``V_prev = beta logsumexp(Q_{i-1} / beta)`` (the learner's value); K - 1 sweeps of soft value
    iteration then one backup give ``Q_i = T^K Q_{i-1}`` and ``g_i = softmax(Q_i / beta)``.

    Returns:
      :class:`~bchg_jax.tabular.follower.BestResponse` of ``Q_i`` (``V`` = its soft value, the
      learner's next state; ``sweeps`` = K).
    Raises:
      ValueError: ``K`` not an integer >= 1 (0 would silently run one backup), or a concrete
        ``V_prev`` that is not finite.
    """
    check_count("K (soft Bellman backups)", K)
    check_finite_if_concrete("V_prev (the learner's last soft value)", V_prev)
    br = soft_value_iteration(P, r, beta, gamma, terminal, V0=V_prev, num_sweeps=K - 1)
    return br._replace(sweeps=jnp.asarray(K, jnp.int32))


def q_learning_policy(Q: Array, beta, explore) -> Array:
    """The Q-learner's behaviour ``(1 - explore) softmax(Q / beta) + explore / B`` [S, B].

    Raises:
      ValueError: a concrete ``beta`` not finite and > 0, or a concrete ``explore`` outside
        [0, 1] (2 gave a row with a negative entry).
    """
    check_beta_if_concrete(beta)
    if is_concrete(explore) and not (0.0 <= float(np.asarray(explore)) <= 1.0):
        raise ValueError(f"explore must be in [0, 1], got {explore}")
    return explore_mix(jax.nn.softmax(Q / beta, axis=-1), explore)


def q_learning_update(Q: Array, batch: Batch, r: Array, beta, gamma, lr) -> Array:
    """Soft Q-learning on a batch of the follower's own transitions, in time order.

    For each step (s, b, s') (the E streams of one time step one after the other), the
    follower moves ``Q(s, b)`` by ``lr`` towards ``r_F(s, b) + gamma (1 - term(s)) beta
    logsumexp_b' Q(s', b') / beta``: it observes its reward and the next state, nothing of the
    model. A time-limit cut still bootstraps (``s_next`` is the state before the reset).

    Args:
      Q: [S, B] its soft Q. batch: the :class:`~bchg_jax.tabular.rollout.Batch` [E, T] it
        generated. r: [S, B] its reward r_F^theta. beta: its entropy weight. gamma: gamma_F.
      lr: step size.
    Returns:
      [S, B] the updated Q.
    Raises:
      ValueError: a concrete ``beta`` not finite and > 0, a concrete ``gamma`` outside [0, 1),
        a ``Q`` that is not [S, B] shaped like ``r``, a concrete ``lr`` outside (0, 1] (the
        trainer's :class:`~bchg_jax.core.follower_model.FollowerModel` range) or a concrete
        ``Q`` that is not finite.
    """
    check_beta_if_concrete(beta)
    check_if_concrete(check_discount, "gamma (the follower's discount)", gamma)
    if np.ndim(Q) != 2:
        raise ValueError(f"Q (the follower's soft Q) must be [S, B], got shape {np.shape(Q)}")
    # an extra column entered every soft next value, unsaid
    check_shape("Q (the follower's soft Q)", Q, np.shape(r), "r_F's [S, B]")
    check_if_concrete(check_unit_interval, "lr (the follower's step size)", lr)
    check_finite_if_concrete("Q (the follower's soft Q)", Q)
    S, B = Q.shape
    s, b, s2 = (x.T.reshape(-1) for x in (batch.s, batch.b, batch.s_next))
    cont = 1.0 - batch.terminal.T.reshape(-1).astype(Q.dtype)

    def next_value(flat, j):
        return soft_v(flat.reshape(S, B)[s2[j]][None], beta)[0]

    flat = soft_q_learning(Q.reshape(-1), s * B + b, r[s, b], next_value, cont, lr, gamma)
    return flat.reshape(S, B)


def policy_gap(policy: Array, best: Array) -> Array:
    """max_{s, b} |g(b|s) - g^{dagger}(b|s)|: how far the follower is from its best response."""
    return jnp.max(jnp.abs(policy - best))
