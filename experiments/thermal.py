"""Building thermal control (4 zones, 2 HVAC units; max-ent LQR follower):
``python -m experiments.thermal --seeds 10 --method all``.

Every (learning rate, seed) of a method trains as one vmapped program, in jitted chunks. The
metric of every iteration is the exact 100-step leader objective J_L(theta_i) under the
follower's best response, with its four components (stability, HVAC energy, insulation and
airflow costs; discounted sums). Outputs as for Four-Rooms (``experiments/run_folder.py``), plus
``components.png`` (objective and components, methods as curves).

Estimator options: ``--follower-grad pathwise`` (default) or ``score`` (the paper's Eq. (nablaQF)),
``--no-baseline`` (BC-HG without the state baseline), ``--no-control-variates``; ``--faithful``
selects the paper's form throughout (MLP critics, score function, no baseline/control variates).
"""

from __future__ import annotations

import dataclasses
import math
import os

from experiments.cli import FOLLOWER_SETTINGS, SHARED_SETTINGS, smoke_requested

PAPER_LR = (0.1, 0.01, 0.001)
ALL_METHODS = ("bchg", "hpgd_td", "hpgd_mc", "naive")
SUMMARY_WINDOW = 100
COMPONENTS = ("J", "stability", "hvac_energy", "insulation", "airflow")
SETTING_KEYS = (
    "seeds",
    "seed",
    "grid",
    "lr",
    "iterations",
    "critic",
    "follower_grad",
    "no_baseline",
    "no_control_variates",
    "episodes",
    "beta",
    "init_std",
    "mlp_steps",
    "mlp_warm_start",
    "value_samples",
    "mlp_lr",
    "mlp_minibatch",
    "mlp_normalize",
    "mlp_kernel",
)
SETTING_KEYS += FOLLOWER_SETTINGS + SHARED_SETTINGS
# the flags only the MLP critic reads (refused with another --critic)
MLP_CRITIC = tuple(k for k in SETTING_KEYS if k.startswith("mlp_")) + ("value_samples",)
# --smoke's MLP critic: at most this many Adam steps and value samples
SMOKE_MLP_STEPS, SMOKE_VALUE_SAMPLES = 5, 8
# the MLP critic's training flags that --faithful holds at their defaults (the paper's critic)
FAITHFUL_CRITIC = (
    "mlp_steps",
    "mlp_lr",
    "mlp_minibatch",
    "mlp_normalize",
    "mlp_warm_start",
    "value_samples",
)


