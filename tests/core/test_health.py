"""Non-convergence is never silent: every trainer flags capped solves and skipped updates, the
progress line shows them and a run with more than 1% warns loudly (on stderr)."""

import jax
import numpy as np
import pytest
from small_problems import tied_cmdp

from bchg_jax import games, lq, problems, run_grid, tabular
from bchg_jax.core.health import health_text, health_warning, solver_health


def test_health_counts_and_warning_threshold():
    m = {
        "solve_capped": np.zeros((2, 3, 100), np.int32),
        "update_skipped": np.zeros((2, 3, 100), np.int32),
        "J": np.zeros((2, 3, 100)),
    }
    h = solver_health(m)
    assert h == {
        "run_iterations": 600,
        "solve_capped": 0,
        "capped_share": 0.0,
        "update_skipped": 0,
        "skipped_share": 0.0,
    }
    assert health_text(h) == "capped 0.00% skipped 0" and health_warning(h) is None
    m["solve_capped"][0, 0, :6] = 1  # 1.0%: at the threshold, no warning
    assert health_warning(solver_health(m)) is None
    m["solve_capped"][0, 0, 6] = 1  # 7 of 600 > 1%
    m["update_skipped"][1, 2, :] = 1
    h = solver_health(m)
    assert h["solve_capped"] == 7 and h["update_skipped"] == 100
    w = health_warning(h)
    assert "1.2% of 600" in w and "16.7% of 600" in w and "metrics.npz" in w
    assert solver_health({"J": np.zeros(3)}) == {}


def test_a_lost_support_alone_is_reported_not_called_unconverged():
    """Iterations whose model left the successor table were solved on the whole table: the
    warning said the results were "not converged solves" and the final table bolded them."""
    from bchg_jax.core.health import suspect

    m = {k: np.zeros((1, 2, 10), np.int32) for k in ("solve_capped", "update_skipped")}
    m["support_lost"] = np.zeros((1, 2, 10), np.int32)
    m["support_lost"][0, 0, :5] = 1
    h = solver_health(m)
    w = health_warning(h)
    assert "25.0% of 20" in w and "whole table" in w and "not converged" not in w
    assert not suspect(h)
    m["solve_capped"][0, 1, :3] = 1
    h = solver_health(m)
    assert "not converged" in health_warning(h) and suspect(h)


def test_a_non_finite_exact_return_is_counted_and_warned():
    """The LQR game's trainer records ``metric_nonfinite`` (an exact J that is not finite: the
    state's moments overflowed the dtype); it was a silent NaN in the curve. It is counted, shown
    when it happened, and warned about above 1% without the "not converged solves" line."""
    m = {
        "solve_capped": np.zeros((1, 2, 50), np.int32),
        "update_skipped": np.zeros((1, 2, 50), np.int32),
        "metric_nonfinite": np.zeros((1, 2, 50), np.int32),
    }
    h = solver_health(m)
    assert h["metric_nonfinite"] == 0 and health_text(h) == "capped 0.00% skipped 0"
    assert health_warning(h) is None
    m["metric_nonfinite"][0, 1, :3] = 1
    h = solver_health(m)
    assert h["metric_nonfinite"] == 3 and h["nonfinite_share"] == 0.03
    assert health_text(h) == "capped 0.00% skipped 0 J not finite 3"
    w = health_warning(h)
    assert "3.0% of 100" in w and "metric_nonfinite" in w and "not converged solves" not in w


def _run_capped(trainer, grid, capsys, iterations=3):
    _, m = run_grid(trainer, grid, seeds=2, iterations=iterations, chunk=iterations)
    out = capsys.readouterr()
    assert m["solve_capped"].shape == (1, 2, iterations)
    return m, out


def _run_healthy(trainer, grid, capsys, iterations=3):
    _, m = run_grid(trainer, grid, seeds=2, iterations=iterations, chunk=iterations)
    out = capsys.readouterr()
    assert "capped 0.00% skipped 0" in out.out and "WARNING" not in out.err
    return m


@pytest.mark.slow
def test_tabular_cap_is_flagged_and_warned(capsys):
    prob = problems.random_tabular_cmdp(jax.random.key(0), num_states=5, num_actions=3)
    grid = {"lr": [0.1], "sarsa_alpha": [0.5], "beta": [0.1]}
    cfg = dict(num_envs=2, num_steps=5, iterations=3)
    m = _run_healthy(tabular.make_train(prob, "bchg", tabular.TrainConfig(**cfg)), grid, capsys)
    assert m["update_skipped"].sum() == 0
    # a tolerance the sweep cap cannot reach (2 sweeps from a cold start at beta 0.1)
    m, out = _run_capped(
        tabular.make_train(prob, "bchg", tabular.TrainConfig(vi_max_sweeps=2, **cfg)), grid, capsys
    )
    assert m["solve_capped"].all() and m["update_skipped"].sum() == 0
    assert "capped 100.00%" in out.out and "WARNING" in out.err and "solves hit" in out.err


