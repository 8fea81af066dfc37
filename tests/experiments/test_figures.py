"""The figures of ``experiments.plot``, built from small synthetic run folders (no training)."""

import contextlib
import json
import os

import matplotlib
import numpy as np
import pytest

from experiments import plot

matplotlib.use("Agg")  # before pyplot is imported (experiments.plot imports it lazily)


@pytest.fixture(autouse=True)
def _close_figures():
    """The figures a test draws without saving are closed after it (pyplot warns on stderr past
    20 open figures, and the one-line error tests read stderr)."""
    yield
    import matplotlib.pyplot as plt

    plt.close("all")


THERMAL_METRICS = ("J", "stability", "hvac_energy", "insulation", "airflow")
ARGS = {
    "fourrooms": {
        "beta": 0.001,
        "batch": 100,
        "slip_model": "reference",
        "grid": "none",
        "lr": [0.1],
        "sarsa_alpha": [0.5],
        "seeds": 3,
        "seed": 0,
        "iterations": 40,
        "out": "x",
        "chunk": 10,
        "method": "bchg,naive",
        "exact_out": True,
    },
    "thermal": {
        "critic": "quadratic",
        "beta": 0.1,
        "follower_grad": "pathwise",
        "grid": "none",
        "lr": [0.1],
        "seeds": 3,
        "seed": 0,
        "iterations": 40,
        "out": "x",
    },
    "toy_game": {
        "R": 2.0,
        "beta": 0.05,
        "actor": "mlp",
        "backup": "reference",
        "grid": "none",
        "actor_steps": [1],
        "critic_steps": [1],
        "seeds": 3,
        "iterations": 40,
    },
    "lqr_game": {
        "beta": 0.1,
        "estimator": "reference",
        "grid": "none",
        "actor_steps": [10],
        "critic_steps": 5,
        "seeds": 3,
        "iterations": 40,
    },
}


@contextlib.contextmanager
def refused(capsys, message):
    """The plot CLI refuses bad input as the training CLIs do: exit status 2, ``message`` on
    stderr."""
    with pytest.raises(SystemExit) as e:
        yield
    assert e.value.code == 2 and message in capsys.readouterr().err


def write_run(
    path,
    experiment="fourrooms",
    methods=("bchg", "naive"),
    seeds=3,
    iterations=40,
    metrics=("J",),
    **args,
):
    """A run folder as the CLIs write it: config.json and <method>/metrics.npz (2 grid points)."""
    os.makedirs(path, exist_ok=True)
    cfg = {
        "experiment": experiment,
        "methods": list(methods),
        "args": {**ARGS[experiment], "seeds": seeds, "iterations": iterations, **args},
        "command": f"python -m experiments.{experiment}",
    }
    with open(os.path.join(path, "config.json"), "w") as f:
        json.dump(cfg, f)
    rng = np.random.default_rng(0)
    for i, m in enumerate(methods):
        os.makedirs(os.path.join(path, m))
        t = np.arange(iterations) / iterations
        data = {
            name: (1.0 + i + k) * t + 0.05 * rng.standard_normal((2, seeds, iterations))
            for k, name in enumerate(metrics)
        }
        np.savez(
            os.path.join(path, m, "metrics.npz"),
            **data,
            grid_lr=np.array([0.1, 0.01]),
            summary_window=np.asarray(10),
        )
    return str(path)


def titles(fig):
    return [ax.get_title() for ax in fig.axes if ax.get_visible()]


def legend_text(fig):
    (leg,) = fig.legends
    return leg.get_title().get_text(), [t.get_text() for t in leg.get_texts()]


def assert_legend_below_axes(fig):
    fig.canvas.draw()
    (leg,) = fig.legends
    top = leg.get_window_extent().y1
    assert all(top <= ax.get_window_extent().y0 for ax in fig.axes if ax.get_visible())


