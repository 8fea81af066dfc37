"""Problem instances (data, and each game's own training metrics; their types live in the
families)."""

from bchg_jax.problems.fourrooms import fourrooms
from bchg_jax.problems.lqr_game import gain_metrics, lqr_game
from bchg_jax.problems.random_tabular import random_tabular_cmdp, random_tabular_game
from bchg_jax.problems.thermal import thermal
from bchg_jax.problems.toy_game import toy_game, toy_game_metrics

__all__ = [
    "fourrooms",
    "gain_metrics",
    "lqr_game",
    "random_tabular_cmdp",
    "random_tabular_game",
    "thermal",
    "toy_game",
    "toy_game_metrics",
]
