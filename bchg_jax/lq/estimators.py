"""Hypergradient estimators for continuous configurable MDPs (Theorem 1, Eq. (hg_configurable),
with sampled episodes).

Per episode (s_0, b_0, ..., s_T), with discounts gL = gamma_L, gF = gamma_F and
``dlogp_k = grad_theta log p_theta(s_{k+1} | s_k, b_k)``:

* partial term (Algorithm 4 "PartialDerivative", configurable MDPs):
  ``sum_{t<T} gL^t grad r_L(s_t, b_t) + sum_{k<T} gL^{k+1} V_L(s_{k+1}) dlogp_k`` (rho_0 does not
  depend on theta here, so there is no t = 0 score term);
* FollowerQGrad (Algorithm 6, Eq. (nablaQF)): ``dQF_t = sum_{t<=k<T} gF^{k-t} (grad r_F(s_k, b_k)
  + gF V_F(s_{k+1}) dlogp_k)``;
* guiding term, ``benefit`` (BC-HG): ``(1/beta) sum_t gL^t Ben(s_t, b_t) dQF_t``;
  ``hpgd`` (Thoma et al., Eq. (hpgd_guidance)): ``(1/beta) sum_t gL^t Q_L(s_t, b_t) (dQF_t -
  dVF(s_t))`` with a learned ``dVF ~ grad_theta V_F``; ``none`` (Naive-PGD): no guiding term.

The sum is averaged over episodes. Like the tabular estimators it is computed as *one* gradient:
swapping the sums turns every term into a scalar weight times ``grad log p``, ``grad r_L`` or
``grad r_F`` of a single step (the guiding weights are a forward discounted sum,
``bchg_jax.core.segments.forward_discounted_sum``), so the estimate is ``jax.grad`` of
``sum_k a_k log p_theta(s_{k+1}|s_k,b_k) + u_k r_L + f_k r_F`` with the weights held fixed.
The HPGD ``dVF`` term is already a vector and is added directly.
"""

from __future__ import annotations

from typing import Optional

import jax
import jax.numpy as jnp

from bchg_jax.core.precision import full_precision
from bchg_jax.core.segments import forward_discounted_sum
from bchg_jax.core.validate import (
    check_beta_if_concrete,
    check_problem_settings,
    check_shape,
    check_theta,
)
from bchg_jax.lq.rollout import Trajectories

Array = jax.Array

GUIDES = ("benefit", "hpgd", "none")


def check_batch(problem, theta: Array, traj: Trajectories, **arrays) -> None:
    """The estimators' inputs fit each other: ``theta`` shaped like ``problem.theta0``, ``traj``'s
    actions on its states' [E, T+1] grid (and its sizes the problem's ``state_dim`` /
    ``action_dim`` where it has them), and each named array of ``arrays`` (None: skipped)
    shaped by its name's suffix: ``*_states`` [E, T+1], ``*_steps`` [E, T], ``*_grads``
    [E, T, *theta.shape]. Shapes are static, so this holds for traced values too; a wrong
    shape would otherwise broadcast into a wrong estimate (a [1, T+1] ``V_L``) or index past
    theta's end (JAX clamps), with no error.

    Raises:
      ValueError: the first array whose shape does not fit, named.
    """
    check_theta(problem, theta)
    E, T1 = traj.s.shape[:2]
    src = f"E={E}, T={T1 - 1} from traj.s"
    check_shape("traj.b", traj.b, (E, T1) + tuple(traj.b.shape[2:]), src)
    for label, attr, arr in (("traj.s", "state_dim", traj.s), ("traj.b", "action_dim", traj.b)):
        size = getattr(problem, attr, None)
        if size is not None and (arr.ndim != 3 or arr.shape[2] != size):
            raise ValueError(f"{label} must have shape [E, T+1, {size}] ({attr}), got {arr.shape}")
    want = {"states": (E, T1), "steps": (E, T1 - 1), "grads": (E, T1 - 1) + tuple(theta.shape)}
    for key, value in arrays.items():
        if value is not None:
            name, kind = key.rsplit("_", 1)
            check_shape(name, value, want[kind], src)


