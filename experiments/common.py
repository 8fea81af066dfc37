"""Shared driver of the experiment CLIs: the common flags, run folders, per-chunk results,
resume / extend / repeat, Ctrl-C, summaries (the experiments: ``docs/experiments.md``).

A run folder holds ``config.json`` and one sub-folder per method with ``config.json``,
``metrics.npz`` (rewritten atomically after every chunk), ``metrics.jsonl`` (one line appended
per chunk) and ``checkpoint/<iteration>/`` (an orbax checkpoint folder of the whole training
state, saved atomically after every chunk; the last one is kept so that a finished run can be
extended), ``summary.csv`` and ``curve.png``. With several methods the folder also gets
``summary.csv`` (best grid point per method) and ``figure.png``. A method whose metrics are
complete is skipped, one with a checkpoint continues from it (``--resume``, also to a larger
``--iterations``); ``--config FILE`` repeats a saved run's settings.
"""
from __future__ import annotations

import argparse
import contextlib
import datetime
import json
import os
import re
import signal
import sys
import threading
import time
from typing import Callable, Dict, Optional, Sequence, Tuple

import numpy as np

# summary entries that are not hyperparameters of the best grid point
NOT_HPARAMS = ("method", "mean", "se", "wall_s", "health")


def parse_methods(spec: str, all_methods: Sequence[str], valid: Sequence[str]):
    """``--method`` value -> list of names: 'all', one name or a comma-separated list."""
    names = list(all_methods) if spec == "all" else [m.strip() for m in spec.split(",")
                                                     if m.strip()]
    if not names or any(m not in valid for m in names):
        raise ValueError(f"--method must be 'all' or names from {tuple(valid)}, got {spec!r}")
    return names


def grid_label(method: str, grid: Dict[str, np.ndarray], g: int) -> str:
    varying = [k for k, v in grid.items() if len(set(np.atleast_1d(v).tolist())) > 1]
    return method + "".join(f" {k}={grid[k][g]:g}" for k in varying)


# the method being trained, for the Ctrl-C message
PROGRESS = {"method": None}


