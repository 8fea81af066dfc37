"""Scaling with the number of vmapped runs, for every experiment's trainer.

``python -m benchmarks.scaling [--experiments fourrooms,thermal,toy_game,lqr_game]
[--runs 1 10 100 1000] [--iterations K] [--fail-on-cap] [--profile-runs 1 1000]``

For each experiment one method's trainer (the paper's main setting, BC-HG) is run for R vmapped
seeds (one grid point): the first call of the jitted chunk (compile + K iterations) and a second
call (K iterations, timed) give the compile time and the time per outer iteration; the table
also gives run-iterations per second (R / time per iteration), i.e. how far vmapping amortises.
The LQR game uses Naive-PGD above 100 runs (BC-HG's 256-sample Benefit per minibatch element
needs ~4 GB of activations at 1000 runs).

A speed figure counts only with its correctness beside it: each row also gives the share of
run-iterations whose follower (or metric) solve hit its cap, the skipped updates and the mean
final J over the runs; ``--fail-on-cap`` exits with status 3 once the table is printed if any
lane of any row hit its cap, skipped an update or ended with a non-finite J (what
``benchmarks/device_check.sh`` relies on).

The same J as the CPU: ``--reference FILE`` compares each row's per-run final J with a CPU
reference written by ``--write-reference FILE`` (run on the CPU with the same ``--iterations``;
:data:`REFERENCE_FILE` is the committed one). Runs are independent and ``seed_keys`` gives run r
the same key at any number of runs, so a row of R runs is compared on its first min(R, 100)
runs with the reference's first ones (:func:`agrees_with_reference`); a row with no reference
(another method or iteration count) says so and is not judged. Differences are relative to
the size of J: each run's ``|J_ref|``, at least the row's median ``|J_ref|`` (so that a run near
J = 0 is not judged on its rounding alone, and the LQR game's J of ~0.015 is not judged on an
absolute scale: with ``max(1, |J_ref|)`` instead, as before 2026-12-02, its critic at TF32 passed
at 1.4e-5). Float32 arithmetic that differs only in its rounding (another backend's reduction
order, exp / log, TF32 products inside the neural networks) moves J by about 1e-7 to 1e-5 of
its size in these few iterations; a sampled action that flips on a rounding tie moves one run by
more, which the share of runs allowed off the reference absorbs. A program that computes
something else (a product rounded into a solver, runs seeded otherwise) moves most runs: the row
fails. Measured on the CPU (100 runs, 4 iterations; the median relative difference per run): another
number of vmapped runs (1 and 10 against 100) 1e-7 to 5.6e-6; jax 0.11.2 against the 0.10.2
reference 0 to 3.4e-6; TF32 emulated in the toy game's networks 3e-6 (0 runs off), all passing.
Failing: the LQR game's critic at TF32 (``CriticConfig(precision=None)``, every other product there
is at full precision) 8.9e-4 with 19% of the runs off; the program as it was before its solvers ran
at full precision, every product emulated at TF32: Four-Rooms 2.3e-3 (its follower capped in 72% of
the run-iterations), the toy game 4.7e-3 (27% of the runs off), the LQR game 3e-5 absolute, ~2e-3 of
its J. The rows are judged only where this JAX draws the reference's random numbers
(:func:`random_fingerprint`); elsewhere they say "not judged".
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform

import jax
import numpy as np

from bchg_jax.core.health import health_text, solver_health
from bchg_jax.core.host_tests import steps_per_test
from bchg_jax.core.io import save_json
from bchg_jax.core.sweep import seed_keys
from bchg_jax.core.unroll import scan_unroll
from benchmarks._timing import report_unhealthy, time_chunks, unhealthy
from benchmarks.profile_trace import HEADER, profile_row


def trainer_for(name: str, runs: int, parallel_steps: bool = False):
    """(method, trainer, one-point grid) of an experiment's row at ``runs`` vmapped runs;
    ``parallel_steps``: Four-Rooms' ``TrainConfig.parallel_steps`` (the others ignore it)."""
    if name == "fourrooms":
        from bchg_jax.problems.fourrooms import fourrooms
        from bchg_jax.tabular.train import TrainConfig, make_train

        return (
            "bchg",
            make_train(
                fourrooms(), "bchg", TrainConfig(num_steps=100, parallel_steps=parallel_steps)
            ),
            {"lr": np.array([0.1]), "sarsa_alpha": np.array([0.5]), "beta": np.array([1e-3])},
        )
    if name == "thermal":
        from bchg_jax import lq
        from bchg_jax.problems.thermal import thermal

        return "bchg", lq.make_train(thermal(), "bchg", lq.TrainConfig()), {"lr": np.array([0.1])}
    if name == "toy_game":
        from bchg_jax.games import tabular as games
        from bchg_jax.problems.toy_game import toy_game

        return (
            "bchg",
            games.make_train(toy_game(), "bchg", games.TrainConfig()),
            {"actor_steps": np.array([1]), "critic_steps": np.array([10])},
        )
    if name == "lqr_game":
        from bchg_jax.games import lqr
        from bchg_jax.problems.lqr_game import lqr_game

        method = "bchg" if runs <= 100 else "naive"
        return (
            method,
            lqr.make_train(
                lqr_game(),
                method,
                lqr.TrainConfig(exploration=lqr.ExplorationConfig(warmup_steps=0)),
            ),
            {"actor_steps": np.array([10])},
        )
    raise ValueError(f"unknown experiment {name!r}")


