"""The whole Four-Rooms figure: every (batch, beta) panel of the paper, all methods.

    python -m benchmarks.fourrooms_figure run [--out results/fourrooms_figure]
        [--compact benchmarks/results/fourrooms_figure] [--panels 200:3e-3 400:1e-3 ...]
    python -m benchmarks.fourrooms_figure figure [--compact benchmarks/results/fourrooms_figure]

``run`` trains the panels one after the other, each as
``python -m experiments.fourrooms --method <all six> ,exact --grid paper --batch B --beta BETA
--seeds 10 --iterations 10000 --exact-out --out OUT/batchB_betaBETA`` (every method's paper grid
x 10 seeds x 10,000 iterations, ``exact`` as the reference line). A panel folder that already
holds a ``config.json`` is continued with ``--resume`` (complete methods are skipped), so the
command can be stopped at any time and given again in a later sitting; a panel whose compact
copy is complete and whose full folder is gone is skipped. After each panel its
compact copy (best grid point of every method, ``experiments.plot --export``) and
``wall.json`` (seconds per method, summed over the chunks of every sitting, compile included)
go to ``--compact``. Each panel's output goes to ``OUT/batchB_betaBETA/log.txt``.
``--workers 2`` trains two panels at once, each pinned to one core: on the 2-core CPU the
240-run grid runs faster on one pinned core than unpinned on both (XLA:CPU's threading costs
more than it gives at these sizes; docs/performance.md).

``figure`` draws the panels found under ``--compact`` (rows: batch, columns: beta) into
``figure.png`` and writes ``table.md``: mean +- SE over 10 seeds of the last 1000 iterations at
each method's best grid point, and the wall time of every panel.

``compare`` checks the panels under ``--compact`` against a reference: by default the committed
CPU table ``benchmarks/results/fourrooms_figure/table.md`` (the compact copies themselves are
not kept in git), or ``--reference DIR`` holding another run's compact copies. Per panel and
method it prints both means +- SE, their difference in units of the combined standard error and
the wall times, and exits with status 3 if a difference exceeds both ``--max-se`` (default 2)
combined SEs and ``--abs-tol`` (default 1e-3, the table's rounding: methods whose 10 seeds end
at the same J have an SE near 0).

``--method-workers K`` trains each panel's methods as K concurrent processes, each method in its
own run folder under ``OUT/batchB_betaX/by_method/`` (continued the same way when given again);
``wall.json`` then also records the panel's elapsed wall-clock time beside the methods' summed
seconds. ``--chunk N`` sets the iterations per jitted chunk (each chunk ends with a checkpoint).

On a GPU one panel (every method + exact, 10 seeds x 10,000 iterations) is
``python -m benchmarks.fourrooms_figure run --panels 100:1e-3 --out OUT --compact OUT/compact
--method-workers 7 --chunk 1000`` then ``python -m benchmarks.fourrooms_figure compare --compact
OUT/compact``; ``benchmarks/gpu_session.sh`` runs both after the device check, in one call.
"""

from __future__ import annotations

import argparse
import json
import os
import queue
import signal
import subprocess
import sys
import threading
import time

BATCHES = (100, 200, 400, 1000)
BETAS = ("1e-3", "3e-3", "5e-3")
METHODS = ("naive", "sobirl", "hpgd_mc", "hpgd_sa", "bchg", "hpgd_oracle", "exact")


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
CHILDREN = set()  # the training processes running now (stopped with this one: _stop)


