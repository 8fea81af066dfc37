"""The run folder of an experiment CLI: ``run_experiment`` (every CLI's main()), the folder and its
``config.json``, per-chunk results and checkpoints, resume / extend, Ctrl-C (the experiments:
``docs/experiments.md``; flags: ``experiments.cli``; summaries: ``experiments.report``).

A run folder holds ``config.json`` and one sub-folder per method with ``config.json``,
``metrics.npz`` (rewritten atomically after every chunk), ``metrics.jsonl`` (one line appended
per chunk) and ``checkpoint/<iteration>/`` (an orbax checkpoint folder of the whole training
state, saved atomically after every chunk; the last one is kept so that a finished run can be
extended: a run killed while writing it keeps the one before, an orbax ``*-tmp`` folder that the
next save removes, and an extension recomputes the chunk after it, to the same results),
``summary.csv`` and ``curve.png`` (written before the npz gets its ``final`` entry, which marks the
method complete: a kill while they are written leaves them to the resume); a resume removes the
temporary files of writes a kill cut short (``.tmp-*``). With several methods the folder also gets
``summary.csv`` (best grid point per method) and ``figure.png``. A method whose metrics are
complete is skipped, one with a checkpoint continues from it (``--resume``, also to a larger
``--iterations``); ``--config FILE`` repeats a saved run's settings.
"""

from __future__ import annotations

import contextlib
import datetime
import functools
import json
import os
import shlex
import signal
import sys
import threading
import time
from typing import Callable, Dict, Optional, Sequence

import numpy as np

from experiments import startup
from experiments.cli import (
    LEGACY_SETTINGS,
    check_base_seed,
    check_distinct_values,
    check_same_x64,
    fail,
    flag_names,
    jsonable,
    read_run_config,
    resume_args,
    same_methods,
    saved_args,
    use_dtype,
    with_legacy,
)
from experiments.report import finish_method, finish_run


def _interruptible(main: Callable) -> Callable:
    """Runs ``main`` inside :func:`interrupt_flag`; a Ctrl-C that ``main``'s own handler (the
    run folder's part) does not catch, i.e. one before any training, exits 130 too."""

    @functools.wraps(main)
    def wrapped(*args, **kw):
        PROGRESS.update(method=None, step=None)
        _DISTRIBUTED.clear()
        with interrupt_flag():
            try:
                if startup.held():  # a Ctrl-C while the command's imports ran
                    raise KeyboardInterrupt
                return main(*args, **kw)
            except KeyboardInterrupt:
                print("\ninterrupted before any training started", file=sys.stderr)
                _exit_at_once_if_program(130)
                raise SystemExit(130) from None

    return wrapped


@_interruptible
def run_experiment(
    experiment: str,
    argv,
    parse_args: Callable,
    validate: Callable,
    run_method: Callable,
    setting_keys: Sequence[str],
    window: int,
    extra_figures: Optional[Callable[[str], None]] = None,
    config_flags: Optional[Dict[str, str]] = None,
) -> str:
    """The main() of every experiment CLI: parse, resume, validate everything before anything
    compiles (bad input exits 2 with ``error: ...``, the library's config fields named as the
    flags that set them: ``config_flags``, see :func:`experiments.cli.flag_names`), run each
    method, write the run summary. Ctrl-C exits 130 with the iteration of the last checkpoint
    and the command to resume (before any training: with a line that says so)."""
    a = parse_args(argv)
    if a.resume is not None:
        a = resume_args(a, experiment)
    use_dtype(a.dtype)
    if getattr(a, "distributed", False):
        _start_distributed(a)
    try:
        if a.resume is None:  # a run saved before the check continues as it was
            check_distinct_values(a)
            check_base_seed(a)
        methods = validate(a)
    except ValueError as err:
        fail(flag_names(str(err), a, config_flags))
    same_methods(a, validate, methods)
    if getattr(a, "distributed", False):
        _check_same_settings(a, methods)
    run_dir = prepare_run_dir(a, experiment, methods, setting_keys, argv)
    scratch = getattr(a, "_scratch", None)  # a --distributed process other than 0
    shown = run_dir if scratch is None else a._shared_out
    if getattr(a, "distributed", False):
        import jax

        print(
            f"distributed run, process {jax.process_index()} of {jax.process_count()}: if any "
            "process stops, the others abort (JAX's coordination service); every finished chunk "
            f"is saved by process 0. Go on by starting every process with --resume {shown}",
            file=sys.stderr,
            flush=True,
        )
    try:
        check_interrupt()  # a Ctrl-C Python dropped while the run started
        summaries = []
        for m in methods:
            summaries.append(run_method(m, a, run_dir))
            check_interrupt()
        try:
            with deferred_interrupt():
                finish_run(
                    run_dir, summaries, window, extra_figures, a.iterations, experiment, shown
                )
        except KeyboardInterrupt:  # held until the summary was complete: nothing to resume
            print(
                "\nCtrl-C came while the run's summary was written; it waited for the summary, "
                "and the run is complete",
                file=sys.stderr,
            )
    except KeyboardInterrupt:
        print(
            f"\ninterrupted {_where(run_dir)}; nothing saved is lost. Resume with:\n"
            f"  python -m experiments.{experiment} --resume {shlex.quote(shown)}",
            file=sys.stderr,
        )
        _remove_scratch(scratch)
        _exit_at_once_if_program(130)
        raise SystemExit(130) from None
    except OSError as err:  # a full disk, a folder made read-only: stop, say how to go on
        print(
            f"\nerror: could not write the results {_where(run_dir)}: {err}\n"
            "Every file written before is complete (atomic writes). Fix the cause, then "
            f"resume with:\n  python -m experiments.{experiment} --resume {shlex.quote(shown)}",
            file=sys.stderr,
        )
        raise SystemExit(1) from None
    finally:
        _remove_scratch(scratch)
    return shown


