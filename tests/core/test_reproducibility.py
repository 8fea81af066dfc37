"""Same seed and configuration give bit-identical metrics on CPU; chunked runs never retrace.

For each experiment's trainer: two fresh runs of the same small grid are compared with
``np.array_equal`` (every metric, every grid point and seed), and the jitted chunk function is
compiled once for all chunks (a retrace between chunks would recompile the whole outer loop;
this caught a weakly-typed buffer counter in the game trainers).
"""

import jax
import numpy as np
import pytest

from bchg_jax.core.sweep import grid_functions, grid_hparams, run_grid, seed_keys


def _trainers():
    from bchg_jax.games.lqr.config import EstimatorConfig as LQRGameEstimator
    from bchg_jax.games.lqr.config import ExplorationConfig as LQRGameExploration
    from bchg_jax.games.lqr.config import TrainConfig as LQRGameTrainConfig
    from bchg_jax.games.lqr.train import make_train as make_train_lqr_game
    from bchg_jax.games.tabular.train import TrainConfig as GameTrainConfig
    from bchg_jax.games.tabular.train import make_train as make_train_game
    from bchg_jax.lq.train import TrainConfig as LQTrainConfig
    from bchg_jax.lq.train import make_train as make_train_lq
    from bchg_jax.problems.fourrooms import fourrooms
    from bchg_jax.problems.lqr_game import lqr_game
    from bchg_jax.problems.thermal import thermal
    from bchg_jax.problems.toy_game import toy_game
    from bchg_jax.tabular.train import TrainConfig, make_train

    return {
        "fourrooms": (
            make_train(fourrooms(), "bchg", TrainConfig(num_steps=20, iterations=4)),
            {
                "lr": np.array([0.1, 0.3]),
                "sarsa_alpha": np.array([0.5, 0.5]),
                "beta": np.array([1e-3, 1e-3]),
            },
        ),
        "thermal": (
            make_train_lq(thermal(), "bchg", LQTrainConfig(num_episodes=8, iterations=4)),
            {"lr": np.array([0.1])},
        ),
        "toy_game": (
            make_train_game(toy_game(), "bchg", GameTrainConfig(iterations=4)),
            {"actor_steps": np.array([1, 2]), "critic_steps": np.array([1, 1])},
        ),
        "lqr_game": (
            make_train_lqr_game(
                lqr_game(),
                "bchg",
                LQRGameTrainConfig(
                    iterations=4,
                    exploration=LQRGameExploration(warmup_steps=400),
                    minibatch=16,
                    estimator=LQRGameEstimator(benefit_samples=8, baseline_samples=4),
                ),
            ),
            {"actor_steps": np.array([1, 3])},
        ),
    }


@pytest.mark.slow
@pytest.mark.parametrize("name", ["fourrooms", "thermal", "toy_game", "lqr_game"])
def test_same_seed_same_bits_and_one_compile(name):
    trainer, grid = _trainers()[name]
    init, run = grid_functions(trainer)
    hp = grid_hparams(trainer, grid)

    def go(seed):  # 4 iterations in 2 chunks from a fresh state, as run_grid does
        state, out = init(seed_keys(2, seed), hp), []
        for _ in range(2):
            state, m = run(state, hp, 2)
            out.append(jax.tree.map(np.asarray, m))
        return {k: np.concatenate([o[k] for o in out], -1) for k in out[0]}

    m1, m2, m3 = go(0), go(0), go(1)
    assert set(m1) == set(m2)
    for k in m1:
        assert np.array_equal(m1[k], m2[k], equal_nan=True), k
    assert not np.array_equal(m1["J"], m3["J"])  # the seed does matter
    assert run._cache_size() == 1  # every chunk reused one compilation


@pytest.mark.slow
def test_run_grid_chunking_is_invisible():
    """run_grid in chunks of 2 (the program of the test above) and in one chunk give the same
    bits (the lqr game trainer)."""
    trainer, grid = _trainers()["lqr_game"]
    _, a = run_grid(trainer, grid, seeds=2, iterations=4, chunk=2, verbose=False)
    _, b = run_grid(trainer, grid, seeds=2, iterations=4, chunk=4, verbose=False)
    for k in a:
        assert np.array_equal(a[k], b[k], equal_nan=True), k


@pytest.mark.slow
@pytest.mark.parametrize("family", ["tabular", "lq"])
def test_float32_run_is_the_same_with_x64_on_or_off(family):
    """Random draws and constants take the run's dtype, not JAX's default float."""
    from bchg_jax import lq, problems, tabular

    def run():
        if family == "tabular":
            t = tabular.make_train(problems.fourrooms(), "bchg", tabular.TrainConfig(iterations=4))
            hp = tabular.HParams(0.1, 0.5, 1e-3)
        else:
            t = lq.make_train(
                problems.thermal(), "bchg", lq.TrainConfig(iterations=3, num_episodes=4)
            )
            hp = lq.HParams(0.1, 0.1)
        return np.asarray(t.train(jax.random.key(0), hp)[1]["J"])

    off = run()
    with jax.enable_x64(True):
        on = run()
    assert on.dtype == np.float32
    np.testing.assert_array_equal(off, on)


@pytest.mark.slow
@pytest.mark.parametrize("name", ["fourrooms", "thermal", "toy_game", "lqr_game"])
def test_a_float32_run_draws_32_bit_randomness_under_x64(name):
    """Every random draw of a float32 run takes 32-bit bits with jax_enable_x64 on too (tracing
    only). The game trainers' minibatch indices were drawn as int64 there (64-bit bits: other
    indices, so other runs); the float32 runs of the game trainers still differ in the last bits
    with x64 on, through optax's Adam (docs/architecture.md, "dtype")."""
    from bchg_jax.core.precision import jaxpr_eqns

    with jax.enable_x64(True):
        trainer, grid = _trainers()[name]
        init, run = grid_functions(trainer)
        hp = grid_hparams(trainer, grid)
        state = init(seed_keys(2, 0), hp)
        jaxpr = jax.make_jaxpr(lambda s: run(s, hp, 1))(state)
    draws = jaxpr_eqns(jaxpr, {"random_bits"})
    assert draws, "no random draw found: the check would pass vacuously"
    wide = {str(v.aval) for e in draws for v in e.outvars if v.aval.dtype.itemsize > 4}
    assert not wide, f"64-bit random draws under x64: {sorted(wide)}"
