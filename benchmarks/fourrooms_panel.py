"""Training the panels of the Four-Rooms figure: one panel's methods as one process, or one
process per method side by side (``--method-workers``), each resumable; the figure's CLI is
``benchmarks.fourrooms_figure``, whose ``run`` calls :func:`run_panel`.

A panel (batch B, beta X) is ``experiments.fourrooms --method <methods> --grid paper --batch B
--beta X --seeds 10 --iterations 10000 --exact-out --out OUT/batchB_betaX``. One process per
method puts each method's own run folder under ``OUT/batchB_betaX/by_method/<method>/``; a
panel started either way is continued that way. After a panel its compact copy (each method's
best grid point, ``experiments.plot.export_best``) and ``wall.json`` go to the compact folder.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

BATCHES = (100, 200, 400, 1000)
BETAS = ("1e-3", "3e-3", "5e-3")
METHODS = ("naive", "sobirl", "hpgd_mc", "hpgd_sa", "bchg", "hpgd_oracle", "exact")
SEEDS, ITERATIONS = 10, 10000  # a new panel's, as in the paper


def panel_name(batch: int, beta: str) -> str:
    return f"batch{batch}_beta{beta}"


def parse_panel(spec: str):
    """``"200:3e-3"`` -> (200, "3e-3"), checked against the paper's batches and betas."""
    try:
        batch, beta = spec.split(":")
        batch = int(batch)
    except ValueError:
        raise SystemExit(f"error: panel {spec!r} is not BATCH:BETA (e.g. 200:3e-3)") from None
    if batch not in BATCHES or beta not in BETAS:
        raise SystemExit(
            f"error: panel {spec!r}: batch must be one of {BATCHES}, beta one of {BETAS}"
        )
    return batch, beta


def method_seconds(run_dir: str) -> dict:
    """{method: seconds} summed over the chunk lines of ``<method>/metrics.jsonl`` (every
    sitting's chunks; the first chunk of a sitting includes its compile)."""
    out = {}
    for m in METHODS:
        path = os.path.join(run_dir, m, "metrics.jsonl")
        if os.path.exists(path):
            with open(path) as f:
                out[m] = round(
                    sum(json.loads(line)["chunk_seconds"] for line in f if line.strip()), 1
                )
    return out


# the panel's methods, costliest first: with fewer --method-workers than methods the long
# jobs start at once (bchg and hpgd_sa train the 240-run grid, hpgd_oracle rolls out 10,000
# extra steps per iteration)
COST_ORDER = ("bchg", "hpgd_sa", "hpgd_oracle", "hpgd_mc", "exact", "sobirl", "naive")
BY_METHOD = "by_method"  # the sub-folder of a panel trained one process per method
CHILDREN = set()  # the training processes running now (stopped with this one: stop_on_sigterm)


def panel_command(
    run_dir: str,
    methods,
    batch: int,
    beta: str,
    seeds=None,
    iterations=None,
    chunk=None,
    parallel_steps: bool = False,
):
    """The ``experiments.fourrooms`` command that trains (or, when ``run_dir`` holds a
    ``config.json``, resumes) ``methods`` of one panel into ``run_dir``. A new panel gets
    ``seeds`` / ``iterations`` (None: :data:`SEEDS` / :data:`ITERATIONS`); a resumed one gets
    those given, which ``--resume`` checks against the saved run (other seeds are refused, more
    iterations extend it; they were ignored without a word), and goes on as it was started
    without them. ``parallel_steps`` adds ``--parallel-steps`` (TrainConfig.parallel_steps) to
    either: a new panel trains that way, and a started one must have been started that way
    (``--resume`` refuses the other form)."""
    if os.path.exists(os.path.join(run_dir, "config.json")):
        cmd = ["--resume", run_dir]
        for flag, value in (("--seeds", seeds), ("--iterations", iterations)):
            cmd += [] if value is None else [flag, str(value)]
    else:
        seeds = SEEDS if seeds is None else seeds
        iterations = ITERATIONS if iterations is None else iterations
        cmd = [
            "--method",
            ",".join(methods),
            "--grid",
            "paper",
            "--batch",
            str(batch),
            "--beta",
            beta,
            "--seeds",
            str(seeds),
            "--iterations",
            str(iterations),
            "--exact-out",
            "--out",
            run_dir,
        ]
    if chunk is not None:
        cmd += ["--chunk", str(chunk)]
    if parallel_steps:
        cmd += ["--parallel-steps"]
    return [sys.executable, "-m", "experiments.fourrooms"] + cmd


