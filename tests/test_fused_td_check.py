"""benchmarks.fused_td_check: the fused critic fit against XLA's, in Pallas' interpreter."""

import pytest

from benchmarks import fused_td_check as check

pytestmark = pytest.mark.slow  # a benchmark's plumbing: two fits in the interpreter each

SMALL = ["--rows", "200", "--steps", "5", "--timing-steps", "3", "--interpret"]


def test_the_check_passes_and_times_both_fits(capsys):
    check.main(SMALL)
    out = capsys.readouterr().out
    assert out.count("(ok, limit") == 2 and "FAILED" not in out
    rows = [line for line in out.splitlines() if line.startswith(("| xla |", "| fused |"))]
    assert len(rows) == 2
    losses = [float(r.split("|")[5]) for r in rows]
    assert abs(losses[0] - losses[1]) <= 1e-4 * abs(losses[0])  # the same fit, 3 steps


def test_a_disagreement_exits_3(monkeypatch, capsys):
    monkeypatch.setattr(check, "GRAD_RTOL", 0.0)  # any rounding difference now fails
    with pytest.raises(SystemExit) as e:
        check.main(SMALL)
    assert e.value.code == 3 and "FAILED" in capsys.readouterr().out