def parse_args(argv=None):
    from experiments.cli import add_follower_args, base_parser

    p = base_parser(
        "thermal",
        __doc__,
        seeds=10,
        iterations=2000,
        chunk=100,
        methods=ALL_METHODS,
        also="also 'exact' (ascent on the exact hypergradient)",
        grid_flags="--lr",
        grid_help="lr in {" + ", ".join(map(str, PAPER_LR)) + "}",
        smoke=(6, 3),
        smoke_help="at most 4 episodes, 5 MLP critic steps and 8 value samples",
    )
    g = p.add_argument_group("thermal control options")
    g.add_argument(
        "--lr",
        type=float,
        nargs="+",
        default=[0.1],
        help="leader learning rate(s); several values form a grid",
    )
    g.add_argument(
        "--critic",
        choices=["quadratic_loo", "quadratic", "mlp", "exact"],
        default="quadratic_loo",
        help="leader critic (and HPGD's grad V_F network): LSTD on quadratic features "
        "(exact class, fast), cross-fitted (each episode's fit from the other episodes: "
        "no in-sample bias, only the fit's small finite-sample one) or on the whole batch, "
        "the paper's 64-64 TD MLP, or closed form",
    )
    g.add_argument(
        "--follower-grad",
        choices=["pathwise", "score"],
        default="pathwise",
        help="per-step FollowerQGrad form (score = the paper's Eq. (nablaQF))",
    )
    g.add_argument(
        "--no-baseline",
        action="store_true",
        help="BC-HG without the learned state baseline h(s) ~ grad V_F(s)",
    )
    g.add_argument(
        "--no-control-variates",
        action="store_true",
        help="no E[V(s')|s,b] control variates in the score-function terms",
    )
    g.add_argument(
        "--faithful",
        action="store_true",
        help="the paper's estimator: --critic mlp --follower-grad score --no-baseline "
        "--no-control-variates, with the MLP critic's flags at their defaults (the paper's "
        "critic; a changed one is refused: give those flags without --faithful; with "
        "--config FILE of a run that was not faithful, FILE's critic settings are replaced "
        "by the paper's; a faithful run's FILE edited to another critic is refused)",
    )
    g.add_argument("--episodes", type=int, default=100, help="episodes of 100 steps per iteration")
    g.add_argument("--beta", type=float, default=0.1, help="follower entropy coefficient")
    g.add_argument(
        "--init-std",
        type=float,
        default=0.01,
        help="std of the initial leader weights around 0 (the reference code: 0.01; "
        "the paper's text: 1.0)",
    )
    g.add_argument("--mlp-steps", type=int, default=5000, help="Adam steps of the MLP critics")
    g.add_argument(
        "--value-samples",
        type=int,
        default=256,
        help="MLP critic: follower samples per state for V_L(s)",
    )
    g.add_argument("--mlp-lr", type=float, default=1e-4, help="Adam step size of the MLP critics")
    g.add_argument(
        "--mlp-minibatch",
        type=int,
        default=0,
        help="samples per MLP critic step (0: full batch, the paper)",
    )
    g.add_argument(
        "--mlp-kernel",
        choices=("xla", "fused"),
        default="xla",
        help="how the leader's MLP critic is fitted: xla (any backend) or fused (two Pallas "
        "kernels per Adam step on a CUDA GPU instead of XLA's 27; the same fit up to float "
        "rounding; full batch, float32; allowed with --faithful)",
    )
    g.add_argument(
        "--mlp-normalize",
        action="store_true",
        help="MLP critics see inputs / RMS and predict outputs / (RMS(r) / (1 - gamma))",
    )
    g.add_argument(
        "--mlp-warm-start",
        action="store_true",
        help="MLP critics continue from the last iteration's fit (the paper "
        "re-initialises them every iteration)",
    )
    from bchg_jax.lq.train import FOLLOWERS  # the follower models the family simulates

    add_follower_args(p, FOLLOWERS, "the estimate (before clipping)")
    a = p.parse_args(argv)
    if a.faithful:
        # --faithful fixes the estimator and the paper's critic training (the parser's
        # defaults); an explicit flag asking for another value is an error, not a run that
        # config.json would call faithful
        fixed = {"critic": "mlp", "follower_grad": "score"}
        fixed.update({k: p.get_default(k) for k in FAITHFUL_CRITIC})
        file_args = getattr(a, "_config_args", None)
        if file_args is not None and "faithful" in a._explicit and not file_args.get("faithful"):
            # --faithful on the command line wins over FILE's critic, as any flag given does
            # (FILE's values were kept, and config.json called that run faithful)
            for k in FAITHFUL_CRITIC:
                if k not in a._explicit:
                    setattr(a, k, fixed[k])
        kept = {k: {v} for k, v in fixed.items()}  # what FILE may hold
        if file_args is not None and file_args.get("smoke"):  # and its smoke reductions
            kept["mlp_steps"].add(min(fixed["mlp_steps"], SMOKE_MLP_STEPS))
            kept["value_samples"].add(min(fixed["value_samples"], SMOKE_VALUE_SAMPLES))

        def flag(k):
            return f"--{k.replace('_', '-')}" + (
                "" if isinstance(fixed[k], bool) else f" {getattr(a, k)}"
            )

        clash = [flag(k) for k in fixed if k in a._explicit and getattr(a, k) != fixed[k]]
        # a FILE whose critic settings were changed by hand after a faithful run
        edited = [
            flag(k)
            for k in fixed
            if k not in a._explicit and k in (file_args or {}) and getattr(a, k) not in kept[k]
        ]
        if clash or edited:
            from experiments.cli import fail

            source = "" if "faithful" in a._explicit else f" (from --config {a.config})"
            fix = [f"drop {' and '.join(clash)}"] if clash else []
            if edited:
                fix.append(f"restore {' and '.join(edited)} in {a.config} to the paper's values")
            fail(
                f"--faithful{source} is the paper's estimator and critic: --critic mlp "
                f"--follower-grad score --no-baseline --no-control-variates with the critic "
                f"flags at their defaults; {', and '.join(fix)}, or give those flags "
                f"without --faithful"
            )
        a.critic, a.follower_grad, a.no_baseline, a.no_control_variates = (
            "mlp",
            "score",
            True,
            True,
        )
    if smoke_requested(a):  # not from a --config file: its values are reduced already
        a.episodes, a.mlp_steps = min(a.episodes, 4), min(a.mlp_steps, SMOKE_MLP_STEPS)
        a.value_samples = min(a.value_samples, SMOKE_VALUE_SAMPLES)
    return a


def methods_of(spec: str):
    from bchg_jax import lq
    from experiments.cli import parse_methods

    return parse_methods(spec, ALL_METHODS, lq.METHODS)


def train_config(a):
    from bchg_jax import lq
    from experiments.cli import follower_model

    return lq.TrainConfig(
        num_episodes=a.episodes,
        iterations=a.iterations,
        weights_init_std=a.init_std,
        critic=a.critic,
        follower_grad=a.follower_grad,
        state_baseline=not a.no_baseline,
        control_variates=not a.no_control_variates,
        mlp_steps=a.mlp_steps,
        mlp_warm_start=a.mlp_warm_start,
        value_samples=a.value_samples,
        mlp_lr=a.mlp_lr,
        mlp_minibatch=a.mlp_minibatch,
        mlp_normalize=a.mlp_normalize,
        mlp_kernel=a.mlp_kernel,
        follower=follower_model(a),
        track_reference=a.track_reference,
    ).validate()


