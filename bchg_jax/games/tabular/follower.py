"""Soft Q-iteration for the follower of a 2-player Markov game (Theorem 2's Bellman equation).

    Q_F(s, a, b) = r_F(s, a, b) + gamma_F sum_{s'} p(s'|s, a, b) V(s')
    g(b | s, a)  = softmax_b(Q_F(s, a, .) / beta)
    V_F(s, a)    = beta logsumexp_b (Q_F(s, a, b) / beta)

The next-state value V(s') has two forms (``backup``):
* ``"paper"``:     V(s') = sum_a' f(a'|s') beta logsumexp_b' Q(s', a', b') / beta   (Theorem 2)
* ``"reference"``: V(s') = beta logsumexp_b' (sum_a' f(a'|s') Q(s', a', b')) / beta  (the
  authors' code; reproduces the paper's figure; this package's default). Theorem 2's estimator
  differentiates the paper form, so under this one it is biased for the exact hypergradient
  (:func:`bchg_jax.games.tabular.exact.exact_hypergradient`).
Warm-startable from a previous Q; sweeps until max |dQ| <= ``tol`` (at most ``max_sweeps``), or
until the change stalls at the float rounding floor (:mod:`bchg_jax.core.rounding`).
"""

from __future__ import annotations

from typing import NamedTuple, Optional

import jax
import jax.numpy as jnp
import numpy as np

from bchg_jax.core.eager import cached_when_eager
from bchg_jax.core.precision import full_precision
from bchg_jax.core.rounding import sweep_to_tolerance
from bchg_jax.core.softmax import follower_softmax
from bchg_jax.core.validate import (
    check_beta_if_concrete,
    check_finite_if_concrete,
    check_problem_settings,
    check_shape,
    check_solver_settings,
    validate_if_concrete,
)
from bchg_jax.games.tabular.game import check_policy_shapes, compute_dtype


def check_game(game) -> None:
    """The game's scalar settings and, where its tables are concrete, its ``validate()``
    (:func:`~bchg_jax.core.validate.validate_if_concrete`): rows that are not distributions,
    shapes, non-finite entries. The exact functions gave finite numbers for an unvalidated game
    whose rows summed to 0.9."""
    check_problem_settings(game)
    validate_if_concrete(game)


Array = jax.Array
BACKUPS = ("reference", "paper")


class GameBestResponse(NamedTuple):
    """The follower's soft-optimal response to a leader policy (it observes the leader's action)
    with the follower protocol ``sample`` / ``log_prob`` / ``value`` / ``q_value``.

    g(b|s, a) = exp((Q_F(s, a, b) - V_F(s, a)) / beta), the Boltzmann best response
    g^{theta dagger} of the Markov-game setting.

    Attributes:
      policy: [S, A, B] g(b|s, a).
      Q: [S, A, B] the follower's soft Q_F(s, a, b).
      V: [S, A] the follower's soft value V_F(s, a) = beta logsumexp_b Q_F(s, a, b) / beta.
      sweeps: [] int, number of soft-Q sweeps done.
      residual: [] sup-norm of the last change (or of the fixed-point residual).
    """

    policy: Array  # g(b | s, a) [S, A, B]
    Q: Array  # Q_F [S, A, B]
    V: Array  # V_F(s, a) [S, A]
    sweeps: Array
    residual: Array

    def sample(self, key, s, a):
        """b ~ g(.|s, a) for int arrays ``s``, ``a`` of one shape [...] -> int [...]."""
        return jax.random.categorical(key, jnp.log(self.policy[s, a]))

    def log_prob(self, s, a, b):
        """log g(b|s, a) for int arrays ``s``, ``a``, ``b`` of one shape [...] -> [...]."""
        return jnp.log(self.policy[s, a, b])

    def value(self, s, a):
        """V_F(s, a) for int arrays ``s``, ``a`` of one shape [...] -> [...]."""
        return self.V[s, a]

    def q_value(self, s, a, b):
        """Q_F(s, a, b) for int arrays ``s``, ``a``, ``b`` of one shape [...] -> [...]."""
        return self.Q[s, a, b]


@full_precision
def next_value(Q: Array, f: Array, beta, backup: str) -> Array:
    """V(s') [S] from Q [S, A, B] and the leader policy f [S, A] (module docstring's two forms).

    Args:
      Q: [S, A, B] follower soft Q.
      f: [S, A] leader policy.
      beta: the follower's entropy weight, scalar.
      backup: ``"paper"`` or ``"reference"``.
    Returns:
      [S] next-state values.
    Raises:
      ValueError: an unknown ``backup``.
    """
    if backup == "paper":
        return jnp.sum(f * beta * jax.nn.logsumexp(Q / beta, axis=-1), axis=-1)
    if backup == "reference":
        return beta * jax.nn.logsumexp(jnp.einsum("sa,sab->sb", f, Q) / beta, axis=-1)
    raise ValueError(f"backup must be one of {BACKUPS}, got {backup!r}")


@full_precision
def soft_q_backup(P: Array, r: Array, Q: Array, f: Array, beta, gamma, backup: str) -> Array:
    """One soft Bellman backup r + gamma sum_{s'} P(s'|s, a, b) V(s'), [S, A, B].

    Args:
      P: [S, A, B, S] transition probabilities. r: [S, A, B] follower reward.
      Q: [S, A, B] current soft Q. f: [S, A] leader policy. beta: entropy weight.
      gamma: the follower's discount. backup: see :func:`next_value`.
    Returns:
      [S, A, B] backed-up Q.
    """
    return r + gamma * jnp.einsum("sabt,t->sab", P, next_value(Q, f, beta, backup))


