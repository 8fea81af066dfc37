"""Is Theorem 2 / 3's estimator unbiased on this LQR game? Its batch mean vs the exact gradient.

``check_problem(game, thetas, beta)`` is the linear-game counterpart of
:func:`bchg_jax.games.tabular.check.check_problem`. Per theta it draws ``batches`` independent
batches with :func:`~bchg_jax.games.lqr.exact.exact_critic_estimate` (``episodes`` episodes of
``leader_steps`` + ``extra_steps`` steps from s0 under the leader and the follower's best
response, *exact* critics Q_L^(h) and follower quantities, the Benefit from Monte Carlo follower
samples) and compares the mean with :func:`~bchg_jax.games.lqr.exact.exact_hypergradient` of the
same ``leader_steps``-step discounted objective. Only the estimator is judged: a trainer adds
its learned critic's error (``benchmarks/lqr_game_learned_quality.py`` measures that).

The estimator options are those of ``exact_critic_estimate``: a Gaussian leader (Theorem 2,
``stochastic=True``) or a deterministic one (Theorem 3), ``guide`` (``"benefit"``: BC-HG,
``"none"``: Naive-PGD), the direct term's baseline (``"value"``: exact V_L, unbiased;
``"same_noise"``: unbiased; ``"same_b"``: the reference implementation's, biased; ``"none"``) and
the influence form (``"baseline"`` or ``"raw"``). ``extra_steps`` defaults to the steps after
which gamma_F^k falls below 1e-3 (the influence sums stand for infinite ones).

The numbers (``bias_se``, ``p_value``, ``rel_error``, ``rel_se``, ``cosine``) are those of
:mod:`bchg_jax.core.bias_check`.
"""

from __future__ import annotations

from typing import List, Optional, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from bchg_jax.core.bias_check import (
    check_batches,
    check_theta_list,
    compare,
    describe,
    warn_if_unresolved,
)
from bchg_jax.core.validate import check_count
from bchg_jax.games.lqr.exact import (
    exact_critic_estimate,
    exact_hypergradient,
    influence_steps,
)
from bchg_jax.games.lqr.game import LQRGame

Array = jax.Array


def check_problem(
    game: LQRGame,
    theta_list: Sequence,
    beta,
    *,
    stochastic: bool = True,
    guide: str = "benefit",
    direct_baseline: str = "value",
    influence: str = "baseline",
    episodes: int = 16,
    leader_steps: Optional[int] = None,
    extra_steps: Optional[int] = None,
    samples: int = 16,
    batches: int = 400,
    key: Optional[Array] = None,
    chunk: int = 100,
    verbose: bool = True,
) -> List[dict]:
    """Mean of ``batches`` exact-critic estimates vs the exact hypergradient, per theta.

    Args:
      game: the :class:`~bchg_jax.games.lqr.game.LQRGame` (validated here).
      theta_list: leader parameters to check, each [k * n] (the gain K flattened).
      beta: the follower's entropy weight (> 0).
      stochastic, guide, direct_baseline, influence, samples: the estimator's options
        (:func:`~bchg_jax.games.lqr.exact.exact_critic_estimate`; module docstring).
      episodes: episodes per batch (>= 1).
      leader_steps: the objective's horizon; None: ``game.horizon``.
      extra_steps: steps only the follower's influence sums see; None: the smallest k with
        gamma_F^k <= 1e-3 (``exact_critic_estimate`` warns below that).
      batches: independent batches per theta (>= 2).
      key: PRNG key (default ``jax.random.key(0)``); theta i uses ``fold_in(key, i)``.
      chunk: batches estimated at once (memory); all batches run as one compiled program.
      verbose: print one line per theta.
    Returns:
      one dict per theta: ``exact``, ``mean``, ``se``, ``z`` [k * n] and ``bias_se``, ``p_value``,
      ``rel_error``, ``rel_se``, ``cosine`` (:func:`~bchg_jax.core.bias_check.compare`).
    Raises:
      ValueError: an invalid game, ``beta`` or estimator option (as ``exact_critic_estimate``),
        ``batches`` < 2, one theta given alone or none, a theta ``game.validate(theta)``
        refuses (an unstabilisable follower pair there), or one whose follower solve does not
        converge (no exact reference).
    Warns:
      UserWarning: a float32 theta at which the exact reference itself is unreliable (its
        direct and follower-response parts cancel: large leader gains,
        :func:`~bchg_jax.games.lqr.exact.float32_cancellation`); pass float64 thetas (with
        ``jax_enable_x64``) there.
    """
    game.validate()
    leader_steps = game.horizon if leader_steps is None else leader_steps
    check_count("leader_steps", leader_steps)
    if extra_steps is None:
        extra_steps = influence_steps(game)
    batches = check_batches(batches)
    shape = (game.leader_dim * game.state_dim,)
    theta_list = check_theta_list("games.lqr.check_problem", theta_list, shape)
    key = jax.random.key(0) if key is None else key
    options = dict(
        episodes=int(episodes),
        leader_steps=int(leader_steps),
        extra_steps=int(extra_steps),
        stochastic=stochastic,
        guide=guide,
        direct_baseline=direct_baseline,
        influence=influence,
        samples=int(samples),
    )

    @jax.jit
    def estimates(theta, keys):
        """[batches, k * n] estimates: one program for every theta (the options are checked
        when it is traced, theta by exact_hypergradient below)."""
        one = lambda k: exact_critic_estimate(game, theta, beta, k, **options)  # noqa: E731
        return jax.lax.map(one, keys, batch_size=min(int(chunk), batches))

    out = []
    for i, theta in enumerate(theta_list):
        theta = jnp.asarray(theta)
        game.validate(theta)  # shape, finiteness and a solvable follower at this theta
        # concrete: a bad theta or an unconverged follower solve is an error here
        exact = exact_hypergradient(
            game, theta, beta, horizon=options["leader_steps"], stochastic=stochastic
        )
        est = estimates(theta, jax.random.split(jax.random.fold_in(key, i), batches))
        row = compare(np.asarray(exact), np.asarray(est))
        warn_if_unresolved(f"games.lqr.check_problem, theta {i}", row, batches)
        out.append(row)
        if verbose:
            kind = "Gaussian" if stochastic else "deterministic"
            print(
                f"theta {i}: {describe(row)}  [{guide}, {kind} leader, baseline "
                f"{direct_baseline}, influence {influence}, {episodes} x "
                f"({leader_steps} + {extra_steps}), {batches} batches]"
            )
    return out
