"""Outer loop for linear-Gaussian configurable MDPs (building thermal control): ``make_train``.

One outer iteration i (Algorithm 1 with the continuous modules: critic Algorithm 3,
PartialDerivative Algorithm 4, FollowerQGrad Algorithm 6):
  1. follower best response g^{theta_i dagger}: max-ent LQR (Proposition 1), Riccati iteration
     warm-started from P of iteration i-1 (a non-converged solve is flagged ``ok = 0`` and the
     update is skipped, never a silent NaN);
  2. ``num_episodes`` episodes of ``problem.horizon`` steps under g;
  3. the leader critic on the batch: ``quadratic_loo`` (LSTD on quadratic features, an exact
     function class, cross-fitted: each episode's critic from the other episodes; the default),
     ``quadratic`` (the same fit on the whole batch, in-sample), ``mlp`` (the paper's 64-64 TD
     network, re-initialised every iteration, ``mlp_steps`` Adam steps) or ``exact``
     (closed-form Q_L; isolates estimator noise).
     The in-sample ``quadratic`` fit depends on each episode's own actions, so BC-HG's Benefit
     ``Q_L(s_t, b_t) - V_L(s_t)`` correlates with the same episode's FollowerQGrad term and the
     estimate is biased at few episodes; ``quadratic_loo`` removes that correlation, not the
     LSTD fit's own finite-sample bias, which shrinks with E (TrainConfig.critic);
  4. the hypergradient (Theorem 1, Eq. (hg_configurable)): ``bchg`` (Benefit guide), ``hpgd_td`` /
     ``hpgd_mc`` (Q_L x (dQF - dVF) with a learned vector dVF ~ grad V_F; TD critic / Monte Carlo
     returns for Q_L and V_L), ``naive`` (partial term only) or ``exact`` (autodiff of the
     closed-form J_L). ``hpgd_mc`` is the authors' baseline as specified, and *biased*: its Q_L
     is the same episode's return G_t, which sums over the same future steps as dQF_t, so
     ``E[G_t dQF_t] = Q_L grad Q_F + Cov(G_t, dQF_t)``, and more episodes do not remove it.
     Measured on the thermal problem (E = 100, 2000 batches at theta0 and at a run's first
     iterate): the covariance dominates, the mean is ~11x the exact hypergradient's norm away
     and points against it (cosine -0.42 / -0.46); 61% / 74% off at E = 2 / 10 on a random
     2-d problem, 146-785% (against the gradient) on other small random LQ problems
     (docs/experiments.md);
  5. SGD ascent after clipping to ``clip_norm``; skipped (``update_skipped``) when the solve did
     not converge, the estimate is not finite, or the closed loop at theta_i diverges under
     max(gamma_L, gamma_F) (``diverging``: J_L is infinite there; ``validate`` checks theta0
     only, and a run can step past the edge).
Metrics of iteration i: exact ``problem.horizon``-step (100 by default) J_L(theta_i) and its
components (``exact_lq``).

Hyperparameters a grid may vary (``lr``, ``beta``) are traced; everything else is static.
"""

from __future__ import annotations

import dataclasses
import warnings
from typing import Any, NamedTuple, Optional, Tuple

import jax
import jax.numpy as jnp
import numpy as np

from bchg_jax.core import hparams as hparams_lib
from bchg_jax.core.bias_check import discount_weight_beyond
from bchg_jax.core.follower_model import FollowerSettings, agreement
from bchg_jax.core.loop import Trainer, build_trainer, check_setup, global_norm, sgd_ascent
from bchg_jax.core.maxent_lqr import soft_q, soft_value
from bchg_jax.core.networks import MLP
from bchg_jax.core.validate import check_beta, check_config, check_positive
from bchg_jax.lq import critics, fused_td
from bchg_jax.lq import exact as exact_lq
from bchg_jax.lq.cmdp import LQConfigurableMDP
from bchg_jax.lq.estimators import (
    discounted_returns,
    hypergradient,
    per_step_follower_grad,
    per_step_follower_grad_pathwise,
)
from bchg_jax.lq.follower_models import (
    first_policy,
    gain_gap,
    k_step_response,
    lag_response,
    observed_follower,
)
from bchg_jax.lq.follower_references import (
    as_if_optimal_hypergradient,
    k_step_hypergradient,
    lag_hypergradient,
)
from bchg_jax.lq.rollout import rollout

Array = jax.Array

