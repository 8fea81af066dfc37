"""Hypergradient estimators for tabular configurable MDPs (Theorem 1; Algorithms 1, 4, 6, 8).

Theorem 1 (Eq. (hg_configurable)) estimated as in Algorithm 1 (BC-HG), with Algorithm 4
(PartialDerivative), Algorithm 6 (FollowerQGrad) and the baselines of Algorithm 8 (HPGD,
SoBiRL, Naive-PGD; Eq. (hpgd_guidance)).

Every term of Theorem 1 is linear in a per-step gradient (grad r_F, grad log p, grad r_L, ...),
so each estimator is computed in two stages:

1. *Segment weights.* A trajectory-segment estimator such as
   ``dQF(s_k, b_k) = sum_{j>=k} gamma_F^{j-k} [grad r_F(s_j,b_j)
   + gamma_F V_F(s_{j+1}) grad log p(s_{j+1}|s_j,b_j)]``
   (Eq. (nablaQF), the discounted suffix sum of a segment) enters the hypergradient with a
   scalar weight ``w_k`` (e.g. ``gamma_L^{t_k} B_L(s_k, b_k) / (beta n_episodes)``). Swapping
   the two sums,
   ``sum_k w_k sum_{j>=k} gamma^{j-k} x_j = sum_j Omega_j x_j`` with the *forward* discounted sum
   ``Omega_j = w_j + gamma Omega_{j-1}`` (reset at episode ends). Every-visit grouping of segments
   by (s, b) (Algorithm 1 line 12) replaces ``w_k`` by the mean weight of its group.
2. *One VJP.* The per-step coefficients are scattered into tables shaped like r_F, r_L, log p,
   log rho_0, and a single ``jax.vjp`` of the problem's functions of theta turns them into the
   gradient. The result equals summing explicit per-step gradient vectors (tested), at the cost of
   O(T) scalars plus one backward pass instead of O(T |theta|).

*Cut-off episodes and the unbiased forms.* A batch's streams restart from rho_0 after every
episode end, so each stream is a renewal sequence of i.i.d. episodes cut at its last step T - 1.
In the forward form every term of Theorem 1 is ``sum_j c_j`` over steps, with ``c_j`` a function
of its own episode's history up to step j only (``Omega_j`` looks back, never ahead). For one
complete episode of length L, ``E[sum_{t<L} c_t] = sum_t a_t`` with ``a_t = E[c_t 1{L > t}]`` is
the term of Theorem 1. Summed over *all* steps of a stream, in-episode time t appears
``U(T-1-t)`` times on average (U(m): expected number of episode starts in steps 0..m, the renewal
function), so late in-episode times are under-represented; dividing by the number of completed
episodes (random, and correlated with the lengths) does not repair this, and the cut-off episode
adds truncated segments (its suffix sums of Eq. (nablaQF) stop at the cut) to the sums but not
to the count. The bias of these ratio forms (``"per_visit"``, ``"trajectory"``) is
O(1 / episodes per stream). Keeping only the completed episodes is no cure either: an episode
completes within the batch more often when it is short (length-biased sampling).
The every-visit forms (the defaults, the reference convention) average the segment sums of all
visits to a pair (``grouping``) or to the start state (``partial``) and apply the mean to every
visit: the segments of visits late in an episode, which the cut stops short, then count for the
early visits too, a bias of about :func:`~bchg_jax.core.bias_check.every_visit_share` (~1 /
((1 - gamma) T)) of the averaged terms where every episode is cut (a time limit, no terminal
state), which more episodes per stream do not reduce (``random_tabular_cmdp`` at time limit 40,
10 episodes per stream: 19% of the gradient, 7.6 SE; the ratio forms 0.6 SE).
The ``"first_episode"`` forms use only each stream's first episode, which starts at step 0
whatever the lengths, and divide by the number of streams E (not random): the sum over it has
expectation ``sum_{t<T} a_t``, i.e. exactly the term of Theorem 1 whenever that episode ends at
a terminal state within the batch. An episode cut before a terminal state gives the term
truncated at the cut, T = ``num_steps`` (the end of the batch) or T = ``time_limit``: a bias of
the discounted tail beyond T of one episode, for any number of streams: ~gamma_L^T of the
partial term, and of the guiding term the steps past T and the tails of the segments of
Eq. (nablaQF) started before it (one starting at step k loses ~gamma_F^(T - k) of its sum):
about :func:`~bchg_jax.core.bias_check.discount_weight_beyond` (~(1 + T (1 - gamma))
gamma^T), more where the gradient comes late; gamma_F 0.99, gamma_L 0.5, T 40: 68% of the
gradient, 225 SE. :func:`bchg_jax.tabular.check.truncated_hypergradient` is the exact
truncated target. A time limit is such a cut
(the sampler resets there; Theorem 1 and :func:`~bchg_jax.tabular.exact.exact_hypergradient`
have no time limit), so
``time_limit <= num_steps`` does not make these forms exact: ``random_tabular_cmdp`` (gamma_L
0.9 > gamma_F 0.85, no terminal state) at ``time_limit = num_steps = 10`` is biased by 34%
(15.9 SE), at 40 by 1.8% (0.9 SE; gamma_L^40 = 1.5%);
:func:`~bchg_jax.tabular.check.check_problem` reports the fraction of cut episodes. Nothing
better is possible without a bound on the lengths: a later episode is seen at in-episode time t
only with a probability set by the unknown length distribution, and reweighting it needs an
unbiased estimate of 1 / that probability, which a fixed number of streams does not give. Many
streams about one episode long (``num_steps`` ~ ``time_limit``) waste little.
"""

