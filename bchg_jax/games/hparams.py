"""The hyperparameters that both game families' trainers trace (a grid is one vmapped program).

Each family subclasses :class:`GameHParams` with its own defaults (a ``NamedTuple``: a pytree)."""

from __future__ import annotations

from typing import Any, NamedTuple

import numpy as np

from bchg_jax.core import hparams as hparams_lib
from bchg_jax.core.validate import check_beta, check_int_range


class _Fields(NamedTuple):
    actor_steps: Any = 1
    critic_steps: Any = 1
    beta: Any = 0.05


class GameHParams(hparams_lib.HParamsMixin, _Fields):
    """Both game trainers' grid-able hyperparameters (traced; a grid is one vmapped program).

    Attributes:
      actor_steps: actor updates per outer iteration, an integer in [0, config.max_steps].
      critic_steps: critic updates per outer iteration, an integer in [0, config.max_steps].
      beta: the follower's entropy weight (> 0).
    """

    __slots__ = ()
    INTEGER_FIELDS = ("actor_steps", "critic_steps")

    def validate(self, max_steps=np.inf) -> "GameHParams":
        """Host-side range checks (concrete values); returns ``self``.

        Args:
          max_steps: upper bound of ``actor_steps`` / ``critic_steps`` (``config.max_steps``).
        Returns:
          ``self``.
        Raises:
          ValueError: a step count outside [0, max_steps] or non-integer, or beta <= 0.
        """
        check_int_range("actor_steps", self.actor_steps, 0, max_steps)
        check_int_range("critic_steps", self.critic_steps, 0, max_steps)
        check_beta(self.beta)
        return self


def game_hparams(name: str, module: str, actor_steps: int, critic_steps: int, beta: float) -> type:
    """A family's HParams class (defined in ``module``): :class:`GameHParams` with its own
    defaults.

    Args:
      name: the family's name, used in the generated class docstring.
      module: ``__module__`` of the generated class (the family's train module).
      actor_steps: default actor updates per outer iteration.
      critic_steps: default critic updates per outer iteration.
      beta: default follower entropy weight (> 0).
    Returns:
      a subclass named ``HParams`` of :class:`GameHParams` (a NamedTuple of scalar or [G]
      fields ``actor_steps``, ``critic_steps``, ``beta``) whose constructor takes these defaults.
    """

    def __new__(cls, actor_steps=actor_steps, critic_steps=critic_steps, beta=beta):
        return GameHParams.__new__(cls, actor_steps, critic_steps, beta)

    doc = (
        f"The {name} trainer's grid-able hyperparameters (defaults: {actor_steps} actor "
        f"step(s), {critic_steps} critic step(s), beta {beta}); fields and checks as "
        ":class:`~bchg_jax.games.hparams.GameHParams`."
    )
    defaults = {"actor_steps": actor_steps, "critic_steps": critic_steps, "beta": beta}
    return type(
        "HParams",
        (GameHParams,),
        {
            "__slots__": (),
            "__new__": __new__,
            "__doc__": doc,
            "_field_defaults": defaults,
            "__module__": module,
        },
    )
