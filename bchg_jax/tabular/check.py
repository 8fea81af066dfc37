"""Is an estimator unbiased on this problem? Its mean over many batches vs the exact hypergradient.

``check_problem(problem, thetas, beta)`` samples ``batches`` independent batches per theta exactly
as a training run of ``method`` would (``make_train(problem, method, config).steps``: the same
sampler with its support check, time limit, oracle rollouts and estimator options), estimates
the hypergradient of Theorem 1 (Eq. (hg_configurable)) on each with exact leader critics
(default) so that only the estimator is judged, and compares the mean with
:func:`~bchg_jax.tabular.exact.exact_hypergradient` (implicit differentiation through the
follower's fixed point). Per theta it reports

* ``bias_se``: max over components of |mean - exact| / SE (SE: the standard error of the mean
  over batches), and ``p_value``, the chance of so large a ``bias_se`` for an unbiased
  estimator (Student's t over the batches, Sidak-corrected over the components,
  :func:`~bchg_jax.core.bias_check.compare`): below ~1e-3 the estimator is biased at this
  resolution (with many batches, ``bias_se`` above ~4; with few, larger values are chance);
* ``rel_error``: ||mean - exact|| / ||exact||, and ``rel_se`` = ||SE|| / ||exact||, the
  resolution of that number (a relative error well above ``rel_se`` is bias, not noise);
* ``cosine``: cos(mean, exact) (these three are NaN, and ``zero_exact`` True, when the exact
  gradient is 0 to rounding: there is nothing to be relative to, and ``z`` judges alone);
* ``truncated``: the fraction of the sampled streams whose first episode was cut (by the time
  limit or the end of the batch) before a terminal state; ``truncated_target`` and ``cut_bias``:
  what the first-episode forms estimate when the episodes are cut at H = min(``time_limit``,
  ``num_steps``) (:func:`truncated_hypergradient`) and its relative error ||truncated_target -
  visible_target|| / ||exact||, the bias that the cut alone causes (below); ``cut_weight`` =
  ``truncated`` x :func:`~bchg_jax.core.bias_check.discount_weight_beyond` (gamma_L, gamma_F,
  H): the discount weight beyond the cut;
* ``unseen_share`` and ``visible_target``: the share of the exact hypergradient's norm that
  comes through transition or initial probabilities that are 0 at theta but move with it (a
  kink of the model), which no sampled estimate can see, and the exact hypergradient without it
  (:mod:`bchg_jax.tabular.unseen`), what the estimates target; ``cut_bias`` is measured against
  ``visible_target`` (the cut's share alone), and a warning names an ``unseen_share`` above
  ``CUT_WEIGHT_WARN``;
* ``support_lost``: with the sparse solvers, the sampler's table put mass outside its successor
  table at theta, so the batches were drawn from the whole table (as a training run does);
* ``rare_share``, ``resolved_target``, ``resolved_bias_se``, ``resolved_p_value`` (computed when
  the comparison reads as biased, NaN otherwise): an unbiased estimator whose mean depends on a
  state-action pair the batches almost never sample reads as biased, since its estimates carry
  the terms of that pair (theta's effect on ``r_F``, ``r_L``, ``p`` there, and the guiding
  segments that start there) only when they visit it: a heavy tail the standard error cannot
  show (the README's problem at beta 0.08, where the incentivised action has probability 4e-6:
  1743 SE, p = 0, for BC-HG's estimator). The pairs (and start states) sampled fewer than
  ``RARE_VISITS`` times in all batches carry a part of the expectation: that of the first
  episodes that visit one of them (or start in one), their terms at and after that visit,
  computed as :func:`truncated_hypergradient` (BC-HG's first-episode form: for another
  estimator, an approximation of what it cannot see) with that mass dropped; ``resolved_target`` is
  the exact hypergradient less that part, ``rare_share`` the part's share of the exact
  gradient's norm, and ``resolved_bias_se`` /
  ``resolved_p_value`` judge the mean against the rest. Biased against the exact value but not
  against the rest: the check could not resolve the rare pairs (a warning says so; sample
  more, or at a larger beta), which is not evidence of bias. The guiding segments matter even
  where theta never acts at the rare pair: at a small beta the follower's response at a state
  splits into a frequent action's Benefit x dQF and a rare one's of about the same size and
  opposite sign (a 3-state problem at beta 0.05 where theta pays the follower's action 0 and
  action 1 has probability 1.2e-5 at state 1: the segments starting at (1, 0) carry +1.0e-4,
  those at (1, 1) -7.1e-5, the exact hypergradient is 2.8e-5; the estimates' mean 1.006e-4 is
  39 SE from it, 0.5 SE from the rest; stopping theta's effect on the tables there, as this
  check did before, left the exact value whole and read as biased);
* ``model_gap``: max |sample_transition(theta) - transition(theta)|. A problem with its own
  sampler (Four-Rooms' ``reference`` slip model: 2/3 sampled, 0.56 in the model) is sampled
  from another MDP than the one the follower's best response and the exact hypergradient are
  of, and the estimates target neither exactly: a warning says so when the gap exceeds
  ``MODEL_GAP_WARN`` (Four-Rooms, beta 0.01, BC-HG's unbiased form, 300 batches of 10 x 1000
  steps: relative error 5.7% at 6.0% resolution with the ``paper`` model, 41% at 8.0% with
  the ``reference`` one).

Only the unbiased forms (``TrainConfig(grouping="first_episode", partial="first_episode")``,
:mod:`bchg_jax.tabular.estimators`) should pass at every resolution, and only when the first
episode ends at a terminal state; the ratio forms are biased by the episodes the batch cuts off,
by O(1 / episodes per stream), and the every-visit reference convention by the segments the cut
shortens, which it reuses for every visit: where every episode is cut (a time limit, no terminal
state) that does not shrink with more episodes per stream
(:func:`~bchg_jax.core.bias_check.every_visit_share`, about 1 / ((1 - gamma) H) of the terms
it averages). A cut episode is truncated at H
while :func:`~bchg_jax.tabular.exact.exact_hypergradient` has no time limit, a bias that no
estimator form removes. Its size follows from Theorem 1: the hypergradient is
``sum_t gamma_L^t E[a_t] + (1/beta) sum_k gamma_L^k E[B_L(s_k, b_k) dQF(s_k, b_k)]`` with
``dQF(s_k, b_k) = sum_j gamma_F^j E[x_{k+j} | s_k, b_k]`` (Eq. (nablaQF)). Cut at H, the partial
term keeps t < H and the guiding term keeps the pairs with k + j < H: the segment started at k
loses ``gamma_F^(H-k) E[dQF(s_H, b_H) | s_k, b_k]``, so the bias is

    sum_{t>=H} gamma_L^t E[a_t] + (1/beta) sum_{k>=H} gamma_L^k E[B_L dQF]
    + (1/beta) sum_{k<H} gamma_L^k gamma_F^(H-k) E[B_L(s_k, b_k) dQF(s_H, b_H)].

The last sum, ~H max(gamma_L, gamma_F)^H when the discounts are close, is what
max(gamma_L, gamma_F)^H (the figure before) left out. With per-step terms of even size the
share of the gradient beyond the cut is the discount weight of the dropped (k, j):
P(K + J >= H) for independent geometric K, J (P(K >= n) = gamma_L^n, P(J >= n) = gamma_F^n),
``gamma_L^H + (1 - gamma_L) sum_{k<H} gamma_L^k gamma_F^(H-k)`` (= (1 + H (1 - gamma)) gamma^H
for equal discounts; :func:`~bchg_jax.core.bias_check.discount_weight_beyond`); a problem
whose leader reward comes late in the episode loses more than that. The exact bias is cheap
here: the expected first-episode estimate of a batch cut at H, with exact critics, is the sum
above truncated at H, computed by propagating the occupancy of the first episode and the forward
sums of the estimator for H steps (:func:`truncated_hypergradient`); ``cut_bias`` is its
relative gap to the exact hypergradient. Measured (relative error of the first-episode forms'
mean +- its resolution ``rel_se``, exact critics) against ``cut_bias``, ``cut_weight`` and the
old figure max(gamma_L, gamma_F)^H; every mean is within 2 SE of ``truncated_target``:

* ``random_tabular_cmdp`` (gamma_L 0.9 > gamma_F 0.85, no terminal state), ``time_limit =
  num_steps = 10``, 800 batches of 16: 33.6% +- 2.7% (15.9 SE) vs 33.2%, 0.61 (0.35); at 40:
  1.8% +- 3.1% (0.9 SE) vs 1.4%, 0.037 (0.015);
* a follower more patient than the leader, gamma_F 0.99 and gamma_L 0.5 at H = 40: 67.6% +- 0.5%
  (125 SE over 400 batches) vs 67.6%, 0.676 (0.669);
* a 7-state ring whose leader reward lies 5 forward steps from the start (or one lucky jump;
  gamma_L 0.95, gamma_F 0.9, beta 0.1; 1200 batches of 16): H = 30: 33.8% +- 1.1% vs 32.8%,
  0.37 (0.21); H = 40: 20.4% +- 1.2% vs 20.0%, 0.23 (0.13); H = 60: 7.5% +- 1.3% vs 7.2%, 0.086
  (0.046). The every-visit reference convention there: 37%, 25%, 12%, 4-5 SE off
  ``truncated_target`` (its segments started late in the episode are cut short too: its own
  bias on top of the cut's).

A warning says so when some sampled first episode was cut and the cut's size exceeds
``CUT_WEIGHT_WARN``: ``cut_bias`` for BC-HG's first-episode forms with exact critics (it is
exactly their cut's bias;
the discount weight only bounds it: 0.12 at gamma_L = 0, gamma_F = 0.9, H = 20, where
``cut_bias`` is 8e-12), the larger of ``cut_weight`` and ``cut_bias`` for the other forms. The
printed line then also compares the mean with ``truncated_target`` (``vs the truncated target:
bias ... SE``): an estimate that matches it is unbiased up to the cut, even where the line
reads an exact mismatch against the exact hypergradient.
"""

