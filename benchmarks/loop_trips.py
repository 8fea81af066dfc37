"""What one outer iteration is made of on an accelerator: the trips of its loops, counted.

    python -m benchmarks.loop_trips [--experiments fourrooms,thermal,toy_game,lqr_game]
        [--runs 1 240] [--warmup 200] [--iterations 20]

On a GPU, XLA runs a loop whose trip count it cannot know (a ``lax.while_loop`` with a
data-dependent test, a ``lax.fori_loop`` with traced bounds) by copying its predicate to the
host after every evaluation of the test, and a ``lax.cond`` by copying its predicate once per
call: at each such *host test* the host waits until the device has finished everything queued,
then launches what comes next. A ``lax.scan`` or a ``fori_loop`` with fixed bounds has a trip
count known to the compiler and runs its trips without reading anything back, but the kernels
of each trip still run one after another, each a launch of its own. So the time of one iteration
of a small problem (a few hundred states, a few runs) is set by these two counts, not by its
arithmetic; this tool measures them.

Each experiment's trainer is the one of :mod:`benchmarks.scaling` (``trainer_for``). While it is
traced, ``jax.lax.while_loop``, ``cond``, ``scan`` and ``fori_loop`` are wrapped so that every
evaluation of a loop test, every loop step and every ``cond`` call also calls a host callback
that counts it by call site (the innermost two frames inside ``bchg_jax``); the runs then train
``--warmup`` iterations and the counts of the next ``--iterations`` are divided by their number
(a ``while_loop``'s host tests: its trips plus one per run of the loop).
The counts are the program's, not the device's: the CPU gives the same ones as a GPU (up to the
sweeps of a solve, which move with float rounding). Not counted: loops inside library calls
(``jnp.linalg``, optax) and anything traced before the wrappers are in place. A ``cond`` whose
predicate is batched under ``vmap`` runs both branches as a ``select`` (no host test) and is
listed as such where the ``cond`` is called under the ``vmap`` itself; inside a loop body under
``vmap`` the predicate is not seen as batched and such a ``cond`` is listed as a host test (every
``cond`` of the library has a predicate shared by the lanes, a real host test). The wrappers
stay in place only inside :func:`counting`.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import datetime
import platform
import traceback
from typing import Dict, Tuple

import jax
import numpy as np

from bchg_jax.core.sweep import grid_functions, grid_hparams, seed_keys

# kinds of a counted site (the second field of a counter key)
HOST_TEST = "while: host test per trip"
TRACED_FORI = "fori, traced bounds: host test per trip"
COND = "cond: host test per call"
SELECT = "cond, batched: select, no host test"
FIXED = "scan / fixed fori: steps, no host test"


# frames of wrappers that say nothing of the loop's place (the loop helper, the precision scope)
_WRAPPERS = ("core/host_tests.py", "core/precision.py")


def _site() -> str:
    """The innermost two ``bchg_jax`` frames that called the wrapped function (wrappers
    skipped), innermost first."""
    frames = [
        f
        for f in traceback.extract_stack()[:-2]  # not this function, not the counting wrapper
        if "bchg_jax" in f.filename and not f.filename.endswith(_WRAPPERS)
    ]
    return " < ".join(f"{f.filename.split('bchg_jax/')[-1]}:{f.lineno}" for f in frames[::-1][:2])


def _batched(x) -> bool:
    """Whether ``x`` is batched by an enclosing ``vmap`` (a batch tracer with a mapped axis)."""
    from jax._src.interpreters import batching

    return isinstance(x, batching.BatchTracer) and x.batch_dim is not None


def _traced(x) -> bool:
    return isinstance(x, jax.core.Tracer)


@contextlib.contextmanager
def counting():
    """Wrap ``jax.lax``'s loops and ``cond`` (module docstring) while the block runs; yields the
    counter (``(site, kind) -> count``), which the host callbacks fill when the traced program
    runs, also after the block."""
    counts: collections.Counter = collections.Counter()
    lax = jax.lax
    saved = (lax.while_loop, lax.cond, lax.scan, lax.fori_loop)
    while_loop, cond, scan, fori_loop = saved

    def tick(key):
        jax.debug.callback(lambda: counts.update([key]))

    def counted_while(cond_fun, body_fun, init_val):
        # host tests = trips + 1 per run of the loop: counted in the body and before the loop,
        # not in ``cond_fun``, which a batched predicate under vmap also evaluates in the body
        key = (_site(), HOST_TEST)
        tick(key)

        def body(c):
            tick(key)
            return body_fun(c)

        return while_loop(cond_fun, body, init_val)

    def counted_cond(pred, true_fun, false_fun, *operands, **kw):
        tick((_site(), SELECT if _batched(pred) else COND))
        return cond(pred, true_fun, false_fun, *operands, **kw)

    def counted_scan(f, init, xs=None, length=None, **kw):
        key = (_site(), FIXED)

        def step(c, x):
            tick(key)
            return f(c, x)

        return scan(step, init, xs, length=length, **kw)

    def counted_fori(lower, upper, body_fun, init_val, **kw):
        traced = _traced(lower) or _traced(upper)
        key = (_site(), TRACED_FORI if traced else FIXED)
        if traced:
            tick(key)  # the test that ends the loop

        def body(i, c):
            tick(key)
            return body_fun(i, c)

        return fori_loop(lower, upper, body, init_val, **kw)

    lax.while_loop, lax.cond, lax.scan, lax.fori_loop = (
        counted_while,
        counted_cond,
        counted_scan,
        counted_fori,
    )
    try:
        yield counts
    finally:
        lax.while_loop, lax.cond, lax.scan, lax.fori_loop = saved


def count_trips(
    trainer, grid, runs: int, warmup: int, iterations: int
) -> Tuple[Dict[Tuple[str, str], float], Dict[str, np.ndarray]]:
    """``((site, kind) -> count per outer iteration, metrics of the counted iterations)`` of a
    trainer that has not been traced yet (a fresh one: one traced before would run uncounted).

    Args:
      trainer: a :class:`~bchg_jax.core.loop.Trainer`.
      grid: its one-point hyperparameter grid (name -> [1] values).
      runs: vmapped seeds.
      warmup: iterations trained first (the solvers' warm starts then are training's), in
        chunks of ``iterations`` (rounded up to a whole number of chunks).
      iterations: iterations counted (>= 1).
    """
    if iterations < 1 or warmup < 0:
        raise ValueError(f"iterations must be >= 1 and warmup >= 0, got {iterations}, {warmup}")
    with counting() as counts:  # every trace happens inside: the chunk length is static
        init, run = grid_functions(trainer)
        hp = grid_hparams(trainer, grid)
        state = init(seed_keys(runs), hp)
        for _ in range(-(-warmup // iterations)):
            state, _ = run(state, hp, iterations)
        jax.block_until_ready(state)
        jax.effects_barrier()
        counts.clear()
        state, m = run(state, hp, iterations)
        jax.block_until_ready(state)
        jax.effects_barrier()
    if not counts:  # every trainer has at least its outer loop
        raise ValueError(
            "no loop was counted: the trainer had been traced before (pass a fresh one)"
        )
    per_it = {k: v / iterations for k, v in counts.items()}
    return per_it, {k: np.asarray(v) for k, v in m.items()}


def host_tests(per_it: Dict[Tuple[str, str], float]) -> float:
    """Host tests per iteration: loop tests of unknown trip count and ``cond`` calls."""
    return sum(v for (_, kind), v in per_it.items() if kind in (HOST_TEST, TRACED_FORI, COND))


def fixed_steps(per_it: Dict[Tuple[str, str], float]) -> float:
    """Steps of loops with a known trip count per iteration."""
    return sum(v for (_, kind), v in per_it.items() if kind == FIXED)


def table(per_it: Dict[Tuple[str, str], float]) -> str:
    """Markdown rows (site, kind, per iteration), the most frequent first."""
    rows = sorted(per_it.items(), key=lambda kv: -kv[1])
    return "\n".join(f"| `{site}` | {kind} | {v:.1f} |" for (site, kind), v in rows)


def main(argv=None):
    from benchmarks.scaling import trainer_for

    p = argparse.ArgumentParser(
        prog="python -m benchmarks.loop_trips",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--experiments", default="fourrooms,thermal,toy_game,lqr_game")
    p.add_argument("--runs", type=int, nargs="+", default=[1, 240], help="vmapped runs (1 240)")
    p.add_argument("--warmup", type=int, default=200, help="iterations trained first (200)")
    p.add_argument("--iterations", type=int, default=20, help="iterations counted (20)")
    p.add_argument(
        "--parallel-steps",
        action="store_true",
        help="Four-Rooms with TrainConfig.parallel_steps (rollout and SARSA pass in parallel form)",
    )
    a = p.parse_args(argv)
    names = [n for n in a.experiments.split(",") if n]
    for n in names:
        trainer_for(n, 1)  # an unknown name fails here, before anything runs
    print(
        f"# Loop trips per outer iteration; {platform.machine()} {jax.devices()[0].device_kind}, "
        f"jax {jax.__version__}, {datetime.date.today()}; warmup {a.warmup}, "
        f"{a.iterations} iterations counted"
        + ("; Four-Rooms with parallel_steps" if a.parallel_steps else "")
    )
    for n in names:
        for R in a.runs:
            method, trainer, grid = trainer_for(n, R, a.parallel_steps)
            per_it, _ = count_trips(trainer, grid, R, a.warmup, a.iterations)
            print(
                f"\n## {n}, {method}, {R} runs: {host_tests(per_it):.1f} host tests and "
                f"{fixed_steps(per_it):.0f} fixed-length loop steps per iteration\n"
            )
            print("| site (innermost < caller) | kind | per iteration |\n|---|---|---:|")
            print(table(per_it), flush=True)


if __name__ == "__main__":
    main()
