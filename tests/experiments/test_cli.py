"""The experiment CLI runs a smoke configuration and writes its results."""

import csv
import json
import os

import numpy as np
import pytest

from experiments import fourrooms as cli


def test_smoke_run_writes_results(tmp_path):
    out = os.path.join(
        cli.main(["--smoke", "--lr", "0.1", "0.05", "--out", str(tmp_path / "r"), "--exact-out"]),
        "bchg",
    )
    files = set(os.listdir(out))
    assert {"config.json", "metrics.npz", "summary.csv", "curve.png"} <= files
    cfg = json.load(open(os.path.join(out, "config.json")))
    assert cfg["num_grid_points"] == 2 and cfg["args"]["seeds"] == 2
    data = np.load(os.path.join(out, "metrics.npz"))
    assert data["J"].shape == (2, 2, 20) and np.all(np.isfinite(data["J"]))
    rows = list(csv.DictReader(open(os.path.join(out, "summary.csv"))))
    assert len(rows) == 2 and sum(int(r["best"]) for r in rows) == 1
    # a run shorter than the summary window is summarised over its whole length, and says so
    assert "mean_last20" in rows[0] and int(data["summary_window"]) == 20
    # a run stopped after its last chunk but before its summary is summarised on --resume
    run = os.path.dirname(out)
    os.remove(os.path.join(out, "summary.csv"))
    kept = {k: v for k, v in dict(np.load(os.path.join(out, "metrics.npz"))).items()}
    np.savez(os.path.join(out, "metrics.npz"), **{k: kept[k] for k in kept if k != "final"})
    cli.main(["--resume", run])
    assert os.path.exists(os.path.join(out, "summary.csv"))
    assert "final" in np.load(os.path.join(out, "metrics.npz")).files


@pytest.mark.parametrize(
    "argv",
    [
        ["--smoke", "--beta", "0"],
        ["--smoke", "--batch", "300"],
        ["--smoke", "--method", "magic"],
        ["--smoke", "--lr", "-1"],
        ["--smoke", "--seed", "4294967297"],  # JAX would read it as --seed 1
        ["--smoke", "--seed", "-1"],
    ],
)
def test_bad_arguments_exit_with_a_message(argv, tmp_path, capsys):
    with pytest.raises(SystemExit) as e:
        cli.main(argv + ["--out", str(tmp_path)])
    assert e.value.code == 2
    assert "error:" in capsys.readouterr().err


def test_an_out_folder_whose_checkpoints_cannot_be_read_back_is_refused(tmp_path, capsys):
    """A run under ``lr[0.1]/`` trained and saved checkpoints that no resume could read (orbax
    globs the folder's path); it now exits 2 before anything is made."""
    out = str(tmp_path / "lr[0.1]")
    with pytest.raises(SystemExit) as e:
        cli.main(["--smoke", "--out", out, "--exact-out"])
    assert e.value.code == 2
    assert "cannot read back" in capsys.readouterr().err
    assert not os.path.exists(out)


def test_batch_shapes():
    assert cli.batch_shape(100) == (1, 100)
    assert cli.batch_shape(200) == (1, 200)
    assert cli.batch_shape(400) == (2, 200)
    assert cli.batch_shape(1000) == (5, 200)


def test_atomic_writes_leave_no_temporary_files(tmp_path):
    from bchg_jax.core.io import save_csv, save_json, save_npz

    save_json(str(tmp_path / "a.json"), {"x": 1})
    save_npz(str(tmp_path / "b.npz"), {"y": np.arange(3)})
    save_csv(str(tmp_path / "c.csv"), ["h"], [[1], [2]])
    assert sorted(os.listdir(tmp_path)) == ["a.json", "b.npz", "c.csv"]
    assert json.load(open(tmp_path / "a.json")) == {"x": 1}
    assert (os.stat(tmp_path / "a.json").st_mode & 0o044) == 0o044  # readable by others


def test_an_atomic_write_syncs_the_file_and_then_its_folder(tmp_path, monkeypatch):
    """The rename is an entry of the folder: without a sync of the folder a power loss could
    leave the old file (or none) after the write had returned."""
    import stat

    from bchg_jax.core.io import save_json

    synced, fsync = [], os.fsync

    def recording_fsync(fd):
        synced.append("folder" if stat.S_ISDIR(os.fstat(fd).st_mode) else "file")
        return fsync(fd)

    monkeypatch.setattr(os, "fsync", recording_fsync)
    save_json(str(tmp_path / "sub" / "a.json"), {"x": 1})
    assert synced == ["file", "folder"]


