"""Figure and table of the bi-level LQR game runs: ``python -m benchmarks.lqr_game_figure``.

Reads the run folders of ``benchmarks/RESULTS.md`` (section "Bi-level LQR Markov game"), takes
each variant at its best actor-step setting (mean of the last 50 iterations), and writes
``benchmarks/results/lqr_game/{curves.npz, figure.png}``: left, mean +- SE over seeds of the exact
undiscounted 100-step return per iteration; right, every seed's final value (log scale), which
shows that the means are carried by a few seeds. Prints the markdown table. (The shuffled-Benefit
control is not a run folder: ``python -m benchmarks.lqr_game_controls`` prints its row.)
``--from-npz`` redraws from the stored ``curves.npz`` (no run folders needed).
"""

from __future__ import annotations

import argparse
import os

import numpy as np

from experiments.summary import summarize

OUT = os.path.join("benchmarks", "results", "lqr_game")
VARIANTS = [  # label, run folder, method
    ("BC-HG", "results/lqr_game_paper", "bchg"),
    ("BC-HG (deterministic leader)", "results/lqr_game_paper", "bchg_det"),
    ("Naive-PGD (on-policy)", "results/lqr_game_ref", "naive_on"),
    ("Naive-PGD (off-policy)", "results/lqr_game_ref", "naive_off"),
    ("Naive-PGD (on-policy, clipped)", "results/lqr_game_paper", "naive_on"),
    ("Naive-PGD (off-policy, clipped)", "results/lqr_game_paper", "naive_off"),
    ("BC-HG, unbiased estimator", "results/lqr_game_unbiased", "bchg"),
    ("Naive-PGD, unbiased baseline", "results/lqr_game_unbiased", "naive_on"),
    ("BC-HG, seeds 1000-1019", "results/lqr_game_seed1000", "bchg"),
]
WINDOW = 50


def collect():
    curves, steps = {}, {}
    for label, run, method in VARIANTS:
        path = os.path.join(run, method, "metrics.npz")
        if not os.path.exists(path):
            print(f"missing {path}; skipped")
            continue
        d = np.load(path)
        J = d["J"]
        best = summarize(J, WINDOW)[3]  # the summary's choice: a NaN grid point never best
        curves[label] = J[best].astype(np.float32)
        steps[label] = int(d["grid_actor_steps"][best])
    return curves, steps


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--from-npz", action="store_true")
    a = p.parse_args(argv)
    from bchg_jax.core.io import save_figure, save_npz

    if a.from_npz:
        d = np.load(os.path.join(OUT, "curves.npz"))
        labels = [str(x) for x in d["labels"]]
        curves = {lab: d[f"J_{i}"] for i, lab in enumerate(labels)}
        steps = dict(zip(labels, d["actor_steps"].tolist(), strict=False))
    else:
        curves, steps = collect()
        labels = list(curves)
        save_npz(
            os.path.join(OUT, "curves.npz"),
            {
                "labels": np.array(labels),
                "actor_steps": np.array([steps[k] for k in labels]),
                **{f"J_{i}": curves[k] for i, k in enumerate(labels)},
            },
        )
    print("| variant | actor steps | mean +- SE (last 50 it.) | median | seeds > 0.05 | max seed |")
    print("|---|---|---|---|---|---|")
    for lab in labels:
        fin = curves[lab][:, -WINDOW:].mean(-1)
        print(
            f"| {lab} | {steps[lab]} | {fin.mean():.3f} +- "
            f"{fin.std(ddof=1) / np.sqrt(fin.size):.3f}"
            f" | {np.median(fin):.3f} | {(fin > 0.05).sum()}/{fin.size} | {fin.max():.2f} |"
        )
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax, ax2) = plt.subplots(1, 2, figsize=(13, 4.4))
    cmap = plt.get_cmap("tab10")
    main_labels = labels[:4]
    for i, lab in enumerate(main_labels):
        c = curves[lab]
        m, se = c.mean(0), c.std(0, ddof=1) / np.sqrt(c.shape[0])
        ax.plot(m, color=cmap(i), label=f"{lab} ({steps[lab]} actor steps)")
        ax.fill_between(np.arange(m.size), m - se, m + se, color=cmap(i), alpha=0.2)
    ax.set_xlabel("outer iteration")
    ax.set_ylabel("leader return (exact, undiscounted, 100 steps)")
    ax.set_title(f"bi-level LQR game, mean +- SE over {curves[labels[0]].shape[0]} seeds")
    ax.legend(fontsize=7)
    rng = np.random.default_rng(0)
    for i, lab in enumerate(labels):
        fin = curves[lab][:, -WINDOW:].mean(-1)
        ax2.scatter(i + 0.15 * rng.standard_normal(fin.size), fin, s=10, color=cmap(i % 10))
        ax2.plot([i - 0.3, i + 0.3], [fin.mean()] * 2, color="k")
    ax2.set_yscale("log")
    ax2.set_xticks(range(len(labels)))
    ax2.set_xticklabels(labels, rotation=35, ha="right", fontsize=7)
    ax2.set_ylabel("per-seed final return (log); bar = mean")
    fig.tight_layout()
    save_figure(os.path.join(OUT, "figure.png"), fig)
    print(f"figure: {os.path.join(OUT, 'figure.png')}")


if __name__ == "__main__":
    main()