from __future__ import annotations

from typing import NamedTuple, Optional

import chex
import jax
import jax.numpy as jnp

from bchg_jax.core.segments import forward_discounted_sum, regroup
from bchg_jax.core.validate import (
    check_beta_if_concrete,
    check_discount,
    check_if_concrete,
    check_indices_if_concrete,
    check_problem_settings,
    check_shape,
    check_theta,
)
from bchg_jax.tabular.cmdp import TabularCMDP
from bchg_jax.tabular.critics import state_value
from bchg_jax.tabular.follower import BestResponse
from bchg_jax.tabular.rollout import Batch

Array = jax.Array

GROUPINGS = ("every_visit", "per_visit", "first_episode")
PARTIALS = ("every_visit", "trajectory", "first_episode")
GUIDES = ("benefit", "hpgd", "sobirl", "none")


class Cotangents(NamedTuple):
    """Coefficient tables, one per differentiable function of theta (S states, B actions)."""

    r_F: Array  # [S, B]
    r_L: Array  # [S, B]
    log_p: Array  # [S, B, S]
    log_rho: Array  # [S]
    rho: Array  # [S]


def _scatter_sb(coef: Array, batch: Batch, S: int, B: int) -> Array:
    return jax.ops.segment_sum(
        coef.reshape(-1), (batch.s * B + batch.b).reshape(-1), S * B
    ).reshape(S, B)


def _scatter_sbs(coef: Array, batch: Batch, S: int, B: int) -> Array:
    idx = ((batch.s * B + batch.b) * S + batch.s_next).reshape(-1)
    return jax.ops.segment_sum(coef.reshape(-1), idx, S * B * S).reshape(S, B, S)