@pytest.mark.slow
def test_stopped_run_resumes_without_losing_or_repeating_work(tmp_path, monkeypatch):
    import bchg_jax.core.io as bio

    args = [
        "--method",
        "bchg,naive",
        "--seeds",
        "2",
        "--iterations",
        "30",
        "--chunk",
        "10",
        "--lr",
        "0.1",
        "0.5",
        "--exact-out",
    ]
    full = cli.main(args + ["--out", str(tmp_path / "full")])

    original, calls = bio.save_state, []

    def stop_after_second_checkpoint(path, state, step=0):
        original(path, state, step)
        calls.append(path)
        if len(calls) == 2:
            raise KeyboardInterrupt  # the run is killed right after iteration 20 was saved

    monkeypatch.setattr(bio, "save_state", stop_after_second_checkpoint)
    stopped = str(tmp_path / "stopped")
    with pytest.raises(SystemExit) as e:  # Ctrl-C: exit status 130
        cli.main(args + ["--out", stopped])
    assert e.value.code == 130
    monkeypatch.setattr(bio, "save_state", original)
    part = np.load(os.path.join(stopped, "bchg", "metrics.npz"))
    assert part["J"].shape[-1] == 20 and bio.checkpoint_exists(
        os.path.join(stopped, "bchg", "checkpoint")
    )
    assert not os.path.exists(os.path.join(stopped, "naive"))

    cli.main(["--resume", stopped])
    for method in ("bchg", "naive"):
        a = np.load(os.path.join(full, method, "metrics.npz"))["J"]
        b = np.load(os.path.join(stopped, method, "metrics.npz"))["J"]
        assert b.shape == (2, 2, 30)
        assert np.array_equal(a, b)  # bit-identical to the uninterrupted run
        assert bio.checkpoint_step(os.path.join(stopped, method, "checkpoint")) == 30  # kept
    assert os.path.exists(os.path.join(stopped, "figure.png"))
    rows = list(csv.DictReader(open(os.path.join(stopped, "summary.csv"))))
    assert [r["method"] for r in rows] == ["bchg", "naive"]


def test_resume_of_a_folder_without_config_is_an_error(tmp_path, capsys):
    with pytest.raises(SystemExit) as e:
        cli.main(["--resume", str(tmp_path)])
    assert e.value.code == 2 and "config.json" in capsys.readouterr().err


@pytest.mark.slow
def test_plot_cli_draws_panels_and_table(tmp_path, capsys):
    from experiments import plot

    run = cli.main(
        ["--smoke", "--method", "bchg,sobirl", "--out", str(tmp_path / "r"), "--exact-out"]
    )
    capsys.readouterr()
    plot.main([run, run, "--out", str(tmp_path / "fig.png")])
    out = capsys.readouterr().out
    assert os.path.exists(tmp_path / "fig.png")
    assert "| BC-HG |" in out and "| SoBiRL |" in out
    plot.main([run, "--export", str(tmp_path / "compact")])
    d = np.load(tmp_path / "compact" / "bchg" / "metrics.npz")
    assert d["J"].shape == (1, 2, 20) and int(d["completed"]) == 20
    assert plot.final_table([run]) == plot.final_table([str(tmp_path / "compact")])


@pytest.mark.slow
def test_methods_can_be_added_to_a_run_folder_but_settings_cannot_change(tmp_path, capsys):
    run = str(tmp_path / "r")
    cli.main(["--smoke", "--method", "naive", "--out", run, "--exact-out"])
    cli.main(["--smoke", "--method", "sobirl", "--out", run, "--exact-out"])
    cfg = json.load(open(os.path.join(run, "config.json")))
    assert cfg["methods"] == ["naive", "sobirl"]
    # the run's summary and figure now cover both methods (they were not refreshed before)
    rows = list(csv.DictReader(open(os.path.join(run, "summary.csv"))))
    assert [r["method"] for r in rows] == ["sobirl", "naive"]  # the figure's order
    assert os.path.exists(os.path.join(run, "figure.png"))
    # metrics.jsonl lines carry their grid's hyperparameters
    line = json.loads(open(os.path.join(run, "naive", "metrics.jsonl")).readline())
    # (naive has no SARSA critic: sarsa_alpha is not one of its hyperparameters)
    assert set(line["grid"]) == {"lr", "beta"} and "solve_capped" in line["metrics"]
    assert "sarsa_alpha" not in rows[0]  # sobirl has no SARSA critic either
    with pytest.raises(SystemExit) as e:
        cli.main(["--smoke", "--method", "naive", "--beta", "0.005", "--out", run, "--exact-out"])
    assert e.value.code == 2 and "other settings" in capsys.readouterr().err
    # the solver is a setting too: a later --resume would continue a method with the other one
    with pytest.raises(SystemExit) as e:
        cli.main(
            ["--smoke", "--method", "hpgd_mc", "--solver", "dense", "--out", run, "--exact-out"]
        )
    assert e.value.code == 2 and "other settings (solver)" in capsys.readouterr().err


