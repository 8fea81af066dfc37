"""Theorem 2: the hypergradient estimators of 2-player Markov games, used by both game families.

Theorem 2 (Eq. (hg_MG)) for stochastic leaders and the appendix's Theorem 3 (Eq. (hg_MG_det))
for deterministic leaders; the direct term is Algorithm 5 ("PartialDerivative", Markov games),
the influence sums are Algorithm 7 ("FollowerQGrad", Markov games, Eq. (nablaQF_MG)).

Two shapes of one estimator:

* minibatch form (what the actor-critic trainers ascend): M segment starts (s_m, a_m, b_m) drawn
  from a buffer with probability ~ gamma_L^t, each with the rest of its episode;
  :func:`score_objective` (stochastic leader) and :func:`deterministic_objective` (deterministic
  leader, the appendix theorem, Theorem 3) are scalars whose gradient in the leader's parameters
  is the estimate, with :func:`influence_weights` the follower's discounting over the segment;
* whole-episode form (exact-critic studies, examples): the sums over segments are swapped into
  per-step weights (:func:`game_score_weights`) and pulled back with one VJP
  (:func:`hypergradient`, :func:`continuous_hypergradient`,
  :func:`deterministic_hypergradient`).

Tabular games:

For a leader policy table ``f = policy_fn(theta)`` [S, A] (tabular softmax or a network on
one-hot states) and episodes (s_t, a_t, b_t), with discounts gL, gF:

* direct (policy-gradient) term: ``sum_t gL^t (Q_L(s_t, a_t, b_t) - base_t) grad log f(a_t|s_t)``
  with an optional state baseline ``base_t = V_L(s_t)`` (unbiased);
* FollowerQGrad (Eq. (nablaQF_MG)): ``dQF_t = sum_{k >= t} gF^{k-t} (V_F(s_k, a_k) - vbar(s_k))
  grad log f(a_k|s_k)`` with ``vbar(s) = sum_a' f(a'|s) V_F(s, a')`` (a baseline; the k = t term
  has zero mean against the Benefit);
* guiding term: ``(1/beta) sum_t gL^t Ben(s_t, a_t, b_t) dQF_t``; ``guide="none"`` is Naive-PGD.

FollowerQGrad is the derivative of Q_F under Theorem 2's Bellman equation (the follower's
``backup="paper"``): with exact critics the estimate is unbiased for
``exact_hypergradient(..., backup="paper")``. Under the ``"reference"`` backup (the reference
implementation's follower, the trainers' default) the derivative of Q_F is the influence of
``sum_b h(b|s) Q_F(s, a, b)`` along (f, h), ``h = softmax_b(sum_a f Q_F / beta)``, so the
estimate is biased for that backup's hypergradient (2.5% on the toy game at p = 0.45, 76% on a
random 5-state game; ``tests/games/test_backup_expectation.py``, ``docs/followers.md``).

As for configurable MDPs the sums are swapped into per-step weights of ``grad log f(a_k|s_k)``
(the guiding weights are a forward discounted sum), scattered into an [S, A] cotangent, divided
by f (``grad log f = grad f / f``; 0 where f is 0) and pulled back through ``policy_fn`` with one
VJP. Averaged over episodes.

Continuous actions (the bi-level LQR game): :func:`game_score_weights` gives the same per-step
weights for any per-sample values, :func:`continuous_hypergradient` pulls them back through
``log f_theta(a_t|s_t)`` at the samples, and :func:`deterministic_hypergradient` is the appendix
theorem for deterministic leaders ``a = f_theta(s)`` (Eq. (hg_MG_det)): the cotangent of
``f_theta(s_k)`` is ``gL^k grad_a Q_L(s_k, a_k, b_k) + (1/beta) c_k grad_a Q_F(s_k, a_k, b_k)`` with
``c_k = sum_{t<=k} gL^t gF^(k-t) Ben_t`` (Eq. (nablaQF_MG_det) swapped into per-step weights).
"""

from __future__ import annotations

from typing import Callable, Optional