def panel_command(
    run_dir: str, methods, batch: int, beta: str, seeds: int, iterations: int, chunk=None
):
    """The ``experiments.fourrooms`` command that trains (or, when ``run_dir`` holds a
    ``config.json``, resumes) ``methods`` of one panel into ``run_dir``."""
    if os.path.exists(os.path.join(run_dir, "config.json")):
        cmd = ["--resume", run_dir]
    else:
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
    exists. On a GPU the processes' compiles overlap and their small kernels share the card;
    each child is told not to preallocate GPU memory (``XLA_PYTHON_CLIENT_PREALLOCATE=false``,
    unless set) so that they fit side by side."""
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
    for m in methods:
        export_best(parts[m], dest)
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
    seeds: int,
    iterations: int,
    core=None,
    chunk=None,
    method_workers: int = 1,
) -> None:
    """Trains one panel (or continues it) and writes its compact copy and ``wall.json``.

    ``method_workers`` > 1 trains the methods as that many concurrent processes, each in its own
    run folder under ``OUT/batchB_betaX/by_method/`` (:func:`_train_by_method`); a panel started
    that way is continued that way. ``wall.json`` holds each method's seconds (compile
    included, every sitting), their ``total`` and the panel's ``elapsed`` wall-clock seconds
    summed over its sittings (below ``total`` when methods ran side by side)."""
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
    args = dict(batch=batch, beta=beta, seeds=seeds, iterations=iterations, chunk=chunk)
    sittings_path = os.path.join(run_dir, "sittings.json")
    sittings = []
    if os.path.exists(sittings_path):
        with open(sittings_path) as f:
            sittings = json.load(f)
    t0, complete = time.perf_counter(), False
    try:  # every sitting is recorded, also one stopped by SIGTERM (_stop)
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


def panels_found(compact: str):
    return [
        (b, e)
        for b in BATCHES
        for e in BETAS
        if os.path.exists(os.path.join(compact, panel_name(b, e), "config.json"))
    ]


def write_figure(compact: str) -> None:
    from bchg_jax.core.io import atomic_write_bytes, save_figure
    from experiments.plot import final_table, panel_figure

    found = panels_found(compact)
    if not found:
        raise SystemExit(f"error: no panel folders under {compact}")
    dirs = [os.path.join(compact, panel_name(b, e)) for b, e in found]
    save_figure(os.path.join(compact, "figure.png"), panel_figure(dirs))
    parts = [
        "Mean +- SE over the seeds of the last 1000 iterations, each method at its best "
        "grid point (chosen on that mean).",
        "",
    ]
    total = 0.0
    for b in BATCHES:
        row = [os.path.join(compact, panel_name(b, e)) for e in BETAS if (b, e) in found]
        if not row:
            continue
        parts += [f"### batch {b}", "", final_table(row)]
        walls = []
        for d in row:
            if not os.path.exists(os.path.join(d, "wall.json")):  # exported, not finished
                walls.append(f"{os.path.basename(d)} unknown")
                continue
            with open(os.path.join(d, "wall.json")) as f:
                w = json.load(f)
            total += w["total"]
            walls.append(
                f"{os.path.basename(d)} {w['total']:.0f} s"
                + (f" ({w['note']})" if w.get("note") else "")
            )
        parts += ["", "wall time (all methods, compile included): " + ", ".join(walls), ""]
    parts.append(
        f"Total wall time of the {len(found)} panels: {total:.0f} s ({total / 3600:.2f} h)."
    )
    text = "\n".join(parts) + "\n"
    atomic_write_bytes(os.path.join(compact, "table.md"), text.encode())
    print(text)


def read_table(path: str) -> dict:
    """{panel name: {method: {"mean", "se"}}} from a ``table.md`` that :func:`write_figure`
    wrote (cells ``0.662 +- 0.005 (lr 0.1, a 0.5)``, columns ``batchB_betaX: ...``)."""
    from experiments.plot import METHOD_LABELS

    by_label = {label: m for m, label in METHOD_LABELS.items()}
    out, panels = {}, []
    with open(path) as f:
        for line in f:
            cells = [c.strip() for c in line.strip().strip("|").split("|")]
            if line.startswith("| method |"):
                panels = [c.split(":")[0] for c in cells[1:]]
            elif line.startswith("| ") and panels and cells[0] in by_label:
                for panel, cell in zip(panels, cells[1:], strict=False):
                    mean, _, rest = cell.partition(" +- ")
                    out.setdefault(panel, {})[by_label[cells[0]]] = {
                        "mean": float(mean),
                        "se": float(rest.split()[0]),
                    }
    return out


def compare(compact: str, reference: str, max_se: float, abs_tol: float = 1e-3) -> bool:
    """Prints, per panel found in both and per method, the two means +- SE and their difference
    over the combined SE; returns True when every difference is within ``max_se`` combined SEs
    or within ``abs_tol``. ``reference``: a ``table.md`` or a folder of compact copies. It also
    prints how often at least one of the comparisons that the SE decides would miss by chance
    (1 - 0.954^k at 2 SE: 17% for four), to read a single miss by."""
    import math

    from experiments.plot import load_run

    if os.path.isfile(reference):
        table = read_table(reference)
        ref_of = {
            pe: table[panel_name(*pe)] for pe in panels_found(compact) if panel_name(*pe) in table
        }
    else:
        ref_of = {
            pe: {m: s for m, (_, s) in load_run(os.path.join(reference, panel_name(*pe))).items()}
            for pe in panels_found(reference)
        }
    found = [pe for pe in panels_found(compact) if pe in ref_of]
    if not found:
        raise SystemExit(f"error: no panel is in both {compact} and {reference}")
    ok, spread = True, 0
    print("| panel | method | this run | reference | difference / SE | within |")
    print("|---|---|---:|---:|---:|---|")
    for b, e in found:
        mine = load_run(os.path.join(compact, panel_name(b, e)))
        ref = ref_of[(b, e)]
        for m in METHODS:
            if m not in mine or m not in ref:
                continue
            a, r = mine[m][1], ref[m]
            se = math.hypot(a["se"], r["se"])
            spread += se * max_se > abs_tol  # the SE test, not the rounding, decides
            diff = abs(a["mean"] - r["mean"])
            z = diff / se if se > 0 else (0.0 if diff == 0 else math.inf)
            within = z <= max_se or diff <= abs_tol
            ok &= within
            print(
                f"| {panel_name(b, e)} | {m} | {a['mean']:.4f} +- {a['se']:.4f} | "
                f"{r['mean']:.4f} +- {r['se']:.4f} | {z:.2f} | {'yes' if within else 'NO'} |"
            )
        wall = os.path.join(compact, panel_name(b, e), "wall.json")
        if os.path.exists(wall):
            with open(wall) as f:
                w = json.load(f)
            print(
                f"wall time {panel_name(b, e)} (this run): {w['total']:.0f} s summed over the "
                "methods, compile included"
                + (
                    f"; {w['elapsed']:.0f} s elapsed ({w['method_workers']} method worker(s))"
                    if "elapsed" in w
                    else ""
                )
            )
    if spread:  # read a single miss with this in mind
        p_one = math.erfc(max_se / math.sqrt(2))
        print(
            f"{spread} comparisons are decided by their SE. Were both runs draws of the same "
            f"distribution (normal means), at least one would be beyond {max_se:g} SE by chance "
            f"with probability {1 - (1 - p_one) ** spread:.0%}."
        )
    return ok


def main(argv=None):
    p = argparse.ArgumentParser(
        prog="python -m benchmarks.fourrooms_figure",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("action", choices=("run", "figure", "compare"))
    p.add_argument(
        "--out",
        default="results/fourrooms_figure",
        help="full run folders, one per panel (default results/fourrooms_figure)",
    )
    p.add_argument(
        "--compact",
        default="benchmarks/results/fourrooms_figure",
        help="compact copies, figure.png and table.md",
    )
    p.add_argument(
        "--panels",
        nargs="+",
        default=None,
        metavar="BATCH:BETA",
        help="panels to run, in this order (default: all 12, batch-major)",
    )
    p.add_argument(
        "--methods",
        default=",".join(METHODS),
        help="comma-separated methods of a new panel (default: the six and exact)",
    )
    p.add_argument(
        "--workers",
        type=int,
        default=1,
        help="panels trained at once, each pinned to its own core (default 1: one "
        "unpinned job). On the 2-core CPU two pinned jobs give ~2.7x the grid "
        "throughput of one unpinned job (docs/performance.md)",
    )
    p.add_argument(
        "--method-workers",
        type=int,
        default=1,
        help="run: train each panel's methods as this many concurrent processes, each method "
        "in its own run folder under OUT/batchB_betaX/by_method/ (default 1: one process per "
        "panel). For a GPU, where the compiles overlap and the methods' small kernels share "
        "the card",
    )
    p.add_argument(
        "--chunk",
        type=int,
        default=None,
        help="run: iterations per jitted chunk, passed to experiments.fourrooms (default: its "
        "500). Each chunk ends with a checkpoint and a rewrite of metrics.npz; on a GPU, where "
        "500 iterations take about a second, 1000 or more keeps those writes from dominating",
    )
    p.add_argument("--seeds", type=int, default=10)
    p.add_argument("--iterations", type=int, default=10000)
    p.add_argument(
        "--reference",
        default="benchmarks/results/fourrooms_figure/table.md",
        help="compare: a table.md, or a folder of compact copies, to compare with (default: "
        "the committed CPU table)",
    )
    p.add_argument(
        "--max-se",
        type=float,
        default=2.0,
        help="compare: the largest difference allowed, in combined SEs (default 2)",
    )
    p.add_argument(
        "--abs-tol",
        type=float,
        default=1e-3,
        help="compare: a difference this small always passes (default 1e-3, the table's rounding)",
    )
    a = p.parse_args(argv)
    if a.action == "figure":
        write_figure(a.compact)
        return
    if a.action == "compare":
        if not compare(a.compact, a.reference, a.max_se, a.abs_tol):
            raise SystemExit(3)
        return
    panels = (
        [parse_panel(s) for s in a.panels] if a.panels else [(b, e) for b in BATCHES for e in BETAS]
    )
    methods = a.methods.split(",")
    unknown = [m for m in methods if m not in METHODS]
    if unknown:
        raise SystemExit(f"error: --methods: unknown {unknown}; choose from {', '.join(METHODS)}")
    for flag in ("workers", "method_workers", "chunk"):
        if getattr(a, flag) is not None and getattr(a, flag) < 1:
            raise SystemExit(f"error: --{flag.replace('_', '-')} must be >= 1")
    if a.workers > 1 and a.method_workers > 1:
        raise SystemExit(
            "error: --workers (panels at once) and --method-workers exclude each other"
        )
    more = dict(chunk=a.chunk, method_workers=a.method_workers)
    if a.workers == 1:
        for batch, beta in panels:
            run_panel(a.out, a.compact, batch, beta, methods, a.seeds, a.iterations, **more)
    else:
        cores = sorted(os.sched_getaffinity(0))
        todo = queue.Queue()
        for panel in panels:
            todo.put(panel)
        failed = []

        def worker(core):
            while True:
                try:
                    batch, beta = todo.get_nowait()
                except queue.Empty:
                    return
                try:
                    run_panel(
                        a.out,
                        a.compact,
                        batch,
                        beta,
                        methods,
                        a.seeds,
                        a.iterations,
                        core,
                        chunk=a.chunk,
                    )
                except subprocess.CalledProcessError as e:
                    failed.append(f"{panel_name(batch, beta)}: {e}")

        threads = [
            threading.Thread(target=worker, args=(cores[i % len(cores)],)) for i in range(a.workers)
        ]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        if failed:
            raise SystemExit("error: " + "; ".join(failed))
    write_figure(a.compact)


def _stop(signum, frame):
    """SIGTERM (``timeout``, job schedulers): stop the training processes, then leave through
    the ``finally`` blocks, so that :func:`run_panel` records the sitting (stopped runs resume
    from their last chunk)."""
    for proc in list(CHILDREN):
        proc.terminate()
    sys.exit(143)


if __name__ == "__main__":
    signal.signal(signal.SIGTERM, _stop)
    main()