def follower_q_grad_cotangents(
    weights: Array,
    batch: Batch,
    V_F: Array,
    gamma_F,
    S: int,
    B: int,
    grouping: str = "every_visit",
    subtract_value: bool = False,
    segments: Optional[Batch] = None,
):
    """(cot r_F, cot log p) with VJP = sum_k weights_k * guide_k (Eq. (nablaQF), Algorithm 6).

    guide_k = dQF_hat(s_k, b_k), or dQF_hat(s_k, b_k) - dVF_hat(s_k) with ``subtract_value``
    (HPGD's advantage gradient, Eq. (hpgd_guidance)). ``weights`` live on ``batch`` [E, T].
    ``grouping="per_visit"``: each visit's own segment (no ``subtract_value``, no
    ``segments``). ``"first_episode"``: the same, for the visits of each stream's first episode
    only (the weights of later steps are dropped; the caller divides by the number of streams:
    unbiased, module docstring). ``"every_visit"``: dQF_hat(s, b) (dVF_hat(s)) is the mean over
    all segments of ``segments`` (default: ``batch``; HPGD (oracle): the oracle batch) starting
    at (s, b) (at s).
    dQF_hat is Algorithm 6 (FollowerQGrad, configurable MDP) on the segment set B_sb of
    Algorithm 1 line 12; dVF_hat is Algorithm 8 line 22 (HPGD), extended with the
    gamma_F V_F(s') grad log p term. Steps at terminal states contribute no transition term.

    Args:
      weights: [E, T] scalar weight w_k of the segment starting at each step of ``batch``
        (e.g. gamma_L^{t_k} B_L(s_k, b_k) / (beta n_episodes)).
      batch: :class:`~bchg_jax.tabular.rollout.Batch`, fields [E, T], the visits (s_k, b_k).
      V_F: [S] follower soft value V_F^{theta dagger}.
      gamma_F: follower discount (scalar).
      S: number of states.
      B: number of follower actions.
      grouping: one of ``GROUPINGS`` (see above).
      subtract_value: if True, use dQF_hat - dVF_hat (HPGD; ``every_visit`` only).
      segments: :class:`~bchg_jax.tabular.rollout.Batch`, fields [E', T'], whose segments
        estimate dQF_hat / dVF_hat (``every_visit`` only); None: ``batch``.
    Returns:
      (cot_r_F, cot_log_p): [S, B] cotangent of r_F^theta and [S, B, S] cotangent of
      log p^theta, for :func:`apply_cotangents`.
    Raises:
      ValueError: an unknown ``grouping``, ``per_visit`` / ``first_episode`` with
        ``subtract_value`` or ``segments``, or a concrete ``gamma_F`` outside [0, 1].
    """
    check_if_concrete(check_discount, "gamma_F", gamma_F, True)
    seg = batch if segments is None else segments
    if grouping in ("per_visit", "first_episode"):
        if subtract_value or segments is not None:
            raise ValueError(
                f"{grouping} grouping uses each visit's own segment: it cannot "
                "subtract dV_F or read another batch's segments"
            )
        omega = weights
        if grouping == "first_episode":
            omega = jnp.where(first_episode_mask(batch), weights, 0.0)
    elif grouping == "every_visit":
        omega = regroup(weights, batch.s * B + batch.b, seg.s * B + seg.b, S * B)
        if subtract_value:
            omega = omega - regroup(weights, batch.s, seg.s, S)
    else:
        raise ValueError(f"grouping must be one of {GROUPINGS}, got {grouping!r}")
    omega = forward_discounted_sum(omega, gamma_F, seg.done)
    real = 1.0 - seg.terminal.astype(omega.dtype)
    return (
        _scatter_sb(omega, seg, S, B),
        _scatter_sbs(gamma_F * V_F[seg.s_next] * omega * real, seg, S, B),
    )


def sobirl_cotangent(coef: Array, batch: Batch, policy: Array, S: int, B: int) -> Array:
    """cot r_F of sum_t coef_t (grad r_F(s_t, b_t) - E_{b~g(.|s_t)} grad r_F(s_t, b)) (SoBiRL).

    SoBiRL's one-step-truncated guiding term (Algorithm 8 line 32, appendix "Baseline
    Approaches").

    Args:
      coef: [E, T] coefficient of each step (e.g. Q_L(s_0, b_0) / (beta n_episodes)).
      batch: :class:`~bchg_jax.tabular.rollout.Batch`, fields [E, T] (uses ``s``, ``b``).
      policy: [S, B] follower policy g(b|s).
      S: number of states.
      B: number of follower actions.
    Returns:
      [S, B] cotangent of r_F^theta.
    """
    onehot = jax.ops.segment_sum(
        coef.reshape(-1), (batch.s * B + batch.b).reshape(-1), S * B
    ).reshape(S, B)
    per_state = jax.ops.segment_sum(coef.reshape(-1), batch.s.reshape(-1), S)
    return onehot - per_state[:, None] * policy


def episode_start_index(batch: Batch) -> Array:
    """For every step, the index (along the stream) of the first step of its episode.

    Args:
      batch: :class:`~bchg_jax.tabular.rollout.Batch`, fields [E, T] (uses ``t``).
    Returns:
      [E, T] int index into axis 1 (0 for steps of an episode begun before the batch).
    """
    idx = jnp.broadcast_to(jnp.arange(batch.t.shape[-1]), batch.t.shape)
    return jax.lax.cummax(jnp.where(batch.t == 0, idx, 0), axis=batch.t.ndim - 1)