@pytest.mark.parametrize(
    "module, extra, metrics",
    [
        (
            "thermal",
            ["--method", "bchg,naive"],
            {"J", "stability", "hvac_energy", "insulation", "airflow", "ok"},
        ),
        ("toy_game", ["--method", "bchg,naive_off"], {"J", "J_discounted", "p", "g_S"}),
        (
            "lqr_game",
            ["--method", "bchg,bchg_det"],
            {"J", "J_discounted", "K1", "K2", "update_skipped"},
        ),
    ],
)
@pytest.mark.slow
def test_other_experiments_smoke_and_resume_skip(module, extra, metrics, tmp_path, capsys):
    import importlib

    mod = importlib.import_module(f"experiments.{module}")
    run = mod.main(["--smoke", *extra, "--out", str(tmp_path / "r"), "--exact-out"])
    for method in extra[1].split(","):
        d = np.load(os.path.join(run, method, "metrics.npz"))
        assert metrics <= set(d.files)
        assert np.all(np.isfinite(d["J"]))
    assert os.path.exists(os.path.join(run, "figure.png"))
    cfg = json.load(open(os.path.join(run, "config.json")))
    assert cfg["experiment"] == module and "jax_version" in cfg
    capsys.readouterr()
    mod.main(["--resume", run])  # complete: every method is skipped
    assert capsys.readouterr().out.count("; skipped") == 2
    if module == "lqr_game":  # the explore preset's cosine rate spans the run: not extensible
        with pytest.raises(SystemExit) as e:
            mod.main(["--resume", run, "--iterations", "1000"])
        assert e.value.code == 2 and "would restart the decay" in capsys.readouterr().err


@pytest.mark.parametrize(
    "module, argv",
    [
        ("thermal", ["--method", "sobirl"]),
        ("thermal", ["--lr", "0"]),
        ("thermal", ["--init-std", "-1"]),
        ("toy_game", ["--method", "bchg_on"]),
        ("toy_game", ["--actor-steps", "50"]),
        ("toy_game", ["--beta", "-0.1"]),
        ("toy_game", ["--follower", "k_step", "--follower-steps", "0"]),
        ("thermal", ["--follower", "k_step", "--follower-steps", "3000000000"]),
        ("thermal", ["--lr", "0.1", "0.1"]),  # ran twice
        ("fourrooms", ["--lr", "0.1", "0.1000000001"]),  # one value in float32
        ("lqr_game", ["--actor-steps", "1", "1"]),
        ("toy_game", ["--follower", "q_learning", "--follower-explore", "2"]),
        ("lqr_game", ["--method", "hpgd"]),
        ("lqr_game", ["--actor-steps", "21"]),
        ("lqr_game", ["--beta", "0"]),
        ("lqr_game", ["--warmup-steps", "-1"]),
        ("lqr_game", ["--explore-episodes", "-2"]),
    ],
)
def test_other_experiments_bad_arguments(module, argv, tmp_path, capsys):
    import importlib

    mod = importlib.import_module(f"experiments.{module}")
    with pytest.raises(SystemExit) as e:
        mod.main(["--smoke", *argv, "--out", str(tmp_path)])
    assert e.value.code == 2
    assert "error:" in capsys.readouterr().err


@pytest.mark.parametrize("module", ["fourrooms", "thermal", "toy_game", "lqr_game"])
def test_every_flag_has_help_and_shows_its_default(module, monkeypatch, capsys):
    import argparse
    import importlib

    mod = importlib.import_module(f"experiments.{module}")
    seen = {}

    def grab(self, args=None, namespace=None):
        seen["parser"] = self
        raise SystemExit(0)

    monkeypatch.setattr(argparse.ArgumentParser, "parse_args", grab)
    with pytest.raises(SystemExit):
        mod.parse_args([])
    parser = seen["parser"]
    actions = [a for a in parser._actions if a.dest != "help"]
    assert all(a.help for a in actions), [a.option_strings for a in actions if not a.help]
    text = parser.format_help()
    assert text.count("(default:") == len(actions)
    assert "checkpoint.npz" not in text and "checkpoint/<iteration>/" in text
    # the --follower help speaks of an exact method only where there is one (the toy game has
    # none)
    flat = " ".join(text.split())  # the help's lines wrap anywhere
    assert ("the exact method ascends" in flat) == (module != "toy_game")