@pytest.mark.slow
def test_float32_logit_rounding_is_flagged_and_warned(capsys):
    """A float32 tabular run at beta 1e-4 with follower values ~5e3 (two nearly tied actions:
    the exact hypergradient 24% off, every solve converged) was silent; every iteration is now
    flagged ``logits_rounded``, shown on the progress line and warned about. The same problem
    at beta 0.5 (rounding 1e-4 of the threshold's scale) is not flagged."""
    cfg = tabular.TrainConfig(num_envs=2, num_steps=100, iterations=3)
    grid = {"lr": [0.1], "sarsa_alpha": [0.5], "beta": [1e-4]}
    problem = tied_cmdp(1e3, 1e-4, np.float32)
    _, m = run_grid(tabular.make_train(problem, "bchg", cfg), grid, seeds=2, iterations=3, chunk=3)
    out = capsys.readouterr()
    assert m["logits_rounded"].all() and not m["solve_capped"].any()
    assert "float32 logits rounded 6" in out.out and "rounded the follower's logits" in out.err
    grid["beta"] = [0.5]
    m = _run_healthy(tabular.make_train(problem, "bchg", cfg), grid, capsys)
    assert not m["logits_rounded"].any()


@pytest.mark.slow
def test_lq_cap_is_flagged_skipped_and_warned(capsys):
    th = problems.thermal()
    grid = {"lr": [0.1], "beta": [0.1]}
    cfg = dict(num_episodes=2, iterations=3)
    m, out = _run_capped(
        lq.make_train(th, "exact", lq.TrainConfig(riccati_max_iters=2, **cfg)), grid, capsys
    )
    assert m["solve_capped"].all() and m["update_skipped"].all()
    assert "skipped 6" in out.out and "updates were skipped" in out.err
    m = _run_healthy(lq.make_train(th, "exact", lq.TrainConfig(**cfg)), grid, capsys)


@pytest.mark.slow
def test_tabular_game_cap_is_flagged(capsys):
    game = problems.toy_game()
    cfg = dict(episodes=2, minibatch=8, iterations=2)
    grid = {"actor_steps": [1], "critic_steps": [1], "beta": [0.05]}
    m, out = _run_capped(
        games.tabular.make_train(
            game, "bchg", games.tabular.TrainConfig(follower_max_sweeps=2, **cfg)
        ),
        grid,
        capsys,
        iterations=2,
    )
    assert m["solve_capped"].all() and "WARNING" in out.err


@pytest.mark.slow
def test_lqr_game_cap_is_flagged_and_skipped(capsys):
    game = problems.lqr_game()
    cfg = dict(iterations=2, exploration=games.lqr.ExplorationConfig(warmup_steps=0))
    grid = {"actor_steps": [1], "critic_steps": [1], "beta": [0.1]}
    m, out = _run_capped(
        games.lqr.make_train(game, "exact", games.lqr.TrainConfig(follower_max_iters=1, **cfg)),
        grid,
        capsys,
        iterations=2,
    )
    assert m["solve_capped"].all() and m["update_skipped"].all()
    assert "updates were skipped" in out.err


def test_cli_summary_reports_health(tmp_path, capsys):
    """The CLI's per-method summary prints the health, summary.csv carries it, and the run
    summary warns once more."""
    from experiments.report import finish_method, finish_run

    J = np.zeros((1, 2, 50))
    capped = np.zeros((1, 2, 50), np.int32)
    capped[0, 0, :10] = 1
    data = {
        "J": J,
        "solve_capped": capped,
        "update_skipped": np.zeros_like(capped),
        "grid_lr": np.array([0.1]),
    }
    s = finish_method(
        str(tmp_path), "bchg", {"lr": np.array([0.1])}, data, 10, "t", "J", write=True
    )
    out = capsys.readouterr()
    assert "capped 10.00% skipped 0" in out.out and "WARNING" in out.err
    assert s["health"]["solve_capped"] == 10
    header, row = open(tmp_path / "summary.csv").read().splitlines()[:2]
    health = "capped_share,skipped_updates,support_lost,logits_rounded,metric_nonfinite"
    assert header.endswith("nonfinite_seeds," + health + ",follower_stalled")
    assert row.endswith("0,0.1000,0,0,0,0,0")
    finish_run(str(tmp_path), [s], 10)
    out = capsys.readouterr()
    assert "capped 10.00%" in out.out and "bchg" in out.err


