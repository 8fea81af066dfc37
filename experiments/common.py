"""Shared driver of the experiment CLIs: the common flags, run folders, per-chunk results,
resume, summaries (the experiments are described in ``docs/experiments.md``).

A run folder holds ``config.json`` and one sub-folder per method with ``config.json``,
``metrics.npz`` (rewritten atomically after every chunk) and ``checkpoint/<iteration>/`` (an
orbax checkpoint folder of the whole training state, saved atomically after every chunk and
removed when the method completes), ``summary.csv`` and ``curve.png``. With several
methods the folder also gets ``summary.csv`` (best grid point per method) and ``figure.png``.
A method whose metrics are complete is skipped, one with a checkpoint resumes from it.
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import sys
import time
from typing import Callable, Dict, Optional, Sequence, Tuple

import numpy as np


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


def run_method_folder(out: str, method: str, trainer, grid: Dict[str, np.ndarray], a, *,
                      record: dict, title: str, window: int, ylabel: str,
                      describe: str) -> dict:
    """Trains (or resumes, or skips if complete) one method's grid in ``out``; returns a summary.

    ``a`` needs ``seeds``, ``seed``, ``iterations``, ``chunk`` and ``shard``.
    """
    import shutil

    from bchg_jax.core import io as bio
    from bchg_jax.core.io import checkpoint_exists, load_state, save_json, save_npz
    from bchg_jax.core.sweep import grid_functions, run_grid, seed_keys

    metrics_path, ckpt_path = os.path.join(out, "metrics.npz"), os.path.join(out, "checkpoint")
    state, start, metrics = None, 0, None
    if os.path.exists(metrics_path):
        data = dict(np.load(metrics_path))
        if data["J"].shape[-1] >= a.iterations:
            print(f"[{method}] complete in {out}; skipped")
            return finish_method(out, method, grid, data, window, title, ylabel, write=False)
        if checkpoint_exists(ckpt_path):
            init, _ = grid_functions(trainer)
            like = init(seed_keys(a.seeds, a.seed), _hparams(trainer, grid))
            state = load_state(ckpt_path, like)
            start = int(np.asarray(state.step).reshape(-1)[0])
            metrics = {k: v[..., :start] for k, v in data.items()
                       if isinstance(v, np.ndarray) and v.ndim == 3}
            print(f"[{method}] resuming at iteration {start}")
    if state is None:
        save_json(os.path.join(out, "config.json"), {
            "method": method, "args": vars(a), **record,
            "grid": {k: np.asarray(v).tolist() for k, v in grid.items()},
            "num_grid_points": _num_points(grid)})
    print(f"[{method}] {describe} grid points={_num_points(grid)} seeds={a.seeds} "
          f"iterations={a.iterations} -> {out}", flush=True)

    def on_chunk(st, m, done):  # metrics first: a checkpoint never runs ahead of the metrics
        save_npz(metrics_path, {**m, **{f"grid_{k}": v for k, v in grid.items()},
                                "completed": np.asarray(done)})
        if done < a.iterations:
            bio.save_state(ckpt_path, st, done)

    t0 = time.perf_counter()
    _, metrics = run_grid(trainer, grid, a.seeds, a.iterations, a.chunk, a.seed, state=state,
                          start=start, metrics=metrics, on_chunk=on_chunk, shard=a.shard)
    wall = time.perf_counter() - t0
    if os.path.exists(ckpt_path):
        shutil.rmtree(ckpt_path)
    data = {**metrics, **{f"grid_{k}": v for k, v in grid.items()}}
    summary = finish_method(out, method, grid, data, window, title, ylabel, write=True)
    summary["wall_s"] = wall
    print(f"[{method}] wall time {wall:.1f}s")
    return summary


def _num_points(grid) -> int:
    return len(np.atleast_1d(next(iter(grid.values()))))


def _hparams(trainer, grid):
    from bchg_jax.core.sweep import grid_hparams
    return grid_hparams(trainer, grid)


def finish_method(out, method, grid, data, window, title, ylabel, write) -> dict:
    from bchg_jax.core.io import save_csv, save_figure, save_npz
    from experiments.plot import learning_curve_figure
    from experiments.summary import summarize
    J = data["J"]
    final, mean, se, best = summarize(J, window)
    keys = list(grid)
    if write:
        save_npz(os.path.join(out, "metrics.npz"), {
            **data, "final": final, "best_index": np.asarray(best),
            "summary_window": np.asarray(window), "completed": np.asarray(J.shape[-1])})
        rows = [tuple(float(grid[k][g]) for k in keys) + (f"{mean[g]:.4f}", f"{se[g]:.4f}",
                                                          int(g == best))
                for g in range(len(mean))]
        save_csv(os.path.join(out, "summary.csv"),
                 keys + [f"mean_last{window}", "se", "best"], rows)
        save_figure(os.path.join(out, "curve.png"), learning_curve_figure(
            {grid_label(method, grid, best): J[best]}, title, ylabel=ylabel))
        print(f"\n{'  '.join(f'{k:>11}' for k in keys)}  mean(last {window})      se")
        for g in np.argsort(-mean):
            mark = "  <- best" if g == best else ""
            print("  ".join(f"{grid[k][g]:11g}" for k in keys)
                  + f"  {mean[g]:+.4f}  {se[g]:.4f}{mark}")
    return {"method": method, **{k: float(grid[k][best]) for k in keys},
            "mean": float(mean[best]), "se": float(se[best])}


def resume_args(a, experiment: str):
    """For ``--resume DIR``: the saved arguments of DIR's run, with resume/shard kept."""
    cfg_path = os.path.join(a.resume, "config.json")
    if not os.path.exists(cfg_path):
        print(f"error: --resume {a.resume}: no config.json there", file=sys.stderr)
        raise SystemExit(2)
    cfg = json.load(open(cfg_path))
    if cfg.get("experiment", experiment) != experiment:
        print(f"error: --resume {a.resume} holds a {cfg['experiment']} run", file=sys.stderr)
        raise SystemExit(2)
    resume, shard, distributed = a.resume, a.shard, getattr(a, "distributed", False)
    a = argparse.Namespace(**{**vars(a), **cfg["args"]})
    a.resume, a.shard, a.out, a.exact_out = resume, shard, resume, True
    a.distributed = distributed
    return a


