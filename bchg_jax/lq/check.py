"""Is an LQ estimator unbiased on this problem? The mean of many batches vs the exact gradient.

``check_problem(problem, thetas, beta)`` is the linear-Gaussian counterpart of
:func:`bchg_jax.tabular.check.check_problem`: per theta it solves the follower's best response
(Proposition 1) as the trainer does, draws ``batches`` independent batches of
``config.num_episodes`` episodes, and runs the trainer's own estimate step on each
(``make_train(problem, method, config).steps["estimate"]``: the same rollout, leader critic,
follower terms, control variates and estimator options), so what is judged is what a training
run of ``method`` with ``config`` would follow. The mean is compared with the exact
infinite-horizon hypergradient (:func:`~bchg_jax.lq.exact.exact_hypergradient` with
``horizon=None``): the estimators bootstrap with infinite-horizon critics and follower values,
and :func:`~bchg_jax.lq.train.make_train` already refuses a horizon whose cut leaves more
than 1e-3 of the discount weight (:func:`~bchg_jax.lq.train.check_truncation`). The numbers
(``bias_se``, ``p_value``, ``rel_error``, ``rel_se``, ``cosine``) are those of
:mod:`bchg_jax.core.bias_check`.

What it shows on the library's own settings (``tests/lq/test_lq_check.py``): BC-HG with the
default cross-fitted critic (``critic="quadratic_loo"``) agrees within the resolution there
(on other problems its LSTD fit keeps a finite-sample bias of a few percent at 2-4 episodes,
8% on one, 1-3% at 10: docs/experiments.md, "The LSTD leader critic's in-sample bias"); the
in-sample fit (``critic="quadratic"``) is biased at a few episodes per batch; ``hpgd_mc`` (the
authors' baseline, Q_L from the same episode's return) is biased at any batch size. Pass
``TrainConfig(critic="exact")`` to judge an estimator alone, with the closed-form Q_L.
"""

from __future__ import annotations

from typing import List, Optional, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from bchg_jax.core.bias_check import (
    check_batches,
    check_best_response_config,
    check_theta_list,
    compare,
    describe,
    warn_if_unresolved,
)
from bchg_jax.lq import exact as exact_lq
from bchg_jax.lq.cmdp import LQConfigurableMDP
from bchg_jax.lq.train import METHOD_SPECS, HParams, TrainConfig, make_train

Array = jax.Array


def check_problem(
    problem: LQConfigurableMDP,
    theta_list: Sequence[Array],
    beta,
    config: Optional[TrainConfig] = None,
    batches: int = 400,
    method: str = "bchg",
    key: Optional[Array] = None,
    chunk: int = 100,
    verbose: bool = True,
) -> List[dict]:
    """Mean of ``batches`` hypergradient estimates vs the exact hypergradient, per theta.

    Args:
      problem: the :class:`~bchg_jax.lq.cmdp.LQConfigurableMDP`.
      theta_list: the thetas to check, each [d] like ``problem.theta0``.
      beta: the follower's entropy weight (> 0).
      config: a :class:`~bchg_jax.lq.train.TrainConfig` (``num_episodes``, ``critic``,
        ``follower_grad``, ``control_variates``, ``state_baseline``, the Riccati ``tol`` /
        cap, ...); None: ``TrainConfig()``, the trainer's defaults. Its follower must be the
        best response (the batches are drawn under it).
      batches: independent batches per theta (>= 2).
      method: an estimating method of ``METHOD_SPECS`` (not ``"exact"``); default BC-HG.
      key: PRNG key (default ``jax.random.key(0)``); theta i uses ``fold_in(key, i)``.
      chunk: batches estimated at once (memory); all batches run as one compiled program.
      verbose: print one line per theta.
    Returns:
      one dict per theta: ``exact``, ``mean``, ``se``, ``z`` [d] and ``bias_se``, ``p_value``,
      ``rel_error``, ``rel_se``, ``cosine`` (:func:`~bchg_jax.core.bias_check.compare`).
    Raises:
      ValueError: a ``config.follower`` off the best response,
        ``method="exact"`` or unknown, ``batches`` < 2, one theta given alone or none,
        an invalid problem / config or
        a horizon too short for the sampling estimators (as
        :func:`~bchg_jax.lq.train.make_train`), a bad ``beta``, or a theta whose follower
        solve does not converge (no exact reference there).
    """
    config = TrainConfig() if config is None else config
    check_best_response_config(config)
    if method == "exact" or method not in METHOD_SPECS:
        raise ValueError(
            f"method must be an estimating method of {tuple(METHOD_SPECS)} "
            f"(not 'exact'), got {method!r}"
        )
    batches = check_batches(batches)
    theta_list = check_theta_list("lq.check_problem", theta_list, np.shape(problem.theta0))
    trainer = make_train(problem, method, config)
    dtype = jnp.asarray(problem.theta0).dtype
    hp = HParams(beta=beta).validate()
    # the MLP critics' initial parameters (``()`` for the other critics), as at a run's start
    critic_init = trainer.init(jax.random.key(0), hp).critic
    estimate, follower = trainer.steps["estimate"], trainer.steps["follower"]
    key = jax.random.key(0) if key is None else key
    Qbar = jnp.asarray(problem.Qbar, dtype)

    @jax.jit
    def exact_and_estimates(theta, beta, keys):
        """(exact hypergradient [d], estimates [batches, d], the follower's solve converged)."""
        br = follower(theta, beta, Qbar)

        def one(k):
            k_roll, k_crit = jax.random.split(k)
            return estimate(k_roll, k_crit, theta, beta, br, critic_init)[0]

        est = jax.lax.map(one, keys, batch_size=min(int(chunk), batches))
        exact = exact_lq.exact_hypergradient(
            problem,
            theta,
            beta,
            horizon=None,
            tol=config.riccati_tol,
            max_iters=config.riccati_max_iters,
        )
        return exact, est, br.converged

    beta_arr = jnp.asarray(beta, dtype)
    out = []
    for i, theta in enumerate(theta_list):
        theta = jnp.asarray(theta, dtype)
        problem.validate(theta)  # shape, finiteness and a stable closed loop at this theta
        keys = jax.random.split(jax.random.fold_in(key, i), batches)
        g, est, converged = exact_and_estimates(theta, beta_arr, keys)
        if not bool(converged) or not np.all(np.isfinite(np.asarray(g))):
            raise ValueError(
                f"{problem.name}: theta {i}: the follower's Riccati solve did not converge "
                f"(tol {config.riccati_tol:g}, at most {config.riccati_max_iters} iterations), "
                "so there is no exact hypergradient to compare with"
            )
        row = compare(g, est)
        warn_if_unresolved(f"lq.check_problem, theta {i}", row, batches)
        out.append(row)
        if verbose:
            critic = f"critic={config.critic}, " if METHOD_SPECS[method][1] == "critic" else ""
            print(
                f"theta {i}: {describe(row)}  [{method}, {critic}{config.num_episodes} "
                f"episodes x {problem.horizon} steps, {batches} batches]"
            )
    return out