def test_panels_are_titled_by_folder_and_the_settings_that_differ(tmp_path):
    runs = [write_run(tmp_path / f"b100_beta{b}", beta=b) for b in (1e-3, 3e-3, 5e-3)]
    fig = plot.panel_figure(runs)
    got = titles(fig)
    assert len(got) == 3
    for t, run, b in zip(got, runs, ("0.001", "0.003", "0.005"), strict=False):
        assert os.path.basename(run) in t and f"β={b}" in t
        assert "batch" not in t and "slip" not in t  # the same in every run: in the figure title
    assert fig.get_suptitle() == "Four-Rooms: batch=100, slip-model=reference"
    caption, labels = legend_text(fig)
    assert labels == ["BC-HG", "Naive-PGD"]
    assert "mean over 3 seeds" in caption and "± 1 standard error" in caption
    assert "trailing mean over 10 iterations" in plot.band_caption(3, 10, 40)
    assert "last 10 iterations" in caption
    short = write_run(tmp_path / "short", iterations=5)  # summary window 10 > run length 5
    assert "last 5 iterations" in legend_text(plot.panel_figure([short]))[0]
    assert fig.axes[0].get_ylabel() == plot.YLABELS["fourrooms"]
    assert fig.axes[0].get_xlabel() == "outer iteration"
    assert_legend_below_axes(fig)


def test_several_differing_settings_and_unchanged_grid_flags(tmp_path):
    a = write_run(tmp_path / "a", beta=1e-3, batch=100)
    b = write_run(tmp_path / "b", beta=1e-3, batch=200, seeds=5)
    t_a, t_b = titles(plot.panel_figure([a, b]))
    assert t_a.startswith("a\n") and "batch=100" in t_a and "seeds=3" in t_a
    assert t_b.startswith("b\n") and "batch=200" in t_b and "seeds=5" in t_b
    assert "β" not in t_a + t_b and "lr" not in t_a + t_b
    # --grid paper replaces the grid flags (lr, sarsa_alpha): they are not settings of the run
    c = write_run(tmp_path / "c", grid="paper", lr=[0.5])
    t_a, t_c = titles(plot.panel_figure([a, c]))
    assert "grid=none" in t_a and "grid=paper" in t_c and "lr" not in t_a + t_c
    # the same folder twice: nothing differs, so the key settings are named
    assert titles(plot.panel_figure([a, a])) == ["a\nβ=0.001, batch=100, slip-model=reference"] * 2


@pytest.mark.parametrize(
    "experiment,expected",
    [
        ("fourrooms", "β=0.001, batch=100, slip-model=reference"),
        ("thermal", "critic=quadratic, β=0.1"),
        ("toy_game", "R=2, β=0.05, actor=mlp"),
        ("lqr_game", "β=0.1, estimator=reference"),
    ],
)
def test_a_single_run_is_titled_by_folder_experiment_and_key_settings(
    tmp_path, experiment, expected
):
    run = write_run(tmp_path / "myrun", experiment)
    fig = plot.panel_figure([run])
    (t,) = titles(fig)
    assert t == f"myrun ({plot.EXPERIMENT_NAMES[experiment]})\n{expected}"
    assert fig.axes[0].get_ylabel() == plot.YLABELS[experiment]
    assert_legend_below_axes(fig)


def test_runs_of_different_experiments_get_their_own_labels(tmp_path, capsys):
    fr = write_run(tmp_path / "fr", "fourrooms")
    th = write_run(tmp_path / "th", "thermal")
    fig = plot.panel_figure([fr, th])
    t_fr, t_th = titles(fig)
    assert t_fr.startswith("fr\nFour-Rooms") and "batch=100" in t_fr
    assert t_th.startswith("th\nbuilding thermal control") and "critic=quadratic" in t_th
    assert [ax.get_ylabel() for ax in fig.axes] == [
        plot.YLABELS["fourrooms"],
        plot.YLABELS["thermal"],
    ]
    plot.main([fr, th, "--out", str(tmp_path / "fig.png")])
    out = capsys.readouterr().out
    assert os.path.exists(tmp_path / "fig.png")
    header = out.splitlines()[0]
    assert "fr: Four-Rooms" in header and "th: building thermal control" in header


def test_many_runs_wrap_into_rows(tmp_path):
    runs = [write_run(tmp_path / f"r{i}", seed=i) for i in range(4)]
    fig = plot.panel_figure(runs)
    assert [t.split("\n") for t in titles(fig)] == [[f"r{i}", f"seed={i}"] for i in range(4)]
    assert sum(ax.get_visible() for ax in fig.axes) == 4 and len(fig.axes) == 6
    assert_legend_below_axes(fig)


def test_table_headers(tmp_path, capsys):
    a = write_run(tmp_path / "a", beta=1e-3)
    b = write_run(tmp_path / "b", beta=3e-3)
    head = plot.final_table([a, b]).splitlines()[0]
    assert head == "| method | a: β=0.001 | b: β=0.003 |"
    # one run: its key settings (the same for a run folder and its --export copy)
    assert plot.final_table([a]).splitlines()[0] == (
        "| method | Four-Rooms: β=0.001, batch=100, slip-model=reference |"
    )
    assert "| BC-HG |" in plot.final_table([a])