def test_lqr_game_presets():
    """``--preset explore`` (default) and ``--preset reference`` set the flags' defaults and the
    trainer's config; explicit flags still win."""
    import dataclasses

    from bchg_jax.games.lqr import presets
    from experiments import lqr_game as cli

    a = cli.parse_args([])
    assert (a.preset, a.iterations, a.estimator, a.actor_lr) == ("explore", 2000, "unbiased", 0.02)
    assert cli.methods_of("all", a.preset) == [
        "bchg",
        "bchg_det",
        "naive",
        "naive_det",
        "exact",
        "exact_direct",
    ]
    c = cli.train_config(a, "naive")
    assert c == presets.explore().config_for("naive")  # the flags' defaults are the preset's
    assert (c.exploration.episodes, c.critic.replay, c.tau, c.critic.normalize) == (
        6,
        80,
        0.2,
        True,
    )
    assert (c.estimator.influence_cv, c.actor.clip) == (True, 1.0)
    assert (c.actor.lr, c.actor.lr_schedule, c.exploration.warmup_steps) == (0.02, "cosine", 160000)
    assert (c.minibatch, c.max_steps, a.critic_steps) == (64, 20, 20)
    c = cli.train_config(
        cli.parse_args(["--replay", "200", "--tau", "0.05", "--minibatch", "256"]), "bchg"
    )
    assert (c.critic.replay, c.tau, c.minibatch) == (200, 0.05, 256)
    c = cli.train_config(cli.parse_args(["--explore-episodes", "2", "--replay", "40"]), "naive")
    assert (c.episodes, c.exploration.episodes, c.critic.replay) == (2, 2, 40)
    with pytest.raises(ValueError, match="multiple of the 6 episodes"):
        cli.validate_args(cli.parse_args(["--explore-episodes", "4"]))  # 80 % (2 + 4) != 0
    with pytest.raises(ValueError, match="needs a replay ring"):
        cli.validate_args(cli.parse_args(["--replay", "0"]))
    with pytest.raises(ValueError, match="minibatch"):
        cli.validate_args(cli.parse_args(["--minibatch", "0"]))
    with pytest.raises(ValueError, match="multiple of the 8 episodes"):
        cli.validate_args(cli.parse_args(["--replay", "42"]))
    r = cli.parse_args(["--preset", "reference", "--actor-lr", "0.2"])
    assert (r.iterations, r.estimator, r.warmup_steps, r.actor_lr) == (500, "reference", 4000, 0.2)
    assert cli.methods_of("all", r.preset) == ["bchg", "naive_on", "naive_off", "bchg_det"]
    c = cli.train_config(r, "naive_on")
    assert (c.episodes, c.exploration.episodes, c.critic.replay, c.critic.normalize) == (
        4,
        0,
        0,
        False,
    )
    assert (c.actor.clip, c.critic.lr, c.minibatch, c.actor.lr) == (0.0, 0.1, 64, 0.2)
    r = cli.parse_args(["--preset", "reference"])
    for name in ("bchg", "naive_on", "naive_off", "bchg_det"):
        want = presets.reference().config_for(name)
        assert cli.train_config(r, name) == dataclasses.replace(want, buffer=cli.VARIANTS[name][1])


@pytest.mark.parametrize("preset", ["explore", "reference"])
def test_lqr_game_every_variant_runs_under_every_preset(preset, tmp_path, capsys):
    """Every variant the CLI offers passes every check under both presets (naive_off under the
    explore preset too: the control variate concerns only a guiding term), and a flag value
    the library refuses is named as the flag."""
    from experiments import lqr_game as cli

    a = cli.parse_args(["--preset", preset, "--method", ",".join(cli.VARIANTS)])
    assert cli.validate_args(a) == list(cli.VARIANTS)
    with pytest.raises(SystemExit) as e:
        cli.main(["--preset", preset, "--critic-lr", "0", "--out", str(tmp_path)])
    assert e.value.code == 2
    assert "error: --critic-lr (CriticConfig.lr) must be > 0" in capsys.readouterr().err