import chex
import jax
import jax.numpy as jnp
import numpy as np

from bchg_jax.core.segments import forward_discounted_sum
from bchg_jax.core.validate import (
    check_beta_if_concrete,
    check_discount,
    check_finite_if_concrete,
    check_if_concrete,
    check_indexing_once,
    check_indices_if_concrete,
    check_probability_rows_if_concrete,
    check_shape,
    is_concrete,
)

Array = jax.Array


def check_policy_fn_on_simplex(policy_fn, theta, caller: str, game=None) -> None:
    """``policy_fn(theta)`` is an [S, A] table of ``game`` (when given; checked for a traced
    ``theta`` too), and its rows stay distributions as a concrete ``theta`` moves (a traced one
    is skipped): their sums must not change along a random direction of ``theta`` (one JVP).

    The leader's objective is a function of policies; its derivative in a direction that moves
    a row's sum off 1 (a direct table ``policy_fn = lambda t: t`` moves every entry freely) is
    that of an extension to non-policies, which Theorem 2's estimator does not estimate: its
    baselines drop exactly that direction (``E_f[d log f(a|s)] b(s) = b(s) sum_a df(a|s)``
    vanishes only on the simplex). A random direction catches such a ``policy_fn`` with
    probability 1; a softmax, or a table normalised by its row sums, passes (the tangent is
    taken in float64 where ``policy_fn`` runs so, :func:`_tangent_in_float64`: in float32 a
    saturated softmax's row sums moved by rounding beyond the bound).

    Args:
      policy_fn: theta -> f [S, A].
      theta: the leader's parameters (pytree of floating arrays).
      caller: the function's name in the error.
      game: the :class:`TabularGame` whose S and A the table must have (None: not checked).
    Raises:
      ValueError: a theta with a non-floating leaf (or none), a table of another shape than
        [S, A], rows that are not distributions at ``theta``, or a row sum that moves with
        theta beyond rounding.
    """
    leaves = jax.tree.leaves(theta)
    kinds = [jnp.result_type(x) for x in leaves]
    if not leaves or not all(jnp.issubdtype(k, jnp.floating) for k in kinds):
        raise ValueError(
            f"{caller}: theta must be a floating array (or a pytree of them) to be "
            f"differentiated, got {'no arrays' if not leaves else 'dtypes ' + str(kinds)}: "
            "e.g. jnp.zeros((S, A)) or jnp.asarray(theta, jnp.float32)"
        )
    if game is not None:
        S, A = np.shape(game.transition)[:2]
        check_shape(
            f"{caller}: policy_fn(theta)",
            jax.eval_shape(policy_fn, theta),
            (S, A),
            f"the leader's policy table [S, A], S={S}, A={A} from {game.name}'s transition",
        )
    if not is_concrete(*leaves):
        return
    f = policy_fn(theta)
    if not is_concrete(f):  # a policy_fn closing over traced values (under jit): skipped
        return
    check_indexing_once(policy_fn, {"policy_fn(theta)": policy_fn}, theta, pname=caller)
    check_probability_rows_if_concrete(f"{caller}: policy_fn(theta) (leader policy)", f)
    f64, df = _tangent_in_float64(policy_fn, theta)
    df = np.asarray(df, np.float64)
    scale = float(np.max(np.abs(df), initial=0.0))
    drift = float(np.max(np.abs(df.sum(-1)), initial=0.0))
    eps = float(jnp.finfo(jnp.result_type(f64)).eps)
    if drift > 1e3 * eps * max(df.shape[-1], 1) * scale:
        raise ValueError(
            f"{caller}: policy_fn's row sums move with theta (a step along a random direction "
            f"changes a row sum at {drift / scale:.3g} of the rate it changes an entry): "
            "the gradient would be that of the objective extended to tables that are no "
            "policies, which Theorem 2's estimator does not estimate. Keep every row on the "
            "simplex for every theta near this one, e.g. f = jax.nn.softmax(logits, -1) or "
            "f = x / x.sum(-1, keepdims=True)"
        )


