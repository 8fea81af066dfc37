"""The outer loop: ``make_train(problem, method, config) -> Trainer`` (Algorithm 1 under lax.scan).

One outer iteration i (Algorithm 1 / Algorithm 8):
  1. follower best response g^{theta_i dagger}: soft value iteration, warm-started from V_F of i-1
     (with ``config.follower`` another model, the policy it plays: docs/followers.md);
  2. a batch of ``num_envs x num_steps`` transitions under g (all streams reset to rho_0);
  3. the leader critic update (SARSA, Algorithm 2) on the batch;
  4. the hypergradient estimate (``estimators.hypergradient`` with the method's critic and guide,
     see ``METHOD_SPECS``), or the exact one for ``exact``;
  5. SGD ascent after clipping to global norm ``clip_norm`` (optax).
The metric of iteration i is the exact J_L(theta_i) at the policy the follower plays (its best
response g^{theta_i dagger} by default; policy evaluation on the follower's model, warm-started
sweeps to tolerance).

Static choices (sizes, method, tolerances) live in the frozen :class:`TrainConfig`; numbers a
grid varies (``lr``, ``sarsa_alpha``, ``beta``) are traced scalars in ``hparams``, so
``jax.vmap`` over hparams and seeds never retraces.
"""

from __future__ import annotations

import dataclasses
import functools
import warnings
from typing import Any, NamedTuple, Optional

import jax
import jax.numpy as jnp
import numpy as np

from bchg_jax.core import hparams as hparams_lib
from bchg_jax.core.bias_check import (
    CUT_WEIGHT_WARN,
    EVERY_VISIT_WARN,
    discount_weight_beyond,
    every_visit_share,
)
from bchg_jax.core.follower_model import FollowerSettings, agreement, lag_mix
from bchg_jax.core.loop import Trainer, build_trainer, check_setup, global_norm, sgd_ascent
from bchg_jax.core.precision import full_precision
from bchg_jax.core.rounding import within_tolerance
from bchg_jax.core.validate import (
    check_beta,
    check_config,
    check_positive,
    check_unit_interval,
    logits_rounded,
    warn_float32_long_horizon,
)
from bchg_jax.tabular import critics, estimators
from bchg_jax.tabular.cmdp import TabularCMDP
from bchg_jax.tabular.exact import exact_hypergradient, policy_evaluation_sweeps
from bchg_jax.tabular.follower import continuation, soft_value_iteration
from bchg_jax.tabular.follower_models import (
    k_step_response,
    observed_follower,
    policy_gap,
    q_learning_policy,
    q_learning_update,
)
from bchg_jax.tabular.follower_references import (
    as_if_optimal_hypergradient,
    k_step_hypergradient,
    lag_hypergradient,
)
from bchg_jax.tabular.rollout import check_parallel_limit, rollout
from bchg_jax.tabular.sparse import (
    Successors,
    check_holds_support,
    cond_on_any_lane,
    depends_on_input,
    outside_support,
    prefers_sparse,
    probe_support,
    problem_successors,
    sparse_policy_evaluation,
    sparse_soft_value_iteration,
)

Array = jax.Array

# method -> (leader critic, guiding term, oracle segments); Algorithm 8 of the paper
METHOD_SPECS = {
    "bchg": ("sarsa", "benefit", False),  # BC-HG (ours)
    "hpgd_sa": ("sarsa", "hpgd", False),  # HPGD (SA)
    "hpgd_mc": ("mc", "hpgd", False),  # HPGD (MC), the authors' implementation
    "hpgd_oracle": ("mc", "hpgd", True),  # HPGD (oracle): extra rollouts from random states
    "sobirl": ("mc", "sobirl", False),  # SoBiRL (one-step truncation)
    "naive": ("mc", "none", False),  # Naive-PGD (partial derivative only)
    "exact": (None, None, False),  # ascent on the exact hypergradient (exact.py)
}
# the method names accepted by make_train (the keys of METHOD_SPECS)
METHODS = tuple(METHOD_SPECS)
SARSA_METHODS = tuple(m for m, spec in METHOD_SPECS.items() if spec[0] == "sarsa")
# follower / metric solvers: dense sweeps, the sparse successor form, or chosen by the rule below
SOLVERS = ("auto", "dense", "sparse")


