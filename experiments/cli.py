"""The command line shared by the experiment CLIs: the common flags (``base_parser``), ``--smoke``,
``--config FILE`` (a saved run's settings), the arguments of ``--resume DIR``, settings older
runs were saved without (``LEGACY_SETTINGS``), and bad-input errors (``fail``: ``error: ...``,
exit status 2). Imports nothing else of the repository.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shlex
import sys
from typing import Sequence, Tuple

SMOKE_SEEDS = 2  # --smoke runs at most this many seeds
_UNSET = object()  # marks flags not given on the command line
# flags that name where and how a run executes, never its settings: --config and --resume do not
# take them from a saved config.json, and --resume accepts them changed
NOT_SETTINGS = ("config", "resume", "out", "exact_out", "shard", "distributed", "chunk")


# settings added after runs were saved without them: the value those runs were made with, or a
# function of the saved arguments that gives it (a resumed run keeps it; a new run gets the
# flag's default)
LEGACY_SETTINGS = {
    "solver": "dense",
    # every run computed in float32 before --dtype
    "dtype": "float32",
    # the LQR game's critic ring and target rate (fixed by the preset before they were flags)
    "replay": lambda saved: 200 if saved.get("preset") == "explore" else 0,
    "tau": lambda saved: 0.05 if saved.get("preset") == "explore" else 0.01,
    "explore_episodes": lambda saved: 2 if saved.get("preset") == "explore" else 0,
    # the follower model: runs before it had the paper's best-response follower
    "follower": "best_response",
    "follower_steps": 1,
    "follower_mix": 0.1,
    "follower_lr": 0.1,
    "follower_explore": 0.0,
    "track_reference": False,
    # Four-Rooms' rollout and SARSA pass in parallel form
    "parallel_steps": False,
    # thermal's MLP critic fit (before the fused Pallas form)
    "mlp_kernel": "xla",
    # the LQR game's deterministic-leader follower reaction (Theorem 3's form before)
    "reaction": "q_gradient",
    # the LQR game's control variate of the guiding term (fixed by the preset before the flag)
    "influence_cv": lambda saved: "on" if saved.get("preset") == "explore" else "off",
}


# (flag dest, value): where a value that a saved run may hold, and the flag no longer takes, went
RETIRED_VALUES = {
    ("estimator", "shuffled"): "the LQR game's 'shuffled' control runs as python -m "
    "benchmarks.lqr_game_controls",
}


def with_legacy(saved: dict, dests) -> dict:
    """``saved`` (a config.json's arguments) completed with the :data:`LEGACY_SETTINGS` value of
    every setting among ``dests`` (the CLI's flags) that it was saved without."""
    legacy = {
        k: v(saved) if callable(v) else v
        for k, v in LEGACY_SETTINGS.items()
        if k in dests and k not in saved
    }
    return {**legacy, **saved}


def smoke_requested(a) -> bool:
    """``--smoke`` was given on this command line. A ``--config`` file of a smoke run carries
    ``smoke: true`` with its reduced values: every flag given beside it must win, so a CLI's
    ``--smoke`` reductions apply only when this is true."""
    return bool(a.smoke) and "smoke" in a._explicit


def fail(message: str) -> None:
    """Prints ``error: message`` to stderr and exits with status 2 (bad input)."""
    print(f"error: {message}", file=sys.stderr)
    raise SystemExit(2)


def saved_args(a) -> dict:
    """The arguments recorded in config.json (``vars(a)`` without private entries)."""
    return {k: v for k, v in vars(a).items() if not k.startswith("_")}


def jsonable(v):
    """A parsed argument as config.json stores it (tuples as lists)."""
    return json.loads(json.dumps(v))


def read_run_config(path: str, flag: str) -> dict:
    """A config.json as a dict; exits 2 with ``error: FLAG PATH: ...`` when unreadable."""
    try:
        with open(path) as f:
            cfg = json.load(f)
        if not isinstance(cfg, dict) or not isinstance(cfg.get("args"), dict):
            raise ValueError("it has no 'args' (not a bchg-jax config.json)")
    except (OSError, ValueError) as err:
        fail(f"{flag} {path}: cannot read it: {getattr(err, 'strerror', None) or err}")
    return cfg


def apply_config_file(parser: argparse.ArgumentParser, a) -> None:
    """``--config FILE``: every setting of FILE (a run's or a method's ``config.json``) that was
    not given on the command line; the flags of :data:`NOT_SETTINGS` are never taken from it,
    and a setting FILE lacks because it predates the flag gets its :data:`LEGACY_SETTINGS` value."""
    cfg = read_run_config(a.config, "--config")
    prog = parser.prog.rsplit(".", 1)[-1]
    if cfg.get("experiment", prog) != prog:
        fail(f"--config {a.config} holds a {cfg['experiment']} run, not {prog}")
    dests = {x.dest for x in parser._actions}
    foreign = sorted(set(cfg["args"]) - dests)
    if foreign:
        fail(f"--config {a.config}: settings {foreign} are not flags of {parser.prog}")
    a._config_args = dict(cfg["args"])  # what FILE set (a CLI may need to know)
    actions = {x.dest: x for x in parser._actions}
    for k, v in cfg["args"].items():
        if k not in a._explicit and k not in NOT_SETTINGS:
            setattr(a, k, saved_value(actions[k], v, f"--config {a.config}"))
    for k, v in LEGACY_SETTINGS.items():  # a file saved before the flag existed
        if k in dests and k not in cfg["args"] and k not in a._explicit:
            setattr(a, k, v(cfg["args"]) if callable(v) else v)
    if "method" in cfg and "method" not in a._explicit:  # a method folder's config.json
        a.method = cfg["method"]
    _reset_other_followers_settings(parser, a, cfg["args"].get("follower"))


def saved_value(action: argparse.Action, value, where: str):
    """A setting read from a config.json, checked and converted as its flag would be on the
    command line (the flag's type, its choices, one value or a list; a switch is true or
    false): a hand-written ``"seeds": 1.5`` or ``"lr": 0.2`` for a list failed deep inside the
    run with a traceback, after its folder was made. Exits 2 with ``error: WHERE: ...``; a
    value of :data:`RETIRED_VALUES` is told where it went."""
    flag = f"--{action.dest.replace('_', '-')}"

    def bad(why: str) -> None:
        fail(f"{where}: {action.dest} = {json.dumps(value)}: {why}")

    if action.nargs == 0:  # a switch (store_true)
        if not isinstance(value, bool):
            bad("must be true or false")
        return value
    if value is None:
        if action.default is None:  # an optional setting left unset
            return None
        bad("must not be null")

    def one(v):
        if v is None or isinstance(v, (bool, list, dict)):
            bad(f"{json.dumps(v)} is not a value of {flag}")
        text = repr(v) if isinstance(v, float) else str(v)  # repr: every digit of a float
        try:
            out = action.type(text) if action.type is not None else text
        except (TypeError, ValueError, argparse.ArgumentTypeError) as err:
            bad(f"{json.dumps(v)} is not a value of {flag} ({err})")
        if action.choices is not None and out not in action.choices:
            went = RETIRED_VALUES.get((action.dest, out))
            allowed = ", ".join(map(str, action.choices))
            bad(f"must be one of {allowed}" + (f" ({went})" if went else ""))
        return out

    if action.nargs in ("+", "*"):
        if not isinstance(value, list) or (action.nargs == "+" and not value):
            bad("must be a list of values (the flag takes several)")
        return [one(v) for v in value]
    return one(value)


def checked_saved_args(saved: dict, a, where: str, experiment: str) -> dict:
    """A resumed run's saved settings (its config.json's ``args``), each checked and converted
    as :func:`saved_value` checks a ``--config`` file's (a config.json edited by hand is read
    once more, then trained on); one the CLI has no flag for is refused, as ``--config``
    refuses it. ``a``: the command line's parse (its ``_actions``: the flags by dest)."""
    actions = a._actions
    foreign = sorted(set(saved) - set(actions))
    if foreign:
        fail(f"{where}: settings {foreign} are not flags of python -m experiments.{experiment}")
    return {
        k: v if k in NOT_SETTINGS else saved_value(actions[k], v, where) for k, v in saved.items()
    }


def _reset_other_followers_settings(parser, a, saved_kind) -> None:
    """``--config FILE --follower X`` with FILE of another follower model: FILE's settings of
    its model (``follower_steps`` of a ``k_step`` run, ...) are not X's, and would be refused
    as another model's setting off its default; they go back to their defaults unless given
    on the command line."""
    from bchg_jax.core.follower_model import SETTING_OF

    if "follower" not in a._explicit or saved_kind in (None, a.follower):
        return
    for k, kind in SETTING_OF.items():
        dest = f"follower_{k}"
        if kind != a.follower and hasattr(a, dest) and dest not in a._explicit:
            setattr(a, dest, parser.get_default(dest))


class HelpFormatter(argparse.RawDescriptionHelpFormatter, argparse.ArgumentDefaultsHelpFormatter):
    """Keeps the module docstring's line breaks and appends "(default: ...)" to every flag."""


class ExperimentParser(argparse.ArgumentParser):
    """An experiment CLI's parser. ``parse_args`` applies ``--smoke``: at most
    :data:`SMOKE_SEEDS` seeds and ``smoke_iterations`` iterations, chunks of ``smoke_chunk``
    unless ``--chunk`` is given (a CLI shrinks its own flags after that)."""

    def __init__(
        self, *args, smoke_iterations: int, smoke_chunk: int, grid_flags: str = "", **kwargs
    ):
        super().__init__(*args, **kwargs)
        self.smoke_iterations, self.smoke_chunk = smoke_iterations, smoke_chunk
        self.grid_flags = re.findall(r"--[\w-]+", grid_flags)  # what --grid paper replaces

    def parse_args(self, args=None, namespace=None):
        args = sys.argv[1:] if args is None else list(args)
        values = {}  # every value each flag was given, in order

        class Given(argparse.Namespace):
            def __setattr__(self, k, v):
                if v is not _UNSET:
                    values.setdefault(k, []).append(v)
                super().__setattr__(k, v)

        unset = Given(**{x.dest: _UNSET for x in self._actions})
        given = super().parse_args(args, unset)
        explicit = {k for k, v in vars(given).items() if v is not _UNSET}
        for k, vs in values.items():  # argparse keeps the last value and drops the others
            if any(repr(v) != repr(vs[0]) for v in vs[1:]):  # by repr: nan is nan
                shown = [" ".join(map(str, v)) if isinstance(v, list) else str(v) for v in vs]
                flag = f"--{k.replace('_', '-')}"
                each = dict.fromkeys(
                    str(x) for v in vs for x in (v if isinstance(v, list) else [v])
                )
                grid = f" (a grid's values follow one flag: {flag} {' '.join(each)})"
                fail(
                    f"{flag} is given {len(vs)} times ({', then '.join(shown)}); only the last "
                    "would be used: give it once" + (grid if isinstance(vs[0], list) else "")
                )
        a = super().parse_args(args, namespace)
        a._explicit = frozenset(explicit)
        a._actions = {x.dest: x for x in self._actions}  # --resume checks the saved values
        if getattr(a, "config", None):
            apply_config_file(self, a)
        given = [f for f in self.grid_flags if f[2:].replace("-", "_") in a._explicit]
        if getattr(a, "grid", None) == "paper" and given:  # they were silently ignored
            fail(f"--grid paper sweeps its own values; drop {' and '.join(given)} or --grid paper")
        if smoke_requested(a):
            caps = (("seeds", SMOKE_SEEDS), ("iterations", self.smoke_iterations))
            over = [
                f"--{k} {getattr(a, k)}" for k, n in caps if k in a._explicit and getattr(a, k) > n
            ]
            if over:  # it would be cut silently (a --smoke run resumed to extend it stayed put)
                fail(
                    f"--smoke runs at most {SMOKE_SEEDS} seeds and {self.smoke_iterations} "
                    f"iterations; {' and '.join(over)} would be cut: drop --smoke or "
                    f"{' and '.join(o.split()[0] for o in over)} (to extend a --smoke run, "
                    "--resume it without --smoke)"
                )
            a.seeds, a.iterations = (
                min(a.seeds, SMOKE_SEEDS),
                min(a.iterations, self.smoke_iterations),
            )
            if "chunk" not in a._explicit:  # an explicit --chunk is kept (and checked)
                a.chunk = self.smoke_chunk
        return a


def base_parser(
    experiment: str,
    description: str,
    *,
    seeds: int,
    iterations: int,
    chunk: int,
    methods: Sequence[str],
    also: str = "",
    noun: str = "method",
    grid_flags: str,
    grid_help: str,
    smoke: Tuple[int, int],
    smoke_help: str = "",
) -> ExperimentParser:
    """The flags every experiment CLI shares, with that experiment's defaults.

    ``methods``: what ``--method all`` runs; ``also``: text on the other accepted names;
    ``grid_flags``: the flags ``--grid none`` takes the grid from, ``grid_help``: what
    ``--grid paper`` sweeps; ``smoke``: (iterations, chunk) of ``--smoke``,
    ``smoke_help``: the CLI's other ``--smoke`` reductions. The CLI adds its own flags (in
    ``parser.add_argument_group(...)``) and calls ``parse_args``.
    """
    p = ExperimentParser(
        grid_flags=grid_flags,
        prog=f"python -m experiments.{experiment}",
        description=description,
        formatter_class=HelpFormatter,
        smoke_iterations=smoke[0],
        smoke_chunk=smoke[1],
    )
    p.add_argument(
        "--seeds",
        type=int,
        default=seeds,
        help="number of seeds (independent runs of every grid point)",
    )
    p.add_argument(
        "--seed",
        type=int,
        default=0,
        help="base seed: seed i runs with the key fold_in(key(SEED), i)",
    )
    p.add_argument(
        "--method",
        default="bchg",
        help=f"a {noun}, a comma-separated list, or 'all' (= {', '.join(methods)})"
        + (f"; {also}" if also else ""),
    )
    p.add_argument(
        "--grid",
        choices=["none", "paper"],
        default="none",
        help=f"'none': the values of {grid_flags}; 'paper': {grid_help}",
    )
    p.add_argument("--iterations", type=int, default=iterations, help="outer iterations per run")
    p.add_argument(
        "--chunk",
        type=int,
        default=chunk,
        help="iterations per jitted chunk; after every chunk the progress is printed "
        "and <method>/metrics.npz and the orbax checkpoint folder "
        "<method>/checkpoint/<iteration>/ are rewritten",
    )
    p.add_argument(
        "--out",
        default="results",
        help=f"results root: the run folder is <out>/{experiment}/<timestamp>/",
    )
    p.add_argument(
        "--exact-out",
        action="store_true",
        help=f"use --out itself as the run folder (no {experiment}/<timestamp>/ "
        "subfolder); a folder of the same settings gets the new methods added",
    )
    p.add_argument(
        "--resume",
        metavar="DIR",
        default=None,
        help="continue the run in the run folder DIR (the folder holding config.json "
        "and one folder per method) with its saved settings: every method "
        "continues from its orbax checkpoint DIR/<method>/checkpoint/<iteration>/"
        "; complete methods are skipped. A larger --iterations extends the run; "
        "--chunk, --shard and --distributed may change; any other changed "
        "setting is refused",
    )
    p.add_argument(
        "--config",
        metavar="FILE",
        default=None,
        help="take every setting from FILE, a run's (or one method's) config.json, "
        "to repeat that run exactly; flags given on the command line override "
        "it (--out, --exact-out, --chunk, --shard are never taken from FILE)",
    )
    p.add_argument(
        "--dtype",
        choices=DTYPES,
        default="float32",
        help="the float dtype of the problem, the trainer and its results; float64 switches "
        "jax_enable_x64 on for the run: slower (much slower on a GPU), for when a WARNING says "
        "float32 rounded the follower's logits (a small --beta) or J",
    )
    add_scale_args(p)
    p.add_argument(
        "--smoke",
        action="store_true",
        help=f"tiny run: at most {SMOKE_SEEDS} seeds and {smoke[0]} iterations, "
        f"chunks of {smoke[1]} unless --chunk is given" + (f", {smoke_help}" if smoke_help else ""),
    )
    return p


def add_scale_args(p: argparse.ArgumentParser) -> None:
    """``--shard`` and ``--distributed``, shared by the experiment CLIs."""
    p.add_argument(
        "--shard",
        action="store_true",
        help="split the seeds x grid runs over every JAX device (jax.shard_map)",
    )
    p.add_argument(
        "--distributed",
        action="store_true",
        help="multi-host: call jax.distributed.initialize() (coordinator, process "
        "count and id from the cluster environment or JAX_COORDINATOR_ADDRESS, "
        "JAX_NUM_PROCESSES, JAX_PROCESS_ID), shard over every host's devices; "
        "process 0 writes the results",
    )


# the settings of base_parser's flags that define a run (part of every CLI's SETTING_KEYS: a
# second command into the same folder may add methods, not change them)
SHARED_SETTINGS = ("dtype",)

# the follower-model flags (add_follower_args), settings of every run folder that has them
FOLLOWER_SETTINGS = (
    "follower",
    "follower_steps",
    "follower_mix",
    "follower_lr",
    "follower_explore",
    "track_reference",
)


# what --follower's help says of each kind
FOLLOWER_HELP = {
    "best_response": "solved every iteration, the paper",
    "k_step": "K steps of its own solver per iteration from its last value: soft Bellman backups "
    "on tables, Riccati steps in the linear-quadratic problems",
    "lag": "mixes its last policy with the best response: the action probabilities on tables, "
    "the gain and covariance in the linear-quadratic problems",
    "q_learning": "soft Q-learning on its own transitions of the leader's batch, a black box",
}


def add_follower_args(
    p: argparse.ArgumentParser, kinds=None, estimate="the estimate", exact_method=True
) -> None:
    """``--follower`` and its settings (:class:`bchg_jax.core.follower_model.FollowerModel`),
    and ``--track-reference``; ``kinds``: the follower models the experiment's family simulates
    (default all), whose settings get flags; ``estimate``: what the experiment compares with
    the references (for the help text); ``exact_method``: whether the experiment has an
    ``exact`` method (the help says what it ascends)."""
    from bchg_jax.core.follower_model import FOLLOWERS

    kinds = tuple(kinds or FOLLOWERS)
    g = p.add_argument_group("follower model (docs/followers.md)")
    g.add_argument(
        "--follower",
        choices=kinds,
        default="best_response",
        help="the simulated follower: "
        + ", ".join(f"'{k}' ({FOLLOWER_HELP[k]})" for k in kinds)
        + (
            "; the exact method ascends the best response's exact hypergradient whatever the "
            "follower"
            if exact_method
            else ""
        ),
    )
    g.add_argument(
        "--track-reference",
        action="store_true",
        help=f"every iteration, compare {estimate} with the two exact references of a "
        "follower off its best response: metrics cos_target, proj_target (the follower's "
        "policy as if optimal), cos_through, proj_through (through its actual update); "
        "two exact gradients per iteration",
    )
    if "k_step" in kinds:
        g.add_argument("--follower-steps", type=int, default=1, help="K of --follower k_step")
    if "lag" in kinds:
        g.add_argument(
            "--follower-mix",
            type=float,
            default=0.1,
            help="--follower lag: the weight of the new best response, in (0, 1]",
        )
    if "q_learning" in kinds:
        g.add_argument(
            "--follower-lr",
            type=float,
            default=0.1,
            help="--follower q_learning: the step size, in (0, 1]",
        )
        g.add_argument(
            "--follower-explore",
            type=float,
            default=0.0,
            help="--follower q_learning: probability of a uniformly random action, in [0, 1]",
        )


def follower_note(config, prefix: str) -> str:
    """``prefix`` + the follower model's label, or "" for the best response (as before)."""
    return "" if config.follower.best_response else prefix + config.follower.label


def follower_model(a):
    """The validated :class:`~bchg_jax.core.follower_model.FollowerModel` of the flags; the
    error names the flag."""
    from bchg_jax.core.follower_model import SETTING_OF, FollowerModel

    # a model's own flag given for another model was silently ignored
    for k, kind in SETTING_OF.items():
        if f"follower_{k}" in getattr(a, "_explicit", ()) and a.follower != kind:
            raise ValueError(
                f"--follower-{k} is a setting of --follower {kind}, and this run has "
                f"--follower {a.follower}: add --follower {kind} or drop --follower-{k}"
            )
    defaults = FollowerModel()
    model = FollowerModel(
        a.follower,
        *(getattr(a, f"follower_{k}", getattr(defaults, k)) for k in ("steps", "mix", "lr")),
        getattr(a, "follower_explore", defaults.explore),
    )
    try:
        return model.validate()
    except ValueError as e:
        message = re.sub(
            r"FollowerModel\.(\w+)", lambda m: f"--follower-{m.group(1)} ({m.group(0)})", str(e)
        )
        raise ValueError(message.replace("--follower-kind", "--follower")) from None


def parse_methods(spec: str, all_methods: Sequence[str], valid: Sequence[str]):
    """``--method`` value -> list of names: 'all', one name or a comma-separated list (a name
    given twice counts once; an empty one, as in ``bchg,,naive``, is refused: a name may have
    been lost)."""
    names = list(all_methods) if spec == "all" else [m.strip() for m in spec.split(",")]
    names = list(dict.fromkeys(names))
    if "" in names:
        raise ValueError(
            f"--method {spec!r} has an empty name between its commas; give 'all' or names "
            f"from {tuple(valid)} separated by single commas"
        )
    if not names or any(m not in valid for m in names):
        raise ValueError(f"--method must be 'all' or names from {tuple(valid)}, got {spec!r}")
    return names


def check_distinct_values(a) -> None:
    """Every list of values given to a flag (the grid axes: ``--lr 0.1 0.05``, ...) holds each
    value once, compared in the run's ``--dtype`` (float32 unless given): a repeated one would
    train the same grid point twice and report both (as would 0.1 and 0.1000000001, one value
    in float32).

    Raises:
      ValueError: naming the flag and the value repeated.
    """
    import numpy as np

    dtype = getattr(a, "dtype", "float32")
    for dest, values in vars(a).items():
        if dest.startswith("_") or not isinstance(values, (list, tuple)):
            continue
        seen = {}
        for v in values:
            if isinstance(v, (int, float)) and not isinstance(v, bool):
                rounded = float(np.asarray(v, dtype))  # the value the trainer computes with
                if rounded in seen:
                    same = f"{v:g}" if seen[rounded] == v else f"{seen[rounded]!r} and {v!r}"
                    raise ValueError(
                        f"--{dest.replace('_', '-')} repeats {same} (one value in {dtype}): each "
                        "value is a grid point, and a repeated one would train the same runs "
                        "twice (use --seeds for more runs of one setting)"
                    )
                seen[rounded] = v


def check_base_seed(a) -> None:
    """``--seed`` is in [0, 2**32 - 1]: JAX reads a seed as a 32-bit word, so a larger one gave
    another seed's runs (``--seed 4294967297`` trained ``--seed 1``'s without x64) and a
    negative one keys that change with ``jax_enable_x64``.

    Raises:
      ValueError: naming the flag and the value given.
    """
    from bchg_jax.core.sweep import SEED_LIMIT

    if not 0 <= a.seed < SEED_LIMIT:
        raise ValueError(f"--seed must be in [0, {SEED_LIMIT - 1}], got {a.seed}")


def check_counts(a, *flags: str) -> None:
    """Each named flag (attribute names of ``a``) is an integer >= 1; the error names the flag
    and the value given."""
    for flag in flags:
        value = getattr(a, flag)
        if value < 1:
            raise ValueError(f"--{flag.replace('_', '-')} must be >= 1, got {value}")


def refuse_unread(a, unread) -> None:
    """Refuses the flags given on the command line (not from ``--config``) that no method of
    the run reads: they would be recorded in config.json as if they had been used.

    Args:
      a: the parsed arguments.
      unread: {flag dest: why it is not read} for this run's methods and settings.
    Raises:
      ValueError: naming each such flag, why, and what to do.
    """
    given = {}
    for dest, why in unread.items():
        if dest in getattr(a, "_explicit", ()):
            given.setdefault(why, []).append(f"--{dest.replace('_', '-')}")
    if given:
        parts = [f"{' and '.join(flags)} would be ignored ({why})" for why, flags in given.items()]
        many = sum(map(len, given.values())) > 1
        raise ValueError("; ".join(parts) + f": drop {'them' if many else 'it'}")


def flag_names(message: str, a, config_flags=None) -> str:
    """An error message from a library config check, with each ``TrainConfig.<field>`` that is
    also a command-line flag named as the flag (``--tau (TrainConfig.tau)``), and each
    ``<Part>Config.<field>`` that ``config_flags`` maps to a flag's dest likewise
    (``{"CriticConfig.lr": "critic_lr"}``: ``--critic-lr (CriticConfig.lr)``), so the user sees
    what to change."""

    def named(m):
        dest = (config_flags or {}).get(m.group(0))
        if dest is None and m.group(1) == "TrainConfig":
            dest = m.group(2)
        if dest is not None and dest in vars(a):
            return f"--{dest.replace('_', '-')} ({m.group(0)})"
        return m.group(0)

    message = re.sub(r"\b(\w*Config)\.(\w+)", named, message)
    # a hyperparameter's check names its field ("lr must be ..."): the flag that set it
    lead = re.match(r"(\w+)(?: \([^)]*\))? must ", message)  # "beta (follower ...) must"
    if lead and lead.group(1) in vars(a) and not lead.group(1).startswith("_"):
        message = f"--{lead.group(1).replace('_', '-')}{message[len(lead.group(1)) :]}"
    return message


DTYPES = ("float32", "float64")


def use_dtype(dtype: str) -> None:
    """``--dtype float64``: switches ``jax_enable_x64`` on for this process (a training command
    is a process of its own), before the run builds a problem or its folder records the
    setting; without it JAX would compute the float64 run in float32. float32 leaves the
    setting as the environment gave it (``JAX_ENABLE_X64``)."""
    if dtype == "float64":
        import jax

        jax.config.update("jax_enable_x64", True)


def check_same_x64(cfg: dict, run_dir: str, how: str = "") -> None:
    """Exits 2 unless ``jax_enable_x64`` is as when the run in ``run_dir`` started (its
    ``config.json`` records it; older runs do not, and are not checked): a float32 run computes
    a few scalars in float64 under x64 (optax Adam's bias correction), so it would go on
    differently from the run it continues. ``how`` names the command that continues it in the
    message (default ``--resume run_dir``; a run re-opened with ``--exact-out`` too)."""
    import jax

    saved = cfg.get("jax_enable_x64")
    if saved is not None and bool(saved) != bool(jax.config.jax_enable_x64):
        fail(
            f"{how or '--resume ' + run_dir}: the run was started with jax_enable_x64="
            f"{bool(saved)}, and it is {bool(jax.config.jax_enable_x64)} now; go on with "
            "JAX_ENABLE_X64="
            f"{int(bool(saved))} (x64 changes a float32 run's arithmetic, so it would not "
            "continue bit for bit)"
        )


def _enclosing_run(path: str, levels: int = 3):
    """The run folder ``path`` lies in (a method's folder, its checkpoint folder or a step of
    it: up to ``levels`` folders up) as ``(folder, experiment)``, or None. The climb passes a
    method's config.json and stops at any other."""
    d = os.path.dirname(os.path.abspath(path))
    for _ in range(levels):
        cfg_path = os.path.join(d, "config.json")
        if os.path.exists(cfg_path):
            try:
                with open(cfg_path) as f:
                    cfg = json.load(f)
            except (OSError, ValueError):
                return None
            if not (isinstance(cfg, dict) and isinstance(cfg.get("args"), dict)):
                return None  # not a bchg-jax config.json
            if "experiment" in cfg:
                return d, cfg["experiment"]
            # a method's config.json: its run folder is one up
        if os.path.dirname(d) == d:
            return None
        d = os.path.dirname(d)
    return None


def resume_args(a, experiment: str):
    """For ``--resume DIR``: DIR's saved arguments, with ``--iterations`` (extend only) and the
    flags of :data:`NOT_SETTINGS` taken from the command line. Exits 2 with a message naming the
    right folder when DIR is a method's folder or no run folder, and refuses every other
    setting given with a value that differs from the saved one."""
    run_dir = os.path.normpath(a.resume)
    for flag in ("out", "exact_out", "config"):
        if flag in a._explicit:
            fail(
                f"--resume continues the run in {a.resume} in place, with its saved settings; "
                f"drop --{flag.replace('_', '-')}"
            )
    cfg_path = os.path.join(run_dir, "config.json")
    parent = os.path.dirname(os.path.abspath(run_dir))
    run = _enclosing_run(run_dir)  # e.g. DIR/bchg/checkpoint -> DIR, not DIR/bchg
    method_folder = os.path.exists(cfg_path) and "experiment" not in read_run_config(
        cfg_path, "--resume"
    )
    if method_folder or (not os.path.exists(cfg_path) and run is not None):
        folder, owner = run if run is not None else (parent, experiment)
        fail(
            f"--resume {a.resume} is a method's folder inside a run; resume the run folder: "
            f"python -m experiments.{owner} --resume {shlex.quote(folder)}"
        )
    if not os.path.exists(cfg_path):
        fail(f"--resume {a.resume}: no config.json there (not a run folder)")
    cfg = read_run_config(cfg_path, "--resume")
    if cfg["experiment"] != experiment:
        fail(
            f"--resume {a.resume} holds a {cfg['experiment']} run; resume it with "
            f"python -m experiments.{cfg['experiment']} --resume {shlex.quote(a.resume)}"
        )
    where = f"--resume {a.resume}: its config.json"
    saved = checked_saved_args(with_legacy(cfg["args"], vars(a)), a, where, experiment)
    if saved["dtype"] == "float64" and cfg.get("jax_enable_x64") is False:
        fail(
            f"{where} has dtype float64, but the run was started with jax_enable_x64=False (a "
            "float32 run); was the file edited? Its dtype is float32"
        )
    use_dtype(saved["dtype"])  # a float64 run goes on with x64, as it started
    check_same_x64(cfg, a.resume)
    changed = [
        f"--{k.replace('_', '-')} {jsonable(saved.get(k))!r} there, "
        f"{jsonable(getattr(a, k))!r} given"
        for k in sorted(a._explicit)
        if k not in NOT_SETTINGS
        and k not in ("iterations", "method")
        and k in saved
        and jsonable(getattr(a, k)) != jsonable(saved[k])
    ]
    # another spelling of the saved methods ('all' for the list of all of them) is the same
    # setting: run_experiment compares the two as the experiment reads them (same_methods)
    method_given = getattr(a, "method", None) if "method" in a._explicit else None
    if changed:
        fail(
            f"{a.resume} holds a run with other settings ({'; '.join(changed)}); --resume "
            "continues a run with its saved settings (only --iterations may grow and --chunk, "
            "--shard, --distributed change); start a new run with another --out"
        )
    iterations = saved["iterations"]
    if "iterations" in a._explicit:
        if a.iterations < saved["iterations"]:
            fail(
                f"--resume {a.resume}: the run has --iterations {saved['iterations']}; a run "
                f"can be extended, not shortened (got --iterations {a.iterations})"
            )
        iterations = a.iterations
    keep = {k: getattr(a, k, False) for k in ("shard", "distributed")}
    if "chunk" in a._explicit:
        keep["chunk"] = a.chunk
    explicit = a._explicit
    a = argparse.Namespace(**{**vars(a), **saved, **keep})
    a.resume, a.out, a.exact_out, a.config = run_dir, run_dir, True, None
    a.iterations, a._explicit = iterations, explicit
    a._saved_iterations = saved["iterations"]  # < a.iterations: the run is being extended
    a._method_given = method_given if method_given != saved.get("method") else None
    return a


def same_methods(a, validate, methods) -> None:
    """After ``--resume DIR --method SPEC`` with SPEC spelled otherwise than the saved value:
    exits 2 unless SPEC names the same methods under the run's saved settings (``validate``,
    the experiment's, reads it: 'all' is the list of all of them, order and repeats do not
    matter)."""
    given = getattr(a, "_method_given", None)
    if given is None:
        return
    try:
        named = validate(argparse.Namespace(**{**vars(a), "method": given}))
    except ValueError as err:
        fail(str(err))
    if set(named) != set(methods):
        fail(
            f"{a.resume} holds a run with other settings (--method {a.method!r} there, "
            f"{given!r} given); --resume continues a run with its saved settings (only "
            "--iterations may grow and --chunk, --shard, --distributed change); to add methods, "
            f"run them with the run's settings and --out {a.resume} --exact-out"
        )