def _tangent_in_float64(policy_fn, theta):
    """(f, df) of ``policy_fn`` at ``theta`` along a fixed random direction, computed in float64
    where the function allows it (else in theta's dtype).

    In float32 a saturated softmax's row-sum tangent is rounding of the logits' tangent, which
    can be 1e-3 of its entries' tangent (entries ~f(1 - f) small): a policy on the simplex
    would look like one that leaves it. In float64 that rounding is ~1e-13 of it.
    """
    rng = np.random.default_rng(0)
    direction = [rng.standard_normal(np.shape(x)) for x in jax.tree.leaves(theta)]
    treedef = jax.tree.structure(theta)

    def along(dtype_of):
        leaves = jax.tree.leaves(theta)
        th = treedef.unflatten([jnp.asarray(x, dtype_of(x)) for x in leaves])
        d = treedef.unflatten(
            [jnp.asarray(u, dtype_of(x)) for u, x in zip(direction, leaves, strict=True)]
        )
        return jax.jvp(policy_fn, (th,), (d,))

    try:
        with jax.enable_x64(True):
            f, df = along(lambda x: jnp.float64)
            return np.asarray(f), np.asarray(df)
    except Exception:  # noqa: BLE001 - a policy_fn that cannot run in float64: its own dtype
        return along(jnp.result_type)


def influence_weights(t: Array, T: int, gamma_F, dtype=jnp.float32) -> Array:
    """W[m, k] = gamma_F^(k - t_m) for k >= t_m, else 0: the follower's discounting of step k in
    the influence sum of a segment starting at t_m (Eq. (nablaQF_MG), Algorithm 7).

    Args:
      t: [M] int start steps of the segments.
      T: episode length.
      gamma_F: the follower's discount, scalar.
      dtype: dtype of the powers of gamma_F.
    Returns:
      [M, T] weights.
    Raises:
      ValueError: a concrete ``gamma_F`` outside [0, 1).
    """
    check_if_concrete(check_discount, "gamma_F", gamma_F)
    kk = jnp.arange(T)[None, :] - t[:, None]
    return jnp.where(kk >= 0, gamma_F ** jnp.maximum(kk, 0).astype(dtype), 0.0)


def score_objective(
    log_f: Array,
    advantage: Array,
    benefit: Array,
    log_f_seg: Array,
    adv_F_seg: Array,
    seg_weights: Array,
    beta,
    guide: str = "benefit",
) -> Array:
    """Theorem 2 (Eq. (hg_MG)) on a minibatch (stochastic leader): a scalar whose gradient is the
    estimate.

    With the M segment starts drawn with probability ~ gamma_L^t (the discounted visitation
    d_{gamma_L} of Theorem 2), the first term is Algorithm 5's direct term and the second the
    guiding term with Algorithm 7's FollowerQGrad.

    ``mean_m [ log f(a_m|s_m) (Q_L - base)_m
    + (1/beta) Ben_m sum_k W[m,k] log f(a_mk|s_mk) adv_F[m,k] ]``
    with every factor but the log-probabilities held constant: the direct (policy-gradient) term
    and the guiding term ``(1/beta) Ben x FollowerQGrad`` of Eq. (hg_MG) / (nablaQF_MG).

    Args:
      log_f: [M] log f_theta(a_m|s_m) (differentiable in theta).
      advantage: [M] Q_L(s_m, a_m, b_m) minus a baseline that does not depend on a_m.
      benefit: [M] Ben(s_m, a_m, b_m) = Q_L(s, a, b) - E_{b' ~ g(.|s, a)} Q_L(s, a, b').
      log_f_seg: [M, T] log f_theta(a_k|s_k) along each sample's episode.
      adv_F_seg: [M, T] V_F(s_k, a_k) (minus an optional baseline depending on s_k only).
      seg_weights: [M, T] from :func:`influence_weights`.
      beta: the follower's entropy weight (> 0), scalar.
      guide: ``"benefit"`` (BC-HG) or ``"none"`` (Naive-PGD; ``benefit``, ``log_f_seg``,
        ``adv_F_seg`` and ``seg_weights`` are then unused and may be None).
    Returns:
      [] scalar surrogate objective; its gradient in theta is the ascent direction.
    Raises:
      ValueError: an unknown ``guide`` or a concrete ``beta`` not finite and > 0.
    """
    _check_guide(guide)
    check_beta_if_concrete(beta)
    chex.assert_rank(log_f, 1)
    chex.assert_equal_shape([log_f, advantage])
    if guide == "benefit":
        chex.assert_shape(benefit, log_f.shape)
        chex.assert_equal_shape([log_f_seg, adv_F_seg, seg_weights])
        chex.assert_axis_dimension(log_f_seg, 0, log_f.shape[0])
    J = jnp.mean(log_f * jax.lax.stop_gradient(advantage))
    if guide == "benefit":
        influence = jnp.sum(seg_weights * log_f_seg * jax.lax.stop_gradient(adv_F_seg), -1)
        J = J + jnp.mean(jax.lax.stop_gradient(benefit) * influence) / beta
    return J


