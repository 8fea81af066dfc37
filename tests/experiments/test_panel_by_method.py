"""``benchmarks.fourrooms_figure run --method-workers``: one process per method gives the same
panel as one process for all, and a stopped panel continues the way it started."""

import json
import os

import numpy as np
import pytest

pytestmark = pytest.mark.slow

PANEL = "batch100_beta1e-3"
COMMON = "run --panels 100:1e-3 --methods sobirl,naive --seeds 2 --iterations 20 --chunk 10".split()


def _metrics(path):
    with np.load(path) as d:
        return {k: d[k] for k in d.files}


def test_by_method_panel_equals_one_process_and_records_its_wall_time(tmp_path, capsys):
    from benchmarks import fourrooms_figure as ff

    one, two = tmp_path / "one", tmp_path / "two"
    ff.main(COMMON + ["--out", str(one), "--compact", str(one / "compact")])
    ff.main(
        COMMON + ["--out", str(two), "--compact", str(two / "compact"), "--method-workers", "2"]
    )
    for m in ("sobirl", "naive"):
        a = _metrics(one / PANEL / m / "metrics.npz")
        b = _metrics(two / PANEL / "by_method" / m / m / "metrics.npz")
        assert a.keys() == b.keys()
        for k in a:
            np.testing.assert_array_equal(a[k], b[k], err_msg=f"{m} {k}")
        # the compact copies (best grid point) agree too
        a = _metrics(one / "compact" / PANEL / m / "metrics.npz")
        b = _metrics(two / "compact" / PANEL / m / "metrics.npz")
        for k in a:
            np.testing.assert_array_equal(a[k], b[k], err_msg=f"compact {m} {k}")
    cfg = json.loads((two / "compact" / PANEL / "config.json").read_text())
    assert cfg["methods"] == ["naive", "sobirl"] and cfg["args"]["method"] == "naive,sobirl"
    wall = json.loads((two / "compact" / PANEL / "wall.json").read_text())
    assert set(wall["seconds"]) == {"naive", "sobirl"} and wall["method_workers"] == 2
    assert 0 < wall["elapsed"] and wall["total"] == pytest.approx(sum(wall["seconds"].values()))
    assert (two / "compact" / "table.md").exists()
    # compare prints the elapsed time beside the summed one
    capsys.readouterr()
    ff.compare(str(two / "compact"), str(one / "compact"), 2.0)
    out = capsys.readouterr().out
    assert "elapsed (2 method worker(s))" in out and out.count("| yes |") == 2


def test_a_stopped_by_method_panel_continues_with_its_own_methods(tmp_path, capsys):
    """A panel started one process per method, stopped after one method, is continued with the
    methods it was started with (not those of the second command), one process per method even
    when --method-workers is not given again."""
    from benchmarks import fourrooms_figure as ff

    out, compact = tmp_path / "fig", tmp_path / "compact"
    args = ["--out", str(out), "--compact", str(compact)]
    run_dir = out / PANEL
    run_dir.mkdir(parents=True)
    (run_dir / "by_method").mkdir()
    (run_dir / "panel.json").write_text(json.dumps({"methods": ["sobirl", "naive"]}))
    # sobirl finished, naive never started
    ff.main(
        COMMON[:4]
        + ["sobirl"]
        + COMMON[5:]
        + ["--out", str(tmp_path / "s")]
        + ["--compact", str(tmp_path / "s_compact")]
    )
    os.rename(tmp_path / "s" / PANEL, run_dir / "by_method" / "sobirl")
    capsys.readouterr()
    ff.main(COMMON[:4] + ["naive"] + COMMON[5:] + args)
    log = capsys.readouterr().out
    assert "--resume" in log and "sobirl" in log and "naive" in log
    cfg = json.loads((compact / PANEL / "config.json").read_text())
    assert cfg["methods"] == ["naive", "sobirl"]
    assert (compact / PANEL / "naive" / "metrics.npz").exists()
    assert (compact / PANEL / "sobirl" / "metrics.npz").exists()
    assert (run_dir / "by_method" / "naive" / "log.txt").exists()
    assert not (run_dir / "config.json").exists()