def first_episode_mask(batch: Batch) -> Array:
    """For every step, whether it belongs to its stream's first episode (the ``first_episode``
    forms; module docstring).

    The first episode of a stream of :func:`~bchg_jax.tabular.rollout.rollout` starts at step 0
    and runs to the stream's first ``done`` (or to the end of the batch if it is cut off).

    Args:
      batch: :class:`~bchg_jax.tabular.rollout.Batch`, fields [E, T] (uses ``done``).
    Returns:
      [E, T] bool.
    """
    done = batch.done.astype(jnp.int32)
    return jnp.cumsum(done, axis=-1) - done == 0


def num_streams(batch: Batch, dtype=jnp.float32) -> Array:
    """E, the number of streams of ``batch`` (the normaliser of the ``first_episode`` forms).

    Args:
      batch: :class:`~bchg_jax.tabular.rollout.Batch`, fields [E, T].
      dtype: dtype of the result.
    Returns:
      [] E as ``dtype``.
    """
    return jnp.asarray(batch.t.shape[0], dtype)


def partial_cotangents(
    batch: Batch,
    V_L: Array,
    rho: Array,
    gamma_L,
    n_episodes,
    S: int,
    B: int,
    partial: str = "every_visit",
):
    """Cotangents of the partial derivative d_theta J_L (first two terms of Theorem 1).

    ``"trajectory"``: (1/n_ep) sum_t gamma_L^t [grad r_L + V_L(s_t) grad log
    p(s_t|s_{t-1},b_{t-1})], with grad log rho_0(s_0) at t = 0 (Algorithm 4 (PartialDerivative,
    configurable MDP)), summed over every step of the batch (biased by the cut-off episodes,
    O(1 / episodes per stream); module docstring).
    ``"first_episode"``: the same sum over the first episode of each stream only, divided by the
    number of streams E instead of ``n_episodes`` (unbiased; module docstring).
    The transition term is attached to the step it leaves (gamma_L^{t+1} V_L(s_{t+1}) grad log
    p(s_{t+1}|s_t,b_t)), so the transition out of a batch's last step is included too.
    ``"every_visit"``: sum_s rho_0(s) dV_L(s) + sum_s V_L(s) grad rho_0(s), where dV_L(s) is the
    every-visit mean over visits to s of discounted segment sums (Algorithm 8 lines 12-16,
    reference; here the segment sums also carry the gamma_L V_L(s') grad log p term).

    Args:
      batch: :class:`~bchg_jax.tabular.rollout.Batch`, fields [E, T].
      V_L: [S] leader value V_L(s) (critic-based, or the Monte Carlo estimate).
      rho: [S] initial distribution rho_0^theta (weights of ``every_visit``).
      gamma_L: leader discount (scalar).
      n_episodes: scalar normaliser of ``"trajectory"`` (``batch.num_episodes``).
      S: number of states.
      B: number of follower actions.
      partial: one of ``PARTIALS``.
    Returns:
      (cot_r_L, cot_log_p, cot_log_rho, cot_rho): [S, B], [S, B, S], [S], [S] cotangents of
      r_L^theta, log p^theta, log rho_0^theta and rho_0^theta.
    Raises:
      ValueError: an unknown ``partial`` or a concrete ``gamma_L`` outside [0, 1].
    """
    check_if_concrete(check_discount, "gamma_L", gamma_L, True)
    dtype = V_L.dtype
    if partial in ("trajectory", "first_episode"):
        if partial == "trajectory":
            w = (batch.t == 0).astype(dtype) / n_episodes
        else:
            w = ((batch.t == 0) & first_episode_mask(batch)).astype(dtype) / num_streams(
                batch, dtype
            )
        cot_log_rho = jax.ops.segment_sum(
            w.reshape(-1) * V_L[batch.s].reshape(-1), batch.s.reshape(-1), S
        )
        cot_rho = jnp.zeros((S,), dtype)
    elif partial == "every_visit":
        count = jax.ops.segment_sum(jnp.ones(batch.s.size, dtype), batch.s.reshape(-1), S)
        w = rho[batch.s] / jnp.maximum(count, 1.0)[batch.s]
        cot_log_rho = jnp.zeros((S,), dtype)
        cot_rho = V_L
    else:
        raise ValueError(f"partial must be one of {PARTIALS}, got {partial!r}")
    omega = forward_discounted_sum(w, gamma_L, batch.done)
    real = 1.0 - batch.terminal.astype(dtype)
    return (
        _scatter_sb(omega, batch, S, B),
        _scatter_sbs(gamma_L * V_L[batch.s_next] * omega * real, batch, S, B),
        cot_log_rho,
        cot_rho,
    )


