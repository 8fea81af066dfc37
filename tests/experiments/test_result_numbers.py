"""The numbers a reader takes from a run folder, on a grid whose points all differ: the best
point's curves, hyperparameters, mean and SE in the summary, summary.csv and the plots' table;
the SE of the curves and the band drawn around them; the grid's documented order; and the sign
of a bias check's z. A mutation audit found each of these wrong-able without any other test
failing (a curve from grid point 0 instead of the best passed all 134 experiment tests)."""

import csv

import matplotlib
import numpy as np

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from bchg_jax.core.bias_check import compare, discount_weight_beyond  # noqa: E402
from bchg_jax.core.sweep import product_grid  # noqa: E402
from experiments.plot import draw_curves, final_table, load_run, mean_se  # noqa: E402
from experiments.report import finish_method  # noqa: E402

# J [3 grid points, 4 seeds, 6 iterations]; point 1 is the best, every point's mean and SE differ
J = np.zeros((3, 4, 6))
J[0] = np.array([1.0, 2.0, 3.0, 4.0])[:, None]  # mean 2.5
J[1] = np.array([5.0, 7.0, 9.0, 11.0])[:, None]  # mean 8
J[2] = np.array([0.0, 0.0, 0.0, 8.0])[:, None]  # mean 2
LR = np.array([0.1, 0.2, 0.3])
SE = [np.std(J[g, :, 0], ddof=1) / 2 for g in range(3)]


def test_the_summary_and_its_csv_are_each_points_own(tmp_path):
    s = finish_method(str(tmp_path), "bchg", {"lr": LR}, {"J": J}, 3, "t", "J", write=True)
    assert s["lr"] == 0.2 and s["mean"] == 8.0, s
    np.testing.assert_allclose(s["se"], SE[1])
    with open(tmp_path / "summary.csv") as f:
        rows = list(csv.DictReader(f))
    got = [(float(r["lr"]), float(r["mean_last3"]), float(r["se"]), int(r["best"])) for r in rows]
    want = [(0.1, 2.5, SE[0], 0), (0.2, 8.0, SE[1], 1), (0.3, 2.0, SE[2], 0)]
    np.testing.assert_allclose(got, want, rtol=1e-7)


def test_the_plotted_curves_are_the_best_points(tmp_path):
    (tmp_path / "bchg").mkdir()
    np.savez(tmp_path / "bchg" / "metrics.npz", J=J, grid_lr=LR, summary_window=np.asarray(3))
    curves, s = load_run(str(tmp_path))["bchg"]
    np.testing.assert_array_equal(curves, J[1])
    assert s["lr"] == 0.2 and s["mean"] == 8.0
    np.testing.assert_allclose(s["se"], SE[1])


def test_the_table_window_is_capped_at_the_run_length(tmp_path):
    """No stored summary_window (the default 1000) and a 6-iteration run: the table averages and
    says the last 6."""
    (tmp_path / "bchg").mkdir()
    np.savez(tmp_path / "bchg" / "metrics.npz", J=J, grid_lr=LR)
    table = final_table([str(tmp_path)]).splitlines()
    assert "the last 6 iterations" in table[-1], table[-1]
    row = [line for line in table if line.startswith("| BC")][0]
    assert f"8.000 +- {SE[1]:.3f}" in row, row


def test_curve_standard_errors_and_their_band():
    m, se = mean_se(np.array([[1.0, 0.0], [2.0, 0.0], [3.0, 3.0]]))
    np.testing.assert_allclose(m, [2.0, 1.0])
    np.testing.assert_allclose(se, [1.0 / np.sqrt(3), 1.0])  # std with ddof 1 over sqrt(n)
    fig, ax = plt.subplots()
    draw_curves(ax, {"bchg": np.array([[1.0, 1.0, 1.0], [3.0, 3.0, 3.0]])}, window=1)
    y = ax.collections[0].get_paths()[0].vertices[:, 1]  # mean 2, SE 1: the band is [1, 3]
    plt.close(fig)
    np.testing.assert_allclose([y.min(), y.max()], [1.0, 3.0])


def test_grid_order_last_name_fastest():
    g = product_grid(a=[1.0, 2.0], b=[3.0, 4.0, 5.0])
    np.testing.assert_array_equal(g["a"], [1, 1, 1, 2, 2, 2])
    np.testing.assert_array_equal(g["b"], [3, 4, 5, 3, 4, 5])


def test_bias_check_z_is_signed_and_the_cut_weight_symmetric():
    """z = (mean - exact) / SE with its sign (the tests elsewhere read |z|); the discount weight
    beyond a cut, P(K + J >= H), is symmetric in the two discounts."""
    est = np.array([[1.0, 0.0], [1.2, 0.1], [1.4, -0.1]])
    row = compare(np.array([1.0, 0.0]), est)
    np.testing.assert_allclose(row["z"][0], 0.2 / (0.2 / np.sqrt(3)), rtol=1e-9)
    for a, b, h in [(0.9, 0.5, 7), (0.3, 0.99, 40)]:
        np.testing.assert_allclose(discount_weight_beyond(a, b, h), discount_weight_beyond(b, a, h))
