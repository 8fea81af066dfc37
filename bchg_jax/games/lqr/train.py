"""Actor-critic leaders in the bi-level LQR Markov game: ``make_train``.

Algorithm 1 with the Markov-game modules (TD critic with target networks, Algorithm 3; direct
term, Algorithm 5; FollowerQGrad, Algorithm 7) for Theorem 2 (Eq. (hg_MG)) and, for the
deterministic methods, the appendix's Theorem 3 (Eq. (hg_MG_det)).

The leader is linear, ``K_theta = theta.reshape(k, n)``: Gaussian ``N(K s, U U^T)`` for the
stochastic methods, ``a = K s`` for the deterministic ones (episodes are collected with the
Gaussian leader for every method). The follower is Proposition 2's best
response, re-solved (warm-started Riccati) every iteration. One outer iteration
(the reference implementation's settings, ``docs/experiments.md``):

  1. ``episodes`` episodes of ``horizon`` steps from s0 (while fewer than ``warmup_steps`` env
     steps have been taken, the leader acts N(0, warmup_std^2) at random), added to the buffer
     (``"on"``: the newest batch only; ``"off"``: every episode);
  2. ``critic_steps`` updates of the MLP critic Q_L(s, a, b) on uniform minibatches with target
     ``r_L(s) + gamma_L Q_targ(s', K_targ s', mean of g(.|s', K_targ s'))``;
  3. ``actor_steps`` updates on minibatches drawn with probability ~ gamma_L^t (skipped during the
     warm-up), the gradient clipped to ``clip`` (global norm) before Adam:
     * ``bchg`` / ``naive`` (Theorem 2, score-function form): direct term
       ``grad log f(a|s) (Q(s,a,b) - base)``; ``bchg`` adds ``(1/beta) Ben(s,a,b) I`` with
       ``Ben = Q(s,a,b) - mean_j Q(s,a,b_j)``, ``b_j ~ g(.|s,a)`` and the influence
       ``I = sum_{k>=0} gF^k grad log f(a_{t+k}|s_{t+k}) adv_F(s_{t+k}, a_{t+k})`` over the rest of
       the episode;
     * ``bchg_det`` / ``naive_det`` (Theorem 3): ``grad_a Q(s,a,b)|_{a=Ks} s^T`` and, for
       ``bchg_det``, ``(1/beta) Ben(s,Ks,b) sum_k gF^k grad_a Q_F(s_k, K s_k, b_k) s_k^T``
       (grad_a Q_F from the white-box follower);
     * ``exact``: gradient ascent on the exact discounted return (the reference curve);
  4. soft update (``tau``) of the target critic and the target leader; the follower re-solves
     (an actor update after which the Riccati iteration does not converge within
     ``follower_max_iters`` is skipped and counted in the ``update_skipped`` metric).

Options that the paper leaves open or where the reference deviates (``docs/experiments.md``):
``direct_baseline="reference"`` subtracts ``mean_i Q(s, a'_i, b)``, a'_i ~ f(.|s), with the *same*
b (biased: b depends on a); ``"same_noise"`` keeps the follower's noise instead,
``b'_i = mean_g(s, a'_i) + (b - mean_g(s, a))`` (unbiased: the noise is independent of a);
``"none"``. ``influence="raw"`` uses V_F(s_k, a_k) (the reference); ``"baseline"`` subtracts
``E_a' V_F(s_k, a')`` (unbiased, far lower variance with U = 1e-3).
``shuffle_benefit=True`` (a control experiment, not a method) pairs every influence sum with the
Benefit of another minibatch element: the guiding term keeps its noise but loses its mean.
The learned-critic design (the CLI's ``explore`` preset, ``docs/experiments.md``) adds
``explore_episodes`` behaviour episodes ``a = K s + explore_std * eps`` per iteration, which feed
only the critic; the critic then trains off-policy on a replay ring of the newest ``replay``
episodes, with ``target_samples`` follower actions averaged in its TD target, standardised inputs
(``normalize``) and output scale ``q_scale``; ``influence_cv`` subtracts a cross-fitted control
variate from the guiding term's influence sums (:mod:`bchg_jax.games.control_variate`) and
``guide_bound`` bounds each sample's guiding gradient by a multiple of the minibatch median;
``actor_lr_schedule="cosine"`` decays theta's learning rate to 0. ``exact_direct`` ascends the
exact hypergradient's direct part only (the follower's policy held at the iteration's start).
Metrics per iteration: the exact undiscounted return over the horizon (``J``, the paper's y-axis),
the discounted one, the batch's sampled return, theta, the follower's Riccati status.
"""