def _safe_log(p: Array) -> Array:
    return jnp.log(jnp.where(p > 0, p, 1.0))


def apply_cotangents(problem: TabularCMDP, theta: Array, cot: Cotangents) -> Array:
    """One VJP of the problem's tables at theta: sum of <cotangent, d table / d theta> + grad Phi_L.

    Args:
      problem: the :class:`TabularCMDP` whose functions of theta are differentiated.
      theta: leader parameters, shaped like ``problem.theta0``.
      cot: :class:`Cotangents` (r_F, r_L [S, B]; log p [S, B, S]; log rho_0, rho_0 [S]).
    Returns:
      the gradient, shaped like ``theta``.
    """

    def tables(th):
        return (
            problem.follower_reward(th),
            problem.leader_reward(th),
            _safe_log(problem.transition(th)),
            _safe_log(problem.init_dist(th)),
            problem.init_dist(th),
            problem.regularizer(th),
        )

    out, vjp = jax.vjp(tables, theta)
    # each cotangent in its table's dtype: float32 tables of a float64 run (which validate()
    # takes, promoted) failed here with a VJP dtype error
    cot = tuple(jnp.asarray(c, o.dtype) for c, o in zip(cot, out[:-1], strict=True))
    (g,) = vjp((*cot, jnp.ones_like(out[-1])))
    return g