def prepare_run_dir(a, experiment: str, methods: Sequence[str], setting_keys: Sequence[str],
                    argv: Optional[Sequence[str]]) -> str:
    """Creates (or re-opens, to add methods) the run folder and writes its ``config.json``."""
    from bchg_jax.core.io import save_json
    stamp = datetime.datetime.now().strftime("%Y%m%d-%H%M%S")
    run_dir = a.out if a.exact_out else os.path.join(a.out, experiment, stamp)
    check_writable(run_dir)
    cfg_path = os.path.join(run_dir, "config.json")
    if a.resume is None:
        command = f"python -m experiments.{experiment} " + " ".join(
            argv if argv is not None else sys.argv[1:])
        all_methods = list(methods)
        if os.path.exists(cfg_path):  # adding methods to an existing run folder
            old = json.load(open(cfg_path))
            diff = [k for k in setting_keys if old["args"].get(k) != vars(a).get(k)]
            if diff:
                print(f"error: {run_dir} holds a run with other settings ({', '.join(diff)}); "
                      "use another --out", file=sys.stderr)
                raise SystemExit(2)
            all_methods = old["methods"] + [m for m in methods if m not in old["methods"]]
        save_json(cfg_path, {"experiment": experiment, "methods": all_methods,
                             "args": {**vars(a), "method": ",".join(all_methods)},
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


def finish_run(run_dir: str, summaries: Sequence[dict], window: int, extra_figures:
               Optional[Callable[[str], None]] = None) -> None:
    from bchg_jax.core.io import save_csv, save_figure
    from experiments.plot import panel_figure
    if len(summaries) > 1:
        keys = [k for k in summaries[0] if k not in ("method", "mean", "se", "wall_s")]
        save_csv(os.path.join(run_dir, "summary.csv"),
                 ["method"] + keys + [f"mean_last{window}", "se"],
                 [(s["method"],) + tuple(s[k] for k in keys) + (f"{s['mean']:.4f}", f"{s['se']:.4f}")
                  for s in summaries])
        save_figure(os.path.join(run_dir, "figure.png"), panel_figure([run_dir]))
    if extra_figures is not None:
        extra_figures(run_dir)
    print(f"\n{'method':>12}  best grid point                 mean(last {window})      se")
    for s in summaries:
        hp = " ".join(f"{k}={v:g}" for k, v in s.items()
                      if k not in ("method", "mean", "se", "wall_s"))
        print(f"{s['method']:>12}  {hp:30s}  {s['mean']:+.4f}  {s['se']:.4f}")
    print(f"\nresults in {run_dir}")


SMOKE_SEEDS = 2  # --smoke runs at most this many seeds


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
        a = super().parse_args(args, namespace)
        if a.smoke:
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
                   help="continue the stopped run in DIR with its saved settings: every method "
                        "restarts from its last orbax checkpoint DIR/<method>/checkpoint/"
                        "<iteration>/ (complete methods are skipped)")
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


def run_experiment(experiment: str, argv, parse_args: Callable, validate: Callable,
                   run_method: Callable, setting_keys: Sequence[str], window: int,
                   extra_figures: Optional[Callable[[str], None]] = None) -> str:
    """The main() of every experiment CLI: parse, resume, validate everything before anything
    compiles (bad input exits 2 with ``error: ...``), run each method, write the run summary."""
    a = parse_args(argv)
    if a.resume is not None:
        a = resume_args(a, experiment)
    if getattr(a, "distributed", False):
        _start_distributed(a)
    try:
        methods = validate(a)
    except ValueError as err:
        print(f"error: {err}", file=sys.stderr)
        raise SystemExit(2)
    run_dir = prepare_run_dir(a, experiment, methods, setting_keys, argv)
    summaries = [run_method(m, a, run_dir) for m in methods]
    finish_run(run_dir, summaries, window, extra_figures)
    return run_dir
