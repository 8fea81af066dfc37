"""``core.hparams``: grid points that differ only in a later field are distinct, grid axes of
different lengths and empty axes are refused with their own messages, the trainer's bounds
passed to ``from_grid`` reach ``validate``, and ``check_representable`` refuses a fractional step
count on its own (not only through ``validate``), and bool or string grid values are refused.

Eager host-side checks on the families' ``HParams`` classes: nothing compiles."""

import jax.numpy as jnp
import numpy as np
import pytest

from bchg_jax.core.hparams import check_distinct_points
from bchg_jax.games.tabular.train import HParams as GameHParams
from bchg_jax.tabular import HParams


def test_points_differing_only_in_a_later_field_are_distinct():
    """{"lr": [0.1, 0.1], "beta": [1e-3, 1e-2]} is two settings (lr is the first field): every
    field counts, not only the first; equal in every field is refused."""
    check_distinct_points(HParams.from_grid({"lr": [0.1, 0.1], "beta": [1e-3, 1e-2]}))
    check_distinct_points(HParams.from_grid({"lr": 0.1, "sarsa_alpha": [0.5, 0.25]}))
    with pytest.raises(ValueError, match="grid points 1 and 2 are the same setting"):
        check_distinct_points(
            HParams.from_grid({"lr": [0.1, 0.2, 0.2], "beta": [1e-3, 1e-2, 1e-2]})
        )


def test_axes_of_different_lengths_are_refused_by_name():
    """Two grid axes of lengths 2 and 3 are the library's own error (with the shapes), not
    NumPy's broadcast message."""
    with pytest.raises(ValueError, match=r"grid axes must have one length.*'beta': \(3,\)"):
        HParams.from_grid({"lr": [0.1, 0.2], "beta": [1e-3, 1e-2, 1e-1]})


def test_an_empty_axis_is_refused_by_name():
    """An empty axis is 'grid axis [...] is empty', beside a scalar or alone."""
    for grid in ({"lr": []}, {"lr": [], "beta": 1e-3}):
        with pytest.raises(ValueError, match=r"grid axis \['lr'\] is empty"):
            HParams.from_grid(grid)


def test_validate_keywords_reach_validate():
    """``from_grid(grid, max_steps=20)`` refuses actor_steps 30 (a traced count above the
    trainer's max_steps would run as max_steps); 20 itself is kept."""
    with pytest.raises(ValueError, match="actor_steps"):
        GameHParams.from_grid({"actor_steps": [1, 30]}, max_steps=20)
    hp = GameHParams.from_grid({"actor_steps": [1, 20]}, max_steps=20)
    assert hp.actor_steps.tolist() == [1, 20] and hp.actor_steps.dtype == jnp.int32


@pytest.mark.parametrize("steps", [2.5, 0.5, -0.25])
def test_check_representable_refuses_a_fractional_step_count(steps):
    """check_representable alone (the method, no validate): a step count that is not a whole
    number would be truncated by the int32 cast."""
    with pytest.raises(ValueError, match="actor_steps = .* not a whole number"):
        GameHParams(actor_steps=steps).check_representable(jnp.float32)
    with pytest.raises(ValueError, match="critic_steps = .* not a whole number"):
        GameHParams(critic_steps=np.array([1.0, steps])).check_representable(jnp.float32)
    GameHParams(actor_steps=3.0, critic_steps=np.array([0.0, 7.0])).check_representable(jnp.float32)


@pytest.mark.parametrize("values", [[True, False], ["0.1", "0.01"]])
def test_bool_and_string_grid_values_are_refused(values):
    """NumPy reads True as 1 and "0.1" as 0.1: a grid of either is refused by its kind, not
    run as the numbers it happens to convert to."""
    with pytest.raises(ValueError, match="strings and bools are not read as hyperparameters"):
        HParams.from_grid({"lr": values})
    with pytest.raises(ValueError, match="strings and bools"):
        GameHParams.from_grid({"actor_steps": [True, True]})