def deterministic_objective(
    action: Array,
    dQL_da: Array,
    benefit: Array,
    action_seg: Array,
    dQF_da_seg: Array,
    seg_weights: Array,
    beta,
    guide: str = "benefit",
) -> Array:
    """Theorem 3 (appendix) on a minibatch (deterministic leader a = f_theta(s)).

    ``mean_m [ f(s_m) . grad_a Q_L
    + (1/beta) Ben_m sum_k W[m,k] f(s_mk) . grad_a Q_F(s_mk, f(s_mk), b_mk) ]``
    with the action-gradients held constant (Eq. (hg_MG_det) / (nablaQF_MG_det)).

    Args:
      action: [M, k] f_theta(s_m) (differentiable in theta).
      dQL_da: [M, k] grad_a Q_L at (s_m, f(s_m), b_m) (held constant).
      benefit: [M] Ben(s_m, f(s_m), b_m).
      action_seg: [M, T, k] f_theta(s_k) along each sample's episode (differentiable).
      dQF_da_seg: [M, T, k] grad_a Q_F(s_k, f(s_k), b_k) (held constant).
      seg_weights: [M, T] from :func:`influence_weights`.
      beta: the follower's entropy weight (> 0), scalar.
      guide: ``"benefit"`` (BC-HG) or ``"none"`` (deterministic Naive-PGD; the segment inputs
        and ``benefit`` may then be None).
    Returns (and raises): as :func:`score_objective`.
    """
    _check_guide(guide)
    check_beta_if_concrete(beta)
    chex.assert_rank(action, 2)
    chex.assert_equal_shape([action, dQL_da])
    if guide == "benefit":
        chex.assert_shape(benefit, action.shape[:1])
        chex.assert_equal_shape([action_seg, dQF_da_seg])
        chex.assert_shape(seg_weights, action_seg.shape[:2])
    J = jnp.mean(jnp.sum(action * jax.lax.stop_gradient(dQL_da), -1))
    if guide == "benefit":
        influence = jnp.sum(
            seg_weights * jnp.sum(action_seg * jax.lax.stop_gradient(dQF_da_seg), -1), -1
        )
        J = J + jnp.mean(jax.lax.stop_gradient(benefit) * influence) / beta
    return J


def _check_guide(guide: str) -> None:
    if guide not in ("benefit", "none"):
        raise ValueError(f"guide must be 'benefit' or 'none', got {guide!r}")


def _check_scalars(beta, gamma_L, gamma_F) -> None:
    """Concrete beta > 0, gamma_L in [0, 1] (a finite-horizon leader sum may be undiscounted),
    gamma_F in [0, 1) (the follower's infinite-horizon discount); traced values are skipped."""
    check_beta_if_concrete(beta)
    check_if_concrete(check_discount, "gamma_L", gamma_L, True)
    check_if_concrete(check_discount, "gamma_F", gamma_F)


