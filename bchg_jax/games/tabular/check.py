"""Is Theorem 2's estimator unbiased on this game? Its mean over many batches vs the exact gradient.

``check_problem(game, policy_fn, thetas, beta)`` is the Markov-game counterpart of
:func:`bchg_jax.tabular.check.check_problem`. Per theta it solves the follower's best response
under ``backup`` (:func:`~bchg_jax.games.tabular.exact.best_response`), computes the exact
critics under it (Q_L, V_L of :func:`~bchg_jax.games.tabular.exact.leader_values`, the
follower's soft V_F), draws ``batches`` independent batches of ``episodes`` episodes of
``horizon`` steps (:func:`~bchg_jax.games.tabular.rollout.rollout`), estimates Theorem 2
(Eq. (hg_MG)) on each with :func:`~bchg_jax.games.estimators.hypergradient` and compares the
mean with :func:`~bchg_jax.games.tabular.exact.exact_hypergradient` (implicit differentiation
through the soft-Q fixed point of the same ``backup``). The critics are exact, so only the
estimator and the follower's backup are judged. A trainer adds its learned critic's error, and
its default direct baseline (``TrainConfig(direct_baseline="reference")``, the sampled b's
``sum_a' f Q_L``) is biased too; with exact critics and the ``state`` baseline its minibatch
surrogate has this estimate's expectation (``docs/followers.md``, "track_reference").

What it shows, and what to do about it:

* ``backup="paper"`` (Theorem 2's Bellman equation): unbiased, up to the cut below;
* ``backup="reference"`` (the reference implementation's follower and the trainers' default):
  the estimator's influence sums are the paper backup's derivative of Q_F, so it is biased for
  this backup's hypergradient by construction (2.5% of the norm on the toy game at p = 0.45,
  76% on a random 5-state game; ``docs/followers.md``). The check measures that bias on your
  game; train with ``TrainConfig(backup="paper")`` where it matters;
* a cut: episodes end at ``horizon`` while the exact gradient has no time limit, so the
  estimates target the hypergradient truncated there, which the row reports exactly
  (``truncated_target``, :func:`truncated_hypergradient`) with ``truncated_bias_se``, the
  estimates' distance from it in SE, and ``truncated_p_value``, its chance (as ``bias_se`` and
  ``p_value``: below ~1e-3 the estimator misses even its truncated target), and ``cut_bias``,
  how far the cut moves the target: ||truncated_target - the estimator's expectation without
  a cut|| / ||exact||, the bias the cut alone causes (for
  ``backup="paper"`` and ``guide="benefit"`` that expectation is the exact hypergradient, and
  ``cut_bias`` = ||truncated_target - exact|| / ||exact||, as in
  :mod:`bchg_jax.tabular.check`; under the reference backup or for Naive-PGD it leaves their
  own bias out). ``cut_weight`` =
  :func:`~bchg_jax.core.bias_check.discount_weight_beyond` (gamma_L, gamma_F, horizon) is the
  discount weight beyond the cut (~(1 + H (1 - gamma)) gamma^H; derivation in
  :mod:`bchg_jax.tabular.check`): the bias's size when the per-step terms are of even size, more
  where the gradient comes late in the episode. A warning says so when either exceeds
  :data:`CUT_WEIGHT_WARN`. Every episode is cut (the game has no terminal states);
* a sharp leader or follower: theta acts only through the leader's policy, and the estimates
  see its effect on an action only when they sample it, so a mean that depends on an action of
  probability ~1e-5 reads as biased although the estimator is not (a random 3-state game at
  beta 0.3 with its logits scaled 12x: 80 SE, p = 0, with the paper backup). The same holds for
  a follower action the batches never sample at a leader pair they sample often: at a small
  beta its Benefit-weighted influence terms and those of the frequent action cancel in the
  exact value, and the estimates carry only the frequent half (a 2-state game at beta 0.05
  whose follower plays its second action with probability 1.5e-8: 312 SE, p = 0, where the mean
  is within 1 SE of the exact value less that action's part, which is 4 times the exact
  gradient's norm). When the comparison reads as biased and some (s, a, b) was sampled fewer
  than ``RARE_VISITS`` times in all batches, the row also judges the mean against the exact
  hypergradient less what the batches cannot see (``resolved_target``): the expected
  ``grad log f(a|s)`` terms of the visits of the leader pairs sampled that rarely (for an action
  of probability exactly 0, never visited, the limit f -> 0 of that expectation: its share of
  the exact gradient) and of the episodes that visit a rare (s, a, b) (Theorem 2's score form
  uncut, :func:`_truncated` with ``keep`` and ``drop``), with ``rare_share`` (that part's share
  of the norm), ``resolved_bias_se`` and ``resolved_p_value``, and warns "not resolved rather
  than biased" when only the full comparison fails (:mod:`bchg_jax.tabular.check` does the
  same for a CMDP).

The truncated target (Theorem 2, Eq. (hg_MG) with the influence sums of Eq. (nablaQF_MG), cut
at H): :func:`~bchg_jax.games.estimators.hypergradient` weights ``grad log f(a_k|s_k)`` for
k < H by ``gL^k (Q_L - V_L)(s_k, a_k, b_k) + (1/beta) c_k (V_F(s_k, a_k) - sum_a' f V_F(s_k,
a'))`` with ``c_k = sum_{t<=k} gF^(k-t) gL^t Ben_t`` (influence sums stopped at H, critics
infinite-horizon). Its expectation over the episodes of
:func:`~bchg_jax.games.tabular.rollout.rollout` (s_0 ~ ``init_dist``, no reset, no terminal
state) is computed by propagating the joint distribution occ_t of (s_t, a_t, b_t) and the
expected guiding weights ``omega_t = E[c_t; s_t, a_t, b_t] = gL^t occ_t Ben + gF
forward(omega_{t-1})`` for H steps in one ``lax.scan``, summing them into [S, A] cotangents of
log f and pulling those back through ``policy_fn`` with one VJP (the design of
:func:`bchg_jax.tabular.check.truncated_hypergradient`). Measured on a random game (S = 3,
A = 2, B = 2, discounts 0.8, beta 0.3, 16 episodes of 6 steps, ``backup="paper"``;
``tests/games/tabular/test_game_check.py``): ``cut_bias`` 0.27 (``cut_weight`` 0.58); pooled
over 8 x 3000 batches the mean is 27% +- 0.5% off the exact hypergradient (140 SE) and 0.4% +-
0.5% (1.4 SE) from ``truncated_target``; within 1.6 SE of it under the reference backup and
without the baseline, and within 0.5 SE (resolution 0.2%) for Naive-PGD without the baseline.
"""