def test_components_figure_has_titled_and_labelled_panels(tmp_path):
    run = write_run(
        tmp_path / "th", "thermal", methods=("bchg", "naive", "exact"), metrics=THERMAL_METRICS
    )
    fig = plot.components_figure(run, THERMAL_METRICS)
    axes = [ax for ax in fig.axes if ax.get_visible()]
    assert [ax.get_title() for ax in axes] == [
        "leader objective $J_L$ (higher is better)",
        "stability (reward ≤ 0, higher is better)",
        "HVAC energy cost (lower is better)",
        "insulation cost (lower is better)",
        "airflow cost (lower is better)",
    ]
    assert all(ax.get_ylabel() and ax.get_xlabel() == "outer iteration" for ax in axes)
    assert axes[0].get_ylabel() == plot.YLABELS["thermal"]
    # the J panel is the large one
    fig.canvas.draw()
    heights = [ax.get_window_extent().height for ax in axes]
    assert heights[0] > 1.8 * max(heights[1:])
    assert plot.THERMAL_IDENTITY.split(";")[0] in fig.get_suptitle().replace("\n", " ")
    assert "th" in fig.get_suptitle()
    caption, labels = legend_text(fig)
    assert labels == ["BC-HG", "Naive-PGD", "exact hypergradient"]
    # the default window follows the run length (40 iterations: 2), as figure.png's does
    assert "mean over 3 seeds" in caption and "trailing mean over 2 iterations" in caption
    assert "trailing mean over 2 iterations" in legend_text(plot.panel_figure([run]))[0]
    assert_legend_below_axes(fig)
    # other metric lists: a plain grid, names as titles
    fig = plot.components_figure(run, ("J", "stability"))
    assert titles(fig)[1] == plot.COMPONENT_TITLES["stability"]
    assert "J_L =" not in fig.get_suptitle()


@pytest.mark.slow
def test_thermal_identity_matches_the_logged_components():
    """J = stability - 0.5 HVAC - 0.1 (insulation + airflow), as the components figure states."""
    import importlib

    import jax
    import jax.numpy as jnp

    from bchg_jax.lq import exact as exact_lq

    th = importlib.import_module("bchg_jax.problems.thermal")  # the package exports thermal()

    assert plot.THERMAL_WEIGHTS == th.COMPONENT_WEIGHTS
    assert plot.THERMAL_WEIGHTS["insulation"] == plot.THERMAL_WEIGHTS["airflow"]
    problem = th.thermal()
    assert (problem.gamma_L, problem.horizon) == (plot.THERMAL_GAMMA, plot.THERMAL_HORIZON)
    theta = 0.5 * jax.random.normal(jax.random.PRNGKey(0), (8,), jnp.float32)
    br = problem.best_response(theta, 0.1)
    J = float(exact_lq.leader_objective(problem, theta, 0.1, br=br))
    c = {
        k: float(v)
        for k, v in exact_lq.components(problem, theta, br, problem.components(theta)).items()
    }
    w = plot.THERMAL_WEIGHTS
    assert c["stability"] <= 0 and min(c["hvac_energy"], c["insulation"], c["airflow"]) >= 0
    assert J == pytest.approx(
        c["stability"]
        - w["hvac_energy"] * c["hvac_energy"]
        - w["insulation"] * (c["insulation"] + c["airflow"]),
        rel=1e-4,
    )


def test_learning_curve_figure_keeps_its_signature(tmp_path):
    curves = {"hpgd_mc lr=0.1": np.random.default_rng(0).standard_normal((4, 30))}
    fig = plot.learning_curve_figure(curves, "a title", 5, "my label")
    ax = fig.axes[0]
    assert (ax.get_title(), ax.get_ylabel(), ax.get_xlabel()) == (
        "a title",
        "my label",
        "outer iteration",
    )
    caption, labels = legend_text(fig)
    assert labels == ["HPGD (MC) (lr=0.1)"]
    assert "mean over 4 seeds" in caption and "trailing mean over 5 iterations" in caption
    assert matplotlib.colors.same_color(
        ax.get_lines()[0].get_color(), plot.method_colors()["HPGD (MC)"]
    )
    assert_legend_below_axes(fig)
    assert plot.pretty_label("bchg") == "BC-HG" and plot.pretty_label("other x=1") == "other x=1"
    assert set(plot.YLABELS) == {"fourrooms", "thermal", "toy_game", "lqr_game"}
    assert plot.YLABEL == plot.YLABELS["fourrooms"]


