"""Figures and tables from saved results: ``python -m experiments.plot RUN_DIR [RUN_DIR ...]``.

A run folder holds one sub-folder per method (``<method>/metrics.npz``); each method is drawn
with its best grid point (best mean over seeds of the run's summary window, e.g. the last 1000
iterations), mean +- standard error over seeds of the trailing rolling mean (window: 1/20 of the
longest run, at most 100; no band for one seed). Several run folders (e.g. three values of
beta) become the panels of one figure, each titled by its folder name and the settings
(``config.json`` ``args``) that differ between the given runs; the settings they share go in
the figure's title. Runs of different experiments may be combined: each panel
then gets its own experiment, key settings and y-axis label. A table of final values is printed
(markdown). The figure goes to ``<run>/figure.png`` for one run folder (the figure the run
wrote itself) and to ``comparison.png`` beside the first of several (never over a run's own
figure); ``--out`` chooses another path.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import textwrap
from typing import Dict, Sequence

import numpy as np

from bchg_jax.core.health import FLAGS, WARN_SHARE, health_text, solver_health, suspect
from bchg_jax.problems.thermal import COMPONENT_WEIGHTS as THERMAL_WEIGHTS
from experiments.cli import NOT_SETTINGS as RUN_FLAGS
from experiments.cli import fail
from experiments.summary import nonfinite_seeds, summarize

METHOD_LABELS = {
    "bchg": "BC-HG",
    "hpgd_oracle": "HPGD (oracle)",
    "hpgd_mc": "HPGD (MC)",
    "hpgd_sa": "HPGD (SA)",
    "hpgd_td": "HPGD (TD)",
    "sobirl": "SoBiRL",
    "naive": "Naive-PGD",
    "bchg_off": "BC-HG (off-policy)",
    "naive_on": "Naive-PGD (on-policy)",
    "naive_off": "Naive-PGD (off-policy)",
    "biac_on": "Bi-AC (on-policy)",
    "biac_off": "Bi-AC (off-policy)",
    "bchg_det": "BC-HG (deterministic leader)",
    "naive_det": "Naive-PGD (deterministic leader)",
    "exact": "exact hypergradient",
    "exact_direct": "exact hypergradient, direct part",
}
METHOD_ORDER = tuple(METHOD_LABELS)
# what the curve metric J is, per experiment (docs/experiments.md, "Metric")
YLABEL = "upper-level objective $V_L(S)$\n(exact, discounted $\\gamma=0.99$)"
YLABELS = {
    "fourrooms": YLABEL,
    "thermal": "leader objective $J_L$\n(exact, discounted $\\gamma_L=0.9$, 100 steps)",
    "toy_game": "leader return\n(exact, undiscounted, 150 steps)",
    "lqr_game": "leader return\n(exact, undiscounted, 100 steps)",
}
GENERIC_YLABEL = "leader objective J"
EXPERIMENT_NAMES = {
    "fourrooms": "Four-Rooms",
    "thermal": "building thermal control",
    "toy_game": "toy game",
    "lqr_game": "bi-level LQR game",
}
# the settings a figure names for a run when nothing else distinguishes it
KEY_SETTINGS = {
    "fourrooms": ("beta", "batch", "slip_model"),
    "thermal": ("critic", "beta"),
    "toy_game": ("R", "beta", "actor"),
    "lqr_game": ("beta", "estimator"),
}
# config.json "args" that are bookkeeping, not settings of the run
NOT_SETTINGS = frozenset(RUN_FLAGS) | {"method", "smoke"}
SETTING_NAMES = {"beta": "β"}

# thermal control: the logged components and how J is made of them
# (bchg_jax.problems.thermal.COMPONENT_WEIGHTS and bchg_jax.lq.exact.components: "stability" is
# logged as the reward term Stability(s) <= 0, the other three as positive, unweighted costs; each
# is a discounted (gamma_L = 0.9) sum over the 100-step horizon; tests check this identity)
THERMAL_GAMMA, THERMAL_HORIZON = 0.9, 100  # thermal()'s gamma_L and horizon (tested equal)
THERMAL_IDENTITY = (
    f"$J_L$ = stability − {THERMAL_WEIGHTS['hvac_energy']:g} · HVAC energy − "
    f"{THERMAL_WEIGHTS['insulation']:g} · (insulation + airflow); each term is an exact discounted "
    f"sum ($\\gamma_L$ = {THERMAL_GAMMA:g}) over {THERMAL_HORIZON} steps; stability is a reward "
    "(≤ 0), the other three are costs (≥ 0)"
)
COMPONENT_TITLES = {
    "J": "leader objective $J_L$ (higher is better)",
    "stability": "stability (reward ≤ 0, higher is better)",
    "hvac_energy": "HVAC energy cost (lower is better)",
    "insulation": "insulation cost (lower is better)",
    "airflow": "airflow cost (lower is better)",
}
COMPONENT_YLABELS = {
    "J": "$J_L$",
    "stability": "$\\mathbb{E}\\,\\Sigma_t\\,\\gamma_L^t\\,\\mathrm{Stability}(s_t)$",
    "hvac_energy": "$\\mathbb{E}\\,\\Sigma_t\\,\\gamma_L^t\\,\\|b_t\\|^2$",
    "insulation": "$\\Sigma_t\\,\\gamma_L^t\\,\\|\\alpha\\|^2$",
    "airflow": "$\\Sigma_t\\,\\gamma_L^t\\,\\|\\beta_{\\mathrm{air}}\\|^2$",
}


class DamagedResult(ValueError):
    """A run folder's ``config.json`` or ``metrics.npz`` that cannot be read (cut short by a
    kill, edited by hand, another program's file); the message names the file."""