def _remove_scratch(scratch: Optional[str]) -> None:
    """Deletes the temporary run folder of a ``--distributed`` process other than 0."""
    if scratch is not None:
        import shutil

        shutil.rmtree(scratch, ignore_errors=True)


def _exit_at_once_if_program(code: int) -> None:
    """Run as ``python -m experiments.<name>``: exits with ``code`` now, skipping the interpreter's
    shutdown, which can crash (SIGSEGV, status 139) while XLA still compiles or runs on its own
    threads after a Ctrl-C. Nothing is lost: writes hold Ctrl-C back until they are complete.
    Called in-process (tests, notebooks): returns, and the caller raises ``SystemExit``."""
    spec = getattr(sys.modules.get("__main__"), "__spec__", None)
    if spec is not None and spec.name.startswith("experiments."):
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)


def _start_distributed(a) -> None:
    """``--distributed``: joins the JAX processes (the coordinator from the cluster, or from
    ``JAX_COORDINATOR_ADDRESS``, ``JAX_NUM_PROCESSES`` and ``JAX_PROCESS_ID``), shards the runs
    over every process's devices, and lets process 0 alone write the run folder. The others
    write to a temporary folder, starting from a copy of the run folder when there is one
    (``--resume``, or methods added with ``--exact-out``; a filesystem every host sees), so that
    every process skips, resumes and trains the same methods from the same checkpoints; that
    folder is deleted when the run ends."""
    import atexit
    import shutil
    import tempfile

    import jax

    env = {
        "coordinator_address": os.environ.get("JAX_COORDINATOR_ADDRESS"),
        "num_processes": os.environ.get("JAX_NUM_PROCESSES"),
        "process_id": os.environ.get("JAX_PROCESS_ID"),
    }
    try:  # (jax 0.10 reads none of these variables itself)
        kw = {
            k: (v if k == "coordinator_address" else int(v))
            for k, v in env.items()
            if v is not None
        }
        jax.distributed.initialize(**kw)
    except (ValueError, RuntimeError) as err:
        fail(
            f"--distributed: jax.distributed.initialize() failed ({err}); run under a cluster "
            "JAX detects (SLURM, TPU pods, ...) or set JAX_COORDINATOR_ADDRESS=host0:port, "
            "JAX_NUM_PROCESSES and JAX_PROCESS_ID on every host"
        )
    a.shard = True
    _DISTRIBUTED.set()  # Ctrl-C: every process stops after the same chunk (check_interrupt)
    a._given_out = (a.out, a.exact_out, a.resume)  # compared across processes
    if jax.process_index() != 0:  # the others compute their shards, write nothing shared
        tmp = tempfile.mkdtemp(prefix=f"bchg-p{jax.process_index()}-")
        if a.exact_out and os.path.isdir(a.out):
            shutil.copytree(a.out, tmp, dirs_exist_ok=True)
        a._shared_out = a.out if a.exact_out else "<the folder process 0 names>"
        a._scratch = tmp  # deleted when the run ends (run_experiment), or at exit
        atexit.register(_remove_scratch, tmp)
        a.out, a.exact_out = tmp, True
        if a.resume is not None:
            a.resume = tmp