def test_fourrooms_figure_compare_reads_the_committed_table(tmp_path, capsys):
    """A GPU panel is checked against the committed CPU table (its compact copies are not in
    git): equal means pass, a mean 10 SE away fails with status 3."""
    from benchmarks import fourrooms_figure as ff

    table = os.path.join(
        os.path.dirname(__file__),
        "..",
        "..",
        "benchmarks",
        "results",
        "fourrooms_figure",
        "table.md",
    )
    want = ff.read_table(table)["batch100_beta1e-3"]
    assert want["bchg"] == {"mean": 0.662, "se": 0.005}

    def panel(shift):
        root = tmp_path / f"shift{shift}"
        run = root / "batch100_beta1e-3"
        write_run(run, methods=("bchg",))
        J = np.full((1, 10, 40), want["bchg"]["mean"] + shift * want["bchg"]["se"])
        np.savez(
            run / "bchg" / "metrics.npz",
            J=J,
            grid_lr=np.array([0.1]),
            summary_window=np.asarray(10),
        )
        return str(root)

    assert ff.compare(panel(0.0), table, 2.0)
    out = capsys.readouterr().out
    # one comparison decided by its SE: a miss beyond 2 SE has a 5% chance under agreement
    assert "1 comparisons are decided by their SE" in out.replace("\n", " ")
    # the methods this partial panel lacks are named, not skipped in silence
    assert "not compared in batch100_beta1e-3: naive (not in this run)," in out
    assert "hpgd_oracle (not in this run)" in out and "bchg (" not in out
    with pytest.raises(SystemExit) as e:
        ff.main(["compare", "--compact", panel(10.0), "--reference", table])
    assert e.value.code == 3 and "| NO |" in capsys.readouterr().out

    # the default: each panel from the newest committed table that holds it (the re-measured
    # rows first), so this panel is judged against the re-measured BC-HG mean, not the old one
    root = os.path.join(os.path.dirname(__file__), "..", "..")
    tables = [os.path.join(root, t) for t in ff.CPU_TABLES]
    newest = ff.read_table(tables[0])["batch100_beta1e-3"]["bchg"]
    assert newest != want["bchg"]
    capsys.readouterr()
    assert ff.compare(
        panel((newest["mean"] - want["bchg"]["mean"]) / want["bchg"]["se"]), tables, 2.0
    )
    assert f"{newest['mean']:.4f} +- {newest['se']:.4f}" in capsys.readouterr().out


def test_fourrooms_figure_table_of_a_single_panel_reads_back(tmp_path):
    """A batch row with one panel (a GPU session's ``--panel-only``) is keyed by its panel
    name as a row of several is, so ``compare`` and ``read_table`` find it."""
    from benchmarks import fourrooms_figure as ff

    run = tmp_path / "batch100_beta1e-3"
    write_run(run, methods=("bchg",))
    J = np.full((1, 10, 40), 0.5)
    J[0, :, -10:] += np.linspace(-0.01, 0.01, 10)[:, None]
    np.savez(
        run / "bchg" / "metrics.npz", J=J, grid_lr=np.array([0.1]), summary_window=np.asarray(10)
    )
    ff.write_figure(str(tmp_path))
    got = ff.read_table(str(tmp_path / "table.md"))
    assert list(got) == ["batch100_beta1e-3"]
    assert got["batch100_beta1e-3"]["bchg"]["mean"] == pytest.approx(0.5, abs=1e-3)
    assert got["batch100_beta1e-3"]["bchg"]["se"] > 0


def test_the_plot_cli_never_overwrites_a_runs_figure_with_a_comparison(tmp_path, capsys):
    """With several runs the default figure went to <first run>/figure.png, replacing the run's
    own single-panel figure with a comparison of other runs."""
    a, b = write_run(tmp_path / "a"), write_run(tmp_path / "b", beta=0.003)
    open(os.path.join(a, "figure.png"), "wb").write(b"the run's own figure")
    plot.main([a, b])
    assert open(os.path.join(a, "figure.png"), "rb").read() == b"the run's own figure"
    assert os.path.exists(tmp_path / "comparison.png")
    assert "comparison.png" in capsys.readouterr().out
    plot.main([a])  # one run: its own figure, redrawn
    assert open(os.path.join(a, "figure.png"), "rb").read() != b"the run's own figure"


