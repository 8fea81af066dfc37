"""The summaries of an experiment run: per method (``finish_method``: ``metrics.npz``'s final
entries, ``summary.csv``, ``curve.png``, the grid table and solver-health warnings) and per run
(``finish_run``: the run's ``summary.csv`` and ``figure.png`` with several methods, the table of
best grid points).
"""

from __future__ import annotations

import os
import shlex
import sys
from typing import Callable, Optional, Sequence

import numpy as np

# summary entries that are not hyperparameters of the best grid point
NOT_HPARAMS = (
    "method",
    "mean",
    "se",
    "wall_s",
    "health",
    "grid_health",
    "window",
    "nonfinite_seeds",
    "hp_text",
)
# summary.csv columns of the solver-health flags (bchg_jax.core.health.FLAGS): the share of
# capped solves and the counts of skipped updates, sampler-support losses, float32-rounded
# follower logits, non-finite exact returns and stalled learners (0 where the trainer does not
# record the flag)
HEALTH_COLUMNS = [
    "capped_share",
    "skipped_updates",
    "support_lost",
    "logits_rounded",
    "metric_nonfinite",
    "follower_stalled",
]


def _cell(x) -> str:
    """A mean or standard error in ``summary.csv``: 8 significant digits, the file that lasts
    (the printed tables' 4 decimals read an SE of 2.5e-5 as 0.0000 and could not tell grid
    points 5e-5 apart)."""
    return f"{float(x):.8g}"


def finish_method(out, method, grid, data, window, title, ylabel, write) -> dict:
    """One method's summary dict (its best grid point on the mean of the last ``window``
    iterations, mean, se, solver health) from ``data`` (its metrics). ``write``: also complete
    ``out/metrics.npz`` and write ``summary.csv`` and ``curve.png`` and print the grid's table
    and solver-health warnings."""
    from bchg_jax.core.health import FLAGS, health_text, health_warning, solver_health
    from bchg_jax.core.io import save_csv, save_figure, save_npz
    from experiments.plot import grid_label, learning_curve_figure, value_texts
    from experiments.summary import nonfinite_seeds, summarize

    J = data["J"]
    window = int(min(window, J.shape[-1]))  # a run shorter than the window: its whole length
    final, mean, se, best = summarize(J, window)
    diverged = nonfinite_seeds(final)
    keys = list(grid)
    flags = {k: np.asarray(data[k]) for k in FLAGS if k in data}
    health = solver_health(flags)
    per_point = [solver_health({k: v[g] for k, v in flags.items()}) for g in range(len(mean))]
    if write:
        rows = [
            tuple(float(grid[k][g]) for k in keys)
            + (_cell(mean[g]), _cell(se[g]), int(g == best and np.isfinite(mean[g])))
            + (int(diverged[g]),)
            + tuple(_health_cells(per_point[g]))
            for g in range(len(mean))
        ]
        save_csv(
            os.path.join(out, "summary.csv"),
            keys
            + [f"mean_last{window}", "se", "best", "nonfinite_seeds"]
            + HEALTH_COLUMNS * bool(health),
            rows,
        )
        # every grid point, the best first (its label says so)
        order = [best] + [g for g in range(len(mean)) if g != best]
        curves = {
            grid_label(method, grid, g) + (" best" if g == best and len(mean) > 1 else ""): J[g]
            for g in order
        }
        save_figure(
            os.path.join(out, "curve.png"),
            learning_curve_figure(curves, title, ylabel=ylabel, color_by_method=len(mean) == 1),
        )
        # the npz's "final" last: it tells a resume that summary.csv and curve.png are of these
        # iterations (a kill while an extended run's summary was written left the old ones)
        save_npz(
            os.path.join(out, "metrics.npz"),
            {
                **data,
                "final": final,
                "best_index": np.asarray(best),
                "summary_window": np.asarray(window),
                "completed": np.asarray(J.shape[-1]),
            },
        )
        # the same rows in the same order as summary.csv (the grid's order)
        print(f"\n{'  '.join(f'{k:>11}' for k in keys)}  mean(last {window})      se")
        texts = {k: value_texts(grid[k]) for k in keys}
        for g in range(len(mean)):
            mark = "  <- best" if g == best and np.isfinite(mean[g]) else ""
            nonfinite = f"  ({diverged[g]} of {J.shape[1]} seeds not finite)" if diverged[g] else ""
            print(
                "  ".join(f"{texts[k][g]:>11}" for k in keys)
                + f"  {mean[g]:+.4f}  {se[g]:.4f}{mark}{nonfinite}"
            )
        if diverged.any():
            print(
                f"[{method}] WARNING: {int(np.count_nonzero(diverged))} of {len(mean)} grid "
                "points have seeds whose J is not finite (diverged runs); their mean is NaN and "
                + (
                    "no grid point is finite in every seed, so there is no best one"
                    if not np.isfinite(mean[best])
                    else "the best point is chosen among the others"
                ),
                file=sys.stderr,
                flush=True,
            )
        if health:
            print(
                f"[{method}] solver health: {health_text(health)} "
                f"(of {health['run_iterations']} run-iterations)"
            )
            warning = health_warning(health)
            if not warning and health_warning(per_point[best]):  # diluted by the grid
                warning = (
                    f"the best grid point ({grid_label(method, grid, best)}): "
                    f"{health_text(per_point[best])}\n" + health_warning(per_point[best])
                )
            if warning:
                print(
                    f"[{method}] " + warning.replace("\n", f"\n[{method}] "),
                    file=sys.stderr,
                    flush=True,
                )
    return {
        "method": method,
        **{k: float(grid[k][best]) for k in keys},
        "mean": float(mean[best]),
        "se": float(se[best]),
        "window": window,  # the iterations the mean is over
        # the best point's (the row's result; as experiments.plot's table), and the grid's
        "health": per_point[best],
        "grid_health": health,
        "nonfinite_seeds": int(diverged[best]),  # > 0 only when no grid point is finite
        # the best point's values as the grid's table prints them (as many digits as tell the
        # grid's values apart)
        "hp_text": {k: value_texts(grid[k])[best] for k in keys},
    }


