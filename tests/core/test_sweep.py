"""sweep.py: sharding the runs over devices gives the unsharded results; checkpoint round trip."""

import logging
import os
import subprocess
import sys
import textwrap

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from bchg_jax.core.io import load_state, save_state
from bchg_jax.core.sweep import grid_functions, product_grid, run_grid, seed_keys
from bchg_jax.problems import random_tabular_cmdp
from bchg_jax.tabular import TrainConfig, make_train

SHARD_SCRIPT = textwrap.dedent("""
    import jax, jax.numpy as jnp, numpy as np
    from bchg_jax.tabular import TrainConfig, make_train
    from bchg_jax.problems import random_tabular_cmdp
    from bchg_jax.core.sweep import product_grid, run_grid
    assert len(jax.devices()) == 4, jax.devices()
    # float64: different per-device batch shapes may round float32 GEMMs differently
    prob = random_tabular_cmdp(jax.random.key(0), num_states=5, num_actions=3, time_limit=20,
                               dtype=jnp.float64)
    for method in ("hpgd_oracle",):      # the oracle batch: the largest per-run state
        tr = make_train(prob, method, TrainConfig(num_envs=2, num_steps=20, iterations=12,
                                                  oracle_envs=2, oracle_steps=20))
        grid = product_grid(lr=[0.1, 0.05, 0.2], sarsa_alpha=[0.5], beta=[0.3])  # 3 x 3 = 9 runs
        _, a = run_grid(tr, grid, 3, 12, chunk=5, verbose=False)
        _, b = run_grid(tr, grid, 3, 12, chunk=5, verbose=False, shard=True)
        assert a["J"].shape == b["J"].shape == (3, 3, 12)
        np.testing.assert_allclose(a["J"], b["J"], rtol=1e-10, atol=1e-12)
        np.testing.assert_array_equal(a["sweeps"], b["sweeps"])
    print("SHARDED_OK")
""")


@pytest.mark.slow
def test_sharded_grid_equals_unsharded_on_four_cpu_devices():
    env = dict(
        os.environ,
        XLA_FLAGS="--xla_force_host_platform_device_count=4",
        JAX_PLATFORMS="cpu",
        JAX_ENABLE_X64="1",
    )
    out = subprocess.run(
        [sys.executable, "-c", SHARD_SCRIPT],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
        cwd=os.path.join(os.path.dirname(__file__), "..", ".."),
    )
    assert out.returncode == 0, out.stderr[-3000:]
    assert "SHARDED_OK" in out.stdout


@pytest.mark.slow
def test_resumed_run_equals_uninterrupted_run(tmp_path):
    prob = random_tabular_cmdp(jax.random.key(1), num_states=5, num_actions=3, time_limit=20)
    tr = make_train(prob, "bchg", TrainConfig(num_envs=1, num_steps=20, iterations=30))
    grid = product_grid(lr=[0.1, 0.05], sarsa_alpha=[0.5], beta=[0.3])
    # one chunk length throughout (one compile); other chunkings: test_reproducibility
    _, full = run_grid(tr, grid, 2, 30, chunk=6, verbose=False)
    state, part = run_grid(tr, grid, 2, 12, chunk=6, verbose=False)  # "stopped" at 12
    save_state(str(tmp_path / "ckpt"), state)
    restored = load_state(str(tmp_path / "ckpt"), state)
    assert jax.random.key_impl(restored.key) == jax.random.key_impl(state.key)
    _, rest = run_grid(
        tr, grid, 2, 30, chunk=6, verbose=False, state=restored, start=12, metrics=part
    )
    assert rest["J"].shape == (2, 2, 30)
    for k in full:
        assert np.array_equal(rest[k], full[k]), k  # bit-identical after the restore


@pytest.mark.slow
def test_checkpoint_shape_mismatch_is_a_clear_error(tmp_path):
    prob = random_tabular_cmdp(jax.random.key(1), num_states=5, num_actions=3, time_limit=20)
    tr = make_train(prob, "bchg", TrainConfig(num_steps=10, iterations=3))
    init, _ = grid_functions(tr)
    hp = tr.hparams(product_grid(lr=[0.1], sarsa_alpha=[0.5], beta=[0.3]))
    s2, s3 = init(seed_keys(2), hp), init(seed_keys(3), hp)  # 2 and 3 seeds
    save_state(str(tmp_path / "c"), s2)
    try:
        load_state(str(tmp_path / "c"), s3)
    except ValueError as err:
        assert "shape" in str(err)
    else:
        raise AssertionError("loading a checkpoint of another shape must fail")


