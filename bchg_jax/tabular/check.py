"""Is an estimator unbiased on this problem? Its mean over many batches vs the exact hypergradient.

``check_problem(problem, thetas, beta)`` samples ``batches`` independent batches per theta exactly
as a training run of ``method`` would (``make_train(problem, method, config).steps``: the same
sampler with its support check, time limit, oracle rollouts and estimator options), estimates
the hypergradient of Theorem 1 (Eq. (hg_configurable)) on each with exact leader critics
(default) so that only the estimator is judged, and compares the mean with
:func:`~bchg_jax.tabular.exact.exact_hypergradient` (implicit differentiation through the
follower's fixed point). Per theta it reports

* ``bias_se``: max over components of |mean - exact| / SE (SE: the standard error of the mean
  over batches); above ~4 the estimator is biased at this resolution;
* ``rel_error``: ||mean - exact|| / ||exact||, and ``rel_se`` = ||SE|| / ||exact||, the
  resolution of that number (a relative error well above ``rel_se`` is bias, not noise);
* ``cosine``: cos(mean, exact);
* ``truncated``: the fraction of the sampled streams whose first episode was cut (by the time
  limit or the end of the batch) before a terminal state, and ``cut_weight`` = ``truncated``
  max(gamma_L, gamma_F)^H, H = min(``time_limit``, ``num_steps``): the discount weight beyond
  the cut (the partial term's steps are discounted by gamma_L, the FollowerQGrad segments of
  Eq. (nablaQF) in the guiding term by gamma_F: a segment starting at step k loses
  ~gamma_F^(H - k) of its sum at the cut);
* ``support_lost``: with the sparse solvers, the sampler's table put mass outside its successor
  table at theta, so the batches were drawn from the whole table (as a training run does);
* ``model_gap``: max |sample_transition(theta) - transition(theta)|. A problem with its own
  sampler (Four-Rooms' ``reference`` slip model: 2/3 sampled, 0.56 in the model) is sampled
  from another MDP than the one the follower's best response and the exact hypergradient are
  of, and the estimates target neither exactly: a warning says so when the gap exceeds
  ``MODEL_GAP_WARN`` (Four-Rooms, beta 0.01, BC-HG's unbiased form, 300 batches of 10 x 1000
  steps: relative error 5.7% at 6.0% resolution with the ``paper`` model, 41% at 8.0% with
  the ``reference`` one).

Only the unbiased forms (``TrainConfig(grouping="first_episode", partial="first_episode")``,
:mod:`bchg_jax.tabular.estimators`) should pass at every resolution, and only when the first
episode ends at a terminal state; the reference convention and the ratio forms are biased by the
episodes the batch cuts off, by O(1 / episodes per stream). A cut episode is truncated at H
while :func:`~bchg_jax.tabular.exact.exact_hypergradient` has no time limit, a bias of up to
~max(gamma_L, gamma_F)^H of the gradient that no estimator form removes (``random_tabular_cmdp``,
gamma_L 0.9 > gamma_F 0.85, no terminal state, ``time_limit = num_steps = 10``: 34%, 15.9 SE;
at 40: 1.8%, 0.9 SE; a follower more patient than the leader, gamma_F 0.99 and gamma_L 0.5 at
H = 40: 225 SE, 0.99^40 = 0.67). A warning says so when ``cut_weight`` exceeds
``CUT_WEIGHT_WARN``.
"""

from __future__ import annotations

import warnings
from typing import List, Optional, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from bchg_jax.core.bias_check import check_batches, check_best_response_config, compare, describe
from bchg_jax.tabular import critics
from bchg_jax.tabular.cmdp import TabularCMDP
from bchg_jax.tabular.estimators import first_episode_mask
from bchg_jax.tabular.exact import best_response, exact_hypergradient, leader_values
from bchg_jax.tabular.train import METHOD_SPECS, TrainConfig, make_train

Array = jax.Array
CRITICS = ("exact", "monte_carlo")
# warn when the sampled first episodes lose more discount weight than this to a cut (module
# docstring): the estimator's target is then the truncated hypergradient, not the exact one
CUT_WEIGHT_WARN = 1e-3
# warn when the sampler's table differs from the model's by more than rounding (module docstring)
MODEL_GAP_WARN = 1e-6


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
      ``bias_se`` (max |z|), ``rel_error``, ``rel_se``, ``cosine``, ``truncated`` and
      ``cut_weight`` (module docstring; a warning when ``cut_weight`` > ``CUT_WEIGHT_WARN``),
      ``support_lost`` (the batches came from the whole table: module docstring),
      ``model_gap`` (the sampler's table against the model's; a warning above
      ``MODEL_GAP_WARN``).
    Raises:
      ValueError: a ``config.follower`` off the best response,
        ``method="exact"`` or unknown, an unknown ``critic``, ``batches`` < 2, or an
        invalid problem / config (as :func:`~bchg_jax.tabular.train.make_train`).
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
    steps = make_train(problem, method, config).steps
    key = jax.random.key(0) if key is None else key
    dtype = jnp.asarray(problem.theta0).dtype

    horizon = config.num_steps if problem.time_limit is None else problem.time_limit
    horizon = min(int(horizon), int(config.num_steps))

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
            return (
                jnp.ravel(steps["estimate"](theta, beta, batch, segments, br, q, v)),
                1.0 - jnp.mean(ended.astype(dtype)),
            )

        est, cut = jax.lax.map(one, keys, batch_size=min(int(chunk), batches))
        # how far the sampled MDP is from the one the exact reference solves (module docstring)
        gap = jnp.max(jnp.abs(problem.sampler_transition(theta) - problem.transition(theta)))
        return jnp.ravel(exact_hypergradient(problem, theta, beta)), est, cut, sampler_lost, gap

    # the slower of the two discounts sets the weight beyond the cut (module docstring)
    gamma = max(float(problem.gamma_L), float(problem.gamma_F))
    out = []
    for i, theta in enumerate(theta_list):
        g, est, cut, lost, gap = exact_and_estimates(
            jnp.asarray(theta, dtype), jax.random.split(jax.random.fold_in(key, i), batches)
        )
        truncated = float(np.mean(np.asarray(cut, np.float64)))
        cut_weight = truncated * gamma**horizon
        row = compare(g, est)
        row.update(
            truncated=truncated,
            cut_weight=cut_weight,
            support_lost=bool(lost),
            model_gap=float(gap),
        )
        out.append(row)
        if row["model_gap"] > MODEL_GAP_WARN:
            warnings.warn(
                f"theta {i}: the sampler's table (problem.sample_transition) differs from "
                f"transition(theta) by up to {row['model_gap']:.3g}: the batches come from "
                "another MDP than the one the exact hypergradient is of, so the bias reported "
                "here is that model mismatch's as well as the estimator's",
                stacklevel=2,
            )
        if cut_weight > CUT_WEIGHT_WARN:
            warnings.warn(
                f"theta {i}: {100 * truncated:.0f}% of the sampled first episodes were cut "
                f"at step {horizon} (time limit or batch end) before a terminal state, and "
                f"max(gamma_L, gamma_F)^{horizon} = {gamma**horizon:.3g}: the estimates "
                "target the hypergradient truncated there, while the exact reference has no "
                f"time limit (a bias of up to ~{cut_weight:.2g} of it)",
                stacklevel=2,
            )
        if verbose:
            print(
                f"theta {i}: {describe(row)}  [{method}, {config.num_envs} x {config.num_steps}, "
                f"grouping={config.grouping}, partial={config.partial}, {batches} batches]"
            )
    return out
