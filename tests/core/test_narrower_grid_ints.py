"""``core.hparams.warn_narrower_grid``: only floating grid arrays are compared with the trainer's
dtype; integer grids (Python ints, int arrays) pass without a warning or an error, and a float32
array in a float64 trainer is still flagged."""

import warnings

import numpy as np
import pytest

from bchg_jax.core.hparams import warn_narrower_grid


def test_integer_grids_are_not_compared_with_the_float_dtype():
    """{"lr": [1, 2]} of Python ints and an int64 array: no warning, no error."""
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        warn_narrower_grid({"lr": [1, 2]}, np.float64)
        warn_narrower_grid({"lr": np.array([1, 2], np.int64), "beta": [0.1]}, np.float32)


def test_a_float32_grid_in_a_float64_trainer_still_warns():
    """The filter keeps the float check: float32 values in a float64 trainer warn, by name."""
    with pytest.warns(UserWarning, match=r"\['lr'\]"):
        warn_narrower_grid({"lr": np.array([0.1], np.float32), "k": [1, 2]}, np.float64)