@pytest.mark.parametrize(
    "preset,replay,tau,explore", [("explore", 200, 0.05, 2), ("reference", 0, 0.01, 0)]
)
def test_lqr_game_run_saved_before_the_replay_and_tau_flags_resumes_with_its_values(
    tmp_path, preset, replay, tau, explore
):
    """A run saved before ``--replay`` / ``--tau`` / ``--explore-episodes`` existed was made with
    its preset's values of the time (LEGACY_SETTINGS); ``--resume`` and ``--config`` restore
    them, not today's defaults."""
    from experiments import lqr_game as cli
    from experiments.cli import resume_args

    saved = vars(cli.parse_args(["--preset", preset]))
    saved = {
        k: v
        for k, v in saved.items()
        if k not in ("replay", "tau", "explore_episodes") and not k.startswith("_")
    }
    run = tmp_path / "run"
    run.mkdir()
    (run / "config.json").write_text(json.dumps({"experiment": "lqr_game", "args": saved}))
    a = resume_args(cli.parse_args(["--resume", str(run)]), "lqr_game")
    c = cli.train_config(a, "bchg")
    got = (a.preset, c.critic.replay, c.tau, c.exploration.episodes)
    assert got == (preset, replay, tau, explore)
    a = cli.parse_args(["--config", str(run / "config.json")])  # --config: the same values
    c = cli.train_config(a, "bchg")
    assert (a.preset, c.critic.replay, c.tau, c.exploration.episodes) == got


def test_lqr_game_run_of_the_removed_shuffled_control_is_refused(tmp_path, capsys):
    """``--estimator shuffled`` (a control, now ``benchmarks/lqr_game_controls.py``): resuming
    such a run exits 2 and says where the control went."""
    from experiments import lqr_game as cli
    from experiments.cli import saved_args

    saved = {**saved_args(cli.parse_args(["--preset", "reference"])), "estimator": "shuffled"}
    run = tmp_path / "run"
    run.mkdir()
    (run / "config.json").write_text(json.dumps({"experiment": "lqr_game", "args": saved}))
    with pytest.raises(SystemExit) as e:
        cli.main(["--resume", str(run)])
    assert e.value.code == 2
    assert "benchmarks.lqr_game_controls" in capsys.readouterr().err


def test_toy_game_follower_flags_are_settings_a_resume_keeps(tmp_path, capsys):
    """The follower model reaches the trainer's config; a run folder's follower cannot change on
    --resume; a run saved before the flags existed had the best-response follower, and resumes
    with it (LEGACY_SETTINGS)."""
    from bchg_jax.core.follower_model import FollowerModel
    from experiments import toy_game as cli
    from experiments.cli import resume_args

    argv = ["--follower", "k_step", "--follower-steps", "3", "--track-reference"]
    a = cli.parse_args(argv)
    c = cli.train_config(a, "on")
    assert c.follower == FollowerModel("k_step", steps=3) and c.track_reference
    assert {"follower", "follower_steps", "track_reference"} <= set(cli.SETTING_KEYS)
    for name, saved in [("new", vars(a)), ("old", vars(cli.parse_args([])))]:
        saved = {k: v for k, v in saved.items() if not k.startswith("_")}
        if name == "old":  # saved before the follower flags
            saved = {k: v for k, v in saved.items() if "follower" not in k}
            saved.pop("track_reference")
        run = tmp_path / name
        run.mkdir()
        (run / "config.json").write_text(json.dumps({"experiment": "toy_game", "args": saved}))
        r = resume_args(cli.parse_args(["--resume", str(run)]), "toy_game")
        want = FollowerModel("k_step", steps=3) if name == "new" else FollowerModel()
        assert cli.train_config(r, "on").follower == want
        with pytest.raises(SystemExit) as e:
            resume_args(cli.parse_args(["--resume", str(run), "--follower", "lag"]), "toy_game")
        assert e.value.code == 2 and "--follower" in capsys.readouterr().err


@pytest.mark.slow
def test_a_failed_write_stops_with_the_resume_command(tmp_path, monkeypatch, capsys):
    """A folder made read-only (or a full disk) mid-run: exit 1, no traceback, how to go on."""
    import bchg_jax.core.io as bio

    def refuse(path, state, step=0):
        raise PermissionError(13, "Permission denied", path)

    monkeypatch.setattr(bio, "save_state", refuse)
    run = str(tmp_path / "r")
    with pytest.raises(SystemExit) as e:
        cli.main(["--smoke", "--method", "naive", "--out", run, "--exact-out"])
    err = capsys.readouterr().err
    assert e.value.code == 1 and "Permission denied" in err
    assert f"--resume {run}" in err and "in method naive at iteration 0" in err


def test_runs_started_in_the_same_second_get_their_own_folders(tmp_path):
    from experiments.run_folder import new_stamped_dir

    first, second = (new_stamped_dir(str(tmp_path / "fourrooms")) for _ in range(2))
    assert first != second and os.path.isdir(first) and os.path.isdir(second)
    # the second of one second gets a suffix; never the first's folder
    assert os.path.basename(second).startswith(os.path.basename(first)[:15])


