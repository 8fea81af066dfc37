"""Theorem 2 / Theorem 3 on a minibatch of the LQR game, from small pieces that compose.

The actor of :func:`bchg_jax.games.lqr.make_train` ascends the gradient of a surrogate on M
segment starts (s_m, a_m, b_m) drawn with probability ~ gamma_L^t, each with the rest of its
episode: :func:`score_surrogate` for the Gaussian leader (Theorem 2, Eq. (hg_MG), via
:func:`bchg_jax.games.estimators.score_objective`) and :func:`deterministic_surrogate` for
``a = K s`` (the appendix's Theorem 3, Eq. (hg_MG_det), via
:func:`bchg_jax.games.estimators.deterministic_objective`). What each option of the estimate
does is one small function, and an :class:`Estimator` names the ones in use:

* the direct term's baseline (Algorithm 5): :func:`reference_baseline` (``mean_i Q(s, a'_i,
  b)``, a'_i ~ f(.|s), with the *same* b: biased, since b depends on a; the reference),
  :func:`same_noise_baseline` (``b'_i = mean_g(s, a'_i) + (b - mean_g(s, a))``: the follower's
  noise kept, unbiased) or :func:`no_baseline`;
* the Benefit: :func:`sampled_benefit` (``Q(s, a, b) - mean_j Q(s, a, b_j)``, b_j ~ g(.|s, a));
* the follower's values in the influence sums (Algorithm 7, Eq. (nablaQF_MG)):
  :func:`raw_influence` (V_F(s_k, a_k), the reference) or :func:`baselined_influence`
  (``V_F - E_a' V_F``: unbiased, far lower variance with U = 1e-3);
* pieces on the guiding term (:mod:`bchg_jax.games.guide`): e.g. the control variate;
* the deterministic leader's follower reaction (Theorem 3's FollowerQGrad, Eq.
  (nablaQF_MG_det)): :func:`q_gradient_reaction` (``grad_a Q_F(s_k, a_k, b_k)`` at every step:
  the theorem, exact at the follower's best response) or :func:`policy_score_reaction` (the
  follower's own score ``grad_a log g(b|s, a)`` at the sample's step and ``grad_a V_F(s_k, a_k)``
  at the later ones: the same at the best response, and unbiased for the as-if-optimal
  gradient of a follower off it, ``docs/followers.md``).

:func:`estimator` builds the pieces of an :class:`~bchg_jax.games.lqr.config.EstimatorConfig`;
a study passes its own (``make_train(..., estimator_pieces=...)``), e.g. with one more guide piece.
"""

from __future__ import annotations

from typing import Callable, NamedTuple, Optional, Tuple

import jax
import jax.numpy as jnp

from bchg_jax.core.precision import full_precision
from bchg_jax.games.estimators import deterministic_objective, influence_weights, score_objective
from bchg_jax.games.guide import control_variate, guide_surrogate
from bchg_jax.games.lqr.config import EstimatorConfig
from bchg_jax.games.lqr.follower import follower_q, follower_state_value, follower_value
from bchg_jax.games.lqr.game import leader_log_prob, leader_mean

Array = jax.Array


class Estimator(NamedTuple):
    """The pieces of the LQR game's minibatch estimate (module docstring).

    Attributes:
      baseline: ``baseline(Q, resp, sample_leader, key, s, a, b)`` -> [M] (or 0.0) the direct
        term's baseline, ``Q(s, a, b)`` the critic and ``sample_leader(key, s)`` a' ~ f(.|s).
      benefit: ``benefit(Q, resp, key, s, a, b, q)`` -> [M] Ben(s, a, b), ``q = Q(s, a, b)``.
      influence: ``influence(game, resp, theta, s, a)`` -> [M, T] the follower's values along
        each episode in the influence sums of the Gaussian leader.
      guide: pieces on the guiding term (:mod:`bchg_jax.games.guide`), run in order.
      reaction: ``reaction(game, resp, theta, s, a, b, se, ae, be, beta)`` -> (``dF`` [M, T, k]
        the follower's action-gradients along each episode, ``own`` [M, k] or None: a term
        added to the sample's own step, ``Ben_m f(s_m) . own_m``) of the deterministic leader.
    """

    baseline: Callable
    benefit: Callable
    influence: Callable
    guide: Tuple[Callable, ...] = ()
    reaction: Optional[Callable] = None  # None: q_gradient_reaction (Theorem 3)


def follower_mean_q(Q, resp, key, s, a, samples: int):
    """mean_j Q(s, a, b_j) over ``samples`` follower actions b_j ~ g(.|s, a) [M]: the Monte
    Carlo E_b Q_L of the Benefit and of a sampled TD target."""
    bj = jax.vmap(lambda kk: resp.sample(kk, s, a))(jax.random.split(key, samples))
    shp = bj.shape[:-1]  # [J, M]
    return jnp.mean(
        Q(jnp.broadcast_to(s, shp + s.shape[-1:]), jnp.broadcast_to(a, shp + a.shape[-1:]), bj), 0
    )


