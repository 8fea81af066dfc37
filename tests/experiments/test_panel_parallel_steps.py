"""``benchmarks.fourrooms_figure run --parallel-steps``: the panel's training command carries
``--parallel-steps`` (new and resumed panels), the run records it, and a panel started in the
other form is refused rather than continued in a mix of the two."""

import json
import sys

import pytest

from benchmarks.fourrooms_panel import panel_command

PANEL = "batch100_beta1e-3"


def test_the_command_carries_the_flag_for_new_and_started_panels(tmp_path):
    new = panel_command(str(tmp_path / "p"), ["naive"], 100, "1e-3", parallel_steps=True)
    assert new[:3] == [sys.executable, "-m", "experiments.fourrooms"]
    assert new.count("--parallel-steps") == 1 and "--resume" not in new
    assert "--parallel-steps" not in panel_command(str(tmp_path / "p"), ["naive"], 100, "1e-3")
    started = tmp_path / "s"
    started.mkdir()
    (started / "config.json").write_text("{}")
    resumed = panel_command(str(started), ["naive"], 100, "1e-3", parallel_steps=True)
    assert resumed[3:5] == ["--resume", str(started)] and "--parallel-steps" in resumed
    assert "--parallel-steps" not in panel_command(str(started), ["naive"], 100, "1e-3")


@pytest.mark.slow
def test_a_panel_trains_with_parallel_steps_and_refuses_the_other_form(tmp_path):
    from benchmarks import fourrooms_figure as ff

    base = "run --panels 100:1e-3 --methods naive --seeds 2 --iterations 10 --chunk 10".split()
    fig = ["--out", str(tmp_path / "fig"), "--compact", str(tmp_path / "c")]
    ff.main(base + fig + ["--parallel-steps"])
    cfg = json.loads((tmp_path / "fig" / PANEL / "config.json").read_text())
    assert cfg["args"]["parallel_steps"] is True
    # a panel started with the scans, continued with --parallel-steps: refused, log named
    other = ["--out", str(tmp_path / "scan"), "--compact", str(tmp_path / "c2")]
    ff.main(base + other)
    with pytest.raises(SystemExit) as e:
        ff.main(base[:-4] + ["--iterations", "20", "--chunk", "10"] + other + ["--parallel-steps"])
    assert "log.txt" in str(e.value.code)
    log = (tmp_path / "scan" / PANEL / "log.txt").read_text()
    assert "--parallel-steps" in log and "other settings" in log
