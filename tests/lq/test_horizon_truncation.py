"""The LQ trainer refuses episodes too short for its infinite-horizon critics: with the discount
weight beyond the cut at T not negligible the estimate would target neither the T-step J_L nor
the infinite-horizon one."""

import dataclasses

import pytest

from bchg_jax.lq.train import METHODS, TRUNCATION_TOL, TrainConfig, check_truncation, make_train
from bchg_jax.problems.thermal import thermal


@pytest.mark.parametrize("method", [m for m in METHODS if m != "exact"])
def test_short_horizon_is_refused_before_compiling(method):
    with pytest.raises(ValueError, match=r"horizon 20 is too short.*at least 88 steps"):
        make_train(thermal(horizon=20), method, TrainConfig(iterations=2))


def test_long_enough_horizons_and_the_exact_method_pass():
    make_train(thermal(horizon=20), "exact", TrainConfig(iterations=2))  # samples nothing
    for method in METHODS:
        make_train(thermal(), method, TrainConfig(iterations=2))  # the default: 0.9^100
    make_train(thermal(horizon=88), "bchg", TrainConfig(iterations=2))  # weight 9.2e-4
    with pytest.raises(ValueError, match="too short"):
        make_train(thermal(horizon=87), "bchg", TrainConfig(iterations=2))


def test_the_larger_discount_decides():
    p = dataclasses.replace(thermal(), gamma_L=0.5, gamma_F=0.95, horizon=100)
    assert 0.95**100 > TRUNCATION_TOL and 0.95**135 < TRUNCATION_TOL  # the weight needs 136
    with pytest.raises(ValueError, match="gamma_F = 0.95"):
        check_truncation(p, "naive")
    check_truncation(dataclasses.replace(p, horizon=136), "naive")