#: Arguments that may differ between the processes of one ``--distributed`` run (how the
#: settings were given); every other one must be the same on every process, the run folder
#: (``--out``, ``--exact-out``, ``--resume``) as given on the command line.
PER_PROCESS_ARGS = ("out", "exact_out", "resume", "config", "distributed", "shard")


def settings_text(a, methods: Sequence[str]) -> str:
    """The settings of a run (its methods, every argument but :data:`PER_PROCESS_ARGS`, and the
    run folder given) as JSON text: what the processes of a ``--distributed`` run compare."""
    settings = {k: v for k, v in saved_args(a).items() if k not in PER_PROCESS_ARGS}
    settings["run_folder"] = getattr(a, "_given_out", (a.out, a.exact_out, a.resume))
    return json.dumps({"methods": list(methods), **jsonable(settings)}, sort_keys=True)


def _check_same_settings(a, methods: Sequence[str]) -> None:
    """``--distributed``: every process must run the same methods with the same settings (each
    computes its shard of one grid; process 0 writes them all under its own settings). Compares
    :func:`settings_text` across the processes (``sweep.differing_processes``) and exits 2 on
    each when any differs, naming the processes, before anything compiles."""
    import jax

    from bchg_jax.core.sweep import differing_processes

    other = differing_processes(settings_text(a, methods).encode())
    if other:
        many = len(other) > 1
        fail(
            f"--distributed: process{'es' if many else ''} {', '.join(map(str, other))} of "
            f"{jax.process_count()} {'were' if many else 'was'} given other settings than "
            f"process 0 (this is process {jax.process_index()}); "
            "start every process with the same flags and the same --out (a folder every "
            "process sees); only --config may differ"
        )


def _where(run_dir: str) -> str:
    """Where a stopped run stands: the method and the iteration of its last checkpoint (as
    recorded when it was saved or loaded: opening the checkpoint folder again is a collective
    of every process in a ``--distributed`` run, which a stopping process must not start, and
    the scratch folder of a process other than 0 holds no finalised step)."""
    if not PROGRESS["method"]:
        return "before the first method started"
    step = PROGRESS.get("step") or 0
    return f"in method {PROGRESS['method']} at iteration {step} (its last checkpoint)"


# what a run writes into its folder beside config.json and its methods' folders
RUN_FILES = ("summary.csv", "figure.png", "components.png")