from __future__ import annotations

import warnings
from typing import Callable, List, Optional, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from bchg_jax.core.bias_check import (
    BIASED_P,
    CUT_WEIGHT_WARN,
    RARE_VISITS,
    check_batches,
    check_theta_list,
    compare,
    describe,
    discount_weight_beyond,
    not_resolved_message,
    reads_biased,
    resolved_clause,
    resolved_entries,
    warn_if_unresolved,
)
from bchg_jax.core.eager import cached_when_eager
from bchg_jax.core.precision import full_precision
from bchg_jax.core.validate import (
    check_beta,
    check_beta_if_concrete,
    check_count,
    warn_float32_logit_rounding,
)
from bchg_jax.games.estimators import check_policy_fn_on_simplex, hypergradient
from bchg_jax.games.tabular.exact import (
    best_response,
    exact_hypergradient,
    leader_values,
)
from bchg_jax.games.tabular.follower import BACKUPS, GameBestResponse
from bchg_jax.games.tabular.game import TabularGame, compute_dtype
from bchg_jax.games.tabular.rollout import rollout

Array = jax.Array
GUIDES = ("benefit", "none")
BASELINES = ("state", "none")


def _flat(tree) -> Array:
    """A pytree's leaves, flattened and concatenated (the order of ``exact``)."""
    return jnp.concatenate([jnp.ravel(v) for v in jax.tree.leaves(tree)])


