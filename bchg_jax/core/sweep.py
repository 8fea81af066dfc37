"""Seeds x hyperparameter grids as one compiled program.

A grid of G hyperparameter points and N seeds is flattened into R = G*N independent runs and
``vmap``ped; hparams are traced arrays, so a new grid value never retraces, also in a later
``run_grid`` call with the same trainer and grid size (:func:`grid_functions` keeps its
compiled functions on the trainer). ``run_grid`` drives
the program in jitted chunks of ``chunk`` iterations (progress, per-chunk results and
checkpoints between chunks; nothing inside a chunk syncs with the host). With ``shard=True`` the
run axis is split over all devices with ``jax.shard_map`` (each device advances its own runs; a
vmapped ``while_loop`` freezes converged lanes, so a run's result does not depend on which runs
share its device, up to float rounding). Multi-host: call ``jax.distributed.initialize()`` in
every process first; ``jax.devices()`` then lists every host's devices, each process feeds its
own shards (``to_global``) and gathers the results (``to_host``), so every process holds the
whole grid.
"""

from __future__ import annotations

import itertools
import sys
import time
from typing import Callable, Dict, Optional, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import NamedSharding, PartitionSpec

from bchg_jax.core.health import health_text, health_warning, solver_health
from bchg_jax.core.hparams import check_distinct_points
from bchg_jax.core.loop import Trainer
from bchg_jax.core.validate import is_concrete

Array = jax.Array


#: seeds and seed indices are in [0, SEED_LIMIT): ``jax.random.key`` and ``fold_in`` read them
#: as 32-bit words, so a larger one was another's (base seed 2**32 + 1 gave base seed 1's keys
#: with jax_enable_x64 off, other keys with it on; seed index 2**32 was index 0) and a negative
#: base seed gave other keys with x64 on than off
SEED_LIMIT = 2**32


def _check_seed_value(name: str, value) -> None:
    """``value`` (a base seed or a seed index: an int or a 0-d integer array) is an integer in
    [0, :data:`SEED_LIMIT`); a traced value is not checked."""
    if isinstance(value, jax.core.Tracer):
        return
    v = np.asarray(value)
    integer = v.ndim == 0 and np.issubdtype(v.dtype, np.integer) and v.dtype != bool
    if not integer or not 0 <= int(v) < SEED_LIMIT:
        raise ValueError(
            f"{name} must be an integer in [0, 2**32 - 1], got {value!r}: JAX's PRNG reads "
            "seeds as 32-bit words, so a larger or negative one would give another seed's keys "
            "(or keys that change with jax_enable_x64)"
        )


def seed_keys(seeds: Sequence[int] | int, base_seed: int = 0) -> Array:
    """Typed keys, one per seed index: fold_in(key(base_seed), i).

    Args:
      seeds: N (seed indices 0..N-1) or a sequence of seed indices, each in [0, 2**32).
      base_seed: seed of the base key, an integer in [0, 2**32).
    Returns:
      [N] typed PRNG keys.
    Raises:
      ValueError: no seed, a bool, a negative count, seed indices that are not integers (a
        float was truncated) or that repeat (two runs would be one, and their spread would
        understate the standard error), or a base seed or seed index outside [0, 2**32) (JAX
        reads them as 32-bit words: base seed 2**32 + 1 was base seed 1, index 2**32 was 0).
    """
    _check_seed_value("base_seed", base_seed)
    if isinstance(seeds, (bool, np.bool_)):
        raise ValueError(f"seeds must be a count or a sequence of seed indices, got {seeds!r}")
    if isinstance(seeds, (int, np.integer)):
        if seeds < 0:
            raise ValueError(f"seeds must be >= 1, got {seeds}")
        idx = jnp.arange(seeds)
    else:
        given = np.asarray(seeds)
        if given.size and (
            given.dtype == bool or not np.issubdtype(given.dtype, np.integer) or given.ndim != 1
        ):
            raise ValueError(
                f"seeds must be integer seed indices [N], got {given.dtype} of shape {given.shape}"
            )
        if given.size and (given.min() < 0 or given.max() >= SEED_LIMIT):
            bad = given[(given < 0) | (given >= SEED_LIMIT)][0]
            _check_seed_value("seed index", bad.item())
        if np.unique(given).size != given.size:
            raise ValueError(
                f"seed indices must be distinct, got {given.tolist()} (a repeated index is the "
                "same run twice)"
            )
        idx = jnp.asarray(given)
    if idx.size == 0:
        raise ValueError("at least one seed is required")
    return jax.vmap(lambda i: jax.random.fold_in(jax.random.key(base_seed), i))(idx)