def prepare_run_dir(
    a,
    experiment: str,
    methods: Sequence[str],
    setting_keys: Sequence[str],
    argv: Optional[Sequence[str]],
) -> str:
    """Creates (or re-opens: to add methods, or to resume) the run folder and writes its
    ``config.json``. A folder that holds another experiment's run or a method's results is
    refused, as is one whose run has other settings, and (``--exact-out``) one that holds no
    run but files the run would replace (a method's folder, :data:`RUN_FILES`)."""
    from bchg_jax.core.io import remove_unfinished_writes, save_json

    if a.exact_out:
        run_dir = a.out
        check_writable(run_dir)
    else:
        run_dir = new_stamped_dir(os.path.join(a.out, experiment))
    cfg_path = os.path.join(run_dir, "config.json")
    command = f"python -m experiments.{experiment} " + shlex.join(
        argv if argv is not None else sys.argv[1:]
    )
    args = saved_args(a)
    if a.resume is not None:  # settings checked by resume_args; --iterations may grow
        old = read_run_config(cfg_path, "--resume")
        remove_unfinished_writes(run_dir)  # of a run killed mid-write
        for method in methods:  # before the saved --iterations changes (a plain resume works)
            _refuse_if_not_extendable(os.path.join(run_dir, method), method, a.iterations)
        legacy = {k: args[k] for k in LEGACY_SETTINGS if k in args and k not in old["args"]}
        save_json(
            cfg_path,
            {
                **old,
                "args": {**old["args"], **legacy, "iterations": a.iterations},
                "resumed": old.get("resumed", []) + [{"command": command, **environment_record()}],
            },
        )
        return run_dir
    all_methods = list(methods)
    taken = [n for n in [*methods, *RUN_FILES] if os.path.exists(os.path.join(run_dir, n))]
    if a.exact_out and taken and not os.path.exists(cfg_path):
        # a folder of the user's (not a run: no config.json) whose files would be replaced
        fail(
            f"--out {run_dir} holds {', '.join(taken)} and no run (no config.json): the run "
            "would replace them; use another --out"
        )
    if os.path.exists(cfg_path):  # adding methods to an existing run folder
        old = read_run_config(cfg_path, "--out")
        if old.get("experiment") != experiment:
            what = (
                f"a {old['experiment']} run"
                if "experiment" in old
                else "one method's results of a run"
            )
            fail(f"--out {run_dir} holds {what}; use another --out")
        saved = with_legacy(old["args"], args)
        diff = [k for k in setting_keys if saved.get(k) != jsonable(args.get(k))]
        if diff:
            fail(
                f"{run_dir} holds a run with other settings ({', '.join(diff)}); use another --out"
            )
        # its stopped methods continue from their checkpoints here, as under --resume
        check_same_x64(old, run_dir, f"--out {run_dir} --exact-out")
        all_methods = old["methods"] + [m for m in methods if m not in old["methods"]]
        # the first command and its date stay; this one joins the list of later ones
        save_json(
            cfg_path,
            {
                **old,
                "methods": all_methods,
                "args": {**args, "method": ",".join(all_methods)},
                "resumed": old.get("resumed", []) + [{"command": command, **environment_record()}],
            },
        )
        return run_dir
    save_json(
        cfg_path,
        {
            "experiment": experiment,
            "methods": all_methods,
            "args": {**args, "method": ",".join(all_methods)},
            "command": command,
            **environment_record(),
        },
    )
    return run_dir


def _refuse_if_not_extendable(out: str, method: str, iterations: int) -> None:
    """Exits 2 if the method folder ``out`` completed fewer than ``iterations`` and keeps no
    checkpoint to continue from (a run finished before checkpoints were kept, or one deleted by
    hand). Checked for every method before ``--resume`` records a larger ``--iterations`` in the
    run's ``config.json``: a refused extension used to leave it recorded, and a plain
    ``--resume`` then asked for the same extension and was refused too. A folder that cannot be
    read is left to :func:`run_method_folder`, which names it."""
    from bchg_jax.core.io import checkpoint_exists

    path = os.path.join(out, "metrics.npz")
    if not os.path.exists(path) or checkpoint_exists(os.path.join(out, "checkpoint")):
        return
    try:
        with np.load(path) as data:
            done, final = np.shape(data["J"])[-1], "final" in data.files
    except Exception:  # noqa: BLE001 - reported with its advice when the method runs
        return
    if final and done < iterations:
        _refuse_extension(out, method, done, iterations)


def _refuse_extension(out: str, method: str, done: int, iterations: int) -> None:
    """Exits 2: ``out`` completed ``done`` < ``iterations`` iterations and has no checkpoint."""
    fail(
        f"{out} completed {done} iterations of {method} but holds no checkpoint to continue "
        f"from; start a new run with --iterations {iterations}"
    )


def new_stamped_dir(parent: str) -> str:
    """A new folder ``parent/<YYYYmmdd-HHMMSS>`` made exclusively (``-2``, ``-3``, ... appended
    when another run started in the same second), after :func:`check_writable` on ``parent``."""
    check_writable(parent)
    stamp = datetime.datetime.now().strftime("%Y%m%d-%H%M%S")
    for k in range(1, 1000):
        path = os.path.join(parent, stamp if k == 1 else f"{stamp}-{k}")
        try:
            os.mkdir(path)
            return path
        except FileExistsError:
            continue
    fail(f"--out {parent}: no free run folder name for {stamp}; use --exact-out")


