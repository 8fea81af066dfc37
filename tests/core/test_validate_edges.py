"""``core.validate``'s shared checks at their edges: a ``positive`` config field refuses 0 and a
``unit`` one refuses 0 and accepts 1; a singular Rbar is refused; a failed constants check is
refused on every call (not cached as passed); a transition's first and last axes must agree; a
NaN is not in [0, 1]."""

import dataclasses

import numpy as np
import pytest
from small_problems import lq

from bchg_jax.core.validate import (
    check_closed_unit_interval,
    check_config,
    check_constants_once,
    check_costs,
    transition_sizes,
)


@dataclasses.dataclass(frozen=True)
class Cfg:
    lr: float = 1e-3
    ridge: float = 0.0


def test_a_positive_config_field_refuses_zero_and_a_nonnegative_one_accepts_it():
    check_config(Cfg(), positive=("lr",), nonneg=("ridge",))
    with pytest.raises(ValueError, match=r"Cfg\.lr must be > 0, got 0\.0"):
        check_config(Cfg(lr=0.0), positive=("lr",), nonneg=("ridge",))
    with pytest.raises(ValueError, match=r"Cfg\.ridge must be >= 0"):
        check_config(Cfg(ridge=-1e-9), positive=("lr",), nonneg=("ridge",))


def test_a_singular_action_cost_is_refused():
    check_costs("lq", np.eye(2), np.eye(1))
    check_costs("lq", np.zeros((2, 2)), np.eye(1))  # Qbar PSD is enough
    for R in (np.zeros((1, 1)), np.diag([1.0, 0.0])):
        with pytest.raises(ValueError, match="Rbar must be symmetric positive definite"):
            check_costs("lq", np.eye(2), R)


def test_a_failed_constants_check_is_not_remembered_as_passed():
    bad = lq(Rbar=-np.eye(1))
    for _ in range(2):
        with pytest.raises(ValueError, match="Rbar"):
            check_constants_once(bad)
    check_constants_once(lq())


def test_a_transition_whose_first_and_last_axes_differ_is_refused():
    assert transition_sizes("P", np.zeros((3, 2, 3))) == (3, 2)
    with pytest.raises(ValueError, match=r"P must have shape \[S, B, S\], got \(3, 2, 4\)"):
        transition_sizes("P", np.zeros((3, 2, 4)))
    with pytest.raises(ValueError, match=r"game: transition must have shape \[S, A, B, S\]"):
        transition_sizes("game: transition", np.zeros((2, 2, 2, 3)), "[S, A, B, S]")


def test_a_nan_is_not_in_the_closed_unit_interval():
    check_closed_unit_interval("p", np.array([0.0, 0.5, 1.0]))
    for bad in (float("nan"), np.array([0.5, np.nan]), float("inf")):
        with pytest.raises(ValueError, match="p must have every entry in"):
            check_closed_unit_interval("p", bad)


@dataclasses.dataclass(frozen=True)
class Mix:
    mix: float = 0.5


def test_a_unit_config_field_refuses_zero_and_accepts_one():
    check_config(Mix(1.0), unit=("mix",))
    for bad in (0.0, 0, -0.1, 1.5):
        with pytest.raises(ValueError, match=r"Mix\.mix must be in \(0, 1\]"):
            check_config(Mix(bad), unit=("mix",))
