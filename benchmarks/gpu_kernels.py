"""Kernels per outer iteration on a GPU, counted from XLA:GPU's compiled program, without a GPU.

    bash benchmarks/gpu_compiler.sh /tmp/cuda_site     # once: XLA:GPU's compiler, ~130 MB
    PYTHONPATH=/tmp/cuda_site python -m benchmarks.gpu_kernels \\
        [--experiments fourrooms,thermal,thermal_faithful,toy_game,lqr_game] [--runs 1 240] \\
        [--parallel-steps] [--mlp-kernel xla|fused] \\
        [--target benchmarks/h200_target.txtpb | --attached] [--save DIR]

What bounds the small problems on a GPU is a chain of kernels (docs/performance.md): each kernel
a launch of its own, at 1-2 us even when it computes almost nothing. ``benchmarks.loop_trips``
counts the chain's steps on the CPU; this tool counts what each step is made of on the GPU. It
compiles one outer iteration of an experiment's trainer (the row of :mod:`benchmarks.scaling`)
with XLA:GPU for a target described in a ``GpuTargetConfigProto`` text file (default: an H200,
``benchmarks/h200_target.txtpb``, written from the card's public specifications) through JAX's
ahead-of-time path, so a machine with no GPU runs it: ``jax.experimental.topologies`` makes a
compile-only CUDA device from the target, and nothing is executed. On a GPU machine,
``--attached`` compiles for the card itself (then the autotuner has chosen the GEMM kernels).

It reads the compiled module's text: every instruction that launches work counts as one kernel
(a fusion, a library call such as a cuBLAS GEMM, a copy, a sort; not parameters, tuples,
bitcasts, constants), a ``while`` with a known trip count (``lax.scan``, a fixed ``fori_loop``)
counts ``trips x`` its body, a ``conditional`` counts its largest branch, and a ``call`` counts
what it calls. A ``while`` of unknown trip count (a solver loop) is listed apart with its kernels
per trip and the site that made it: its trips per iteration are ``benchmarks.loop_trips``'
host tests. So ``fixed kernels per iteration + sum(trips x kernels per trip)`` is the chain one
iteration launches. The solver loops are traced as on an accelerator (``BCHG_STEPS_PER_TEST``
set to :data:`~bchg_jax.core.host_tests.ACCELERATOR_STEPS_PER_TEST` unless given). Caveats:
compiled without a device the GEMMs are XLA's untuned choice (the autotuner may split a GEMM
differently on the card); the deviceless compile forms no command buffers (CUDA graphs), which
XLA:GPU may form on the card; and the compiler is the one of the
installed jaxlib (the card's image may have a newer one; jax 0.10.2 and 0.11.2 counted within
1% of each other, 2026-12-05). Counts, not times.

Needs XLA:GPU's compiler: the ``jax-cuda13-plugin`` and ``jax-cuda13-pjrt`` wheels of the
installed jaxlib's version, which ``benchmarks/gpu_compiler.sh DIR`` installs into a folder of
their own (put it on ``PYTHONPATH``; they are not a dependency of the project, and JAX keeps
running on the CPU beside them).
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import os
import re
from typing import Dict, List, Optional, Tuple

import jax
import numpy as np

TARGET_FILE = os.path.join(os.path.dirname(__file__), "h200_target.txtpb")
EXPERIMENTS = ("fourrooms", "thermal", "thermal_faithful", "toy_game", "lqr_game")

# instructions that launch nothing on their own
_NO_KERNEL = {
    "parameter",
    "get-tuple-element",
    "tuple",
    "bitcast",
    "constant",
    "after-all",
    "opt-barrier",
    "add-dependency",
    "partition-id",
    "replica-id",
    "domain",
}
_HEADER = re.compile(r"^(?:ENTRY )?%?([\w.\-]+) .*\{\s*$")
_INSTR = re.compile(r"^(?:ROOT )?%?([\w.\-]+) = (.*)$")


@dataclasses.dataclass
class Instruction:
    name: str
    op: str
    text: str


@dataclasses.dataclass
class Module:
    """A compiled HLO module's computations (name -> instructions), its entry's name and the
    source locations of its stack frames (frame id -> [(file, line)], innermost first)."""

    computations: Dict[str, List[Instruction]]
    entry: str
    frames: Dict[int, List[Tuple[str, int]]]


def _op(rhs: str) -> str:
    """The opcode of an instruction's right-hand side ``TYPE op(operands), attributes``: the
    first identifier directly followed by ``(`` once the result type (which may be a tuple type
    with nested parentheses) is skipped."""
    if rhs.startswith("("):  # a tuple type
        depth = 0
        for end, ch in enumerate(rhs):
            depth += ch == "("
            depth -= ch == ")"
            if depth == 0:
                rhs = rhs[end + 1 :]
                break
    m = re.search(r"\s([a-z][a-z0-9\-_]*)\(", rhs)
    return m.group(1) if m else "?"


def _frames(text: str) -> Dict[int, List[Tuple[str, int]]]:
    """Frame id -> [(file, line)] innermost first, from the module's trailing tables."""
    sections: Dict[str, List[str]] = {}
    current = None
    for line in text.splitlines():
        s = line.strip()
        if s in ("FileNames", "FunctionNames", "FileLocations", "StackFrames"):
            current = s
            sections[current] = []
        elif current and s and s[0].isdigit():
            sections[current].append(s)
        elif current and s:
            current = None
    files = {}
    for s in sections.get("FileNames", []):
        k, v = s.split(" ", 1)
        files[int(k)] = v.strip('"')
    locations = {}
    for s in sections.get("FileLocations", []):
        k = int(s.split(" ", 1)[0])
        f = re.search(r"file_name_id=(\d+)", s)
        ln = re.search(r"\bline=(\d+)", s)
        if f and ln:
            locations[k] = (files.get(int(f.group(1)), "?"), int(ln.group(1)))
    parents, where = {}, {}
    for s in sections.get("StackFrames", []):
        k = int(s.split(" ", 1)[0])
        loc = re.search(r"file_location_id=(\d+)", s)
        par = re.search(r"parent_frame_id=(\d+)", s)
        where[k] = locations.get(int(loc.group(1))) if loc else None
        parents[k] = int(par.group(1)) if par else 0
    chains = {}
    for k in where:
        chain, seen, j = [], set(), k
        while j in where and j not in seen:
            seen.add(j)
            if where[j] is not None:
                chain.append(where[j])
            j = parents.get(j, 0)
        chains[k] = chain
    return chains


def parse(text: str) -> Module:
    """Parse a compiled HLO module's text (``jax.stages.Compiled.as_text()``)."""
    comps: Dict[str, List[Instruction]] = {}
    entry, current = None, None
    for line in text.splitlines():
        if not line.startswith(" ") and line.rstrip().endswith("{"):
            m = _HEADER.match(line)
            if m:
                current = m.group(1)
                comps[current] = []
                if line.startswith("ENTRY"):
                    entry = current
                continue
        if line.startswith("}"):
            current = None
            continue
        if current is not None:
            m = _INSTR.match(line.strip())
            if m:
                comps[current].append(Instruction(m.group(1), _op(m.group(2)), line.strip()))
    if entry is None:
        raise ValueError("no ENTRY computation in the module's text")
    return Module(comps, entry, _frames(text))


def _called(text: str, key: str) -> List[str]:
    m = re.search(key + r"=\{?([^},]+(?:, ?%[\w.\-]+)*)\}?", text)
    if not m:
        return []
    return [c.strip().lstrip("%") for c in m.group(1).split(",")]


# frames that say nothing of a loop's place (the loop helpers, the precision scope)
_WRAPPERS = ("core/host_tests.py", "core/precision.py", "core/run_last.py")


def site(module: Module, ins: Instruction, package: str = "bchg_jax") -> str:
    """``file:line < file:line`` of the innermost two frames inside ``package`` that made an
    instruction, the loop helpers skipped where others are known (or its op_name when the module
    carries no frames), then the instruction's name."""
    m = re.search(r"stack_frame_id=(\d+)", ins.text)
    chain = module.frames.get(int(m.group(1)), []) if m else []
    inside = [f"{f.split(package + '/')[-1]}:{ln}" for f, ln in chain if package in f]
    # the helpers' frames only where nothing else is known (a custom_vmap keeps only its own)
    outer = [s for s in inside if not s.split(":")[0].endswith(_WRAPPERS)] or inside
    if outer:
        return " < ".join(outer[:2]) + f" ({ins.name})"
    name = re.search(r'op_name="([^"]+)"', ins.text)
    return (name.group(1)[-60:] + f" ({ins.name})") if name else ins.name


@dataclasses.dataclass
class Count:
    """Kernels of a computation: ``fixed`` (loops of known trip count unrolled into it), the
    loops of unknown trip count (site, kernels per trip; their own loops inside counted per
    trip) and the known loops (site, trips, kernels per trip; the trips per run of the
    computation, or, marked ``[per trip of ...]``, per trip of the enclosing loop of unknown
    length; ``[in a branch]``: inside a conditional, counted in ``fixed`` only if in its largest
    branch)."""

    fixed: float = 0.0
    unknown: List[Tuple[str, float]] = dataclasses.field(default_factory=list)
    known: List[Tuple[str, int, float]] = dataclasses.field(default_factory=list)


def count(module: Module, name: Optional[str] = None, _memo=None) -> Count:
    """Kernels launched by one run of computation ``name`` (default the entry), see
    :class:`Count` and the module docstring for what counts."""
    memo = {} if _memo is None else _memo
    name = module.entry if name is None else name
    if name in memo:
        return memo[name]
    out = Count()
    for ins in module.computations.get(name, []):
        if ins.op in _NO_KERNEL:
            continue
        if ins.op == "while":
            body = count(module, _called(ins.text, "body")[0], memo)
            cond = count(module, _called(ins.text, "condition")[0], memo)
            trips = re.search(r'"known_trip_count":\{"n":"(\d+)"\}', ins.text)
            where = site(module, ins)
            if trips:
                n = int(trips.group(1))
                out.fixed += n * body.fixed
                out.known.append((where, n, body.fixed))
                out.known += [(s, n * t, k) for s, t, k in body.known]
                out.unknown += body.unknown  # per trip of theirs; reached n times per run
            else:
                out.unknown.append((where, body.fixed + cond.fixed))
                out.unknown += body.unknown
                out.known += [(f"{s} [per trip of {where}]", t, k) for s, t, k in body.known]
        elif ins.op == "conditional":
            branches = _called(ins.text, "branch_computations") or (
                _called(ins.text, "true_computation") + _called(ins.text, "false_computation")
            )
            counts = [count(module, b, memo) for b in branches]
            out.fixed += max((c.fixed for c in counts), default=0.0)
            for c in counts:  # listed from every branch, counted in the largest
                out.unknown += c.unknown
                out.known += [(f"{s} [in a branch]", t, k) for s, t, k in c.known]
        elif ins.op in ("call", "async-start"):
            for c in _called(ins.text, "to_apply") + _called(ins.text, "calls"):
                sub = count(module, c, memo)
                out.fixed += sub.fixed
                out.unknown += sub.unknown
                out.known += sub.known
        elif ins.op in ("async-done", "async-update"):
            continue
        else:
            out.fixed += 1
    memo[name] = out
    return out


def cuda_device(target: Optional[str], attached: bool):
    """A device to compile for: the attached GPU, or a compile-only CUDA device of the target
    config in file ``target``."""
    from jax.experimental import topologies

    if attached:
        return jax.devices("gpu")[0]
    with open(target) as f:
        config = f.read()
    try:
        topo = topologies.get_topology_desc(
            "bchg-target", "cuda", target_config=config, topology="1x1x1"
        )
    except Exception as e:  # the plugin is missing or does not take the target
        raise SystemExit(
            "error: no XLA:GPU compiler (install it with `bash benchmarks/gpu_compiler.sh DIR` "
            f"and put DIR on PYTHONPATH): {type(e).__name__}: {e}"
        ) from e
    return topo.devices[0]


def compiled_iteration(trainer, grid, runs: int, device) -> str:
    """The text of one outer iteration of ``trainer`` (``runs`` vmapped seeds, the one-point
    ``grid``) compiled for ``device``: the grid's ``run`` with a chunk of one iteration, on the
    abstract state of its ``init`` (nothing runs)."""
    from jax.sharding import SingleDeviceSharding

    from bchg_jax.core.sweep import grid_functions, grid_hparams, seed_keys

    init, run = grid_functions(trainer)
    hp = grid_hparams(trainer, grid)
    state = jax.eval_shape(init, seed_keys(runs), hp)
    sharding = SingleDeviceSharding(device)

    def spec(x):
        return jax.ShapeDtypeStruct(np.shape(x), x.dtype, sharding=sharding)

    args = jax.tree.map(spec, (state, hp))
    # the default device says which GPU a Pallas kernel is lowered for (jax >= 0.11)
    with jax.default_device(device):
        lowered = run.trace(*args, 1).lower(lowering_platforms=("cuda",))
        return lowered.compile().as_text()


def trainer_for(name: str, runs: int, parallel_steps: bool = False, mlp_kernel: str = "xla"):
    """(method, trainer, grid) of :func:`benchmarks.scaling.trainer_for`, plus
    ``thermal_faithful``: thermal with the paper's estimator (MLP critics, 5,000 Adam steps;
    ``mlp_kernel``: ``lq.TrainConfig.mlp_kernel``)."""
    from benchmarks.scaling import trainer_for as scaling_trainer

    if name != "thermal_faithful":
        return scaling_trainer(name, runs, parallel_steps)
    import warnings

    from bchg_jax import lq
    from bchg_jax.problems.thermal import thermal

    config = lq.TrainConfig(
        critic="mlp",
        follower_grad="score",
        state_baseline=False,
        control_variates=False,
        mlp_kernel=mlp_kernel,
    )
    with warnings.catch_warnings():  # compiled for a GPU: the interpreter warning is moot
        warnings.filterwarnings("ignore", message=".*Pallas' interpreter")
        return "bchg", lq.make_train(thermal(), "bchg", config), {"lr": np.array([0.1])}


def report(c: Count, top: int = 6) -> str:
    """Markdown lines: the known loops with the most kernels and every unknown loop."""
    lines = []
    rows = sorted(c.known, key=lambda r: -r[1] * r[2])[:top]
    if rows:
        lines.append("\n| loop of known length (site) | trips / iteration | kernels / trip |")
        lines.append("|---|---:|---:|")
        lines += [f"| `{s}` | {n} | {k:.0f} |" for s, n, k in rows]
    if c.unknown:
        lines.append("\n| loop of unknown length (site) | kernels / trip |")
        lines.append("|---|---:|")
        lines += [f"| `{s}` | {k:.0f} |" for s, k in sorted(c.unknown, key=lambda r: -r[1])]
    return "\n".join(lines)


def main(argv=None):
    p = argparse.ArgumentParser(
        prog="python -m benchmarks.gpu_kernels",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--experiments", default="fourrooms,thermal,toy_game,lqr_game")
    p.add_argument("--runs", type=int, nargs="+", default=[1, 240], help="vmapped runs (1 240)")
    p.add_argument("--parallel-steps", action="store_true", help="Four-Rooms' parallel steps")
    p.add_argument(
        "--mlp-kernel",
        choices=("xla", "fused"),
        default="xla",
        help="thermal_faithful's MLP critic fit (lq.TrainConfig.mlp_kernel)",
    )
    p.add_argument("--target", default=TARGET_FILE, help="GpuTargetConfigProto text file")
    p.add_argument("--attached", action="store_true", help="compile for the attached GPU")
    p.add_argument("--save", default=None, help="folder to write each compiled module into")
    a = p.parse_args(argv)
    names = [n for n in a.experiments.split(",") if n]
    bad = [n for n in names if n not in EXPERIMENTS]
    if bad:
        p.error(f"unknown experiments {bad}; choose from {', '.join(EXPERIMENTS)}")
    from bchg_jax.core import host_tests

    # the program a GPU runs: the solver loops traced with the accelerators' steps per host test
    # (chosen at trace time from the default backend, the CPU here) unless the caller set them
    os.environ.setdefault(host_tests.ENV_VAR, str(host_tests.ACCELERATOR_STEPS_PER_TEST))
    from bchg_jax.lq import fused_td

    os.environ.setdefault(fused_td.ENV_INTERPRET, "0")  # the Pallas kernels compiled, for it
    device = cuda_device(a.target, a.attached)
    where = "the attached GPU" if a.attached else f"target {os.path.basename(a.target)}"
    print(
        f"# Kernels per outer iteration, XLA:GPU for {where} ({device.device_kind}); "
        f"jax {jax.__version__}, {datetime.date.today()}; "
        f"{os.environ[host_tests.ENV_VAR]} solver steps per host test"
        + ("; Four-Rooms with parallel_steps" if a.parallel_steps else "")
    )
    for n in names:
        for R in a.runs:
            method, trainer, grid = trainer_for(n, R, a.parallel_steps, a.mlp_kernel)
            text = compiled_iteration(trainer, grid, R, device)
            if a.save:
                os.makedirs(a.save, exist_ok=True)
                with open(os.path.join(a.save, f"{n}_{R}.hlo.txt"), "w") as f:
                    f.write(text)
            c = count(parse(text))
            print(
                f"\n## {n}, {method}, {R} runs: {c.fixed:.0f} kernels per iteration outside "
                f"loops of unknown length, {len(c.unknown)} such loops",
                flush=True,
            )
            print(report(c), flush=True)


if __name__ == "__main__":
    main()