def _seed_count(seeds) -> int:
    """N, the number of seeds per grid point of :func:`run_grid` / :func:`state_template`.

    Raises:
      ValueError: ``seeds`` not a positive int (a float such as 2.5 is refused, not truncated).
    """
    if isinstance(seeds, (bool, np.bool_)) or not isinstance(seeds, (int, np.integer)) or seeds < 1:
        raise ValueError(f"seeds must be a positive int (seeds per grid point), got {seeds!r}")
    return int(seeds)


def product_grid(**axes: Sequence[float]) -> Dict[str, np.ndarray]:
    """Cartesian product of named hyperparameter lists -> dict of flat arrays of length G.

    Args:
      **axes: name -> non-empty list of values (G = product of the lengths).
    Returns:
      name -> [G] float64 array (the last name varies fastest).
    Raises:
      ValueError: an axis that is not a list (a scalar), an empty axis, or one that repeats a
        value (the same runs twice; more runs of one setting are more seeds).
    """
    for name, values in axes.items():
        if np.ndim(values) != 1:  # len() of a scalar was a TypeError
            raise ValueError(
                f"hyperparameter grid axis {name!r} must be a list of values, got "
                f"{values!r}" + (f" (write {name}=[{values!r}])" if np.ndim(values) == 0 else "")
            )
        if len(values) == 0:
            raise ValueError(f"hyperparameter grid axis {name!r} is empty")
        flat = np.asarray(values).ravel()
        if len(np.unique(flat)) < len(flat):
            raise ValueError(
                f"hyperparameter grid axis {name!r} repeats a value ({list(flat)}): the same "
                "grid points would run twice; ask for more seeds instead"
            )
    names = list(axes)
    rows = list(itertools.product(*(axes[n] for n in names)))
    return {n: np.asarray([r[i] for r in rows], np.float64) for i, n in enumerate(names)}


def grid_hparams(trainer: Trainer, grid: Dict[str, np.ndarray]):
    """The trainer's typed HParams (leading axis G) of a grid dict, validated and cast.

    Args:
      trainer: a :class:`~bchg_jax.core.loop.Trainer`.
      grid: name -> [G] values or a scalar.
    Returns:
      the family's ``HParams``, every field a [G] array.
    """
    return trainer.hparams(grid)


def _refuse_unread_axes(trainer: Trainer, grid: Dict[str, np.ndarray]) -> None:
    """A grid axis of several values that the trainer's method never reads
    (``Trainer.unread``) is refused: its points would be the same runs, reported as if the
    setting had been compared."""
    for name in getattr(trainer, "unread", ()):
        if name in grid and len(np.unique(np.asarray(grid[name], np.float64).ravel())) > 1:
            raise ValueError(
                f"the grid varies {name}, which {trainer.method} never reads: its grid points "
                f"would be the same runs; give {name} one value (or leave it out)"
            )


