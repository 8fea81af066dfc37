"""What bounds a jitted call: a profiler trace of it, summarised without TensorBoard.

:func:`trace_summary` runs ``fn(*args)`` under ``jax.profiler.trace`` and reads the trace back
with ``jax.profiler.ProfileData``. On a GPU the device planes hold one event per kernel and per
copy: the summary gives, per outer iteration, the kernels launched, the device's busy time (the
union of its events' intervals), the time in copies (a ``while_loop`` on a GPU copies its
predicate to the host every trip) and the costliest kernels. Busy time far below the wall time
with many short kernels means the call is bound by launches and loop trips (latency); busy time
near the wall time with a few long kernels means arithmetic or memory bandwidth. On a CPU there
is no device plane and the XLA worker threads' op events stand in for it (for trying the
plumbing; the split means little there).

Used by ``benchmarks.scaling --profile-runs`` (and so by ``benchmarks/device_check.sh``).
"""

from __future__ import annotations

import glob
import tempfile
import time

import jax


def _busy_ns(events) -> int:
    """Length of the union of the events' [start, end) intervals."""
    total, end = 0, None
    for start, stop in sorted((e.start_ns, e.end_ns) for e in events):
        if end is None or start > end:
            total += stop - start
            end = stop
        elif stop > end:
            total += stop - end
            end = stop
    return total


def _device_events(data):
    """(where, events) of the kernels and copies: the GPU / TPU planes' stream lines if the trace
    has any, else the CPU's XLA worker threads (compile threads left out)."""
    events, where = [], []
    for plane in data.planes:
        if not plane.name.startswith("/device:"):
            continue
        lines = list(plane.lines)
        streams = [ln for ln in lines if "Stream" in ln.name] or lines
        for ln in streams:
            events += list(ln.events)
            where.append(f"{plane.name} {ln.name}")
    if events:
        return where, events
    for plane in data.planes:
        if plane.name != "/host:CPU":
            continue
        for ln in plane.lines:
            if ln.name.startswith(("tf_XLAEigen", "tf_XLAPjRtCpuClient")):
                evs = [e for e in ln.events if not e.name.startswith("ThunkExecutor")]
                events += evs
                where.append(f"{plane.name} {ln.name}")
    return where, events


def trace_summary(fn, *args, iterations: int = 1, top: int = 5) -> dict:
    """Runs ``fn(*args)`` (already compiled: call it once before) under the profiler.

    Returns a dict, every time per outer iteration (``iterations`` of them in the call):
    ``wall_ms``, ``busy_ms`` (device busy), ``busy_share``, ``kernels`` (events per iteration),
    ``copy_ms`` (events named like a memcpy / memset), ``top`` [(name, ms per iteration, count per
    iteration)] of the costliest event names, and ``where`` (the trace lines read).
    """
    from jax.profiler import ProfileData

    with tempfile.TemporaryDirectory() as d:
        with jax.profiler.trace(d):
            t0 = time.perf_counter()
            jax.block_until_ready(fn(*args))
            wall = time.perf_counter() - t0
        files = glob.glob(f"{d}/**/*.xplane.pb", recursive=True)
        if not files:
            raise RuntimeError("the profiler wrote no trace")
        data = ProfileData.from_file(files[0])
        where, events = _device_events(data)
        per = {}
        for e in events:
            ns, n = per.get(e.name, (0, 0))
            per[e.name] = (ns + e.duration_ns, n + 1)
        busy = _busy_ns(events)
        copy = sum(
            ns
            for name, (ns, _) in per.items()
            if "memcpy" in name.lower() or "memset" in name.lower()
        )
    it = max(iterations, 1)
    ranked = sorted(per.items(), key=lambda kv: -kv[1][0])[:top]
    return {
        "wall_ms": 1e3 * wall / it,
        "busy_ms": busy / 1e6 / it,
        "busy_share": busy / 1e9 / wall if wall > 0 else 0.0,
        "kernels": len(events) / it,
        "copy_ms": copy / 1e6 / it,
        "top": [(name, ns / 1e6 / it, n / it) for name, (ns, n) in ranked],
        "where": where,
    }


def summary_row(label: str, s: dict) -> str:
    """One Markdown table row of :func:`trace_summary` (header: :data:`HEADER`)."""
    top = "; ".join(f"{name[:40]} {ms:.3f} ms x{n:g}" for name, ms, n in s["top"])
    return (
        f"| {label} | {s['wall_ms']:.3f} | {s['busy_ms']:.3f} | {s['busy_share']:.0%} | "
        f"{s['kernels']:.0f} | {s['copy_ms']:.3f} | {top} |"
    )


HEADER = (
    "| call | wall ms / it | device busy ms / it | busy share | kernels / it | copies ms / it | "
    "costliest (ms / it x count / it) |\n|---|---:|---:|---:|---:|---:|---|"
)