@full_precision
def leader_sample(game, theta, key, s):
    """a ~ f_theta(.|s) = N(K s, U U^T) for ``s`` [..., n] -> [..., k]."""
    eps = jax.random.normal(key, s.shape[:-1] + (game.leader_dim,), s.dtype)
    return leader_mean(game, theta, s) + eps @ jnp.asarray(game.U, s.dtype).T


def _alternative_actions(sample_leader, key, s, samples):
    return jax.vmap(lambda kk: sample_leader(kk, s))(jax.random.split(key, samples))  # [I, M, k]


def _mean_q(Q, s, a_alt, b_alt):
    return jnp.mean(Q(jnp.broadcast_to(s, a_alt.shape[:-1] + s.shape[-1:]), a_alt, b_alt), 0)


def reference_baseline(samples: int) -> Callable:
    """The reference's direct baseline ``mean_i Q(s, a'_i, b)``, a'_i ~ f(.|s), the same b."""

    def baseline(Q, resp, sample_leader, key, s, a, b):
        a_alt = _alternative_actions(sample_leader, key, s, samples)
        return _mean_q(Q, s, a_alt, jnp.broadcast_to(b, a_alt.shape[:-1] + b.shape[-1:]))

    return baseline


def same_noise_baseline(samples: int) -> Callable:
    """The unbiased direct baseline ``mean_i Q(s, a'_i, b'_i)``, a'_i ~ f(.|s), with the
    follower's noise kept: ``b'_i = mean_g(s, a'_i) + (b - mean_g(s, a))``."""

    def baseline(Q, resp, sample_leader, key, s, a, b):
        a_alt = _alternative_actions(sample_leader, key, s, samples)
        return _mean_q(Q, s, a_alt, resp.mean(s, a_alt) + (b - resp.mean(s, a)))

    return baseline


def no_baseline(Q, resp, sample_leader, key, s, a, b):
    """No baseline in the direct term."""
    return 0.0


def sampled_benefit(samples: int) -> Callable:
    """Ben(s, a, b) = Q(s, a, b) - mean_j Q(s, a, b_j), ``samples`` draws b_j ~ g(.|s, a)."""

    def benefit(Q, resp, key, s, a, b, q):
        return q - follower_mean_q(Q, resp, key, s, a, samples)

    return benefit


def raw_influence(game, resp, theta, s, a):
    """V_F(s_k, a_k) (the reference)."""
    return follower_value(game, resp, s, a)


def baselined_influence(game, resp, theta, s, a):
    """V_F(s_k, a_k) - E_a' V_F(s_k, a') (a baseline of s_k only: unbiased)."""
    return follower_value(game, resp, s, a) - follower_state_value(game, resp, theta, s)


def q_gradient_reaction(game, resp, theta, s, a, b, se, ae, be, beta):
    """Theorem 3 (Eq. (nablaQF_MG_det)): ``grad_a Q_F(s_k, a_k, b_k)`` along each episode
    [M, T, k], nothing more at the sample's own step."""
    dF = jax.grad(lambda x: jnp.sum(follower_q(game, resp, theta, se, x, be)))(ae)
    return dF, None


@full_precision
def policy_score_reaction(game, resp, theta, s, a, b, se, ae, be, beta):
    """The white-box form for a follower off its best response: ``grad_a V_F(s_k, a_k)`` along
    each episode [M, T, k] and, at the sample's own step, ``grad_a log g(b|s, a) - grad_a
    V_F(s, a) / beta`` [M, k] (so the own step's term is ``Ben grad_a log g``: how the
    follower's action distribution moves with the leader's action it observes). At the best
    response ``log g = (Q_F - V_F) / beta`` and ``E_b grad_a Q_F = grad_a V_F``, so both are
    Theorem 3 in expectation (``docs/followers.md``). The surrogate adds the own-step term to
    the sample's influence sum (as ``beta own``), so the guide pieces act on it: there its
    ``-grad_a V_F`` cancels the sum's own step ``grad_a V_F``, leaving ``beta grad_a log g``,
    and the control variate's prediction of the sum from the state no longer leaves that
    large, predictable part behind."""
    dF = jax.grad(lambda x: jnp.sum(follower_value(game, resp, se, x)))(ae)
    score = jax.grad(lambda x: jnp.sum(resp.log_prob(s, x, b)))(a)
    dV = jax.grad(lambda x: jnp.sum(follower_value(game, resp, s, x)))(a)
    return dF, score - dV / beta


