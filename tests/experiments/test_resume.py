"""Run folders are never redone or overwritten by mistake: --resume finds the run folder or
refuses, extends a run by --iterations (bit for bit the longer run), refuses changed settings,
--config repeats a run exactly, and Ctrl-C exits 130 with a resumable checkpoint."""

import csv
import importlib
import json
import os
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

from experiments import fourrooms

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _error(main, argv, capsys):
    capsys.readouterr()
    with pytest.raises(SystemExit) as e:
        main(argv)
    assert e.value.code == 2
    return capsys.readouterr().err


def _metrics(run, method):
    d = np.load(os.path.join(run, method, "metrics.npz"))
    return {k: d[k] for k in d.files if d[k].ndim == 3}


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory):
    """A complete 2-seed, 20-iteration Four-Rooms run of one method (chunks of 10)."""
    run = str(tmp_path_factory.mktemp("fr") / "run")
    fourrooms.main(
        [
            "--method",
            "naive",
            "--seeds",
            "2",
            "--iterations",
            "20",
            "--chunk",
            "10",
            "--out",
            run,
            "--exact-out",
        ]
    )
    return run


def test_resume_refuses_a_method_folder_and_changed_settings(finished_run, capsys, digest):
    before = digest(finished_run)
    err = _error(fourrooms.main, ["--resume", os.path.join(finished_run, "naive")], capsys)
    assert "method's folder" in err and f"--resume {finished_run}" in err
    err = _error(fourrooms.main, ["--resume", finished_run, "--beta", "0.5"], capsys)
    assert "other settings" in err and "--beta 0.001 there, 0.5 given" in err
    err = _error(fourrooms.main, ["--resume", finished_run, "--lr", "0.2"], capsys)
    assert "--lr [0.1] there, [0.2] given" in err
    err = _error(fourrooms.main, ["--resume", finished_run, "--iterations", "10"], capsys)
    assert "extended, not shortened" in err
    err = _error(fourrooms.main, ["--resume", finished_run, "--out", "elsewhere"], capsys)
    assert "drop --out" in err
    err = _error(
        fourrooms.main,
        ["--smoke", "--out", os.path.join(finished_run, "naive"), "--exact-out"],
        capsys,
    )
    assert "one method's results" in err
    toy = importlib.import_module("experiments.toy_game")
    err = _error(toy.main, ["--resume", finished_run], capsys)
    assert "holds a fourrooms run" in err and "experiments.fourrooms --resume" in err
    # another set of methods is a change; another spelling of the same set is not (below)
    err = _error(fourrooms.main, ["--resume", finished_run, "--method", "naive,sobirl"], capsys)
    assert "--method 'naive' there, 'naive,sobirl' given" in err and "--exact-out" in err
    err = _error(fourrooms.main, ["--resume", finished_run, "--method", "all"], capsys)
    assert "--method 'naive' there, 'all' given" in err
    err = _error(fourrooms.main, ["--resume", finished_run, "--method", "naive,,"], capsys)
    assert "empty name" in err
    # the same value as saved is not a change; a complete run is skipped
    fourrooms.main(["--resume", finished_run, "--beta", "0.001", "--method", " naive,naive"])
    assert "; skipped" in capsys.readouterr().out
    after = digest(finished_run)
    assert {k: v for k, v in after.items() if k != "config.json"} == {
        k: v for k, v in before.items() if k != "config.json"
    }


def test_resume_reads_all_as_the_saved_list_of_every_method():
    """``--resume DIR --method all`` on a run saved with every method spelled out was refused
    as another setting: 'all' names the same methods."""
    from argparse import Namespace

    from experiments.cli import same_methods

    def validate(a):
        return list(fourrooms.ALL_METHODS) if a.method == "all" else a.method.split(",")

    spelled = ",".join(fourrooms.ALL_METHODS)
    a = Namespace(resume="run", method=spelled, _method_given="all")
    same_methods(a, validate, validate(a))  # no exit
    with pytest.raises(SystemExit):
        same_methods(a, validate, ["naive"])


