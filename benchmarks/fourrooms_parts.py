"""Where a Four-Rooms outer iteration goes: ms per iteration of each named step and of the whole
iteration, at 1 / 10 / 240 / 1000 vmapped runs (the first call's extra time reported apart).

    python -m benchmarks.fourrooms_parts [--runs 1 10 240 1000] [--beta 1e-3] [--method bchg]
        [--solver auto|dense|sparse] [--parallel-steps]

The runs cycle through the paper's lr x SARSA-alpha grid (24 points, so 240 runs = the paper's
grid x 10 seeds), run r with seed r. (Before 2026-11-29 every run had seed 0, so 240 runs were
24 distinct runs, each 10 times: the vmapped loops ran at the slowest of 24 lanes, not 240.
It barely mattered: at 240 runs, beta 1e-3, one core each, the other busy, 2026-11-29, soft-VI
sweeps mean / loop 43.4 / 120 dense and 32.5 / 69 sparse with 240 seeds against 45.2 / 125 and
34.3 / 69 with one; whole iteration 140.5 / 10.3 ms against 113.6 / 9.4 ms, within this
machine's timing noise under load.)
Every run first trains ``--warmup`` iterations, so the warm starts are the ones training sees
(the follower's soft value iteration starts from the previous iteration's V, the metric's
policy evaluation from the previous V_L). Then each step of ``trainer.steps`` is timed
alone, vmapped over the runs: ``follower`` (soft VI to tolerance), ``evaluate`` (the exact J_L
metric: warm-started policy-evaluation sweeps), ``collect`` (rollout), ``leader_critic``
(SARSA), ``estimate`` (the hypergradient), and ``whole`` = ``trainer.run`` over ``--iterations``
iterations divided by their number (it includes the ascent and bookkeeping; with few runs the
parts, timed as separate calls, each also pay ~0.1 ms of dispatch). Each timing is the
best of ``--repeats`` calls after one compiling call; ``sweeps`` is the follower's mean number
of soft-VI sweeps per run and the number the vmapped loop runs (its slowest lane); ``capped``
and ``skipped`` are the solver health of the timed ``whole`` calls (the share of run-iterations
whose follower or metric solve hit its cap, and the skipped updates): a speed figure with capped
solves is not a valid one.

With ``--parallel-steps`` (``TrainConfig.parallel_steps``) each row is also checked on the device
against the scan forms at the same inputs: the rollout's batch must be the scan's bit for bit and
the SARSA critic the scan's within ``PARALLEL_RTOL`` of its largest entry (the exit status is 3
otherwise): a fast parallel form that computes another critic (a linear solve at reduced
precision, say) is a bug, not a speed-up.

The cost depends on the training phase: the follower's warm start is poorest while theta moves
fast. Measured on the 2-core CPU (2026-11-26): the 240-run grid costs 140 ms per iteration at
iterations 200-220, against 58 ms averaged over a whole 10,000-iteration run; ``--warmup``
picks the phase. The first call of a large vmapped step can take far longer than compiling it
(240 runs: 34 s for the follower, whose compile alone takes 0.2 s; not explained yet), so the
``first call extra s`` column is reported apart from the per-iteration times.
"""

from __future__ import annotations

import argparse
import datetime
import platform
import sys
import time

import jax
import numpy as np

from bchg_jax import tabular
from bchg_jax.core.health import solver_health
from bchg_jax.core.sweep import grid_functions, seed_keys
from bchg_jax.problems import fourrooms
from bchg_jax.tabular import sparse
from benchmarks._timing import time_call
from experiments.fourrooms import PAPER_ALPHA, PAPER_LR

PARALLEL_RTOL = 1e-5  # the parallel SARSA pass against the scan's, relative to the critic's scale


