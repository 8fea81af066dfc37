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
* a cut: episodes end at ``horizon`` while the exact gradient has no time limit, and the
  influence sums of the last steps lose ~gamma_F^(steps left) of their weight: a bias of about
  ``cut_weight`` = :func:`~bchg_jax.core.bias_check.discount_weight_beyond` (gamma_L, gamma_F,
  horizon) of the gradient (~(1 + H (1 - gamma)) gamma^H; more where the gradient comes late in
  the episode; derivation in :mod:`bchg_jax.tabular.check`), warned about above
  :data:`CUT_WEIGHT_WARN`.

The numbers (``bias_se``, ``rel_error``, ``rel_se``, ``cosine``) are those of
:mod:`bchg_jax.core.bias_check`.
"""

from __future__ import annotations

import warnings
from typing import Callable, List, Optional, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from bchg_jax.core.bias_check import check_batches, compare, describe, discount_weight_beyond
from bchg_jax.core.validate import check_beta, check_count, check_probability_rows_if_concrete
from bchg_jax.games.estimators import hypergradient
from bchg_jax.games.tabular.exact import best_response, exact_hypergradient, leader_values
from bchg_jax.games.tabular.follower import BACKUPS
from bchg_jax.games.tabular.game import TabularGame
from bchg_jax.games.tabular.rollout import rollout

Array = jax.Array
GUIDES = ("benefit", "none")
BASELINES = ("state", "none")
# warn when the episodes' cut leaves more discount weight than this (module docstring)
CUT_WEIGHT_WARN = 1e-3


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
      ``bias_se``, ``rel_error``, ``rel_se``, ``cosine``
      (:func:`~bchg_jax.core.bias_check.compare`), ``cut_weight`` (a warning above
      :data:`CUT_WEIGHT_WARN`).
    Raises:
      ValueError: an invalid game, ``beta``, ``backup``, ``guide`` or ``baseline``, no
        ``horizon`` (and no ``game.time_limit``), ``episodes`` < 1, ``batches`` < 2, or a
        ``policy_fn(theta)`` whose rows are not distributions.
    """
    game.validate()
    check_beta(beta)
    for name, value, allowed in (
        ("backup", backup, BACKUPS),
        ("guide", guide, GUIDES),
        ("baseline", baseline, BASELINES),
    ):
        if value not in allowed:
            raise ValueError(f"{name} must be one of {allowed}, got {value!r}")
    horizon = game.time_limit if horizon is None else horizon
    if horizon is None:
        raise ValueError(f"{game.name}: pass a horizon (the game has no time_limit)")
    check_count("horizon", horizon)
    check_count("episodes", episodes)
    batches = check_batches(batches)
    key = jax.random.key(0) if key is None else key
    horizon, episodes = int(horizon), int(episodes)

    @jax.jit
    def exact_and_estimates(theta, keys):
        """(exact hypergradient, estimates [batches, ...]): one program for every theta."""
        f = policy_fn(theta)
        br = best_response(game, f, beta, backup)
        V_L, Q_L = leader_values(game, f, br.policy)
        base = V_L if baseline == "state" else None

        def one(k):
            ep = rollout(k, game, f, br.policy, episodes, horizon)
            return hypergradient(
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

        est = jax.lax.map(one, keys, batch_size=min(int(chunk), batches))
        return exact_hypergradient(policy_fn, theta, game, beta, backup), est

    for i, theta in enumerate(theta_list):
        label = f"theta {i}: policy_fn(theta) (leader policy)"
        check_probability_rows_if_concrete(label, policy_fn(theta))
    cut_weight = discount_weight_beyond(game.gamma_L, game.gamma_F, horizon)
    if cut_weight > CUT_WEIGHT_WARN:
        warnings.warn(
            f"{game.name}: episodes of {horizon} steps leave {cut_weight:.3g} of the discount "
            "weight beyond the cut (the leader's steps past it and the tails of the follower's "
            "influence sums started before it), while the exact hypergradient has no time "
            "limit: the estimates target the gradient truncated there (a bias of about "
            f"{cut_weight:.2g} of it, more where the gradient comes late); pass a longer horizon",
            stacklevel=2,
        )
    out = []
    for i, theta in enumerate(theta_list):
        g, est = exact_and_estimates(theta, jax.random.split(jax.random.fold_in(key, i), batches))
        flat = jax.vmap(lambda x: jnp.concatenate([jnp.ravel(v) for v in jax.tree.leaves(x)]))
        exact = np.concatenate([np.ravel(np.asarray(v)) for v in jax.tree.leaves(g)])
        row = compare(exact, flat(est))
        row["cut_weight"] = cut_weight
        out.append(row)
        if verbose:
            print(
                f"theta {i}: {describe(row)}  [{guide}, backup={backup}, baseline={baseline}, "
                f"{episodes} x {horizon}, {batches} batches]"
            )
    return out