def hypergradient(
    problem: TabularCMDP,
    theta: Array,
    batch: Batch,
    follower: BestResponse,
    Q_L: Array,
    beta,
    guide: str = "benefit",
    grouping: str = "every_visit",
    partial: str = "every_visit",
    V_L: Optional[Array] = None,
    guide_batch: Optional[Batch] = None,
) -> Array:
    """Hypergradient estimate: partial term + guiding term (Theorem 1, Algorithms 1 and 8).

    Estimates Eq. (hg_configurable) (+ grad Phi_L): Algorithm 1 lines 10-16 for BC-HG and the
    baselines of Algorithm 8.

    ``grouping="first_episode", partial="first_episode"`` is the unbiased literal form of
    Theorem 1 for any number of episodes per stream (each stream's first episode over the number
    of streams; exact when that episode ends at a terminal state within the batch, truncated at
    a time limit or the batch's end otherwise: a bias of about
    :func:`~bchg_jax.core.bias_check.discount_weight_beyond`, module docstring).
    ``"per_visit"`` / ``"trajectory"`` divide sums over every step by the number of completed
    episodes: consistent, but biased by the cut-off episodes (O(1 / episodes per stream)). The
    defaults (``"every_visit"``) are the reference convention of the paper's runs: their means
    reuse the segments of visits late in an episode, which the cut shortens, for every visit, a
    bias that more episodes per stream do not remove where every episode is cut (a time limit,
    no terminal state: about :func:`~bchg_jax.core.bias_check.every_visit_share` of the terms
    averaged).

    ``Q_L`` [S,B] (and optionally ``V_L`` [S], default sum_b g Q_L) is the leader critic: SARSA,
    Monte Carlo, or exact (tests). The Benefit is B_L(s,b) = Q_L(s,b) - V_L(s). ``guide``:

    * ``"benefit"`` (BC-HG): (1/(beta n_ep)) sum_k gamma_L^{t_k} B_L(s_k,b_k) dQF(s_k,b_k);
    * ``"hpgd"`` (HPGD, Eq. (hpgd_guidance) with the authors' Q_L - V_L): dQF - dVF for dQF, the
      segments of ``guide_batch`` (oracle) or of ``batch``;
    * ``"sobirl"``: (1/(beta n_ep)) sum_t Q_L(s_0,b_0) (grad r_F(s_t,b_t) - E_b grad r_F(s_t,b)),
      the one-step truncation of Yang et al. (s_0, b_0: the first step of t's episode);
    * ``"none"``: Naive-PGD (partial term only).

    Args:
      problem: the :class:`TabularCMDP`.
      theta: leader parameters (differentiated through the problem's functions), shaped like
        ``problem.theta0``.
      batch: :class:`Batch`, fields [E, T], sampled under ``follower.policy``.
      follower: the :class:`BestResponse` (``policy`` [S, B], ``V`` [S]).
      Q_L: [S, B] leader critic.
      beta: the follower's entropy weight, > 0 (scalar; may be traced).
      guide: one of ``GUIDES`` (see above).
      grouping: one of ``GROUPINGS``, the segment grouping of dQF (see
        :func:`follower_q_grad_cotangents`); ``"first_episode"`` weights the visits of each
        stream's first episode by 1 / (beta E) instead of every visit by 1 / (beta n_ep).
      partial: one of ``PARTIALS`` (see :func:`partial_cotangents`).
      V_L: [S] leader value, or None for sum_b g(b|s) Q_L(s, b); also used by the partial term.
      guide_batch: the oracle's :class:`Batch`, fields [E', T'] (``hpgd`` only) or None.
    Returns:
      the estimate, shaped like ``theta`` (includes grad Phi_L(theta)).
    Raises:
      ValueError: an unknown ``guide``/``grouping``/``partial``, a concrete ``beta`` not finite
        and > 0, a bad scalar setting of ``problem`` (a discount outside [0, 1), ...), ``theta``
        not shaped like ``problem.theta0`` (or, when concrete, not finite), ``Q_L``,
        ``follower`` or ``V_L`` not shaped by the problem's S and B (the error names the
        array), or concrete batch indices (``s``, ``b``, ``s_next``) out of range.
    """
    if guide not in GUIDES:
        raise ValueError(f"guide must be one of {GUIDES}, got {guide!r}")
    check_problem_settings(problem)
    check_theta(problem, theta)
    check_beta_if_concrete(beta)
    S, B = problem.num_states, problem.num_actions
    src = f"S={S}, B={B} from transition [S, B, S]"
    check_shape("Q_L", Q_L, (S, B), src)
    check_shape("follower.policy", follower.policy, (S, B), src)
    check_shape("follower.V", follower.V, (S,), src)
    if V_L is not None:
        check_shape("V_L", V_L, (S,), src)
    chex.assert_equal_shape([batch.s, batch.b, batch.t, batch.done])
    for b in (batch,) if guide_batch is None else (batch, guide_batch):
        for name, idx, size in (("s", b.s, S), ("b", b.b, B), ("s_next", b.s_next, S)):
            check_indices_if_concrete(f"batch.{name}", idx, size)
    dtype = Q_L.dtype
    n_ep = batch.num_episodes.astype(dtype)
    V_L = state_value(Q_L, follower.policy) if V_L is None else V_L
    rho = problem.init_dist(theta)
    c_rL, c_logp_L, c_log_rho, c_rho = partial_cotangents(
        batch, V_L, rho, problem.gamma_L, n_ep, S, B, partial
    )
    c_rF, c_logp_F = jnp.zeros((S, B), dtype), jnp.zeros((S, B, S), dtype)
    if guide in ("benefit", "hpgd"):
        ben = (Q_L - V_L[:, None])[batch.s, batch.b]
        n_guide = num_streams(batch, dtype) if grouping == "first_episode" else n_ep
        w = (problem.gamma_L ** batch.t.astype(dtype)) * ben / (beta * n_guide)
        c_rF, c_logp_F = follower_q_grad_cotangents(
            w,
            batch,
            follower.V,
            problem.gamma_F,
            S,
            B,
            grouping,
            subtract_value=(guide == "hpgd"),
            segments=guide_batch,
        )
    elif guide == "sobirl":
        start = episode_start_index(batch)
        q0 = Q_L[jnp.take_along_axis(batch.s, start, -1), jnp.take_along_axis(batch.b, start, -1)]
        c_rF = sobirl_cotangent(q0 / (beta * n_ep), batch, follower.policy, S, B)
    return apply_cotangents(
        problem, theta, Cotangents(c_rF, c_rL, c_logp_F + c_logp_L, c_log_rho, c_rho)
    )