def test_bad_flags_exit_before_anything_runs(tmp_path):
    from benchmarks import fourrooms_figure as ff

    base = ["run", "--out", str(tmp_path / "o"), "--compact", str(tmp_path / "c")]
    for extra, want in [
        (["--methods", "bchg,nope"], "unknown"),
        (["--method-workers", "0"], "--method-workers must be >= 1"),
        (["--chunk", "0"], "--chunk must be >= 1"),
        (["--workers", "2", "--method-workers", "2"], "exclude each other"),
        # checked first: a refusal of another flag shows the old code did not check it
        (["--compact", str(tmp_path / "o"), "--methods", "nope"], "is --out itself"),
    ]:
        with pytest.raises(SystemExit) as e:
            ff.main(base + extra)
        assert want in str(e.value.code)
    assert not (tmp_path / "o").exists()


def test_sigterm_stops_the_methods_records_the_sitting_and_the_panel_resumes(tmp_path):
    """``timeout`` (or a scheduler) stops the runner with SIGTERM, sent here to the runner alone:
    its training processes stop too, the stopped sitting is recorded, and the same command
    finishes the panel from the methods' last chunks, its elapsed time summing both sittings."""
    import signal
    import subprocess
    import sys
    import time

    out, compact = tmp_path / "fig", tmp_path / "compact"
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    cmd = [sys.executable, "-m", "benchmarks.fourrooms_figure"] + COMMON[:7]
    cmd += ["--iterations", "400", "--chunk", "10", "--method-workers", "2"]
    cmd += ["--out", str(out), "--compact", str(compact)]
    runner = subprocess.Popen(cmd, cwd=root, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    jsonl = out / PANEL / "by_method" / "naive" / "naive" / "metrics.jsonl"
    deadline = time.time() + 300
    while not (jsonl.exists() and jsonl.read_text().count("\n") >= 2):
        assert time.time() < deadline and runner.poll() is None, runner.stdout.read()
        time.sleep(0.5)
    children = subprocess.run(
        ["pgrep", "-P", str(runner.pid)], capture_output=True, text=True
    ).stdout.split()
    assert len(children) == 2
    runner.send_signal(signal.SIGTERM)
    assert runner.wait(timeout=60) == 143
    time.sleep(1)
    for pid in children:  # the training processes are gone too
        assert not os.path.exists(f"/proc/{pid}") or "Z" in open(f"/proc/{pid}/stat").read()
    sittings = json.loads((out / PANEL / "sittings.json").read_text())
    assert [s["complete"] for s in sittings] == [False] and sittings[0]["seconds"] > 0
    assert not (compact / PANEL / "wall.json").exists()

    done = subprocess.run(cmd, cwd=root, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    sittings = json.loads((out / PANEL / "sittings.json").read_text())
    assert [s["complete"] for s in sittings] == [False, True]
    wall = json.loads((compact / PANEL / "wall.json").read_text())
    assert wall["elapsed"] == pytest.approx(sum(s["seconds"] for s in sittings), abs=0.2)
    with np.load(compact / PANEL / "naive" / "metrics.npz") as d:
        assert d["J"].shape[-1] == 400


def test_a_started_panel_checks_seeds_and_extends_to_more_iterations(tmp_path, capsys):
    """A second ``run`` with other --seeds / --iterations continued the started panel as it was,
    exit 0 and no word; now other seeds are refused (exit with the panel's log named) and more
    iterations extend it, bit for bit the longer run."""
    from benchmarks import fourrooms_figure as ff

    base = COMMON[:4] + ["naive", "--chunk", "10"]
    fig = ["--out", str(tmp_path / "fig"), "--compact", str(tmp_path / "c")]
    ff.main(base + ["--seeds", "2", "--iterations", "20"] + fig)
    with pytest.raises(SystemExit) as e:
        ff.main(base + ["--seeds", "3"] + fig)
    assert "log.txt" in str(e.value.code)
    log = (tmp_path / "fig" / PANEL / "log.txt").read_text()
    assert "--seeds" in log and "error" in log
    ff.main(base + ["--iterations", "30"] + fig)
    longer = _metrics(tmp_path / "fig" / PANEL / "naive" / "metrics.npz")
    assert longer["J"].shape[1:] == (2, 30)
    one = ["--out", str(tmp_path / "one"), "--compact", str(tmp_path / "c1")]
    ff.main(base + ["--seeds", "2", "--iterations", "30"] + one)
    once = _metrics(tmp_path / "one" / PANEL / "naive" / "metrics.npz")
    np.testing.assert_array_equal(longer["J"], once["J"])
