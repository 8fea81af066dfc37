"""The shared command-line rules of the experiments (``experiments.cli``, ``run_folder``),
called directly on a saved config: what ``--resume`` takes from the command line (``--shard``,
``--chunk``) and from the run (``--iterations``); what ``--config`` never takes (where a run
goes) and where an explicit flag wins; a follower flag of another model is kept to be refused;
the seed limit; the ``resumed`` history; ``--exact-out`` never replacing a user's file; a
metrics.jsonl chunk mean over the chunk's own iterations."""

import json
import os
import re

import numpy as np
import pytest

from experiments import fourrooms
from experiments.cli import check_base_seed, follower_model, resume_args, saved_args
from experiments.run_folder import _append_jsonl, prepare_run_dir


def _run(tmp_path, argv=(), **extra):
    """A Four-Rooms run folder (its config.json only) saved from ``argv``."""
    run = tmp_path / "run"
    run.mkdir()
    args = saved_args(fourrooms.parse_args(list(argv)))
    record = {"experiment": "fourrooms", "methods": ["naive"], "args": args, **extra}
    (run / "config.json").write_text(json.dumps(record))
    return run


def _config_file(tmp_path, argv, **extra):
    cfg = tmp_path / "config.json"
    args = saved_args(fourrooms.parse_args(argv))
    cfg.write_text(json.dumps({"experiment": "fourrooms", "args": args, **extra}))
    return str(cfg)


def test_resume_takes_shard_and_chunk_from_the_command_line_and_the_rest_from_the_run(tmp_path):
    run = _run(tmp_path, ["--method", "naive", "--shard", "--chunk", "10", "--iterations", "40"])
    a = resume_args(fourrooms.parse_args(["--resume", str(run), "--chunk", "5"]), "fourrooms")
    assert a.chunk == 5 and a.shard is False and a.iterations == 40
    b = resume_args(fourrooms.parse_args(["--resume", str(run)]), "fourrooms")
    assert b.chunk == 10 and b.iterations == 40  # not the default 10,000


def test_config_never_takes_where_a_run_goes_and_an_explicit_method_wins(tmp_path):
    """A repeat of a saved ``--exact-out`` run would otherwise write into the saved run's own
    folder; a method folder's config names its method, which an explicit ``--method`` beats."""
    old = str(tmp_path / "old")
    cfg = _config_file(tmp_path, ["--method", "naive", "--out", old, "--exact-out", "--chunk", "7"])
    a = fourrooms.parse_args(["--config", cfg])
    assert a.out == "results" and a.exact_out is False and a.chunk != 7 and a.method == "naive"
    cfg = _config_file(tmp_path, ["--method", "naive,bchg"], method="naive")
    assert fourrooms.parse_args(["--config", cfg]).method == "naive"
    assert fourrooms.parse_args(["--config", cfg, "--method", "bchg"]).method == "bchg"


@pytest.mark.parametrize(
    "setting, message",
    [
        ({"seeds": 1.5}, r"seeds = 1\.5: 1\.5 is not a value of --seeds"),
        ({"iterations": 10.5}, "iterations = 10.5"),
        ({"beta": "abc"}, r"beta = \"abc\".*could not convert"),
        ({"beta": None}, "beta = null: must not be null"),
        ({"lr": 0.2}, "lr = 0.2: must be a list"),
        ({"lr": [0.1, "x"]}, r"\"x\" is not a value of --lr"),
        ({"method": ["bchg"]}, "method = "),
        ({"parallel_steps": 1}, "parallel_steps = 1: must be true or false"),
        ({"solver": "fast"}, 'solver = "fast": must be one of'),
    ],
)
def test_config_file_values_are_checked_as_their_flags(tmp_path, capsys, setting, message):
    """A hand-written --config file's values went in unchecked: "seeds": 1.5 or "lr": 0.2
    ended in a traceback (exit 1) after the run folder was made, which --resume then could not
    read. Each value is now converted and checked as its flag would be (exit 2, nothing
    written); "iterations": "10" is read as 10, as --iterations 10 is."""
    cfg = tmp_path / "c.json"
    cfg.write_text(json.dumps({"args": setting}))
    with pytest.raises(SystemExit) as stop:
        fourrooms.parse_args(["--config", str(cfg), "--out", str(tmp_path / "o")])
    assert stop.value.code == 2
    assert re.search(message, capsys.readouterr().err)
    assert not (tmp_path / "o").exists()
    cfg.write_text(json.dumps({"args": {"iterations": "10", "lr": [0.1, 1], "beta": 0.1}}))
    a = fourrooms.parse_args(["--config", str(cfg)])
    assert (a.iterations, a.lr, a.beta) == (10, [0.1, 1.0], 0.1)
    assert isinstance(a.lr[1], float)


