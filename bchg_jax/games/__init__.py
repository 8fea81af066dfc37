"""2-player Markov games: the leader is a player whose policy steers a soft-optimal follower.

:mod:`bchg_jax.games.estimators` holds Theorem 2 and the appendix's deterministic-leader
Theorem 3 (one implementation, used by both families), :mod:`bchg_jax.games.actor_critic` the
one actor-critic leader skeleton both families' trainers are assembled on,
:mod:`bchg_jax.games.guide` the variance-reduction pieces of the guiding term and
:mod:`bchg_jax.games.hparams` the shared hyperparameters; the families are
:mod:`bchg_jax.games.tabular` (finite games, soft Q-iteration follower) and
:mod:`bchg_jax.games.lqr` (linear games, Proposition 2 follower).
"""

from bchg_jax.games import actor_critic, estimators, guide, lqr, tabular

__all__ = ["actor_critic", "estimators", "guide", "lqr", "tabular"]