def method_grid(a):
    import numpy as np

    lrs = PAPER_LR if a.grid == "paper" else a.lr
    return {"lr": np.asarray(lrs, np.float64), "beta": np.full(len(lrs), a.beta)}


def unread_flags(a, methods) -> dict:
    """{flag dest: why} for the flags no method of ``methods`` reads with these settings
    (:func:`experiments.cli.refuse_unread`): ``lq.make_train`` reads the MLP settings only for
    ``critic="mlp"`` (the leader's Q_L fit's, ``value_samples`` and ``mlp_kernel``, not for
    ``hpgd_mc``, which uses Monte Carlo returns), the FollowerQGrad form only for a guided
    method, the state baseline only for BC-HG, and the exact method none of the estimator's
    settings."""
    from bchg_jax.lq.train import METHOD_SPECS

    guides = {METHOD_SPECS[m][0] for m in methods}  # None: exact
    if guides == {None}:
        why = "--method exact ascends the exact hypergradient: no critic, estimator or episodes"
        keys = ("critic", "faithful", "follower_grad", "no_baseline", "no_control_variates")
        return dict.fromkeys(keys + ("episodes",) + MLP_CRITIC, why)
    unread = {}
    if a.critic != "mlp":
        why = f"settings of the MLP critic, and this run has --critic {a.critic}"
        unread.update(dict.fromkeys(MLP_CRITIC, why))
    elif all(METHOD_SPECS[m][1] == "mc" for m in methods):
        why = (
            "settings of the leader's MLP Q_L fit, and this run's methods use Monte Carlo "
            "returns instead"
        )
        unread.update(dict.fromkeys(("value_samples", "mlp_kernel"), why))
    if not guides & {"benefit", "hpgd"}:
        unread["follower_grad"] = "FollowerQGrad's form, estimated by bchg and hpgd_* only"
    if "benefit" not in guides:
        unread["no_baseline"] = "BC-HG's state baseline, and this run has no bchg"
    return unread


def validate_args(a):
    from bchg_jax.lq.train import METHOD_SPECS, HParams
    from experiments.cli import check_counts, refuse_unread

    methods = methods_of(a.method)
    check_counts(a, "seeds", "iterations", "chunk", "episodes")
    refuse_unread(a, unread_flags(a, methods))
    if not (math.isfinite(a.init_std) and a.init_std >= 0):  # NaN compared False
        raise ValueError(f"--init-std must be finite and >= 0, got {a.init_std}")
    train_config(a)
    fitted = [m for m in methods if METHOD_SPECS[m][0] is not None and METHOD_SPECS[m][1] != "mc"]
    if a.dtype != "float32" and a.critic == "mlp" and a.mlp_kernel == "fused" and fitted:
        raise ValueError(
            f"--mlp-kernel fused computes in float32, and this run has --dtype {a.dtype}; use "
            "--mlp-kernel xla"
        )
    HParams.from_grid(method_grid(a))
    return methods


def run_method(method: str, a, run_dir: str):
    from bchg_jax import lq
    from bchg_jax.problems.thermal import thermal
    from experiments.plot import YLABELS, pretty_label
    from experiments.run_folder import run_method_folder

    config = train_config(a)
    trainer = lq.make_train(thermal(dtype=a.dtype), method, config)
    sampled = method != "exact"  # exact ascent uses no critic, estimator or episodes
    return run_method_folder(
        os.path.join(run_dir, method),
        method,
        trainer,
        method_grid(a),
        a,
        record={"train_config": dataclasses.asdict(config)},
        title=f"building thermal control, {pretty_label(method)}: "
        + (f"{a.critic} critic, " if sampled else "")
        + f"β={a.beta:g}, {a.seeds} seeds",
        window=SUMMARY_WINDOW,
        ylabel=YLABELS["thermal"],
        describe=(
            f"thermal critic={a.critic} follower-grad={a.follower_grad} episodes={a.episodes}"
            if sampled
            else "thermal exact hypergradient (no sampling)"
        ),
    )


def components_png(run_dir: str) -> None:
    from bchg_jax.core.io import save_figure
    from experiments.plot import components_figure

    save_figure(os.path.join(run_dir, "components.png"), components_figure(run_dir, COMPONENTS))


def main(argv=None) -> str:
    from experiments.run_folder import run_experiment

    return run_experiment(
        "thermal",
        argv,
        parse_args,
        validate_args,
        run_method,
        SETTING_KEYS,
        SUMMARY_WINDOW,
        components_png,
    )


if __name__ == "__main__":
    main()
