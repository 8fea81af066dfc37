"""``experiments.fourrooms``'s flags reach what it trains and records: the documented defaults
(README, docs/experiments.md: lr 0.1, alpha 0.5, beta 1e-3, batch 100, the reference slip
model, a 1000-iteration window), the grids of ``--grid paper``, the refusal of beta 0, and the
trainer's config, problem and run-folder record of each flag (captured in-process, nothing
trained)."""

import numpy as np
import pytest
from cli_capture import captured_run

from experiments import fourrooms as cli


def _captured_run(argv, method, monkeypatch, tmp_path):
    return captured_run(
        monkeypatch,
        tmp_path,
        cli,
        argv,
        method,
        ("bchg_jax.problems.fourrooms", "fourrooms"),
        "bchg_jax.tabular.train",
        "validate_all",
    )


def test_fourrooms_defaults_match_the_documents():
    """The documented main job: lr 0.1 / alpha 0.5, beta 1e-3, batch 100 (1 x 100), the
    reference slip model, the auto solver, 10 seeds x 10,000 iterations, window 1000."""
    a = cli.parse_args([])
    got = (a.lr, a.sarsa_alpha, a.beta, a.batch, a.slip_model, a.solver, a.parallel_steps)
    assert got == ([0.1], [0.5], 1e-3, 100, "reference", "auto", False)
    assert (a.seeds, a.iterations, a.chunk) == (10, 10_000, 500)
    assert cli.batch_shape(a.batch) == (1, 100)
    assert cli.SUMMARY_WINDOW == 1000


def test_fourrooms_paper_grid_and_sarsa_axis():
    """--grid paper: lr in {0.5, 0.1, 0.05, 0.01}, x alpha in {0.1, ..., 1.0} (24 points) only
    for the SARSA methods; the others have no sarsa_alpha axis (4 points)."""
    a = cli.parse_args(["--grid", "paper", "--beta", "0.003"])
    g = cli.method_grid("bchg", a)
    assert len(g["lr"]) == 24 and set(np.round(g["lr"], 6)) == {0.5, 0.1, 0.05, 0.01}
    assert set(np.round(g["sarsa_alpha"], 6)) == {0.1, 0.3, 0.5, 0.7, 0.9, 1.0}
    assert np.allclose(g["beta"], 0.003)
    assert len(cli.method_grid("hpgd_sa", a)["lr"]) == 24
    n = cli.method_grid("naive", a)
    assert set(n) == {"lr", "beta"} and sorted(np.round(n["lr"], 6)) == [0.01, 0.05, 0.1, 0.5]
    b = cli.parse_args(["--lr", "0.2", "0.3", "--sarsa-alpha", "0.4"])
    g = cli.method_grid("bchg", b)
    assert sorted(np.round(g["lr"], 6)) == [0.2, 0.3] and np.allclose(g["sarsa_alpha"], 0.4)


def test_fourrooms_beta_zero_is_refused():
    """--beta must be > 0 (the soft best response divides by beta): 0 is refused before
    anything compiles."""
    with pytest.raises(ValueError, match="beta"):
        cli.validate_all(cli.parse_args(["--beta", "0"]))


def test_fourrooms_flags_reach_the_trainer_and_its_record(monkeypatch, tmp_path):
    """--batch, --solver, --parallel-steps, --slip-model, --track-reference and --iterations
    reach the TrainConfig / problem given to make_train, and the title and description name
    them."""
    argv = ["--batch", "400", "--solver", "dense", "--parallel-steps", "--slip-model", "paper"]
    argv += ["--iterations", "30", "--track-reference", "--beta", "0.005"]
    seen = _captured_run(argv, "bchg", monkeypatch, tmp_path)
    c = seen["config"]
    assert (c.num_envs, c.num_steps, c.iterations) == (2, 200, 30)
    assert (c.solver, c.parallel_steps, c.track_reference) == ("dense", True, True)
    args, kw = seen["problem_args"]
    assert "paper" in list(args) + list(kw.values())
    assert seen["method"] == "bchg" and seen["window"] == 1000
    assert seen["record"]["train_config"]["solver"] == "dense"
    assert "batch 400" in seen["title"] and "slip model paper" in seen["title"]
    assert seen["describe"] == "Four-Rooms [paper] beta=0.005 batch=400 (2x200)"
    assert set(seen["grid"]) == {"lr", "sarsa_alpha", "beta"}
    d = _captured_run([], "naive", monkeypatch, tmp_path)
    assert (d["config"].solver, d["config"].parallel_steps) == ("auto", False)
    assert "reference" in list(d["problem_args"][0]) + list(d["problem_args"][1].values())


def test_fourrooms_setting_keys_cover_the_run_defining_flags():
    """A second invocation may add methods, not change the slip model, solver, batch, beta,
    grid or step mode of the run folder."""
    keys = set(cli.SETTING_KEYS)
    assert {"slip_model", "solver", "parallel_steps", "batch", "beta", "lr", "sarsa_alpha"} <= keys
    assert {"seeds", "seed", "grid", "iterations", "follower"} <= keys