def check_writable(run_dir: str) -> None:
    """Exits 2 with a clear error unless ``run_dir`` can be created and written (before any
    compilation; an existing folder's files are not touched), and its checkpoints read back
    (``bchg_jax.core.io.check_checkpoint_path``: no ``[...]`` or backslash in the path)."""
    import tempfile

    from bchg_jax.core.io import check_checkpoint_path

    try:
        check_checkpoint_path(run_dir)
    except ValueError as err:
        print(f"error: cannot keep resumable results in {run_dir!r}: {err}", file=sys.stderr)
        raise SystemExit(2) from None
    try:
        os.makedirs(run_dir, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=run_dir, prefix=".write-test-"):
            pass
    except OSError as err:
        print(f"error: cannot write results to {run_dir!r}: {err.strerror or err}", file=sys.stderr)
        raise SystemExit(2) from None


def environment_record() -> dict:
    """Library, JAX and device versions stored with every result."""
    import jax

    import bchg_jax

    return {
        "bchg_jax_version": bchg_jax.__version__,
        "jax_version": jax.__version__,
        "devices": [str(d) for d in jax.devices()],
        # a float32 run computes some scalars in float64 under x64 (optax Adam's bias
        # correction): a resume checks it, to continue bit for bit
        "jax_enable_x64": bool(jax.config.jax_enable_x64),
        "date": datetime.datetime.now().isoformat(timespec="seconds"),
    }


# the method being trained and the iteration of its last checkpoint, for the Ctrl-C message
PROGRESS = {"method": None, "step": None}


