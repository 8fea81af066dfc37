"""Host-side pieces of ``core.sweep`` against hand-computed values: the keys ``seed_keys``
promises (fold_in(key(base_seed), i)), the progress line's seed mean and best point,
``join_chunks``' fill for a metric a chunk lacks, and the seed-value bound."""

from __future__ import annotations

import jax
import numpy as np
import pytest

from bchg_jax.core.sweep import join_chunks, progress_line, seed_keys


def _data(keys):
    return np.asarray(jax.random.key_data(keys))


def test_seed_keys_are_fold_in_of_the_base_key():
    """``seed_keys(N, base)`` is fold_in(key(base), i) for i = 0..N-1, and a sequence of seed
    indices folds in those indices (in order)."""
    want = np.stack([_data(jax.random.fold_in(jax.random.key(7), i)) for i in range(3)])
    np.testing.assert_array_equal(_data(seed_keys(3, 7)), want)
    want = np.stack([_data(jax.random.fold_in(jax.random.key(0), i)) for i in (5, 2)])
    np.testing.assert_array_equal(_data(seed_keys([5, 2])), want)


def test_seed_index_2_pow_32_is_refused():
    """Seeds are read as 32-bit words: a base seed of exactly 2**32 is refused (it would be 0);
    2**32 - 1 is accepted."""
    with pytest.raises(ValueError, match="base_seed must be an integer"):
        seed_keys(1, 2**32)
    seed_keys(1, 2**32 - 1)


def test_progress_line_averages_the_seeds_of_the_best_point():
    """J [2 points, 2 seeds, 3 iterations]: point 1 has the best mean over seeds of the last 2
    iterations (mean 1.5 vs 1.0, though point 0 holds the single best seed), and the line
    reports its seed-mean J now (last iteration) and over the window."""
    J = np.array(
        [
            [[0.0, 0.0, 0.0], [2.0, 2.0, 2.0]],  # point 0: seed means 1.0
            [[1.0, 1.0, 1.2], [1.0, 2.0, 2.0]],  # point 1: window means 1.1 and 2.0 -> 1.55
        ]
    )
    line = progress_line(J, 3, 10, 3, 1.0, False, 2.0, window=2)
    assert "grid point 1," in line
    assert "now +1.6000" in line  # (1.2 + 2.0) / 2
    assert "last 2 it +1.5500" in line
    assert "mean of 2 seeds" in line


def test_join_chunks_fills_a_missing_float_metric_with_nan():
    """A metric missing from one chunk is NaN there if it is a float (not a made-up 0) and 0 if
    it is an integer flag; the chunks join along axis 2."""
    a = {"J": np.ones((1, 2, 2)), "flag": np.ones((1, 2, 2), np.int32)}
    b = {"J": np.full((1, 2, 3), 2.0), "x": np.full((1, 2, 3), 5.0)}
    out = join_chunks([a, b])
    assert out["J"].shape == (1, 2, 5)
    np.testing.assert_array_equal(out["J"][0, 0], [1, 1, 2, 2, 2])
    assert np.all(np.isnan(out["x"][..., :2])) and np.all(out["x"][..., 2:] == 5.0)
    assert out["flag"].dtype == np.int32
    np.testing.assert_array_equal(out["flag"][0, 1], [1, 1, 0, 0, 0])


def test_progress_line_never_picks_a_point_diverged_to_inf():
    """A grid point whose J overflowed to +inf is diverged, not the best: the line reports the
    best finite point."""
    J = np.stack([np.full((1, 2), 0.3), np.full((1, 2), np.inf), np.full((1, 2), 0.1)])
    line = progress_line(J, 2, 2, 2, 1.0, False, 1.0, window=2)
    assert "grid point 0," in line and "now +0.3000" in line


def test_run_grid_refuses_a_start_past_the_iterations():
    """``start`` must be in [0, iterations]: 5 of 3 is refused as such, before the trainer is
    used (a stand-in without ``hparams`` or ``init`` shows nothing else ran)."""
    from types import SimpleNamespace

    from bchg_jax.core.sweep import run_grid

    trainer = SimpleNamespace(config=None, unread=(), method="naive")
    with pytest.raises(ValueError, match=r"start must be in \[0, iterations\], got 5"):
        run_grid(trainer, {"lr": [0.1]}, 1, 3, start=5, verbose=False)