def test_resumed_legacy_metrics_get_zero_flags():
    """Metrics saved before the flags existed: the earlier iterations read 0, not dropped."""
    from bchg_jax.core.sweep import join_chunks

    old = {"J": np.ones((1, 2, 4))}
    new = {"J": np.ones((1, 2, 3)), "solve_capped": np.ones((1, 2, 3), np.int32)}
    m = join_chunks([old, new])
    assert m["J"].shape == (1, 2, 7)
    np.testing.assert_array_equal(m["solve_capped"][..., :4], 0)
    np.testing.assert_array_equal(m["solve_capped"][..., 4:], 1)


def test_a_resumed_float_metric_reads_nan_where_it_was_not_recorded():
    """A float metric the earlier chunk lacks (a policy per iteration, a cosine) was 0 there: a
    made-up value on its curve. It is NaN (not recorded); the flags stay 0."""
    from bchg_jax.core.sweep import join_chunks

    old = {"J": np.ones((1, 2, 4))}
    new = {"J": np.ones((1, 2, 3)), "pi": np.full((1, 2, 3, 5), 0.2, np.float32)}
    m = join_chunks([old, new])
    assert m["pi"].shape == (1, 2, 7, 5) and m["pi"].dtype == np.float32
    assert np.isnan(m["pi"][:, :, :4]).all() and (m["pi"][:, :, 4:] == np.float32(0.2)).all()


def _flags(*names, runs=2, iterations=50):
    return {k: np.zeros((1, runs, iterations), np.int32) for k in names}


def test_exactly_one_percent_does_not_warn_and_two_do_for_every_flag():
    """ "More than 1%" for rounded logits and non-finite metrics as for capped solves: 1 of 100
    run-iterations gives no warning (and is not ``suspect``), 2 of 100 warn."""
    from bchg_jax.core.health import suspect

    for flag, share, text in (
        ("logits_rounded", "rounded_share", "rounded the follower's logits"),
        ("metric_nonfinite", "nonfinite_share", "2.0% of 100"),
        ("solve_capped", "capped_share", "2.0% of 100"),
    ):
        m = _flags(flag)
        m[flag][0, 0, 7] = 1
        h = solver_health(m)
        assert h[share] == 0.01 and health_warning(h) is None and not suspect(h), flag
        m[flag][0, 1, 7] = 1
        w = health_warning(solver_health(m))
        assert w is not None and text in w and "2.0% of 100" in w, (flag, w)
    h = solver_health(_flags("metric_nonfinite"))
    assert h == {"run_iterations": 100, "metric_nonfinite": 0, "nonfinite_share": 0.0}


def test_non_finite_metrics_alone_are_suspect_and_skips_alone_not_converged():
    """5% non-finite exact J with nothing capped makes a run suspect (bold in the table); 5%
    skipped updates with nothing capped still get the "not converged solves" line naming the
    flags in metrics.npz."""
    from bchg_jax.core.health import suspect

    m = _flags("solve_capped", "update_skipped", "metric_nonfinite")
    assert not suspect(solver_health(m))
    m["metric_nonfinite"][0, 1, :5] = 1
    h = solver_health(m)
    assert h["nonfinite_share"] == 0.05 and suspect(h)
    m = _flags("solve_capped", "update_skipped")
    m["update_skipped"][0, 0, :5] = 1
    w = health_warning(solver_health(m))
    assert "5.0% of 100 run-iterations updates were skipped (5 times)" in w
    assert "capped" not in w.splitlines()[0]
    assert "not converged solves" in w and "metrics.npz (solve_capped, update_skipped)" in w


def test_a_stalled_follower_is_counted_shown_and_warned():
    """The LQR game's K-step learner records ``follower_stalled`` (it answered neither the
    update nor the leader that stayed, and kept its policy); it was only in metrics.npz. It is
    counted, shown when it happened, warned about above 1%, and a summary.csv column."""
    from experiments.report import HEALTH_COLUMNS, _health_cells

    m = _flags("solve_capped", "update_skipped", "follower_stalled")
    h = solver_health(m)
    assert h["follower_stalled"] == 0 and health_text(h) == "capped 0.00% skipped 0"
    assert health_warning(h) is None
    m["follower_stalled"][0, 0, 7] = 1
    m["update_skipped"][0, 0, 7] = 1  # a stall is always a skipped update too
    h = solver_health(m)
    assert health_text(h) == "capped 0.00% skipped 1 follower stalled 1"
    assert health_warning(h) is None  # 1 of 100: at the threshold
    m["follower_stalled"][0, 1, 7] = m["update_skipped"][0, 1, 7] = 1
    w = health_warning(solver_health(m))
    assert "2.0% of 100" in w and "follower_stalled" in w and "kept its policy" in w
    cells = dict(zip(HEALTH_COLUMNS, _health_cells(solver_health(m)), strict=True))
    assert cells["follower_stalled"] == 2 and cells["skipped_updates"] == 2