def discounted_returns(r: Array, gamma) -> Array:
    """G_t = sum_{k >= t} gamma^{k-t} r_k along axis 1 of ``r`` [E, T, ...] (truncated at T).

    Args:
      r: [E, T, ...] per-step (scalar or vector) rewards.
      gamma: discount, scalar.
    Returns:
      [E, T, ...] discounted suffix sums (Monte Carlo returns of every segment).
    """

    def body(G, x):
        G = x + gamma * G
        return G, G

    x = jnp.moveaxis(r, 1, 0)[::-1]
    _, out = jax.lax.scan(body, jnp.zeros_like(x[0]), x)
    return jnp.moveaxis(out[::-1], 0, 1)


def step_weights(
    traj: Trajectories,
    V_L_next: Array,
    V_F_next: Array,
    guide_weight: Optional[Array],
    beta,
    gamma_L,
    gamma_F,
):
    """(a, u, f): weights of grad log p (transition k), grad r_L and grad r_F (step k), [E, T].

    ``a_k = gL^{k+1} V_L(s_{k+1}) + gF V_F(s_{k+1}) c_k``, ``u_k = gL^k``, ``f_k = c_k`` with
    ``c_k = (1/beta) sum_{t<=k} gF^{k-t} gL^t guide_weight_t`` (zero without a guide): the sums of
    Eq. (hg_configurable) / (nablaQF) swapped into per-step weights.

    Args:
      traj: the batch (``s`` [E, T+1, n]).
      V_L_next: [E, T] V_L(s_{k+1}) (optionally minus a control variate).
      V_F_next: [E, T] V_F(s_{k+1}) (optionally minus a control variate).
      guide_weight: [E, T] Benefit (BC-HG) or Q_L (HPGD) per step, or None (no Monte Carlo
        guiding weights).
      beta: the follower's entropy weight, scalar.
      gamma_L: the leader's discount. gamma_F: the follower's discount.
    Returns:
      (a, u, f), each [E, T].
    """
    E, T = traj.s.shape[0], traj.horizon
    disc_L = gamma_L ** jnp.arange(T, dtype=traj.s.dtype)
    a = gamma_L * disc_L * V_L_next
    u = jnp.broadcast_to(disc_L, (E, T))
    f = jnp.zeros((E, T), traj.s.dtype)
    if guide_weight is not None:
        c = forward_discounted_sum(disc_L * guide_weight, gamma_F, jnp.zeros((E, T), bool)) / beta
        a = a + gamma_F * V_F_next * c
        f = f + c
    return a, u, f


def weighted_gradient(
    problem, theta: Array, traj: Trajectories, a: Array, u: Array, f: Array
) -> Array:
    """grad_theta of sum_{e,k} (a log p(s_{k+1}|s_k,b_k) + u r_L(s_k,b_k) + f r_F(s_k,b_k)) / E.

    Args:
      problem: the configurable MDP (``log_transition``, ``leader_reward``, ``follower_reward``).
      theta: [d] leader parameters.
      traj: the batch (``s`` [E, T+1, n], ``b`` [E, T+1, m]).
      a, u, f: [E, T] weights (held constant), e.g. from :func:`step_weights`.
    Returns:
      [d] gradient.
    """
    s, b, s2 = traj.s[:, :-1], traj.b[:, :-1], traj.s[:, 1:]
    a, u, f = (jax.lax.stop_gradient(x) for x in (a, u, f))

    def surrogate(th):
        out = jnp.sum(a * problem.log_transition(th, s, b, s2))
        out = out + jnp.sum(u * problem.leader_reward(th, s, b))
        out = out + jnp.sum(f * problem.follower_reward(th, s, b))
        return out / s.shape[0]

    return jax.grad(surrogate)(theta)


def per_step_follower_grad(problem, theta: Array, traj: Trajectories, V_F_next: Array) -> Array:
    """Per-step terms of FollowerQGrad, score-function form (Eq. (nablaQF), Algorithm 6).

    y_k = grad r_F(s_k, b_k) + gamma_F V_F(s_{k+1}) dlogp_k for every step; the discounted suffix
    sums ``sum_{k>=t} gamma_F^{k-t} y_k`` estimate grad_theta Q_F(s_t, b_t).

    Args:
      problem: the configurable MDP (``follower_reward``, ``log_transition``, ``gamma_F``).
      theta: [d] leader parameters.
      traj: the batch (``s`` [E, T+1, n], ``b`` [E, T+1, m]).
      V_F_next: [E, T] the follower's soft value V_F(s_{k+1}) (held constant; may be centred by
        E[V_F(s')|s_k, b_k], an unbiased control variate).
    Returns:
      [E, T, d] per-step gradients y_k.
    """
    check_batch(problem, theta, traj, V_F_next_steps=V_F_next)
    s, b, s2 = traj.s[:, :-1], traj.b[:, :-1], traj.s[:, 1:]

    def one(th, si, bi, s2i, vi):
        return problem.follower_reward(th, si, bi) + problem.gamma_F * vi * problem.log_transition(
            th, si, bi, s2i
        )

    g = jax.vmap(jax.vmap(jax.grad(one), (None, 0, 0, 0, 0)), (None, 0, 0, 0, 0))
    return g(theta, s, b, s2, jax.lax.stop_gradient(V_F_next))