def game_score_weights(
    q: Array,
    base,
    ben: Array,
    adv_F: Array,
    beta,
    gamma_L,
    gamma_F,
    guide: str = "benefit",
    leader_steps: Optional[int] = None,
) -> Array:
    """Per-step weights of ``grad log f(a_k|s_k)`` in Theorem 2's estimate, [E, T].

    ``w_k = gL^k (q_k - base_k) + (1/beta) c_k adv_F_k`` with
    ``c_k = sum_{t<=k} gF^(k-t) gL^t ben_t``: the direct term (Algorithm 5) and the guiding term
    of Eq. (hg_MG) with Eq. (nablaQF_MG)'s sums swapped into per-step weights.

    ``q`` = Q_L(s_t, a_t, b_t), ``base`` a baseline not depending on a_t (or 0), ``ben`` the
    Benefit, ``adv_F`` = V_F(s_k, a_k) (- an optional baseline depending on s_k only).
    ``leader_steps``: only t < leader_steps enter the leader's sums (a finite-horizon objective),
    while the follower's influence sums run to the end of the episode.

    Args:
      q: [E, T] Q_L(s_t, a_t, b_t).
      base: [E, T] (or broadcastable, e.g. 0.0) baseline of the direct term.
      ben: [E, T] Benefit B_L(s_t, a_t, b_t).
      adv_F: [E, T] V_F(s_k, a_k), optionally minus a state-only baseline.
      beta: the follower's entropy weight (> 0), scalar.
      gamma_L: the leader's discount. gamma_F: the follower's discount.
      guide: ``"benefit"`` (BC-HG) or ``"none"`` (Naive-PGD: direct term only).
      leader_steps: optional cut-off of the leader's sums (None: all T steps).
    Returns:
      [E, T] weights.
    Raises:
      ValueError: an unknown ``guide``, a concrete ``beta`` not finite and > 0, a concrete
        ``gamma_L`` outside [0, 1] or ``gamma_F`` outside [0, 1).
    """
    _check_guide(guide)
    _check_scalars(beta, gamma_L, gamma_F)
    disc = _leader_discounts(q.shape[1], q.dtype, gamma_L, leader_steps)
    w = disc * (q - base)
    if guide == "benefit":
        w = w + _guide_coefficients(disc * ben, gamma_F) * adv_F / beta
    return w


def _leader_discounts(T: int, dtype, gamma_L, leader_steps: Optional[int]) -> Array:
    """gamma_L^t for t < T, zero from ``leader_steps`` on (a finite-horizon leader objective)."""
    disc = gamma_L ** jnp.arange(T, dtype=dtype)
    return disc if leader_steps is None else jnp.where(jnp.arange(T) < leader_steps, disc, 0.0)


def _guide_coefficients(disc_ben: Array, gamma_F) -> Array:
    """c_k = sum_{t<=k} gF^(k-t) gL^t Ben_t: the guiding term's weight of step k's influence."""
    return forward_discounted_sum(disc_ben, gamma_F, jnp.zeros(disc_ben.shape, bool))


