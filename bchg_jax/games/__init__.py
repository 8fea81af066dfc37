"""2-player Markov games: the leader is a player whose policy steers a soft-optimal follower.

:mod:`bchg_jax.games.estimators` holds Theorem 2 and the appendix's deterministic-leader
Theorem 3 (one implementation, used by both families) and :mod:`bchg_jax.games.hparams` their
shared hyperparameters; the families are :mod:`bchg_jax.games.tabular` (finite games, soft
Q-iteration follower) and :mod:`bchg_jax.games.lqr` (linear games, Proposition 2 follower).
"""

from bchg_jax.games import estimators, lqr, tabular

__all__ = ["estimators", "lqr", "tabular"]