def test_a_method_named_twice_is_trained_and_listed_once():
    from experiments.cli import parse_methods

    assert parse_methods("bchg,naive,bchg", cli.ALL_METHODS, cli.ALL_METHODS) == ["bchg", "naive"]
    assert parse_methods(" bchg, naive", cli.ALL_METHODS, cli.ALL_METHODS) == ["bchg", "naive"]
    # an empty name was dropped: 'bchg,,naive' may have lost a method between its commas
    for spec in ("bchg,,", "bchg,,naive", ",bchg", ""):
        with pytest.raises(ValueError, match="empty name"):
            parse_methods(spec, cli.ALL_METHODS, cli.ALL_METHODS)


@pytest.mark.parametrize(
    "module, flags",
    [
        ("thermal", ["--episodes", "50", "--mlp-steps", "300", "--value-samples", "64"]),
        ("lqr_game", ["--warmup-steps", "5000"]),
    ],
)
def test_config_of_a_smoke_run_keeps_explicit_flags(module, flags, tmp_path):
    """A smoke run's config.json says ``smoke: true`` and holds its reduced values; with
    ``--config`` every flag given on the command line must still win (the CLIs' own --smoke caps
    applied only when --smoke itself is on the command line)."""
    import importlib
    import json

    from experiments.cli import saved_args

    mod = importlib.import_module(f"experiments.{module}")
    smoke = mod.parse_args(["--smoke"])
    path = tmp_path / "config.json"
    path.write_text(json.dumps({"experiment": module, "args": saved_args(smoke)}))
    a = mod.parse_args(["--config", str(path), *flags])
    assert a.smoke  # taken from the file
    for flag, value in zip(flags[::2], flags[1::2], strict=True):
        assert getattr(a, flag[2:].replace("-", "_")) == int(value), flag
    b = mod.parse_args(["--config", str(path), "--smoke", *flags])  # --smoke given: capped
    assert any(
        getattr(b, f[2:].replace("-", "_")) < int(v)
        for f, v in zip(flags[::2], flags[1::2], strict=True)
    )


def test_smoke_keeps_an_explicit_chunk_and_checks_it():
    """``--smoke`` sets chunks of 10 only when --chunk is not given: ``--smoke --chunk 5`` ran in
    chunks of 10 (and saved 10), and ``--smoke --chunk 0`` was accepted."""
    assert cli.parse_args(["--smoke"]).chunk == 10
    a = cli.parse_args(["--smoke", "--chunk", "5"])
    assert a.chunk == 5 and a.iterations == 20
    with pytest.raises(ValueError, match="chunk"):
        cli.validate_args(cli.parse_args(["--smoke", "--chunk", "0"]))


@pytest.mark.slow
def test_resume_command_and_recorded_command_survive_a_path_with_spaces(
    tmp_path, monkeypatch, capsys
):
    """The printed "Resume with" command and config.json's command were not shell-quoted: with
    --out "my runs/b 1" the pasted command resumed "my" and failed on the other words."""
    import shlex

    import bchg_jax.core.io as bio

    def refuse(path, state, step=0):
        raise PermissionError(13, "Permission denied", path)

    monkeypatch.setattr(bio, "save_state", refuse)
    run = str(tmp_path / "my runs" / "b 1")
    argv = ["--smoke", "--method", "naive", "--out", run, "--exact-out"]
    with pytest.raises(SystemExit):
        cli.main(argv)
    line = capsys.readouterr().err.strip().splitlines()[-1]
    assert shlex.split(line) == ["python", "-m", "experiments.fourrooms", "--resume", run]
    command = json.load(open(os.path.join(run, "config.json")))["command"]
    assert shlex.split(command)[3:] == argv


@pytest.mark.parametrize(
    "argv, named",
    [
        (["--lr", "0.1", "--lr", "0.05"], "--lr is given 2 times (0.1, then 0.05)"),
        (["--seeds", "3", "--seeds", "5"], "--seeds is given 2 times (3, then 5)"),
        (["--method", "bchg", "--method", "naive"], "--method is given 2 times"),
    ],
)
def test_a_flag_given_twice_with_other_values_is_refused(argv, named, capsys):
    """argparse kept the last value and dropped the others: --lr 0.1 --lr 0.05 trained lr 0.05
    alone, with nothing said."""
    with pytest.raises(SystemExit) as e:
        cli.parse_args(argv)
    assert e.value.code == 2 and named in capsys.readouterr().err
    a = cli.parse_args(["--seeds", "3", "--seeds", "3", "--lr", "0.1", "0.05"])  # the same: fine
    assert cli.parse_args(["--lr", "nan", "--lr", "nan"]).lr == [pytest.approx(np.nan, nan_ok=True)]
    assert a.seeds == 3 and a.lr == [0.1, 0.05]