def run_method_folder(out: str, method: str, trainer, grid: Dict[str, np.ndarray], a, *,
                      record: dict, title: str, window: int, ylabel: str,
                      describe: str) -> dict:
    """Trains (or resumes, extends, or skips if complete) one method's grid in ``out``.

    ``a`` needs ``seeds``, ``seed``, ``iterations``, ``chunk`` and ``shard``. After every chunk
    ``metrics.npz`` and the orbax checkpoint ``checkpoint/<iteration>/`` are rewritten and one
    line is appended to ``metrics.jsonl``; the checkpoint of the last iteration is kept, so a
    later ``--resume DIR --iterations M`` continues from it. Returns the method's summary dict.
    """
    from bchg_jax.core import io as bio
    from bchg_jax.core.io import checkpoint_exists, load_state, save_json, save_npz
    from bchg_jax.core.sweep import run_grid, state_template

    metrics_path, ckpt_path = os.path.join(out, "metrics.npz"), os.path.join(out, "checkpoint")
    jsonl_path = os.path.join(out, "metrics.jsonl")
    state, start, metrics = None, 0, None
    PROGRESS["method"] = method
    if os.path.exists(metrics_path):
        data = dict(np.load(metrics_path))
        done = data["J"].shape[-1]
        if done >= a.iterations:
            print(f"[{method}] complete in {out}; skipped")
            return finish_method(out, method, grid, data, window, title, ylabel, write=False)
        if checkpoint_exists(ckpt_path):
            like = state_template(trainer, grid, a.seeds, a.seed)
            # grow=True: an off-policy episode buffer is sized by --iterations; extending a run
            # gives it empty slots at the end
            state = load_state(ckpt_path, like, grow=True)
            start = int(np.asarray(state.step).reshape(-1)[0])
            metrics = {k: v[..., :start] for k, v in data.items()
                       if isinstance(v, np.ndarray) and v.ndim == 3}
            verb = "extending" if "final" in data else "resuming"
            print(f"[{method}] {verb} at iteration {start} (to {a.iterations})")
        elif "final" in data:       # completed before checkpoints were kept: nothing to extend
            fail(f"{out} completed {done} iterations but holds no checkpoint to continue from; "
                 f"start a new run with --iterations {a.iterations}")
        else:                       # stopped before its first checkpoint was complete
            print(f"[{method}] no checkpoint in {out}; starting again from iteration 0")
    _truncate_jsonl(jsonl_path, start)
    save_json(os.path.join(out, "config.json"), {
        "method": method, "args": saved_args(a), **record,
        "grid": {k: np.asarray(v).tolist() for k, v in grid.items()},
        "num_grid_points": _num_points(grid)})
    print(f"[{method}] {describe} grid points={_num_points(grid)} seeds={a.seeds} "
          f"iterations={a.iterations} -> {out}", flush=True)
    clock = {"t": time.perf_counter(), "done": start}

    def on_chunk(st, m, done):  # metrics first: a checkpoint never runs ahead of the metrics
        with deferred_interrupt():          # Ctrl-C waits until the chunk's files are written
            save_npz(metrics_path, {**m, **{f"grid_{k}": v for k, v in grid.items()},
                                    "completed": np.asarray(done)})
            now = time.perf_counter()
            _append_jsonl(jsonl_path, method, m, clock["done"], done, now - clock["t"], window,
                          grid)
            clock.update(t=now, done=done)
            bio.save_state(ckpt_path, st, done)

    t0 = time.perf_counter()
    _, metrics = run_grid(trainer, grid, a.seeds, a.iterations, a.chunk, a.seed, state=state,
                          start=start, metrics=metrics, on_chunk=on_chunk, shard=a.shard,
                          window=window)
    wall = time.perf_counter() - t0
    data = {**metrics, **{f"grid_{k}": v for k, v in grid.items()}}
    summary = finish_method(out, method, grid, data, window, title, ylabel, write=True)
    summary["wall_s"] = wall
    print(f"[{method}] wall time {wall:.1f}s")
    return summary


