"""The run summaries' statistics (``experiments.summary.summarize``)."""

import os

import numpy as np
import pytest

from experiments.summary import summarize


def test_mean_se_and_best_of_the_last_window():
    J = np.zeros((2, 3, 10))
    J[0] += np.array([1.0, 2.0, 3.0])[:, None]
    J[1, :, -4:] = np.nan  # a diverged grid point is never the best
    J[0, :, :6] = 100.0  # outside the window
    final, mean, se, best = summarize(J, 4)
    np.testing.assert_allclose(final[0], [1.0, 2.0, 3.0])
    assert mean[0] == 2.0 and np.isclose(se[0], 1.0 / np.sqrt(3)) and best == 0


def test_one_seed_has_no_standard_error():
    """It was 0.0000 in the summary table and summary.csv: one seed read as an exact value."""
    _, mean, se, _ = summarize(np.ones((2, 1, 5)), 3)
    assert np.all(mean == 1.0) and np.all(np.isnan(se))


def _finish(tmp_path, data, capsys):
    from experiments.report import finish_method

    grid = {"lr": np.array([0.1, 0.2])}
    s = finish_method(str(tmp_path), "bchg", grid, {**data}, 3, "t", "J", write=True)
    header, *rows = open(tmp_path / "summary.csv").read().splitlines()
    return s, header.split(","), [r.split(",") for r in rows], capsys.readouterr()


def test_every_health_flag_reaches_summary_csv(tmp_path, capsys):
    """support_lost, logits_rounded and metric_nonfinite were warned about on the console but
    summary.csv, the file that lasts, had no column for them and read as a healthy run."""
    flags = {f: np.zeros((2, 2, 5), np.int32) for f in ("solve_capped", "update_skipped")}
    flags["support_lost"] = np.ones((2, 2, 5), np.int32)
    flags["logits_rounded"] = np.zeros((2, 2, 5), np.int32)
    flags["logits_rounded"][1, 0, :2] = 1
    # the LQR game's non-finite exact return: in the progress line and warning, not the file
    flags["metric_nonfinite"] = np.zeros((2, 2, 5), np.int32)
    flags["metric_nonfinite"][0, 1, 4] = 1
    _, header, rows, _ = _finish(tmp_path, {"J": np.zeros((2, 2, 5)), **flags}, capsys)
    names = ("support_lost", "logits_rounded", "skipped_updates", "metric_nonfinite")
    cols = {k: header.index(k) for k in names}
    assert [int(r[cols["support_lost"]]) for r in rows] == [10, 10]
    assert [int(r[cols["logits_rounded"]]) for r in rows] == [0, 2]
    assert [int(r[cols["metric_nonfinite"]]) for r in rows] == [1, 0]


def test_a_diverged_seed_is_named_and_no_finite_point_has_no_best(tmp_path, capsys):
    J = np.zeros((2, 2, 5))
    J[1] = 1.0  # the better point ...
    J[1, 0, 3:] = np.nan  # ... diverged in one seed
    s, header, rows, out = _finish(tmp_path, {"J": J}, capsys)
    col = header.index("nonfinite_seeds")
    assert [int(r[col]) for r in rows] == [0, 1] and s["lr"] == 0.1 and s["nonfinite_seeds"] == 0
    assert "1 of 2 seeds not finite" in out.out and "chosen among the others" in out.err
    J[0, 1, 4] = np.inf  # now no point is finite in every seed
    s, _, _, out = _finish(tmp_path, {"J": J}, capsys)
    assert s["nonfinite_seeds"] == 1 and "no best one" in out.err and "<- best" not in out.out
    from experiments.report import finish_run

    finish_run(str(tmp_path), [s, {**s, "method": "naive"}], 3)
    assert "(no grid point finite in every seed)" in capsys.readouterr().out


