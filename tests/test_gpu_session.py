"""``benchmarks/gpu_session.sh --smoke``: the GPU session's plumbing, on the CPU. A GPU
lease is short and rare; this is what keeps its script from failing on the day."""

import os
import subprocess
import tarfile

import pytest

pytestmark = pytest.mark.slow

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _session(out, work, *flags, budget=1500, smoke=True):  # a slow 2-core CPU took 794 s
    env = {**os.environ, "GPU_SESSION_WORK": str(work), "GPU_SESSION_BUDGET": str(budget)}
    return subprocess.run(
        ["bash", "benchmarks/gpu_session.sh", *(["--smoke"] if smoke else []), *flags, str(out)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=2400,
    )


def test_a_check_only_call_runs_the_device_check_and_not_the_panel(tmp_path):
    """The first of a lease's 10-minute calls: ``--check-only`` bundles the check's files in
    four and trains nothing. (The panel's calls are the next test: apart, the two workers of
    the slow tier share them.)"""
    out, work = tmp_path / "out", tmp_path / "work"
    proc = _session(out, work, "--check-only")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    result = (out / "RESULT.txt").read_text()
    assert "device check: passed" in result and "panel" not in result
    assert sorted(os.listdir(out)) == [
        "RESULT.txt",
        "device_check.txt",
        "gpu_session.tgz",
        "header.txt",
    ]
    check = (out / "device_check.txt").read_text()
    for step in ("fourrooms_throughput", "thermal_faithful", "scaling_lqr_game", "PASSED"):
        assert f"### {step}" in check
    # each step's duration against its limit, so that the limits can be sized from a GPU run
    steps = check.split("### steps\n")[1].split("###")[0].splitlines()
    assert [line.split(":")[0] for line in steps] == [
        "fourrooms_throughput",
        "thermal_faithful",
        "scaling_fourrooms",
        "scaling_thermal",
        "scaling_toy_game",
        "scaling_lqr_game",
    ]
    assert all(line.endswith("exit 0") and " s of its " in line for line in steps), steps
    with tarfile.open(out / "gpu_session.tgz") as t:
        assert "check/PASSED.txt" in t.getnames()
    assert not (work / "fig").exists() and not (work / "compact").exists()


def test_panel_only_calls_train_continue_and_refuse_a_short_budget(tmp_path):
    """The panel in calls of its own, in the work folder a ``--check-only`` call left (its
    check is kept, not wiped); each call bundles its files in at most six."""
    out, work = tmp_path / "out2", tmp_path / "work"
    (work / "check").mkdir(parents=True)  # what the check-only call before it left
    (work / "check" / "PASSED.txt").write_text("device check passed\n")
    proc = _session(out, work, "--panel-only")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    result = (out / "RESULT.txt").read_text()
    assert "panel: complete" in result and "device check" not in result
    assert sorted(os.listdir(out)) == [
        "RESULT.txt",
        "compact.tgz",
        "gpu_session.tgz",
        "header.txt",
        "panel.txt",
    ]
    with tarfile.open(out / "gpu_session.tgz") as t:
        names = set(t.getnames())
    with tarfile.open(out / "compact.tgz") as t:
        assert "compact/batch100_beta1e-3/wall.json" in t.getnames()
    assert "fig/batch100_beta1e-3/by_method/bchg/bchg/metrics.jsonl" in names
    assert not any("checkpoint" in n for n in names)
    assert "check/PASSED.txt" in names and (work / "check" / "PASSED.txt").exists()
    assert "7 method worker(s)" in (out / "panel.txt").read_text()

    # a further call continues the (here complete) panel
    proc = _session(tmp_path / "out3", work, "--panel-only")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "panel: complete" in (tmp_path / "out3" / "RESULT.txt").read_text()

    # too little time left for the panel: said, and the exit status says it
    proc = _session(tmp_path / "out4", work, "--panel-only", budget=50)
    assert proc.returncode == 1
    assert "panel: not started" in (tmp_path / "out4" / "RESULT.txt").read_text()


def test_the_panel_only_and_check_only_calls_exclude_each_other(tmp_path):
    for pair in (("--panel-only", "--check-only"), ("--check-only", "--ab-only")):
        proc = _session(tmp_path / "out", tmp_path / "work", *pair)
        assert proc.returncode == 2 and "exclude each other" in proc.stderr
        assert not (tmp_path / "work").exists()


def test_an_ab_only_call_times_both_forms_of_four_rooms_steps_and_nothing_else(tmp_path):
    """``--ab-only``: step 3 alone (Four-Rooms with its scans and with parallel steps, the fused
    critic fit checked against XLA's, the faithful thermal run, the parts of a parallel
    iteration with the sparse follower's rounds in each form, Four-Rooms at 25 steps per scan
    trip and at 8 steps per host test), every Four-Rooms row beside its J."""
    out = tmp_path / "out"
    proc = _session(out, tmp_path / "work", "--ab-only")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    result = (out / "RESULT.txt").read_text()
    for part in (
        "Four-Rooms, scan and parallel steps: passed",
        "fused TD fit against XLA's: passed",
        "thermal faithful, XLA and fused critic fits: passed",
        "Four-Rooms, 25 steps per scan trip: passed",
        "Four-Rooms, parallel steps, 8 steps per host test: passed",
        "fourrooms_parts, parallel steps: passed",
        "fourrooms_parts, parallel steps, the follower's rounds as a loop: passed",
    ):
        assert part in result, result
    assert "device check" not in result and "panel" not in result
    assert sorted(os.listdir(out)) == ["RESULT.txt", "ab.txt", "gpu_session.tgz", "header.txt"]
    ab = (out / "ab.txt").read_text()
    first, fused, thermal, parts, loop, unrolled, tests = ab.split("### ")[1:]
    rows = [line.split(" | ") for line in first.splitlines() if line.startswith("| 0.001 |")]
    assert [r[1:3] for r in rows] == [["sparse", "scan"], ["sparse", "parallel"]]
    J = [float(r[10]) for r in rows]  # the grid's mean J: the same leader either way
    assert abs(J[0] - J[1]) < 1e-5 * abs(J[0]) and J[0] < 0
    assert "| bchg | mlp (faithful, 50 Adam steps) | 1 |" in thermal
    assert "(ok, limit" in fused and "| fused |" in fused and "| xla |" in fused
    assert "25 steps per trip" in unrolled and "parallel steps" in parts.splitlines()[1]
    assert "against the scans on this device: batch identical" in parts
    assert "sparse rounds auto" in parts and "sparse rounds loop" in loop
    assert "a solver loop test every 8 steps" in tests and "| sparse | parallel |" in tests


def test_a_machine_without_a_gpu_backend_stops_at_once(tmp_path):
    """Without --smoke the session needs JAX's GPU backend: on this CPU it says so and runs
    nothing (a lease is not spent on CPU timings)."""
    out = tmp_path / "out"
    proc = _session(out, tmp_path / "work", smoke=False)
    assert proc.returncode == 1
    assert "no GPU: JAX's backend is 'cpu'" in (out / "RESULT.txt").read_text()
    assert not (tmp_path / "work" / "check").exists()