def test_one_seed_draws_no_band_and_short_runs_are_named_in_the_caption(tmp_path):
    m, se = plot.mean_se(np.ones((1, 5)))
    assert np.all(m == 1.0) and np.all(np.isnan(se))  # as the summaries: no SE from one seed
    assert "no band (one seed)" in plot.band_caption(1, 10, 40)
    assert "(none for one seed)" in plot.band_caption([1, 3], 10, 40)
    # a 20-iteration panel beside a 400-iteration one: the window 20 is a running mean there
    caption = plot.band_caption(3, 20, [20, 400])
    assert "trailing mean over 20 iterations" in caption
    assert "running mean since iteration 1 for the runs of at most 20" in caption
    one = write_run(tmp_path / "one", seeds=1, iterations=1)
    fig = plot.panel_figure([one])
    line = fig.axes[0].get_lines()[0]
    assert line.get_marker() == "o"  # a one-iteration curve is a visible point


@pytest.mark.parametrize("points", [24, 45])
def test_grid_curves_are_told_apart(points):
    """curve.png of a grid of more than ten points reused tab10: the paper's 24-point Four-Rooms
    grid drew points 1 and 11 (and 2 and 12, ...) in the same colour and line style."""
    rng = np.random.default_rng(0)
    curves = {f"bchg lr={i}": rng.standard_normal((2, 12)) for i in range(points)}
    fig = plot.learning_curve_figure(curves, "grid", 3, color_by_method=False)
    looks = [
        (matplotlib.colors.to_hex(line.get_color()), line.get_linestyle())
        for line in fig.axes[0].get_lines()
    ]
    assert len(looks) == points and len(set(looks)) == points


def test_table_marks_unhealthy_cells_and_names_the_window(tmp_path):
    """The plot CLI's table showed a run whose solves hit their cap like a healthy one, and did
    not say which iterations its means are over."""
    a = write_run(tmp_path / "a")
    path = os.path.join(a, "naive", "metrics.npz")
    d = dict(np.load(path))
    d["solve_capped"] = np.zeros(d["J"].shape, np.int32)
    d["solve_capped"][:, :, ::2] = 1  # half of the iterations at every grid point
    d["update_skipped"] = np.zeros(d["J"].shape, np.int32)
    np.savez(path, **d)
    lines = plot.final_table([a]).splitlines()
    naive = next(x for x in lines if x.startswith("| Naive"))
    bchg = next(x for x in lines if x.startswith("| BC-HG"))
    assert "**capped 50.00% skipped 0**" in naive and "**" not in bchg
    assert "last 10 iterations" in lines[-1] and "in bold" in lines[-1]
    b = write_run(tmp_path / "b")
    d = dict(np.load(os.path.join(b, "bchg", "metrics.npz")))
    np.savez(os.path.join(b, "bchg", "metrics.npz"), **{**d, "summary_window": np.asarray(20)})
    assert "last 10 / 10-20 iterations (by column)" in plot.final_table([a, b]).splitlines()[-1]


def test_export_never_overwrites_a_run_folder(tmp_path, capsys):
    """--export onto the run folder itself (or onto another run) replaced every method's
    metrics.npz by its best grid point: the grid was lost and the run could not be resumed."""
    run = write_run(tmp_path / "run")
    path = os.path.join(run, "naive", "metrics.npz")
    before = np.load(path)["J"].shape
    with refused(capsys, "run folder itself"):
        plot.main([run, "--export", run])
    with refused(capsys, "holds a run"):  # its grid (no checkpoint left)
        plot.main([write_run(tmp_path / "other"), "--export", run])
    os.makedirs(os.path.join(run, "naive", "checkpoint"))  # a CLI's run keeps its checkpoint
    with refused(capsys, "holds a run"):
        plot.main([write_run(tmp_path / "other2"), "--export", run])
    # a folder inside the run (a method's own: its config.json was replaced by the run's)
    cfg = os.path.join(run, "naive", "config.json")
    with open(cfg, "w") as f:
        f.write('{"method": "naive"}')
    for inside in (os.path.join(run, "naive"), os.path.join(run, "exports", "best")):
        with refused(capsys, "inside the run folder"):
            plot.main([run, "--export", inside])
    with open(cfg) as f:
        assert f.read() == '{"method": "naive"}'
    assert not os.path.exists(os.path.join(run, "exports"))
    with refused(capsys, "method folder of a run"):  # another run's method
        plot.main([write_run(tmp_path / "other3"), "--export", os.path.join(run, "naive")])
    assert np.load(path)["J"].shape == before == (2, 3, 40)
    plot.main([run, "--export", str(tmp_path / "best")])  # a new folder: the compact copy
    assert np.load(tmp_path / "best" / "naive" / "metrics.npz")["J"].shape == (1, 3, 40)
    plot.main([run, "--export", str(tmp_path / "best")])  # an export is refreshed in place