@full_precision
def soft_q_backups(P: Array, r: Array, Q: Array, f: Array, beta, gamma, backup: str, K: int):
    """``K`` soft Bellman backups ``T_f^K Q`` [S, A, B] (:func:`soft_q_backup` applied ``K`` times,
    a ``fori_loop`` with a static trip count, so reverse-mode differentiable in ``f``, ``Q``).

    The ``k_step`` follower's update (:mod:`bchg_jax.core.follower_model`) and the map that
    :func:`bchg_jax.games.tabular.exact.k_step_hypergradient` differentiates.
    """
    return jax.lax.fori_loop(
        0, int(K), lambda _, q: soft_q_backup(P, r, q, f, beta, gamma, backup), Q
    )


def response_from_q(Q: Array, beta, sweeps, residual) -> GameBestResponse:
    """The Boltzmann policy softmax_b(Q / beta) [S, A, B] (:func:`follower_softmax`) and
    V = beta logsumexp_b(Q / beta) [S, A] of a soft Q [S, A, B], packed with the solver's
    ``sweeps`` and ``residual``."""
    V = beta * jax.nn.logsumexp(Q / beta, axis=-1)
    return GameBestResponse(follower_softmax(Q / beta), Q, V, sweeps, residual)


def _soft_q_iteration_checks(
    game, f, beta, backup="reference", Q0=None, tol=1e-6, max_sweeps=1000
) -> None:
    """:func:`soft_q_iteration`'s checks (an eager call's precheck: inside its cached program
    ``f`` and ``Q0`` are traced, and a concrete ``f``'s rows are checked here)."""
    if backup not in BACKUPS:
        raise ValueError(f"backup must be one of {BACKUPS}, got {backup!r}")
    check_game(game)
    check_beta_if_concrete(beta)
    check_policy_shapes(game, f)
    check_solver_settings("soft_q_iteration", tol, max_sweeps=(max_sweeps, 1))
    if Q0 is not None:
        check_shape("Q0", Q0, np.shape(game.transition)[:3], "[S, A, B] from game.transition")
        check_finite_if_concrete("Q0", Q0)  # a NaN start gave an all-NaN response


@cached_when_eager(_soft_q_iteration_checks, traced_names=())
@full_precision
def soft_q_iteration(
    game,
    f: Array,
    beta,
    backup: str = "reference",
    Q0: Optional[Array] = None,
    tol: float = 1e-6,
    max_sweeps: int = 1000,
) -> GameBestResponse:
    """The follower's best response to the leader policy ``f`` [S, A] (not differentiated).

    Soft Q-iteration (at least one sweep, then until max |dQ| <= ``tol`` or ``max_sweeps``, or
    until the change has stalled at the float rounding floor: :mod:`bchg_jax.core.rounding`) in
    one ``lax.while_loop``; for a differentiable response use
    :func:`bchg_jax.games.tabular.exact.best_response`.

    Args:
      game: a :class:`~bchg_jax.games.tabular.game.TabularGame` (``transition``,
        ``follower_reward``, ``gamma_F``).
      f: [S, A] leader policy f(a|s).
      beta: the follower's entropy weight (> 0), scalar.
      backup: ``"reference"`` (default) or ``"paper"`` (module docstring).
      Q0: optional [S, A, B] warm start (default zeros; cast to the computation's dtype).
      tol: sup-norm stopping tolerance.
      max_sweeps: sweep cap.
    Returns:
      :class:`GameBestResponse` (``policy`` [S, A, B], ``Q`` [S, A, B], ``V`` [S, A], ``sweeps``
      [] int32, ``residual`` [] the last sup-norm change), in the promoted dtype of ``f``,
      ``beta`` and the game's tables (:func:`~bchg_jax.games.tabular.game.compute_dtype`).
    Raises:
      ValueError: an unknown ``backup``, a concrete ``beta`` not finite and > 0, a bad scalar
        setting of ``game`` (a discount outside [0, 1), ...), ``f`` / ``Q0`` not shaped by
        ``game.transition`` (or a concrete ``f`` whose rows are not distributions, or a concrete
        ``Q0`` that is not finite), a concrete
        ``tol`` not finite and > 0, or ``max_sweeps`` not a positive integer.
    """
    _soft_q_iteration_checks(game, f, beta, backup, Q0, tol, max_sweeps)
    # the game's tables and f promoted (games.tabular.game.compute_dtype); the loop carries it
    dtype = compute_dtype(game, f, beta)
    f, beta, gamma_F = (jnp.asarray(x, dtype) for x in (f, beta, game.gamma_F))
    P = jnp.asarray(game.transition, dtype)
    r = jnp.asarray(game.follower_reward, dtype)
    Q0 = jnp.zeros_like(r) if Q0 is None else jnp.asarray(Q0, dtype)

    def sweep(Q):
        return soft_q_backup(P, r, Q, f, beta, gamma_F, backup)

    Q, res, it = sweep_to_tolerance(sweep, Q0, tol, max_sweeps, game.gamma_F, min_sweeps=1)
    return response_from_q(Q, beta, it, res)