from __future__ import annotations

import dataclasses
from typing import NamedTuple, Tuple

import jax
import jax.numpy as jnp
import numpy as np
import optax

from bchg_jax.core.buffers import (
    EpisodeBuffer,
    buffer_add,
    buffer_init,
    sample_discounted,
    sample_uniform,
    stored,
)
from bchg_jax.core.loop import Trainer, adam_step, build_trainer, check_setup, masked_steps, polyak
from bchg_jax.core.networks import MLP
from bchg_jax.core.validate import check_config
from bchg_jax.games.control_variate import crossfit_baseline, quadratic_features
from bchg_jax.games.estimators import deterministic_objective, influence_weights, score_objective
from bchg_jax.games.hparams import game_hparams
from bchg_jax.games.lqr.exact import leader_objective
from bchg_jax.games.lqr.follower import (
    best_response,
    follower_q,
    follower_state_value,
    follower_value,
)
from bchg_jax.games.lqr.game import LQRGame, leader_gain, leader_log_prob, leader_reward
from bchg_jax.games.lqr.rollout import rollout

Array = jax.Array
# bchg / naive: Gaussian leader (Theorem 2 / direct term only); *_det: deterministic leader
# (Theorem 3); exact: ascent on the exact discounted return; exact_direct: on its direct part
# only (the follower's policy held fixed: what Naive-PGD estimates)
METHODS = ("bchg", "naive", "bchg_det", "naive_det", "exact", "exact_direct")
DETERMINISTIC = ("bchg_det", "naive_det")