@dataclasses.dataclass(frozen=True)
class TrainConfig(FollowerSettings):
    """Static configuration of one training run (hashable; changing it recompiles).

    Attributes:
      num_envs: E, parallel sampling streams per iteration.
      num_steps: T, steps per stream per iteration (batch of E x T transitions).
      iterations: N, outer iterations of ``train``.
      clip_norm: global-norm clip of the hypergradient before the SGD step.
      theta_init_std: std of the N(0, std^2) noise added to ``problem.theta0`` at init.
      critic_init_std: std of the random initial leader critic Q_L^0 [S, B].
      vi_tol: sup-norm tolerance of soft value iteration and of the exact policy evaluation.
      vi_max_sweeps: cap on the sweeps of both.
      grouping: segment grouping of dQF, one of ``estimators.GROUPINGS``.
      partial: partial-derivative estimator, one of ``estimators.PARTIALS``.
      oracle_envs: streams of the extra oracle rollouts of ``hpgd_oracle`` (Algorithm 8 line 7).
      oracle_steps: steps per oracle stream.
      solver: the follower's and the metric's solvers: ``"dense"`` (soft value iteration and
        expectation sweeps on the [S, B, S] table), ``"sparse"`` (modified soft policy iteration
        and expectation sweeps on the successor table, :mod:`bchg_jax.tabular.sparse`) or
        ``"auto"``: sparse when each state has at most S/4 successors and the support did not
        change between the probed thetas, dense otherwise (:func:`resolve_solver`). Both stop
        on the same tolerance ``vi_tol``; an iteration whose model has a non-zero entry outside
        the successor table is solved densely and flagged (metric ``support_lost``).
      linear_sweeps: expectation sweeps after each soft sweep of the sparse follower solver.
      parallel_steps: draw the rollouts in log depth and make the SARSA pass one triangular
        solve (``rollout(parallel=True)``, ``sarsa_update(parallel=True)``): the same batches
        bit for bit and the same critic up to float rounding, in tens of dependent steps per
        iteration instead of one per transition, at S times the sampling work and an
        (E*T)^2 matrix per SARSA pass (4 MB per run at batch 1,000: 1 GB for the 240-run
        grid). For an accelerator, where the iteration is a chain of small kernels; slower on
        a CPU (docs/performance.md). Needs the problem's ``time_limit`` None or >=
        ``num_steps`` (and ``oracle_steps`` for ``hpgd_oracle``).
      follower: the simulated follower (:class:`~bchg_jax.core.follower_model.FollowerModel`;
        default the best response, the paper's setting; docs/followers.md).
      track_reference: also record, every iteration, the estimate's cosine and projection
        against the two exact references of a follower off its best response
        (:mod:`bchg_jax.tabular.follower_references`; costs two exact gradients per iteration).
    """

    num_envs: int = 1
    num_steps: int = 100
    iterations: int = 10_000
    clip_norm: float = 1.0
    theta_init_std: float = 0.01
    critic_init_std: float = 1.0
    vi_tol: float = 1e-6
    vi_max_sweeps: int = 3000
    grouping: str = "every_visit"
    partial: str = "every_visit"
    oracle_envs: int = 50  # HPGD (oracle): 50 x 200 = 10,000 extra steps per iteration
    oracle_steps: int = 200
    solver: str = "auto"
    linear_sweeps: int = 16
    parallel_steps: bool = False

    def validate(self) -> "TrainConfig":
        """Host-side field checks; returns ``self`` (raises ``ValueError`` on a bad field)."""
        check_config(
            self,
            positive_ints=(
                "num_envs",
                "num_steps",
                "iterations",
                "vi_max_sweeps",
                "oracle_envs",
                "oracle_steps",
            ),
            positive=("clip_norm", "vi_tol"),
            unbounded=("clip_norm",),
            nonneg=("theta_init_std", "critic_init_std", "linear_sweeps"),
            choices={
                "grouping": estimators.GROUPINGS,
                "partial": estimators.PARTIALS,
                "solver": SOLVERS,
            },
        )
        if not isinstance(self.parallel_steps, (bool, np.bool_)):
            raise ValueError(
                f"TrainConfig.parallel_steps must be True or False, got {self.parallel_steps!r}"
            )
        self.check_follower()
        return self


class TrainState(NamedTuple):
    """The carry of the outer loop (one run)."""

    theta: Array
    critic: Array  # leader critic Q_L [S, B]
    V_F: Array  # follower soft value (warm start of soft VI)
    V_L: Array  # leader value (warm start of the exact evaluation)
    key: Array
    step: Array
    # a follower off its best response: k_step its value V [S], lag its policy [S, B],
    # q_learning its soft Q [S, B]; None for the best response (V_F is then all it keeps)
    follower: Optional[Any] = None


class _Fields(NamedTuple):
    lr: Any = 0.1
    sarsa_alpha: Any = 0.5
    beta: Any = 1e-3