def run_method_folder(
    out: str,
    method: str,
    trainer,
    grid: Dict[str, np.ndarray],
    a,
    *,
    record: dict,
    title: str,
    window: int,
    ylabel: str,
    describe: str,
) -> dict:
    """Trains (or resumes, extends, or skips if complete) one method's grid in ``out``.

    ``a`` needs ``seeds``, ``seed``, ``iterations``, ``chunk`` and ``shard``. After every chunk
    ``metrics.npz`` and the orbax checkpoint ``checkpoint/<iteration>/`` are rewritten and one
    line is appended to ``metrics.jsonl``; the checkpoint of the last iteration is kept, so a
    later ``--resume DIR --iterations M`` continues from it. Returns the method's summary dict.
    A grid axis the method never reads (``trainer.unread``: the LQR game's ``critic_steps``
    for a method without a critic) is left out of the grid, and so of its tables, labels and
    files: the trainer takes its default, which changes nothing.
    """
    from bchg_jax.core import io as bio
    from bchg_jax.core.io import checkpoint_exists, load_state, save_json, save_npz
    from bchg_jax.core.sweep import run_grid, state_template

    read = {k: v for k, v in grid.items() if k not in getattr(trainer, "unread", ())}
    grid = read or grid  # a grid of nothing but unread axes is kept as it is
    metrics_path, ckpt_path = os.path.join(out, "metrics.npz"), os.path.join(out, "checkpoint")
    jsonl_path = os.path.join(out, "metrics.jsonl")
    state, start, metrics = None, 0, None
    PROGRESS.update(method=method, step=None)
    bio.remove_unfinished_writes(out)  # a run killed mid-write left its temporary file
    if os.path.exists(metrics_path):
        try:
            data = dict(np.load(metrics_path))
            shape = np.shape(data["J"])
        except Exception as err:  # noqa: BLE001 - any unreadable file gets the same advice
            fail(
                f"{metrics_path} cannot be read ({type(err).__name__}: {err}); the folder was "
                f"damaged: delete {out} to train {method} again from iteration 0"
            )
        runs = (_num_points(grid), a.seeds)
        if len(shape) < 3 or tuple(shape[:2]) != runs:
            fail(
                f"{metrics_path} holds J of shape {shape}, not [grid points, seeds, iterations] "
                f"= [{runs[0]}, {runs[1]}, ...] as the run's settings ask; was the folder edited "
                f"by hand? Delete {out} to train {method} again from iteration 0"
            )
        done = shape[-1]
        if done >= a.iterations:
            # a run stopped between its last chunk and its summary gets the summary now
            written = "final" in data and all(
                os.path.exists(os.path.join(out, f)) for f in ("summary.csv", "curve.png")
            )
            PROGRESS["step"] = done
            print(f"[{method}] complete in {out}; " + ("skipped" if written else "summarising"))
            with deferred_interrupt():
                return finish_method(
                    out, method, grid, data, window, title, ylabel, write=not written
                )
        if checkpoint_exists(ckpt_path):
            like = state_template(trainer, grid, a.seeds, a.seed)
            # grow=True: an off-policy episode buffer is sized by --iterations; extending a run
            # gives it empty slots at the end
            try:
                state = load_state(ckpt_path, like, grow=True)
            except ValueError as err:  # a damaged checkpoint, or one of other runs
                fail(f"{err}; delete {out} to train {method} again from iteration 0")
            start = int(np.asarray(state.step).reshape(-1)[0])
            PROGRESS["step"] = start
            if start > done:  # each chunk writes its metrics first: only a lost write (a
                # power cut before the folder's entries reached the disk) or an edit does this
                fail(
                    f"{ckpt_path} is at iteration {start} but {metrics_path} records only "
                    f"{done}: the iterations between have no metrics; delete {out} to train "
                    f"{method} again from iteration 0"
                )
            # per-iteration metrics are [G, N, iterations, ...] (some carry trailing axes)
            metrics = {
                k: v[:, :, :start]
                for k, v in data.items()
                if isinstance(v, np.ndarray) and v.ndim >= 3
            }
            verb = "extending" if "final" in data else "resuming"
            print(f"[{method}] {verb} at iteration {start} (to {a.iterations})")
        elif "final" in data:  # completed before checkpoints were kept: nothing to extend
            _refuse_extension(out, method, done, a.iterations)
        else:  # stopped before its first checkpoint was complete
            print(f"[{method}] no checkpoint in {out}; starting again from iteration 0")
    _truncate_jsonl(jsonl_path, start)
    save_json(
        os.path.join(out, "config.json"),
        {
            "method": method,
            "args": saved_args(a),
            **record,
            "grid": {k: np.asarray(v).tolist() for k, v in grid.items()},
            "num_grid_points": _num_points(grid),
        },
    )
    print(
        f"[{method}] {describe} grid points={_num_points(grid)} seeds={a.seeds} "
        f"iterations={a.iterations} -> {out}",
        flush=True,
    )
    clock = {"t": time.perf_counter(), "done": start}

    def on_chunk(st, m, done):  # metrics first: a checkpoint never runs ahead of the metrics
        with deferred_interrupt():  # Ctrl-C waits until the chunk's files are written
            save_npz(
                metrics_path,
                {
                    **m,
                    **{f"grid_{k}": v for k, v in grid.items()},
                    "completed": np.asarray(done),
                    # what experiments.plot judges an unfinished run over (as finish_method)
                    "summary_window": np.asarray(min(window, done)),
                },
            )
            now = time.perf_counter()
            _append_jsonl(
                jsonl_path, method, m, clock["done"], done, now - clock["t"], window, grid
            )
            clock.update(t=now, done=done)
            bio.save_state(ckpt_path, st, done)
            PROGRESS["step"] = done
        check_interrupt()  # a Ctrl-C Python dropped during the chunk stops the run here

    t0 = time.perf_counter()
    _, metrics = run_grid(
        trainer,
        grid,
        a.seeds,
        a.iterations,
        a.chunk,
        a.seed,
        state=state,
        start=start,
        metrics=metrics,
        on_chunk=on_chunk,
        shard=a.shard,
        window=window,
    )
    wall = time.perf_counter() - t0
    data = {**metrics, **{f"grid_{k}": v for k, v in grid.items()}}
    with deferred_interrupt():  # Ctrl-C waits until the summary's files are written
        summary = finish_method(out, method, grid, data, window, title, ylabel, write=True)
    summary["wall_s"] = wall
    print(f"[{method}] wall time {wall:.1f}s")
    return summary


_INTERRUPTED = threading.Event()
# set in a --distributed run: a Ctrl-C stops every process after the same chunk
_DISTRIBUTED = threading.Event()


@contextlib.contextmanager
def interrupt_flag():
    """Ctrl-C (SIGINT) inside the block raises ``KeyboardInterrupt`` as before and also sets a
    flag that :func:`check_interrupt` reads after every chunk's files and every method. Python
    drops an exception raised inside a garbage-collection callback ("Exception ignored in ...";
    JAX runs one that frees device buffers), so a Ctrl-C landing there was lost and the run
    trained to its end; the flag stops it at the next chunk instead. Outside the main thread,
    or where SIGINT has another handler (or is ignored, as in a shell's background job), it
    changes nothing."""
    _INTERRUPTED.clear()
    current = signal.getsignal(signal.SIGINT)
    if threading.current_thread() is not threading.main_thread() or not (
        current is signal.default_int_handler or startup.is_holding(current)
    ):
        yield
        return

    def on_sigint(signum, frame):
        again = _INTERRUPTED.is_set()
        _INTERRUPTED.set()
        if _DISTRIBUTED.is_set() and not again:
            # the others are in this chunk's collectives: stop with them after it
            print(
                "\nCtrl-C: every process stops after this chunk (Ctrl-C again stops this one "
                "at once, and JAX aborts the others)",
                file=sys.stderr,
                flush=True,
            )
            return
        raise KeyboardInterrupt

    signal.signal(signal.SIGINT, on_sigint)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, signal.default_int_handler)  # start-up is over