def test_join_chunks_joins_along_the_iteration_axis_of_metrics_with_trailing_axes():
    from bchg_jax.core.sweep import join_chunks

    G, N = 2, 3
    a = {"J": np.zeros((G, N, 4)), "g_S": np.zeros((G, N, 4, 3))}
    b = {"J": np.ones((G, N, 5)), "g_S": np.ones((G, N, 5, 3)), "new": np.ones((G, N, 5, 2))}
    out = join_chunks([a, b])
    assert out["J"].shape == (G, N, 9) and out["g_S"].shape == (G, N, 9, 3)
    np.testing.assert_array_equal(out["g_S"][:, :, 4:], 1.0)
    np.testing.assert_array_equal(out["g_S"][:, :, :4], 0.0)
    # a float metric the earlier chunk lacks is NaN there (not recorded), with its own axes
    assert out["new"].shape == (G, N, 9, 2) and np.isnan(out["new"][:, :, :4]).all()


def test_run_grid_refuses_more_iterations_than_an_iteration_sized_trainer_holds():
    """A toy-game trainer made for 4 iterations with an off-policy buffer (4 batches) ran 8
    in ``run_grid`` without a word: past iteration 4 every batch overwrote the last slots, and
    J differed from a trainer made for 8 (by 5e-3 at iteration 5). A cosine learning rate is
    also sized by ``config.iterations``; trainers whose state is not have no limit."""
    from bchg_jax.games.lqr.config import ActorConfig
    from bchg_jax.games.lqr.config import TrainConfig as LQRGameConfig
    from bchg_jax.games.tabular.train import TrainConfig as GameConfig
    from bchg_jax.games.tabular.train import make_train as make_train_game
    from bchg_jax.problems.toy_game import toy_game

    off = make_train_game(toy_game(), "bchg", GameConfig(iterations=4, buffer="off"))
    with pytest.raises(ValueError, match="made for 4 iterations"):
        run_grid(off, {"actor_steps": [1]}, 2, 8, verbose=False)
    assert GameConfig(iterations=4, buffer="off").iteration_limit() == 4
    assert GameConfig(iterations=4).iteration_limit() is None  # on-policy: the newest batch
    cosine = LQRGameConfig(iterations=4, actor=ActorConfig(lr_schedule="cosine"))
    assert cosine.iteration_limit() == 4 and LQRGameConfig(iterations=4).iteration_limit() is None


def test_seeds_must_be_a_positive_int():
    """``seeds=2.5`` ran 2 seeds silently; now any seed count that is not a positive int is a
    clear error, before anything is built or run."""
    from bchg_jax.core.sweep import state_template

    prob = random_tabular_cmdp(jax.random.key(1), num_states=5, num_actions=3, time_limit=20)
    tr = make_train(prob, "bchg", TrainConfig(num_steps=10, iterations=3))
    grid = {"beta": [0.3]}
    for seeds in (2.5, 0, -1, True, "2"):
        with pytest.raises(ValueError, match="seeds must be a positive int"):
            run_grid(tr, grid, seeds, 3, verbose=False)
        with pytest.raises(ValueError, match="seeds must be a positive int"):
            state_template(tr, grid, seeds)
    assert state_template(tr, grid, np.int64(2)).theta.shape[:2] == (1, 2)


