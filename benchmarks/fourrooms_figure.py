"""The whole Four-Rooms figure: every (batch, beta) panel of the paper, all methods.

    python -m benchmarks.fourrooms_figure run [--out results/fourrooms_figure]
        [--compact benchmarks/results/fourrooms_figure] [--panels 200:3e-3 400:1e-3 ...]
    python -m benchmarks.fourrooms_figure figure [--compact benchmarks/results/fourrooms_figure]

``run`` trains the panels one after the other, each as
``python -m experiments.fourrooms --method <all six> ,exact --grid paper --batch B --beta BETA
--seeds 10 --iterations 10000 --exact-out --out OUT/batchB_betaBETA`` (every method's paper grid
x 10 seeds x 10,000 iterations, ``exact`` as the reference line). A panel folder that already
holds a ``config.json`` is continued with ``--resume`` (complete methods are skipped; a
``--seeds`` or ``--iterations`` given again is checked against it: other seeds are refused, more
iterations extend it), so the command can be stopped at any time and given again in a later
sitting; a panel whose compact
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
CPU tables (the compact copies themselves are not kept in git), each panel from the newest table
that holds it (:data:`CPU_TABLES`: the rows re-measured on 2026-11-28, then the whole figure of
2026-11-26 / 27), or ``--reference`` a ``table.md`` or a folder of another run's compact copies.
Per panel and method it prints both means +- SE, their difference in units of the combined
standard error and the wall times, and exits with status 3 if a difference exceeds both
``--max-se`` (default 2) combined SEs and ``--abs-tol`` (default 1e-3, the table's rounding:
methods whose 10 seeds end at the same J have an SE near 0). Runs of another length than their
reference (the committed tables: 10,000 iterations) are an error (status 1, after the
comparison is printed): their means are over other iterations; a ``table.md`` given as
``--reference`` states a run's length only where it is short of its plan (``; 500 it``), and a
length it does not state is named on stderr as not checked.

``--method-workers K`` trains each panel's methods as K concurrent processes, each method in its
own run folder under ``OUT/batchB_betaX/by_method/`` (continued the same way when given again);
``wall.json`` then also records the panel's elapsed wall-clock time beside the methods' summed
seconds. ``--chunk N`` sets the iterations per jitted chunk (each chunk ends with a checkpoint).

On a GPU one panel (every method + exact, 10 seeds x 10,000 iterations) is
``python -m benchmarks.fourrooms_figure run --panels 100:1e-3 --out OUT --compact OUT/compact
--chunk 1000`` (the methods one after another: side by side they take turns on the card) then
``python -m benchmarks.fourrooms_figure compare --compact OUT/compact``;
``bash benchmarks/gpu_session.sh --panel-only`` runs both.
"""

from __future__ import annotations

import argparse
import json
import os
import queue
import re
import signal
import subprocess
import sys
import threading

from benchmarks.fourrooms_panel import (
    BATCHES,
    BETAS,
    ITERATIONS,
    METHODS,
    SEEDS,
    panel_name,
    parse_panel,
    run_panel,
    stop_on_sigterm,
)

# the committed CPU tables, newest first: compare's default reference takes each panel from the
# first one that holds it
CPU_TABLES = (
    "benchmarks/results/fourrooms_figure_remeasured/table.md",
    "benchmarks/results/fourrooms_figure_remeasured/table_batch400.md",
    "benchmarks/results/fourrooms_figure/table.md",
)


def read_wall(path: str) -> dict:
    """A panel's ``wall.json``.

    Raises:
      experiments.plot.DamagedResult: the file is not a JSON object with a ``total``.
    """
    from experiments.plot import DamagedResult

    try:
        with open(path) as f:
            w = json.load(f)
        float(w["total"])
    except (OSError, ValueError, TypeError, KeyError) as err:
        raise DamagedResult(f"{path} cannot be read ({type(err).__name__}: {err})") from None
    return w


def panels_found(compact: str):
    return [
        (b, e)
        for b in BATCHES
        for e in BETAS
        if os.path.exists(os.path.join(compact, panel_name(b, e), "config.json"))
    ]


