"""``--dtype float64`` of the experiment commands: the run computes, saves and resumes in
float64 (``jax_enable_x64`` switched on by the command, also when it resumes), what float32
would round is kept, and a setting that computes in float32 only is refused before anything is
written. ``jax_enable_x64`` is a process-wide setting: every test here puts it back."""

import argparse
import json
import os

import jax
import numpy as np
import pytest

from bchg_jax.core.health import health_warning
from experiments import fourrooms, thermal
from experiments.cli import check_distinct_values


@pytest.fixture
def x64_restored():
    """The global ``jax_enable_x64`` as it was before the test (a float64 command sets it)."""
    before = jax.config.jax_enable_x64
    yield
    jax.config.update("jax_enable_x64", before)


FOURROOMS_SMALL_BETA = ["--method", "exact", "--beta", "1e-6", "--seeds", "1", "--chunk", "2"]


def test_a_float64_run_trains_saves_and_resumes_in_float64(tmp_path, x64_restored, capsys):
    """Every float array the run saves is float64 (without x64, JAX computes a float64 request
    in float32, silently), config.json records x64, the logits float32 would round at beta
    1e-6 (|Q| / beta ~ 1e6: the slow test below) are kept, and --resume switches x64 on again
    in a process where it is off (else the x64 check refuses the run); the same folder run
    again as float32 is another run's."""
    run = str(tmp_path / "run")
    argv = FOURROOMS_SMALL_BETA + ["--out", run, "--exact-out", "--iterations", "2"]
    fourrooms.main(argv + ["--dtype", "float64"])
    with open(os.path.join(run, "config.json")) as f:
        cfg = json.load(f)
    assert cfg["jax_enable_x64"] is True and cfg["args"]["dtype"] == "float64"
    jax.config.update("jax_enable_x64", False)
    fourrooms.main(["--resume", run, "--iterations", "4"])
    assert jax.config.jax_enable_x64
    m = np.load(os.path.join(run, "exact", "metrics.npz"))
    floats = {k: m[k].dtype for k in m.files if np.issubdtype(m[k].dtype, np.floating)}
    assert floats and set(floats.values()) == {np.dtype(np.float64)}, floats
    assert m["J"].shape[-1] == 4 and np.all(np.isfinite(m["J"]))
    assert not m["logits_rounded"].any()
    with pytest.raises(SystemExit):  # its first command without --dtype: another run
        fourrooms.main(FOURROOMS_SMALL_BETA + ["--out", run, "--exact-out", "--iterations", "4"])
    assert "holds a run with other settings (dtype)" in capsys.readouterr().err


@pytest.mark.slow
def test_the_float32_run_rounds_the_logits_and_says_how_not_to(tmp_path, capsys, x64_restored):
    """The same run in float32 rounds the follower's logits in every iteration, and its
    WARNING names --dtype float64; the two runs' J agree to float32's accuracy of a policy
    this sharp (the rounding moves J, so not closer)."""
    argv = FOURROOMS_SMALL_BETA + ["--exact-out", "--iterations", "2"]
    fourrooms.main(argv + ["--out", str(tmp_path / "f32")])
    warned = capsys.readouterr().err
    assert "float32 rounded the follower's logits" in warned and "--dtype float64" in warned
    f32 = np.load(str(tmp_path / "f32" / "exact" / "metrics.npz"))
    assert f32["logits_rounded"].all() and f32["J"].dtype == np.float32
    fourrooms.main(argv + ["--out", str(tmp_path / "f64"), "--dtype", "float64"])
    assert "rounded the follower's logits" not in capsys.readouterr().err
    f64 = np.load(str(tmp_path / "f64" / "exact" / "metrics.npz"))
    # off by ~1e-4 of |J| (measured 1.1e-4): far above float32's own round-off of J (~1e-7),
    # and still an answer of the same problem
    off = np.abs(f32["J"] - f64["J"]) / np.abs(f64["J"])
    assert np.all((off > 1e-5) & (off < 1e-3)), off


def test_the_rounding_warning_names_the_flag():
    """The health WARNING of a run that rounded its logits says how to run in float64 from
    the command line, not only through the library."""
    text = health_warning({"run_iterations": 10, "logits_rounded": 5, "rounded_share": 0.5})
    assert "float32 rounded the follower's logits" in text and "--dtype float64" in text


def test_the_fused_float32_critic_is_refused_in_float64(tmp_path, x64_restored, capsys):
    """thermal's fused Pallas critic computes in float32 only: refused by name before the run
    folder exists (make_train refused it after, with the library's field names)."""
    out = tmp_path / "o"
    argv = ["--dtype", "float64", "--critic", "mlp", "--mlp-kernel", "fused", "--out", str(out)]
    with pytest.raises(SystemExit) as stop:
        thermal.main(argv)
    assert stop.value.code == 2
    assert "--mlp-kernel fused computes in float32" in capsys.readouterr().err
    assert not out.exists()


def test_grid_values_are_told_apart_in_the_runs_dtype():
    """Two --lr values one in float32 are refused in a float32 run and kept in a float64 one."""
    values = argparse.Namespace(lr=[0.1, 0.1 + 1e-10])
    check_distinct_values(argparse.Namespace(**vars(values), dtype="float64"))
    with pytest.raises(ValueError, match="one value in float32"):
        check_distinct_values(argparse.Namespace(**vars(values), dtype="float32"))