def test_run_summary_keeps_columns_a_method_does_not_have(tmp_path, capsys):
    """Naive-PGD's grid has no sarsa_alpha (it has no SARSA critic); the run's summary.csv
    took its columns from the first method only and failed on a method without one of them."""
    import csv

    from experiments.report import finish_run

    base = {"mean": 0.5, "se": 0.1, "window": 3, "health": {}, "nonfinite_seeds": 0}
    bchg = {"method": "bchg", "lr": 0.1, "sarsa_alpha": 0.5, "beta": 1e-3, **base}
    naive = {"method": "naive", "lr": 0.05, "beta": 1e-3, **base}
    finish_run(str(tmp_path), [naive, bchg], 3, extra_figures=None)
    rows = list(csv.DictReader(open(tmp_path / "summary.csv")))
    assert [(r["method"], r["sarsa_alpha"], r["lr"]) for r in rows] == [
        ("bchg", "0.5", "0.1"),
        ("naive", "", "0.05"),
    ]
    assert "lr=0.05 beta=0.001" in capsys.readouterr().out


def test_run_summary_health_is_the_best_points_not_the_grids(tmp_path, capsys):
    """The run's table and summary.csv showed, beside the best grid point, the health of the
    whole grid: a best point capped in 20% of its iterations read "capped 0.80%" (25 points)
    and no warning was printed, while experiments.plot's table of the same run bolds it."""
    import csv

    from experiments import plot
    from experiments.report import finish_method, finish_run

    G, N, T = 25, 3, 40
    J = np.zeros((G, N, T))
    J[7] += 1.0  # the best point ...
    capped = np.zeros((G, N, T), np.int32)
    capped[7, :, :8] = 1  # ... hit its cap in 20% of its iterations (0.8% of the grid's)
    grid = {"lr": np.linspace(0.01, 0.25, G)}
    data = {"J": J, "solve_capped": capped, "update_skipped": np.zeros_like(capped)}
    os.makedirs(tmp_path / "bchg")
    s = finish_method(str(tmp_path / "bchg"), "bchg", grid, data, 10, "t", "J", write=True)
    assert s["health"]["capped_share"] == 0.2 and s["grid_health"]["capped_share"] == 0.008
    assert "best grid point" in capsys.readouterr().err
    finish_run(str(tmp_path), [s, {**s, "method": "naive", "health": {}}], 10)
    out = capsys.readouterr()
    assert "capped 20.00%" in out.out and "of: bchg" in out.err
    rows = {r["method"]: r for r in csv.DictReader(open(tmp_path / "summary.csv"))}
    assert rows["bchg"]["capped_share"] == "0.2000"
    # the same health as the plot CLI's table of this run
    assert "**capped 20.00% skipped 0**" in plot.final_table([str(tmp_path)])


def test_run_summary_names_a_damaged_earlier_method_folder(tmp_path, capsys):
    """A method folder of an earlier command whose metrics.npz was cut short (a kill, a full
    disk) made the run summary die with a zipfile traceback after every method had trained."""
    from experiments.report import finish_run

    base = {"mean": 0.5, "se": 0.1, "window": 3, "health": {}, "nonfinite_seeds": 0}
    bchg = {"method": "bchg", "lr": 0.1, **base}
    for data in (b"PK\x03\x04 cut short", b""):
        os.makedirs(tmp_path / "naive", exist_ok=True)
        (tmp_path / "naive" / "metrics.npz").write_bytes(data)
        with pytest.raises(SystemExit) as e:
            finish_run(str(tmp_path), [bchg], 3)
        err = capsys.readouterr().err
        assert e.value.code == 2 and f"{tmp_path / 'naive'} of an earlier command" in err
    np.savez(tmp_path / "naive" / "metrics.npz", J=np.zeros((2, 3)), grid_lr=np.ones(2))
    with pytest.raises(SystemExit):
        finish_run(str(tmp_path), [bchg], 3)
    assert "holds J of shape (2, 3)" in capsys.readouterr().err


@pytest.mark.parametrize("window", [0, -3, 2.5, True])
def test_summarize_refuses_a_window_below_one(window):
    """J[..., -0:] is the whole run: a window of 0 gave the mean since iteration 1."""
    with pytest.raises(ValueError, match="window must be an int >= 1"):
        summarize(np.ones((2, 3, 10)), window)


