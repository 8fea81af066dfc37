"""``benchmarks.profile_trace``: the busy time is the union of the events' intervals, and a traced
call's summary reads the trace back (here the CPU's XLA threads; on a GPU its streams)."""

from types import SimpleNamespace

import jax
import jax.numpy as jnp
import pytest

from benchmarks.profile_trace import HEADER, _busy_ns, summary_row, trace_summary


def _ev(start, end):
    return SimpleNamespace(start_ns=start, end_ns=end)


def test_busy_time_is_the_union_of_the_intervals():
    assert _busy_ns([]) == 0
    assert _busy_ns([_ev(0, 10), _ev(5, 15), _ev(20, 30)]) == 25  # overlap counted once
    assert _busy_ns([_ev(20, 30), _ev(0, 100)]) == 100  # nested, in any order
    assert _busy_ns([_ev(0, 10), _ev(10, 20)]) == 20  # touching


def test_trace_summary_of_a_jitted_loop():
    @jax.jit
    def f(x):
        return jax.lax.fori_loop(0, 50, lambda i, v: jnp.tanh(v @ v.T) / 8.0, x)

    x = jnp.ones((64, 64))
    f(x).block_until_ready()
    s = trace_summary(f, x, iterations=2)
    assert s["wall_ms"] > 0 and s["kernels"] > 0 and s["where"]
    assert 0 < s["busy_ms"] and 0 <= s["busy_share"]
    assert s["top"] and all(ms >= 0 and n > 0 for _, ms, n in s["top"])
    # one event per operation run: at least one per loop trip, no end markers, no loop event
    assert s["kernels"] * 2 >= 50
    assert not [name for name, _, _ in s["top"] if name.startswith(("end: ", "while"))]
    row = summary_row("f", s)
    assert row.count("|") == HEADER.splitlines()[0].count("|")


def test_cpu_events_that_are_not_operations():
    from benchmarks.profile_trace import is_cpu_op

    assert is_cpu_op("ynn_fusion") and is_cpu_op("copy.6") and is_cpu_op("while_fusion.2")
    for name in ("end: ynn_fusion", "while.5", "cond.3.clone.3", "ThunkExecutor::Execute"):
        assert not is_cpu_op(name), name


@pytest.mark.slow
def test_a_failed_profile_is_reported_not_fatal(monkeypatch, capsys):
    """A machine where the profiler cannot trace (no GPU tracing there) still gets its timing
    table and the device check's verdict; the profile row says what failed."""
    from benchmarks import profile_trace, scaling

    def fail(*args, **kwargs):
        raise RuntimeError("no tracer here")

    monkeypatch.setattr(profile_trace, "trace_summary", fail)
    scaling.main(
        "--experiments fourrooms --runs 1 --iterations 1 --profile-runs 1 --fail-on-cap".split()
    )
    out = capsys.readouterr().out
    assert "| fourrooms | bchg | 1 |" in out
    assert "no profile: RuntimeError: no tracer here" in out


def test_a_device_backend_without_device_events_is_an_error_not_zeros(monkeypatch):
    """A GPU whose kernels the profiler could not trace must not read as an idle device."""
    from benchmarks import profile_trace

    host = SimpleNamespace(name="/host:CPU", lines=[])
    monkeypatch.setattr(jax, "default_backend", lambda: "gpu")
    with pytest.raises(RuntimeError, match="no device events"):
        profile_trace._device_events(SimpleNamespace(planes=[host]))
    kernel = SimpleNamespace(name="loop_fusion", start_ns=0, end_ns=5, duration_ns=5)
    copy = SimpleNamespace(name="MemcpyD2H", start_ns=5, end_ns=6, duration_ns=1)
    lines = [
        SimpleNamespace(name="Stream #7", events=[kernel, copy]),
        SimpleNamespace(name="XLA Ops", events=[kernel]),  # derived: repeats the kernel
    ]
    where, events = profile_trace._device_events(
        SimpleNamespace(planes=[SimpleNamespace(name="/device:GPU:0", lines=lines)])
    )
    assert events == [kernel, copy] and where == ["/device:GPU:0 Stream #7"]
    assert profile_trace.is_copy("MemcpyD2H") and not profile_trace.is_copy("loop_fusion")


@pytest.mark.slow
def test_thermal_throughput_prints_what_bounds_each_row(capsys):
    """``benchmarks.thermal_throughput --profile`` (the device check's faithful thermal step)
    adds a profile row per timed row, read from the same compiled chunk."""
    from benchmarks import thermal_throughput

    thermal_throughput.main(
        "--skip-mlp --methods bchg --seeds 1 --iterations 2 --profile --fail-on-cap".split()
    )
    out = capsys.readouterr().out
    assert "| bchg | quadratic_loo | 1 |" in out
    rows = out.split("Profiled (one more call of the same chunk under jax.profiler):\n")[1]
    row = rows.splitlines()[2]
    assert row.startswith("| bchg quadratic_loo x1 | ") and "no profile" not in row
    assert row.count("|") == HEADER.splitlines()[0].count("|")