def hypergradient(
    policy_fn: Callable[[Array], Array],
    theta,
    ep,
    g: Array,
    Q_L: Array,
    V_F: Array,
    beta,
    gamma_L,
    gamma_F,
    guide: str = "benefit",
    V_L: Optional[Array] = None,
):
    """Theorem 2's estimate (``guide="benefit"``: BC-HG; ``"none"``: Naive-PGD) for one batch.

    Tabular whole-episode form: the per-step weights of :func:`game_score_weights` (with
    ``Ben = Q_L - sum_b g Q_L`` and the influence baseline ``sum_a' f(a'|s) V_F(s, a')``) are
    scattered into an [S, A] cotangent and pulled back through ``log policy_fn`` (as the VJP of
    ``policy_fn`` at the cotangent divided by f, 0 where f is 0: a leader action of probability 0
    is never sampled and contributes nothing) with one VJP, averaged over the E episodes.

    Args:
      policy_fn: theta -> f [S, A], the leader's policy table (rows on the simplex; entries that
        are exactly 0 are allowed).
      theta: the leader's parameters (pytree).
      ep: :class:`~bchg_jax.games.tabular.rollout.GameEpisodes` (``s``, ``a``, ``b`` [E, T] int).
      g: [S, A, B] the follower's policy g(b|s, a).
      Q_L: [S, A, B] the leader's critic Q_L(s, a, b).
      V_F: [S, A] the follower's soft value V_F(s, a).
      beta: the follower's entropy weight (> 0), scalar.
      gamma_L: the leader's discount. gamma_F: the follower's discount.
      guide: ``"benefit"`` or ``"none"``.
      V_L: optional [S] state baseline V_L(s) of the direct term (unbiased).
    Returns:
      a pytree like ``theta``: the estimate of grad_theta J_L (an ascent direction).
    Raises:
      ValueError: as :func:`game_score_weights`; ``g``, ``Q_L``, ``V_F`` or ``V_L`` not shaped
        by the policy table [S, A] and ``g``'s B; a concrete ``policy_fn(theta)`` or ``g`` whose
        rows are not distributions (``core.validate.check_probability_rows_if_concrete``), or
        a ``policy_fn`` whose row sums move with a concrete theta
        (:func:`check_policy_fn_on_simplex`);
        a concrete ``Q_L``, ``V_F`` or ``V_L`` that is not finite; concrete episode indices out
        of range.
    """
    _check_guide(guide)
    _check_scalars(beta, gamma_L, gamma_F)
    f = jax.lax.stop_gradient(policy_fn(theta))
    S, A = f.shape
    B = g.shape[-1]
    src = "S, A from policy_fn(theta), B from g"
    for name, x, shape in (("g", g, (S, A, B)), ("Q_L", Q_L, (S, A, B)), ("V_F", V_F, (S, A))):
        check_shape(name, x, shape, src)
    check_probability_rows_if_concrete("policy_fn(theta) (leader policy)", f)
    # rows that leave the simplex as theta moves: a direction the estimate does not estimate
    # (its baselines drop it), so the state baseline and none gave different means
    check_policy_fn_on_simplex(policy_fn, theta, "games.tabular.hypergradient")
    check_probability_rows_if_concrete("g (follower policy)", g)
    if V_L is not None:
        check_shape("V_L", V_L, (S,), src)
    for name, x in (("Q_L", Q_L), ("V_F", V_F), ("V_L", V_L)):
        if x is not None:
            check_finite_if_concrete(name, x)  # a NaN critic gave an all-NaN estimate
    if np.ndim(ep.s) != 2:
        raise ValueError(f"ep.s (states) must be [E, T], got shape {tuple(np.shape(ep.s))}")
    for name, x in (("ep.a", ep.a), ("ep.b", ep.b)):
        check_shape(name, x, np.shape(ep.s), "[E, T] from ep.s")
    for name, idx, size in (("ep.s (states)", ep.s, S), ("ep.a", ep.a, A), ("ep.b", ep.b, B)):
        check_indices_if_concrete(name, idx, size)
    E, T = ep.s.shape
    q = Q_L[ep.s, ep.a, ep.b]
    base = 0.0 if V_L is None else V_L[ep.s]
    ben = q - jnp.sum(g * Q_L, axis=-1)[ep.s, ep.a]
    vbar = jnp.sum(f * V_F, axis=-1)
    w = game_score_weights(
        q, base, ben, V_F[ep.s, ep.a] - vbar[ep.s], beta, gamma_L, gamma_F, guide
    )
    ct = jnp.zeros((S, A), f.dtype).at[ep.s, ep.a].add(jax.lax.stop_gradient(w)) / E
    # grad log f = grad f / f, pulled back through policy_fn itself: an action of probability 0
    # (a float32 softmax underflows at a logit gap of ~90) is never sampled, so its cotangent is 0,
    # where the VJP of log f would give 0 / 0 = NaN for every parameter it shares
    ct = jnp.where(f > 0, ct / jnp.where(f > 0, f, 1.0), 0.0)
    _, vjp = jax.vjp(policy_fn, theta)
    return vjp(ct)[0]