class HParams(hparams_lib.HParamsMixin, _Fields):
    """The tabular trainer's grid-able hyperparameters (traced; a grid is one vmapped program).

    Attributes:
      lr: leader SGD step size (> 0); default 0.1.
      sarsa_alpha: SARSA step size of the leader critic, in (0, 1] (Algorithm 2); default 0.5.
      beta: the follower's entropy weight (> 0); default 1e-3.
    """

    __slots__ = ()

    def validate(self) -> "HParams":
        """Host-side range checks (concrete values); returns ``self``."""
        check_positive("lr", self.lr)
        check_unit_interval("sarsa_alpha", self.sarsa_alpha)
        check_beta(self.beta)
        return self


def resolve_solver(problem: TabularCMDP, solver: str = "auto", explain: bool = False):
    """(``"dense"`` or ``"sparse"``, the successor table or None) for ``problem``.

    ``"auto"`` takes the sparse form when (a) the support of ``transition(theta)`` (and of the
    sampler's table, if it has its own) is the same at every probed theta (theta0 and 12 random
    thetas at scales 1, 3 and 10; :func:`~bchg_jax.tabular.sparse.probe_support`) and (b) every
    state has at most S/4 successors (:func:`~bchg_jax.tabular.sparse.prefers_sparse`), on
    every backend. A support that differs between probes depends on theta, and a union of
    finitely many probes need not hold it elsewhere: ``auto`` then stays dense and warns
    (``UserWarning``); ``solver="sparse"`` still takes the union table. Either way the trainer
    checks the table at every iteration (metric ``support_lost``, dense solves for that
    iteration). Measured for Four-Rooms (J = 4 of S = 104; docs/performance.md): on the
    2-core CPU a sparse sweep over 240 runs costs 0.14 ms against 0.40 ms dense; on an NVIDIA
    H200 the whole 240-run iteration was 3.6-4.4x faster and one run 1.6-2.1x faster than dense
    at beta 1e-3..5e-3 (indicative only: measured before the solvers ran at full precision).

    Args:
      problem: the tabular CMDP.
      solver: ``"auto"``, ``"dense"`` or ``"sparse"``.
      explain: also return the reason of the choice (a sentence).
    Returns:
      (solver, successors or None), or (solver, successors or None, reason) with ``explain``.
    Raises:
      ValueError: an unknown ``solver``.
    """
    if solver not in SOLVERS:
        raise ValueError(f"solver must be one of {SOLVERS}, got {solver!r}")
    S = problem.num_states
    if solver == "dense":
        out = ("dense", None, "dense requested")
    else:
        probe = probe_support(problem)
        J = probe.successors.width
        if solver == "sparse":
            out = ("sparse", probe.successors, f"sparse requested (J = {J} of S = {S})")
        elif not prefers_sparse(probe.successors, S):
            out = ("dense", None, f"J = {J} successors of S = {S} states is above S/4")
        elif not (
            probe.fixed
            and (problem.sample_transition is None or probe_support(problem, sampler=True).fixed)
        ):
            out = (
                "dense",
                None,
                f"the support of {problem.name}'s transition table differs between the "
                f"{probe.probes} probed thetas (it depends on theta; their union has J = "
                f"{J} of S = {S}), so solver='auto' uses the dense solvers; "
                f"solver='sparse' would use the union, checked at every iteration",
            )
            warnings.warn(out[2], stacklevel=2)
        else:
            out = (
                "sparse",
                probe.successors,
                f"J = {J} successors of S = {S} states, the same support at all "
                f"{probe.probes} probed thetas",
            )
    return out if explain else out[:2]


