"""The benchmarks' checks of the parallel forms against the scans (``fourrooms_throughput``'s
mean J per row, in standard errors): a form that trains another leader fails the call."""

import numpy as np
import pytest

from benchmarks import fourrooms_throughput


def _fake_measure(J_by_form):
    def measure(method, solver, beta, single_its, its, seeds, parallel_steps=False):
        health = {"capped_share": 0.0, "update_skipped": 0, "solve_capped": 0}
        return 1.0, 0.1, 1.0, 2.0, 240, health, np.asarray(J_by_form[parallel_steps])

    return measure


ARGS = ["--solvers", "sparse", "--steps", "scan", "parallel", "--iterations", "1"]


RUNS = np.linspace(-0.1, 0.1, 240)  # a spread of final J: the mean's SE is about 0.0037


def test_a_parallel_row_off_the_scans_j_fails_the_call(monkeypatch, capsys):
    J = {False: RUNS - 0.4, True: RUNS - 0.4 + 0.03}  # 8 standard errors apart
    monkeypatch.setattr(fourrooms_throughput, "measure", _fake_measure(J))
    with pytest.raises(SystemExit) as e:
        fourrooms_throughput.main(ARGS)
    assert e.value.code == 3
    assert "parallel steps trained another leader" in capsys.readouterr().out


def test_a_parallel_row_within_rounding_of_the_scans_j_passes(monkeypatch, capsys):
    J = {False: RUNS - 0.4, True: RUNS[::-1] - 0.4 + 0.005}  # runs apart, 1.3 SE in the mean
    monkeypatch.setattr(fourrooms_throughput, "measure", _fake_measure(J))
    fourrooms_throughput.main(ARGS)
    out = capsys.readouterr().out
    assert "| 0.001 | sparse | parallel |" in out and "FAILED" not in out