def test_resume_extends_a_finished_run_bit_for_bit(finished_run, tmp_path, capsys):
    """--resume --iterations 30 on a finished 20-iteration run continues from its kept
    checkpoint and equals a fresh 30-iteration run of the same settings (made with --config
    from the extended run's config.json), metrics and metrics.jsonl lines alike."""
    import shutil

    run = str(tmp_path / "ext")
    shutil.copytree(finished_run, run)
    fourrooms.main(["--resume", run, "--iterations", "30"])
    assert "extending at iteration 20 (to 30)" in capsys.readouterr().out
    cfg = json.load(open(os.path.join(run, "config.json")))
    assert cfg["args"]["iterations"] == 30
    assert cfg["resumed"][-1]["command"].endswith("--iterations 30")
    fresh = fourrooms.main(
        [
            "--config",
            os.path.join(run, "config.json"),
            "--out",
            str(tmp_path / "fresh"),
            "--exact-out",
        ]
    )
    a, b = _metrics(run, "naive"), _metrics(fresh, "naive")
    assert a["J"].shape == (1, 2, 30)
    for k in b:
        np.testing.assert_array_equal(a[k], b[k])
    lines = [json.loads(x) for x in open(os.path.join(run, "naive", "metrics.jsonl"))]
    assert [x["iteration"] for x in lines] == [10, 20, 30]
    last = lines[-1]["metrics"]["J"]
    np.testing.assert_allclose(last["last"], a["J"][:, :, -1].mean(1))
    np.testing.assert_allclose(last["window_mean"], a["J"].mean((1, 2)))


def test_off_policy_buffer_grows_when_a_run_is_extended(tmp_path):
    """An off-policy buffer is sized by the iteration count: restoring it into a longer run's
    state (``load_state(grow=True)``) keeps the stored episodes and count and appends after
    them. (Measured: toy-game ``naive_off`` extended 6 -> 9 iterations equals the fresh
    9-iteration run bit for bit; sampling reads only the stored episodes.)"""
    import jax.numpy as jnp

    from bchg_jax.core.buffers import buffer_add, buffer_init
    from bchg_jax.core.io import load_state, save_state

    ep = lambda v: (jnp.full((2, 4), v), jnp.full((2, 3), v), jnp.full((2, 3), v))  # noqa: E731
    small = buffer_add(buffer_init(6, 3), *ep(7), mode="off")
    save_state(str(tmp_path / "ck"), {"buf": small}, 5)
    with pytest.raises(ValueError, match="has shape"):
        load_state(str(tmp_path / "ck"), {"buf": buffer_init(9, 3)})
    grown = load_state(str(tmp_path / "ck"), {"buf": buffer_init(9, 3)}, grow=True)["buf"]
    assert grown.s.shape == (9, 4) and int(grown.count) == 2
    np.testing.assert_array_equal(grown.s[:6], small.s)
    np.testing.assert_array_equal(grown.s[6:], 0)
    more = buffer_add(grown, *ep(5), mode="off")
    assert int(more.count) == 4 and np.all(np.asarray(more.s[2:4]) == 5)
    with pytest.raises(ValueError, match="has shape"):  # shrinking is never accepted
        load_state(str(tmp_path / "ck"), {"buf": buffer_init(4, 3)}, grow=True)


def test_config_file_overrides_and_checks(finished_run, tmp_path, capsys):
    toy = importlib.import_module("experiments.toy_game")
    err = _error(toy.main, ["--config", os.path.join(finished_run, "config.json")], capsys)
    assert "holds a fourrooms run" in err
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    assert "cannot read" in _error(fourrooms.main, ["--config", str(bad)], capsys)
    a = fourrooms.parse_args(
        ["--config", os.path.join(finished_run, "naive", "config.json"), "--beta", "0.003"]
    )
    assert (a.method, a.iterations, a.seeds, a.beta) == ("naive", 20, 2, 0.003)