@pytest.mark.slow
def test_grid_values_that_the_dtype_rounds_to_zero_or_inf_are_refused(x64):
    """``beta = 1e-46`` is > 0 in float64 (validate passes) but 0 in float32: the float32
    trainer's grid refuses it (and a subnormal 1e-40, and lr 1e39 -> inf); a float64 grid keeps
    it."""
    prob = random_tabular_cmdp(jax.random.key(1), num_states=5, num_actions=3, time_limit=20)
    tr = make_train(prob, "bchg", TrainConfig(num_steps=10, iterations=3))
    for grid in ({"beta": [0.3, 1e-46]}, {"beta": 1e-40}, {"lr": [1e39]}):
        with pytest.raises(ValueError, match="does not fit in float32"):
            tr.hparams(grid)
        with pytest.raises(ValueError, match="does not fit in float32"):
            run_grid(tr, grid, 1, 3, verbose=False)
    from bchg_jax.tabular import HParams

    assert float(HParams.from_grid({"beta": 1e-46}, jnp.float64).beta[0]) == 1e-46
    HParams(beta=1e-46).check_representable(jnp.float64)
    with pytest.raises(ValueError, match="beta = 1e-46 does not fit in float32"):
        HParams(beta=1e-46).check_representable(jnp.float32)
    # one run's HParams given to the float32 trainer directly (build_trainer's check)
    with pytest.raises(ValueError, match="beta = 1e-46 does not fit in float32"):
        tr.train(jax.random.key(0), HParams(beta=1e-46))


@pytest.mark.parametrize("steps", [1e10, 2.0**31, np.inf, 2**33])
def test_step_counts_that_int32_cannot_hold_are_refused_not_wrapped(steps):
    """A game's ``actor_steps`` of 1e10 (or inf, or 2**31) was cast to int32 -2147483648, and
    2**33 to 0: the run took no actor step, without a word (``HParams.from_grid`` without the
    trainer's ``max_steps``, as the library's grid functions take it)."""
    from bchg_jax.games.tabular.train import HParams

    with pytest.raises(ValueError, match="actor_steps = .* int32"):
        HParams.from_grid({"actor_steps": [1, steps]})
    with pytest.raises(ValueError, match="actor_steps = .* int32"):
        HParams(actor_steps=steps).check_representable(jnp.float32)
    hp = HParams.from_grid({"actor_steps": [0, 2**31 - 1]})  # int32's own range is kept
    assert hp.actor_steps.dtype == jnp.int32 and int(hp.actor_steps[1]) == 2**31 - 1


@pytest.mark.slow
def test_progress_line_marks_every_compiling_chunk_and_never_picks_a_nan_point(capsys):
    """The last, shorter chunk compiles again (a new static length): its rate said nothing of
    it. A diverged (NaN) grid point was reported as the best (np.argmax returns the first NaN),
    while the summary never picks one."""
    from bchg_jax.core.sweep import progress_line

    prob = random_tabular_cmdp(jax.random.key(0), num_states=5, num_actions=3, time_limit=10)
    tr = make_train(prob, "naive", TrainConfig(num_envs=2, num_steps=10, iterations=11))
    grid = product_grid(lr=[0.1], sarsa_alpha=[0.5], beta=[0.3])
    run_grid(tr, grid, 1, 11, chunk=5, verbose=True)
    lines = [x for x in capsys.readouterr().out.splitlines() if "iter" in x]
    assert ["incl. compile" in x for x in lines] == [True, False, True], lines
    J = np.stack([np.full((2, 3), 0.1), np.full((2, 3), np.nan), np.full((2, 3), 0.7)])
    assert "grid point 2" in progress_line(J, 3, 3, 3, 1.0, False, 1.0, window=2)


def test_a_save_removes_the_folder_an_interrupted_save_left(tmp_path, caplog):
    """A kill while step 80 was written leaves ``80.orbax-checkpoint-tmp-...``; a resume with
    another chunk never writes step 80 again, and the folder (a whole copy of the state) stayed
    for good. The next save removes it and keeps the checkpoint."""
    from bchg_jax.core.io import checkpoint_step, load_state, save_state

    ckpt = str(tmp_path / "checkpoint")
    state = {"x": jnp.arange(3.0)}
    save_state(ckpt, state, 60)
    stale = os.path.join(ckpt, "80.orbax-checkpoint-tmp-1234")
    os.makedirs(os.path.join(stale, "arrays"))
    save_state(ckpt, {"x": jnp.arange(3.0) + 1}, 75)
    assert not os.path.exists(stale) and checkpoint_step(ckpt) == 75
    np.testing.assert_array_equal(load_state(ckpt, state)["x"], [1.0, 2.0, 3.0])
    # the same chunk again (a plain resume) writes the step it was killed in: the folder goes
    # before the save (orbax removed it itself, with an absl WARNING on every such resume)
    os.makedirs(os.path.join(ckpt, "90.orbax-checkpoint-tmp", "arrays"))
    with caplog.at_level(logging.WARNING):
        save_state(ckpt, {"x": jnp.arange(3.0) + 2}, 90)
    assert not [r for r in caplog.records if "orbax-checkpoint-tmp" in r.getMessage()]
    assert checkpoint_step(ckpt) == 90