def write_figure(compact: str) -> None:
    from bchg_jax.core.io import atomic_write_bytes, save_figure
    from experiments.plot import final_table, load_run, panel_figure

    found = panels_found(compact)
    if not found:
        raise SystemExit(f"error: no panel folders under {compact}")
    dirs = [os.path.join(compact, panel_name(b, e)) for b, e in found]
    save_figure(os.path.join(compact, "figure.png"), panel_figure(dirs))
    # the windows the cells are means over (each run's summary window, at most its length)
    windows = sorted(
        {min(s["window"], s["iterations"]) for d in dirs for _, s in load_run(d).values()}
    )
    parts = [
        f"Mean +- SE over the seeds of the last {' / '.join(map(str, windows))} iterations, "
        "each method at its best grid point (chosen on that mean).",
        "",
    ]
    total = 0.0
    for b in BATCHES:
        row = [os.path.join(compact, panel_name(b, e)) for e in BETAS if (b, e) in found]
        if not row:
            continue
        table = final_table(row, footnote=False)  # the window is named once, above
        if len(row) == 1:  # one run's header is its settings: key it by its panel, as read_table
            table = table.replace("| method | ", f"| method | {os.path.basename(row[0])}: ", 1)
        parts += [f"### batch {b}", "", table]
        walls = []
        for d in row:
            if not os.path.exists(os.path.join(d, "wall.json")):  # exported, not finished
                walls.append(f"{os.path.basename(d)} unknown")
                continue
            w = read_wall(os.path.join(d, "wall.json"))
            total += w["total"]
            walls.append(
                f"{os.path.basename(d)} {w['total']:.0f} s"
                + (f" ({w['note']})" if w.get("note") else "")
            )
        parts += ["", "wall time (all methods, compile included): " + ", ".join(walls), ""]
    parts.append(
        f"Wall time summed over the {len(found)} panels: {total:.0f} s ({total / 3600:.2f} h; "
        "panels run side by side count once each)."
    )
    if any("**" in p for p in parts):  # final_table's own footnote, which says so, is off
        from experiments.plot import BOLD_NOTE

        parts[0] += f" {BOLD_NOTE}."
    text = "\n".join(parts) + "\n"
    atomic_write_bytes(os.path.join(compact, "table.md"), text.encode())
    print(text)


def read_table(path: str) -> dict:
    """{panel name: {method: {"mean", "se"}}} from a ``table.md`` that :func:`write_figure`
    wrote (cells ``0.662 +- 0.005 (lr 0.1, a 0.5)``, columns ``batchB_betaX: ...``); a cell of
    a run short of its planned iterations (``(lr 0.1; 500 it)``) also gives ``"iterations"``."""
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
                    mean, sep, rest = cell.partition(" +- ")
                    if not sep:  # "-": the method is not in that panel (a row of several)
                        continue
                    entry = {"mean": float(mean), "se": float(rest.split()[0])}
                    short = re.search(r"; (\d+) it\)", rest)
                    if short:
                        entry["iterations"] = int(short.group(1))
                    out.setdefault(panel, {})[by_label[cells[0]]] = entry
    return out