@pytest.mark.slow
def test_ctrl_c_exits_130_with_a_resumable_checkpoint(tmp_path):
    run = str(tmp_path / "run")
    env = {**os.environ, "PYTHONPATH": REPO}
    argv = [
        sys.executable,
        "-m",
        "experiments.fourrooms",
        "--method",
        "naive",
        "--seeds",
        "1",
        "--iterations",
        "1000000",
        "--chunk",
        "50",
        "--out",
        run,
        "--exact-out",
    ]
    # a shell's background job inherits SIGINT ignored (and Python then installs no Ctrl-C
    # handler); a Python-level handler in this process is reset to the default at the child's
    # exec, so the child gets the default disposition, as under an interactive terminal
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        proc = subprocess.Popen(
            argv,
            cwd=str(tmp_path),
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
    finally:
        signal.signal(signal.SIGINT, previous)
    ckpt, t0 = os.path.join(run, "naive", "checkpoint"), time.time()
    while not (os.path.isdir(ckpt) and any(x.isdigit() for x in os.listdir(ckpt))):
        assert proc.poll() is None and time.time() - t0 < 120, proc.communicate()
        time.sleep(0.1)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 130, err
    assert "Traceback" not in err
    assert "interrupted in method naive at iteration" in err
    assert f"python -m experiments.fourrooms --resume {run}" in err
    from bchg_jax.core.io import checkpoint_step

    step = checkpoint_step(ckpt)
    assert step and step % 50 == 0 and f"at iteration {step} " in err
    saved = np.load(os.path.join(run, "naive", "metrics.npz"))
    done = saved["J"].shape[-1]
    assert done >= step  # metrics are written before the checkpoint
    # an unfinished run names its summary window (experiments.plot judges it over that)
    assert int(saved["summary_window"]) == min(fourrooms.SUMMARY_WINDOW, done)
    # the checkpoint restores into the trainer's state at that iteration
    from bchg_jax import problems, tabular
    from bchg_jax.core.io import load_state
    from bchg_jax.core.sweep import grid_functions, seed_keys

    a = fourrooms.parse_args(["--config", os.path.join(run, "config.json")])
    trainer = tabular.make_train(
        problems.fourrooms(),
        "naive",
        tabular.TrainConfig(num_envs=1, num_steps=100, iterations=a.iterations),
    )
    init, _ = grid_functions(trainer)
    like = init(seed_keys(1), trainer.hparams(fourrooms.method_grid("naive", a)))
    state = load_state(ckpt, like)
    assert int(np.asarray(state.step).reshape(-1)[0]) == step


@pytest.mark.slow
def test_a_run_saved_before_the_solver_flag_resumes_with_the_dense_solvers(tmp_path):
    """Runs saved without ``solver`` in their config were made with the dense solvers; --resume
    keeps them there (LEGACY_SETTINGS): the extended run equals a fresh dense run bit for bit."""
    old, fresh = str(tmp_path / "old"), str(tmp_path / "fresh")
    common = ["--method", "bchg", "--seeds", "2", "--chunk", "10", "--exact-out"]
    fourrooms.main(common + ["--iterations", "20", "--solver", "dense", "--out", old])
    for path in (os.path.join(old, "config.json"), os.path.join(old, "bchg", "config.json")):
        with open(path) as f:
            cfg = json.load(f)
        if "solver" in cfg.get("args", {}):
            del cfg["args"]["solver"]
        with open(path, "w") as f:
            json.dump(cfg, f)
    fourrooms.main(["--resume", old, "--iterations", "30"])
    fourrooms.main(common + ["--iterations", "30", "--solver", "dense", "--out", fresh])
    a, b = _metrics(old, "bchg"), _metrics(fresh, "bchg")
    for k in a:
        np.testing.assert_array_equal(a[k], b[k])
    with open(os.path.join(old, "config.json")) as f:
        assert json.load(f)["args"]["solver"] == "dense"


def test_the_run_summary_leaves_out_a_method_that_stopped_short(tmp_path, capsys):
    """A method folder stopped at 20 of 50 iterations (a killed run, then another method added
    to the folder) is not summarised as if finished: summary.csv holds the complete methods,
    and the stopped one is named with the command that finishes it. Before, its mean over the
    20 iterations done went into the table with nothing to say so."""
    from experiments.report import finish_run

    for method, done in (("bchg", 20), ("naive", 50), ("exact", 50)):
        os.makedirs(tmp_path / method)
        J = np.linspace(0.0, 1.0, done)[None, None, :] * np.ones((1, 2, 1))
        np.savez(tmp_path / method / "metrics.npz", J=J, grid_lr=np.array([0.1]))
    finish_run(str(tmp_path), [], 10, iterations=50, experiment="fourrooms")
    err = capsys.readouterr().err
    rows = list(csv.DictReader(open(tmp_path / "summary.csv")))
    assert sorted(r["method"] for r in rows) == ["exact", "naive"]
    assert "NOT in the summary: bchg (20 / 50 iterations)" in err
    assert f"experiments.fourrooms --resume {tmp_path}" in err


def test_resume_of_a_hand_damaged_folder_says_so(finished_run, tmp_path, capsys):
    """An unreadable metrics.npz gave numpy's traceback; seeds edited in config.json gave a
    concatenate error from the sweep after the checkpoint was loaded."""
    import shutil

    garbled = str(tmp_path / "garbled")
    shutil.copytree(finished_run, garbled)
    with open(os.path.join(garbled, "naive", "metrics.npz"), "wb") as f:
        f.write(b"not an npz file")
    err = _error(fourrooms.main, ["--resume", garbled, "--iterations", "30"], capsys)
    assert "metrics.npz cannot be read" in err and "the folder was damaged" in err
    edited = str(tmp_path / "edited")
    shutil.copytree(finished_run, edited)
    path = os.path.join(edited, "config.json")
    with open(path) as f:
        config = json.load(f)
    config["args"]["seeds"] = 3
    with open(path, "w") as f:
        json.dump(config, f)
    err = _error(fourrooms.main, ["--resume", edited, "--iterations", "30"], capsys)
    assert "not [grid points, seeds, iterations] = [1, 3, ...]" in err and "by hand" in err


def test_resume_of_a_checkpoint_ahead_of_its_metrics_says_so(finished_run, tmp_path, capsys):
    """A chunk writes its metrics before its checkpoint; a folder whose checkpoint is ahead of
    metrics.npz (a write lost to a power cut, or an edit) ended in a traceback from the sweep's
    continuation check, now in an error that names both iteration counts."""
    import shutil

    behind = str(tmp_path / "behind")
    shutil.copytree(finished_run, behind)
    path = os.path.join(behind, "naive", "metrics.npz")
    with np.load(path) as d:
        data = {k: d[k][:, :, :10] if d[k].ndim >= 3 else d[k] for k in d.files}
    data.pop("final", None)
    np.savez(path, **data)
    err = _error(fourrooms.main, ["--resume", behind, "--iterations", "30"], capsys)
    assert "is at iteration 20" in err and "records only 10" in err


def _exit_code_as_in_a_terminal(run: str, iterations: int) -> int:
    """The exit code of a one-seed ``naive`` Four-Rooms run into ``run`` (chunks of 10) that is
    to be interrupted, with SIGINT's default handler as under a terminal."""
    argv = ["--method", "naive", "--seeds", "1", "--iterations", str(iterations), "--chunk", "10"]
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        with pytest.raises(SystemExit) as e:
            fourrooms.main(argv + ["--out", run, "--exact-out"])
    finally:
        signal.signal(signal.SIGINT, previous)
    return e.value.code


def _ctrl_c_that_python_drops():
    """Runs the SIGINT handler inside a garbage-collection callback, as a Ctrl-C that lands in
    JAX's does: Python prints "Exception ignored" and drops the KeyboardInterrupt it raises."""
    import gc

    def in_gc(phase, info):
        signal.getsignal(signal.SIGINT)(signal.SIGINT, None)

    gc.callbacks.append(in_gc)
    try:
        gc.collect()
    finally:
        gc.callbacks.remove(in_gc)


@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")
@pytest.mark.slow
def test_a_ctrl_c_python_drops_in_a_gc_callback_still_stops_the_run(tmp_path, monkeypatch, capsys):
    """JAX frees device buffers from a garbage-collection callback; a KeyboardInterrupt raised
    there is printed as "Exception ignored" and dropped, and the run trained to its end with exit
    0 (4 of 19 Ctrl-Cs in an audit). The run now stops at the next chunk with exit 130."""
    from bchg_jax.core import sweep

    real = sweep.run_grid

    def run_grid(*args, on_chunk, **kw):
        def first_chunk_interrupted(st, m, done):
            _ctrl_c_that_python_drops()
            on_chunk(st, m, done)

        return real(*args, on_chunk=first_chunk_interrupted, **kw)

    monkeypatch.setattr(sweep, "run_grid", run_grid)
    run = str(tmp_path / "run")
    assert _exit_code_as_in_a_terminal(run, 40) == 130
    assert "interrupted in method naive at iteration 10" in capsys.readouterr().err
    assert np.load(os.path.join(run, "naive", "metrics.npz"))["J"].shape[-1] == 10
    # the same run resumes to the end
    monkeypatch.setattr(sweep, "run_grid", real)
    fourrooms.main(["--resume", run])
    assert np.load(os.path.join(run, "naive", "metrics.npz"))["J"].shape[-1] == 40


def _ctrl_c_on_entering(name: str, monkeypatch):
    """``run_folder.<name>`` receives a Ctrl-C as it starts; returns the real function."""
    from experiments import run_folder

    real = getattr(run_folder, name)

    def interrupted(*args, **kw):
        os.kill(os.getpid(), signal.SIGINT)  # the handler runs before the first write
        return real(*args, **kw)

    monkeypatch.setattr(run_folder, name, interrupted)
    return real


@pytest.mark.slow
def test_ctrl_c_during_a_methods_summary_waits_for_its_files(tmp_path, monkeypatch, capsys):
    """A Ctrl-C inside the final ``metrics.npz`` write (not guarded, unlike the chunks' writes)
    surfaced as NumPy's "Can't close the ZIP file" ValueError with exit 1; the summary's files
    are now complete first, then the run exits 130."""
    _ctrl_c_on_entering("finish_method", monkeypatch)
    run = str(tmp_path / "run")
    assert _exit_code_as_in_a_terminal(run, 20) == 130, capsys.readouterr().err
    for name in ("summary.csv", "curve.png"):
        assert os.path.exists(os.path.join(run, "naive", name)), name
    assert "final" in np.load(os.path.join(run, "naive", "metrics.npz")).files


class _Killed(BaseException):
    """What a SIGKILL does to the process at that point (nothing after it runs)."""


@pytest.mark.parametrize("killed_in", ["save_csv", "save_figure"])
def test_a_kill_while_an_extension_is_summarised_leaves_no_stale_summary(
    finished_run, tmp_path, monkeypatch, capsys, killed_in
):
    """Extending a finished run to 30 iterations and killing it while ``summary.csv`` was
    written or ``curve.png`` drawn left the new ``metrics.npz`` (with ``final``) beside the
    20-iteration file, and ``--resume`` called the method complete and kept it for good. The
    npz's ``final`` is now written last, so the resume writes the summary again. The temporary
    files of writes a kill cut short (``.tmp-*``) are removed by the resume, in the run folder
    and in the method's folder; other files stay."""
    import shutil

    from bchg_jax.core import io as bio

    run = str(tmp_path / "ext")
    shutil.copytree(finished_run, run)
    summary = os.path.join(run, "naive", "summary.csv")
    assert "mean_last20" in open(summary).read()
    figure = open(os.path.join(run, "naive", "curve.png"), "rb").read()

    def killed(*args, **kw):
        raise _Killed

    monkeypatch.setattr(bio, killed_in, killed)
    with pytest.raises(_Killed):
        fourrooms.main(["--resume", run, "--iterations", "30"])
    monkeypatch.undo()
    left = [os.path.join(run, ".tmp-abc123"), os.path.join(run, "naive", ".tmp-def456")]
    for p in left + [os.path.join(run, "naive", "notes.txt")]:
        open(p, "w").write("x")
    capsys.readouterr()
    fourrooms.main(["--resume", run])
    assert "complete in" in capsys.readouterr().out
    assert "mean_last30" in open(summary).read()
    assert open(os.path.join(run, "naive", "curve.png"), "rb").read() != figure
    assert not any(os.path.exists(p) for p in left)
    assert os.path.exists(os.path.join(run, "naive", "notes.txt"))
    data = np.load(os.path.join(run, "naive", "metrics.npz"))
    assert "final" in data.files and data["J"].shape[-1] == 30


@pytest.mark.slow
def test_a_refused_extension_and_a_repeated_command_keep_the_run_config(tmp_path, capsys):
    """A refused ``--resume --iterations N`` wrote N into the run's config.json first, so a plain
    ``--resume`` was refused from then on; the same ``--exact-out`` command run again replaced
    the first command and date and dropped the ``resumed`` history."""
    import shutil

    run = str(tmp_path / "run")
    argv = ["--method", "naive", "--seeds", "1", "--iterations", "20", "--chunk", "10"]
    argv += ["--out", run, "--exact-out"]
    fourrooms.main(argv)
    cfg_path = os.path.join(run, "config.json")
    first = json.load(open(cfg_path))
    fourrooms.main(argv)  # complete: skipped; recorded as a later command
    again = json.load(open(cfg_path))
    assert again["command"] == first["command"] and again["date"] == first["date"]
    assert [r["command"] for r in again["resumed"]] == [first["command"]]

    shutil.rmtree(os.path.join(run, "naive", "checkpoint"))  # nothing to extend from
    before = open(cfg_path, "rb").read()
    err = _error(fourrooms.main, ["--resume", run, "--iterations", "30"], capsys)
    assert "naive" in err and "holds no checkpoint to continue from" in err
    assert open(cfg_path, "rb").read() == before
    fourrooms.main(["--resume", run])  # still complete at 20 iterations
    assert "complete" in capsys.readouterr().out


@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")
def test_a_ctrl_c_dropped_while_the_run_starts_stops_it_before_training(
    tmp_path, monkeypatch, capsys
):
    """The same dropped Ctrl-C during the checks before training (3 of the audit's 4 lost ones
    came within the first 5 s) stops the run before its first chunk."""
    from experiments import run_folder

    real = run_folder.prepare_run_dir

    def interrupted(*args, **kw):
        _ctrl_c_that_python_drops()
        return real(*args, **kw)

    monkeypatch.setattr(run_folder, "prepare_run_dir", interrupted)
    run = str(tmp_path / "run")
    assert _exit_code_as_in_a_terminal(run, 20) == 130
    assert f"python -m experiments.fourrooms --resume {run}" in capsys.readouterr().err
    assert not os.path.exists(os.path.join(run, "naive", "metrics.npz"))


_START_UP = """
import os, signal, sys
sys.argv, sys.orig_argv = ["-m"], [sys.executable, "-m", "experiments.fourrooms"]
import experiments  # as `python -m experiments.fourrooms` imports it, before the module's code
from experiments import startup
assert startup.is_holding(signal.getsignal(signal.SIGINT))
assert all(m in sys.modules for m in ("jax", "bchg_jax", "orbax.checkpoint"))  # under the hold
os.kill(os.getpid(), signal.SIGINT)  # a Ctrl-C during the imports: held
assert startup.held()
{second}
from experiments import fourrooms
fourrooms.main(["--smoke", "--out", sys.argv_out, "--exact-out"])
"""


@pytest.mark.parametrize("presses", [1, 2])
def test_a_ctrl_c_during_the_commands_imports_stops_it_before_anything_is_written(
    tmp_path, presses
):
    """A Ctrl-C while ``python -m experiments.<name>`` imported NumPy / JAX raised
    ``KeyboardInterrupt`` inside those imports: a traceback, and in 2 of 16 tries of an audit a
    crash (SIGSEGV, no message). The package now holds it until start-up is done and the run
    stops before writing anything (exit 130); a second Ctrl-C exits at once. JAX itself was
    imported later, inside the command's argument parsing, after the hold (a second audit: a
    Ctrl-C 0.3 s into ``experiments.thermal`` crashed 1 in 3 to 6 times): the package imports
    the library under the hold."""
    import subprocess
    import sys

    run = str(tmp_path / "run")
    second = "os.kill(os.getpid(), signal.SIGINT); raise AssertionError('not stopped')"
    code = _START_UP.format(second=second if presses == 2 else "").replace(
        "sys.argv_out", repr(run)
    )
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    proc = subprocess.run(
        [sys.executable, "-c", code], cwd=root, capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 130, proc.stderr[-2000:]
    assert "Ctrl-C: stopping once start-up is done" in proc.stderr
    expected = "stopped during start-up" if presses == 2 else "interrupted before any training"
    assert expected in proc.stderr and "Traceback" not in proc.stderr, proc.stderr[-2000:]
    assert not os.path.exists(run)


def test_the_start_up_hold_is_only_for_the_training_commands(monkeypatch):
    """Imported by tests, notebooks or ``experiments.plot``, the package leaves Ctrl-C alone."""
    import sys

    from experiments import startup

    assert not startup.started_as_training_command()  # under pytest
    for target, expected in (
        ("experiments.thermal", True),
        ("experiments.plot", False),
        ("benchmarks.fourrooms_figure", False),
    ):
        monkeypatch.setattr(sys, "argv", ["-m"])
        monkeypatch.setattr(sys, "orig_argv", ["python", "-m", target, "--seeds", "2"])
        assert startup.started_as_training_command() is expected, target
    monkeypatch.setattr(sys, "argv", ["/x/experiments/thermal.py"])  # the module's code runs
    assert not startup.started_as_training_command()


@pytest.mark.slow
def test_a_ctrl_c_while_the_run_summary_is_written_completes_the_run(tmp_path, monkeypatch, capsys):
    """The run summary waits for a Ctrl-C that came while it was written; the run is then
    complete, and it said 'interrupted in method naive at iteration 20 ... Resume with' (exit
    130) for a run with nothing left to do. It now says the run is complete (exit 0)."""
    from experiments import run_folder

    real = _ctrl_c_on_entering("finish_run", monkeypatch)
    run = str(tmp_path / "run")
    argv = ["--method", "naive", "--seeds", "1", "--iterations", "20", "--chunk", "10"]
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        fourrooms.main(argv + ["--out", run, "--exact-out"])  # no SystemExit
    finally:
        signal.signal(signal.SIGINT, previous)
    err = capsys.readouterr().err
    assert "the run is complete" in err and "Resume with" not in err
    monkeypatch.setattr(run_folder, "finish_run", real)
    fourrooms.main(["--resume", run])
    assert "complete" in capsys.readouterr().out


@pytest.mark.slow
def test_metrics_ahead_of_the_checkpoint_are_recomputed(tmp_path, monkeypatch):
    """A 6-iteration run (chunks of 2) killed after chunk 4's metrics were written but before
    its checkpoint resumes from the checkpoint at 2: metrics.npz is cut back to it and
    metrics.jsonl truncated, so the resumed files are the uninterrupted run's (no repeated jsonl
    line, one chunk's iterations each); the stopped file names its summary window (4 done)."""
    import bchg_jax.core.io as bio

    argv = ["--method", "naive", "--seeds", "1", "--iterations", "6", "--chunk", "2"]
    argv += ["--exact-out"]
    lines = lambda run: [  # noqa: E731
        json.loads(x) for x in open(os.path.join(run, "naive", "metrics.jsonl"))
    ]
    full = fourrooms.main(argv + ["--out", str(tmp_path / "full")])
    real = bio.save_state

    def killed_before_the_second_checkpoint(path, state, step=0):
        if step == 4:
            raise KeyboardInterrupt
        return real(path, state, step)

    monkeypatch.setattr(bio, "save_state", killed_before_the_second_checkpoint)
    run = str(tmp_path / "run")
    with pytest.raises(SystemExit) as e:
        fourrooms.main(argv + ["--out", run])
    assert e.value.code == 130
    monkeypatch.setattr(bio, "save_state", real)
    stopped = np.load(os.path.join(run, "naive", "metrics.npz"))
    assert stopped["J"].shape[-1] == 4 and int(stopped["summary_window"]) == 4
    assert bio.checkpoint_step(os.path.join(run, "naive", "checkpoint")) == 2
    fourrooms.main(["--resume", run])
    np.testing.assert_array_equal(_metrics(run, "naive")["J"], _metrics(full, "naive")["J"])
    assert [(x["iteration"], x["chunk_iterations"]) for x in lines(run)] == [
        (2, 2),
        (4, 2),
        (6, 2),
    ]
    assert [x["metrics"] for x in lines(run)] == [x["metrics"] for x in lines(full)]


@pytest.mark.slow
def test_an_off_policy_run_extends_as_the_longer_run(tmp_path):
    """The trainer side of the buffer test above: a toy-game ``naive_off`` run extended 6 -> 9
    iterations (its buffer restored with grow=True) equals a fresh 9-iteration run bit for bit."""
    toy = importlib.import_module("experiments.toy_game")
    argv = ["--method", "naive_off", "--seeds", "1", "--chunk", "3", "--exact-out"]
    run = toy.main(argv + ["--iterations", "6", "--out", str(tmp_path / "run")])
    toy.main(["--resume", run, "--iterations", "9"])
    fresh = toy.main(argv + ["--iterations", "9", "--out", str(tmp_path / "fresh")])
    a, b = _metrics(run, "naive_off"), _metrics(fresh, "naive_off")
    assert a["J"].shape[-1] == 9 and a.keys() == b.keys()
    for k in b:
        np.testing.assert_array_equal(a[k], b[k])