@contextlib.contextmanager
def deferred_interrupt():
    """Holds back Ctrl-C (SIGINT) inside the block and raises ``KeyboardInterrupt`` after it, so
    that an interrupt never lands inside a checkpoint write (orbax's writer threads would print
    their tracebacks). Outside the main thread, or where SIGINT is ignored, it does nothing."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    caught = []
    previous = signal.signal(signal.SIGINT, lambda *_: caught.append(True))
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)
        if caught and previous is not signal.SIG_IGN:
            raise KeyboardInterrupt


def _append_jsonl(path: str, method: str, m: Dict[str, np.ndarray], begin: int, done: int,
                  seconds: float, window: int, grid: Dict[str, np.ndarray]) -> None:
    """One JSON line per chunk: the grid's hyperparameters (``grid``: name -> one value per grid
    point, the order of every per-point list) and, for every scalar metric, the mean over seeds
    per grid point at the chunk's last iteration (``last``), over the chunk (``chunk_mean``) and
    over the summary window (``window_mean``). Appended and flushed, so ``tail -f`` shows a
    running job."""
    line = {"method": method, "iteration": int(done), "chunk_iterations": int(done - begin),
            "chunk_seconds": round(float(seconds), 4), "window": int(min(window, done)),
            "grid": {k: np.atleast_1d(v).tolist() for k, v in grid.items()}, "metrics": {}}
    for k, v in m.items():
        if isinstance(v, np.ndarray) and v.ndim == 3:
            seed_mean = v.astype(np.float64).mean(axis=1)          # [G, t]
            line["metrics"][k] = {
                "last": seed_mean[:, -1].tolist(),
                "chunk_mean": seed_mean[:, begin:done].mean(-1).tolist(),
                "window_mean": seed_mean[:, -min(window, done):].mean(-1).tolist()}
    with open(path, "a") as f:
        f.write(json.dumps(line) + "\n")
        f.flush()


def _truncate_jsonl(path: str, start: int) -> None:
    """Drops the lines past iteration ``start`` (a chunk recorded after the last checkpoint is
    recomputed on resume); a fresh run (start 0) starts an empty file."""
    from bchg_jax.core.io import _atomic_write_bytes
    if not os.path.exists(path):
        return
    keep = []
    with open(path) as f:
        for raw in f:
            try:
                if json.loads(raw)["iteration"] <= start:
                    keep.append(raw if raw.endswith("\n") else raw + "\n")
            except (ValueError, KeyError):       # a line cut by a kill: dropped
                pass
    _atomic_write_bytes(path, "".join(keep).encode())


def _num_points(grid) -> int:
    return len(np.atleast_1d(next(iter(grid.values()))))


def finish_method(out, method, grid, data, window, title, ylabel, write) -> dict:
    from bchg_jax.core.io import save_csv, save_figure, save_npz
    from experiments.plot import learning_curve_figure
    from bchg_jax.core.health import FLAGS, health_text, health_warning, solver_health
    from experiments.summary import summarize
    J = data["J"]
    final, mean, se, best = summarize(J, window)
    keys = list(grid)
    flags = {k: np.asarray(data[k]) for k in FLAGS if k in data}
    health = solver_health(flags)
    per_point = [solver_health({k: v[g] for k, v in flags.items()}) for g in range(len(mean))]
    if write:
        save_npz(os.path.join(out, "metrics.npz"), {
            **data, "final": final, "best_index": np.asarray(best),
            "summary_window": np.asarray(window), "completed": np.asarray(J.shape[-1])})
        rows = [tuple(float(grid[k][g]) for k in keys) + (f"{mean[g]:.4f}", f"{se[g]:.4f}",
                                                          int(g == best))
                + tuple(_health_cells(per_point[g]))
                for g in range(len(mean))]
        save_csv(os.path.join(out, "summary.csv"),
                 keys + [f"mean_last{window}", "se", "best"] + HEALTH_COLUMNS * bool(health),
                 rows)
        # every grid point, the best first (its label says so)
        order = [best] + [g for g in range(len(mean)) if g != best]
        curves = {grid_label(method, grid, g) + (" best" if g == best and len(mean) > 1
                                                  else ""): J[g] for g in order}
        save_figure(os.path.join(out, "curve.png"), learning_curve_figure(
            curves, title, ylabel=ylabel, color_by_method=len(mean) == 1))
        # the same rows in the same order as summary.csv (the grid's order)
        print(f"\n{'  '.join(f'{k:>11}' for k in keys)}  mean(last {min(window, J.shape[-1])})"
              "      se")
        for g in range(len(mean)):
            mark = "  <- best" if g == best else ""
            print("  ".join(f"{grid[k][g]:11g}" for k in keys)
                  + f"  {mean[g]:+.4f}  {se[g]:.4f}{mark}")
        if health:
            print(f"[{method}] solver health: {health_text(health)} "
                  f"(of {health['run_iterations']} run-iterations)")
            warning = health_warning(health)
            if warning:
                print(f"[{method}] " + warning.replace("\n", f"\n[{method}] "), file=sys.stderr,
                      flush=True)
    return {"method": method, **{k: float(grid[k][best]) for k in keys},
            "mean": float(mean[best]), "se": float(se[best]), "health": health}


# summary.csv columns of the solver-health flags (bchg_jax.core.health)
HEALTH_COLUMNS = ["capped_share", "skipped_updates"]


def _health_cells(health: dict):
    """The HEALTH_COLUMNS cells of one grid point (none when the trainer records no flags)."""
    if not health:
        return ()
    return (f"{health.get('capped_share', 0.0):.4f}", int(health.get("update_skipped", 0)))


# settings added after runs were saved without them: the value those runs were made with, or a
# function of the saved arguments that gives it (a resumed run keeps it; a new run gets the
# flag's default)
LEGACY_SETTINGS = {
    "solver": "dense",
    # the LQR game's critic ring and target rate (fixed by the preset before they were flags)
    "replay": lambda saved: 200 if saved.get("preset") == "explore" else 0,
    "tau": lambda saved: 0.05 if saved.get("preset") == "explore" else 0.01,
    "explore_episodes": lambda saved: 2 if saved.get("preset") == "explore" else 0,
}


def resume_args(a, experiment: str):
    """For ``--resume DIR``: DIR's saved arguments, with ``--iterations`` (extend only) and the
    flags of :data:`NOT_SETTINGS` taken from the command line. Exits 2 with a message naming the
    right folder when DIR is a method's folder or no run folder, and refuses every other
    setting given with a value that differs from the saved one."""
    run_dir = os.path.normpath(a.resume)
    for flag in ("out", "exact_out", "config"):
        if flag in a._explicit:
            fail(f"--resume continues the run in {a.resume} in place, with its saved settings; "
                 f"drop --{flag.replace('_', '-')}")
    cfg_path = os.path.join(run_dir, "config.json")
    parent = os.path.dirname(os.path.abspath(run_dir))
    method_folder = os.path.exists(cfg_path) and "experiment" not in read_run_config(
        cfg_path, "--resume")
    if method_folder or (not os.path.exists(cfg_path)
                         and os.path.exists(os.path.join(parent, "config.json"))):
        fail(f"--resume {a.resume} is a method's folder inside a run; resume the run folder: "
             f"python -m experiments.{experiment} --resume {parent}")
    if not os.path.exists(cfg_path):
        fail(f"--resume {a.resume}: no config.json there (not a run folder)")
    cfg = read_run_config(cfg_path, "--resume")
    if cfg["experiment"] != experiment:
        fail(f"--resume {a.resume} holds a {cfg['experiment']} run; resume it with "
             f"python -m experiments.{cfg['experiment']} --resume {a.resume}")
    saved = cfg["args"]
    changed = [f"--{k.replace('_', '-')} {saved.get(k)!r} there, {_jsonable(getattr(a, k))!r} "
               "given" for k in sorted(a._explicit)
               if k not in NOT_SETTINGS and k != "iterations" and k in saved
               and _jsonable(getattr(a, k)) != saved[k]]
    if changed:
        fail(f"{a.resume} holds a run with other settings ({'; '.join(changed)}); --resume "
             "continues a run with its saved settings (only --iterations may grow and --chunk, "
             "--shard, --distributed change); start a new run with another --out")
    iterations = saved["iterations"]
    if "iterations" in a._explicit:
        if a.iterations < saved["iterations"]:
            fail(f"--resume {a.resume}: the run has --iterations {saved['iterations']}; a run "
                 f"can be extended, not shortened (got --iterations {a.iterations})")
        iterations = a.iterations
    keep = {k: getattr(a, k, False) for k in ("shard", "distributed")}
    if "chunk" in a._explicit:
        keep["chunk"] = a.chunk
    explicit = a._explicit
    legacy = {k: v(saved) if callable(v) else v for k, v in LEGACY_SETTINGS.items()
              if hasattr(a, k)}
    a = argparse.Namespace(**{**vars(a), **legacy, **saved, **keep})
    a.resume, a.out, a.exact_out, a.config = run_dir, run_dir, True, None
    a.iterations, a._explicit = iterations, explicit
    return a


def _jsonable(v):
    """A parsed argument as config.json stores it (tuples as lists)."""
    return json.loads(json.dumps(v))


def prepare_run_dir(a, experiment: str, methods: Sequence[str], setting_keys: Sequence[str],
                    argv: Optional[Sequence[str]]) -> str:
    """Creates (or re-opens: to add methods, or to resume) the run folder and writes its
    ``config.json``. A folder that holds another experiment's run or a method's results is
    refused, as is one whose run has other settings."""
    from bchg_jax.core.io import save_json
    stamp = datetime.datetime.now().strftime("%Y%m%d-%H%M%S")
    run_dir = a.out if a.exact_out else os.path.join(a.out, experiment, stamp)
    check_writable(run_dir)
    cfg_path = os.path.join(run_dir, "config.json")
    command = f"python -m experiments.{experiment} " + " ".join(
        argv if argv is not None else sys.argv[1:])
    args = saved_args(a)
    if a.resume is not None:        # settings checked by resume_args; --iterations may grow
        old = read_run_config(cfg_path, "--resume")
        legacy = {k: args[k] for k in LEGACY_SETTINGS if k in args and k not in old["args"]}
        save_json(cfg_path, {**old, "args": {**old["args"], **legacy, "iterations": a.iterations},
                             "resumed": old.get("resumed", []) + [
                                 {"command": command, **environment_record()}]})
        return run_dir
    all_methods = list(methods)
    if os.path.exists(cfg_path):  # adding methods to an existing run folder
        old = read_run_config(cfg_path, "--out")
        if old.get("experiment") != experiment:
            what = (f"a {old['experiment']} run" if "experiment" in old
                    else "one method's results of a run")
            fail(f"--out {run_dir} holds {what}; use another --out")
        diff = [k for k in setting_keys if old["args"].get(k) != _jsonable(args.get(k))]
        if diff:
            fail(f"{run_dir} holds a run with other settings ({', '.join(diff)}); "
                 "use another --out")
        all_methods = old["methods"] + [m for m in methods if m not in old["methods"]]
    save_json(cfg_path, {"experiment": experiment, "methods": all_methods,
                         "args": {**args, "method": ",".join(all_methods)},
                         "command": command, **environment_record()})
    return run_dir


def check_writable(run_dir: str) -> None:
    """Exits 2 with a clear error unless ``run_dir`` can be created and written (before any
    compilation; an existing folder's files are not touched)."""
    import tempfile
    try:
        os.makedirs(run_dir, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=run_dir, prefix=".write-test-"):
            pass
    except OSError as err:
        print(f"error: cannot write results to {run_dir!r}: {err.strerror or err}",
              file=sys.stderr)
        raise SystemExit(2)


def environment_record() -> dict:
    """Library, JAX and device versions stored with every result."""
    import jax
    import bchg_jax
    return {"bchg_jax_version": bchg_jax.__version__, "jax_version": jax.__version__,
            "devices": [str(d) for d in jax.devices()],
            "date": datetime.datetime.now().isoformat(timespec="seconds")}


def _saved_summaries(run_dir: str, done: set, window: int) -> list:
    """The summaries of the method folders in ``run_dir`` that are not in ``done``, computed
    from their ``metrics.npz`` (nothing is rewritten)."""
    out = []
    for name in sorted(os.listdir(run_dir)):
        path = os.path.join(run_dir, name, "metrics.npz")
        if name in done or not os.path.isfile(path):
            continue
        data = dict(np.load(path))
        grid = {k[5:]: v for k, v in data.items() if k.startswith("grid_")}
        if "J" in data and grid:
            out.append(finish_method(os.path.join(run_dir, name), name, grid, data, window,
                                     "", "", write=False))
    return out


def finish_run(run_dir: str, summaries: Sequence[dict], window: int, extra_figures:
               Optional[Callable[[str], None]] = None) -> None:
    from bchg_jax.core.health import WARN_SHARE, health_text, health_warning
    from bchg_jax.core.io import save_csv, save_figure
    from experiments.plot import METHOD_ORDER, panel_figure
    # the run's other method folders (trained by an earlier command into the same --out)
    summaries = list(summaries) + _saved_summaries(run_dir, {s["method"] for s in summaries},
                                                   window)
    rank = {m: i for i, m in enumerate(METHOD_ORDER)}
    summaries.sort(key=lambda s: rank.get(s["method"], len(rank)))
    if len(summaries) > 1:
        keys = [k for k in summaries[0] if k not in NOT_HPARAMS]
        with_health = any(s.get("health") for s in summaries)
        save_csv(os.path.join(run_dir, "summary.csv"),
                 ["method"] + keys + [f"mean_last{window}", "se"]
                 + HEALTH_COLUMNS * with_health,
                 [(s["method"],) + tuple(s[k] for k in keys) + (f"{s['mean']:.4f}", f"{s['se']:.4f}")
                  + (tuple(_health_cells(s.get("health") or {"capped_share": 0.0}))
                     if with_health else ())
                  for s in summaries])
        save_figure(os.path.join(run_dir, "figure.png"), panel_figure([run_dir]))
    if extra_figures is not None:
        extra_figures(run_dir)
    print(f"\n{'method':>12}  best grid point                 mean(last {window})      se"
          "  solver health")
    for s in summaries:
        hp = " ".join(f"{k}={v:g}" for k, v in s.items() if k not in NOT_HPARAMS)
        print(f"{s['method']:>12}  {hp:30s}  {s['mean']:+.4f}  {s['se']:.4f}  "
              f"{health_text(s.get('health') or {})}")
    unhealthy = [s["method"] for s in summaries if health_warning(s.get("health") or {})]
    if unhealthy:
        print(f"WARNING: solves hit their cap or updates were skipped in more than "
              f"{100 * WARN_SHARE:g}% of the run-iterations of: {', '.join(unhealthy)} "
              "(see the warnings above)", file=sys.stderr, flush=True)
    print(f"\nresults in {run_dir}")


SMOKE_SEEDS = 2  # --smoke runs at most this many seeds
_UNSET = object()  # marks flags not given on the command line
# flags that name where and how a run executes, never its settings: --config and --resume do not
# take them from a saved config.json, and --resume accepts them changed
NOT_SETTINGS = ("config", "resume", "out", "exact_out", "shard", "distributed", "chunk")


def saved_args(a) -> dict:
    """The arguments recorded in config.json (``vars(a)`` without private entries)."""
    return {k: v for k, v in vars(a).items() if not k.startswith("_")}


def read_run_config(path: str, flag: str) -> dict:
    """A config.json as a dict; exits 2 with ``error: FLAG PATH: ...`` when unreadable."""
    try:
        with open(path) as f:
            cfg = json.load(f)
        if not isinstance(cfg, dict) or not isinstance(cfg.get("args"), dict):
            raise ValueError("it has no 'args' (not a bchg-jax config.json)")
    except (OSError, ValueError) as err:
        fail(f"{flag} {path}: cannot read it: {getattr(err, 'strerror', None) or err}")
    return cfg


def fail(message: str) -> None:
    """Prints ``error: message`` to stderr and exits with status 2 (bad input)."""
    print(f"error: {message}", file=sys.stderr)
    raise SystemExit(2)


def apply_config_file(parser: argparse.ArgumentParser, a) -> None:
    """``--config FILE``: every setting of FILE (a run's or a method's ``config.json``) that was
    not given on the command line; the flags of :data:`NOT_SETTINGS` are never taken from it,
    and a setting FILE lacks because it predates the flag gets its :data:`LEGACY_SETTINGS` value."""
    cfg = read_run_config(a.config, "--config")
    prog = parser.prog.rsplit(".", 1)[-1]
    if cfg.get("experiment", prog) != prog:
        fail(f"--config {a.config} holds a {cfg['experiment']} run, not {prog}")
    dests = {x.dest for x in parser._actions}
    foreign = sorted(set(cfg["args"]) - dests)
    if foreign:
        fail(f"--config {a.config}: settings {foreign} are not flags of {parser.prog}")
    for k, v in cfg["args"].items():
        if k not in a._explicit and k not in NOT_SETTINGS:
            setattr(a, k, v)
    for k, v in LEGACY_SETTINGS.items():       # a file saved before the flag existed
        if k in dests and k not in cfg["args"] and k not in a._explicit:
            setattr(a, k, v(cfg["args"]) if callable(v) else v)
    if "method" in cfg and "method" not in a._explicit:   # a method folder's config.json
        a.method = cfg["method"]


class HelpFormatter(argparse.RawDescriptionHelpFormatter,
                    argparse.ArgumentDefaultsHelpFormatter):
    """Keeps the module docstring's line breaks and appends "(default: ...)" to every flag."""


class ExperimentParser(argparse.ArgumentParser):
    """An experiment CLI's parser. ``parse_args`` applies ``--smoke``: at most
    :data:`SMOKE_SEEDS` seeds and ``smoke_iterations`` iterations, chunks of ``smoke_chunk``
    (a CLI shrinks its own flags after that)."""

    def __init__(self, *args, smoke_iterations: int, smoke_chunk: int, **kwargs):
        super().__init__(*args, **kwargs)
        self.smoke_iterations, self.smoke_chunk = smoke_iterations, smoke_chunk

    def parse_args(self, args=None, namespace=None):
        args = sys.argv[1:] if args is None else list(args)
        unset = argparse.Namespace(**{x.dest: _UNSET for x in self._actions})
        given = super().parse_args(args, unset)
        explicit = {k for k, v in vars(given).items() if v is not _UNSET}
        a = super().parse_args(args, namespace)
        a._explicit = frozenset(explicit)
        if getattr(a, "config", None):
            apply_config_file(self, a)
        if a.smoke and "smoke" in a._explicit:   # (a --config file holds reduced values)
            a.seeds, a.iterations = min(a.seeds, SMOKE_SEEDS), min(a.iterations,
                                                                   self.smoke_iterations)
            a.chunk = self.smoke_chunk
        return a


def base_parser(experiment: str, description: str, *, seeds: int, iterations: int, chunk: int,
                methods: Sequence[str], also: str = "", noun: str = "method", grid_flags: str,
                grid_help: str, smoke: Tuple[int, int], smoke_help: str = "") -> ExperimentParser:
    """The flags every experiment CLI shares, with that experiment's defaults.

    ``methods``: what ``--method all`` runs; ``also``: text on the other accepted names;
    ``grid_flags``: the flags ``--grid none`` takes the grid from, ``grid_help``: what
    ``--grid paper`` sweeps; ``smoke``: (iterations, chunk) of ``--smoke``,
    ``smoke_help``: the CLI's other ``--smoke`` reductions. The CLI adds its own flags (in
    ``parser.add_argument_group(...)``) and calls ``parse_args``.
    """
    p = ExperimentParser(prog=f"python -m experiments.{experiment}", description=description,
                         formatter_class=HelpFormatter, smoke_iterations=smoke[0],
                         smoke_chunk=smoke[1])
    p.add_argument("--seeds", type=int, default=seeds,
                   help="number of seeds (independent runs of every grid point)")
    p.add_argument("--seed", type=int, default=0,
                   help="base seed: seed i runs with the key fold_in(key(SEED), i)")
    p.add_argument("--method", default="bchg",
                   help=f"a {noun}, a comma-separated list, or 'all' (= {', '.join(methods)})"
                        + (f"; {also}" if also else ""))
    p.add_argument("--grid", choices=["none", "paper"], default="none",
                   help=f"'none': the values of {grid_flags}; 'paper': {grid_help}")
    p.add_argument("--iterations", type=int, default=iterations, help="outer iterations per run")
    p.add_argument("--chunk", type=int, default=chunk,
                   help="iterations per jitted chunk; after every chunk the progress is printed "
                        "and <method>/metrics.npz and the orbax checkpoint folder "
                        "<method>/checkpoint/<iteration>/ are rewritten")
    p.add_argument("--out", default="results",
                   help=f"results root: the run folder is <out>/{experiment}/<timestamp>/")
    p.add_argument("--exact-out", action="store_true",
                   help=f"use --out itself as the run folder (no {experiment}/<timestamp>/ "
                        "subfolder); a folder of the same settings gets the new methods added")
    p.add_argument("--resume", metavar="DIR", default=None,
                   help="continue the run in the run folder DIR (the folder holding config.json "
                        "and one folder per method) with its saved settings: every method "
                        "continues from its orbax checkpoint DIR/<method>/checkpoint/<iteration>/"
                        "; complete methods are skipped. A larger --iterations extends the run; "
                        "--chunk, --shard and --distributed may change; any other changed "
                        "setting is refused")
    p.add_argument("--config", metavar="FILE", default=None,
                   help="take every setting from FILE, a run's (or one method's) config.json, "
                        "to repeat that run exactly; flags given on the command line override "
                        "it (--out, --exact-out, --chunk, --shard are never taken from FILE)")
    add_scale_args(p)
    p.add_argument("--smoke", action="store_true",
                   help=f"tiny run: at most {SMOKE_SEEDS} seeds and {smoke[0]} iterations, "
                        f"chunks of {smoke[1]}" + (f", {smoke_help}" if smoke_help else ""))
    return p


def add_scale_args(p: argparse.ArgumentParser) -> None:
    """``--shard`` and ``--distributed``, shared by the experiment CLIs."""
    p.add_argument("--shard", action="store_true",
                   help="split the seeds x grid runs over every JAX device (jax.shard_map)")
    p.add_argument("--distributed", action="store_true",
                   help="multi-host: call jax.distributed.initialize() (coordinator, process "
                        "count and id from the cluster environment or JAX_COORDINATOR_ADDRESS, "
                        "JAX_NUM_PROCESSES, JAX_PROCESS_ID), shard over every host's devices; "
                        "process 0 writes the results")


def _start_distributed(a) -> None:
    import tempfile

    import jax
    jax.distributed.initialize()
    a.shard = True
    if jax.process_index() != 0:          # the others compute their shards, write nothing shared
        a.out, a.exact_out = tempfile.mkdtemp(prefix=f"bchg-p{jax.process_index()}-"), True


def check_counts(a, *flags: str) -> None:
    """Each named flag (attribute names of ``a``) is an integer >= 1; the error names the flag
    and the value given."""
    for flag in flags:
        value = getattr(a, flag)
        if value < 1:
            raise ValueError(f"--{flag.replace('_', '-')} must be >= 1, got {value}")


def flag_names(message: str, a) -> str:
    """An error message from a library config check, with each ``TrainConfig.<field>`` that is
    also a command-line flag named as the flag (``--tau (TrainConfig.tau)``), so the user sees
    what to change."""
    def named(m):
        field = m.group(1)
        if field in vars(a):
            return f"--{field.replace('_', '-')} ({m.group(0)})"
        return m.group(0)
    return re.sub(r"\bTrainConfig\.(\w+)", named, message)


def run_experiment(experiment: str, argv, parse_args: Callable, validate: Callable,
                   run_method: Callable, setting_keys: Sequence[str], window: int,
                   extra_figures: Optional[Callable[[str], None]] = None) -> str:
    """The main() of every experiment CLI: parse, resume, validate everything before anything
    compiles (bad input exits 2 with ``error: ...``), run each method, write the run summary.
    Ctrl-C exits 130 with the iteration of the last checkpoint and the command to resume."""
    PROGRESS["method"] = None
    a = parse_args(argv)
    if a.resume is not None:
        a = resume_args(a, experiment)
    if getattr(a, "distributed", False):
        _start_distributed(a)
    try:
        methods = validate(a)
    except ValueError as err:
        fail(flag_names(str(err), a))
    run_dir = prepare_run_dir(a, experiment, methods, setting_keys, argv)
    try:
        summaries = [run_method(m, a, run_dir) for m in methods]
        finish_run(run_dir, summaries, window, extra_figures)
    except KeyboardInterrupt:
        print(f"\ninterrupted {_where(run_dir)}; nothing saved is lost. Resume with:\n"
              f"  python -m experiments.{experiment} --resume {run_dir}", file=sys.stderr)
        raise SystemExit(130)
    except OSError as err:     # a full disk, a folder made read-only: stop, say how to go on
        print(f"\nerror: could not write the results {_where(run_dir)}: {err}\n"
              "Every file written before is complete (atomic writes). Fix the cause, then "
              f"resume with:\n  python -m experiments.{experiment} --resume {run_dir}",
              file=sys.stderr)
        raise SystemExit(1)
    return run_dir


def _where(run_dir: str) -> str:
    """Where a stopped run stands: the method and the iteration of its last checkpoint."""
    from bchg_jax.core.io import checkpoint_step
    if not PROGRESS["method"]:
        return "before the first method started"
    step = checkpoint_step(os.path.join(run_dir, PROGRESS["method"], "checkpoint"))
    return f"in method {PROGRESS['method']} at iteration {step or 0} (its last checkpoint)"
