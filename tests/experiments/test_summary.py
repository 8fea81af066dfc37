"""The run summaries' statistics (``experiments.summary.summarize``)."""

import numpy as np

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