def _check_options(backup: str, guide: str, baseline: str) -> None:
    """Raises ``ValueError`` for an unknown ``backup``, ``guide`` or ``baseline``."""
    for name, value, allowed in (
        ("backup", backup, BACKUPS),
        ("guide", guide, GUIDES),
        ("baseline", baseline, BASELINES),
    ):
        if value not in allowed:
            raise ValueError(f"{name} must be one of {allowed}, got {value!r}")


@full_precision
def _truncated(
    game: TabularGame,
    policy_fn: Callable,
    theta,
    beta,
    horizon: Optional[int],
    br: GameBestResponse,
    V_L: Array,
    Q_L: Array,
    guide: str = "benefit",
    baseline: str = "state",
    keep: Optional[Array] = None,
    drop: Optional[Array] = None,
):
    """:func:`truncated_hypergradient` given the best response and the leader's exact values;
    ``horizon=None``: the estimator's expectation without a cut (discounted occupancies by
    linear solves instead of the scan over t < H); ``keep`` [S, A] bool: only the terms of the
    visits of those (s, a) (the rest of the expectation of the sampled ``grad log f(a|s)``
    terms is dropped); ``drop`` [S, A, B] bool: the episodes that visit one of those
    (s, a, b) are left out, their terms there and after (module docstring, ``rare_share``)."""
    f_out = jax.lax.stop_gradient(policy_fn(theta))
    # the promoted dtype of the policies and the game (games.tabular.game.compute_dtype)
    dtype = compute_dtype(game, f_out, br.policy, V_L, Q_L, beta)
    f, g_full = jnp.asarray(f_out, dtype), jnp.asarray(br.policy, dtype)
    # the mass of the dropped triples' episodes is left out; the Benefit stays that of the
    # whole response (a sampled step reads it whole)
    g = g_full if drop is None else jnp.where(drop, 0.0, g_full)
    V_L, Q_L = jnp.asarray(V_L, dtype), jnp.asarray(Q_L, dtype)
    P = jnp.asarray(game.transition, dtype)
    rho = jnp.asarray(game.init_dist, dtype)
    gamma_L = jnp.asarray(game.gamma_L, dtype)
    gamma_F = jnp.asarray(game.gamma_F, dtype)
    joint = f[:, :, None] * g  # [S, A, B]: P(a, b | s)
    base = V_L if baseline == "state" else jnp.zeros_like(V_L)
    adv_L = Q_L - base[:, None, None]  # the direct term's weight of grad log f(a|s)
    ben = Q_L - jnp.sum(g_full * Q_L, -1, keepdims=True)  # the Benefit
    benefit = guide == "benefit"

    def push(mass, w=None):
        """sum_{s,a,b} mass(s) f(a|s) g(b|s, a) w(s, a, b) P(s'|s, a, b) [S']: a state mass
        (weighted by ``w``) one step on."""
        m = mass[:, None, None] * joint
        return jnp.einsum("sab,sabt->t", m if w is None else m * w, P)

    def per_f(mass, w):
        """sum_b mass(s) f(a|s) g(b|s, a) w(s, a, b) / f(a|s) [S, A] from a state mass [S]:
        the expected cotangent of log f without dividing by f (finite where f is 0)."""
        return mass[:, None] * jnp.sum(g * w, -1)

    # the expected cotangents of log f (grad log f = grad f / f, as the estimator pulls it back)
    one = jnp.ones_like(Q_L)
    if horizon is None:
        # sum_t gL^t P(s_t = s) = rho (I - gL P_pi)^-1; the guiding weights' sum over k of
        # E[c_k; s_k, a_k, b_k] = N + sum_{j>=1} gF^j (N pushed on j steps), N = occupancy x
        # Benefit
        S = rho.shape[0]
        P_pi = jnp.einsum("sab,sabt->st", joint, P)
        eye = jnp.eye(S, dtype=dtype)
        d = jnp.linalg.solve((eye - gamma_L * P_pi).T, rho)
        c_direct = per_f(d, adv_L)
        tail = jnp.linalg.solve((eye - gamma_F * P_pi).T, push(d, ben))
        c_guide = per_f(d, ben) + per_f(gamma_F * tail, one)
    else:

        def step(carry, t):
            # d = P(s_t = s) (episodes neither end nor reset before the cut); the guiding
            # weight of step t is c_t = sum_{k<=t} gF^(t-k) gL^k Ben_k
            # (games.estimators.game_score_weights), and E[c_t; s_t, a_t, b_t] = (m_t(s) +
            # gL^t d_t(s) Ben) f g, with m_t the state mass of the earlier steps' part; the sums
            # over t < H are the expected cotangents of log f(a|s) of the direct and the
            # guiding term. State masses, not [S, A, B] ones, so nothing is divided by f.
            d, m, c_direct, c_guide = carry
            disc = gamma_L**t
            c_direct = c_direct + disc * per_f(d, adv_L)
            if benefit:
                c_guide = c_guide + per_f(m, one) + disc * per_f(d, ben)
                m = gamma_F * (push(m) + disc * push(d, ben))
            return (push(d), m, c_direct, c_guide), None

        zero = jnp.zeros_like(f)
        (_, _, c_direct, c_guide), _ = jax.lax.scan(
            step, (rho, jnp.zeros_like(rho), zero, zero), jnp.arange(horizon, dtype=dtype)
        )
    ct = c_direct
    if benefit:
        V_F = br.V  # [S, A]; the influence sums' baseline sum_a' f V_F(s, a')
        ct = ct + c_guide * (V_F - jnp.sum(f * V_F, -1, keepdims=True)) / beta
    # the estimator's expectation: 0 where f is 0 (never sampled); the part of the pairs in
    # ``keep`` is what they carry in the exact gradient, at f = 0 too (the limit f -> 0)
    ct = jnp.where(f > 0, ct, 0.0) if keep is None else jnp.where(keep, ct, 0.0)
    _, vjp = jax.vjp(policy_fn, theta)
    return vjp(ct.astype(f_out.dtype))[0]  # the cotangent of policy_fn's output dtype