def compare(
    compact: str,
    reference: str,
    max_se: float,
    abs_tol: float = 1e-3,
    reference_iterations: int | None = None,
) -> bool:
    """Prints, per panel found in both and per method, the two means +- SE and their difference
    over the combined SE; returns True when every difference is within ``max_se`` combined SEs
    or within ``abs_tol``. ``reference``: a ``table.md``, a folder of compact copies, or a
    sequence of ``table.md`` files (each panel from the first that holds it). It also
    prints how often at least one of the comparisons that the SE decides would miss by chance
    (1 - 0.954^k at 2 SE: 17% for four), to read a single miss by.

    The runs compared must be of the same length: ``reference_iterations`` is the length of a
    reference run whose table cell does not state it (:func:`read_table`: only a run short of
    its plan does; None: unknown, and said on stderr). Raises SystemExit (after printing the
    comparison) when a run's length differs from its reference's."""
    import math

    from experiments.plot import load_run

    if not isinstance(reference, str) or os.path.isfile(reference):
        table = {}
        for path in [reference] if isinstance(reference, str) else reversed(reference):
            table.update(read_table(path))  # the earlier tables win
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
    ok, spread, compared, lengths, unknown = True, 0, 0, [], []
    print("| panel | method | this run | reference | difference / SE | within |")
    print("|---|---|---:|---:|---:|---|")
    for b, e in found:
        mine = load_run(os.path.join(compact, panel_name(b, e)))
        ref = ref_of[(b, e)]
        unmatched = [
            f"{m} ({'not in this run' if m in ref else 'no reference'})"
            for m in METHODS
            if (m in mine) != (m in ref)
        ]
        for m in METHODS:
            if m not in mine or m not in ref:
                continue
            a, r = mine[m][1], ref[m]
            length = r.get("iterations", reference_iterations)
            if length is None:
                unknown.append(f"{panel_name(b, e)} {m}")
            elif length != a["iterations"]:  # means over other iterations of the runs
                lengths.append(f"{panel_name(b, e)} {m} ({a['iterations']} against {length})")
            se = math.hypot(a["se"], r["se"])
            spread += se * max_se > abs_tol  # the SE test, not the rounding, decides
            diff = abs(a["mean"] - r["mean"])
            z = diff / se if se > 0 else (0.0 if diff == 0 else math.inf)
            within = (z <= max_se or diff <= abs_tol) and length in (None, a["iterations"])
            ok &= within
            compared += 1
            print(
                f"| {panel_name(b, e)} | {m} | {a['mean']:.4f} +- {a['se']:.4f} | "
                f"{r['mean']:.4f} +- {r['se']:.4f} | {z:.2f} | {'yes' if within else 'NO'} |"
            )
        if unmatched:  # a partial panel is compared on what it holds, and says so
            print(f"not compared in {panel_name(b, e)}: {', '.join(unmatched)}")
        wall = os.path.join(compact, panel_name(b, e), "wall.json")
        if os.path.exists(wall):
            w = read_wall(wall)
            print(
                f"wall time {panel_name(b, e)} (this run): {w['total']:.0f} s summed over the "
                "methods, compile included"
                + (
                    f"; {w['elapsed']:.0f} s elapsed ({w['method_workers']} method worker(s))"
                    if "elapsed" in w
                    else ""
                )
            )
    if not compared:  # nothing agreed with anything: not a pass
        raise SystemExit(
            f"error: no method is in both {compact} and {reference} (panels "
            f"{', '.join(panel_name(*pe) for pe in found)}); nothing was compared"
        )
    if unknown:
        print(
            "WARNING: the reference does not state the iterations of "
            f"{', '.join(unknown)}: not checked that they are as long as this run's",
            file=sys.stderr,
            flush=True,
        )
    if lengths:  # not a comparison of the same runs: an error, not a miss
        raise SystemExit(
            "error: runs of different length were compared (iterations of this run against "
            f"the reference): {', '.join(lengths)}; compare runs of the same length"
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
        help="compact copies, figure.png and table.md (default: the committed figure's "
        "folder: figure regenerates its figure.png and table.md in place)",
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
        "panel). For a CPU with cores to spare, where the compiles overlap; not for one GPU: "
        "processes there take turns on the card, and each Four-Rooms iteration waits on the "
        "host at every solver sweep: seven side by side ran bchg over 20x slower than alone "
        "(H200, 2026-12-04; docs/performance.md)",
    )
    p.add_argument(
        "--chunk",
        type=int,
        default=None,
        help="run: iterations per jitted chunk, passed to experiments.fourrooms (default: its "
        "500). Each chunk ends with a checkpoint and a rewrite of metrics.npz; on a GPU, where "
        "500 iterations take about a second, 1000 or more keeps those writes from dominating",
    )
    started = (
        "; a started panel goes on as it was started, and a value given is checked against it "
        "by experiments.fourrooms --resume"
    )
    p.add_argument(
        "--parallel-steps",
        action="store_true",
        help="run: train with experiments.fourrooms --parallel-steps (the rollout and the SARSA "
        "pass in parallel form: the same batches, the critic up to float rounding; fewer, wider "
        "kernels on a GPU, docs/performance.md); a started panel must have been started so "
        "(experiments.fourrooms --resume refuses the other form)",
    )
    p.add_argument(
        "--seeds",
        type=int,
        default=None,
        help=f"run: seeds of a new panel (default {SEEDS}){started} (other seeds are refused)",
    )
    p.add_argument(
        "--iterations",
        type=int,
        default=None,
        help=f"run: iterations of a new panel (default {ITERATIONS}){started} (more extend it, "
        "fewer are refused)",
    )
    p.add_argument(
        "--reference",
        default=None,
        help="compare: a table.md, or a folder of compact copies, to compare with (default: "
        f"the committed CPU tables, each panel from the newest: {', '.join(CPU_TABLES)})",
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
    from experiments.plot import DamagedResult

    try:  # a damaged compact copy: one line that names the file, not a traceback
        if a.action == "figure":
            write_figure(a.compact)
            return
        if a.action == "compare":
            reference = CPU_TABLES if a.reference is None else a.reference
            # the committed tables are of runs of ITERATIONS (their short cells would say so)
            length = ITERATIONS if a.reference is None else None
            if not compare(a.compact, reference, a.max_se, a.abs_tol, length):
                raise SystemExit(3)
            return
    except DamagedResult as err:
        raise SystemExit(f"error: {err}") from None
    if os.path.realpath(a.compact) == os.path.realpath(a.out):
        # a panel's compact copy would be its own run folder: refused after hours of training
        raise SystemExit(
            f"error: --compact {a.compact} is --out itself; the compact copies need a folder "
            "of their own (e.g. OUT/compact)"
        )
    panels = (
        [parse_panel(s) for s in a.panels] if a.panels else [(b, e) for b in BATCHES for e in BETAS]
    )
    methods = a.methods.split(",")
    unknown = [m for m in methods if m not in METHODS]
    if unknown:
        raise SystemExit(f"error: --methods: unknown {unknown}; choose from {', '.join(METHODS)}")
    for flag in ("workers", "method_workers", "chunk", "seeds", "iterations"):
        if getattr(a, flag) is not None and getattr(a, flag) < 1:
            raise SystemExit(f"error: --{flag.replace('_', '-')} must be >= 1")
    if a.workers > 1 and a.method_workers > 1:
        raise SystemExit(
            "error: --workers (panels at once) and --method-workers exclude each other"
        )
    more = dict(chunk=a.chunk, method_workers=a.method_workers, parallel_steps=a.parallel_steps)
    if a.workers == 1:
        for batch, beta in panels:
            try:
                run_panel(a.out, a.compact, batch, beta, methods, a.seeds, a.iterations, **more)
            except subprocess.CalledProcessError as e:  # its error is in the panel's log
                log = os.path.join(a.out, panel_name(batch, beta), "log.txt")
                raise SystemExit(f"error: {panel_name(batch, beta)}: {e}; see {log}") from None
            except ValueError as e:  # the compact copy refused (its run folder is kept)
                raise SystemExit(
                    f"error: {panel_name(batch, beta)}: its compact copy was refused: {e}"
                ) from None
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
                        parallel_steps=a.parallel_steps,
                    )
                except subprocess.CalledProcessError as e:
                    log = os.path.join(a.out, panel_name(batch, beta), "log.txt")
                    failed.append(f"{panel_name(batch, beta)}: {e}; see {log}")
                except ValueError as e:
                    failed.append(f"{panel_name(batch, beta)}: its compact copy was refused: {e}")

        threads = [
            threading.Thread(target=worker, args=(cores[i % len(cores)],)) for i in range(a.workers)
        ]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        if failed:
            raise SystemExit("error: " + "; ".join(failed))
    try:
        write_figure(a.compact)
    except DamagedResult as err:
        raise SystemExit(f"error: {err}") from None


if __name__ == "__main__":
    signal.signal(signal.SIGTERM, stop_on_sigterm)
    try:
        main()
    except KeyboardInterrupt:  # the training processes got the Ctrl-C too and saved their chunk
        print(
            "\ninterrupted; nothing saved is lost: give the same command again to continue",
            file=sys.stderr,
        )
        raise SystemExit(130) from None