def _summary_window(path: str, d: dict) -> int:
    """The ``summary_window`` a metrics.npz records (1000 where it records none), >= 1."""
    if "summary_window" not in d:
        return 1000
    window = np.asarray(d["summary_window"])
    if window.ndim or not np.issubdtype(window.dtype, np.number) or not window >= 1:
        raise DamagedResult(f"{path} holds summary_window {window!r}, not a count >= 1")
    return int(window)


def _config(run_dir: str) -> dict:
    """The run folder's ``config.json`` ({} without one).

    Raises:
      DamagedResult: the file is not a JSON object.
    """
    path = os.path.join(run_dir, "config.json")
    if not os.path.exists(path):
        return {}
    try:
        with open(path) as f:
            cfg = json.load(f)
    except (OSError, ValueError) as err:
        raise DamagedResult(f"{path} cannot be read ({type(err).__name__}: {err})") from None
    if not isinstance(cfg, dict):
        raise DamagedResult(f"{path} holds a {type(cfg).__name__}, not a run's settings")
    return cfg


def _read_metrics(path: str, names) -> dict:
    """{name: array} of ``names`` and of the ``grid_*`` entries (those the file holds; ``J`` is
    required, [G, N, iterations]) from a method's ``metrics.npz``; only these are read (a full
    grid's file can be large).

    Raises:
      DamagedResult: the file cannot be read or has no such ``J``.
    """
    try:
        with np.load(path) as d:
            grid = [k for k in d.files if k.startswith("grid_")]
            out = {k: np.asarray(d[k]) for k in dict.fromkeys([*names, *grid]) if k in d.files}
    except Exception as err:  # noqa: BLE001 - zip, zlib, pickle and OS errors of a damaged file
        raise DamagedResult(f"{path} cannot be read ({type(err).__name__}: {err})") from None
    if np.ndim(out.get("J")) != 3:
        raise DamagedResult(
            f"{path} holds no J of shape [grid points, seeds, iterations]"
            + (f" (J: {np.shape(out['J'])})" if "J" in out else "")
        )
    return out


def rolling_mean(x: np.ndarray, window: int) -> np.ndarray:
    """Trailing rolling mean along the last axis (shorter windows at the start). A window that
    holds a non-finite value is NaN, and only that window: a cumulative sum over it carried one
    NaN iteration (``metric_nonfinite``) to the end of the curve."""
    if window <= 1:
        return x
    finite = np.isfinite(x)

    def trailing_sum(v):
        c = np.cumsum(v, axis=-1, dtype=np.float64)
        out = c.copy()
        out[..., window:] -= c[..., :-window]
        return out

    n = np.minimum(np.arange(1, x.shape[-1] + 1), window)
    out = trailing_sum(np.where(finite, x, 0.0)) / n
    return np.where(trailing_sum(~finite) > 0, np.nan, out)


def mean_se(curves: np.ndarray):
    """Mean and standard error over axis 0 (seeds); the error is NaN (no band) for one seed, as
    in the summaries (0 would draw an exact curve)."""
    n = curves.shape[0]
    se = curves.std(axis=0, ddof=1) / np.sqrt(n) if n > 1 else np.full(curves.shape[1:], np.nan)
    return curves.mean(axis=0), se