def grid_functions(trainer: Trainer):
    """(init, run): jitted functions over [G] hparams x [N] keys; state leaves are [G, N, ...].

    The same functions for every call with one trainer (kept as an attribute of ``trainer.run``
    where it takes one): a second grid of the same size compiles nothing.

    Args:
      trainer: a :class:`~bchg_jax.core.loop.Trainer`.
    Returns:
      (init, run): ``init(keys [N], hp [G]) -> state [G, N, ...]`` and
      ``run(state [G, N, ...], hp [G], n) -> (state, metrics [G, N, n, ...])`` (``n`` static).
    """
    return _kept(trainer)[0]


def _kept(trainer: Trainer):
    """((init, run) of :func:`grid_functions`, the set of program shapes they have run): made
    once per trainer and kept as an attribute of ``trainer.run`` (a reference cycle through it,
    collected with it), or made afresh where ``run`` takes no attributes."""
    kept = getattr(trainer.run, "_bchg_grid_functions", None)
    if kept is not None and kept[0] is trainer.init:
        return kept[1]
    init = jax.jit(jax.vmap(jax.vmap(trainer.init, (0, None)), (None, 0)))
    run = jax.jit(jax.vmap(jax.vmap(trainer.run, (0, None, None)), (0, 0, None)), static_argnums=2)
    made = ((init, run), set())
    try:
        trainer.run._bchg_grid_functions = (trainer.init, made)
    except AttributeError:  # a run function of the user's that takes no attributes
        pass
    return made


def _flat(tree, G, N):
    return jax.tree.map(lambda x: x.reshape((G * N,) + x.shape[2:]), tree)


def _unflat(tree, G, N):
    return jax.tree.map(lambda x: x.reshape((G, N) + x.shape[1:]), tree)


def sharded_run(trainer: Trainer, devices=None):
    """run(state, hp, n) over R runs (leading axis), split over ``devices`` with shard_map.

    R must be a multiple of the number of devices (``run_grid`` pads).

    Args:
      trainer: a :class:`~bchg_jax.core.loop.Trainer`.
      devices: the devices of the 1-D mesh, or None for ``jax.devices()``.
    Returns:
      (run, sharding, D): jitted ``run(state [R, ...], hp [R], n) -> (state [R, ...],
      metrics [R, n, ...])`` (``n`` static), the ``NamedSharding`` of the run axis, and the
      number of devices D.
    """
    devices = jax.devices() if devices is None else devices
    mesh = jax.sharding.Mesh(np.asarray(devices), ("runs",))
    spec = PartitionSpec("runs")
    runs = jax.vmap(trainer.run, (0, 0, None))

    def run(state, hp, n):
        f = jax.shard_map(
            lambda s, h: runs(s, h, n),
            mesh=mesh,
            in_specs=(spec, spec),
            out_specs=(spec, spec),
            check_vma=False,
        )
        return f(state, hp)

    return jax.jit(run, static_argnums=2), NamedSharding(mesh, spec), len(devices)


def differing_processes(data: bytes) -> list:
    """The JAX processes whose ``data`` differs from process 0's (compared by SHA-256 digest,
    gathered from every process; every process must call this): ``[]`` when all agree or
    there is one process. What ``--distributed`` runs and :func:`run_grid` check their
    settings with."""
    if jax.process_count() == 1:
        return []
    import hashlib

    from jax.experimental import multihost_utils

    mine = np.frombuffer(hashlib.sha256(data).digest()[:16], dtype=np.uint32).copy()
    every = np.asarray(multihost_utils.process_allgather(mine)).reshape(-1, mine.size)
    return [i for i in range(len(every)) if not np.array_equal(every[i], every[0])]


def _check_same_grid_on_every_process(hp, *ints) -> None:
    """With several JAX processes, every one must shard the same grid (each computes its runs of
    it and gathers the others'): the grid's values and ``ints`` (seeds, iterations, ...) are
    compared (:func:`differing_processes`); a difference raises ValueError on each."""
    data = repr(ints).encode()
    for x in jax.tree.leaves(hp):
        x = np.asarray(x)
        data += f"{x.dtype}{x.shape}".encode() + np.ascontiguousarray(x).tobytes()
    other = differing_processes(data)
    if other:
        raise ValueError(
            f"run_grid(shard=True): process(es) {other} of {jax.process_count()} were given "
            "another grid, seeds, iterations, start, chunk or base_seed than process 0; every "
            "process must run the same grid"
        )


