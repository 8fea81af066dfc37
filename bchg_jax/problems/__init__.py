"""Problems as pure functions of theta."""
from bchg_jax.problems.fourrooms import fourrooms
from bchg_jax.problems.random_tabular import random_tabular_cmdp
from bchg_jax.problems.tabular import TabularCMDP

__all__ = ["TabularCMDP", "fourrooms", "random_tabular_cmdp"]