def per_step_follower_grad_pathwise(problem, theta: Array, traj: Trajectories, V_F_fn) -> Array:
    """Per-step terms of FollowerQGrad, pathwise form for additive-noise dynamics.

    For ``s' = mean_next(theta, s, b) + w``: y_k = grad r_F(s_k, b_k)
    + gamma_F grad_theta V_F(mean_next(theta, s_k, b_k) + w_k) with V_F held fixed and
    w_k = s_{k+1} - mean_next(theta, s_k, b_k). Same expectation given (s_k, b_k) as the score
    form of Eq. (nablaQF) (reparameterisation), far lower variance when V_F is steep.

    Args:
      problem: the configurable MDP (``follower_reward``, ``mean_next``, ``gamma_F``).
      theta: [d] leader parameters.
      traj: the batch (``s`` [E, T+1, n], ``b`` [E, T+1, m]).
      V_F_fn: s [..., n] -> [...] the follower's soft value; must not depend on theta (e.g.
        built from a gradient-stopped best response).
    Returns:
      [E, T, d] per-step gradients y_k.
    """
    check_batch(problem, theta, traj)
    s, b, s2 = traj.s[:, :-1], traj.b[:, :-1], traj.s[:, 1:]
    noise = jax.lax.stop_gradient(s2 - problem.mean_next(theta, s, b))

    def one(th, si, bi, wi):
        return problem.follower_reward(th, si, bi) + problem.gamma_F * V_F_fn(
            problem.mean_next(th, si, bi) + wi
        )

    g = jax.vmap(jax.vmap(jax.grad(one), (None, 0, 0, 0)), (None, 0, 0, 0))
    return g(theta, s, b, noise)


