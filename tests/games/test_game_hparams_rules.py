"""The game families' HParams (bchg_jax.games.hparams): each family's defaults land in the right
fields, from_grid fills missing fields with them, step counts are int32 when cast, and validate
refuses what its docstring names (a step count outside [0, max_steps] or non-integer, beta <= 0)
while accepting 0 steps."""

import jax.numpy as jnp
import numpy as np
import pytest

from bchg_jax.games.lqr import train as lqr_train
from bchg_jax.games.tabular import train as tabular_train


def test_game_hparams_defaults_land_in_their_fields():
    """LQR: 1 actor step, 5 critic steps, beta 0.1 (tabular: 1, 1, 0.05), positionally and by
    from_grid for a field the grid leaves out."""
    hp = lqr_train.HParams()
    assert (hp.actor_steps, hp.critic_steps, hp.beta) == (1, 5, 0.1)
    assert tuple(tabular_train.HParams()) == (1, 1, 0.05)
    assert lqr_train.HParams(2).critic_steps == 5
    assert lqr_train.HParams._field_defaults == {"actor_steps": 1, "critic_steps": 5, "beta": 0.1}
    grid = lqr_train.HParams.from_grid({"beta": [0.2, 0.3]})
    np.testing.assert_array_equal(grid.actor_steps, [1, 1])
    np.testing.assert_array_equal(grid.critic_steps, [5, 5])
    assert isinstance(hp, lqr_train.HParams) and not hasattr(hp, "__dict__")


def test_game_hparams_cast_keeps_step_counts_integer():
    """cast: actor_steps and critic_steps become int32, beta the float dtype."""
    hp = lqr_train.HParams(3, 7, 0.2).cast(jnp.float32)
    assert hp.actor_steps.dtype == jnp.int32 and hp.critic_steps.dtype == jnp.int32
    assert hp.beta.dtype == jnp.float32 and int(hp.critic_steps) == 7


def test_game_hparams_validate_bounds():
    """validate: 0 steps and max_steps itself are accepted; -1, max_steps + 1, 1.5 and beta <= 0
    are refused, naming the field (each count checked on its own value)."""
    HP = lqr_train.HParams
    HP(0, 0, 0.1).validate(max_steps=4)
    HP(4, 4, 0.1).validate(max_steps=4)
    for bad, field in (
        (HP(5, 1, 0.1), "actor_steps"),
        (HP(-1, 1, 0.1), "actor_steps"),
        (HP(1.5, 1, 0.1), "actor_steps"),
        (HP(1, 5, 0.1), "critic_steps"),
        (HP(1, -1, 0.1), "critic_steps"),
        (HP(1, 2.5, 0.1), "critic_steps"),
    ):
        with pytest.raises(ValueError, match=field):
            bad.validate(max_steps=4)
    for beta in (0.0, -0.1, np.nan):
        with pytest.raises(ValueError, match="beta"):
            HP(1, 1, beta).validate()