# method -> (guide, leader critic source)
# guide: "benefit" (BC-HG), "hpgd" (Eq. (hpgd_guidance)), "none" (Naive-PGD), None (exact);
# source: "critic" (config.critic) or "mc" (Monte Carlo returns of the batch)
METHOD_SPECS = {
    "bchg": ("benefit", "critic"),
    "hpgd_td": ("hpgd", "critic"),
    "hpgd_mc": ("hpgd", "mc"),
    "naive": ("none", "critic"),
    "exact": (None, None),
}
METHODS = tuple(METHOD_SPECS)  # the method names make_train accepts
CRITICS = ("quadratic", "quadratic_loo", "mlp", "exact")
FOLLOWERS = ("best_response", "k_step", "lag")  # the follower models of this family
FOLLOWER_GRADS = ("score", "pathwise")
#: how the leader's MLP critic is fitted: XLA's program of ``critics.td_fit``, or two Pallas
#: kernels per Adam step (:mod:`bchg_jax.lq.fused_td`; full batch, a CUDA GPU)
MLP_KERNELS = ("xla", "fused")
# the largest discount weight beyond the episodes' cut the sampling methods accept
# (check_truncation; core.bias_check.discount_weight_beyond)
TRUNCATION_TOL = 1e-3


@dataclasses.dataclass(frozen=True)
class TrainConfig(FollowerSettings):
    """Static (non-traced) settings of the LQ trainer; ``validate()`` checks them.

    Attributes:
      num_episodes: E, episodes sampled per outer iteration (each ``problem.horizon`` steps).
      iterations: number of outer iterations of ``train``.
      clip_norm: global-norm clip of the hypergradient before the SGD step.
      weights_init_std: std of the Gaussian perturbation of ``problem.theta0`` at ``init``.
      critic: the leader critic: ``"quadratic_loo"`` (the default: SARSA-LSTD cross-fitted,
        episode e's Q_L and V_L from the other E - 1 episodes,
        :func:`bchg_jax.lq.critics.leave_one_out_quadratic_q`; needs ``num_episodes >= 2``),
        ``"quadratic"`` (the same fit on the whole batch,
        :func:`bchg_jax.lq.critics.fit_quadratic_q`; the default before 2026-11-28),
        ``"mlp"`` (TD network, Algorithm 3) or ``"exact"`` (closed-form Q_L). Why
        ``quadratic_loo``: the in-sample fit depends on episode e's own actions and rewards,
        which correlates BC-HG's Benefit with episode e's FollowerQGrad term, a bias that
        shrinks with E. Measured with the ``estimate`` step (default estimator) against the
        exact hypergradient on a random 2-d problem (T = 60, 30000 batches; docs/experiments.md):
        relative bias 0.039 (z 23) at E = 2 and 0.010 (z 13) at E = 10 in-sample, 0.001
        (|z| <= 1.3) cross-fitted at both, as with the exact critic. Cross-fitting does not
        remove the fit's own finite-sample bias (LSTD solves a random linear system), which
        depends on the problem: on two other small problems (paired against the exact critic)
        it was 1.15% / 0.23% of the gradient's norm at E = 2 / 5, and 4.0% / 2.7% / 0.9% /
        below 0.2% at E = 2 / 4 / 10 / 30. Use E >= 10 (or ``critic="exact"`` to judge an
        estimator's form). The price: at E = 2 each
        critic sees one episode, per-batch standard deviation x1.35 (x1.05 at E = 10). On
        thermal at the protocol's E = 100 the in-sample bias is ~7% of the gradient's norm
        (paired against the exact critic), against a per-batch standard deviation of ~1.6x the
        norm; cross-fitted 0.3% +- 0.25% (docs/experiments.md). Thermal, BC-HG, the paper
        grid: -162.56 / -164.37 / -235.05 cross-fitted against -162.58 / -164.49 / -235.65
        in-sample at lr 0.1 / 0.01 / 0.001 (benchmarks/RESULTS.md).
      control_variates: subtract E[V(s')|s, b] from V(s_{k+1}) in the score-function terms.
      follower_grad: FollowerQGrad per step: ``"score"`` (Eq. (nablaQF)) or ``"pathwise"``.
      state_baseline: BC-HG subtracts a learned h(s) ~ grad V_F(s), each episode's fitted on
        the other episodes (:func:`bchg_jax.lq.critics.leave_one_out_vector_value`, unbiased);
        with ``num_episodes = 1`` there is no other episode and no baseline.
      mlp_hidden: hidden layer sizes of the MLP critics.
      mlp_steps: Adam steps per MLP critic fit.
      mlp_lr: Adam learning rate of the MLP critics.
      mlp_warm_start: start each MLP fit from the previous iteration's parameters.
      mlp_normalize: scale the MLP critics' inputs / outputs (:func:`bchg_jax.lq.critics.scales`).
      mlp_minibatch: samples per MLP step; 0 means full batch.
      mlp_kernel: how the leader's MLP critic (Q_L) is fitted: ``"xla"`` (``critics.td_fit``,
        any backend) or ``"fused"`` (:func:`bchg_jax.lq.fused_td.td_fit_fused`: the same fit as
        two Pallas kernels per Adam step, for a CUDA GPU, where XLA's 27 kernels per step bound
        the faithful run; full batch, two hidden layers of one width in 16..128, float32; on
        another backend it runs in Pallas' interpreter, for tests, with a warning). HPGD's
        vector critic of grad V_F keeps ``"xla"``.
      value_samples: actions b_j ~ g(.|s) averaged for the MLP critic's V_L(s).
      ridge: LSTD ridge of the quadratic critics.
      riccati_tol: relative-change tolerance of the follower's Riccati iteration.
      riccati_max_iters: its iteration cap.
      follower: the simulated follower: the best response (default), ``k_step`` (K Riccati
        steps per iteration from its last value) or ``lag`` (its gain and covariance moved the
        share ``mix`` toward the best response's; :mod:`bchg_jax.lq.follower_models`).
      track_reference: also record the estimate's cosine and projection against the two exact
        references of :mod:`bchg_jax.lq.follower_references` every iteration.
    """

    num_episodes: int = 100
    iterations: int = 2000
    clip_norm: float = 1.0
    weights_init_std: float = 0.01  # reference: N(0, 0.01^2); the paper's text says N(0, 1)
    critic: str = "quadratic_loo"
    control_variates: bool = True  # subtract E[V(s')|s,b] in the score-function terms
    follower_grad: str = "pathwise"  # FollowerQGrad per step: "score" (Eq. (nablaQF)) or "pathwise"
    state_baseline: bool = True  # bchg: subtract h(s) ~ grad V_F(s) fitted on the other episodes
    mlp_hidden: Tuple[int, ...] = (64, 64)
    mlp_steps: int = 5000
    mlp_lr: float = 1e-4
    mlp_warm_start: bool = False  # True: start each iteration from the last fit (cheaper)
    mlp_normalize: bool = False  # scale inputs / outputs of the MLP critics (not the paper's)
    mlp_minibatch: int = 0  # 0: full-batch Adam steps (the paper); else samples per step
    mlp_kernel: str = "xla"  # "fused": the leader critic's fit as Pallas kernels (a GPU)
    value_samples: int = 256  # MLP critic: V_L(s) = mean of Q_L(s, b_j), b_j ~ g(.|s)
    ridge: float = 1e-6
    riccati_tol: float = 1e-6
    riccati_max_iters: int = 50_000
    FOLLOWER_KINDS = FOLLOWERS

    def validate(self) -> "TrainConfig":
        """Host-side range and choice checks; returns ``self`` (``ValueError`` otherwise)."""
        check_config(
            self,
            positive_ints=(
                "num_episodes",
                "iterations",
                "mlp_steps",
                "value_samples",
                "riccati_max_iters",
            ),
            nonneg_ints=("mlp_minibatch",),
            positive=("clip_norm", "mlp_lr", "riccati_tol"),
            unbounded=("clip_norm",),
            nonneg=("weights_init_std", "ridge"),
            choices={
                "follower_grad": FOLLOWER_GRADS,
                "critic": CRITICS,
                "mlp_kernel": MLP_KERNELS,
            },
        )
        if not self.mlp_hidden or any(int(h) < 1 for h in self.mlp_hidden):
            raise ValueError(f"mlp_hidden must be positive layer sizes, got {self.mlp_hidden!r}")
        if self.mlp_kernel == "fused" and self.critic == "mlp":
            hidden = tuple(int(h) for h in self.mlp_hidden)
            if self.mlp_minibatch:
                raise ValueError(
                    "mlp_kernel='fused' fits at full batch (the paper's critic), got "
                    f"mlp_minibatch={self.mlp_minibatch}; use mlp_kernel='xla' for minibatches"
                )
            if len(hidden) != 2 or hidden[0] != hidden[1] or hidden[0] not in (16, 32, 64, 128):
                raise ValueError(
                    "mlp_kernel='fused' fits two hidden layers of one width in (16, 32, 64, "
                    f"128), got mlp_hidden={self.mlp_hidden!r}; use mlp_kernel='xla'"
                )
        if self.critic == "quadratic_loo" and self.num_episodes < 2:
            raise ValueError(
                "critic='quadratic_loo' fits each episode's leader critic on the other episodes "
                f"and needs num_episodes >= 2, got {self.num_episodes}; use critic='quadratic' "
                "for a single episode"
            )
        self.check_follower()
        return self


