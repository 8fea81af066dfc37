"""Continuing a run from the library API: pieces that disagree are refused, not run.

An audit of the scale-out layer found these silently accepted: ``run_grid`` given a ``start``
that was not the state's step or the metrics' length (a curve of another length, or another
run's), ``load_state(grow=True)`` completing a checkpoint of fewer seeds with runs at iteration
0, ``load_state`` casting a float32 checkpoint into a float64 state, a damaged checkpoint
reported as a write failure, repeated or fractional seed indices, and a second save of the same
step failing deep inside orbax.
"""

from __future__ import annotations

import json
import os
import shutil

import jax
import numpy as np
import pytest

from bchg_jax.core.io import load_state, save_state
from bchg_jax.core.sweep import run_grid, seed_keys, state_template
from bchg_jax.problems.random_tabular import random_tabular_cmdp
from bchg_jax.tabular import TrainConfig, make_train

GRID = {"lr": [0.1], "sarsa_alpha": [0.5], "beta": [0.3]}


@pytest.fixture(scope="module")
def trainer():
    prob = random_tabular_cmdp(jax.random.key(1), num_states=5, num_actions=3, time_limit=20)
    return make_train(prob, "bchg", TrainConfig(num_steps=10, iterations=12))


@pytest.mark.slow
def test_run_grid_refuses_a_start_that_is_not_the_state_or_the_metrics(trainer):
    state, metrics = run_grid(trainer, GRID, 2, 8, chunk=4, verbose=False)
    cut = {k: v[:, :, :4] for k, v in metrics.items()}
    with pytest.raises(ValueError, match=r"state is at iteration \[8\], not start=4"):
        run_grid(trainer, GRID, 2, 12, state=state, start=4, metrics=cut, verbose=False)
    with pytest.raises(ValueError, match=r"metrics\['J'\] must be \[G, N, start, \.\.\.\]"):
        run_grid(trainer, GRID, 2, 12, state=state, start=8, metrics=cut, verbose=False)
    with pytest.raises(ValueError, match="pass its state too"):
        run_grid(trainer, GRID, 2, 12, start=8, metrics=metrics, verbose=False)
    with pytest.raises(ValueError, match=r"\[G, N, \.\.\.\] = \[1, 3, \.\.\.\]"):
        run_grid(trainer, GRID, 3, 12, state=state, start=8, metrics=metrics, verbose=False)
    # the consistent continuation is the straight run, bit for bit
    _, joined = run_grid(trainer, GRID, 2, 12, state=state, start=8, metrics=metrics, verbose=False)
    _, straight = run_grid(trainer, GRID, 2, 12, chunk=4, verbose=False)
    np.testing.assert_array_equal(joined["J"], straight["J"])


@pytest.mark.slow
def test_load_state_never_grows_the_run_axes_and_keeps_the_dtype(trainer, tmp_path):
    ckpt = str(tmp_path / "c")
    state, _ = run_grid(trainer, GRID, 2, 4, chunk=4, verbose=False)
    save_state(ckpt, state, 4)
    # fewer seeds or grid points: refused even with grow=True (they were added at iteration 0)
    for seeds, grid in ((3, GRID), (2, {k: v * 2 for k, v in GRID.items()})):
        with pytest.raises(ValueError, match="has shape"):
            load_state(ckpt, state_template(trainer, grid, seeds), grow=True)
    # the saved runs restore exactly
    back = load_state(ckpt, state_template(trainer, GRID, 2), grow=True)
    for a, b in zip(jax.tree.leaves(back), jax.tree.leaves(state), strict=True):
        if jax.dtypes.issubdtype(a.dtype, jax.dtypes.prng_key):
            a, b = jax.random.key_data(a), jax.random.key_data(b)
        np.testing.assert_array_equal(a, b)
    # another float dtype is refused unless asked for
    with jax.enable_x64(True):
        wide = jax.tree.map(
            lambda x: np.asarray(x, np.float64) if x.dtype == np.float32 else x,
            state_template(trainer, GRID, 2),
        )
        with pytest.raises(ValueError, match=r"is float32, expected float64.*cast=True"):
            load_state(ckpt, wide)
        cast = load_state(ckpt, wide, cast=True)
        assert cast.theta.dtype == np.float64