def test_metrics_jsonl_is_strict_json_when_a_seed_diverges(tmp_path):
    """A non-finite mean was written as Python's NaN token, which is not JSON: JavaScript's
    JSON.parse (and any strict reader of the documented JSON lines) rejected the line."""
    from experiments.run_folder import _append_jsonl

    J = np.ones((2, 2, 4))
    J[1, 0, 3] = np.nan
    path = str(tmp_path / "metrics.jsonl")
    _append_jsonl(path, "bchg", {"J": J}, 0, 4, 1.0, 10, {"lr": np.array([0.1, 0.2])})

    def strict(token):
        raise ValueError(f"{token} is not JSON")

    line = json.loads(open(path).read(), parse_constant=strict)
    assert line["metrics"]["J"]["last"] == [1.0, None]
    assert line["metrics"]["J"]["window_mean"] == [1.0, None]


def test_resume_inside_a_method_folder_names_the_run_folder(tmp_path, capsys):
    """--resume RUN/bchg/checkpoint was told to resume RUN/bchg, a method's folder, which is
    refused in turn: the advice must name RUN."""
    from experiments.cli import resume_args

    run = tmp_path / "run"
    (run / "bchg" / "checkpoint" / "20").mkdir(parents=True)
    (run / "config.json").write_text(json.dumps({"experiment": "fourrooms", "args": {}}))
    (run / "bchg" / "config.json").write_text(json.dumps({"method": "bchg", "args": {}}))
    for inside in (run / "bchg", run / "bchg" / "checkpoint", run / "bchg" / "checkpoint" / "20"):
        with pytest.raises(SystemExit):
            resume_args(cli.parse_args(["--resume", str(inside)]), "fourrooms")
        err = capsys.readouterr().err
        assert err.rstrip().endswith(f"--resume {run}"), err
    # the hint names the run's own experiment; a folder under a project with a config.json of
    # another tool is no run's
    with pytest.raises(SystemExit):
        resume_args(cli.parse_args(["--resume", str(run / "bchg")]), "thermal")
    assert "python -m experiments.fourrooms --resume" in capsys.readouterr().err
    (tmp_path / "config.json").write_text(json.dumps({"experiment": "mine"}))
    with pytest.raises(SystemExit):
        resume_args(cli.parse_args(["--resume", str(tmp_path / "new")]), "fourrooms")
    assert "no config.json there (not a run folder)" in capsys.readouterr().err


def test_a_flag_no_method_of_the_run_reads_is_refused(tmp_path, capsys):
    """Two audits found flags accepted that the run never read (metrics.npz identical in every
    key to the run without them, config.json recording them as used): thermal's MLP-critic
    flags with another --critic or --method exact alone, --follower-grad / --no-baseline
    without a method that reads them; Four-Rooms' --sarsa-alpha with no SARSA method; the
    LQR game's --explore-std without behaviour episodes, --clip with no clipped method, critic
    flags with the exact methods alone; the toy game's --critic-target for Bi-AC alone. Each
    is refused before anything is compiled."""
    from experiments import fourrooms, lqr_game, thermal, toy_game

    cases = [
        (thermal, ["--mlp-lr", "0.5", "--value-samples", "2"], "--mlp-lr and --value-samples"),
        (thermal, ["--critic", "exact", "--mlp-kernel", "fused"], "--mlp-kernel would be"),
        (thermal, ["--method", "exact", "--episodes", "3"], "--episodes would be ignored"),
        (thermal, ["--method", "naive", "--follower-grad", "score"], "--follower-grad would"),
        (thermal, ["--method", "hpgd_td", "--no-baseline"], "--no-baseline would be"),
        (fourrooms, ["--method", "naive,hpgd_mc", "--sarsa-alpha", "0.3"], "--sarsa-alpha"),
        (lqr_game, ["--preset", "reference", "--explore-std", "0.9"], "--explore-std would"),
        (lqr_game, ["--preset", "reference", "--method", "naive_on", "--clip", "0.5"], "--clip"),
        (
            lqr_game,
            ["--method", "exact", "--tau", "0.5", "--critic-lr", "0.01"],
            "--critic-lr and --tau",
        ),
        (toy_game, ["--method", "biac_on", "--critic-target", "paper"], "--critic-target"),
        # an audit: the exact methods train no critic (critic_steps 20 was recorded and tabled)
        (lqr_game, ["--method", "exact,exact_direct", "--critic-steps", "0"], "--critic-steps"),
        # Theorem 3's surrogate reads no direct baseline or influence: the same gradient
        (lqr_game, ["--method", "bchg_det,naive_det", "--estimator", "unbiased"], "--estimator"),
    ]
    for mod, argv, says in cases:
        with pytest.raises(SystemExit) as e:
            mod.main(["--smoke", *argv, "--out", str(tmp_path / "x")])
        err = capsys.readouterr().err
        assert e.value.code == 2 and says in err and "drop" in err, (argv, err)
        assert not os.path.exists(tmp_path / "x")
    # where a method reads them they pass the checks
    for mod, argv in (
        (thermal, ["--critic", "mlp", "--mlp-lr", "0.5"]),
        (thermal, ["--faithful", "--mlp-kernel", "fused"]),
        (thermal, ["--method", "bchg,exact", "--no-baseline", "--follower-grad", "score"]),
        (fourrooms, ["--method", "naive,bchg", "--sarsa-alpha", "0.3"]),
        (lqr_game, ["--preset", "reference", "--method", "bchg", "--clip", "0.5"]),
        (lqr_game, ["--explore-std", "0.9"]),
        (lqr_game, ["--method", "bchg_det,naive", "--estimator", "unbiased"]),
        (toy_game, ["--method", "bchg,biac_on", "--critic-target", "paper"]),
    ):
        mod.validate_args(mod.parse_args(argv))