from __future__ import annotations

import warnings
from typing import List, Optional, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from bchg_jax.core.bias_check import (
    BIASED_P,
    CUT_WEIGHT_WARN,
    RARE_VISITS,
    check_batches,
    check_best_response_config,
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
from bchg_jax.core.validate import FLOAT32_LOGIT_WARN, warn_float32_logit_rounding
from bchg_jax.tabular import critics
from bchg_jax.tabular.cmdp import TabularCMDP
from bchg_jax.tabular.estimators import Cotangents, apply_cotangents, first_episode_mask
from bchg_jax.tabular.exact import (
    best_response,
    check_inputs,
    exact_hypergradient,
    leader_values,
)
from bchg_jax.tabular.follower import BestResponse, continuation
from bchg_jax.tabular.train import METHOD_SPECS, TrainConfig, make_train
from bchg_jax.tabular.unseen import score_visible

Array = jax.Array
CRITICS = ("exact", "monte_carlo")
# warn when the sampler's table differs from the model's by more than rounding (module docstring)
MODEL_GAP_WARN = 1e-6


@full_precision
def _truncated(
    problem, theta, beta, horizon: int, br: BestResponse, V_L, Q_L, keep=None, keep_start=None
) -> Array:
    """:func:`truncated_hypergradient` given the best response and the leader's exact values;
    ``keep`` [S, B] / ``keep_start`` [S] bool: without the first episodes that start in another
    state, and without the terms of the others at and after their first visit to another pair
    (module docstring, ``rare_share``)."""
    g = br.policy
    P = problem.transition(theta)
    rho = problem.init_dist(theta)
    dtype = Q_L.dtype
    S, B = g.shape
    cont = continuation(problem.terminal, S, dtype)
    gamma_L = jnp.asarray(problem.gamma_L, dtype)
    gamma_F = jnp.asarray(problem.gamma_F, dtype)
    benefit = (Q_L - V_L[:, None]) / beta
    moves = cont[:, None, None] * P  # [S, B, S]: no transition out of a terminal state
    kept = jnp.ones((S, B), dtype) if keep is None else jnp.asarray(keep, dtype)
    kept_start = jnp.ones((S,), dtype) if keep_start is None else jnp.asarray(keep_start, dtype)

    def forward(m):
        """Mass on (s_t, b_t) [S, B] -> on (s_{t+1}, b_{t+1}) within the episode."""
        return jnp.einsum("sb,sbt->t", m, moves)[:, None] * g

    def step(carry, t):
        # occ = P(s_t, b_t, first episode still running); omega = E[Omega_t; s_t, b_t], the
        # forward discounted sum of the guiding term's weights (estimators module docstring);
        # the sums are the expected cotangents of r_L (partial term) and r_F (guiding term)
        # (``kept``: the mass of the episodes that visit no other pair, and their terms)
        occ, omega_prev, c_rL, c_rF = carry
        occ = occ * kept
        omega = (omega_prev + gamma_L**t * occ * benefit) * kept
        return (forward(occ), gamma_F * forward(omega), c_rL + gamma_L**t * occ, c_rF + omega), None

    occ0 = (rho * kept_start)[:, None] * g
    zero = jnp.zeros_like(occ0)
    (_, _, c_rL, c_rF), _ = jax.lax.scan(
        step, (occ0, zero, zero, zero), jnp.arange(horizon, dtype=dtype)
    )
    c_logp = (gamma_L * c_rL[..., None] * V_L + gamma_F * c_rF[..., None] * br.V) * moves
    cot = Cotangents(c_rF, c_rL, c_logp, rho * kept_start * V_L, jnp.zeros_like(rho))
    return apply_cotangents(problem, theta, cot)


def _truncated_checks(problem: TabularCMDP, theta: Array, beta, horizon: int) -> None:
    """:func:`truncated_hypergradient`'s checks (an eager call's precheck: inside its cached
    program theta is traced)."""
    if int(horizon) < 1:
        raise ValueError(f"horizon must be >= 1, got {horizon}")
    check_inputs(problem, theta, beta)


def _warn_truncated(_out, problem: TabularCMDP, theta: Array, beta, horizon: int) -> None:
    """The plain call's float32 logits warning after a cached call: its best response's (a
    cached call too, which gives it)."""
    if jnp.asarray(problem.follower_reward(theta)).dtype == jnp.float32:
        best_response(problem, theta, beta)


@cached_when_eager(_truncated_checks, _warn_truncated)
@full_precision
def truncated_hypergradient(problem: TabularCMDP, theta: Array, beta, horizon: int) -> Array:
    """Theorem 1's hypergradient with every episode cut at ``horizon``: the mean of the
    first-episode forms (``grouping = partial = "first_episode"``, exact critics) on batches
    whose first episodes are cut at step H = ``horizon`` (module docstring).

    The expectation of the estimator of :func:`~bchg_jax.tabular.estimators.hypergradient`
    (BC-HG's Benefit guide) over a stream's first episode: the partial term summed over
    t < H and the guiding term's segments of Eq. (nablaQF) stopped at H, with the exact Q_L, V_L
    and the follower's best response. Computed by propagating the first episode's occupancy
    (terminal states end it) and the expected forward sums of the estimator for H steps, then
    one VJP; as H grows it tends to
    :func:`~bchg_jax.tabular.exact.exact_hypergradient` (tested to rounding), except at a theta
    where a transition or initial probability that is 0 moves with theta (a kink of the model:
    :mod:`bchg_jax.tabular.unseen`): it tends to the exact hypergradient of
    :func:`~bchg_jax.tabular.unseen.score_visible` there, which is what every sampled estimate
    targets.

    Args:
      problem: the :class:`TabularCMDP` (its model ``transition``, not a ``sample_transition``).
      theta: leader parameters, shaped like ``problem.theta0``.
      beta: the follower's entropy weight (> 0).
      horizon: the cut H >= 1: steps 0..H-1 of the first episode (and the transition out of the
        last) are kept, as the sampler's ``time_limit`` or the batch's ``num_steps`` keep them.
    Returns:
      the truncated hypergradient, shaped like ``theta`` (includes grad Phi_L).
    Raises:
      ValueError: ``horizon`` < 1, or as :func:`~bchg_jax.tabular.exact.best_response`.
    """
    _truncated_checks(problem, theta, beta, horizon)
    br = best_response(problem, theta, beta)
    V_L, Q_L = leader_values(problem, theta, br.policy)
    return _truncated(problem, theta, beta, int(horizon), br, V_L, Q_L)


def check_problem(
    problem: TabularCMDP,
    theta_list: Sequence[Array],
    beta,
    config=None,
    batches: int = 400,
    method: str = "bchg",
    critic: str = "exact",
    key: Optional[Array] = None,
    chunk: int = 100,
    verbose: bool = True,
) -> List[dict]:
    """Mean of ``batches`` hypergradient estimates vs the exact hypergradient, per theta.

    Args:
      problem: the :class:`TabularCMDP`.
      theta_list: the thetas to check, each shaped like ``problem.theta0``.
      beta: the follower's entropy weight (> 0).
      config: a :class:`~bchg_jax.tabular.train.TrainConfig` (batch size ``num_envs`` x
        ``num_steps``, ``grouping``, ``partial``, oracle sizes; its follower must be the best
        response: the batches are drawn under it); None: ``TrainConfig()``.
      batches: number of independent batches per theta (>= 2).
      method: any estimating method of ``METHOD_SPECS`` (not ``"exact"``); default BC-HG.
      critic: ``"exact"`` (exact Q_L, V_L under the best response: judges the estimator alone)
        or ``"monte_carlo"`` (the batch's, or the oracle segments', every-visit Monte Carlo
        returns, Algorithm 9, as HPGD (MC) and SoBiRL train).
      key: PRNG key (default ``jax.random.key(0)``); each theta gets ``fold_in(key, i)``.
      chunk: batches estimated at once (memory); all batches run as one compiled program.
      verbose: print one line per theta.
    Returns:
      one dict per theta: ``exact`` [D] and ``mean``, ``se``, ``z`` (all flattened like theta),
      ``bias_se`` (max |z|), ``p_value``, ``rel_error``, ``rel_se``, ``cosine``, ``truncated``,
      ``truncated_target`` [D] (:func:`truncated_hypergradient` at the cut),
      ``truncated_bias_se`` and ``truncated_p_value`` (max |mean - truncated_target| / SE and
      its chance, as ``bias_se`` and ``p_value``), ``cut_bias`` and
      ``cut_weight`` (module docstring; a warning when an episode was cut and the cut's size
      exceeds ``CUT_WEIGHT_WARN``: ``cut_bias`` for BC-HG's first-episode forms with exact
      critics, whose target ``truncated_target`` is, else the larger of the two),
      ``rare_share``, ``resolved_target`` [D], ``resolved_bias_se`` and ``resolved_p_value``
      (the mean against the part of the exact hypergradient that the batches sample often
      enough; computed when ``p_value`` < ``BIASED_P`` or a component is an exact mismatch,
      else NaN; a warning when the comparison reads as biased and the resolved one does not:
      module docstring),
      ``visible_target`` [D] and ``unseen_share`` (zero probabilities that move with theta:
      module docstring; a warning above ``CUT_WEIGHT_WARN``),
      ``support_lost`` (the batches came from the whole table: module docstring),
      ``model_gap`` (the sampler's table against the model's; a warning above
      ``MODEL_GAP_WARN``).
    Raises:
      ValueError: a ``config.follower`` off the best response,
        ``method="exact"`` or unknown, an unknown ``critic``, ``batches`` < 2, one theta
        given alone or none (not a list of thetas), or an invalid problem / config (as
        :func:`~bchg_jax.tabular.train.make_train`).
    """
    config = TrainConfig() if config is None else config
    check_best_response_config(config)
    if method == "exact" or method not in METHOD_SPECS:
        raise ValueError(
            f"method must be an estimating method of {tuple(METHOD_SPECS)} "
            f"(not 'exact'), got {method!r}"
        )
    if critic not in CRITICS:
        raise ValueError(f"critic must be one of {CRITICS}, got {critic!r}")
    batches = check_batches(batches)
    theta_list = check_theta_list("tabular.check_problem", theta_list, np.shape(problem.theta0))
    with warnings.catch_warnings():  # the cut is measured and reported below, per theta
        warnings.filterwarnings("ignore", message=".*no terminal state, so every episode")
        steps = make_train(problem, method, config).steps
    key = jax.random.key(0) if key is None else key
    dtype = jnp.asarray(problem.theta0).dtype

    horizon = config.num_steps if problem.time_limit is None else problem.time_limit
    horizon = min(int(horizon), int(config.num_steps))

    visible_problem = score_visible(problem)

    @jax.jit
    def exact_and_estimates(theta, keys):
        """(exact hypergradient [D], estimates [batches, D], fraction of first episodes cut
        [batches]): one program for every theta."""
        br = best_response(problem, theta, beta)
        V_L, Q_L = leader_values(problem, theta, br.policy)
        # the trainer's sampler: from the whole table where the successor table lost mass
        _, sampler_lost = steps["support_lost"](theta)

        def one(k):
            batch, segments = steps["checked_collect"](k, theta, br.policy, sampler_lost)
            q, v = Q_L, V_L
            if critic == "monte_carlo":
                q, v = critics.monte_carlo_critic(
                    batch if segments is None else segments,
                    problem.leader_reward(theta),
                    problem.gamma_L,
                )
            ended = jnp.any(first_episode_mask(batch) & batch.terminal, axis=-1)  # [E]
            # visits of each (s, b) and episode starts in each state, oracle segments included
            visits = jnp.zeros(br.policy.shape, jnp.int32)
            starts = jnp.zeros(br.policy.shape[:1], jnp.int32)
            for sampled in (batch, segments):
                if sampled is not None:
                    visits = visits.at[sampled.s, sampled.b].add(1)
                    starts = starts.at[sampled.s].add((sampled.t == 0).astype(jnp.int32))
            return (
                jnp.ravel(steps["estimate"](theta, beta, batch, segments, br, q, v)),
                1.0 - jnp.mean(ended.astype(dtype)),
                visits,
                starts,
            )

        est, cut, visits, starts = jax.lax.map(one, keys, batch_size=min(int(chunk), batches))
        # how far the sampled MDP is from the one the exact reference solves (module docstring)
        gap = jnp.max(jnp.abs(problem.sampler_transition(theta) - problem.transition(theta)))
        # what the first-episode forms estimate when the episodes are cut at the horizon
        target = _truncated(problem, theta, beta, horizon, br, V_L, Q_L)
        return (
            jnp.ravel(exact_hypergradient(problem, theta, beta)),
            # what every sampled estimate targets (no cut): without zero probabilities' moves
            jnp.ravel(exact_hypergradient(visible_problem, theta, beta)),
            est,
            cut,
            sampler_lost,
            gap,
            jnp.ravel(target),
            jnp.max(jnp.abs(br.Q)),
            jnp.sum(visits, 0),
            jnp.sum(starts, 0),
        )

    # the discount weight beyond the cut, per cut episode (module docstring)
    weight = discount_weight_beyond(problem.gamma_L, problem.gamma_F, horizon)
    out = []
    for i, theta in enumerate(theta_list):
        theta = jnp.asarray(theta, dtype)
        g, visible, est, cut, lost, gap, target, q_max, visits, starts = exact_and_estimates(
            theta, jax.random.split(jax.random.fold_in(key, i), batches)
        )
        # float32 rounding of the follower's logits: the exact references and the truncated
        # target carry it too, so a large one is named before any bias is read
        rounding = warn_float32_logit_rounding(f"tabular.check_problem, theta {i}", q_max, beta)
        truncated = float(np.mean(np.asarray(cut, np.float64)))
        cut_weight = truncated * weight
        row = compare(g, est)
        warn_if_unresolved(f"tabular.check_problem, theta {i}", row, batches)
        target = np.asarray(target, np.float64)
        norm_g = max(float(np.linalg.norm(row["exact"])), np.finfo(np.float64).tiny)
        # relative to an exact gradient of 0 it is undefined (NaN): the warning uses cut_weight;
        # the cut's alone: against the part of the exact gradient that samples can see
        visible = np.asarray(visible, np.float64)
        cut_bias, unseen_share = (
            (np.nan, np.nan)
            if row["zero_exact"]
            else (
                float(np.linalg.norm(target - visible) / norm_g),
                float(np.linalg.norm(row["exact"] - visible) / norm_g),
            )
        )
        to_target = compare(target, est)
        row.update(_resolved(problem, theta, beta, horizon, row, target, est, visits, starts))
        row.update(
            truncated=truncated,
            truncated_target=target,
            truncated_bias_se=to_target["bias_se"],
            truncated_p_value=to_target["p_value"],
            cut_bias=cut_bias,
            cut_weight=cut_weight,
            visible_target=visible,
            unseen_share=unseen_share,
            support_lost=bool(lost),
            model_gap=float(gap),
        )
        out.append(row)
        if row["resolved_p_value"] >= BIASED_P:  # NaN (not computed) compares False
            warnings.warn(
                not_resolved_message(
                    i,
                    row,
                    "state-action pairs or start states",
                    batches,
                    "Sample more (batches, num_envs x num_steps), or check at a larger beta",
                ),
                stacklevel=2,
            )
        if unseen_share > CUT_WEIGHT_WARN:  # NaN compares False
            warnings.warn(
                f"theta {i}: {unseen_share:.2g} of the exact hypergradient's norm comes through "
                "transition or initial probabilities that are 0 at this theta but move with it "
                "(a kink of the model, e.g. a clip at its bound, where the derivative is "
                "one-sided or JAX's mean of the sides): no sampled estimate can see it, since "
                "the sampler never draws those entries (unseen_share; visible_target is what "
                "the estimates target; bchg_jax.tabular.unseen). The bias reported includes it; "
                "it is not the cut's. Check at a theta off the kink, or make the model smooth "
                "there",
                stacklevel=2,
            )
        if row["model_gap"] > MODEL_GAP_WARN:
            warnings.warn(
                f"theta {i}: the sampler's table (problem.sample_transition) differs from "
                f"transition(theta) by up to {row['model_gap']:.3g}: the batches come from "
                "another MDP than the one the exact hypergradient is of, so the bias reported "
                "here is that model mismatch's as well as the estimator's",
                stacklevel=2,
            )
        # the first-episode forms estimate truncated_target, so cut_bias is their cut's bias,
        # computed exactly; the discount weight is only a bound (0.12 where gamma_L = 0 gave
        # cut_bias 8e-12). Other forms add their own bias: the bound is kept for them.
        exact_cut = (
            method == "bchg"
            and critic == "exact"
            and config.grouping == "first_episode"
            and config.partial == "first_episode"
        )
        cut_size = max(cut_weight, cut_bias) if not exact_cut else cut_bias
        cut_size = cut_weight if np.isnan(cut_bias) else cut_size
        if truncated > 0 and cut_size > CUT_WEIGHT_WARN:
            warnings.warn(
                f"theta {i}: {100 * truncated:.0f}% of the sampled first episodes were cut "
                f"at step {horizon} (time limit or batch end) before a terminal state: the "
                "estimates target the hypergradient truncated there, while the exact "
                "reference has no time limit. Truncated there, the first-episode forms' "
                f"target (exact critics) is off the exact hypergradient by {cut_bias:.2g} of "
                f"its norm (cut_bias, computed exactly"
                + (
                    f", up to the float32 rounding of the logits, {rounding:.2g}, warned about "
                    "above: with float64 cut_bias may be far smaller"
                    if rounding > FLOAT32_LOGIT_WARN
                    else ""
                )
                + f"); the discount weight beyond the cut is {cut_weight:.2g} (cut_weight); "
                "other estimator forms add their own bias",
                stacklevel=2,
            )
        if verbose:
            cut_clause = (
                f"; vs the truncated target: bias {row['truncated_bias_se']:.1f} SE "
                f"(p = {row['truncated_p_value']:.2g}), cut_bias {cut_bias:.2g}"
                if truncated > 0
                else ""
            )
            if unseen_share > CUT_WEIGHT_WARN:
                cut_clause += f"; unseen_share {unseen_share:.2g} (zero probabilities that move)"
            cut_clause += resolved_clause(row, "pairs")
            print(
                f"theta {i}: {describe(row)}{cut_clause}  [{method}, {config.num_envs} x "
                f"{config.num_steps}, grouping={config.grouping}, partial={config.partial}, "
                f"{batches} batches]"
            )
    return out


def _resolved(problem, theta, beta, horizon, row: dict, target, est, visits, starts) -> dict:
    """The ``rare_share`` / ``resolved_*`` entries of a check's row (module docstring): computed
    when ``row`` reads as biased and some pair or start state was sampled fewer than
    ``RARE_VISITS`` times, else NaN (``rare_share`` 0 when none is that rare). The rest is the
    exact hypergradient less the part of the expectation ``target`` (the first episodes cut at
    ``horizon``) that comes from the episodes visiting a rare pair or starting in a rare
    state."""
    if not reads_biased(row):
        return resolved_entries(row)
    rare = np.asarray(visits) < RARE_VISITS
    rare_start = np.asarray(starts) < RARE_VISITS
    if not (rare.any() or rare_start.any()):
        return {**resolved_entries(row), "rare_share": 0.0}
    br = best_response(problem, theta, beta)
    V_L, Q_L = leader_values(problem, theta, br.policy)
    seen = _truncated(problem, theta, beta, horizon, br, V_L, Q_L, ~rare, ~rare_start)
    part = np.asarray(target, np.float64) - np.ravel(np.asarray(seen, np.float64))
    return resolved_entries(row, row["exact"] - part, est)