def continuous_hypergradient(log_prob_fn: Callable, theta, s: Array, a: Array, weights: Array):
    """sum_{e,t} weights[e,t] grad log f_theta(a[e,t] | s[e,t]) / E with one VJP.

    Theorem 2's whole-episode score form for continuous actions (the bi-level LQR game).

    Args:
      log_prob_fn: ``log_prob_fn(theta, s, a)`` -> [E, T] log f_theta(a|s).
      theta: the leader's parameters (pytree, e.g. [k * n]).
      s: [E, T, n] states.
      a: [E, T, k] leader actions.
      weights: [E, T] from :func:`game_score_weights` (held constant).
    Returns:
      a pytree like ``theta``.
    """
    E = weights.shape[0]
    _, vjp = jax.vjp(lambda th: log_prob_fn(th, s, a), theta)
    return vjp(jax.lax.stop_gradient(weights) / E)[0]


def deterministic_hypergradient(
    policy_fn: Callable,
    theta,
    s: Array,
    dQL_da: Array,
    ben: Array,
    dQF_da: Array,
    beta,
    gamma_L,
    gamma_F,
    guide: str = "benefit",
    leader_steps: Optional[int] = None,
    own_step: Optional[Array] = None,
):
    """Theorem 3 (appendix; deterministic leader ``a = policy_fn(theta, s)``), one VJP.

    Eq. (hg_MG_det) with Eq. (nablaQF_MG_det): the cotangent of f_theta(s_k) is
    ``gL^k dQL_da_k + (1/beta) c_k dQF_da_k``, ``c_k = sum_{t<=k} gL^t gF^(k-t) ben_t``,
    averaged over the E episodes.

    ``s`` [E, T, n]; ``dQL_da``, ``dQF_da`` [E, T, k] the action-gradients of Q_L and Q_F at
    (s_k, f(s_k), b_k); ``ben`` [E, T] the Benefit. ``guide="none"``: the deterministic Naive-PGD.

    Args:
      policy_fn: ``policy_fn(theta, s)`` -> [E, T, k] the deterministic leader's actions.
      theta: the leader's parameters (pytree).
      s: [E, T, n] states.
      dQL_da: [E, T, k] grad_a Q_L(s_k, a, b_k) at a = f(s_k).
      ben: [E, T] Benefit B_L(s_k, f(s_k), b_k).
      dQF_da: [E, T, k] grad_a Q_F(s_k, a, b_k) at a = f(s_k).
      beta: the follower's entropy weight (> 0), scalar.
      gamma_L: the leader's discount. gamma_F: the follower's discount.
      guide: ``"benefit"`` (BC-HG) or ``"none"``.
      leader_steps: optional cut-off of the leader's sums (None: all T steps).
      own_step: optional [E, T, k] added to each step's own guiding term (``guide="benefit"``
        only): the cotangent gains ``gL^k ben_k own_step_k`` (the white-box reaction of a
        follower off its best response,
        :func:`bchg_jax.games.lqr.estimator.policy_score_reaction`: pass ``grad_a V_F`` as
        ``dQF_da`` and ``grad_a log g - grad_a V_F / beta`` here).
    Returns:
      a pytree like ``theta``.
    Raises:
      ValueError: an unknown ``guide``, a concrete ``beta`` not finite and > 0, a concrete
        ``gamma_L`` outside [0, 1] or ``gamma_F`` outside [0, 1).
    """
    _check_guide(guide)
    _check_scalars(beta, gamma_L, gamma_F)
    E, T = ben.shape
    disc = _leader_discounts(T, ben.dtype, gamma_L, leader_steps)
    ct = disc[:, None] * dQL_da
    if guide == "benefit":
        ct = ct + _guide_coefficients(disc * ben, gamma_F)[..., None] * dQF_da / beta
        if own_step is not None:
            ct = ct + (disc * ben)[..., None] * own_step
    _, vjp = jax.vjp(lambda th: policy_fn(th, s), theta)
    return vjp(jax.lax.stop_gradient(ct) / E)[0]