def test_rolling_mean_keeps_a_non_finite_iteration_inside_its_windows():
    """One NaN iteration (the LQR game's metric_nonfinite: "the curve has a NaN there") made
    the rest of the curve NaN: the cumulative sum carried it past every later window."""
    x = np.arange(10.0)
    x[2] = np.nan
    got = plot.rolling_mean(x, 3)
    assert np.isnan(got[2:5]).all()
    np.testing.assert_allclose(got[[0, 1]], [0.0, 0.5])
    np.testing.assert_allclose(got[5:], [4.0, 5.0, 6.0, 7.0, 8.0])
    y = np.arange(10.0)
    y[2] = np.inf
    assert np.isfinite(plot.rolling_mean(y, 3)[5:]).all()
    np.testing.assert_allclose(plot.rolling_mean(np.arange(4.0), 10), [0.0, 0.5, 1.0, 1.5])


def test_plot_out_that_is_a_folder_or_an_unknown_format_is_refused(tmp_path, capsys):
    """--out naming a folder (or a .xyz file) drew the figure, then died with a traceback
    (IsADirectoryError / matplotlib's ValueError) before the table was printed."""
    run = write_run(tmp_path / "run")
    for out, says in ((str(tmp_path), "is a folder"), (str(tmp_path / "f.xyz"), "no .xyz")):
        with pytest.raises(SystemExit) as e:
            plot.main([run, "--out", out])
        assert e.value.code == 2 and says in capsys.readouterr().err
    plot.main([run, "--out", str(tmp_path / "f.pdf")])
    assert os.path.getsize(tmp_path / "f.pdf") > 0


def test_table_says_when_no_grid_point_is_finite(tmp_path):
    """With a non-finite seed at every grid point the plot table printed "nan +- nan (lr 0.1)":
    grid point 0 named as if it were the best one; the run's own table says there is none."""
    run = write_run(tmp_path / "run")
    path = os.path.join(run, "naive", "metrics.npz")
    d = dict(np.load(path))
    d["J"][:, 0, -3] = np.nan  # seed 0 of both grid points, inside the window
    np.savez(path, **d)
    naive = next(x for x in plot.final_table([run]).splitlines() if x.startswith("| Naive"))
    assert "no grid point finite in every seed" in naive and "lr 0.1" not in naive


def test_fourrooms_figure_compare_with_nothing_to_compare_fails(tmp_path, capsys):
    """A panel folder whose methods are all missing (or none of them in the reference) was
    reported as "not compared" and compare exited 0: a check that compared nothing passed."""
    from benchmarks import fourrooms_figure as ff

    ref = tmp_path / "ref"
    write_run(ref / "batch100_beta1e-3", methods=("bchg",))
    empty = tmp_path / "empty" / "batch100_beta1e-3"
    os.makedirs(empty)
    open(empty / "config.json", "w").write(open(ref / "batch100_beta1e-3" / "config.json").read())
    with pytest.raises(SystemExit) as e:
        ff.main(["compare", "--compact", str(tmp_path / "empty"), "--reference", str(ref)])
    assert e.value.code != 0 and "nothing was compared" in str(e.value.code)
    other = tmp_path / "other"
    write_run(other / "batch100_beta1e-3", methods=("naive",))
    with pytest.raises(SystemExit, match="nothing was compared"):
        ff.compare(str(other), str(ref), 2.0)
    assert ff.compare(str(ref), str(ref), 2.0)  # something compared: a pass