REFERENCE_FILE = os.path.join(os.path.dirname(__file__), "scaling_cpu_reference.json")
REFERENCE_RUNS = 100  # per-run final J kept in a reference: the first 100 runs of a row
MEDIAN_RTOL = 1e-4  # the median run's |J - J_ref| / scale (agrees_with_reference) stays below
OFF_RTOL = 1e-2  # a run further off than this counts as off the reference ...
MAX_OFF_SHARE = 0.1  # ... and at most this share of the compared runs may be


def reference_key(name: str, method: str, iterations: int) -> str:
    """The reference entry of an experiment's method after ``2 * iterations`` iterations (the
    untimed chunk and the timed one)."""
    return f"{name}:{method}:{2 * iterations}"


def agrees_with_reference(J, ref):
    """(verdict, text) of a row's per-run final J against the reference's first runs: the
    median relative difference below :data:`MEDIAN_RTOL` and at most :data:`MAX_OFF_SHARE` of
    the runs off by more than :data:`OFF_RTOL`, relative to the size of J: each run's
    ``|J_ref|``, at least the median ``|J_ref|`` of the compared runs."""
    J, ref = np.asarray(J, np.float64), np.asarray(ref, np.float64)
    n = min(J.size, ref.size)
    if n == 0:
        return True, "no reference"
    size = np.abs(ref[:n])
    scale = np.maximum(np.maximum(size, np.median(size)), np.finfo(np.float64).tiny)
    d = np.abs(J[:n] - ref[:n]) / scale
    if not np.all(np.isfinite(d)):
        return False, f"{n} runs, non-finite J"
    median, off = float(np.median(d)), float(np.mean(d > OFF_RTOL))
    ok = median <= MEDIAN_RTOL and off <= MAX_OFF_SHARE
    return ok, f"{n} runs: median {median:.1e}, {off:.0%} off"


def measure(
    name: str, runs: int, iterations: int, profile: bool = False, parallel_steps: bool = False
):
    """(method, compile s, s per iteration, health dict, per-run final J [runs], profile
    summary or None) of one row."""
    method, trainer, grid = trainer_for(name, runs, parallel_steps)
    comp, per, m, *prof = time_chunks(
        trainer, grid, runs, iterations, with_metrics=True, profile=profile
    )
    J = np.asarray(m["J"][..., -1], np.float64).reshape(-1)
    return method, comp, per, solver_health(m), J, (prof[0] if prof else None)


def random_fingerprint() -> list:
    """A few draws of every ``jax.random`` function the trainers use (``split``, ``fold_in``,
    ``uniform``, ``normal``, ``categorical``, ``randint``, ``permutation``) from
    :func:`~bchg_jax.core.sweep.seed_keys`. A reference is judged only where the device's JAX
    draws these numbers as the reference's did (:func:`same_random_stream`): JAX does not
    promise the same random numbers across its versions, and another stream would fail every
    row for a reason that is not the device's arithmetic."""
    import jax.numpy as jnp

    keys = seed_keys(3)
    a, b, c = jax.random.split(jax.random.fold_in(keys[2], 7), 3)
    logits = jnp.log(jnp.array([0.1, 0.2, 0.3, 0.4]))
    parts = (
        jax.random.uniform(keys[0], (4,)),
        jax.random.normal(keys[1], (4,)),
        jax.random.categorical(a, logits, shape=(8,)),
        jax.random.randint(b, (4,), 0, 1000),
        jax.random.permutation(c, 8),
    )
    return [float(x) for p in parts for x in np.asarray(p, np.float64)]


def same_random_stream(fingerprint) -> bool:
    """This JAX draws the reference's :func:`random_fingerprint` (to a float32 ulp or so: a
    backend's ``erfinv`` may differ in its last bits)."""
    here = np.asarray(random_fingerprint())
    there = np.asarray(fingerprint if fingerprint is not None else [], np.float64)
    return here.shape == there.shape and np.allclose(here, there, rtol=1e-5, atol=1e-6)