def _train(cmd, run_dir: str, label: str, core=None, env=None) -> None:
    """Runs ``cmd`` with its output appended to ``run_dir/log.txt``."""
    pin = None if core is None else (lambda: os.sched_setaffinity(0, {core}))
    os.makedirs(run_dir, exist_ok=True)
    log = os.path.join(run_dir, "log.txt")
    print(
        f"== {label}"
        + ("" if core is None else f" (core {core})")
        + f": {' '.join(cmd[1:])} >> {log}",
        flush=True,
    )
    t0 = time.perf_counter()
    with open(log, "a") as f:
        proc = subprocess.Popen(cmd, stdout=f, stderr=subprocess.STDOUT, preexec_fn=pin, env=env)
        CHILDREN.add(proc)
        try:
            rc = proc.wait()
        finally:
            CHILDREN.discard(proc)
    if rc:
        raise subprocess.CalledProcessError(rc, cmd)
    print(f"== {label} done in {time.perf_counter() - t0:.0f} s (this sitting)", flush=True)


def _parts(run_dir: str):
    """{method: its own run folder} of a panel trained one process per method."""
    root = os.path.join(run_dir, BY_METHOD)
    if not os.path.isdir(root):
        return {}
    return {
        m: os.path.join(root, m)
        for m in COST_ORDER
        if os.path.exists(os.path.join(root, m, "config.json"))
    }


def _train_by_method(run_dir: str, methods, workers: int, args: dict) -> None:
    """Trains each method of a panel as its own process (``workers`` at a time, costliest
    first), each into ``run_dir/by_method/<method>``: a run folder of one method, resumed if it
    exists. On a CPU with cores to spare their compiles overlap. On one GPU they take turns on
    the card and each waits out the others' turns at every host test (a solver loop's test or a
    ``lax.cond``, read back by the host: ``benchmarks/loop_trips.py`` counts them): run them one
    at a time there (docs/performance.md, "On an NVIDIA
    H200"). Each child is told not to preallocate GPU memory
    (``XLA_PYTHON_CLIENT_PREALLOCATE=false``, unless set) so that several fit."""
    from concurrent.futures import ThreadPoolExecutor

    env = dict(os.environ)
    env.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
    todo = sorted(methods, key=COST_ORDER.index)
    failed = []

    def one(m):
        part = os.path.join(run_dir, BY_METHOD, m)
        try:
            _train(
                panel_command(part, [m], **args), part, f"{os.path.basename(run_dir)} {m}", env=env
            )
        except subprocess.CalledProcessError as e:
            failed.append(f"{m}: {e}")

    with ThreadPoolExecutor(max_workers=workers) as pool:
        list(pool.map(one, todo))
    if failed:
        raise subprocess.CalledProcessError(1, "experiments.fourrooms", "; ".join(failed))


def _merge_parts(run_dir: str, dest: str, methods) -> dict:
    """Compact copies of every method's own run folder into ``dest``, with one ``config.json``
    naming all of them; -> {method: seconds}."""
    from bchg_jax.core.io import save_json
    from experiments.plot import export_best

    parts = _parts(run_dir)
    seconds = {}
    for i, m in enumerate(methods):
        export_best(parts[m], dest, replace=i == 0)  # the first clears an earlier copy's methods
        seconds.update(method_seconds(parts[m]))
    with open(os.path.join(parts[methods[0]], "config.json")) as f:
        cfg = json.load(f)
    cfg["methods"] = list(methods)
    cfg["args"] = {**cfg["args"], "method": ",".join(methods)}
    save_json(os.path.join(dest, "config.json"), cfg)
    return seconds