def to_global(tree, sharding):
    """Host (or fully replicated) arrays -> arrays laid out by ``sharding`` over every device of
    every process; each process supplies only its addressable shards (works multi-host).

    Args:
      tree: pytree of arrays with a leading run axis [R, ...] (typed PRNG keys allowed).
      sharding: e.g. the ``NamedSharding`` of :func:`sharded_run`.
    Returns:
      the same pytree of global ``jax.Array`` s, shapes unchanged.
    """

    def put(x):
        if jax.dtypes.issubdtype(x.dtype, jax.dtypes.prng_key):
            impl = jax.random.key_impl(x)
            return jax.random.wrap_key_data(put(jax.random.key_data(x)), impl=impl)
        x = np.asarray(x)
        return jax.make_array_from_callback(x.shape, sharding, lambda idx: x[idx])

    return jax.tree.map(put, tree)


def to_host(tree):
    """Arrays -> host numpy arrays holding every run; with several processes the shards are
    all-gathered so that every process sees the whole grid (typed PRNG keys are kept).

    Args:
      tree: pytree of (possibly sharded) arrays.
    Returns:
      the same pytree of numpy arrays (typed keys stay typed ``jax`` keys), shapes unchanged.
    """

    def get(x):
        if jax.dtypes.issubdtype(x.dtype, jax.dtypes.prng_key):
            impl = jax.random.key_impl(x)
            return jax.random.wrap_key_data(jnp.asarray(get(jax.random.key_data(x))), impl=impl)
        if isinstance(x, jax.Array) and not x.is_fully_addressable:
            from jax.experimental import multihost_utils

            return np.asarray(multihost_utils.process_allgather(x, tiled=True))
        return np.asarray(x)

    return jax.tree.map(get, tree)


def state_template(trainer: Trainer, grid: Dict[str, np.ndarray], seeds: int, base_seed: int = 0):
    """A grid's initial training state, the template that :func:`bchg_jax.core.io.load_state`
    needs as ``like`` (structure, shapes, dtypes and key implementation of every leaf; with
    ``grow=True`` also the values that complete a grown buffer).

    Restoring a run saved by ``run_grid(..., on_chunk=...)`` with ``io.save_state``::

        like = state_template(trainer, grid, seeds=10)
        state = io.load_state("run/checkpoint", like)
        done = int(np.asarray(state.step).reshape(-1)[0])
        run_grid(trainer, grid, 10, iterations, state=state, start=done, metrics=saved)

    Args:
      trainer, grid, seeds, base_seed: as :func:`run_grid`.
    Returns:
      the state of ``init`` (leaves [G, N, ...]), as ``run_grid`` starts from it.
    """
    init, _ = grid_functions(trainer)
    return init(seed_keys(_seed_count(seeds), base_seed), grid_hparams(trainer, grid))


def _check_continuation(state, start: int, metrics, G: int, N: int) -> None:
    """``run_grid``'s ``state``, ``start`` and ``metrics`` describe one point of one run."""
    if state is None:
        if start or metrics:
            raise ValueError(
                f"start={start} and metrics continue a run: pass its state too (without it the "
                "runs would start again from init)"
            )
        return
    for x in jax.tree.leaves(state):
        if tuple(np.shape(x))[:2] != (G, N):
            raise ValueError(
                f"state leaves must be [G, N, ...] = [{G}, {N}, ...] (grid points, seeds), got "
                f"{np.shape(x)}"
            )
    step = getattr(state, "step", None)
    readable = is_concrete(step) and getattr(step, "is_fully_addressable", True)
    if step is not None and readable and np.any(np.asarray(step) != start):
        raise ValueError(
            f"the state is at iteration {sorted(set(np.asarray(step).ravel().tolist()))}, "
            f"not start={start}: pass start=int(state.step.reshape(-1)[0]) and the metrics "
            "recorded up to it"
        )
    for k, v in (metrics or {}).items():
        if tuple(np.shape(v))[:3] != (G, N, start):
            raise ValueError(
                f"metrics[{k!r}] must be [G, N, start, ...] = [{G}, {N}, {start}, ...] (the "
                f"iterations already done), got {np.shape(v)}"
            )