def _truncated_checks(
    game, policy_fn, theta, beta, horizon, *, backup="reference", guide="benefit", baseline="state"
) -> None:
    """:func:`truncated_hypergradient`'s checks (an eager call's precheck: inside its cached
    program theta is traced)."""
    game.validate()
    check_beta_if_concrete(beta)
    check_count("horizon", horizon)
    _check_options(backup, guide, baseline)
    check_policy_fn_on_simplex(policy_fn, theta, "games.tabular.truncated_hypergradient", game)


def _warn_truncated(_out, game, policy_fn, theta, beta, horizon, *, backup="reference", **_):
    """The plain call's float32 logits warning after a cached call: its best response's (a
    cached call too, which gives it)."""
    f = policy_fn(theta)
    if compute_dtype(game, f, beta) == jnp.float32:
        best_response(game, f, beta, backup)


@cached_when_eager(_truncated_checks, _warn_truncated)
@full_precision
def truncated_hypergradient(
    game: TabularGame,
    policy_fn: Callable,
    theta,
    beta,
    horizon: int,
    *,
    backup: str = "reference",
    guide: str = "benefit",
    baseline: str = "state",
):
    """The exact expectation of Theorem 2's whole-episode estimate (Eq. (hg_MG) with the
    influence sums of Eq. (nablaQF_MG), :func:`~bchg_jax.games.estimators.hypergradient`) over
    episodes of H = ``horizon`` steps from ``init_dist``
    (:func:`~bchg_jax.games.tabular.rollout.rollout`), with the exact critics of
    :func:`check_problem`: Q_L, V_L of :func:`~bchg_jax.games.tabular.exact.leader_values` and
    the follower's best response g, V_F under ``backup``.

    What :func:`check_problem`'s mean estimates: the direct term summed over t < H and the
    guiding weights ``c_k = sum_{t<=k} gF^(k-t) gL^t Ben_t`` of the steps k < H (influence sums
    stopped at H), the critics infinite-horizon. Computed by propagating the joint distribution
    of (s_t, a_t, b_t) and the expected guiding weights E[c_t; s_t, a_t, b_t] for H steps (one
    ``lax.scan``), then one VJP through ``policy_fn`` (module docstring). With
    ``backup="paper"`` and ``guide="benefit"`` it tends to
    :func:`~bchg_jax.games.tabular.exact.exact_hypergradient` as H grows (Theorem 2; tested to
    rounding); the direct term's state baseline does not change it. Pure and jit-able
    (``horizon`` and the options static).

    Args:
      game: the :class:`~bchg_jax.games.tabular.game.TabularGame` (validated here).
      policy_fn: theta -> f [S, A], the leader's policy table (rows on the simplex).
      theta: the leader's parameters (pytree).
      beta: the follower's entropy weight (> 0).
      horizon: H >= 1, the episodes' steps (``check_problem``'s ``horizon``).
      backup: the follower's soft-Q backup, ``"reference"`` or ``"paper"``.
      guide: ``"benefit"`` (BC-HG) or ``"none"`` (Naive-PGD).
      baseline: the direct term's baseline, ``"state"`` (V_L(s)) or ``"none"``.
    Returns:
      a pytree like ``theta``.
    Raises:
      ValueError: an invalid game, a concrete ``beta`` not finite and > 0, ``horizon`` not an
        integer >= 1, an unknown ``backup``, ``guide`` or ``baseline``, or as
        :func:`~bchg_jax.games.tabular.exact.best_response`.
    """
    _truncated_checks(
        game, policy_fn, theta, beta, horizon, backup=backup, guide=guide, baseline=baseline
    )
    f = policy_fn(theta)
    br = best_response(game, f, beta, backup)
    V_L, Q_L = leader_values(game, f, br.policy)
    return _truncated(game, policy_fn, theta, beta, int(horizon), br, V_L, Q_L, guide, baseline)