def test_a_rounding_only_warning_does_not_blame_capped_solves(tmp_path, capsys):
    """An audit ran Four-Rooms at beta 1e-5 in float32: only the logits-rounded flag was set,
    and the run's last line said "solves hit their cap or updates were skipped" beside
    "capped 0.00% skipped 0" (the plot table's footnote likewise)."""
    from experiments import plot
    from experiments.report import finish_method, finish_run

    J = np.zeros((1, 2, 20))
    zeros = np.zeros(J.shape, np.int32)
    data = {"J": J, "solve_capped": zeros, "update_skipped": zeros, "logits_rounded": 1 + zeros}
    os.makedirs(tmp_path / "bchg")
    s = finish_method(str(tmp_path / "bchg"), "bchg", {"lr": np.ones(1)}, data, 10, "t", "J", 1)
    assert "float32 rounded the follower's logits" in capsys.readouterr().err
    finish_run(str(tmp_path), [s], 10)
    err = capsys.readouterr().err
    assert "of: bchg" in err
    assert "hit their cap or updates were skipped" not in err
    assert "float32-rounded logits" in err
    table = plot.final_table([str(tmp_path)])
    assert "**capped 0.00% skipped 0 float32 logits rounded 40**" in table
    assert "float32-rounded logits" in table.splitlines()[-1]


def test_summary_csv_marks_no_best_point_when_none_is_finite_and_keeps_small_errors(
    tmp_path, capsys
):
    """With a NaN seed in every grid point the table says there is no best one, and
    summary.csv marked row 0 best = 1; its 4 decimals also wrote an SE of 2.5e-5 as 0.0000."""
    J = np.ones((2, 2, 5), np.float32)
    J[:, 0, -1] = np.nan
    _, header, rows, _ = _finish(tmp_path, {"J": J}, capsys)
    assert [r[header.index("best")] for r in rows] == ["0", "0"]
    J = np.ones((2, 2, 5)) + np.array([0.0, 5e-5])[None, :, None]  # SE 2.5e-5, means 5e-5 apart
    J[1] += 5e-5
    _, header, rows, _ = _finish(tmp_path, {"J": J}, capsys)
    assert [float(r[header.index("se")]) for r in rows] == [2.5e-5, 2.5e-5]
    means = [float(r[header.index("mean_last3")]) for r in rows]
    assert means[1] - means[0] == pytest.approx(5e-5) and rows[1][header.index("best")] == "1"


def test_grid_values_distinct_in_float32_print_and_plot_apart(tmp_path, capsys, monkeypatch):
    """lr 0.1 and 0.10000001 (distinct in float32, so a grid may hold both) both printed as
    0.1 under ``:g``: the table's rows looked the same and the two curves shared one label, so
    ``curve.png`` drew only one of them."""
    from experiments import plot
    from experiments.report import finish_method, finish_run

    drawn = []
    real = plot.learning_curve_figure
    monkeypatch.setattr(
        plot,
        "learning_curve_figure",
        lambda curves, *a, **k: drawn.append(curves) or real(curves, *a, **k),
    )
    grid = {"lr": np.array([0.1, 0.10000001, 0.2], np.float32), "beta": np.full(3, 1e-3)}
    J = np.zeros((3, 2, 5))
    J[1] += 1.0
    os.makedirs(tmp_path / "bchg")
    s = finish_method(str(tmp_path / "bchg"), "bchg", grid, {"J": J}, 3, "t", "J", write=True)
    assert len(drawn[0]) == 3 and "bchg lr=0.10000001 best" in drawn[0]
    rows = [line.split()[0] for line in capsys.readouterr().out.splitlines()[-3:]]
    assert rows == ["0.1", "0.10000001", "0.2"]
    assert plot.value_texts([1e-3, 0.01]) == ["0.001", "0.01"]  # :g where it tells them apart
    finish_run(str(tmp_path), [s, {**s, "method": "naive"}], 3)
    assert "lr=0.10000001 beta=0.001" in capsys.readouterr().out