def join_chunks(chunks):
    """Joins per-chunk metrics along the iteration axis (axis 2 of [G, N, iterations, ...]: a
    metric may carry trailing axes, e.g. a policy per iteration). A metric missing from a chunk
    (a run resumed from files saved before the trainer recorded it) is filled there: NaN for a
    float metric (not recorded; a 0 would be a made-up value on its curve), 0 for an integer
    or bool one (the health flags: not flagged)."""
    out = {}
    for name in dict.fromkeys(k for c in chunks for k in c):
        like = next(c[name] for c in chunks if name in c)
        fill = np.nan if np.issubdtype(like.dtype, np.inexact) else 0
        parts = []
        for c in chunks:
            length = next(iter(c.values())).shape[2]
            shape = like.shape[:2] + (length,) + like.shape[3:]
            parts.append(c[name] if name in c else np.full(shape, fill, like.dtype))
        out[name] = np.concatenate(parts, axis=2)
    return out


def run_grid(
    trainer: Trainer,
    grid: Dict[str, np.ndarray],
    seeds: int,
    iterations: int,
    chunk: int = 500,
    base_seed: int = 0,
    state=None,
    start: int = 0,
    metrics: Optional[Dict[str, np.ndarray]] = None,
    on_chunk: Optional[Callable] = None,
    verbose: bool = True,
    shard: bool = False,
    window: int = 1000,
):
    """Runs every (grid point, seed) up to ``iterations`` outer iterations -> (state, metrics).

    ``metrics`` is a dict of numpy arrays shaped [G, N, iterations, ...]. To continue a stopped run,
    pass its ``state`` (leaves [G, N, ...]), the iterations already done as ``start`` and the
    metrics recorded so far. ``on_chunk(state, metrics_so_far, done)`` is called after every chunk
    (e.g. to write results and a checkpoint). ``shard=True`` splits the runs over all devices.

    Args:
      trainer: a :class:`~bchg_jax.core.loop.Trainer` (its metrics must include ``J``).
      grid: name -> [G] values (G is taken from the first entry) or a scalar.
      seeds: N, the number of seeds per grid point.
      iterations: total outer iterations per run.
      chunk: iterations per jitted call (between host syncs).
      base_seed: base of :func:`seed_keys`.
      state: state to continue (leaves [G, N, ...]), or None to ``init``.
      start: iterations already done (in [0, iterations]).
      metrics: metrics recorded so far (name -> [G, N, start, ...]), or None.
      on_chunk: optional ``on_chunk(state, metrics, done)`` callback.
      verbose: print :func:`progress_line` after every chunk.
      shard: split the G*N runs over all devices (:func:`sharded_run`).
      window: iterations averaged in the progress line's running mean (the experiment's
        summary window).
    Returns:
      (state, metrics): state leaves [G, N, ...]; metrics name -> numpy [G, N, iterations, ...]
      ([G, N, iterations - start, ...] when continuing without ``metrics``: with nothing left to
      run, ``start == iterations``, every metric the trainer records, of length 0).
    Raises:
      ValueError: ``seeds`` not a positive int, ``chunk``, ``iterations`` or ``window`` < 1,
        a grid axis of several values the method never reads (``Trainer.unread``), two grid
        points of one setting in the trainer's dtype
        (:func:`~bchg_jax.core.hparams.check_distinct_points`), ``start`` out of range, or a
        continuation whose pieces disagree: ``start`` > 0 without the
        ``state``, a ``state`` not [G, N, ...] or whose ``step`` is not ``start`` in every run,
        ``metrics`` not [G, N, start, ...] (each would silently give a curve of another
        length or another run's); with ``shard=True`` over several processes, a process given
        another grid, ``seeds``, ``iterations``, ``start``, ``chunk`` or ``base_seed`` than
        process 0 (on every process); ``iterations`` above the trainer's
        ``config.iteration_limit()`` where it has one (a game trainer's off-policy buffer or
        cosine learning rate, sized by ``config.iterations``: the runs would silently change
        past it).
    """
    N = _seed_count(seeds)
    if chunk < 1 or iterations < 1:
        raise ValueError("chunk and iterations must be >= 1")
    _check_window(window)  # before anything compiles, not at the first progress line
    if not 0 <= start <= iterations:
        raise ValueError(f"start must be in [0, iterations], got {start}")
    limit = getattr(trainer.config, "iteration_limit", None)
    limit = limit() if callable(limit) else None
    if limit is not None and iterations > limit:
        raise ValueError(
            f"run_grid(iterations={iterations}): this trainer was made for {limit} iterations "
            "and its state or schedule is sized by them (an off-policy buffer, a cosine "
            f"learning rate), so the runs would change past iteration {limit}; make the "
            f"trainer with iterations={iterations} (a checkpoint of the shorter run loads "
            "into it with load_state(..., grow=True))"
        )
    _refuse_unread_axes(trainer, grid)
    hp = grid_hparams(trainer, grid)
    check_distinct_points(hp)
    G = int(jax.tree.leaves(hp)[0].shape[0])  # grid points (from the HParams)
    _check_continuation(state, start, metrics, G, N)
    (init, run), compiled = _kept(trainer)  # compiled: program shapes run so far (not re-marked)
    plain_run = run
    if shard:
        compiled = set()  # the sharded program is made per call
    if state is None:
        state = init(seed_keys(N, base_seed), hp)
    if shard:
        _check_same_grid_on_every_process(hp, N, iterations, start, chunk, base_seed)
        run_sharded, sharding, D = sharded_run(trainer)
        R = G * N
        pad = (-R) % D
        hp_runs = jax.tree.map(lambda x: jnp.repeat(x, N), hp)

        def padded(tree):
            # filler runs (copies of run 0) make R a multiple of the device count; dropped after
            return jax.tree.map(
                lambda x: jnp.concatenate([x, jnp.repeat(x[:1], pad, axis=0)]) if pad else x, tree
            )

        hp_runs = to_global(padded(hp_runs), sharding)

        def run(state, _hp, n):
            s, m = run_sharded(to_global(padded(_flat(to_host(state), G, N)), sharding), hp_runs, n)
            s, m = to_host(s), to_host(m)  # every process gets every run (multi-host)
            trim = lambda t: _unflat(jax.tree.map(lambda x: x[:R], t), G, N)  # noqa: E731
            return trim(s), trim(m)

    chunks = [metrics] if metrics else []  # {}: no earlier metrics, as None
    done, t0, warned = start, time.perf_counter(), False
    while done < iterations:
        n = min(chunk, iterations - done)
        tc = time.perf_counter()
        state, m = run(state, hp, n)
        chunks.append(jax.tree.map(np.asarray, m))  # host copy once per chunk (the only sync)
        dt = time.perf_counter() - tc
        first = (G, N, n) not in compiled  # a new shape (a shorter last chunk) compiles
        compiled.add((G, N, n))
        done += n
        metrics = join_chunks(chunks)
        chunks = [metrics]
        health = solver_health(metrics)
        if verbose:
            print(
                progress_line(
                    metrics["J"],
                    done,
                    iterations,
                    n,
                    dt,
                    first,
                    time.perf_counter() - t0,
                    window,
                    health,
                ),
                flush=True,
            )
            warning = health_warning(health)
            if warning and not warned:  # once per call, on stderr: loud, not repeated
                print(warning, file=sys.stderr, flush=True)
                warned = True
        if on_chunk is not None:
            on_chunk(state, metrics, done)
    if not metrics:  # nothing left to run (start == iterations) and no metrics given
        metrics = _empty_metrics(plain_run, state, hp, G, N)
    return state, metrics