def smoothing_window(lengths, cap: int = 100) -> int:
    """The figures' trailing-mean window for runs of ``lengths`` iterations: 1/20 of the longest
    run, at least 1 and at most ``cap`` (100: the paper's figures, 10,000-iteration runs). A
    fixed window on a short run draws a kink where the running mean of the first iterations
    turns into the trailing one (at iteration 100 of a 200-iteration run); one rule for every
    figure also keeps their last points, hence the final J they show, the same."""
    longest = max([int(n) for n in lengths] or [1])
    return int(max(1, min(cap, longest // 20)))


def _plt():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def method_colors() -> dict:
    """A distinct, fixed colour per method label (tab10, then the dark half of tab20b; the exact
    hypergradient reference in black)."""
    plt = _plt()
    cmap10, cmap20 = plt.get_cmap("tab10"), plt.get_cmap("tab20b")
    colors = {
        METHOD_LABELS[m]: (cmap10(i) if i < 10 else cmap20(4 * (i - 10) % 20))
        for i, m in enumerate(METHOD_ORDER)
    }
    colors[METHOD_LABELS["exact"]] = "k"
    colors[METHOD_LABELS["exact_direct"]] = "0.55"
    return colors


def method_linestyles() -> dict:
    """Line style per method label: off-policy variants dashed, deterministic-leader variants
    dotted, the exact hypergradient (and its direct part) dash-dotted, the rest solid."""

    def style(m):
        return (
            "--"
            if m.endswith("_off")
            else ":"
            if m.endswith("_det")
            else "-."
            if m.startswith("exact")
            else "-"
        )

    return {METHOD_LABELS[m]: style(m) for m in METHOD_ORDER}


def value_texts(values) -> list:
    """The texts of one grid axis's values: ``:g`` (6 significant digits), or the fewest
    digits beyond that at which values that differ print differently (``0.1`` and
    ``0.10000001``, distinct in float32, both read ``0.1`` under ``:g``: their table rows looked
    the same and their curves shared one label, so ``curve.png`` drew one of them)."""
    values = [float(v) for v in np.atleast_1d(values)]
    for digits in range(6, 18):
        texts = [f"{v:.{digits}g}" for v in values]
        if len(set(texts)) == len(set(values)):
            return texts
    return [repr(v) for v in values]


def grid_label(method: str, grid: Dict[str, np.ndarray], g: int) -> str:
    """The curve label of grid point ``g``: the method and the hyperparameters that vary over
    ``grid`` (``"bchg lr=0.1 sarsa_alpha=0.5"``; :func:`pretty_label` reads it), each value
    in as many digits as tell the axis's values apart (:func:`value_texts`)."""
    varying = [k for k, v in grid.items() if len(set(np.atleast_1d(v).tolist())) > 1]
    return method + "".join(f" {k}={value_texts(grid[k])[g]}" for k in varying)


def pretty_label(label: str) -> str:
    """``"bchg lr=0.1 sarsa_alpha=0.5"`` (:func:`grid_label`) ->
    ``"BC-HG (lr=0.1, sarsa_alpha=0.5)"``; other labels are returned unchanged."""
    method, *hp = label.split()
    if method not in METHOD_LABELS:
        return label
    return METHOD_LABELS[method] + (f" ({', '.join(hp)})" if hp else "")


def band_caption(seeds, window: int, iterations=None) -> str:
    """What a curve and its band are: ``seeds`` / ``iterations``: the seed counts / curve
    lengths drawn (several if they differ)."""
    seeds = sorted({int(s) for s in np.atleast_1d(seeds)})
    n = (
        f"{seeds[0]} seed" + ("s" if seeds[0] != 1 else "")
        if len(seeds) == 1
        else f"{seeds[0]}-{seeds[-1]} seeds"
    )
    longest = None if iterations is None else max(np.atleast_1d(iterations))
    shortest = None if iterations is None else min(np.atleast_1d(iterations))
    smooth = (
        "no smoothing"
        if window <= 1
        else f"running mean since iteration 1 (window {window} ≥ run length)"
        if longest is not None and longest <= window
        else f"trailing mean over {window} iterations"
        + (
            f" (a running mean since iteration 1 for the runs of at most {window})"
            if shortest is not None and shortest <= window
            else ""
        )
    )
    band = (
        "no band (one seed)"
        if seeds == [1]
        else "band: ± 1 standard error" + (" (none for one seed)" if 1 in seeds else "")
    )
    return f"line: mean over {n}, {band};\nsmoothing: {smooth}"


def _integer_x(ax):
    from matplotlib.ticker import MaxNLocator

    ax.xaxis.set_major_locator(MaxNLocator(integer=True, nbins=6))


def draw_curves(
    ax, curves: dict, window: int = 100, colors: dict | None = None, styles: dict | None = None
):
    """Draws ``curves`` (label -> [seeds, iterations]) as mean +- SE over seeds of the trailing
    rolling mean (``window``) on ``ax``."""
    for label, c in curves.items():
        m, se = mean_se(rolling_mean(np.asarray(c, np.float64), window))
        x = np.arange(1, m.shape[0] + 1)
        color = None if colors is None else colors.get(label)
        ls = "-" if styles is None else styles.get(label, "-")
        # markers where the curve has too few points to be seen as a line (one point: none)
        marker = "o" if m.shape[0] < 10 else None
        (line,) = ax.plot(x, m, label=label, lw=1.5, color=color, ls=ls, marker=marker, ms=3)
        ax.fill_between(x, m - se, m + se, alpha=0.2, color=line.get_color(), lw=0)
    ax.set_xlabel("outer iteration")
    _integer_x(ax)
    ax.grid(alpha=0.3)


def _legend_below(fig, ax_or_axes, caption: str, ncol: int | None = None):
    """One legend under the axes (never over the curves), titled with ``caption``."""
    axes = list(np.atleast_1d(ax_or_axes).ravel())
    seen = {}
    for ax in axes:
        for h, lab in zip(*ax.get_legend_handles_labels(), strict=False):
            seen.setdefault(lab, h)
    if not seen:
        return None
    labels = [lab for lab in [METHOD_LABELS[m] for m in METHOD_ORDER] if lab in seen] + [
        lab for lab in seen if lab not in METHOD_LABELS.values()
    ]
    width = fig.get_figwidth()
    per_row = max(1, int(width / 2.2))  # legend entries that fit a row
    ncol = ncol or (
        len(labels)
        if len(labels) <= per_row
        else math.ceil(len(labels) / math.ceil(len(labels) / per_row))
    )
    chars = max(40, int(width * 17))  # caption characters per line at fontsize 8
    caption = "\n".join(textwrap.fill(line, chars) for line in caption.split("\n"))
    return fig.legend(
        [seen[lab] for lab in labels],
        labels,
        loc="upper center",
        bbox_to_anchor=(0.5, 0.0),
        ncol=ncol,
        fontsize=8,
        title=caption,
        title_fontsize=8,
        frameon=False,
    )


def distinct_styles(labels: list) -> tuple:
    """({label: colour}, {label: line style}), no two labels alike: the ten tab10 colours with
    a solid line, then again dashed, dotted and dash-dotted (up to 40 curves: a 24-point grid
    drew points 1 and 11 identically before); beyond 40, colours spread over viridis."""
    plt = _plt()
    n = len(labels)
    if n <= 40:
        tab = plt.get_cmap("tab10").colors
        cols = [tab[i % 10] for i in range(n)]
        lss = [("-", "--", ":", "-.")[i // 10] for i in range(n)]
    else:
        cols = [plt.get_cmap("viridis")(i / (n - 1)) for i in range(n)]
        lss = ["-"] * n
    return dict(zip(labels, cols, strict=True)), dict(zip(labels, lss, strict=True))


def learning_curve_figure(
    curves: dict,
    title: str = "",
    window: int | None = None,
    ylabel: str = YLABEL,
    color_by_method: bool = True,
):
    """``curves``: label -> [seeds, iterations] array (a label starting with a method name, as
    :func:`grid_label` writes it, is shown as the method's name and its grid
    point). Returns a matplotlib figure; the legend, under the axes, says what the line and band
    are (mean +- SE over the seeds) and the smoothing window (None: :func:`smoothing_window`).
    ``color_by_method=False``: one colour per curve (the grid points of one method)."""
    plt = _plt()
    if window is None:
        window = smoothing_window([np.shape(c)[-1] for c in curves.values()])
    fig, ax = plt.subplots(figsize=(5.5, 3.8))
    pretty = {pretty_label(k): v for k, v in curves.items()}
    by_method, by_style = method_colors(), method_linestyles()
    method = {
        pretty_label(k): METHOD_LABELS.get(k.split()[0] if k.split() else k, k) for k in curves
    }
    if color_by_method:
        colors = {k: by_method.get(method[k]) for k in pretty}
        styles = {k: by_style.get(method[k], "-") for k in pretty}
    else:
        colors, styles = distinct_styles(list(pretty))
    draw_curves(ax, pretty, window, colors, styles)
    ax.set_ylabel(ylabel)
    ax.set_title(title, fontsize=10)
    arrays = [np.asarray(c) for c in curves.values()]
    fig.tight_layout()
    _legend_below(
        fig, ax, band_caption([c.shape[0] for c in arrays], window, [c.shape[-1] for c in arrays])
    )
    return fig


def load_run(run_dir: str, metric: str = "J"):
    """{method: (best curves [seeds, iters] of ``metric``, summary dict)} for the method folders in
    run_dir; the best grid point is chosen on J over the run's summary window.

    Raises:
      DamagedResult: a ``metrics.npz`` that cannot be read, or that lacks ``metric``.
    """
    out = {}
    for method in METHOD_ORDER:
        path = os.path.join(run_dir, method, "metrics.npz")
        if not os.path.exists(path):
            continue
        d = _read_metrics(path, ["J", metric, "summary_window", *FLAGS])
        if metric not in d:
            raise DamagedResult(f"{path} holds no {metric!r}")
        J = d["J"]
        window = _summary_window(path, d)
        final, mean, se, best = summarize(J, window)
        hp = {k[5:]: float(d[k][best]) for k in d if k.startswith("grid_")}
        out[method] = (
            d[metric][best],
            {
                "mean": float(mean[best]),
                "se": float(se[best]),
                **hp,
                "iterations": int(J.shape[-1]),
                "window": window,
                # > 0 only when no grid point is finite in every seed (summarize)
                "nonfinite_seeds": int(nonfinite_seeds(final)[best]),
                # the best point's solver health (bchg_jax.core.health): {} without flags
                "health": solver_health({f: d[f][best] for f in FLAGS if f in d}),
            },
        )
    return out


def run_name(run_dir: str) -> str:
    """The run folder's name (its last path component)."""
    return os.path.basename(os.path.normpath(run_dir)) or run_dir


def run_names(run_dirs) -> list:
    """Each run folder's :func:`run_name`, or, where folders share their name (``a/run`` and
    ``b/run``), the shortest end of its path that no other given folder's path ends with
    (``a/run``, ``b/run``), so that panels and table columns can be told apart."""
    parts = [os.path.abspath(d).split(os.sep) for d in run_dirs]
    names = []
    for i, mine in enumerate(parts):
        k = 1
        while k < len(mine) and any(
            j != i and p[-k:] == mine[-k:] for j, p in enumerate(parts) if p != mine
        ):
            k += 1
        names.append(run_name(run_dirs[i]) if k == 1 else "/".join(mine[-k:]))
    return names


def run_settings(run_dir: str):
    """(experiment or None, {setting: value}) from the run folder's ``config.json``.

    Bookkeeping arguments (:data:`NOT_SETTINGS`) are left out, and with ``--grid paper`` so are the
    grid flags (list values such as ``lr``), which that grid replaces.
    """
    cfg = _config(run_dir)
    args = {k: v for k, v in cfg.get("args", {}).items() if k not in NOT_SETTINGS}
    if args.get("grid", "none") != "none":
        args = {k: v for k, v in args.items() if not isinstance(v, list)}
    return cfg.get("experiment"), args


def format_setting(key: str, value) -> str:
    """``("beta", 0.001)`` -> ``"β=0.001"``; lists are comma-joined, floats use ``:g``."""

    def one(v):
        return f"{v:g}" if isinstance(v, float) else str(v)

    val = ",".join(one(v) for v in value) if isinstance(value, (list, tuple)) else one(value)
    return f"{SETTING_NAMES.get(key, key.replace('_', '-'))}={val}"


def _key_settings(experiment, settings: dict):
    return [k for k in KEY_SETTINGS.get(experiment, ()) if k in settings]


def _wrap(text: str, width: int = 48) -> str:
    return "\n".join(textwrap.wrap(text, width, break_on_hyphens=False)) if text else ""


def panel_titles(run_dirs):
    """(panel titles, figure title) for a figure with one panel per run folder.

    Each title is the folder name (:func:`run_names`: with the folders above it where two
    runs share it) and, on a second line, the settings that differ between the
    runs (when none differ: the experiment's :data:`KEY_SETTINGS`). The figure title names the
    experiment and the key settings all panels share. One run: the panel title names the
    experiment and the figure title is empty. Runs of different experiments: each title names
    its experiment and key settings, and the figure title is empty.
    """
    info = [run_settings(d) for d in run_dirs]
    names = run_names(run_dirs)
    experiments = {e for e, _ in info}
    titles = []
    if len(experiments) > 1:
        for d, (e, s) in zip(names, info, strict=False):
            body = ", ".join(format_setting(k, s[k]) for k in _key_settings(e, s))
            titles.append(
                d
                + f"\n{EXPERIMENT_NAMES.get(e, e or '?')}"
                + (f": {_wrap(body, 40)}" if body else "")
            )
        return titles, ""
    experiment = experiments.pop()
    # settings every run records (an older config.json may lack a newer flag)
    keys = [k for k in info[0][1] if all(k in s for _, s in info)]
    differ = [k for k in keys if len({json.dumps(s.get(k), sort_keys=True) for _, s in info}) > 1]
    key = KEY_SETTINGS.get(experiment, ())
    differ = [k for k in key if k in differ] + sorted(k for k in differ if k not in key)
    shown = differ or _key_settings(experiment, info[0][1])
    name = EXPERIMENT_NAMES.get(experiment, experiment or "")
    for d, (_, s) in zip(names, info, strict=False):
        body = ", ".join(format_setting(k, s[k]) for k in shown if k in s)
        head = d + (f" ({name})" if len(run_dirs) == 1 and name else "")
        titles.append(head + (f"\n{_wrap(body)}" if body else ""))
    if len(run_dirs) == 1:
        return titles, ""
    shared = [k for k in _key_settings(experiment, info[0][1]) if k not in shown]
    sup = name + (
        ": " + ", ".join(format_setting(k, info[0][1][k]) for k in shared) if shared else ""
    )
    return titles, sup


def _experiment(run_dir: str):
    return _config(run_dir).get("experiment")


def _best_caption(windows) -> str:
    """``windows``: the summary windows used (at most the run length, as ``summarize`` does)."""
    windows = sorted(set(windows))
    last = " / ".join(str(w) for w in windows)
    return f"each method at its best grid point (highest mean of the last {last} iterations)"


def panel_figure(run_dirs, window: int | None = None):
    """One panel per run folder, methods as curves (the paper's Four-Rooms figure layout): panel
    titles from :func:`panel_titles`, one legend under the panels that says what the lines and
    bands are. Up to 3 panels a row. ``window``: the trailing mean (None:
    :func:`smoothing_window` of the longest run)."""
    plt = _plt()
    loaded = [load_run(d) for d in run_dirs]
    if window is None:
        window = smoothing_window([c.shape[-1] for r in loaded for c, _ in r.values()])
    n = len(run_dirs)
    ncols = min(n, 3)
    nrows = math.ceil(n / ncols)
    fig, axes = plt.subplots(nrows, ncols, figsize=(5.0 * ncols, 3.9 * nrows), squeeze=False)
    colors, styles = method_colors(), method_linestyles()  # the same for a method in every panel
    titles, sup = panel_titles(run_dirs)
    mixed = len({_experiment(d) for d in run_dirs}) > 1
    seeds, lengths, windows = [], [], []
    for i, (ax, run_dir, title, runs) in enumerate(
        zip(axes.ravel(), run_dirs, titles, loaded, strict=False)
    ):
        draw_curves(ax, {METHOD_LABELS[m]: c for m, (c, _) in runs.items()}, window, colors, styles)
        seeds += [c.shape[0] for c, _ in runs.values()]
        lengths += [c.shape[-1] for c, _ in runs.values()]
        windows += [min(s["window"], s["iterations"]) for _, s in runs.values()]
        ax.set_title(title, fontsize=10)
        if mixed or i % ncols == 0:
            ax.set_ylabel(YLABELS.get(_experiment(run_dir), GENERIC_YLABEL))
    for ax in axes.ravel()[n:]:
        ax.set_visible(False)
    if sup:
        fig.suptitle(sup, fontsize=11)
    fig.tight_layout()
    caption = band_caption(seeds or [0], window, lengths or None)
    if windows:
        caption += ";\n" + _best_caption(windows)
    _legend_below(fig, axes, caption)
    return fig


def _is_thermal_components(metrics) -> bool:
    return set(THERMAL_WEIGHTS) <= set(metrics)


def components_figure(run_dir: str, metrics: Sequence[str], window: int | None = None):
    """One panel per metric (e.g. the objective and its components), methods as curves, each at
    its best grid point on J (the paper's thermal-control appendix figure).

    With ``metrics = ("J", c1, c2, c3, c4)`` the J panel is large, on the left, and the four
    components form a 2 x 2 grid beside it; otherwise up to 3 panels a row. Panels are titled and
    y-labelled from :data:`COMPONENT_TITLES` / :data:`COMPONENT_YLABELS` (the metric's name for
    others). For the thermal components the figure title states how J is made of them
    (:data:`THERMAL_IDENTITY`). ``window``: the trailing mean (None: :func:`smoothing_window`,
    the same rule as the run's ``figure.png``, so both show the same final J).
    """
    plt = _plt()
    if window is None:
        window = smoothing_window([c.shape[-1] for c, _ in load_run(run_dir).values()])
    metrics = list(metrics)
    big_j = len(metrics) == 5 and metrics[0] == "J"
    if big_j:
        fig = plt.figure(figsize=(13.5, 6.6))
        gs = fig.add_gridspec(2, 3, width_ratios=(1.35, 1, 1))
        axes = [fig.add_subplot(gs[:, 0])] + [
            fig.add_subplot(gs[r, c]) for r in range(2) for c in (1, 2)
        ]
    else:
        ncols = min(len(metrics), 3)
        nrows = math.ceil(len(metrics) / ncols)
        fig, grid = plt.subplots(nrows, ncols, figsize=(4.6 * ncols, 3.6 * nrows), squeeze=False)
        axes = list(grid.ravel())
        for ax in axes[len(metrics) :]:
            ax.set_visible(False)
    colors, styles = method_colors(), method_linestyles()
    seeds, lengths, windows = [], [], []
    experiment = _experiment(run_dir)
    for ax, name in zip(axes, metrics, strict=False):
        runs = load_run(run_dir, name)
        draw_curves(ax, {METHOD_LABELS[m]: c for m, (c, _) in runs.items()}, window, colors, styles)
        seeds += [c.shape[0] for c, _ in runs.values()]
        lengths += [c.shape[-1] for c, _ in runs.values()]
        windows += [min(s["window"], s["iterations"]) for _, s in runs.values()]
        ax.set_title(COMPONENT_TITLES.get(name, name), fontsize=10)
        ylabel = (
            YLABELS.get(experiment, COMPONENT_YLABELS["J"])
            if name == "J"
            else COMPONENT_YLABELS.get(name, name)
        )
        ax.set_ylabel(ylabel)
    exp_name = EXPERIMENT_NAMES.get(experiment, experiment or "")
    head = (
        f"{exp_name}, {run_name(run_dir)}: leader objective and its components"
        if exp_name
        else f"{run_name(run_dir)}: " + ", ".join(metrics)
    )
    if _is_thermal_components(metrics):
        head += "\n" + THERMAL_IDENTITY.replace("; each", ";\neach", 1)
    fig.suptitle(head, fontsize=10.5)
    fig.tight_layout()
    caption = band_caption(seeds or [0], window, lengths or None)
    if windows:
        caption += ";\n" + _best_caption(windows) + ", chosen on $J_L$"
    _legend_below(
        fig,
        axes,
        caption,
        ncol=min(5, max(1, len({lab for ax in axes for lab in ax.get_legend_handles_labels()[1]}))),
    )
    return fig


def final_table(run_dirs, footnote: bool = True) -> str:
    """Markdown table: mean +- SE over seeds of the summary window (e.g. the last 1000
    iterations) of each method's best grid point; a cell whose solver health makes its result
    suspect (:func:`~bchg_jax.core.health.suspect`) carries it in bold. ``footnote``: a line
    under the table names the window(s) and what the bold means.

    Column headers: with several runs the panel titles of :func:`panel_titles` (folder name and
    differing settings); with one run its key settings (so a run and its ``--export`` copy give
    the same table)."""
    runs = [load_run(d) for d in run_dirs]
    methods = [m for m in METHOD_ORDER if any(m in r for r in runs)]
    if len(run_dirs) > 1:
        heads = [t.replace("\n", ": ", 1).replace("\n", " ") for t in panel_titles(run_dirs)[0]]
    else:
        e, s = run_settings(run_dirs[0])
        body = ", ".join(format_setting(k, s[k]) for k in _key_settings(e, s))
        name = EXPERIMENT_NAMES.get(e, e or run_name(run_dirs[0]))
        heads = [name + (f": {body}" if body else "")]
    lines = ["| method | " + " | ".join(heads) + " |", "|---|" + "---|" * len(run_dirs)]
    unhealthy = False
    for m in methods:
        cells = []
        for d, r in zip(run_dirs, runs, strict=False):
            if m in r:
                s = r[m][1]
                planned = _config(d).get("args", {}).get("iterations", s["iterations"])
                # the steps the method reads (no critic: no critic_steps in its grid)
                steps = [
                    f"{w} {s[f'{w}_steps']:g}" for w in ("actor", "critic") if f"{w}_steps" in s
                ]
                hp = f"lr {s['lr']:g}" if "lr" in s else ", ".join(steps)
                cells.append(
                    f"{s['mean']:.3f} +- {s['se']:.3f} ({hp}"
                    + (
                        f", a {s['sarsa_alpha']:g}"
                        if m in ("bchg", "hpgd_sa") and "sarsa_alpha" in s
                        else ""
                    )
                    + (f"; {s['iterations']} it" if s["iterations"] < planned else "")
                    + ")"
                )
                if s.get("nonfinite_seeds"):  # as the run's own table: there is no best point
                    cells[-1] = "nan +- nan (no grid point finite in every seed)"
                if suspect(s["health"]):  # a result that is not what it claims to be
                    cells[-1] += f" **{health_text(s['health'])}**"
                    unhealthy = True
            else:
                cells.append("-")
        lines.append(f"| {METHOD_LABELS[m]} | " + " | ".join(cells) + " |")
    if not footnote:
        return "\n".join(lines)
    # (a run shorter than its window is averaged over its whole length)
    windows = [sorted({min(s["window"], s["iterations"]) for _, s in r.values()}) for r in runs]
    over = (
        f"the last {windows[0][0]} iterations"
        if all(w == windows[0] for w in windows) and len(windows[0]) == 1
        else "the last "
        + " / ".join("-".join(map(str, w)) or "-" for w in windows)
        + " iterations (by column)"
    )
    lines.append(
        f"\nMean +- SE over the seeds of {over}, at each method's best grid point"
        + ("; in b" + BOLD_NOTE[4:] if unhealthy else "")
        + "."
    )
    return "\n".join(lines)


# what a bold cell of a table means (final_table's footnote, the figure's table)
BOLD_NOTE = (
    f"In bold: a solver-health flag set in more than {100 * WARN_SHARE:g}% of the "
    "run-iterations (capped or stalled solves, skipped updates, a non-finite J or "
    "float32-rounded logits): the cell is not the method's result"
)


# what export_best leaves out of a method's metrics.npz: a folder whose npz holds one is a run's
EXPORT_DROPS = ("grad_norm", "sweeps", "riccati_iters", "ok")


def _holds_a_run(method_dir: str) -> bool:
    """Whether a method folder holds a CLI run's results rather than an export's: a checkpoint,
    or a metrics.npz with more than one grid point or with a record an export drops (a run
    whose checkpoints were deleted still has those)."""
    if os.path.isdir(os.path.join(method_dir, "checkpoint")):
        return True
    path = os.path.join(method_dir, "metrics.npz")
    if not os.path.exists(path):
        return False
    try:
        with np.load(path) as d:
            return bool(set(d.files) & set(EXPORT_DROPS)) or d["J"].shape[0] > 1
    except (OSError, ValueError, KeyError, IndexError):
        return True  # unreadable: not ours to overwrite


def _read_all(path: str) -> dict:
    """Every entry of a method's ``metrics.npz`` (:func:`_read_metrics`'s checks)."""
    try:
        with np.load(path) as d:
            names = d.files
    except Exception as err:  # noqa: BLE001 - as _read_metrics
        raise DamagedResult(f"{path} cannot be read ({type(err).__name__}: {err})") from None
    return _read_metrics(path, names)


# the files export_best writes in a method folder (what it removes when they are stale)
EXPORT_FILES = ("metrics.npz", "summary.csv", "curve.png")


def export_best(run_dir: str, dest: str, replace: bool = True) -> None:
    """Writes a compact copy of a run folder: per method only its best grid point (G = 1).

    The copy is itself a run folder (plots and tables work on it), a few hundred KB per method
    instead of the full grid's megabytes. ``dest`` may hold an earlier export (it is refreshed
    in place), never a run (refused: ValueError). The export replaces exactly what it owns: the
    files an earlier export wrote (:data:`EXPORT_FILES`, ``config.json``) that this one does
    not write are removed, so a method the run no longer holds does not linger in the copy
    beside the new results; other files are kept. ``replace=False`` keeps the method folders
    that ``run_dir`` lacks (one copy gathered from several run folders, one method each).
    """
    from bchg_jax.core.io import atomic_write_bytes, save_npz

    if os.path.isdir(dest) and os.path.isdir(run_dir) and os.path.samefile(dest, run_dir):
        raise ValueError(f"--export {dest} is the run folder itself; give another folder")
    inside = os.path.relpath(os.path.realpath(dest), os.path.realpath(run_dir))
    if inside != os.curdir and not inside.startswith(os.pardir):
        # e.g. a method's folder: its config.json would be replaced by the run's
        raise ValueError(
            f"--export {dest} is inside the run folder {run_dir}, whose files it would "
            "replace; give a folder outside it"
        )
    if _holds_a_run(dest):
        raise ValueError(f"--export {dest} is a method folder of a run; give another folder")
    trained = [m for m in METHOD_ORDER if _holds_a_run(os.path.join(dest, m))]
    if trained:  # a CLI's run folder: its grids and health records would be lost
        raise ValueError(
            f"--export {dest} holds a run ({', '.join(trained)}: a checkpoint, several grid "
            "points or the per-iteration records an export drops); its results would be "
            "replaced by a copy of the best grid points: give another folder"
        )

    def _copy_atomic(src: str, dst: str) -> None:
        with open(src, "rb") as f:
            atomic_write_bytes(dst, f.read())

    def _remove_stale(method: str, names) -> None:
        folder = os.path.join(dest, method)
        for name in names:
            if os.path.isfile(os.path.join(folder, name)):
                os.remove(os.path.join(folder, name))
        if os.path.isdir(folder) and not os.listdir(folder):
            os.rmdir(folder)

    os.makedirs(dest, exist_ok=True)
    if os.path.exists(os.path.join(run_dir, "config.json")):
        _copy_atomic(os.path.join(run_dir, "config.json"), os.path.join(dest, "config.json"))
    elif replace and os.path.isfile(os.path.join(dest, "config.json")):
        os.remove(os.path.join(dest, "config.json"))  # an earlier export's settings
    for method in METHOD_ORDER:
        src = os.path.join(run_dir, method)
        if not os.path.exists(os.path.join(src, "metrics.npz")):
            if replace:
                _remove_stale(method, EXPORT_FILES)
            continue
        d = _read_all(os.path.join(src, "metrics.npz"))
        window = _summary_window(os.path.join(src, "metrics.npz"), d)
        best = summarize(d["J"], window)[3]
        keep = {
            k: v[best : best + 1].astype(np.float32)
            for k, v in d.items()
            if isinstance(v, np.ndarray) and v.ndim == 3 and k not in EXPORT_DROPS
        }
        keep.update({k: v[best : best + 1] for k, v in d.items() if k.startswith("grid_")})
        keep["summary_window"] = np.asarray(window)
        keep["completed"] = np.asarray(d["J"].shape[-1])
        save_npz(os.path.join(dest, method, "metrics.npz"), keep)
        for name in ("summary.csv", "curve.png"):
            if os.path.exists(os.path.join(src, name)):
                _copy_atomic(os.path.join(src, name), os.path.join(dest, method, name))
            else:
                _remove_stale(method, [name])


def main(argv=None):
    from bchg_jax.core.io import save_figure

    p = argparse.ArgumentParser(
        prog="python -m experiments.plot",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("runs", nargs="+", help="run folders (each with <method>/metrics.npz)")
    p.add_argument(
        "--window",
        type=int,
        default=None,
        help="rolling-mean window (default: 1/20 of the longest run, at most 100)",
    )
    p.add_argument(
        "--out",
        default=None,
        help="figure path (default: <run>/figure.png for one run, comparison.png beside the "
        "first of several)",
    )
    p.add_argument(
        "--export",
        metavar="DEST",
        default=None,
        help="with one run folder: write its compact copy (best grid points) to DEST (an "
        "earlier export there is replaced, also its methods the run lacks; a run is refused)",
    )
    a = p.parse_args(argv)
    if a.out is not None:  # checked before anything is drawn or exported
        from matplotlib.backend_bases import FigureCanvasBase

        formats = FigureCanvasBase.get_supported_filetypes()
        ext = os.path.splitext(a.out)[1][1:].lower() or "png"
        if os.path.isdir(a.out):
            p.error(f"--out {a.out} is a folder; give the figure's file name (e.g. figure.png)")
        if ext not in formats:
            p.error(f"--out {a.out}: matplotlib writes no .{ext} figures ({', '.join(formats)})")
    if a.export is not None:
        if len(a.runs) != 1:
            fail("--export takes exactly one run folder")
        try:
            export_best(a.runs[0], a.export)
        except ValueError as err:
            fail(str(err))
        a.runs = [a.export]
    try:  # a damaged file: one line that names it, not a traceback
        for d in a.runs:
            if not load_run(d):
                fail(f"no <method>/metrics.npz under {d}")
        if a.out:
            out = a.out
        elif len(a.runs) == 1:
            out = os.path.join(a.runs[0], "figure.png")  # what the run wrote itself
        else:  # never over a run's own figure
            out = os.path.join(os.path.dirname(os.path.abspath(a.runs[0])), "comparison.png")
        save_figure(out, panel_figure(a.runs, a.window))
        print(final_table(a.runs))
    except DamagedResult as err:
        fail(str(err))
    print(f"\nfigure: {out}")


if __name__ == "__main__":
    main()