@full_precision
def hypergradient(
    problem,
    theta: Array,
    traj: Trajectories,
    beta,
    V_L: Array,
    V_F: Array,
    guide: str = "benefit",
    benefit: Optional[Array] = None,
    Q_L: Optional[Array] = None,
    dVF: Optional[Array] = None,
    dQF: Optional[Array] = None,
    EV_L: Optional[Array] = None,
    EV_F: Optional[Array] = None,
) -> Array:
    """Theorem 1's hypergradient estimate (Eq. (hg_configurable)) for one batch of episodes.

    Algorithm 1's update direction with the continuous modules (Algorithms 4 and 6): partial term
    plus the guiding term of ``guide``, averaged over the E episodes, as one gradient.

    ``V_L`` [E, T+1]: leader values at s_0..s_T for the partial term (a critic, or Monte Carlo
    returns); ``V_F`` [E, T+1]: the follower's soft values. ``guide='benefit'`` needs ``benefit``
    [E, T]; ``guide='hpgd'`` needs ``Q_L`` [E, T] and ``dVF`` [E, T, d] (grad V_F at s_0..s_{T-1}).

    FollowerQGrad: by default the score-function sums of Eq. (nablaQF) enter through the weights
    of ``grad log p`` (one VJP). ``dQF`` [E, T, d] replaces them by given per-step estimates of
    grad Q_F(s_t, b_t) (e.g. suffix sums of :func:`per_step_follower_grad_pathwise`).
    With ``guide='benefit'``, ``dVF`` is optional and acts as a state baseline: because
    ``E_b[Ben(s, b)] = 0``, ``Ben_t (dQF_t - h(s_t))`` has the same expectation for *any* h that
    does not depend on the episode's own actions, so an approximate grad V_F only lowers variance
    (a fit on the same episodes does depend on them: fit it on the other episodes,
    :func:`bchg_jax.lq.critics.leave_one_out_vector_value`). HPGD's ``Q_L (dQF - dVF)`` is biased
    when dVF is.

    Control variates (optional, same expectation): ``EV_L`` / ``EV_F`` [E, T] are
    ``E[V(s') | s_k, b_k]`` for the leader / follower; they are subtracted from ``V(s_{k+1})`` in
    the score-function terms, which is unbiased because ``E[dlogp_k | s_k, b_k] = 0`` and every
    weight of ``dlogp_k`` depends on the episode only up to ``b_k``.

    Args:
      problem: a continuous configurable MDP (e.g. :class:`~bchg_jax.lq.cmdp.LQConfigurableMDP`:
        ``log_transition``, ``leader_reward``, ``follower_reward``, ``gamma_L``, ``gamma_F``).
      theta: [d] leader parameters.
      traj: :class:`~bchg_jax.lq.rollout.Trajectories` (``s`` [E, T+1, n], ``b`` [E, T+1, m]).
      beta: the follower's entropy weight (> 0), scalar.
      V_L: [E, T+1] leader values V_L(s_0..s_T) (only s_1..s_T are used).
      V_F: [E, T+1] follower soft values V_F(s_0..s_T) (only s_1..s_T are used).
      guide: ``"benefit"`` (BC-HG), ``"hpgd"`` (HPGD) or ``"none"`` (Naive-PGD).
      benefit: [E, T] Ben(s_t, b_t) = Q_L(s_t, b_t) - V_L(s_t) (``guide="benefit"``).
      Q_L: [E, T] Q_L(s_t, b_t) (``guide="hpgd"``).
      dVF: [E, T, d] estimates of grad_theta V_F(s_t) (required by HPGD, optional baseline for
        BC-HG).
      dQF: [E, T, d] per-step estimates of grad_theta Q_F(s_t, b_t) replacing the score-function
        FollowerQGrad.
      EV_L: [E, T] E[V_L(s') | s_k, b_k] control variate, or None.
      EV_F: [E, T] E[V_F(s') | s_k, b_k] control variate, or None.
    Returns:
      [d] estimate of grad_theta J_L (an ascent direction).
    Raises:
      ValueError: unknown ``guide``, a missing input it needs, an input shaped unlike the
        batch or theta (:func:`check_batch`), a concrete ``beta`` not finite and > 0, or a bad
        scalar setting of ``problem`` (a discount outside [0, 1), ...).
    """
    if guide not in GUIDES:
        raise ValueError(f"guide must be one of {GUIDES}, got {guide!r}")
    check_problem_settings(problem)
    check_beta_if_concrete(beta)
    gw = {"benefit": benefit, "hpgd": Q_L, "none": None}[guide]
    if guide != "none" and gw is None:
        raise ValueError(f"guide={guide!r} needs {'benefit' if guide == 'benefit' else 'Q_L'}")
    if guide == "hpgd" and dVF is None:
        raise ValueError("guide='hpgd' needs dVF")
    check_batch(
        problem,
        theta,
        traj,
        V_L_states=V_L,
        V_F_states=V_F,
        benefit_steps=benefit,
        Q_L_steps=Q_L,
        EV_L_steps=EV_L,
        EV_F_steps=EV_F,
        dVF_grads=dVF,
        dQF_grads=dQF,
    )
    VL_next = V_L[:, 1:] if EV_L is None else V_L[:, 1:] - EV_L
    VF_next = V_F[:, 1:] if EV_F is None else V_F[:, 1:] - EV_F
    mc_weights = gw if dQF is None else None
    a, u, f = step_weights(
        traj, VL_next, VF_next, mc_weights, beta, problem.gamma_L, problem.gamma_F
    )
    grad = weighted_gradient(problem, theta, traj, a, u, f)
    if guide != "none":
        disc_L = problem.gamma_L ** jnp.arange(traj.horizon, dtype=theta.dtype)
        w = jax.lax.stop_gradient(disc_L * gw / beta)
        vec = jnp.zeros(traj.s.shape[:2] + theta.shape, theta.dtype)[:, :-1]
        if dQF is not None:
            vec = vec + dQF
        if dVF is not None:
            vec = vec - dVF
        grad = grad + jnp.einsum("et,etd->d", w, jax.lax.stop_gradient(vec)) / traj.num_episodes
    return grad