def check_interrupt() -> None:
    """Raises ``KeyboardInterrupt`` if a Ctrl-C arrived inside :func:`interrupt_flag` (also one
    whose own exception Python dropped). In a ``--distributed`` run, if one arrived in any
    process: the processes gather their flags (every process calls this at the same points),
    so all of them stop together; one process stopping alone left the others in a collective
    it never joined (gloo's "collective mismatch" abort, no resume line)."""
    stop = _INTERRUPTED.is_set()
    if _DISTRIBUTED.is_set():
        from jax.experimental import multihost_utils

        flags = multihost_utils.process_allgather(np.asarray([int(stop)], np.int32))
        stop = bool(np.any(np.asarray(flags)))
    if stop:
        _INTERRUPTED.set()
        raise KeyboardInterrupt


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
            if not _DISTRIBUTED.is_set():
                raise KeyboardInterrupt
            _INTERRUPTED.set()  # the next check_interrupt stops every process together


def _append_jsonl(
    path: str,
    method: str,
    m: Dict[str, np.ndarray],
    begin: int,
    done: int,
    seconds: float,
    window: int,
    grid: Dict[str, np.ndarray],
) -> None:
    """One JSON line per chunk: the grid's hyperparameters (``grid``: name -> one value per grid
    point, the order of every per-point list) and, for every scalar metric, the mean over seeds
    per grid point at the chunk's last iteration (``last``), over the chunk (``chunk_mean``) and
    over the summary window (``window_mean``). Appended and flushed, so ``tail -f`` shows a
    running job."""
    line = {
        "method": method,
        "iteration": int(done),
        "chunk_iterations": int(done - begin),
        "chunk_seconds": round(float(seconds), 4),
        "window": int(min(window, done)),
        "grid": {
            k: [x if np.isfinite(x) else None for x in np.atleast_1d(v).tolist()]
            if np.issubdtype(np.asarray(v).dtype, np.floating)
            else np.atleast_1d(v).tolist()
            for k, v in grid.items()
        },
        "metrics": {},
    }
    for k, v in m.items():
        if isinstance(v, np.ndarray) and v.ndim == 3:
            seed_mean = v.astype(np.float64).mean(axis=1)  # [G, t]
            line["metrics"][k] = {
                "last": _json_values(seed_mean[:, -1]),
                "chunk_mean": _json_values(seed_mean[:, begin:done].mean(-1)),
                "window_mean": _json_values(seed_mean[:, -min(window, done) :].mean(-1)),
            }
    with open(path, "a") as f:
        f.write(json.dumps(line, allow_nan=False) + "\n")
        f.flush()


def _json_values(x: np.ndarray) -> list:
    """Floats as JSON holds them: a non-finite mean (a diverged seed) is null; Python's NaN
    token is not JSON, and JSON.parse and other strict readers reject the whole line."""
    return [float(v) if np.isfinite(v) else None for v in x]


def _truncate_jsonl(path: str, start: int) -> None:
    """Drops the lines past iteration ``start`` (a chunk recorded after the last checkpoint is
    recomputed on resume); a fresh run (start 0) starts an empty file."""
    from bchg_jax.core.io import atomic_write_bytes

    if not os.path.exists(path):
        return
    keep = []
    with open(path) as f:
        for raw in f:
            try:
                if json.loads(raw)["iteration"] <= start:
                    keep.append(raw if raw.endswith("\n") else raw + "\n")
            except (ValueError, KeyError):  # a line cut by a kill: dropped
                pass
    atomic_write_bytes(path, "".join(keep).encode())


def _num_points(grid) -> int:
    return len(np.atleast_1d(next(iter(grid.values()))))