def test_a_checkpoint_path_orbax_cannot_read_back_is_refused_before_saving(tmp_path):
    """Orbax gathers a saved state's parts with a glob of the folder's path, and tensorstore
    reads a backslash as a separator: under ``lr[0.1]/`` or ``a\\b/`` the save went through
    and every restore said the checkpoint was damaged, so the run could not be resumed. Such
    a path is refused before anything is written; other unusual names round-trip."""
    from bchg_jax.core.io import load_state, save_state

    state = {"x": jnp.arange(3.0)}
    for name in ("lr[0.1]", "a\\b"):
        ckpt = str(tmp_path / name / "checkpoint")
        with pytest.raises(ValueError, match="cannot read back"):
            save_state(ckpt, state, 5)
        assert not os.path.exists(ckpt)
    for name in ("lr[0.1", "a*b?", "spaced ü €", "x]y"):
        ckpt = str(tmp_path / name / "checkpoint")
        save_state(ckpt, {"x": jnp.arange(3.0) + 1}, 5)
        np.testing.assert_array_equal(load_state(ckpt, state)["x"], [1.0, 2.0, 3.0])


def test_run_grid_with_nothing_left_to_run_returns_empty_metrics():
    """run_grid(..., start=iterations) without metrics returned (state, None), not the
    documented [G, N, iterations - start, ...] metrics: a caller's metrics["J"] failed."""
    from typing import NamedTuple

    from bchg_jax.core.loop import Trainer, scan_loop

    class State(NamedTuple):
        step: jax.Array
        x: jax.Array

    def init(key, hp):
        return State(jnp.asarray(0, jnp.int32), jnp.zeros(()))

    def step(s, hp):
        return State(s.step + 1, s.x + hp["lr"]), {"J": s.x, "pi": jnp.zeros(3, jnp.float32)}

    run, train = scan_loop(init, step, 4)
    tr = Trainer(None, "toy", None, init, run, train, lambda g: {"lr": jnp.asarray(g["lr"])})
    grid = {"lr": np.array([0.1, 0.2])}
    state, m = run_grid(tr, grid, 3, 4, verbose=False)
    assert m["J"].shape == (2, 3, 4)
    again, rest = run_grid(tr, grid, 3, 4, state=state, start=4, verbose=False)
    assert again is state and set(rest) == {"J", "pi"}
    assert rest["J"].shape == (2, 3, 0) and rest["pi"].shape == (2, 3, 0, 3)
    assert rest["pi"].dtype == m["pi"].dtype
    _, same = run_grid(tr, grid, 3, 4, state=state, start=4, metrics=m, verbose=False)
    assert same is m  # the metrics given, as before
    # metrics={} is no earlier metrics, as None (it ended in a bare StopIteration)
    half, _ = run_grid(tr, grid, 3, 2, verbose=False)
    _, tail = run_grid(tr, grid, 3, 4, state=half, start=2, metrics={}, verbose=False)
    np.testing.assert_array_equal(tail["J"], m["J"][:, :, 2:])
    _, none = run_grid(tr, grid, 3, 4, state=state, start=4, metrics={}, verbose=False)
    assert none["J"].shape == (2, 3, 0)


@pytest.mark.parametrize("window", [0, -5, 2.5])
def test_a_progress_window_below_one_is_refused(window):
    """window=0 printed the mean since iteration 1 as "last 0 it" (J[..., -0:] is the whole
    run); a negative one dropped the first iterations. Refused, by run_grid before it compiles."""
    from bchg_jax.core.sweep import progress_line

    J = np.stack([np.full((2, 4), 0.1), np.full((2, 4), 0.7)])
    assert "last 2 it +0.7000" in progress_line(J, 4, 4, 4, 1.0, False, 1.0, window=2)
    with pytest.raises(ValueError, match="window must be an int >= 1"):
        progress_line(J, 4, 4, 4, 1.0, False, 1.0, window=window)
    with pytest.raises(ValueError, match="window must be an int >= 1"):
        run_grid(None, {"lr": [0.1]}, 1, 4, window=window)  # refused before the trainer is used