def warn_cut_without_terminal(problem: TabularCMDP, method: str, config: "TrainConfig") -> None:
    """Warns when a sampling method's episodes can only end by a cut: no terminal state, so
    every episode stops at ``min(time_limit, num_steps)`` (or earlier, at the batch's end),
    and the discount weight beyond that step
    (:func:`~bchg_jax.core.bias_check.discount_weight_beyond`) exceeds
    :data:`CUT_WEIGHT_WARN`. The estimates then target the hypergradient truncated there, a
    bias of about that weight (the problem of the README, cut at 10 steps: 37% of the
    gradient; :func:`~bchg_jax.tabular.check.check_problem` measures it). With terminal
    states the cut's share depends on how often episodes reach them, which only sampling shows
    (``check_problem``'s ``truncated``), so nothing is said here; the LQ trainer, whose
    episodes always end by the cut, refuses such a horizon instead.

    The every-visit forms (``partial="every_visit"``; ``grouping="every_visit"`` for the guides
    with FollowerQGrad segments, BC-HG's and HPGD's) add a bias of their own that more episodes
    per stream do not reduce: their means reuse the segments of visits late in an episode, which
    the cut shortens, for every visit (:func:`~bchg_jax.core.bias_check.every_visit_share`,
    about 1 / ((1 - gamma) H)); it is named too when it exceeds
    :data:`~bchg_jax.core.bias_check.EVERY_VISIT_WARN` (0.1: those forms are biased by design
    for their lower variance), with the first-episode forms as the remedy.
    """
    if method == "exact" or bool(jnp.any(problem.terminal_mask)):
        return
    cut = min(int(problem.time_limit or config.num_steps), int(config.num_steps))
    weight = discount_weight_beyond(float(problem.gamma_L), float(problem.gamma_F), cut)
    shares = []  # (form, its every-visit share)
    if config.partial == "every_visit":
        shares.append(("partial='every_visit'", every_visit_share(problem.gamma_L, cut)))
    if config.grouping == "every_visit" and METHOD_SPECS[method][1] in ("benefit", "hpgd"):
        shares.append(("grouping='every_visit'", every_visit_share(problem.gamma_F, cut)))
    shares = [(form, x) for form, x in shares if x > EVERY_VISIT_WARN]
    if weight <= CUT_WEIGHT_WARN and not shares:
        return
    text = (
        f"{problem.name}: tabular.make_train({method!r}): no terminal state, so every "
        f"episode is cut at step {cut} at the latest (time_limit {problem.time_limit}, "
        f"num_steps {config.num_steps})"
    )
    if weight > CUT_WEIGHT_WARN:
        text += (
            f", which leaves {weight:.2g} of the discount weight beyond it: the estimates "
            "target the hypergradient truncated there (a bias of about that share)"
        )
    if shares:
        forms = " and ".join(f"{form} ({x:.2g})" for form, x in shares)
        text += (
            f"; the every-visit forms {forms} add a bias of about that share of their terms, "
            "however many episodes a stream holds: their means reuse the segments of visits "
            "late in an episode, which the cut shortens (TrainConfig(grouping='first_episode', "
            "partial='first_episode') is the unbiased form; HPGD needs the every-visit "
            "grouping)"
        )
    warnings.warn(
        text + ". tabular.check_problem measures it on your problem. Raise time_limit and "
        "num_steps",
        stacklevel=3,
    )


def check_successors(
    problem: TabularCMDP,
    solver: str,
    successors: Optional[Successors],
    sampler_successors: Optional[Successors],
) -> None:
    """Checks the successor tables a caller gives :func:`make_train` (a table built with other
    probe settings, or the known support of a model whose support moves with theta): each a
    :class:`~bchg_jax.tabular.sparse.Successors` table of the problem's S states holding the
    support of its table at theta0. The trainer then uses them where :func:`resolve_solver`'s
    probed union would be used (and still checks every iteration's tables: ``support_lost``).

    Raises:
      ValueError: a table given with ``solver="dense"``, ``sampler_successors`` without
        ``successors`` or for a problem without ``sample_transition``, a table that is not a
        successor table of S states, or one that misses theta0's support.
    """
    if successors is None:
        if sampler_successors is not None:
            raise ValueError("sampler_successors is taken with successors (the model's table)")
        return
    if solver == "dense":
        raise ValueError(
            "successor tables were given with TrainConfig(solver='dense'): take solver='sparse' "
            "(or 'auto') to use them, or give none"
        )
    tables = [("successors", successors, problem.transition)]
    if sampler_successors is not None:
        if problem.sample_transition is None:
            raise ValueError(
                f"sampler_successors was given, but {problem.name} has no sample_transition: "
                "the rollouts sample the model's table (successors)"
            )
        tables.append(("sampler_successors", sampler_successors, problem.sample_transition))
    theta0 = jnp.asarray(problem.theta0)
    remedy = "give a table that holds the support at theta0 (and wherever theta goes)"
    for name, table, fn in tables:
        if not isinstance(table, Successors):
            raise ValueError(
                f"{name} must be a bchg_jax.tabular.sparse.Successors table, got "
                f"{type(table).__name__}"
            )
        table.check(problem.num_states, f"{problem.name}'s num_states")
        check_holds_support(f"{problem.name}'s table at theta0 ({name})", fn(theta0), table, remedy)


