"""What bounds a jitted call: a profiler trace of it, summarised without TensorBoard.

:func:`trace_summary` runs ``fn(*args)`` under ``jax.profiler.trace`` and reads the trace back
with ``jax.profiler.ProfileData``. On a GPU the device planes hold one event per kernel and per
copy: the summary gives, per outer iteration, the kernels launched, the device's busy time (the
union of its events' intervals) as a share of the untraced call's time, the copies (a
``while_loop`` on a GPU copies its predicate to the host every trip; copy kernels on the device,
such as ``memcpy32_post``, count here too: ``benchmarks.loop_trips`` counts the host tests
alone) and the costliest kernels.
A low busy share with many short kernels means the call is bound by launches and loop trips
(latency); a share near 1 with a few long kernels means arithmetic or memory bandwidth. The
traced call runs slower than the untraced one (tracing adds to every launch, and XLA turns CUDA
graphs off while profiling), so its wall time is reported apart. On a CPU there
is no device plane and the XLA worker threads' op events stand in for it (for trying the
plumbing; the split means little there).

Used by ``benchmarks.scaling --profile-runs`` (and so by ``benchmarks/device_check.sh``).
"""

from __future__ import annotations

import glob
import re
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


# timelines that a trace viewer derives from the kernels (their events repeat the kernels' time)
DERIVED_LINES = (
    "XLA Modules",
    "XLA Ops",
    "XLA TraceMe",
    "Steps",
    "Framework Name Scope",
    "Framework Ops",
    "TensorFlow Name Scope",
    "TensorFlow Ops",
    "Source code",
)


def is_copy(name: str) -> bool:
    """A memory copy or set rather than a kernel (CUPTI names them ``Memcpy...`` /
    ``Memset...``)."""
    low = name.lower()
    return "memcpy" in low or "memset" in low


def _device_events(data):
    """(where, events) of the kernels and copies: every line of the GPU / TPU planes but those a
    viewer derives (:data:`DERIVED_LINES`); on a CPU backend, the op events of the XLA threads
    named ``tf_XLA...`` (the names differ between jax releases; compile threads and the events
    :func:`is_cpu_op` rejects left out). Raises when a non-CPU backend's trace holds no device
    event (the profiler could not trace the device: zeros would read as a result)."""
    events, where = [], []
    for plane in data.planes:
        if not plane.name.startswith("/device:"):
            continue
        for ln in plane.lines:
            if ln.name in DERIVED_LINES:
                continue
            evs = list(ln.events)
            if evs:
                events += evs
                where.append(f"{plane.name} {ln.name}")
    if events:
        return where, events
    if jax.default_backend() != "cpu":
        raise RuntimeError(
            f"no device events in the trace on the {jax.default_backend()} backend (planes: "
            + ", ".join(p.name for p in data.planes)
            + ")"
        )
    for plane in data.planes:
        if plane.name != "/host:CPU":
            continue
        for ln in plane.lines:
            if ln.name.startswith("tf_XLA") and "compil" not in ln.name.lower():
                evs = [e for e in ln.events if is_cpu_op(e.name)]
                events += evs
                where.append(f"{plane.name} {ln.name}")
    return where, events


# XLA:CPU trace events that are not an operation's run: the end markers that repeat every op
# (jax 0.10-0.12), the executor's and thread pool's bookkeeping, and control flow (a while
# loop's or conditional's event spans its body's ops; on a GPU the loop is no kernel at all)
_CPU_NOT_OPS = ("end: ", "ThunkExecutor", "ThreadpoolListener")
_CPU_CONTROL_FLOW = re.compile(r"^(while|cond|conditional|call)(\.|$)")


def is_cpu_op(name: str) -> bool:
    """An XLA:CPU trace event that is one operation's run (see :data:`_CPU_NOT_OPS`)."""
    return not name.startswith(_CPU_NOT_OPS) and not _CPU_CONTROL_FLOW.match(name)


def trace_summary(fn, *args, iterations: int = 1, untraced_s=None, top: int = 5) -> dict:
    """Runs ``fn(*args)`` (already compiled: call it once before) under the profiler.

    Returns a dict, every time per outer iteration (``iterations`` of them in the call):
    ``wall_ms`` (the traced call: tracing slows launches, and XLA turns CUDA graphs off while
    profiling), ``busy_ms`` (device busy: the union of the events' intervals), ``busy_share``
    (busy time over ``untraced_s``, the same call's untraced seconds per iteration when given,
    else over the traced wall time), ``kernels`` and ``copies`` (events per iteration),
    ``copy_ms``, ``top`` [(name, ms per iteration, count per iteration)] of the costliest event
    names, and ``where`` (the trace lines read).
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
    it = max(iterations, 1)
    copies = {name: v for name, v in per.items() if is_copy(name)}
    base = untraced_s * it if untraced_s else wall
    ranked = sorted(per.items(), key=lambda kv: -kv[1][0])[:top]
    return {
        "wall_ms": 1e3 * wall / it,
        "busy_ms": busy / 1e6 / it,
        "busy_share": busy / 1e9 / base if base > 0 else 0.0,
        "kernels": sum(n for name, (_, n) in per.items() if name not in copies) / it,
        "copies": sum(n for _, n in copies.values()) / it,
        "copy_ms": sum(ns for ns, _ in copies.values()) / 1e6 / it,
        "top": [(name, ns / 1e6 / it, n / it) for name, (ns, n) in ranked],
        "where": where,
    }


def summary_row(label: str, s: dict) -> str:
    """One Markdown table row of :func:`trace_summary` (header: :data:`HEADER`)."""
    top = "; ".join(f"{name[:40]} {ms:.3f} ms x{n:g}" for name, ms, n in s["top"])
    return (
        f"| {label} | {s['wall_ms']:.3f} | {s['busy_ms']:.3f} | {s['busy_share']:.0%} | "
        f"{s['kernels']:.0f} | {s['copies']:.0f} | {s['copy_ms']:.3f} | {top} |"
    )


def profile_row(label: str, prof) -> str:
    """A table row of a profile: :func:`summary_row` of a summary, or the text saying why there
    is none (``benchmarks._timing.time_chunks`` returns one where profiling failed or was
    skipped)."""
    return (
        f"| {label} | no profile: {prof} |" if isinstance(prof, str) else summary_row(label, prof)
    )


HEADER = (
    "| call | traced wall ms / it | device busy ms / it | busy share of the untraced time | "
    "kernels / it | copies / it | copies ms / it | costliest (ms / it x count / it) |\n"
    "|---|---:|---:|---:|---:|---:|---:|---|"
)