@pytest.mark.slow
def test_a_damaged_checkpoint_and_a_repeated_step_are_named(trainer, tmp_path):
    ckpt = str(tmp_path / "c")
    state, _ = run_grid(trainer, GRID, 2, 4, chunk=4, verbose=False)
    save_state(ckpt, state, 4)
    with pytest.raises(ValueError, match="already holds step 4"):
        save_state(ckpt, state, 4)
    save_state(ckpt, state, 8)  # another step replaces it
    shutil.rmtree(os.path.join(ckpt, "8", "meta"))
    with pytest.raises(ValueError, match=r"checkpoint .* \(step 8\) is damaged or unreadable"):
        load_state(ckpt, state_template(trainer, GRID, 2))


@pytest.mark.parametrize(
    "seeds, match",
    [
        ([0.5, 1.7], "must be integer seed indices"),
        ([1, 1], "must be distinct"),
        (True, "a count or a sequence"),
        (np.array([[0, 1]]), "must be integer seed indices"),
    ],
)
def test_seed_keys_refuses_seeds_that_are_not_distinct_integers(seeds, match):
    with pytest.raises(ValueError, match=match):
        seed_keys(seeds)


def test_seed_keys_of_given_indices_are_those_of_the_count():
    np.testing.assert_array_equal(
        jax.random.key_data(seed_keys([0, 2])), jax.random.key_data(seed_keys(3)[::2])
    )


@pytest.mark.parametrize(
    "seeds, base_seed",
    [(2, 2**32 + 1), (2, -1), (2, 1.0), ([2**32], 0), ([-1], 0), (np.array([2**63], np.uint64), 0)],
)
def test_seed_keys_refuses_seeds_that_jax_reads_as_other_seeds(seeds, base_seed):
    """JAX reads a seed as a 32-bit word: without x64, base seed 2**32 + 1 gave base seed 1's
    keys (with x64 other ones), index 2**32 gave index 0's, and a negative base seed gave keys
    that changed with x64; each is now refused."""
    with pytest.raises(ValueError, match=r"in \[0, 2\*\*32 - 1\]"):
        seed_keys(seeds, base_seed)


def test_seed_keys_at_the_ends_of_the_seed_range_are_the_same_under_x64():
    def data():
        return np.asarray(jax.random.key_data(seed_keys([0, 2**32 - 1], 2**32 - 1)))

    off = data()
    with jax.enable_x64(True):
        on = data()
    np.testing.assert_array_equal(off, on)
    assert not np.array_equal(off[0], off[1])


@pytest.mark.slow
def test_a_resume_under_another_x64_setting_is_refused(tmp_path, capsys):
    from experiments import fourrooms

    run = str(tmp_path / "r")
    argv = ["--smoke", "--method", "bchg", "--iterations", "2", "--out", run, "--exact-out"]
    fourrooms.main(argv)
    cfg_path = os.path.join(run, "config.json")
    with open(cfg_path) as f:
        cfg = json.load(f)
    assert cfg["jax_enable_x64"] is bool(jax.config.jax_enable_x64)
    cfg["jax_enable_x64"] = not cfg["jax_enable_x64"]  # as if started under the other setting
    with open(cfg_path, "w") as f:
        json.dump(cfg, f)
    with pytest.raises(SystemExit) as e:
        fourrooms.main(["--resume", run, "--iterations", "4"])
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert "started with jax_enable_x64" in err and "JAX_ENABLE_X64=" in err, err
    # the same command again (--exact-out re-opens the run and continues its stopped methods
    # from their checkpoints) went on under the other setting unsaid (an audit: 3e-4 in J)
    with pytest.raises(SystemExit) as e:
        fourrooms.main(argv)
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert f"--out {run} --exact-out: the run was started with jax_enable_x64" in err, err
