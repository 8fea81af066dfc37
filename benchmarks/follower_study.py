"""How the estimators hold up when the follower is not at its best response.

    python -m benchmarks.follower_study run [--out results/follower_study] [--iterations 3000]
        [--followers k_step1 ...]
    python -m benchmarks.follower_study table [--out results/follower_study]
        [--compact benchmarks/results/follower_study]

``run`` trains, for each follower model and each beta, every Four-Rooms method (the six of the
paper and ``exact``) as ``python -m experiments.fourrooms --method ... --seeds 10 --batch 100
--beta BETA --iterations N --track-reference --follower ...`` into
``OUT/fourrooms/beta<BETA>_<follower>/`` (a folder that holds a ``config.json`` is continued
with ``--resume``), and the toy game's variants likewise into ``OUT/toy_game/<follower>/``.
Followers: the best response, ``k_step`` with K in {1, 3, 10}, ``q_learning`` at two step
sizes (exploration 0.1). Every method uses lr 0.1 and SARSA step 0.5 (BC-HG's best grid point
at batch 100 for both betas) rather than its own tuned grid point: the study compares followers,
not tunings.

``table`` reads the runs (the first N iterations of each) and writes ``table.md`` and
``figure.png`` to ``--compact``: per follower and method, the final J_L (mean +- SE over
seeds of the last 500 iterations; J_L at the policy the follower actually plays) and the
estimate's mean cosine and median projection ``<est, ref> / |ref|^2`` against the two exact
references (``target``: the follower's current policy as if optimal; ``through``: the
derivative through the follower's next update, from its state after this iteration's
reaction; docs/followers.md) over iterations and seeds
(a zero estimate has no cosine and is left out; the projection is heavy-tailed where the
reference is small, hence the median).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

import numpy as np

from bchg_jax.core.io import atomic_write_bytes, save_figure, save_json

FOURROOMS_METHODS = ("bchg", "hpgd_oracle", "hpgd_mc", "hpgd_sa", "sobirl", "naive", "exact")
TOY_METHODS = ("bchg", "naive_on", "naive_off", "biac_on", "biac_off")
BETAS = ("1e-3", "5e-3")
# (label, CLI flags)
FOLLOWERS = (
    ("best_response", []),
    ("k_step1", ["--follower", "k_step", "--follower-steps", "1"]),
    ("k_step3", ["--follower", "k_step", "--follower-steps", "3"]),
    ("k_step10", ["--follower", "k_step", "--follower-steps", "10"]),
    (
        "q_learning0.1",
        ["--follower", "q_learning", "--follower-lr", "0.1", "--follower-explore", "0.1"],
    ),
    (
        "q_learning0.5",
        ["--follower", "q_learning", "--follower-lr", "0.5", "--follower-explore", "0.1"],
    ),
)
WINDOW = {"fourrooms": 500, "toy_game": 50}


def _train(folder: str, command: list, log) -> float:
    """Runs (or resumes) one CLI command into ``folder``; returns its wall seconds."""
    if os.path.exists(os.path.join(folder, "config.json")):
        command = [sys.executable, "-m", command[2], "--resume", folder]
    t0 = time.time()
    subprocess.run(command, check=True, stdout=log, stderr=subprocess.STDOUT)
    return time.time() - t0


def run(out: str, iterations: dict, parts, followers=None) -> None:
    """Trains every (experiment, beta, follower) folder (``followers``: only these labels);
    wall times go to ``OUT/wall.json``."""
    wall_path = os.path.join(out, "wall.json")
    os.makedirs(out, exist_ok=True)
    wall = json.load(open(wall_path)) if os.path.exists(wall_path) else {}
    jobs = []
    chosen = [(label, flags) for label, flags in FOLLOWERS if not followers or label in followers]
    if "fourrooms" in parts:
        for beta in BETAS:
            for label, flags in chosen:
                folder = os.path.join(out, "fourrooms", f"beta{beta}_{label}")
                cmd = ["--method", ",".join(FOURROOMS_METHODS), "--beta", beta, "--batch", "100"]
                jobs.append((folder, "experiments.fourrooms", cmd + flags, iterations["fourrooms"]))
    if "toy_game" in parts:
        for label, flags in chosen:
            folder = os.path.join(out, "toy_game", label)
            cmd = ["--method", ",".join(TOY_METHODS)] + flags
            jobs.append((folder, "experiments.toy_game", cmd, iterations["toy_game"]))
    for folder, module, args, n in jobs:
        common = ["--seeds", "10", "--iterations", str(n), "--track-reference"]
        command = [sys.executable, "-m", module, *args, *common, "--out", folder, "--exact-out"]
        os.makedirs(folder, exist_ok=True)
        with open(os.path.join(folder, "log.txt"), "a") as log:
            seconds = _train(folder, command, log)
        wall[os.path.relpath(folder, out)] = wall.get(os.path.relpath(folder, out), 0) + seconds
        save_json(wall_path, wall)
        print(f"{folder}: {seconds:.0f} s", flush=True)


def summarize(metrics: str, iterations: int, window: int) -> dict:
    """{J, J_se, cos_target, proj_target, cos_through, proj_through, gap} of one method's
    ``metrics.npz`` (first grid point, the first ``iterations`` iterations)."""
    x = np.load(metrics)
    J = x["J"][0][:, :iterations]
    final = J[:, -window:].mean(1)
    out = {"J": final.mean(), "J_se": final.std(ddof=1) / np.sqrt(final.size), "n": J.shape[1]}
    for k in ("cos_target", "proj_target", "cos_through", "proj_through", "follower_gap"):
        v = x[k][0][:, :iterations] if k in x.files else np.full(1, np.nan)
        # cos: mean over the iterations with a nonzero estimate; proj: median (heavy-tailed
        # where the reference is small)
        stat = np.nanmedian if k.startswith("proj") else np.nanmean
        out[k] = float(stat(v)) if np.any(np.isfinite(v)) else np.nan
    out["curve"] = J.mean(0)
    return out


def _cell(v, digits=2):
    return "-" if not np.isfinite(v) else f"{v:.{digits}f}"


def table(out: str, compact: str, iterations: dict) -> None:
    """``table.md`` and ``figure.png`` under ``compact`` from the runs under ``out``."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    wall = json.load(open(os.path.join(out, "wall.json")))
    panels = []
    for beta in BETAS:
        panels.append(
            (f"Four-Rooms, batch 100, β={beta}", "fourrooms", f"beta{beta}_", FOURROOMS_METHODS)
        )
    panels.append(("toy game, R = 2", "toy_game", "", TOY_METHODS))
    # the final window, or every iteration of a shorter run
    window = {exp: min(WINDOW[exp], iterations[exp]) for exp in WINDOW}
    lines = [
        f"Mean +- SE over 10 seeds of the last {window['fourrooms']} of "
        f"{iterations['fourrooms']} iterations (toy game: {window['toy_game']} of "
        f"{iterations['toy_game']}) of J_L at the "
        "policy the follower plays; cos / proj: the estimate against the as-if-optimal "
        "reference (T) and the derivative through the follower's update (U): mean cosine and "
        "median proj = <est, ref> / |ref|^2 over iterations and seeds; gap: mean "
        "max |g - g^dagger| (LQ: of the gains).",
        "",
    ]
    fig, axes = plt.subplots(
        len(panels),
        len(FOLLOWERS),
        figsize=(3.2 * len(FOLLOWERS), 2.6 * len(panels)),
        squeeze=False,
    )
    for row, (title, exp, prefix, methods) in enumerate(panels):
        lines += [
            f"### {title}",
            "",
            "| follower | method | J_L | cos T | proj T | cos U | proj U | gap | wall |",
            "|---|---|---|---|---|---|---|---|---|",
        ]
        for col, (label, _) in enumerate(FOLLOWERS):
            folder = os.path.join(out, exp, prefix + label)
            ax = axes[row][col]
            ax.set_title(f"{title.split(',')[0]} {prefix[4:-1]} {label}", fontsize=8)
            for m in methods:
                path = os.path.join(folder, m, "metrics.npz")
                if not os.path.exists(path):
                    continue
                s = summarize(path, iterations[exp], window[exp])
                seconds = wall.get(os.path.relpath(folder, out))
                lines.append(
                    f"| {label} | {m} | {s['J']:.3f} +- {s['J_se']:.3f} | "
                    f"{_cell(s['cos_target'])} | "
                    f"{_cell(s['proj_target'])} | {_cell(s['cos_through'])} | "
                    f"{_cell(s['proj_through'])} | {_cell(s['follower_gap'], 3)} | "
                    + (f"{seconds:.0f} s |" if m == methods[0] and seconds else " |")
                )
                ax.plot(s["curve"], label=m, lw=0.8)
            ax.tick_params(labelsize=6)
        lines.append("")
    for row in axes:
        row[0].legend(fontsize=6)
    fig.tight_layout()
    save_figure(os.path.join(compact, "figure.png"), fig)
    atomic_write_bytes(os.path.join(compact, "table.md"), ("\n".join(lines) + "\n").encode())
    print("\n".join(lines))


def main(argv=None):
    p = argparse.ArgumentParser(
        prog="python -m benchmarks.follower_study",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("command", choices=["run", "table"])
    p.add_argument("--out", default="results/follower_study")
    p.add_argument("--compact", default="benchmarks/results/follower_study")
    p.add_argument("--iterations", type=int, default=3000, help="Four-Rooms iterations")
    p.add_argument("--toy-iterations", type=int, default=500, help="toy game iterations")
    p.add_argument(
        "--parts", nargs="+", default=["fourrooms", "toy_game"], choices=["fourrooms", "toy_game"]
    )
    p.add_argument(
        "--followers",
        nargs="+",
        choices=[label for label, _ in FOLLOWERS],
        help="run only these followers (default: all)",
    )
    a = p.parse_args(argv)
    iterations = {"fourrooms": a.iterations, "toy_game": a.toy_iterations}
    if a.command == "run":
        run(a.out, iterations, a.parts, a.followers)
    else:
        table(a.out, a.compact, iterations)


if __name__ == "__main__":
    main()