def parallel_check(method, solver, keys, flat, policy, alphas, batch, segments, Q_L):
    """(same batch [bool], max |Q_L - Q_L of the scans| / max(1, max |Q_L of the scans|)): the
    parallel forms' outputs against the scans' at the same inputs, computed on this device."""
    ref = tabular.make_train(
        fourrooms(), method, tabular.TrainConfig(num_steps=100, solver=solver)
    ).steps
    ref_batch, ref_segments = jax.jit(jax.vmap(ref["collect"]))(keys, flat.theta, policy)
    same = all(
        np.array_equal(np.asarray(a), np.asarray(b))
        for a, b in zip(
            jax.tree.leaves((batch, segments)),
            jax.tree.leaves((ref_batch, ref_segments)),
            strict=True,
        )
    )
    axis = None if segments is None else 0
    critic = jax.jit(jax.vmap(ref["leader_critic"], (0, 0, 0, 0, axis, 0)))
    _, Q_ref, _ = critic(keys, flat.critic, flat.theta, batch, segments, alphas)
    Q_ref, Q_L = np.asarray(Q_ref, np.float64), np.asarray(Q_L, np.float64)
    return same, float(np.max(np.abs(Q_L - Q_ref)) / max(1.0, np.max(np.abs(Q_ref))))


def measure(
    runs: int,
    beta: float,
    method: str,
    warmup: int,
    iterations: int,
    repeats: int,
    solver: str = "auto",
    parallel_steps: bool = False,
):
    """One row per part: (part, first call extra s, ms per iteration) plus the follower's sweep
    counts (mean per run, and the slowest lane's) and the solver health of the timed whole-loop
    calls (:func:`~bchg_jax.core.health.solver_health`)."""
    trainer = tabular.make_train(
        fourrooms(),
        method,
        tabular.TrainConfig(num_steps=100, solver=solver, parallel_steps=parallel_steps),
    )
    grid = [(lr, a) for lr in PAPER_LR for a in PAPER_ALPHA]
    pts = [grid[i % len(grid)] for i in range(runs)]
    hp = trainer.hparams(
        {"lr": [p[0] for p in pts], "sarsa_alpha": [p[1] for p in pts], "beta": beta}
    )
    _, run = grid_functions(trainer)
    # one seed per run (run r: seed r), leaves [R, 1, ...]: with one shared seed the runs
    # r and r + 24 of a grid point were bit-identical, 24 distinct lanes however many runs
    state = jax.vmap(trainer.init)(seed_keys(runs), hp)
    state = jax.tree.map(lambda x: x[:, None], state)
    state, _ = run(state, hp, warmup)
    flat = jax.tree.map(lambda x: x[:, 0], state)  # [R, ...]
    steps, dt = trainer.steps, flat.theta.dtype
    betas, alphas = hp.beta.astype(dt), hp.sarsa_alpha.astype(dt)
    keys = jax.vmap(jax.random.fold_in, (0, None))(flat.key, 7)

    follower = jax.jit(jax.vmap(steps["follower"]))
    evaluate = jax.jit(jax.vmap(steps["evaluate"]))
    collect = jax.jit(jax.vmap(steps["collect"]))
    first = {}  # the parts whose outputs the later parts need: their first call timed here

    def first_call(name, fn, *args):
        t0 = time.perf_counter()
        out = jax.block_until_ready(fn(*args))
        first[name] = time.perf_counter() - t0
        return out

    br = first_call("follower", follower, flat.theta, betas, flat.V_F)
    batch, segments = first_call("collect", collect, keys, flat.theta, br.policy)
    axis = lambda x: None if x is None else 0  # noqa: E731  (absent terms)
    critic = jax.jit(jax.vmap(steps["leader_critic"], (0, 0, 0, 0, axis(segments), 0)))
    _, Q_L, V_hat = first_call(
        "leader_critic", critic, keys, flat.critic, flat.theta, batch, segments, alphas
    )
    estimate = jax.jit(jax.vmap(steps["estimate"], (0, 0, 0, axis(segments), 0, 0, axis(V_hat))))

    def timed(name, fn, *args):
        extra, best = time_call(fn, *args, repeats=repeats)
        if name in first:  # time_call's own first call was already compiled
            extra = max(first[name] - best, 0.0)
        return (name, extra, best)

    rows = [
        timed("follower", follower, flat.theta, betas, flat.V_F),
        timed("evaluate", evaluate, flat.theta, br.policy, flat.V_L),
        timed("collect", collect, keys, flat.theta, br.policy),
        timed("leader_critic", critic, keys, flat.critic, flat.theta, batch, segments, alphas),
        timed("estimate", estimate, flat.theta, betas, batch, segments, br, Q_L, V_hat),
    ]
    c, t, (_, m) = time_call(
        lambda s: run(s, hp, iterations), state, repeats=repeats, with_output=True
    )
    rows.append(("whole", c, t / iterations))
    sweeps = np.asarray(br.sweeps)
    health = solver_health({k: np.asarray(m[k]) for k in ("solve_capped", "update_skipped")})
    check = None
    if parallel_steps:
        check = parallel_check(method, solver, keys, flat, br.policy, alphas, batch, segments, Q_L)
    return (
        [(p, c, 1e3 * t) for p, c, t in rows],
        float(sweeps.mean()),
        int(sweeps.max()),
        health,
        check,
    )


