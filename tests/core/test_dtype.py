"""The dtype follows theta (tabular, LQ: the problem's theta0; games: config.dtype): a float64
run keeps every floating leaf of the state and every metric in float64, and its first exact
objective agrees with the float32 run's (same start, no initial noise) to float32 accuracy."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from bchg_jax import lq, tabular
from bchg_jax.games import lqr
from bchg_jax.games import tabular as tgame
from bchg_jax.problems import fourrooms, lqr_game, thermal, toy_game


def _run(family, dtype):
    if family == "tabular":
        tr = tabular.make_train(
            fourrooms(dtype=dtype),
            "bchg",
            tabular.TrainConfig(num_steps=20, iterations=2, theta_init_std=0.0),
        )
        hp = tabular.HParams(0.1, 0.5, 1e-2)
    elif family == "lq":
        tr = lq.make_train(
            thermal(dtype=dtype, horizon=88),  # the shortest the 0.9 discounts allow (1e-3)
            "bchg",
            lq.TrainConfig(num_episodes=2, iterations=2, weights_init_std=0.0),
        )
        hp = lq.HParams(0.1, 0.1)
    elif family == "games.tabular":
        game = dataclasses.replace(toy_game(), time_limit=30)
        tr = tgame.make_train(
            game,
            "bchg",
            tgame.TrainConfig(iterations=2, actor="tabular", dtype=jnp.dtype(dtype).name),
        )
        hp = tgame.HParams(1, 1, 0.05)
    else:
        tr = lqr.make_train(
            lqr_game(horizon=20),
            "bchg",
            lqr.TrainConfig(
                iterations=2,
                exploration=lqr.ExplorationConfig(warmup_steps=0),
                actor=lqr.ActorConfig(theta0_std=0.0),
                estimator=lqr.EstimatorConfig(benefit_samples=16, baseline_samples=4),
                dtype=jnp.dtype(dtype).name,
            ),
        )
        hp = lqr.HParams(0, 5, 0.1)  # the leader stays at theta = 0: J comparable
    return jax.jit(tr.train)(jax.random.key(1), hp)


def _float_dtypes(tree):
    return {
        jnp.dtype(x.dtype).name
        for x in jax.tree.leaves(tree)
        if jnp.issubdtype(x.dtype, jnp.floating)
    }


@pytest.mark.slow
@pytest.mark.parametrize("family", ["tabular", "lq", "games.tabular", "games.lqr"])
def test_float64_run_stays_float64(family, x64):
    state, metrics = _run(family, jnp.float64)
    assert _float_dtypes(state) == {"float64"}
    assert _float_dtypes(metrics) == {"float64"}
    state32, metrics32 = _run(family, jnp.float32)
    assert _float_dtypes(metrics32) == {"float32"}
    J64, J32 = np.asarray(metrics["J"]), np.asarray(metrics32["J"])
    np.testing.assert_allclose(J32[0], J64[0], rtol=2e-3, atol=1e-4)


def test_a_float32_grid_in_a_float64_trainer_is_warned_about(x64):
    """np.float32(0.1) is 0.10000000149: a float32 grid array fed to a float64 trainer keeps that
    rounding (an audit measured J 7e-9 apart from the same grid as Python floats), which the
    printed grid does not show; Python floats, float64 arrays and integer step counts pass."""
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error", UserWarning)
        hp = tabular.HParams.from_grid({"lr": [0.1, 0.5]}, dtype=jnp.float64)
        tabular.HParams.from_grid({"lr": np.array([0.1, 0.5])}, dtype=jnp.float64)
        tabular.HParams.from_grid({"lr": np.float32([0.1, 0.5])}, dtype=jnp.float32)
        tgame.HParams.from_grid({"actor_steps": np.int16([1, 2])}, dtype=jnp.float64)
    assert float(hp.lr[0]) == 0.1
    with pytest.warns(UserWarning, match=r"\['lr'\] are float32 arrays.*float64"):
        narrow = tabular.HParams.from_grid({"lr": np.float32([0.1, 0.5])}, dtype=jnp.float64)
    assert float(narrow.lr[0]) == float(np.float32(0.1))  # the values are those given