@dataclasses.dataclass(frozen=True)
class TrainConfig:
    """Static (non-traced) settings of the LQR game trainer; ``validate()`` checks them.

    Attributes:
      iterations: number of outer iterations of ``train``.
      episodes: E, episodes of ``game.horizon`` steps collected per iteration.
      buffer: ``"on"`` (the newest batch only) or ``"off"`` (every episode so far).
      minibatch: M, transitions / segment starts per critic or actor step.
      max_steps: upper bound of the traced ``actor_steps`` / ``critic_steps``.
      hidden: hidden layer sizes of the critic Q_L(s, a, b).
      init: ``"torch"`` or ``"flax"`` initialisation of the critic.
      actor_lr: Adam learning rate of theta.
      actor_lr_schedule: ``"constant"`` or ``"cosine"`` (cosine decay from ``actor_lr`` to 0
        over ``iterations`` actor steps: the whole run when ``actor_steps`` = 1).
      critic_lr: Adam learning rate of the critic.
      tau: Polyak factor of the target critic and target leader, in (0, 1].
      clip: global-norm clip of the actor gradient (0: none).
      warmup_steps: environment steps with random leader actions (no actor updates).
      warmup_std: std of the random warm-up leader actions.
      explore_episodes: episodes per iteration collected with the behaviour leader
        ``a = K s + explore_std * eps`` for the critic only (0: none, the reference).
      explore_std: std of the behaviour leader's exploration noise.
      replay: episodes the critic trains on, the newest kept in a ring (0: the critic trains on
        the actor's buffer, the reference); must be a multiple of the episodes per iteration.
      critic_minibatch: transitions per critic step (0: ``minibatch``).
      target_samples: follower actions b' ~ g(.|s', a') averaged in the TD target (0: the
        follower's mean action, the reference).
      normalize: standardise the critic's inputs (s, a, b) by the mean and std of the data it
        trains on (recomputed every iteration; the target critic uses the same scales).
      q_scale: the critic network outputs ``q_scale * Q_L`` (its output scale).
      influence_cv: subtract from every influence sum a cross-fitted prediction of it from
        quadratic features of (s, a) (:mod:`bchg_jax.games.control_variate`; unbiased, since
        the Benefit has mean zero given (s, a)); needs at least 2 episodes in the actor's buffer.
      guide_bound: 0 (off) or b > 0: every minibatch sample's guiding-term gradient
        ``Ben_m (grad influence_m - c_m) / beta`` is shrunk to norm at most b times the median norm
        over the minibatch (a robust mean of a heavy-tailed term: biased, bounded).
      benefit_samples: follower actions b_j ~ g(.|s, a) averaged in the Benefit.
      baseline_samples: leader actions a'_i ~ f(.|s) averaged in the direct baseline.
      direct_baseline: ``"reference"``, ``"same_noise"`` or ``"none"`` (module docstring).
      influence: ``"raw"`` (V_F) or ``"baseline"`` (V_F - E_a' V_F).
      shuffle_benefit: control experiment pairing each influence with another Benefit.
      theta0_std: std of the N(0, theta0_std^2) initial theta [k * n].
      follower_tol: relative-change tolerance of the follower's Riccati iteration.
      follower_max_iters: its iteration cap.
      dtype: dtype of theta, the critic, the buffer and every computation.
    """

    iterations: int = 500
    episodes: int = 4
    buffer: str = "on"  # "on": newest batch (400 steps); "off": every episode
    minibatch: int = 64
    max_steps: int = 10  # upper bound of the actor / critic step grids
    hidden: Tuple[int, ...] = (64, 64)
    init: str = "torch"
    actor_lr: float = 0.1
    actor_lr_schedule: str = "constant"  # "constant" | "cosine" (to 0 over `iterations` steps)
    critic_lr: float = 0.1
    tau: float = 0.01
    clip: float = 1.0  # global-norm clip of the actor gradient (0: none)
    warmup_steps: int = 4000
    warmup_std: float = 1.0
    explore_episodes: int = 0  # behaviour episodes a = K s + explore_std eps (critic only)
    explore_std: float = 0.5
    replay: int = 0  # critic replay ring in episodes (0: the actor's buffer)
    critic_minibatch: int = 0  # 0: minibatch
    target_samples: int = 0  # 0: the follower's mean action in the TD target
    normalize: bool = False  # standardise the critic inputs
    q_scale: float = 1.0  # the critic network outputs q_scale * Q_L
    influence_cv: bool = False  # cross-fitted control variate of the guiding term
    guide_bound: float = 0.0  # per-sample bound of the guiding term (x minibatch median)
    benefit_samples: int = 256
    baseline_samples: int = 32
    direct_baseline: str = "reference"  # "reference" | "same_noise" | "none"
    influence: str = "raw"  # "raw" (V_F) | "baseline" (V_F - E_a' V_F)
    shuffle_benefit: bool = False  # control experiment: pair each influence with the
    # Benefit of another minibatch element (mean ~0, same noise)
    theta0_std: float = 1.0
    follower_tol: float = 1e-6
    follower_max_iters: int = 1000
    dtype: str = "float32"  # of theta, the critic, the buffer and every computation

    def validate(self) -> "TrainConfig":
        """Host-side range and choice checks; returns ``self`` (``ValueError`` otherwise)."""
        check_config(
            self,
            positive_ints=(
                "iterations",
                "episodes",
                "minibatch",
                "max_steps",
                "benefit_samples",
                "baseline_samples",
                "follower_max_iters",
            ),
            nonneg_ints=(
                "warmup_steps",
                "explore_episodes",
                "replay",
                "critic_minibatch",
                "target_samples",
            ),
            positive=("actor_lr", "critic_lr", "follower_tol", "warmup_std", "explore_std"),
            nonneg=("clip", "theta0_std", "guide_bound"),
            unit=("tau",),
            choices={
                "buffer": ("on", "off"),
                "init": ("torch", "flax"),
                "actor_lr_schedule": ("constant", "cosine"),
                "direct_baseline": ("reference", "same_noise", "none"),
                "influence": ("raw", "baseline"),
            },
        )
        per_iteration = self.episodes + self.explore_episodes
        if self.replay and self.replay % per_iteration:
            raise ValueError(
                f"replay ({self.replay} episodes) must be a multiple of the "
                f"{per_iteration} episodes collected per iteration (episodes + "
                "explore_episodes)"
            )
        if self.influence_cv and self.buffer != "on":
            raise ValueError(
                "influence_cv needs buffer='on' (the newest episodes are the "
                "control variate's groups)"
            )
        if self.influence_cv and self.episodes < 2:
            raise ValueError(
                "influence_cv needs episodes >= 2: the control variate of an "
                "episode's samples is fitted on the other episodes"
            )
        if self.explore_episodes and not self.replay:
            raise ValueError(
                "explore_episodes > 0 needs a replay ring (replay > 0): the "
                "exploration episodes feed only the critic"
            )
        return self