def run_panel(
    out: str,
    compact: str,
    batch: int,
    beta: str,
    methods,
    seeds=None,
    iterations=None,
    core=None,
    chunk=None,
    method_workers: int = 1,
    parallel_steps: bool = False,
) -> None:
    """Trains one panel (or continues it) and writes its compact copy and ``wall.json``.

    ``method_workers`` > 1 trains the methods as that many concurrent processes, each in its own
    run folder under ``OUT/batchB_betaX/by_method/`` (:func:`_train_by_method`); a panel started
    that way is continued that way. ``wall.json`` holds each method's seconds (compile
    included, every sitting), their ``total`` and the panel's ``elapsed`` wall-clock seconds
    summed over its sittings (below ``total`` when methods ran side by side).
    ``parallel_steps``: :func:`panel_command`'s."""
    from bchg_jax.core.io import save_json
    from experiments.plot import export_best

    name = panel_name(batch, beta)
    run_dir = os.path.join(out, name)
    dest = os.path.join(compact, name)
    by_method = os.path.isdir(os.path.join(run_dir, BY_METHOD))
    started = by_method or os.path.exists(os.path.join(run_dir, "config.json"))
    if os.path.exists(os.path.join(dest, "wall.json")) and not started:
        print(f"== {name}: done, kept in {dest} (delete it to train again)", flush=True)
        return
    if method_workers > 1 and not started:
        by_method = True
    elif method_workers > 1 and not by_method:
        print(f"== {name}: started as one process, continued as one", flush=True)
    args = dict(
        batch=batch,
        beta=beta,
        seeds=seeds,
        iterations=iterations,
        chunk=chunk,
        parallel_steps=parallel_steps,
    )
    sittings_path = os.path.join(run_dir, "sittings.json")
    sittings = []
    if os.path.exists(sittings_path):
        with open(sittings_path) as f:
            sittings = json.load(f)
    t0, complete = time.perf_counter(), False
    try:  # every sitting is recorded, also one stopped by SIGTERM (stop_on_sigterm)
        if by_method:
            panel_path = os.path.join(run_dir, "panel.json")  # the methods it was started with
            if os.path.exists(panel_path):
                with open(panel_path) as f:
                    methods = json.load(f)["methods"]
            else:
                save_json(panel_path, {"methods": list(methods)})
            _train_by_method(run_dir, methods, max(method_workers, 1), args)
        else:
            _train(panel_command(run_dir, methods, **args), run_dir, name, core)
        complete = True
    finally:
        sittings.append(
            {
                "seconds": round(time.perf_counter() - t0, 1),
                "method_workers": method_workers,
                "complete": complete,
            }
        )
        save_json(sittings_path, sittings)
    if by_method:
        methods = [m for m in METHODS if m in methods]
        os.makedirs(dest, exist_ok=True)
        seconds = _merge_parts(run_dir, dest, methods)
    else:
        export_best(run_dir, dest)
        seconds = method_seconds(run_dir)
    save_json(
        os.path.join(dest, "wall.json"),
        {
            "seconds": seconds,
            "total": round(sum(seconds.values()), 1),
            "elapsed": round(sum(s["seconds"] for s in sittings), 1),
            "method_workers": max(s["method_workers"] for s in sittings),
        },
    )


def stop_on_sigterm(signum, frame):
    """SIGTERM (``timeout``, job schedulers): stop the training processes, then leave through
    the ``finally`` blocks, so that :func:`run_panel` records the sitting (stopped runs resume
    from their last chunk)."""
    for proc in list(CHILDREN):
        proc.terminate()
    sys.exit(143)