@pytest.mark.parametrize(
    "setting, message",
    [
        ({"seeds": 1.5}, r"its config\.json: seeds = 1\.5: 1\.5 is not a value of --seeds"),
        ({"lr": 0.2}, "lr = 0.2: must be a list"),
        ({"dtype": "float16"}, 'dtype = "float16": must be one of float32, float64'),
        ({"speed": 3}, r"settings \['speed'\] are not flags of python -m experiments\.fourrooms"),
    ],
)
def test_resume_checks_the_saved_values_as_their_flags(tmp_path, capsys, setting, message):
    """--resume trained on its config.json's values unchecked (only --config checked them): a
    hand-edited "seeds": 1.5 ended in a traceback deep in the run. They are now checked as
    --config's are (exit 2); the saved values of an intact run are read back unchanged, and a
    run saved before --dtype existed goes on in float32."""
    run = _run(tmp_path, ["--method", "naive", "--lr", "0.1", "0.05", "--iterations", "40"])
    record = json.loads((run / "config.json").read_text())
    del record["args"]["dtype"]  # a run saved before --dtype computed in float32
    (run / "config.json").write_text(json.dumps(record))
    intact = resume_args(fourrooms.parse_args(["--resume", str(run)]), "fourrooms")
    assert (intact.lr, intact.iterations, intact.dtype) == ([0.1, 0.05], 40, "float32")
    record["args"].update(setting)
    (run / "config.json").write_text(json.dumps(record))
    with pytest.raises(SystemExit) as stop:
        resume_args(fourrooms.parse_args(["--resume", str(run)]), "fourrooms")
    assert stop.value.code == 2
    assert re.search(message, capsys.readouterr().err)


def test_resume_names_a_hand_edited_dtype_before_the_x64_check(tmp_path, capsys):
    """A float64 run whose dtype was edited to float16 was told to set JAX_ENABLE_X64=1 (the x64
    check ran on the unchecked value), and a float32 run edited to float64 to set
    JAX_ENABLE_X64=0, which the float64 setting overrides: each is now named as it is, before
    x64 is touched."""
    for x64, dtype, says in (
        (True, "float16", 'dtype = "float16": must be one of float32, float64'),
        (False, "float64", "has dtype float64, but the run was started with jax_enable_x64=False"),
    ):
        (tmp_path / dtype).mkdir()
        run = _run(tmp_path / dtype, ["--method", "naive"], jax_enable_x64=x64)
        record = json.loads((run / "config.json").read_text())
        record["args"]["dtype"] = dtype
        (run / "config.json").write_text(json.dumps(record))
        with pytest.raises(SystemExit) as stop:
            resume_args(fourrooms.parse_args(["--resume", str(run)]), "fourrooms")
        err = capsys.readouterr().err
        assert stop.value.code == 2 and says in err and "JAX_ENABLE_X64" not in err, err


def test_an_explicit_setting_of_another_follower_is_refused_not_reset(tmp_path):
    """--config (a k_step run) --follower lag --follower-steps 5: the saved --follower-steps is
    reset with the model, the one given is kept, and refused as k_step's setting."""
    cfg = _config_file(tmp_path, ["--follower", "k_step", "--follower-steps", "3"])
    a = fourrooms.parse_args(["--config", cfg, "--follower", "lag", "--follower-steps", "5"])
    assert a.follower_steps == 5
    with pytest.raises(ValueError, match="--follower-steps is a setting of --follower k_step"):
        follower_model(a)
    assert fourrooms.parse_args(["--config", cfg, "--follower", "lag"]).follower_steps == 1


def test_the_seed_limit_is_exclusive():
    check_base_seed(fourrooms.parse_args(["--seed", str(2**32 - 1)]))
    with pytest.raises(ValueError, match="--seed"):
        check_base_seed(fourrooms.parse_args(["--seed", str(2**32)]))


def test_resume_appends_to_the_resumed_history(tmp_path):
    run = _run(tmp_path, ["--method", "naive"], command="first", resumed=[{"command": "second"}])
    argv = ["--resume", str(run)]
    a = resume_args(fourrooms.parse_args(argv), "fourrooms")
    prepare_run_dir(a, "fourrooms", ["naive"], fourrooms.SETTING_KEYS, argv)
    cfg = json.loads((run / "config.json").read_text())
    assert cfg["command"] == "first"
    assert [r["command"] for r in cfg["resumed"]][:1] == ["second"]
    assert len(cfg["resumed"]) == 2 and cfg["resumed"][1]["command"].endswith(f"--resume {run}")


def test_exact_out_refuses_a_users_folder_holding_a_file_the_run_writes(tmp_path, capsys):
    out = tmp_path / "mine"
    out.mkdir()
    (out / "summary.csv").write_text("my table")
    argv = ["--method", "naive", "--out", str(out), "--exact-out"]
    with pytest.raises(SystemExit) as e:
        prepare_run_dir(
            fourrooms.parse_args(argv), "fourrooms", ["naive"], fourrooms.SETTING_KEYS, argv
        )
    assert e.value.code == 2 and "holds summary.csv and no run" in capsys.readouterr().err
    assert (out / "summary.csv").read_text() == "my table"
    assert not os.path.exists(out / "config.json")


def test_a_jsonl_chunk_mean_is_over_the_chunks_iterations(tmp_path):
    J = np.arange(6, dtype=float)[None, None, :] * np.ones((1, 2, 1))  # iterations 0..5
    path = str(tmp_path / "m.jsonl")
    _append_jsonl(path, "naive", {"J": J}, 4, 6, 1.0, 3, {"lr": np.array([0.1])})
    line = json.loads(open(path).read())
    assert line["chunk_iterations"] == 2 and line["window"] == 3
    assert line["metrics"]["J"] == {"last": [5.0], "chunk_mean": [4.5], "window_mean": [4.0]}