def test_lqr_game_config_of_one_preset_with_another_preset_is_refused(tmp_path, capsys):
    """--config FILE --preset X ran FILE's flag values (one preset's) with X's settings that
    have no flag (4 actor episodes instead of 2, the critic's normalisation ...): neither
    preset, and config.json said preset X."""
    import json

    from experiments import lqr_game

    cfg = tmp_path / "config.json"
    args = vars(lqr_game.parse_args([]))
    args = {k: v for k, v in args.items() if not k.startswith("_")}
    cfg.write_text(json.dumps({"experiment": "lqr_game", "args": args}))
    with pytest.raises(SystemExit) as e:
        lqr_game.parse_args(["--config", str(cfg), "--preset", "reference"])
    err = capsys.readouterr().err
    assert e.value.code == 2 and "holds a --preset explore run" in err
    assert lqr_game.parse_args(["--config", str(cfg), "--preset", "explore"]).preset == "explore"
    assert lqr_game.parse_args(["--config", str(cfg)]).preset == "explore"


def test_config_of_one_follower_model_with_another_follower_flag(tmp_path):
    """--config FILE --follower X, FILE from a run of another follower model: FILE's setting
    of its model (follower_steps = 3 of a k_step run) was copied and refused as a setting of
    another kind, and no flag could reset it (the error named a flag never given)."""
    from experiments import cli as common
    from experiments import toy_game

    for mod, saved, argv, want in (
        (cli, ["--follower", "k_step", "--follower-steps", "3"], ["--follower", "lag"], "lag"),
        (cli, ["--follower", "k_step", "--follower-steps", "3"], [], "k_step"),
        (
            toy_game,
            ["--follower", "lag", "--follower-mix", "0.3"],
            ["--follower", "k_step"],
            "k_step",
        ),
        (
            toy_game,
            ["--follower", "lag", "--follower-mix", "0.3"],
            ["--follower", "best_response"],
            "best_response",
        ),
    ):
        args = {k: v for k, v in vars(mod.parse_args(saved)).items() if not k.startswith("_")}
        cfg = tmp_path / f"{mod.__name__}.json"
        cfg.write_text(json.dumps({"experiment": mod.__name__.rsplit(".", 1)[-1], "args": args}))
        a = mod.parse_args(["--config", str(cfg), *argv])
        model = common.follower_model(a)
        assert model.kind == want
        if want == "k_step":
            assert model.steps == (3 if not argv else 1)
        if want == "lag":
            assert model.mix == 0.1 and model.steps == 1


def test_refusals_name_the_flag_and_its_real_range(capsys):
    """An audit: --beta 0 was refused as "beta (follower entropy coefficient) must ..." (no
    flag named), --critic-steps -1 with the range [0, 10] that the flag itself widens, and the
    toy game's --R 1e39 (finite in Python, inf in its float32 tables) as a table of the game."""
    from experiments import lqr_game, toy_game

    for mod, argv, says in (
        (toy_game, ["--beta", "0"], "--beta (follower entropy coefficient) must be finite"),
        (lqr_game, ["--beta", "nan"], "--beta (follower entropy coefficient) must be finite"),
        (lqr_game, ["--critic-steps", "-1"], "--critic-steps must be an integer >= 0, got -1"),
        (toy_game, ["--R", "1e39"], "--R must be finite in float32"),
    ):
        with pytest.raises(SystemExit) as e:
            mod.main(["--smoke", *argv])
        assert e.value.code == 2 and says in capsys.readouterr().err, argv
    lqr_game.validate_args(lqr_game.parse_args(["--critic-steps", "50", "--actor-steps", "40"]))