def main(argv=None):
    p = argparse.ArgumentParser(
        prog="python -m benchmarks.fourrooms_parts",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument(
        "--runs",
        type=int,
        nargs="+",
        default=[1, 10, 240, 1000],
        help="vmapped run counts (default: 1 10 240 1000)",
    )
    p.add_argument("--beta", type=float, default=1e-3, help="follower entropy weight (1e-3)")
    p.add_argument("--method", default="bchg", help="tabular method (bchg)")
    p.add_argument(
        "--solver",
        default="auto",
        choices=["auto", "dense", "sparse"],
        help="TrainConfig.solver (auto)",
    )
    p.add_argument(
        "--parallel-steps",
        action="store_true",
        help="TrainConfig.parallel_steps: the rollout in log depth, the SARSA pass one solve",
    )
    p.add_argument("--warmup", type=int, default=200, help="training iterations first (200)")
    p.add_argument(
        "--iterations", type=int, default=20, help="iterations of the timed whole-loop call (20)"
    )
    p.add_argument("--repeats", type=int, default=3, help="timed calls, best kept (3)")
    a = p.parse_args(argv)
    print(
        f"# Four-Rooms parts, {a.method}, solver {a.solver}, "
        f"{'parallel' if a.parallel_steps else 'scan'} steps, "
        f"sparse rounds {sparse.round_form()}, beta {a.beta:g}, batch 100; "
        f"{platform.machine()} {jax.devices()[0].device_kind}, jax {jax.__version__}, "
        f"{datetime.date.today()}"
    )
    print(
        "| runs | "
        + " | ".join(["follower", "evaluate", "collect", "leader_critic", "estimate", "whole"])
        + " | soft-VI sweeps mean / loop | capped | skipped |"
    )
    print("|---:|" + "---:|" * 9)
    off = []
    for R in a.runs:
        rows, mean_sweeps, max_sweeps, health, check = measure(
            R, a.beta, a.method, a.warmup, a.iterations, a.repeats, a.solver, a.parallel_steps
        )
        cells = " | ".join(f"{ms:.3f}" if ms < 1 else f"{ms:.1f}" for _, _, ms in rows)
        print(
            f"| {R} | {cells} | {mean_sweeps:.1f} / {max_sweeps} | "
            f"{health['capped_share']:.2%} | {health['update_skipped']} |",
            flush=True,
        )
        print("  first call extra s: " + ", ".join(f"{n} {c:.1f}" for n, c, _ in rows), flush=True)
        if check is not None:
            same, dev = check
            print(
                f"  against the scans on this device: batch {'identical' if same else 'DIFFERS'}, "
                f"SARSA critic max |dQ| / scale {dev:.1e} (allowed {PARALLEL_RTOL:.0e})",
                flush=True,
            )
            if not same or dev > PARALLEL_RTOL:
                off.append(f"{R} runs")
    if off:
        print(f"parallel steps differ from the scans at {', '.join(off)}", file=sys.stderr)
        sys.exit(3)


if __name__ == "__main__":
    main()