def make_train(
    problem: TabularCMDP,
    method: str = "bchg",
    config: TrainConfig = TrainConfig(),
    successors: Optional[Successors] = None,
    sampler_successors: Optional[Successors] = None,
) -> Trainer:
    """Pure training functions of a leader in a tabular configurable MDP (Algorithm 1).

    BC-HG (Algorithm 1) and the baselines of Algorithm 8 (see ``METHOD_SPECS``), one outer
    iteration per ``lax.scan`` step (module docstring).

    Args:
      problem: a :class:`TabularCMDP` (validated here; theta0's dtype is the run's dtype).
      method: one of :data:`METHODS`.
      config: the static :class:`TrainConfig`.
      successors: the model's successor table
        (:class:`~bchg_jax.tabular.sparse.Successors`, e.g. ``problem_successors(problem,
        draws=..., scales=...)`` or ``successors_from_support(mask)`` of a support known to hold
        every theta's), or None: ``config.solver`` decides (:func:`resolve_solver`). Given, the
        sparse solvers use it (``solver`` "auto" or "sparse"; "dense" refuses it).
      sampler_successors: with ``successors``, the table of ``problem.sample_transition``
        (probed when None); only for a problem with a sampling model of its own.
    Returns:
      a :class:`~bchg_jax.core.loop.Trainer`: ``init(key, hp)``, ``run(state, hp, n)``,
      ``train(key, hp)`` with ``hp`` an :class:`HParams`; ``metrics`` per iteration: ``J`` (exact
      J_L(theta_i)), ``grad_norm``, ``sweeps`` (soft-VI sweeps of the follower),
      ``solve_capped`` (1: the follower's or the metric's solve hit ``vi_max_sweeps`` before
      ``vi_tol`` or the float rounding floor of :mod:`bchg_jax.core.rounding`),
      ``update_skipped`` (1: the update was dropped: a non-finite estimate, or ``model_invalid``),
      ``model_invalid`` (1: the update would have taken theta where ``transition``, the
      sampler's table or ``init_dist`` are not distributions within
      :meth:`~bchg_jax.tabular.cmdp.TabularCMDP.row_sum_tolerance`: ``validate()`` checks
      theta0 only, and there every solve and J are finite but meaningless),
      ``support_lost`` (1: with the sparse solvers, ``transition(theta_i)`` or the sampler's
      table has a non-zero entry outside its successor table: when the model's does, that
      iteration's follower and metric were solved densely, so ``J`` and ``sweeps`` are the
      dense solves'; when the sampler's does, its rollouts drew from the whole table); with a
      follower off its best response (``config.follower``, docs/followers.md) ``J`` is J_L at
      the policy it plays and
      ``follower_gap`` its distance max |g - g^{theta dagger}|; with ``config.track_reference``
      also ``cos_target``, ``proj_target``, ``cos_through``, ``proj_through``
      (:func:`~bchg_jax.core.follower_model.agreement` of the estimate with the two exact
      references); each [n] per run of
      ``run(state, hp, n)``. The state is a ``TrainState`` (``theta`` shaped like
      ``problem.theta0``, ``critic`` [S, B], ``V_F`` [S], ``V_L`` [S], ``key``, ``step``,
      ``follower``: the learner's own state or None).
    Raises:
      ValueError: an unknown method, an invalid problem or config, an HPGD method with
        ``config.grouping != "every_visit"``, or a bad successor table
        (:func:`check_successors`).
    """
    check_setup(problem, method, config, METHODS, TabularCMDP)
    check_successors(problem, config.solver, successors, sampler_successors)
    warn_float32_long_horizon(
        f"{problem.name}: tabular.make_train",
        jnp.asarray(problem.theta0).dtype,
        problem.gamma_F,
        problem.gamma_L,
    )
    warn_cut_without_terminal(problem, method, config)
    S, B = problem.num_states, problem.num_actions
    terminal = problem.terminal_mask
    critic_kind, guide, use_oracle = METHOD_SPECS[method]
    if method != "exact":  # which draws no batch
        for steps in (config.num_steps,) + ((config.oracle_steps,) if use_oracle else ()):
            check_parallel_limit(config.parallel_steps, problem.time_limit, steps)
    if guide == "hpgd" and config.grouping != "every_visit":
        raise ValueError(
            "HPGD methods need grouping='every_visit' (dV_F comes from other segments)"
        )
    dtype = jnp.asarray(problem.theta0).dtype
    if successors is None:
        solver, successors = resolve_solver(problem, config.solver)
    else:  # the caller's table (checked above)
        solver = "sparse"
    # with the sparse solvers the rollouts draw next states among the successors too (the same
    # draws as the full search); a sampling model of its own gets its own table
    sample_successors = None
    if solver == "sparse":
        sample_successors = sampler_successors
        if sample_successors is None:
            sample_successors = (
                successors
                if problem.sample_transition is None
                else problem_successors(problem, sampler=True)
            )

    def init(key: Array, hp) -> TrainState:
        k_theta, k_critic, k_run = jax.random.split(key, 3)
        theta0 = jnp.asarray(problem.theta0, dtype)
        theta = theta0 + config.theta_init_std * jax.random.normal(k_theta, theta0.shape, dtype)
        critic = critics.init_tabular_critic(k_critic, S, B, config.critic_init_std, dtype)
        zeros = jnp.zeros((S,), dtype)
        step0 = jnp.zeros((), jnp.int32)
        return TrainState(theta, critic, zeros, zeros, k_run, step0, init_follower())

    fm = config.follower

    def init_follower():
        """The learning follower's own state at the start (module ``TrainState``)."""
        if fm.kind == "k_step":
            return jnp.zeros((S,), dtype)  # its value V_0 = 0
        if fm.kind == "lag":
            return jnp.full((S, B), 1.0 / B, dtype)  # a uniformly random first policy
        if fm.kind == "q_learning":
            return jnp.zeros((S, B), dtype)
        return None

    def play(theta, beta, br, own):
        """(the policy the follower plays at theta [S, B], its state after the play): the best
        response ``br``, or the learner's move (``k_step``: K backups from its value;
        ``lag``: mixed with its last policy; ``q_learning``: its current soft-greedy policy,
        learned further after the batch)."""
        if fm.kind == "k_step":
            P, rF = problem.transition(theta), problem.follower_reward(theta)
            own_br = k_step_response(P, rF, beta, problem.gamma_F, terminal, own, fm.steps)
            return own_br.policy, own_br.V
        if fm.kind == "lag":
            policy = lag_mix(own, br.policy, jnp.asarray(fm.mix, dtype))
            return policy, policy
        if fm.kind == "q_learning":
            return q_learning_policy(own, beta, jnp.asarray(fm.explore, dtype)), own
        return br.policy, own

    def seen(theta, beta, policy, sweeps):
        """What the estimators get of a follower off its best response: its policy with
        ``V^g`` (:func:`~bchg_jax.tabular.follower_models.observed_follower`)."""
        P, rF = problem.transition(theta), problem.follower_reward(theta)
        cont = continuation(terminal, S, dtype)
        return observed_follower(P, rF, policy, beta, problem.gamma_F, cont, sweeps)

    def references(theta, beta, br, policy, own):
        """(the as-if-optimal reference, the reference through the follower's update) at
        theta (:mod:`bchg_jax.tabular.follower_references`); NaN where none is defined."""
        if fm.best_response:
            exact = exact_hypergradient(
                problem, theta, beta, V0=br.V, newton_iters=0, polish_sweeps=3, tol=None
            )
            return exact, exact
        target = as_if_optimal_hypergradient(problem, theta, policy, beta)
        if fm.kind == "k_step":
            through = k_step_hypergradient(problem, theta, own, beta, fm.steps)
        elif fm.kind == "lag":
            through = lag_hypergradient(problem, theta, own, beta, fm.mix, V_star=br.V, tol=None)
        else:
            through = jax.tree.map(lambda x: jnp.full_like(x, jnp.nan), target)
        return target, through

    @full_precision
    def follower(theta, beta, V0, kind=solver):
        """Best response g^{theta dagger}: soft value iteration (``kind`` dense) or modified
        soft policy iteration (sparse), warm-started from V0, to the soft-sweep tolerance
        ``vi_tol``."""
        if kind == "sparse":
            return sparse_soft_value_iteration(
                problem.transition(theta),
                problem.follower_reward(theta),
                beta,
                problem.gamma_F,
                successors,
                terminal,
                V0=V0,
                tol=config.vi_tol,
                max_sweeps=config.vi_max_sweeps,
                linear_sweeps=config.linear_sweeps,
            )
        return soft_value_iteration(
            problem.transition(theta),
            problem.follower_reward(theta),
            beta,
            problem.gamma_F,
            terminal,
            V0=V0,
            tol=config.vi_tol,
            max_sweeps=config.vi_max_sweeps,
        )

    @full_precision
    def evaluate(theta, policy, V0, kind=solver):
        """(exact J_L(theta) under ``policy``, V_L [S], residual []): warm-started
        policy-evaluation sweeps, dense or sparse by ``kind`` (``residual`` above ``vi_tol``:
        the sweep cap was hit).

        The rows are renormalised first. The best response's already are
        (:func:`~bchg_jax.tabular.follower.boltzmann`); this keeps any policy played (a lagging
        or exploring follower's mixture) exact too. Rows summing to 1 +- 7e-5, as the
        unnormalised float32 exp((Q - V) / beta) did at beta 1e-3, biased J_L by -2.8e-4 on
        average on Four-Rooms (30 random thetas; max 4.5e-4); normalised, the float32 metric is
        within 5e-7 of the float64 best response's (tests/tabular/test_train.py)."""
        policy = policy / jnp.sum(policy, axis=-1, keepdims=True)
        evaluation = policy_evaluation_sweeps
        if kind == "sparse":
            evaluation = functools.partial(sparse_policy_evaluation, successors=successors)
        V_L, res = evaluation(
            problem.transition(theta),
            problem.leader_reward(theta),
            policy,
            problem.gamma_L,
            continuation(terminal, S, dtype),
            V0,
            tol=config.vi_tol,
            max_sweeps=config.vi_max_sweeps,
            return_residual=True,
        )
        J = jnp.dot(problem.init_dist(theta), V_L) + problem.regularizer(theta)
        return J.astype(dtype), V_L, res

    def solves(theta, beta, V_F, V_L, own, kind=solver):
        """(best response, the policy played, the learner's state, J, V_L, metric residual):
        the follower and the metric (at the policy played), one kind."""
        br = follower(theta, beta, V_F, kind)
        policy, own = play(theta, beta, br, own)
        J, V_L, res = evaluate(theta, policy, V_L, kind)
        return br, policy, own, J, V_L, res

    def support_lost(theta):
        """([] bool model lost mass, [] bool sampler lost mass): with the sparse solvers, the
        follower's model / the sampler's table has a non-zero entry outside its successor table
        at theta (:func:`~bchg_jax.tabular.sparse.outside_support`: exact, whatever the mass).
        A table that does not depend on theta (Four-Rooms) has the support of theta0, which its
        successor table holds: it is not checked (False)."""

        def lost(table, table_successors):
            if solver != "sparse" or not depends_on_input(table, problem.theta0):
                return jnp.zeros((), bool)
            return outside_support(table(theta), table_successors)

        model = lost(problem.transition, successors)
        if problem.sample_transition is None:
            return model, model
        return model, lost(problem.sample_transition, sample_successors)

    def checked_solves(theta, beta, V_F, V_L, own=None):
        """:func:`solves` with the trainer's solver; with the sparse one, the dense solves for a
        run whose model lost mass at theta (:func:`~bchg_jax.tabular.sparse.cond_on_any_lane`:
        under vmap the dense solves run only in iterations where some run lost mass). Returns
        (br, policy, own, J, V_L, residual, (model lost mass [] bool, sampler lost mass [] bool));
        ``own`` is the learning follower's state (None for the best response)."""
        lost = support_lost(theta)
        if solver == "dense" or not depends_on_input(problem.transition, problem.theta0):
            return solves(theta, beta, V_F, V_L, own) + (lost,)
        out = cond_on_any_lane(
            lost[0],
            functools.partial(solves, kind="dense"),
            functools.partial(solves, kind="sparse"),
            theta,
            beta,
            V_F,
            V_L,
            own,
        )
        return tuple(out) + (lost,)

    def collect(key, theta, policy, dense=False):
        """(batch, oracle segments or None): num_envs x num_steps transitions from rho_0 and,
        for ``hpgd_oracle``, extra rollouts whose every reset starts from a uniform state.
        ``dense``: draw next states from the whole [S, B, S] table, not the successor table
        (an iteration whose sampler lost mass outside it)."""
        P_sample = problem.sampler_transition(theta)
        table = None if dense else sample_successors
        batch = rollout(
            key,
            policy,
            P_sample,
            problem.init_dist(theta),
            terminal,
            problem.time_limit,
            config.num_envs,
            config.num_steps,
            successors=table,
            parallel=config.parallel_steps,
        )
        if not use_oracle:
            return batch, None
        return batch, rollout(
            jax.random.fold_in(key, 1),
            policy,
            P_sample,
            jnp.full((S,), 1.0 / S, dtype),
            terminal,
            problem.time_limit,
            config.oracle_envs,
            config.oracle_steps,
            successors=table,
            parallel=config.parallel_steps,
        )

    sampler_fn = problem.sample_transition or problem.transition
    check_sampler = solver == "sparse" and depends_on_input(sampler_fn, problem.theta0)

    def checked_collect(key, theta, policy, sampler_lost):
        """:func:`collect`, from the whole table for a run whose sampler lost mass at theta."""
        if not check_sampler:
            return collect(key, theta, policy)
        return cond_on_any_lane(
            sampler_lost, functools.partial(collect, dense=True), collect, key, theta, policy
        )

    def leader_critic(key, critic, theta, batch, segments, alpha):
        """(critic state, Q_L [S, B], V_L or None): a SARSA update (Algorithm 2; V_L = sum_b g
        Q_L, Algorithm 10) or Monte Carlo returns of the batch / oracle segments (Algorithm 9)."""
        rL = problem.leader_reward(theta)
        if critic_kind == "sarsa":
            critic = critics.sarsa_update(
                key, critic, batch, rL, problem.gamma_L, alpha, config.parallel_steps
            )
            return critic, critic, None
        Q_L, V_L_hat = critics.monte_carlo_critic(
            batch if segments is None else segments, rL, problem.gamma_L
        )
        return critic, Q_L, V_L_hat

    def estimate(theta, beta, batch, segments, br, Q_L, V_L_hat):
        """The method's hypergradient estimate (Theorem 1 with its guiding term)."""
        return estimators.hypergradient(
            problem,
            theta,
            batch,
            br,
            Q_L,
            beta,
            guide=guide,
            grouping=config.grouping,
            partial=config.partial,
            V_L=V_L_hat,
            guide_batch=segments,
        )

    row_tol = problem.row_sum_tolerance(dtype)

    def tables_invalid(theta):
        """[] bool: a probability table at theta off the simplex by more than ``row_tol``
        (a negative entry or a sum off 1), as ``validate()`` checks at theta0."""
        # written so that a NaN entry is invalid too (a comparison with NaN is False: a row
        # that became NaN passed, and J was NaN with no flag but solve_capped)
        rho = problem.init_dist(theta)
        ok = (jnp.min(rho) >= -row_tol) & (jnp.abs(jnp.sum(rho) - 1) <= row_tol)
        tables = [problem.transition(theta)]
        if problem.sample_transition is not None:
            tables.append(problem.sampler_transition(theta))
        for P in tables:
            ok &= (jnp.min(P) >= -row_tol) & (jnp.max(jnp.abs(jnp.sum(P, -1) - 1)) <= row_tol)
        return ~ok

    def step(state: TrainState, hp: HParams):
        hp = hp.cast(dtype)
        theta, beta = state.theta, hp.beta
        key, k_roll, k_sarsa = jax.random.split(state.key, 3)
        br, policy, own, J, V_L, metric_res, (model_lost, sampler_lost) = checked_solves(
            theta, beta, state.V_F, state.V_L, state.follower
        )
        view = br if fm.best_response else seen(theta, beta, policy, br.sweeps)
        critic, learns = state.critic, fm.kind == "q_learning"
        if method == "exact":
            grad = exact_hypergradient(
                problem, theta, beta, V0=br.V, newton_iters=0, polish_sweeps=3, tol=None
            )
            if learns:  # the follower acts (and learns) whatever the leader's gradient
                batch, _ = checked_collect(k_roll, theta, policy, sampler_lost)
        else:
            batch, segments = checked_collect(k_roll, theta, policy, sampler_lost)
            critic, Q_L, V_L_hat = leader_critic(
                k_sarsa, critic, theta, batch, segments, hp.sarsa_alpha
            )
            grad = estimate(theta, beta, batch, segments, view, Q_L, V_L_hat)
        if learns:
            rF, lr = problem.follower_reward(theta), jnp.asarray(fm.lr, dtype)
            own = q_learning_update(own, batch, rF, beta, problem.gamma_F, lr)
        grad_norm = global_norm(grad)  # finite for every finite gradient (overflow-safe)
        # a non-finite estimate is dropped (flagged), never spread into theta, and so is an
        # update to a theta whose tables are not distributions; a follower or metric solve that
        # hit its sweep cap is flagged (its approximate answer is still used)
        proposed = sgd_ascent(theta, grad, hp.lr, config.clip_norm)
        invalid = tables_invalid(proposed)
        skipped = ~jnp.isfinite(grad_norm) | invalid
        new_theta = jax.tree.map(lambda new, old: jnp.where(skipped, old, new), proposed, theta)
        # converged: the last change within vi_tol or at the float rounding floor (core.rounding)
        capped = ~(
            within_tolerance(br.residual, br.V, config.vi_tol)
            & within_tolerance(metric_res, V_L, config.vi_tol)
        )
        metrics = {
            "J": J,
            "grad_norm": grad_norm,
            "sweeps": br.sweeps,
            "solve_capped": capped.astype(jnp.int32),
            "update_skipped": skipped.astype(jnp.int32),
            "model_invalid": invalid.astype(jnp.int32),
            "support_lost": (model_lost | sampler_lost).astype(jnp.int32),
            "logits_rounded": logits_rounded(br.Q, beta),  # float32 and a small beta
        }
        if not fm.best_response:
            metrics["follower_gap"] = policy_gap(policy, br.policy)
        if config.track_reference:
            # "through": from the learner's state after this reaction, where its reaction to the
            # leader's next theta starts (as the game trainers); not the state it started from
            refs = references(theta, beta, br, policy, own)
            metrics.update(agreement(grad, refs[0], "target"))
            metrics.update(agreement(grad, refs[1], "through"))
        new_state = TrainState(new_theta, critic, br.V, V_L, key, state.step + 1, own)
        return new_state, metrics

    steps = {
        "follower": follower,
        "play": play,
        "seen": seen,
        "references": references,
        "evaluate": evaluate,
        "support_lost": support_lost,
        "tables_invalid": tables_invalid,
        "solves": checked_solves,
        "collect": collect,
        "checked_collect": checked_collect,
        "leader_critic": leader_critic,
        "estimate": estimate,
    }
    unread = () if method in SARSA_METHODS else ("sarsa_alpha",)  # no SARSA critic
    return build_trainer(problem, method, config, init, step, HParams, dtype, steps, unread)