BASELINES = {"reference": reference_baseline, "same_noise": same_noise_baseline}
INFLUENCES = {"raw": raw_influence, "baseline": baselined_influence}
REACTIONS = {"q_gradient": q_gradient_reaction, "policy_score": policy_score_reaction}


def estimator(config: EstimatorConfig = EstimatorConfig()) -> Estimator:
    """The :class:`Estimator` of an :class:`~bchg_jax.games.lqr.config.EstimatorConfig`."""
    base = config.direct_baseline
    return Estimator(
        no_baseline if base == "none" else BASELINES[base](config.baseline_samples),
        sampled_benefit(config.benefit_samples),
        INFLUENCES[config.influence],
        (control_variate,) if config.influence_cv else (),
        REACTIONS[config.reaction],
    )


def _with_guide(J, est, influence, theta, ben, x, e, buf, beta):
    """J plus the surrogate of the guide pieces (the groups: the episodes of ``buf``)."""
    extra = guide_surrogate(est.guide, influence, theta, ben, x, e, buf.s.shape[0], beta)
    return J if extra is None else J + extra


def score_surrogate(est: Estimator, game, theta, Q, resp, beta, key, e, t, buf, guide: bool):
    """Theorem 2 on the minibatch (e, t) [M] of ``buf``, Gaussian leader: a scalar whose gradient
    in theta [k * n] is the estimate (``guide`` False: the direct term alone, Naive-PGD).

    ``Q(s, a, b)`` is the critic, ``resp`` the follower's response; ``key`` draws the baseline's
    leader actions and the Benefit's follower actions.
    """
    T = buf.a.shape[1]
    s, a, b = buf.s[e, t], buf.a[e, t], buf.b[e, t]
    kb, kj = jax.random.split(key)
    q = Q(s, a, b)
    logf = leader_log_prob(game, theta, s, a)
    base = est.baseline(Q, resp, lambda k, x: leader_sample(game, theta, k, x), kb, s, a, b)
    if not guide:
        return score_objective(logf, q - base, None, None, None, None, beta, "none")
    ben = est.benefit(Q, resp, kj, s, a, b, q)
    se, ae = buf.s[e, :T], buf.a[e]  # [M, T, .]
    adv = est.influence(game, resp, theta, se, ae)
    W = influence_weights(t, T, game.gamma_F, theta.dtype)
    logf_seg = leader_log_prob(game, theta, se, ae)
    J = score_objective(logf, q - base, ben, logf_seg, adv, W, beta, "benefit")
    influence = lambda th: jnp.sum(W * leader_log_prob(game, th, se, ae) * adv, -1)  # noqa: E731
    return _with_guide(J, est, influence, theta, ben, jnp.concatenate([s, a], -1), e, buf, beta)


def deterministic_surrogate(est, game, theta, Q, resp, beta, key, e, t, buf, guide: bool):
    """Theorem 3 (appendix) on the minibatch (e, t) of ``buf``, deterministic leader a = K s
    (arguments as :func:`score_surrogate`; ``key`` draws the Benefit's follower actions)."""
    T = buf.a.shape[1]
    s, b = buf.s[e, t], buf.b[e, t]
    a_pi = jax.lax.stop_gradient(leader_mean(game, theta, s))
    dQL = jax.grad(lambda aa: jnp.sum(Q(s, aa, b)))(a_pi)
    if not guide:
        return deterministic_objective(
            leader_mean(game, theta, s), dQL, None, None, None, None, beta, "none"
        )
    ben = est.benefit(Q, resp, key, s, a_pi, b, Q(s, a_pi, b))
    se, be = buf.s[e, :T], buf.b[e]
    ae = jax.lax.stop_gradient(leader_mean(game, theta, se))
    reaction = q_gradient_reaction if est.reaction is None else est.reaction
    dQF, own = reaction(game, resp, theta, s, a_pi, b, se, ae, be, beta)
    W = influence_weights(t, T, game.gamma_F, theta.dtype)
    J = deterministic_objective(
        leader_mean(game, theta, s), dQL, ben, leader_mean(game, theta, se), dQF, W, beta, "benefit"
    )
    if own is not None:  # Ben_m f(s_m) . own_m, the reaction's own-step term
        own = jax.lax.stop_gradient(own)
        weighted = jax.lax.stop_gradient(ben[:, None] * own)
        J = J + jnp.mean(jnp.sum(leader_mean(game, theta, s) * weighted, -1))

    def influence(th):
        sums = jnp.sum(W * jnp.sum(leader_mean(game, th, se) * dQF, -1), -1)
        if own is None:
            return sums
        # the own-step term belongs to the influence sum the guide pieces see (Ben I / beta):
        # the control variate then predicts the sum with it, whose grad_a V_F parts cancel
        return sums + beta * jnp.sum(leader_mean(game, th, s) * own, -1)

    return _with_guide(J, est, influence, theta, ben, s, e, buf, beta)