def test_fourrooms_figure_table_with_a_method_missing_from_a_panel_reads_back(tmp_path, capsys):
    """A batch row whose panels hold different methods has "-" cells; compare --reference on
    that table.md died with ValueError (float("-")) instead of comparing the panels."""
    from benchmarks import fourrooms_figure as ff

    write_run(tmp_path / "batch100_beta1e-3", methods=("bchg", "naive"))
    write_run(tmp_path / "batch100_beta3e-3", methods=("bchg",), beta=0.003)
    ff.write_figure(str(tmp_path))
    table = str(tmp_path / "table.md")
    assert "| - |" in open(table).read()
    got = ff.read_table(table)
    assert set(got["batch100_beta1e-3"]) == {"bchg", "naive"}
    assert set(got["batch100_beta3e-3"]) == {"bchg"}
    capsys.readouterr()
    assert ff.compare(str(tmp_path), table, 2.0)
    out = capsys.readouterr().out
    assert "| batch100_beta3e-3 | bchg |" in out and "| batch100_beta1e-3 | naive |" in out


def test_a_damaged_result_file_is_named_in_one_line_not_a_traceback(tmp_path, capsys):
    """A metrics.npz cut short (a kill, a full disk) or a config.json edited by hand gave a
    traceback (BadZipFile, JSONDecodeError) in the plot CLI and in fourrooms_figure's figure and
    compare, which did not say which of the run's files was at fault."""
    from benchmarks import fourrooms_figure as ff

    write_run(tmp_path / "ok")
    good = (tmp_path / "ok" / "naive" / "metrics.npz").read_bytes()
    cases = [
        ("naive/metrics.npz", good[:200]),  # cut short
        ("naive/metrics.npz", b"not an npz"),
        ("config.json", b'{"experiment": "fourrooms", "args": {'),
        ("config.json", b"[1, 2]"),
    ]
    for i, (name, data) in enumerate(cases):
        root = tmp_path / f"case{i}"
        run = write_run(root / "batch100_beta1e-3")
        path = os.path.join(run, name)
        with open(path, "wb") as f:
            f.write(data)
        calls = [plot.main, lambda: ff.main(["figure", "--compact", str(root)])]
        if name.endswith(".npz"):  # compare reads no config.json
            calls.append(
                lambda: ff.main(["compare", "--compact", str(root), "--reference", str(root)])
            )
        for call in calls:
            with pytest.raises(SystemExit) as e:
                call([run]) if call is plot.main else call()
            if call is plot.main:  # bad input: status 2 and one line on stderr, as the CLIs
                err = capsys.readouterr().err
                assert e.value.code == 2 and err.startswith(f"error: {path} ")
                assert err.count("\n") == 1
            else:
                assert str(e.value.code).startswith(f"error: {path} ")
                assert "\n" not in e.value.code
    root = tmp_path / "wall"
    write_run(root / "batch100_beta1e-3")
    (root / "batch100_beta1e-3" / "wall.json").write_text('{"total": ')
    with pytest.raises(SystemExit, match="wall.json cannot be read"):
        ff.main(["figure", "--compact", str(root)])


def test_runs_of_the_same_folder_name_get_distinct_titles_and_columns(tmp_path):
    """a/run and b/run (the same experiment in two places) were both titled "run": two panels
    and two table columns that could not be told apart."""
    runs = [write_run(tmp_path / p / "run") for p in ("a", "b")]
    titles, _ = plot.panel_titles(runs)
    assert [t.split("\n")[0] for t in titles] == ["a/run", "b/run"]
    head = plot.final_table(runs).splitlines()[0]
    assert "| a/run: " in head and "| b/run: " in head
    deep = [write_run(tmp_path / p / "x" / "run") for p in ("c", "d")]
    assert plot.run_names([*deep, runs[0]]) == ["c/x/run", "d/x/run", "a/run"]
    assert plot.run_names([runs[0], str(tmp_path / "other")]) == ["run", "other"]
    thermal = write_run(tmp_path / "t" / "run", experiment="thermal")  # titles of two experiments
    assert plot.panel_titles([runs[0], thermal])[0][1].startswith("t/run\n")