def _empty_metrics(run, state, hp, G: int, N: int) -> Dict[str, np.ndarray]:
    """name -> [G, N, 0, ...] zeros of every metric ``run`` records (its shapes and dtypes are
    traced, nothing is compiled or run)."""
    _, shapes = jax.eval_shape(lambda s, h: run(s, h, 1), state, hp)
    return {k: np.zeros((G, N, 0) + tuple(v.shape[3:]), v.dtype) for k, v in shapes.items()}


def _rate(x: float) -> str:
    """A rate in 9 characters: whole numbers from 100 up, three significant digits below (a
    slow run's 0.4 run-it/s is not shown as 0)."""
    return f"{x:9.0f}" if x >= 100 else f"{x:9.3g}"


def _check_window(window) -> None:
    """``window`` (iterations of a running mean) is an int >= 1: ``J[..., -0:]`` is the whole
    run, so a window of 0 gave the mean since iteration 1 labelled "last 0 it"."""
    if isinstance(window, bool) or not isinstance(window, (int, np.integer)) or window < 1:
        raise ValueError(f"window must be an int >= 1 (iterations of the mean), got {window!r}")


def progress_line(
    J: np.ndarray,
    done: int,
    iterations: int,
    n: int,
    seconds: float,
    includes_compile: bool,
    elapsed: float,
    window: int = 1000,
    health: Optional[Dict[str, float]] = None,
) -> str:
    """One line per chunk: iterations/s (and run-iterations/s over the G x N vmapped runs) and
    the objective of the best grid point: ``J`` at the last iteration and its mean over the last
    ``window`` iterations (fewer while the run is shorter), both averaged over the N seeds; the
    best grid point is the one with the highest windowed mean (the summary's choice). Computed
    on the host from the chunk's metrics (no sync in the scan).

    Args:
      J: [G, N, t] leader objective recorded so far.
      done: iterations done.
      iterations: total iterations.
      n: iterations of the last chunk.
      seconds: wall time of the last chunk.
      includes_compile: the chunk's time includes compilation.
      elapsed: wall time since the start.
      window: iterations of the running mean (the experiment's summary window), >= 1.
      health: :func:`~bchg_jax.core.health.solver_health` of the metrics so far, or None; its
        share of capped solves and count of skipped updates end the line.
    Returns:
      the progress line (str).
    Raises:
      ValueError: ``window`` not an int >= 1.
    """
    _check_window(window)
    G, N = J.shape[0], J.shape[1]
    w = min(window, J.shape[-1])
    recent = J[..., -w:].mean(-1).mean(-1)  # [G]
    # a diverged (NaN) grid point is never the best, as in the summary (experiments.summary)
    best = int(np.argmax(np.where(np.isfinite(recent), recent, -np.inf)))
    rate = n / max(seconds, 1e-9)
    note = " incl. compile" if includes_compile else ""
    where = f"grid point {best}, " if G > 1 else ""
    return (
        f"  iter {done:6d}/{iterations}  {rate:8.1f} it/s ({_rate(rate * G * N)} run-it/s"
        f"{note})  J ({where}mean of {N} seed{'s' * (N > 1)}): now {J[best, :, -1].mean():+.4f}"
        f", last {w} it {recent[best]:+.4f}  elapsed {elapsed:7.1f}s"
        + (f"  {health_text(health)}" if health else "")
    )