def load_reference(path):
    """(entries, jax version, random fingerprint) of the reference file ``path`` (``({}, None,
    None)`` when ``path`` is None or absent)."""
    if not path or not os.path.exists(path):
        return {}, None, None
    with open(path) as f:
        data = json.load(f)
    return data["J"], data.get("jax"), data.get("random")


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--experiments", default="fourrooms,thermal,toy_game,lqr_game")
    p.add_argument("--runs", type=int, nargs="+", default=[1, 10, 100, 1000])
    p.add_argument("--iterations", type=int, default=3)
    p.add_argument(
        "--fail-on-cap",
        action="store_true",
        help="exit 3 if any run's solve hit its cap, an update was skipped or J is not finite",
    )
    p.add_argument(
        "--profile-runs",
        type=int,
        nargs="*",
        default=[],
        help="rows (numbers of runs) whose chunk is called once more under the profiler; a "
        "second table gives their kernels, device busy time and costliest kernels per "
        "iteration (benchmarks.profile_trace)",
    )
    p.add_argument(
        "--reference",
        nargs="?",
        const=REFERENCE_FILE,
        default=None,
        help="compare each row's per-run final J with this CPU reference (default file: "
        "benchmarks/scaling_cpu_reference.json); with --fail-on-cap a row that "
        "disagrees fails like a capped one",
    )
    p.add_argument(
        "--write-reference",
        metavar="FILE",
        default=None,
        help="record each row's first 100 per-run final J in FILE (merged with what it holds), "
        "to be the reference of another device; run it on the CPU",
    )
    p.add_argument(
        "--parallel-steps",
        action="store_true",
        help="Four-Rooms with TrainConfig.parallel_steps (its rollout in log depth, its SARSA "
        "pass one triangular solve)",
    )
    a = p.parse_args(argv)
    if a.write_reference and a.parallel_steps:
        p.error("--write-reference records the scan form's J; drop --parallel-steps")
    if a.write_reference and jax.default_backend() != "cpu":
        p.error(f"--write-reference records the CPU's J; this backend is {jax.default_backend()}")
    reference, ref_jax, ref_random = load_reference(a.reference)
    if a.reference and not reference:
        p.error(f"--reference: no reference file at {a.reference}")
    unjudged = ""
    if reference and not same_random_stream(ref_random):
        unjudged = (
            f"not judged: jax {jax.__version__} draws other random numbers than the "
            f"reference's jax {ref_jax} (make one on this machine's CPU: JAX_PLATFORMS=cpu "
            "... --write-reference FILE)"
        )
        print(f"# J reference {unjudged}", flush=True)
    written = load_reference(a.write_reference)[0]
    print(
        f"# {platform.processor() or platform.machine()}, jax {jax.__version__}, devices "
        f"{jax.devices()}, {datetime.date.today()}, {a.iterations} timed iterations, a solver "
        f"loop test every {steps_per_test()} steps (core.host_tests), {scan_unroll()} steps per "
        "trip of the Four-Rooms scans (core.unroll)"
        + (", Four-Rooms with parallel_steps" if a.parallel_steps else "")
    )
    print(
        "| experiment | method | vmapped runs | compile (s) | s / outer iteration | "
        "run-iterations / s | capped | skipped | mean J | same J as the CPU |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|")
    bad, profiles, lines_read = [], [], set()
    for name in a.experiments.split(","):
        for runs in a.runs:
            method, comp, per, health, J_runs, prof = measure(
                name, runs, a.iterations, runs in a.profile_runs, a.parallel_steps
            )
            J = float(np.mean(J_runs))
            key = reference_key(name, method, a.iterations)
            same = "-"
            if reference and key not in reference:
                same = f"no reference for {key}"
            elif reference and unjudged:
                same = "not judged (another random stream)"
            elif reference:
                same_ok, text = agrees_with_reference(J_runs, reference[key])
                same = ("yes, " if same_ok else "NO, ") + text
                if not same_ok:
                    bad.append(f"{name} at {runs} runs (J off the CPU reference: {text})")
            if a.write_reference and len(J_runs) > len(written.get(key, [])):
                written[key] = [float(x) for x in J_runs[:REFERENCE_RUNS]]
            if prof is not None:
                profiles.append(profile_row(f"{name} {method} x{runs}", prof))
                if not isinstance(prof, str):
                    lines_read.update(prof["where"])
            print(
                f"| {name} | {method} | {runs} | {comp:.1f} | {per:.4f} | {runs / per:.0f} | "
                f"{health.get('capped_share', 0.0):.2%} | {health.get('update_skipped', 0)} | "
                f"{J:.4g} | {same} |",
                flush=True,
            )
            if unhealthy(health) or not np.isfinite(J):
                bad.append(f"{name} at {runs} runs ({health_text(health)}, J {J:.4g})")
    if profiles:
        print("\nProfiled (one more call of the same chunk under jax.profiler):\n" + HEADER)
        print("\n".join(profiles))
        print("trace lines read: " + ", ".join(sorted(lines_read)), flush=True)
    if a.write_reference:
        machine = platform.processor() or platform.machine()
        meta = f"{machine}, jax {jax.__version__}, {datetime.date.today()}"
        entries = dict(sorted(written.items()))
        save_json(
            a.write_reference,
            {"machine": meta, "jax": jax.__version__, "random": random_fingerprint(), "J": entries},
        )
        print(f"reference: {len(written)} entries in {a.write_reference}")
    report_unhealthy(bad, a.fail_on_cap, checks_J=True)


if __name__ == "__main__":
    main()