class TrainState(NamedTuple):
    """The carry of the outer ``lax.scan`` (one iteration per step)."""

    theta: Array  # leader weights (unconstrained)
    P: Array  # follower Riccati solution (warm start)
    critic: object  # MLP critics' starting parameters (q, dVF) for the next iteration, or ()
    key: Array
    step: Array
    # the k_step learner's value matrix P [n, n]; the lag follower's last policy (K [m, n],
    # cov [m, m]); else None
    follower: Optional[object] = None


class _Fields(NamedTuple):
    lr: Any = 0.1
    beta: Any = 0.1


class HParams(hparams_lib.HParamsMixin, _Fields):
    """The LQ trainer's grid-able hyperparameters (traced; a grid is one vmapped program).

    Attributes:
      lr: leader SGD step size (> 0); default 0.1.
      beta: the follower's entropy weight (> 0); default 0.1.
    """

    __slots__ = ()

    def validate(self) -> "HParams":
        """Host-side range checks (concrete values); returns ``self``."""
        check_positive("lr", self.lr)
        check_beta(self.beta)
        return self


def check_truncation(problem: LQConfigurableMDP, method: str, tol: float = TRUNCATION_TOL) -> None:
    """Host-side: refuses a horizon too short for the sampling estimators.

    The estimators see episodes of T = ``problem.horizon`` steps but bootstrap with
    infinite-horizon quantities: the leader critic's V_L / Q_L (the TD fixed point of
    Algorithm 3, or the closed form), the follower's stationary V_F and best response
    (Proposition 1), and FollowerQGrad's sums (Eq. (nablaQF)) cut at T. What the cut leaves
    out is the discount weight beyond it, ``gamma_L^T + (1 - gamma_L) sum_{k<T} gamma_L^k
    gamma_F^(T-k)`` (:func:`~bchg_jax.core.bias_check.discount_weight_beyond`: the partial
    term's steps past T and the tails of the guiding term's segments started before it; about
    ``(1 + T (1 - gamma)) gamma^T`` for equal discounts, 7.6x ``gamma^T`` at 0.9 and T = 66).
    When it is not negligible the estimate targets neither the T-step J_L (the metric and the
    ``exact`` method) nor the infinite-horizon one. The ``exact`` method samples nothing and is
    not checked.

    Args:
      problem: the configurable MDP (``gamma_L``, ``gamma_F``, ``horizon``).
      method: the trainer's method.
      tol: the largest accepted weight (default :data:`TRUNCATION_TOL`).
    Returns:
      None.
    Raises:
      ValueError: a sampling method whose weight beyond T exceeds ``tol``, naming the
        shortest horizon that passes.
    """
    if method == "exact":
        return
    gL, gF, T = float(problem.gamma_L), float(problem.gamma_F), int(problem.horizon)
    weight = discount_weight_beyond(gL, gF, T)
    if weight > tol:
        need = T
        while discount_weight_beyond(gL, gF, need) > tol:  # the weight falls with the horizon
            need += max(1, need // 8)
        while need > T + 1 and discount_weight_beyond(gL, gF, need - 1) <= tol:
            need -= 1
        raise ValueError(
            f"{problem.name}: horizon {T} is too short for discounts gamma_L = {gL:g}, "
            f"gamma_F = {gF:g}: the discount weight beyond the cut, gamma_L^T + (1 - gamma_L) "
            f"sum_k<T gamma_L^k gamma_F^(T-k), is {weight:.3g} > {tol:g}. The estimators "
            "truncate episodes at T steps but bootstrap with infinite-horizon critics and "
            f"follower values, so method {method!r} would follow a biased gradient of neither "
            f"the {T}-step nor the infinite-horizon J_L. Give the problem a horizon of at least "
            f"{need} steps (dataclasses.replace(problem, horizon={need}), "
            f"thermal(horizon={need})), or use method 'exact'."
        )


def expected_next_value(Q: Array, r: Array, gamma) -> Array:
    """The score terms' control variate E[V(s') | s, b] = (Q(s, b) - r(s, b)) / gamma, from a
    critic's Q; 0 when gamma = 0, where the V(s') term it centres has weight gamma = 0 (a
    division would make every estimate NaN)."""
    gamma = jnp.asarray(gamma, Q.dtype)
    return jnp.where(gamma > 0, (Q - r) / jnp.where(gamma > 0, gamma, 1), 0)


def make_train(
    problem: LQConfigurableMDP, method: str = "bchg", config: TrainConfig = TrainConfig()
) -> Trainer:
    """Pure training functions (``init``, ``run``, ``train``) for an LQ configurable MDP.

    Algorithm 1 under ``lax.scan`` (module docstring): per iteration the follower's best response
    (Proposition 1), E episodes, the leader critic, Theorem 1's estimate
    (:func:`bchg_jax.lq.estimators.hypergradient`) or the exact hypergradient, and a clipped SGD
    ascent step on theta [d].

    Args:
      problem: an :class:`~bchg_jax.lq.cmdp.LQConfigurableMDP` (validated here).
      method: one of :data:`METHODS` (``"bchg"``, ``"hpgd_td"``, ``"hpgd_mc"``, ``"naive"``,
        ``"exact"``).
      config: the static :class:`TrainConfig`.
    Returns:
      a :class:`~bchg_jax.core.loop.Trainer`; its ``hparams(grid)`` builds :class:`HParams`
      (``lr``, ``beta``) and ``run`` yields per-iteration metrics (``J``, ``ok``, ``grad_norm``
      (the estimate's norm before any skip, as in the other families: non-finite or huge where
      the update was dropped),
      ``riccati_iters``, ``solve_capped`` (1: the Riccati iteration stopped at its cap,
      stalled at the rounding floor above its tolerance, or diverged),
      ``diverging`` (1: the played closed loop A - B K is not stable under
      max(gamma_L, gamma_F), where J_L and every critic diverge), ``update_skipped`` (1: the
      update was dropped: a capped solve, a diverging closed loop or a non-finite estimate) and
      the problem's components).
    Raises:
      ValueError: an unknown method, a wrong problem type, a failed ``validate()`` (e.g. a
        closed loop that diverges under gamma_L at theta0), or a horizon too short for the
        sampling methods (:func:`check_truncation`).
    """
    check_setup(problem, method, config, METHODS, LQConfigurableMDP)
    check_truncation(problem, method)
    guide, source = METHOD_SPECS[method]
    n, m = problem.state_dim, problem.action_dim
    dtype = jnp.asarray(problem.theta0).dtype
    d = int(np.size(problem.theta0))
    E, T = config.num_episodes, problem.horizon
    use_mlp = config.critic == "mlp" and method != "exact"
    # the leader's Q_L fit (HPGD-MC uses Monte Carlo returns and fits none)
    fused = use_mlp and source != "mc" and config.mlp_kernel == "fused"
    if fused:
        if dtype != jnp.float32:
            raise ValueError(
                f"mlp_kernel='fused' computes in float32, the problem's theta is {dtype}; use "
                "mlp_kernel='xla'"
            )
        if n + m + 2 > 64:
            raise ValueError(
                f"mlp_kernel='fused' takes at most 62 critic inputs, got n + m = {n + m}"
            )
        interpret = fused_td.interpret_default()
        if interpret:
            warnings.warn(
                f"mlp_kernel='fused' runs in Pallas' interpreter on {jax.default_backend()!r}, "
                "orders of magnitude slower than mlp_kernel='xla' (it is meant for a CUDA GPU; "
                "the interpreter is for tests)",
                stacklevel=2,
            )
    # the critics' parameters (and Adam states) in theta's dtype, as every other piece
    q_model = MLP(tuple(config.mlp_hidden), 1, torch_init=False, param_dtype=dtype)
    v_model = MLP(tuple(config.mlp_hidden), d, torch_init=False, param_dtype=dtype)
    comp_fn = getattr(problem, "components", None)

    def init(key, hp):
        k_theta, k_q, k_v, k_run = jax.random.split(key, 4)
        theta0 = jnp.asarray(problem.theta0, dtype)
        theta = theta0 + config.weights_init_std * jax.random.normal(k_theta, theta0.shape, dtype)
        critic_init = ()
        if use_mlp:
            critic_init = (
                q_model.init(k_q, jnp.zeros((1, n + m), dtype)),
                v_model.init(k_v, jnp.zeros((1, n), dtype)),
            )
        own = None
        if fm.kind == "k_step":
            own = jnp.zeros((n, n), dtype)  # knows nothing yet
        elif fm.kind == "lag":  # the policy of knowing nothing, as the learner's first
            start = first_policy(problem, hp.beta, dtype)
            own = (start.K, start.cov)
        Qbar = jnp.asarray(problem.Qbar, dtype)
        return TrainState(theta, Qbar, critic_init, k_run, jnp.zeros((), jnp.int32), own)

    fm = config.follower

    def previous_policy(br, own):
        """The lag follower's last policy (its state) as a policy of ``br``'s kind."""
        return br._replace(K=own[0], K_w=jnp.zeros_like(br.K_w), cov=own[1])

    def play(theta, beta, br, own):
        """(the policy played, what the estimators see of it, the follower's next state): the
        best response, or the K-step learner's or the lag follower's policy with ``V^g``."""
        if fm.kind == "k_step":
            played, own = k_step_response(problem, theta, beta, own, fm.steps)
        elif fm.kind == "lag":
            played = lag_response(br, previous_policy(br, own), fm.mix, beta)
            # an unconverged best response (flagged, its update skipped) is not followed
            own = jax.tree.map(
                lambda new, old: jnp.where(br.converged, new, old), (played.K, played.cov), own
            )
        else:
            return br, br, own
        return played, observed_follower(problem, theta, played, beta), own

    def references(theta, beta, played, own):
        """(as-if-optimal reference, reference through the follower's update) at theta; ``own``:
        the follower's state after its reaction to theta (where its next one starts)."""
        kw = dict(tol=config.riccati_tol, max_iters=config.riccati_max_iters)
        if fm.kind == "best_response":
            exact = exact_lq.exact_hypergradient(problem, theta, beta, **kw)
            return exact, exact
        target = as_if_optimal_hypergradient(problem, theta, played, beta)
        if fm.kind == "k_step":
            return target, k_step_hypergradient(problem, theta, own, beta, fm.steps)
        previous = previous_policy(played, own)
        P0 = jnp.where(played.converged, played.P, jnp.asarray(problem.Qbar, dtype))  # br's P
        return target, lag_hypergradient(problem, theta, previous, beta, fm.mix, P0=P0, **kw)

    def leader_critic(key, theta, br, traj, rL, critic_init):
        """(V_L [E,T+1], Q_L [E,T], EV_L [E,T] or None, fitted MLP params or None)."""
        s, b = traj.s, traj.b
        if source == "mc":
            G = discounted_returns(rL, problem.gamma_L)
            return jnp.concatenate([G, jnp.zeros((E, 1), dtype)], 1), G, None, None
        params = None
        if config.critic == "exact":
            qv = exact_lq.leader_value_quadratic(problem, theta, br)
            Q = qv.q(s[:, :-1], b[:, :-1])
            V = qv.value(s)
        elif config.critic in ("quadratic", "quadratic_loo"):
            # quadratic_loo: episode e's critic (H [E, 1, ., .]) is fitted on the other episodes
            fit = critics.fit_quadratic_q
            if config.critic == "quadratic_loo":
                fit = critics.leave_one_out_quadratic_q
            qf = fit(s, b, rL, problem.gamma_L, config.ridge, gain=br.K)
            Q = qf.q(s[:, :-1], b[:, :-1])
            V = qf.value(s, br.mean(s), br.cov)
        else:
            x = jnp.concatenate([s, b], -1)
            X, Xn = x[:, :-1].reshape(-1, n + m), x[:, 1:].reshape(-1, n + m)
            k_fit, k_val = jax.random.split(key)
            xs, ys = critics.scales(X, rL.reshape(-1), problem.gamma_L, config.mlp_normalize)
            # the data, the discount and Adam's settings: the same for either fit
            data = (X, Xn, rL.reshape(-1), problem.gamma_L, config.mlp_steps, config.mlp_lr)
            if fused:
                params = fused_td.td_fit_fused(critic_init[0], *data, xs, ys, interpret=interpret)
            else:
                params = critics.td_fit(
                    q_model, critic_init[0], *data, k_fit, config.mlp_minibatch, xs, ys
                )
            Q = critics.apply_scaled(q_model, params, X, xs, ys)[:, 0].reshape(E, T)
            bs = br.sample(k_val, jnp.broadcast_to(s[None], (config.value_samples,) + s.shape))
            xv = jnp.concatenate([jnp.broadcast_to(s[None], bs.shape[:-1] + (n,)), bs], -1)
            V = jnp.mean(critics.apply_scaled(q_model, params, xv, xs, ys)[..., 0], 0)
        EV = expected_next_value(Q, rL, problem.gamma_L) if config.control_variates else None
        return V, Q, EV, params

    def fit_grad_vf(key, traj, y, critic_init):
        """(learned grad_theta V_F at s_0..s_{T-1}, fitted MLP params or None): TD on the per-step
        vector rewards ``y`` (BC-HG's baseline: each episode's fit on the other episodes)."""
        if config.critic == "mlp" and guide == "hpgd":
            S = traj.s[:, :-1].reshape(-1, n)
            Sn = traj.s[:, 1:].reshape(-1, n)
            Y = y.reshape(-1, d)
            xs, ys = critics.scales(S, Y, problem.gamma_F, config.mlp_normalize)
            params = critics.td_fit(
                v_model,
                critic_init[1],
                S,
                Sn,
                Y,
                problem.gamma_F,
                config.mlp_steps,
                config.mlp_lr,
                key,
                config.mlp_minibatch,
                xs,
                ys,
            )
            return critics.apply_scaled(v_model, params, S, xs, ys).reshape(E, T, d), params
        if guide == "benefit":
            # BC-HG's state baseline: unbiased only if h does not depend on the episode's own
            # actions, so each episode's LSTD fit uses the other episodes (none when E = 1)
            h = critics.leave_one_out_vector_value(traj.s, y, problem.gamma_F, config.ridge)
            return h, None
        # HPGD's dVF for the quadratic / exact critics (the class is exact for an LQ follower)
        f = critics.fit_quadratic_vector_value(traj.s, y, problem.gamma_F, config.ridge)
        return f(traj.s[:, :-1]), None

    def follower(theta, beta, P0):
        """Proposition 1's best response, Riccati iteration warm-started from P0 (flagged, never
        silently wrong: ``br.converged``)."""
        return problem.best_response(
            theta, beta, P0=P0, tol=config.riccati_tol, max_iters=config.riccati_max_iters
        )

    def evaluate(theta, beta, br, played=None):
        """Metrics of theta: the exact 100-step J_L and its components at the policy played
        (``played``, default the best response ``br``), the best response's solve status."""
        played = br if played is None else played
        quadratics = {} if comp_fn is None else comp_fn(theta)
        # J and the components from one state-covariance sum (one 100-step scan, not two)
        J, parts = exact_lq.objective_and_components(problem, theta, played, quadratics)
        return {
            "J": J,
            "ok": br.converged.astype(jnp.int32),
            "riccati_iters": br.info.iterations,
            **parts,
        }

    def follower_terms(key, theta, br, traj, critic_init):
        """The follower-side inputs of the estimator: V_F on the batch, the control variate
        E[V_F(s')|s,b] (or None), FollowerQGrad ``dQF`` (pathwise form) and the learned
        ``dVF ~ grad V_F`` (HPGD, or BC-HG's state baseline), with the fitted MLP params."""
        s, b = traj.s[:, :-1], traj.b[:, :-1]
        V_F = soft_value(br, traj.s)
        EV_F = None
        if config.control_variates:
            A, B = problem.A_fn(theta), problem.B_fn(theta)
            QF = soft_q(
                br,
                A,
                B,
                jnp.asarray(problem.Qbar, dtype),
                jnp.asarray(problem.Rbar, dtype),
                jnp.asarray(problem.U, dtype),
                problem.gamma_F,
                s,
                b,
            )
            EV_F = expected_next_value(QF, problem.follower_reward(theta, s, b), problem.gamma_F)
        kw, v_params = {}, None
        if guide is not None and guide != "none":
            need_vf = guide == "hpgd" or config.state_baseline
            if config.follower_grad == "pathwise":
                br_fixed = jax.lax.stop_gradient(br)
                y = per_step_follower_grad_pathwise(
                    problem, theta, traj, lambda x: soft_value(br_fixed, x)
                )
                kw["dQF"] = discounted_returns(y, problem.gamma_F)
            elif need_vf:
                VFn = V_F[:, 1:] if EV_F is None else V_F[:, 1:] - EV_F
                y = per_step_follower_grad(problem, theta, traj, VFn)
            if need_vf:
                kw["dVF"], v_params = fit_grad_vf(key, traj, y, critic_init)
        return V_F, EV_F, kw, v_params

    def estimate(k_roll, k_crit, theta, beta, br, critic_init):
        """One batch under g and the method's hypergradient estimate (Theorem 1, continuous
        modules) -> (grad, fitted MLP params or None for the Q_L and dVF critics)."""
        traj = rollout(k_roll, problem, theta, br, E, T)
        s, b = traj.s[:, :-1], traj.b[:, :-1]
        rL = problem.leader_reward(theta, s, b)
        V_L, Q_L, EV_L, q_params = leader_critic(k_crit, theta, br, traj, rL, critic_init)
        V_F, EV_F, kw, v_params = follower_terms(
            jax.random.fold_in(k_crit, 1), theta, br, traj, critic_init
        )
        if guide == "benefit":
            kw["benefit"] = Q_L - V_L[:, :-1]
        elif guide == "hpgd":
            kw["Q_L"] = Q_L
        grad = hypergradient(
            problem, theta, traj, beta, V_L, V_F, guide, EV_L=EV_L, EV_F=EV_F, **kw
        )
        return grad, q_params, v_params

    def step(state: TrainState, hp: HParams):
        hp = hp.cast(dtype)
        theta, beta = state.theta, hp.beta
        critic = state.critic
        key, k_roll, k_crit = jax.random.split(state.key, 3)
        br = follower(theta, beta, state.P)
        played, view, own = play(theta, beta, br, state.follower)
        metrics = evaluate(theta, beta, br, played)
        if method == "exact":
            grad = exact_lq.exact_hypergradient(
                problem, theta, beta, tol=config.riccati_tol, max_iters=config.riccati_max_iters
            )
        else:
            grad, q_params, v_params = estimate(k_roll, k_crit, theta, beta, view, state.critic)
            if use_mlp and config.mlp_warm_start:
                critic = (
                    state.critic[0] if q_params is None else q_params,
                    state.critic[1] if v_params is None else v_params,
                )
        raw = grad
        # the closed loop the episodes follow must be stable under both discounts: past it the
        # infinite-horizon J_L, critics and follower values diverge, and the sampled estimates
        # are finite but meaningless (1e13 where 1e4 just inside, with no flag) while the exact
        # method's is NaN; either way the update is dropped and said (validate checks theta0)
        closed = exact_lq.closed_loop_matrix(problem, theta, played.K)
        stable = exact_lq.is_discounted_stable(closed, max(problem.gamma_L, problem.gamma_F))
        ok = br.converged & stable & jnp.all(jnp.isfinite(grad))
        grad = jnp.where(ok, grad, 0.0)  # flagged, skipped: never a silent NaN update
        new_theta = sgd_ascent(theta, grad, hp.lr, config.clip_norm)
        metrics["ok"] = ok.astype(jnp.int32)
        # a solve that met its tolerance at a non-stabilising solution (br.info.unstable) is
        # a diverging closed loop, not a capped solve
        metrics["solve_capped"] = (~br.converged & ~br.info.unstable).astype(jnp.int32)
        metrics["update_skipped"] = (~ok).astype(jnp.int32)
        metrics["diverging"] = (~stable | br.info.unstable).astype(jnp.int32)
        metrics["grad_norm"] = global_norm(raw)  # the estimate's, skipped or not
        if fm.kind == "k_step":
            own = jnp.where(jnp.all(jnp.isfinite(own)), own, jnp.zeros_like(own))
        if fm.kind != "best_response":
            metrics["follower_gap"] = gain_gap(played, br)
        if config.track_reference:
            # "through": from the learner's state after this reaction (where its reaction to
            # the leader's next theta starts), as the tabular and game trainers
            target, through = references(theta, beta, played, own)
            metrics.update(agreement(raw, target, "target"))
            metrics.update(agreement(raw, through, "through"))
        P_next = jnp.where(
            br.converged, jax.lax.stop_gradient(br.P), jnp.asarray(problem.Qbar, dtype)
        )
        return TrainState(new_theta, P_next, critic, key, state.step + 1, own), metrics

    steps = {
        "follower": follower,
        "play": play,
        "references": references,
        "evaluate": evaluate,
        "leader_critic": leader_critic,
        "follower_terms": follower_terms,
        "estimate": estimate,
    }
    return build_trainer(problem, method, config, init, step, HParams, dtype, steps)