def check_problem(
    game: TabularGame,
    policy_fn: Callable,
    theta_list: Sequence,
    beta,
    *,
    backup: str = "reference",
    guide: str = "benefit",
    baseline: str = "state",
    episodes: int = 64,
    horizon: Optional[int] = None,
    batches: int = 400,
    key: Optional[Array] = None,
    chunk: int = 100,
    verbose: bool = True,
) -> List[dict]:
    """Mean of ``batches`` whole-episode estimates vs the exact hypergradient, per theta.

    Args:
      game: the :class:`~bchg_jax.games.tabular.game.TabularGame` (validated here).
      policy_fn: theta -> f [S, A], the leader's policy table (rows on the simplex).
      theta_list: the leader parameters to check (pytrees; ``policy_fn`` takes each).
      beta: the follower's entropy weight (> 0).
      backup: the follower's soft-Q backup, ``"reference"`` (the trainers' default) or
        ``"paper"`` (module docstring).
      guide: ``"benefit"`` (BC-HG) or ``"none"`` (Naive-PGD: the direct term only, biased by
        the whole follower-response part).
      baseline: the direct term's baseline: ``"state"`` (exact V_L(s), unbiased) or ``"none"``.
      episodes: episodes per batch (>= 1).
      horizon: steps per episode; None: ``game.time_limit`` (then required).
      batches: independent batches per theta (>= 2).
      key: PRNG key (default ``jax.random.key(0)``); theta i uses ``fold_in(key, i)``.
      chunk: batches estimated at once (memory); all batches run as one compiled program.
      verbose: print one line per theta.
    Returns:
      one dict per theta: ``exact``, ``mean``, ``se``, ``z`` (flattened like theta) and
      ``bias_se``, ``p_value``, ``rel_error``, ``rel_se``, ``cosine``, ``exact_mismatches``
      (:func:`~bchg_jax.core.bias_check.compare`); ``truncated_target`` [D] (flattened like
      ``exact``: :func:`truncated_hypergradient` at ``horizon``, the exact expectation of the
      estimates), ``truncated_bias_se`` and ``truncated_p_value`` (max |mean -
      truncated_target| / SE and its chance, as ``bias_se`` and ``p_value``: below ~1e-3 the
      estimates miss their own target), ``cut_bias`` (||truncated_target - the
      estimator's expectation without a cut|| / ||exact||: the bias the cut alone causes; for
      ``backup="paper"`` and ``guide="benefit"``, ||truncated_target - exact|| / ||exact||) and
      ``cut_weight`` (module docstring; a warning when either exceeds
      :data:`CUT_WEIGHT_WARN`); ``rare_share``, ``rare_component_share``, ``resolved_target``,
      ``resolved_bias_se``, ``resolved_p_value`` (module docstring, "a sharp leader"; NaN
      unless the comparison reads as biased).
    Raises:
      ValueError: an invalid game, ``beta``, ``backup``, ``guide`` or ``baseline``, no
        ``horizon`` (and no ``game.time_limit``), ``episodes`` < 1, ``batches`` < 2, an empty
        ``theta_list``, or a
        ``policy_fn(theta)`` whose rows are not distributions.
    """
    game.validate()
    check_beta(beta)
    _check_options(backup, guide, baseline)
    horizon = game.time_limit if horizon is None else horizon
    if horizon is None:
        raise ValueError(f"{game.name}: pass a horizon (the game has no time_limit)")
    check_count("horizon", horizon)
    check_count("episodes", episodes)
    batches = check_batches(batches)
    theta_list = check_theta_list("games.tabular.check_problem", theta_list)
    key = jax.random.key(0) if key is None else key
    horizon, episodes = int(horizon), int(episodes)

    @jax.jit
    def exact_and_estimates(theta, keys):
        """(exact hypergradient, estimates [batches, ...], the estimates' expectation cut at
        the horizon and without a cut): one program for every theta."""
        f = policy_fn(theta)
        br = best_response(game, f, beta, backup)
        V_L, Q_L = leader_values(game, f, br.policy)
        base = V_L if baseline == "state" else None

        def one(k):
            ep = rollout(k, game, f, br.policy, episodes, horizon)
            estimate = hypergradient(
                policy_fn,
                theta,
                ep,
                br.policy,
                Q_L,
                br.V,
                beta,
                game.gamma_L,
                game.gamma_F,
                guide,
                V_L=base,
            )
            # the visits of each (s, a, b): the leader pairs through which theta acts, and the
            # follower actions whose guiding terms the estimates carry
            return estimate, jnp.zeros(br.policy.shape, jnp.int32).at[ep.s, ep.a, ep.b].add(1)

        est, visits = jax.lax.map(one, keys, batch_size=min(int(chunk), batches))
        targets = [
            _truncated(game, policy_fn, theta, beta, h, br, V_L, Q_L, guide, baseline)
            for h in (horizon, None)
        ]
        g = exact_hypergradient(policy_fn, theta, game, beta, backup)
        return g, est, *targets, jnp.max(jnp.abs(br.Q)), jnp.sum(visits, 0)

    for i, theta in enumerate(theta_list):  # its shape, its rows, and that they stay rows
        check_policy_fn_on_simplex(
            policy_fn, theta, f"games.tabular.check_problem, theta {i}", game
        )
    # the discount weight beyond the cut: every episode is cut at the horizon (no terminal states)
    cut_weight = discount_weight_beyond(game.gamma_L, game.gamma_F, horizon)
    out = []
    for i, theta in enumerate(theta_list):
        g, est, target, uncut, q_max, visits = exact_and_estimates(
            theta, jax.random.split(jax.random.fold_in(key, i), batches)
        )
        # float32 rounding of the follower's logits (the references carry it too)
        warn_float32_logit_rounding(f"games.tabular.check_problem, theta {i}", q_max, beta)
        est = jax.vmap(_flat)(est)
        row = compare(_flat(g), est)
        warn_if_unresolved(f"games.tabular.check_problem, theta {i}", row, batches)
        target, uncut = (np.asarray(_flat(x), np.float64) for x in (target, uncut))
        norm_g = max(float(np.linalg.norm(row["exact"])), np.finfo(np.float64).tiny)
        # relative to an exact gradient of 0 it is undefined (NaN): the warning uses cut_weight
        cut_bias = np.nan if row["zero_exact"] else float(np.linalg.norm(target - uncut) / norm_g)
        to_target = compare(target, est)
        row.update(_resolved(game, policy_fn, theta, beta, backup, baseline, row, est, visits))
        row.update(
            truncated_target=target,
            truncated_bias_se=to_target["bias_se"],
            truncated_p_value=to_target["p_value"],
            cut_bias=cut_bias,
            cut_weight=cut_weight,
        )
        out.append(row)
        if row["resolved_p_value"] >= BIASED_P:  # NaN (not computed) compares False
            warnings.warn(
                f"{game.name}, "
                + not_resolved_message(
                    i,
                    row,
                    "leader state-action pairs or follower actions",
                    batches,
                    "Sample more (batches, episodes), or check where the leader's policy is "
                    "less sharp",
                ),
                stacklevel=2,
            )
        if max(cut_weight, np.nan_to_num(cut_bias)) > CUT_WEIGHT_WARN:
            warnings.warn(
                f"{game.name}, theta {i}: every episode is cut at step {horizon}, while the "
                "exact hypergradient has no time limit: the estimates target the hypergradient "
                "truncated there (truncated_target, computed exactly; their mean is "
                f"{row['truncated_bias_se']:.1f} SE from it). The cut moves that target by "
                f"{cut_bias:.2g} of the exact hypergradient's norm (cut_bias; with "
                "backup='paper' and guide='benefit', its gap to the exact hypergradient); the "
                f"discount weight beyond the cut is {cut_weight:.2g} (cut_weight); pass a longer "
                "horizon",
                stacklevel=2,
            )
        if verbose:
            rare_clause = resolved_clause(row, "leader pairs or follower actions")
            print(
                f"theta {i}: {describe(row)}; vs the truncated target: bias "
                f"{row['truncated_bias_se']:.1f} SE (p = {row['truncated_p_value']:.2g}), "
                f"cut_bias {cut_bias:.2g}{rare_clause}  [{guide}, "
                f"backup={backup}, baseline={baseline}, {episodes} x {horizon}, {batches} batches]"
            )
    return out