def _health_cells(health: dict):
    """The HEALTH_COLUMNS cells of one grid point (none when the trainer records no flags)."""
    if not health:
        return ()
    return (
        f"{health.get('capped_share', 0.0):.4f}",
        int(health.get("update_skipped", 0)),
        int(health.get("support_lost", 0)),
        int(health.get("logits_rounded", 0)),
        int(health.get("metric_nonfinite", 0)),
        int(health.get("follower_stalled", 0)),
    )


def _saved_summaries(run_dir: str, done: set, window: int, iterations=None) -> tuple:
    """(summaries, stopped): the summaries of the method folders in ``run_dir`` that are not in
    ``done`` and hold all ``iterations`` (None: any length), computed from their
    ``metrics.npz`` (nothing is rewritten), and {method: iterations done} of the folders of a
    stopped run, left out (a mean over part of a run is not that method's result).

    A ``metrics.npz`` that cannot be read, or whose ``J`` is not [grid points, seeds,
    iterations], exits 2 with an error naming its folder (``experiments.cli.fail``)."""
    from experiments.cli import fail

    out, stopped = [], {}
    for name in sorted(os.listdir(run_dir)):
        path = os.path.join(run_dir, name, "metrics.npz")
        if name in done or not os.path.isfile(path):
            continue
        folder = os.path.join(run_dir, name)
        try:
            with np.load(path) as f:
                data = {k: f[k] for k in f.files}
        except Exception as err:  # noqa: BLE001 - zip, zlib, pickle and OS errors alike
            fail(
                f"{path} cannot be read ({type(err).__name__}: {err}): the method folder "
                f"{folder} of an earlier command was damaged; delete it to summarise the run "
                f"without {name}, or to train it again"
            )
        if "J" in data and np.ndim(data["J"]) != 3:
            fail(
                f"{path} holds J of shape {np.shape(data['J'])}, not [grid points, seeds, "
                f"iterations]: the method folder {folder} was damaged; delete it to summarise the "
                f"run without {name}, or to train it again"
            )
        grid = {k[5:]: v for k, v in data.items() if k.startswith("grid_")}
        if "J" in data and grid and iterations is not None and data["J"].shape[2] < iterations:
            stopped[name] = int(data["J"].shape[2])
        elif "J" in data and grid:
            out.append(
                finish_method(
                    os.path.join(run_dir, name), name, grid, data, window, "", "", write=False
                )
            )
    return out, stopped