class Critic(NamedTuple):
    """The leader's critic Q_L(s, a, b): the MLP's parameters and the input scales.

    Attributes:
      params: the MLP's parameters (the only part the critic's Adam updates).
      scale: ``None`` (raw inputs) or ``(mean [n+k+m], std [n+k+m])``: the inputs (s, a, b) are
        standardised as ``(x - mean) / std`` (``config.normalize``).
    """

    params: object
    scale: object = None


def input_scale(buf: EpisodeBuffer, floor: float = 1e-3):
    """(mean, std) [n+k+m] of the (s, a, b) transitions stored in ``buf`` (its filled slots).

    The critic's input normalisation (``TrainConfig.normalize``); ``std`` is at least ``floor``.
    """
    n_slots = buf.s.shape[0]
    w = (jnp.arange(n_slots) < stored(buf)).astype(buf.s.dtype)[:, None, None]
    x = jnp.concatenate([buf.s[:, :-1], buf.a, buf.b], -1)  # [N, T, n+k+m]
    tot = jnp.sum(w) * x.shape[1]
    mean = jnp.sum(w * x, (0, 1)) / tot
    var = jnp.sum(w * (x - mean) ** 2, (0, 1)) / tot
    return jax.lax.stop_gradient(mean), jax.lax.stop_gradient(jnp.sqrt(var) + floor)


class TrainState(NamedTuple):
    """The carry of the outer ``lax.scan``: theta [k * n] and its target, the critic and its
    target, both Adam states, the follower's Riccati solution P [n, n] (warm start), the episode
    buffer (the actor's), the critic's replay ring (``None`` without one), the PRNG key and the
    iteration counter."""

    theta: Array
    theta_targ: Array
    critic: object
    critic_targ: object
    actor_opt: object
    critic_opt: object
    P: Array  # the follower's Riccati solution (warm start)
    buffer: EpisodeBuffer
    replay: object  # the critic's EpisodeBuffer ring, or None (the critic uses ``buffer``)
    key: Array
    step: Array


# the traced hyperparameters (actor_steps, critic_steps, beta), see bchg_jax.games.hparams
HParams = game_hparams("LQR game", __name__, actor_steps=1, critic_steps=5, beta=0.1)