def _resolved(game, policy_fn, theta, beta, backup, baseline, row: dict, est, visits) -> dict:
    """The ``rare_share`` / ``resolved_*`` entries of a check's row (module docstring): when
    ``row`` reads as biased and some (s, a, b) was sampled fewer than ``RARE_VISITS`` times,
    the exact hypergradient less what the batches cannot see: the expected terms of the visits
    of the leader pairs (s, a) sampled that rarely, and of the episodes that visit a rare
    (s, a, b) (Theorem 2's score form with the Benefit guide and the check's ``baseline``,
    uncut, under ``backup``'s best response), else NaN (``rare_share`` 0 when none is that
    rare)."""
    if not reads_biased(row):
        return resolved_entries(row)
    rare_triple = np.asarray(visits) < RARE_VISITS
    rare_pair = np.asarray(visits).sum(-1) < RARE_VISITS
    if not rare_triple.any():
        return {**resolved_entries(row), "rare_share": 0.0}
    f = policy_fn(theta)
    br = best_response(game, f, beta, backup)
    V_L, Q_L = leader_values(game, f, br.policy)
    args = (game, policy_fn, theta, beta, None, br, V_L, Q_L, "benefit", baseline)
    # every pair kept: a leader action of probability 0 counts with its limit share
    whole = _truncated(*args, jnp.ones(rare_pair.shape, bool))
    seen = _truncated(*args, jnp.asarray(~rare_pair), jnp.asarray(rare_triple))
    part = jax.tree.map(lambda a, b: a - b, whole, seen)
    return resolved_entries(row, row["exact"] - np.asarray(_flat(part), np.float64), est)