def finish_run(
    run_dir: str,
    summaries: Sequence[dict],
    window: int,
    extra_figures: Optional[Callable[[str], None]] = None,
    iterations: Optional[int] = None,
    experiment: str = "",
    shown_dir: Optional[str] = None,
) -> None:
    """The run's summary (``shown_dir``: the folder its messages name, ``run_dir`` by default):
    with several methods (``summaries`` and the complete method folders an
    earlier command left in ``run_dir``; one stopped short of ``iterations`` is left out and
    named, with the command that finishes it) its ``summary.csv`` and ``figure.png``;
    ``extra_figures(run_dir)``; the printed table of best grid points and a warning naming the
    methods with poor solver health. An earlier method folder whose ``metrics.npz`` cannot be
    read exits 2 naming it (:func:`_saved_summaries`)."""
    from bchg_jax.core.health import WARN_SHARE, health_text, health_warning
    from bchg_jax.core.io import save_csv, save_figure
    from experiments.plot import METHOD_ORDER, panel_figure

    # the run's other method folders (trained by an earlier command into the same --out)
    saved, stopped = _saved_summaries(run_dir, {s["method"] for s in summaries}, window, iterations)
    summaries = list(summaries) + saved
    rank = {m: i for i, m in enumerate(METHOD_ORDER)}
    summaries.sort(key=lambda s: rank.get(s["method"], len(rank)))
    if len(summaries) > 1:
        # every method's hyperparameters (a method without a SARSA critic has no sarsa_alpha:
        # its cell is empty)
        keys = list(dict.fromkeys(k for s in summaries for k in s if k not in NOT_HPARAMS))
        with_health = any(s.get("health") for s in summaries)
        windows = {s["window"] for s in summaries}  # one unless the methods ran unequal lengths
        mean_col = f"mean_last{windows.pop()}" if len(windows) == 1 else "mean_last"
        save_csv(
            os.path.join(run_dir, "summary.csv"),
            ["method"] + keys + [mean_col, "se"] + HEALTH_COLUMNS * with_health,
            [
                (s["method"],)
                + tuple(s.get(k, "") for k in keys)
                + (_cell(s["mean"]), _cell(s["se"]))
                + (
                    tuple(_health_cells(s.get("health") or {"capped_share": 0.0}))
                    if with_health
                    else ()
                )
                for s in summaries
            ],
        )
        save_figure(os.path.join(run_dir, "figure.png"), panel_figure([run_dir]))
    if extra_figures is not None:
        extra_figures(run_dir)
    # the iterations each mean is over (the summary window, or the whole of a shorter run)
    shown = " / ".join(str(w) for w in sorted({s.get("window", window) for s in summaries}))
    print(
        f"\n{'method':>12}  best grid point                 mean(last {shown})      se"
        "  solver health"
    )
    for s in summaries:
        text = s.get("hp_text", {})
        hp = " ".join(f"{k}={text.get(k, f'{v:g}')}" for k, v in s.items() if k not in NOT_HPARAMS)
        if s.get("nonfinite_seeds"):
            hp = "(no grid point finite in every seed)"
        print(
            f"{s['method']:>12}  {hp:30s}  {s['mean']:+.4f}  {s['se']:.4f}  "
            f"{health_text(s.get('health') or {})}"
        )
    unhealthy = [
        s["method"]
        for s in summaries
        if health_warning(s.get("health") or {}) or health_warning(s.get("grid_health") or {})
    ]
    if unhealthy:
        print(
            f"WARNING: a solver-health flag (capped or stalled solves, skipped updates, mass "
            f"lost by the successor table, a non-finite J, float32-rounded logits) is set in "
            f"more than {100 * WARN_SHARE:g}% of the run-iterations of: {', '.join(unhealthy)} "
            "(which one: the warnings above)",
            file=sys.stderr,
            flush=True,
        )
    if stopped:
        done = ", ".join(f"{m} ({n} / {iterations} iterations)" for m, n in stopped.items())
        where = shown_dir or run_dir
        print(
            f"NOT in the summary: {done}, stopped before the end; finish with\n"
            f"  python -m experiments.{experiment or '<experiment>'} --resume {shlex.quote(where)}",
            file=sys.stderr,
            flush=True,
        )
    print(f"\nresults in {shown_dir or run_dir}")