def make_train(game: LQRGame, method: str = "bchg", config: TrainConfig = TrainConfig()) -> Trainer:
    """Pure training functions of a linear leader in the bi-level LQR game.

    Algorithm 1 under ``lax.scan`` (module docstring); the actor ascends Theorem 2's estimate
    (:func:`bchg_jax.games.estimators.score_objective`) or Theorem 3's
    (:func:`bchg_jax.games.estimators.deterministic_objective`).

    Args:
      game: an :class:`~bchg_jax.games.lqr.game.LQRGame` (validated here).
      method: one of :data:`METHODS`.
      config: the static :class:`TrainConfig`; ``config.dtype`` is the dtype of theta, the critic,
        the buffer and every computed quantity.
    Returns:
      a :class:`~bchg_jax.core.loop.Trainer`; its ``hparams(grid)`` builds :class:`HParams`
      and ``run`` yields per-iteration metrics (``J``, ``J_discounted``, ``batch_return``,
      ``K1``, ``K2``, ``grad_norm``, ``update_skipped``, ``solve_capped`` (both 1 when the
      follower's Riccati iteration at the new theta hit its cap and the update was undone),
      ``riccati_iterations``).
    Raises:
      ValueError: an unknown method or a failed ``validate()`` of the game or the config.
    """
    check_setup(game, method, config, METHODS)
    dtype = jnp.dtype(config.dtype)
    n, k, m = game.state_dim, game.leader_dim, game.follower_dim
    T, E, Ex = int(game.horizon), config.episodes, config.explore_episodes
    N = E if config.buffer == "on" else E * config.iterations
    explore_game = dataclasses.replace(game, U=config.explore_std * np.eye(k))
    gL, gF = game.gamma_L, game.gamma_F
    det = method in DETERMINISTIC
    guide = "benefit" if method in ("bchg", "bchg_det") else "none"
    critic_net = MLP(tuple(config.hidden), 1, config.init == "torch", dtype)
    tx = [optax.clip_by_global_norm(config.clip)] if config.clip > 0 else []
    lr = (
        optax.cosine_decay_schedule(config.actor_lr, config.iterations)
        if config.actor_lr_schedule == "cosine"
        else config.actor_lr
    )
    a_opt = optax.chain(*tx, optax.adam(lr))
    c_opt = optax.adam(config.critic_lr)
    warmup_iters = -(-config.warmup_steps // ((E + Ex) * T))
    critic_mb = config.critic_minibatch or config.minibatch

    def Q(critic: Critic, s, a, b):
        """Q_L(s, a, b) of a :class:`Critic` (inputs standardised by ``critic.scale``)."""
        x = jnp.concatenate([s, a, b], -1)
        if critic.scale is not None:
            x = (x - critic.scale[0]) / critic.scale[1]
        return critic_net.apply(critic.params, x)[..., 0] / config.q_scale

    def follower(theta, beta, P0=None):
        """Proposition 2's best response (warm-started Riccati iteration from P0)."""
        return best_response(
            game,
            theta,
            beta,
            stochastic=not det,
            P0=P0,
            tol=config.follower_tol,
            max_iters=config.follower_max_iters,
        )

    def init(key, hp: HParams):
        hp = hp.cast(dtype)
        kt, kc, kr = jax.random.split(key, 3)
        theta = config.theta0_std * jax.random.normal(kt, (k * n,), dtype)
        params = critic_net.init(kc, jnp.zeros((1, n + k + m), dtype))
        scale = (
            (jnp.zeros(n + k + m, dtype), jnp.ones(n + k + m, dtype)) if config.normalize else None
        )
        resp = follower(theta, hp.beta)
        replay = buffer_init(config.replay, T, dtype, (n, k, m)) if config.replay else None
        return TrainState(
            theta,
            theta,
            Critic(params, scale),
            params,
            a_opt.init(theta),
            c_opt.init(params),
            resp.P,
            buffer_init(N, T, dtype, (n, k, m)),
            replay,
            kr,
            jnp.zeros((), jnp.int32),
        )

    def follower_mean_q(critic, resp, key, s, a, samples):
        """mean_j Q(s, a, b_j) over ``samples`` follower actions b_j ~ g(.|s, a): the Monte
        Carlo E_b Q_L of the Benefit and of the sampled TD target."""
        bj = jax.vmap(lambda kk: resp.sample(kk, s, a))(jax.random.split(key, samples))
        shp = bj.shape[:-1]  # [J, M]
        return jnp.mean(
            Q(critic, jnp.broadcast_to(s, shp + (n,)), jnp.broadcast_to(a, shp + (k,)), bj), 0
        )

    def critic_loss(params, targ, scale, theta_targ, resp, key, s, a, b, s2):
        """TD loss of Q_L(s, a, b) against ``r_L(s) + gamma_L E_b' Q_targ(s', K_targ s', b')``:
        b' is the follower's mean action (``target_samples`` = 0) or the mean over
        ``target_samples`` draws b' ~ g(.|s', a')."""
        a2 = s2 @ leader_gain(game, theta_targ).T
        if config.target_samples:
            nxt = follower_mean_q(Critic(targ, scale), resp, key, s2, a2, config.target_samples)
        else:
            nxt = Q(Critic(targ, scale), s2, a2, resp.mean(s2, a2))
        y = leader_reward(game, s) + gL * nxt
        return jnp.mean((Q(Critic(params, scale), s, a, b) - jax.lax.stop_gradient(y)) ** 2)

    def critic_update(key, state, resp, buf, num_steps, scale):
        """``num_steps`` Adam steps of Q_L(s, a, b) on uniform minibatches of ``buf`` (TD targets
        from the target networks); returns (:class:`Critic`, Adam state)."""

        def body(i, c):
            params, opt = c
            ki = jax.random.fold_in(key, i)
            e, t = sample_uniform(ki, buf, critic_mb)
            grads = jax.grad(critic_loss)(
                params,
                state.critic_targ,
                scale,
                state.theta_targ,
                resp,
                jax.random.fold_in(ki, 1),
                buf.s[e, t],
                buf.a[e, t],
                buf.b[e, t],
                buf.s[e, t + 1],
            )
            return adam_step(c_opt, params, opt, grads)

        params, opt = masked_steps(
            body, config.max_steps, num_steps, (state.critic.params, state.critic_opt)
        )
        return Critic(params, scale), opt

    def leader_sample(theta, key, s):
        eps = jax.random.normal(key, s.shape[:-1] + (k,), s.dtype)
        return s @ leader_gain(game, theta).T + eps @ jnp.asarray(game.U, s.dtype).T

    def benefit(critic, resp, key, s, a, b, q):
        """Ben(s, a, b) = Q(s, a, b) - mean_j Q(s, a, b_j), b_j ~ g(.|s, a) (benefit_samples)."""
        return q - follower_mean_q(critic, resp, key, s, a, config.benefit_samples)

    def direct_baseline(theta, critic, resp, key, s, a, b):
        """The direct term's baseline: mean_i Q(s, a'_i, b'_i), a'_i ~ f(.|s) (config option)."""
        if config.direct_baseline == "none":
            return 0.0
        a_alt = jax.vmap(lambda kk: leader_sample(theta, kk, s))(
            jax.random.split(key, config.baseline_samples)
        )  # [I, M, k]
        if config.direct_baseline == "reference":
            b_alt = jnp.broadcast_to(b, a_alt.shape[:-1] + (m,))
        else:
            b_alt = resp.mean(s, a_alt) + (b - resp.mean(s, a))
        return jnp.mean(Q(critic, jnp.broadcast_to(s, a_alt.shape[:-1] + (n,)), a_alt, b_alt), 0)

    def stochastic_objective(theta, critic, resp, beta, key, e, t, buf):
        """Theorem 2 on the minibatch (:func:`score_objective`), Gaussian leader."""
        s, a, b = buf.s[e, t], buf.a[e, t], buf.b[e, t]
        kb, kj = jax.random.split(key)
        q = Q(critic, s, a, b)
        logf = leader_log_prob(game, theta, s, a)
        base = direct_baseline(theta, critic, resp, kb, s, a, b)
        if guide == "none":
            return score_objective(logf, q - base, None, None, None, None, beta, guide)
        ben = benefit(critic, resp, kj, s, a, b, q)
        se, ae = buf.s[e, :T], buf.a[e]  # [M, T, .]
        adv = follower_value(game, resp, se, ae)
        if config.influence == "baseline":
            adv = adv - follower_state_value(game, resp, theta, se)
        if config.shuffle_benefit:
            ben = jax.random.permutation(jax.random.fold_in(key, 1), ben)
        W = influence_weights(t, T, gF, dtype)
        J = score_objective(
            logf, q - base, ben, leader_log_prob(game, theta, se, ae), adv, W, beta, guide
        )
        return J + guide_correction(
            lambda th: jnp.sum(W * leader_log_prob(game, th, se, ae) * adv, -1),
            theta,
            ben,
            jnp.concatenate([s, a], -1),
            e,
            beta,
        )

    def deterministic_objective_(theta, critic, resp, beta, key, e, t, buf):
        """Theorem 3 (appendix) on the minibatch (:func:`deterministic_objective`), a = K s."""
        K = leader_gain(game, theta)
        s, b = buf.s[e, t], buf.b[e, t]
        a_pi = jax.lax.stop_gradient(s @ K.T)
        dQL = jax.grad(lambda aa: jnp.sum(Q(critic, s, aa, b)))(a_pi)
        if guide == "none":
            return deterministic_objective(s @ K.T, dQL, None, None, None, None, beta, guide)
        ben = benefit(critic, resp, key, s, a_pi, b, Q(critic, s, a_pi, b))
        se, be = buf.s[e, :T], buf.b[e]
        ae = jax.lax.stop_gradient(se @ K.T)
        dQF = jax.grad(lambda aa: jnp.sum(follower_q(game, resp, theta, se, aa, be)))(ae)
        W = influence_weights(t, T, gF, dtype)
        J = deterministic_objective(s @ K.T, dQL, ben, se @ K.T, dQF, W, beta, guide)
        return J + guide_correction(
            lambda th: jnp.sum(W * jnp.sum((se @ leader_gain(game, th).T) * dQF, -1), -1),
            theta,
            ben,
            s,
            e,
            beta,
        )

    def guide_correction(influence, theta, ben, x, e, beta):
        """A surrogate added to the guiding term: 0 unless ``influence_cv`` or ``guide_bound``.

        With ``G_m = grad_theta influence(theta)_m`` (one forward-mode pass, theta is small):
        ``influence_cv`` subtracts ``mean_m Ben_m c_m / beta``, ``c_m`` the cross-fitted
        prediction of ``G_m`` from quadratic features of ``x_m`` = (s_m, a_m)
        (:mod:`bchg_jax.games.control_variate`); ``guide_bound`` = b then shrinks every sample's
        guiding gradient ``h_m = Ben_m (G_m - c_m) / beta`` to norm at most b times the minibatch
        median of ``|h_m|`` by adding ``mean_m (w_m - 1) h_m . theta``, ``w_m`` the shrink factor.
        """
        if not (config.influence_cv or config.guide_bound):
            return 0.0
        G = jax.jacfwd(influence)(jax.lax.stop_gradient(theta))  # [M, d]
        c = crossfit_baseline(quadratic_features(x), G, e, N) if config.influence_cv else 0.0
        ben = jax.lax.stop_gradient(ben)
        surrogate = (
            -jnp.mean(ben * (jax.lax.stop_gradient(c) @ theta)) / beta
            if config.influence_cv
            else 0.0
        )
        if config.guide_bound:
            h = jax.lax.stop_gradient(ben[:, None] * (G - c) / beta)  # [M, d]
            norm = jnp.sqrt(jnp.sum(h**2, -1))
            bound = config.guide_bound * jnp.median(norm)
            w = jnp.minimum(1.0, bound / jnp.maximum(norm, jnp.finfo(norm.dtype).tiny))
            surrogate = surrogate + jnp.mean(((w - 1.0)[:, None] * h) @ theta)
        return surrogate

    actor_objective = deterministic_objective_ if det else stochastic_objective

    def actor_grad(theta, critic, resp, beta, key, e, t, buf):
        """Theorem 2's estimate (or Theorem 3's) on the minibatch (e, t): an ascent
        direction [k * n]."""
        return jax.grad(actor_objective)(theta, critic, resp, beta, key, e, t, buf)

    def actor_update(key, state, critic, resp, beta, buf, num_steps, active):
        """``num_steps`` clipped Adam steps along the estimate (minibatches ~ gamma_L^t), or along
        the exact hypergradient for ``exact``; returns (theta, opt state, last gradient norm)."""

        def body(i, c):
            theta, opt, _ = c
            if method == "exact":
                grads = jax.grad(
                    lambda th: -leader_objective(game, th, beta, gamma=gL, stochastic=True)
                )(theta)
            elif method == "exact_direct":  # the follower's policy held at theta's
                grads = jax.grad(
                    lambda th: (
                        -leader_objective(game, th, beta, gamma=gL, stochastic=True, resp=resp)
                    )
                )(theta)
            else:
                e, t = sample_discounted(jax.random.fold_in(key, i), buf, config.minibatch, gL)
                k_i = jax.random.fold_in(key, 10_000 + i)
                # the loss is the negated surrogate (differentiating it, rather than negating the
                # gradient, keeps XLA's arithmetic identical to a plain loss minimisation)
                grads = jax.grad(
                    lambda th: -actor_objective(th, critic, resp, beta, k_i, e, t, buf)
                )(theta)
            theta, opt = adam_step(a_opt, theta, opt, grads)
            return theta, opt, jnp.sqrt(jnp.sum(grads**2))

        return masked_steps(
            body,
            config.max_steps,
            num_steps,
            (state.theta, state.actor_opt, jnp.zeros((), dtype)),
            active,
        )

    def step(state: TrainState, hp: HParams):
        hp = hp.cast(dtype)
        beta = hp.beta
        key, k_roll, k_c, k_a = jax.random.split(state.key, 4)
        resp = follower(state.theta, beta, state.P)
        warm = state.step < warmup_iters
        tr = rollout(
            k_roll,
            game,
            state.theta,
            resp,
            E,
            T,
            stochastic=True,
            random_leader=warm,
            random_std=config.warmup_std,
        )
        buf = buffer_add(state.buffer, tr.s, tr.a, tr.b, config.buffer)
        replay, critic_buf = state.replay, buf
        if config.replay:
            s_, a_, b_ = tr.s, tr.a, tr.b
            if Ex:  # behaviour episodes a = K s + explore_std eps, for the critic only
                tx_ = rollout(
                    jax.random.fold_in(k_roll, 1),
                    explore_game,
                    state.theta,
                    resp,
                    Ex,
                    T,
                    stochastic=True,
                    random_leader=warm,
                    random_std=config.warmup_std,
                )
                s_, a_, b_ = (
                    jnp.concatenate(p, 0) for p in ((tr.s, tx_.s), (tr.a, tx_.a), (tr.b, tx_.b))
                )
            replay = critic_buf = buffer_add(replay, s_, a_, b_, "ring")
        critic, c_state = state.critic, state.critic_opt
        if method not in ("exact", "exact_direct"):
            scale = input_scale(critic_buf) if config.normalize else None
            critic, c_state = critic_update(k_c, state, resp, critic_buf, hp.critic_steps, scale)
        theta, a_state, gnorm = actor_update(
            k_a, state, jax.lax.stop_gradient(critic), resp, beta, buf, hp.actor_steps, ~warm
        )
        resp_new = follower(theta, beta, resp.P)
        # an update whose follower problem has no converged Riccati solution is skipped
        ok = resp_new.converged
        theta, a_state = jax.tree.map(
            lambda x, y: jnp.where(ok, x, y), (theta, a_state), (state.theta, state.actor_opt)
        )
        resp_new = jax.tree.map(lambda x, y: jnp.where(ok, x, y), resp_new, resp)
        metrics = {
            "J": leader_objective(game, theta, beta, stochastic=not det, resp=resp_new),
            "J_discounted": leader_objective(
                game, theta, beta, gamma=gL, stochastic=not det, resp=resp_new
            ),
            "batch_return": jnp.mean(jnp.sum(leader_reward(game, tr.s[:, :T]), -1)),
            "K1": theta[0],
            "K2": theta[1] if theta.shape[0] > 1 else theta[0],
            "grad_norm": gnorm,
            "update_skipped": (~ok).astype(jnp.int32),
            "solve_capped": (~ok).astype(jnp.int32),
            "riccati_iterations": resp_new.info.iterations,
        }
        new_state = TrainState(
            theta,
            polyak(theta, state.theta_targ, config.tau),
            critic,
            polyak(critic.params, state.critic_targ, config.tau),
            a_state,
            c_state,
            resp_new.P,
            buf,
            replay,
            key,
            state.step + 1,
        )
        return new_state, metrics

    steps = {
        "Q": Q,
        "follower": follower,
        "critic_update": critic_update,
        "benefit": benefit,
        "direct_baseline": direct_baseline,
        "actor_objective": actor_objective,
        "actor_grad": actor_grad,
        "actor_update": actor_update,
    }
    return build_trainer(
        game,
        method,
        config,
        init,
        step,
        lambda grid: HParams.from_grid(grid, dtype, max_steps=config.max_steps),
        lambda hp: HParams.validate(hp, max_steps=config.max_steps),
        steps,
    )