def test_an_export_replaces_an_earlier_export_and_keeps_no_stale_method(tmp_path, capsys):
    """Exporting into the folder of an earlier export kept the method folders the new run lacks:
    its figure and table mixed the old results in with the new ones, without a word."""
    dest = tmp_path / "best"
    old = write_run(tmp_path / "old", methods=("bchg", "naive"))
    with open(os.path.join(old, "naive", "curve.png"), "wb") as f:
        f.write(b"old curve")
    plot.main([old, "--export", str(dest)])
    assert (dest / "naive" / "curve.png").exists()
    (dest / "notes.txt").write_text("mine")  # not the export's: kept
    new = write_run(tmp_path / "new", methods=("bchg",))
    capsys.readouterr()
    plot.main([new, "--export", str(dest)])
    assert set(plot.load_run(str(dest))) == {"bchg"} and not (dest / "naive").exists()
    assert "Naive-PGD" not in capsys.readouterr().out
    assert (dest / "notes.txt").read_text() == "mine"
    # replace=False (one copy gathered from one run folder per method) keeps the others
    plot.export_best(old, str(dest))
    plot.export_best(new, str(dest), replace=False)
    assert set(plot.load_run(str(dest))) == {"bchg", "naive"}


def test_fourrooms_figure_compare_refuses_runs_of_another_length(tmp_path, capsys):
    """compare judged a 20-iteration panel against a 40-iteration one (or against the committed
    10,000-iteration tables) as if they were the same runs: means over other iterations."""
    from benchmarks import fourrooms_figure as ff

    ref, short = tmp_path / "ref", tmp_path / "short"
    write_run(ref / "batch100_beta1e-3", methods=("bchg",))
    write_run(short / "batch100_beta1e-3", methods=("bchg",), iterations=20)
    with pytest.raises(SystemExit, match=r"different length.*bchg \(20 against 40\)"):
        ff.main(["compare", "--compact", str(short), "--reference", str(ref)])
    assert "| batch100_beta1e-3 | bchg |" in capsys.readouterr().out  # printed all the same
    assert ff.compare(str(ref), str(ref), 2.0)
    # a table states a run's length where it is short of its plan ("; 20 it")
    planned = tmp_path / "planned"
    write_run(planned / "batch100_beta1e-3", methods=("bchg",), iterations=20)
    cfg = planned / "batch100_beta1e-3" / "config.json"
    cfg.write_text(cfg.read_text().replace('"iterations": 20', '"iterations": 40'))
    ff.write_figure(str(planned))
    table = str(planned / "table.md")
    assert ff.read_table(table)["batch100_beta1e-3"]["bchg"]["iterations"] == 20
    assert ff.compare(str(short), table, 2.0)
    with pytest.raises(SystemExit, match="40 against 20"):
        ff.compare(str(ref), table, 2.0)
    # one it does not state: the given length (the committed tables': 10,000), else a warning
    committed = os.path.join(
        os.path.dirname(__file__), "..", "..", "benchmarks", "results", "fourrooms_figure"
    )
    with pytest.raises(SystemExit, match="40 against 10000"):
        ff.compare(str(ref), os.path.join(committed, "table.md"), 2.0, reference_iterations=10000)
    capsys.readouterr()
    ff.compare(str(ref), os.path.join(committed, "table.md"), 2.0)
    assert "does not state the iterations of batch100_beta1e-3 bchg" in capsys.readouterr().err


def test_a_summary_window_below_one_is_a_damaged_file(tmp_path, capsys):
    """summary_window 0 in a metrics.npz (edited, another program's) averaged the whole run
    (J[..., -0:]) and called it the final window; it is named as damaged."""
    run = write_run(tmp_path / "run")
    path = os.path.join(run, "naive", "metrics.npz")
    with np.load(path) as d:
        data = {k: d[k] for k in d.files}
    np.savez(path, **{**data, "summary_window": np.asarray(0)})
    with refused(capsys, f"error: {path} holds summary_window"):
        plot.main([run])


def test_fourrooms_figure_table_explains_its_bold_cells(tmp_path):
    """write_figure turns final_table's footnote off (it names the window once, above), which
    also dropped the line saying what a bold cell is; a healthy table has no such line."""
    from benchmarks import fourrooms_figure as ff

    run = write_run(tmp_path / "batch100_beta1e-3", methods=("bchg", "naive"))
    ff.write_figure(str(tmp_path))
    assert "In bold" not in (tmp_path / "table.md").read_text()
    path = os.path.join(run, "naive", "metrics.npz")
    with np.load(path) as d:
        data = {k: d[k] for k in d.files}
    capped = np.zeros(data["J"].shape, np.int32)
    capped[:, :, ::2] = 1
    np.savez(path, **data, solve_capped=capped, update_skipped=np.zeros_like(capped))
    ff.write_figure(str(tmp_path))
    text = (tmp_path / "table.md").read_text()
    assert "**capped" in text and "In bold: a solver-health flag set in more than 1%" in text
