"""Hand-computed cases of ``core.bias_check``'s row entries that the statistical tests do not pin:
the cosine's sign, an exact mismatch beside a spread below rounding, the verdict when another
component is NaN, the low-resolution warning's threshold and the rare pairs' share."""

from __future__ import annotations

import warnings

import numpy as np
import pytest

from bchg_jax.core.bias_check import (
    LOW_RESOLUTION,
    compare,
    reads_biased,
    resolved_entries,
    warn_if_unresolved,
)


def test_cosine_of_an_opposite_mean_is_minus_one():
    """``cosine`` = cos(mean, exact): a mean pointing against the exact value gives -1, not +1."""
    exact = np.array([1.0, 2.0])
    est = np.array([[-1.0, -2.0], [-1.2, -2.4]])  # mean -1.1 * exact
    row = compare(exact, est)
    assert row["cosine"] == pytest.approx(-1.0, abs=1e-12)
    assert row["rel_error"] == pytest.approx(2.1, rel=1e-12)


def test_a_spread_below_rounding_is_no_standard_error():
    """A component whose spread is below float rounding (se 1e-13 on values ~1) and which differs
    from the exact value by 1e-3 is an exact mismatch (z = inf), not a finite z of ~1e10."""
    est = np.array([[1.001, 5.0], [1.001 + 2e-13, 6.0], [1.001 - 1e-13, 4.0]])
    row = compare(np.array([1.0, 5.0]), est)
    assert np.isinf(row["z"][0]) and row["exact_mismatches"] == 1
    assert row["z"][1] == 0.0  # mean 5 = exact 5 to rounding
    assert row["p_value"] == 0.0 and reads_biased(row)


def test_one_exact_mismatch_reads_biased_when_another_component_is_nan():
    """``reads_biased``: a single exact mismatch is biased even when a NaN component makes
    ``p_value`` NaN (NaN < BIASED_P is False)."""
    est = np.array([[2.0, np.nan], [2.0, 1.0], [2.0, 3.0]])
    row = compare(np.array([1.0, 1.0]), est)
    assert np.isnan(row["p_value"]) and row["exact_mismatches"] == 1
    assert reads_biased(row)


def test_low_resolution_warning_fires_just_above_its_threshold():
    """``warn_if_unresolved`` warns for any ``rel_se`` above LOW_RESOLUTION (0.5), e.g. 0.7, and
    not at 0.4."""
    assert LOW_RESOLUTION == 0.5
    row = {"p_value": 0.5, "exact_mismatches": 0, "rel_se": 0.7}
    with pytest.warns(UserWarning, match="standard error is 70% of the exact"):
        assert warn_if_unresolved("theta 0", row, 10)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert not warn_if_unresolved("theta 0", dict(row, rel_se=0.4), 10)


def test_rare_share_is_the_norm_of_the_part_the_rare_pairs_carry():
    """``resolved_entries``: exact (3, 4), rest (3, 0): the rare pairs carry (0, 4), a share
    4 / 5 of the norm and all of the second component; the estimates are judged against rest."""
    exact = np.array([3.0, 4.0])
    est = np.array([[3.0, 0.1], [3.0, -0.1]]) + np.array([[0.1, 0.0], [-0.1, 0.0]])
    row = compare(exact, est)
    out = resolved_entries(row, rest=np.array([3.0, 0.0]), estimates=est)
    assert out["rare_share"] == pytest.approx(0.8, rel=1e-12)
    assert out["rare_component_share"] == pytest.approx(1.0, rel=1e-12)
    np.testing.assert_array_equal(out["resolved_target"], [3.0, 0.0])
    assert out["resolved_bias_se"] == 0.0  # the mean (3, 0) is rest exactly
