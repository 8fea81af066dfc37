"""Exact leader return and hypergradient of the bi-level LQR Markov game (the references of
Theorem 2's and Theorem 3's estimators).

Under the leader ``a = K s + U eps_a`` and the best response ``b = -K_s s - K_a a + L eps_b`` the
closed loop is linear-Gaussian (:func:`closed_loop`):
``s' = F s + (C - B K_a) U eps_a + B L eps_b``, ``F = A + C K - B (K_s + K_a K)``,
so from the fixed ``s0`` the state is ``N(mu_t, Sigma_t)`` with ``mu_{t+1} = F mu_t``,
``Sigma_{t+1} = F Sigma_t F^T + N`` (:func:`state_moments`). The Gaussian bump has the closed-form
expectation (:func:`expected_bump`)
``E exp(-1/2 (s - s*)^T W (s - s*))
= det(I + Sigma_t W)^{-1/2} exp(-1/2 d^T (I + W Sigma_t)^{-1} W d)``
with ``d = mu_t - s*``. Summing over the horizon gives the leader's return
(:func:`leader_objective`);
its gradient by autodiff through the moments and the Riccati solution (implicit) is the exact
hypergradient (:func:`exact_hypergradient`). :func:`leader_q` gives exact finite-horizon critics
``Q_L^(h)(s, a, b) = r_L(s) + gamma V_L^(h-1)(A s + B b + C a)`` for any batch of samples (the
conditional mean from a state ``x`` is ``F^t x`` and the covariance does not depend on ``x``).
"""

from __future__ import annotations

import math
import warnings

import jax
import jax.numpy as jnp
import numpy as np

from bchg_jax.core.maxent_lqr import nan_unless_converged
from bchg_jax.core.precision import full_precision
from bchg_jax.core.validate import (
    check_beta_if_concrete,
    check_constants_once,
    check_count,
    check_discount,
    check_if_concrete,
    check_int_range,
    check_problem_settings,
    check_shape,
    check_theta,
    is_concrete,
)
from bchg_jax.games.estimators import (
    continuous_hypergradient,
    deterministic_hypergradient,
    game_score_weights,
)
from bchg_jax.games.lqr.follower import (
    GameResponse,
    best_response,
    follower_q,
    follower_state_value,
    follower_value,
)
from bchg_jax.games.lqr.game import LQRGame, leader_gain, leader_log_prob, leader_reward, transition
from bchg_jax.games.lqr.rollout import rollout

# exact_critic_estimate warns when the follower's influence sums lose more discount weight than
# this to the end of the episodes (gamma_F ** extra_steps): they stand for infinite sums
INFLUENCE_CUT_WARN = 1e-3


def influence_steps(game: LQRGame) -> int:
    """The fewest extra steps k whose cut leaves at most :data:`INFLUENCE_CUT_WARN` of the
    follower's influence sums' discount weight (``gamma_F ** k``): what
    :func:`exact_critic_estimate` needs to stay quiet, and ``check_problem``'s default."""
    gF = float(game.gamma_F)
    return 0 if gF == 0 else math.ceil(math.log(INFLUENCE_CUT_WARN) / math.log(gF))


Array = jax.Array


def _check_args(game: LQRGame, beta=None, horizon=None, gamma=None, theta=None) -> None:
    """The game's scalar settings, a concrete beta (> 0), a horizon (a positive integer), a
    concrete return discount gamma (in [0, 1]: a finite-horizon sum may be undiscounted) and
    theta ([k * n], finite); None skips an argument."""
    check_problem_settings(game)
    check_constants_once(game)
    if theta is not None:
        check_theta(game, theta, last_axis=game.num_params)
    if beta is not None:
        check_beta_if_concrete(beta)
    if horizon is not None:
        check_count("horizon", horizon)
    if gamma is not None:
        check_if_concrete(check_discount, "gamma (the leader return's discount)", gamma, True)


@full_precision
def closed_loop(game: LQRGame, theta: Array, resp: GameResponse, stochastic: bool = True):
    """(F, N): the closed-loop matrix and the per-step noise covariance.

    Args:
      game: the LQR game. theta: [k * n] leader parameters.
      resp: the follower's best response at theta.
      stochastic: include the leader's noise U (False: deterministic leader).
    Returns:
      (F [n, n] = A + C K - B (K_s + K_a K), N [n, n] symmetric noise covariance).
    """
    dt = theta.dtype
    A, B, C, _, _ = game.arrays(dt)
    K = leader_gain(game, theta)
    F = A + C @ K - B @ (resp.K_s + resp.K_a @ K)
    G = (C - B @ resp.K_a) @ jnp.asarray(game.U, dt) * (1.0 if stochastic else 0.0)
    N = G @ G.T + B @ resp.cov @ B.T
    return F, 0.5 * (N + N.T)


@full_precision
def state_moments(F: Array, N: Array, s0: Array, horizon: int):
    """Means [T, n] and covariances [T, n, n] of s_0..s_{T-1} from the fixed state ``s0``.

    Args:
      F: [n, n] closed-loop matrix. N: [n, n] per-step noise covariance.
      s0: [n] initial state. horizon: T.
    Returns:
      (mu [T, n], Sigma [T, n, n]).
    """

    def body(c, _):
        mu, S = c
        return (F @ mu, F @ S @ F.T + N), (mu, S)

    n = s0.shape[-1]
    _, (mu, S) = jax.lax.scan(body, (s0, jnp.zeros((n, n), s0.dtype)), None, length=horizon)
    return mu, S


@full_precision
def expected_bump(game: LQRGame, mu: Array, cov: Array) -> Array:
    """E[r_L(s)] for s ~ N(mu, cov) (any batch shape; ``cov`` broadcasts against ``mu``).

    Args:
      game: the LQR game (``s_star``, ``Sigma``).
      mu: [..., n] means.
      cov: [..., n, n] covariances (broadcast against ``mu``'s batch shape).
    Returns:
      [...] expected leader rewards.
    """
    W = jnp.asarray(game.Sigma, mu.dtype)
    n = mu.shape[-1]
    Mx = jnp.eye(n, dtype=mu.dtype) + W @ cov  # [..., n, n]
    d = mu - jnp.asarray(game.s_star, mu.dtype)
    Wd = d @ W.T
    # inverted on cov's own batch and applied as a product, not solved once per mean: a batched
    # LAPACK solve over the samples can stall jaxlib 0.10.x (core.maxent_lqr.whiten)
    z = jnp.einsum("...ij,...j->...i", jnp.linalg.inv(Mx), Wd)
    return jnp.exp(-0.5 * jnp.sum(d * z, -1)) / jnp.sqrt(jnp.linalg.det(Mx))


@full_precision
def leader_objective(
    game: LQRGame,
    theta: Array,
    beta,
    *,
    horizon: int | None = None,
    gamma=1.0,
    stochastic: bool = True,
    resp: GameResponse | None = None,
    s0: Array | None = None,
    tol: float = 1e-6,
    max_iters: int = 50_000,
) -> Array:
    """sum_{t < horizon} gamma^t E[r_L(s_t)] from ``s0`` (default the game's): exact.

    ``gamma=1`` (default) is the paper's y-axis (undiscounted 100-step return); the leader's
    training objective is ``gamma=game.gamma_L``. Differentiable in theta.

    Args:
      game: the :class:`~bchg_jax.games.lqr.game.LQRGame`.
      theta: [k * n] leader parameters.
      beta: the follower's entropy weight (> 0), scalar.
      horizon: number of steps (default ``game.horizon``).
      gamma: discount of the return (default 1.0, undiscounted).
      stochastic: Gaussian (True) or deterministic (False) leader.
      resp: the follower's response; solved at theta (Proposition 2) when None, so that the
        gradient includes the follower's reaction.
      s0: [n] start state (default ``game.s0``).
      tol: Riccati stopping tolerance. max_iters: Riccati iteration cap (when ``resp`` is None).
    Returns:
      [] the expected leader return; when ``resp`` is None, NaN (and a NaN gradient) if the
      Riccati iteration here did not converge and the arguments are traced (under ``jit`` /
      ``vmap`` / ``grad``). A ``resp`` given is evaluated as it is (check ``resp.converged``).
    Raises:
      ValueError: a concrete ``beta`` not finite and > 0, a ``horizon`` that is not a positive
        integer, a concrete ``gamma`` outside [0, 1], a bad scalar setting of ``game`` (a
        discount outside [0, 1), ...), ``theta`` not [k * n], an ``s0`` not a finite [n], or a
        concrete solve here that did not converge.
    """
    _check_args(game, beta, horizon, gamma, theta=theta)
    if s0 is not None:  # the game's own s0 is validated; an override is checked here
        check_shape("s0", s0, (game.state_dim,), f"n={game.state_dim} from {game.name}")
        if is_concrete(s0) and not np.all(np.isfinite(np.asarray(s0))):
            raise ValueError(f"{game.name}: s0 must be finite, got {np.asarray(s0)}")
    T = int(game.horizon if horizon is None else horizon)
    solved = resp is None
    if solved:
        resp = best_response(game, theta, beta, stochastic=stochastic, tol=tol, max_iters=max_iters)
    F, N = closed_loop(game, theta, resp, stochastic)
    x0 = jnp.asarray(game.s0 if s0 is None else s0, theta.dtype)
    mu, S = state_moments(F, N, x0, T)
    r = expected_bump(game, mu, S)
    J = jnp.sum(r * jnp.asarray(gamma, theta.dtype) ** jnp.arange(T, dtype=theta.dtype))
    if not solved:  # the response given is evaluated as it is (the trainer flags its solves)
        return J
    J = nan_unless_converged(resp, J, "lqr.leader_objective: the follower's Riccati iteration")
    refuse_overflow(J, F, T, "games.lqr.leader_objective")
    return J


def refuse_overflow(value, F, horizon: int, caller: str) -> None:
    """A concrete non-finite return (or gradient) from a converged follower: the state's moments
    overflowed the dtype within the horizon, because the closed loop ``F`` is unstable (its
    covariance grows like rho(F)^(2t)). The true return is finite (the bump's expectation
    there is ~0), but not computable this way; raise rather than return NaN. A traced value is
    left as it is (NaN)."""
    if not is_concrete(value, F) or np.all(np.isfinite(np.asarray(value))):
        return
    rho = float(np.max(np.abs(np.linalg.eigvals(np.asarray(F, np.float64)))))
    dtype = jnp.result_type(value)
    raise ValueError(
        f"{caller}: the state's mean and covariance overflow {dtype} within the horizon "
        f"{horizon}: the closed loop's spectral radius is {rho:.4g}, so the covariance grows "
        f"like {rho:.4g}^(2t). The bump's expectation there is about 0, but this closed form "
        "cannot reach it; take a shorter horizon, float64, or a leader gain whose closed loop "
        "is stable"
    )


@full_precision
def exact_hypergradient(
    game: LQRGame,
    theta: Array,
    beta,
    *,
    horizon: int | None = None,
    gamma=None,
    stochastic: bool = True,
    tol: float = 1e-6,
    max_iters: int = 50_000,
) -> Array:
    """grad_theta of the discounted ``horizon``-step leader return (default gamma = gamma_L).

    The exact hypergradient (autodiff through the moments and the Riccati solution) that the
    Theorem 2 / Theorem 3 estimates are compared with.

    Args:
      game: the LQR game. theta: [k * n] leader parameters.
      beta: the follower's entropy weight (> 0), scalar.
      horizon: number of steps (default ``game.horizon``).
      gamma: discount (default ``game.gamma_L``).
      stochastic: Gaussian (True) or deterministic (False) leader.
      tol: Riccati stopping tolerance. max_iters: Riccati iteration cap.
    Returns:
      [k * n] gradient; NaN when the Riccati iteration did not converge (traced).
    Raises:
      ValueError: as :func:`leader_objective`.
    """
    _check_args(game, beta, horizon, gamma, theta=theta)
    g = game.gamma_L if gamma is None else gamma

    def J(th):
        resp = best_response(game, th, beta, stochastic=stochastic, tol=tol, max_iters=max_iters)
        kw = dict(horizon=horizon, gamma=g, stochastic=stochastic, resp=resp)
        return leader_objective(game, th, beta, **kw), resp

    grad, resp = jax.grad(J, has_aux=True)(theta)
    what = "lqr.exact_hypergradient: the follower's Riccati iteration"
    grad = nan_unless_converged(resp, grad, what)
    if is_concrete(grad) and not np.all(np.isfinite(np.asarray(grad))):
        F, _ = closed_loop(game, theta, resp, stochastic)
        T = int(game.horizon if horizon is None else horizon)
        refuse_overflow(grad, F, T, "games.lqr.exact_hypergradient")
    return grad


@full_precision
def leader_state_values(
    game: LQRGame,
    theta: Array,
    resp: GameResponse,
    x: Array,
    remaining: Array,
    gamma,
    horizon: int,
    stochastic: bool = True,
) -> Array:
    """V_L^(h)(x) = sum_{t < h} gamma^t E[r_L(s_t) | s_0 = x] for ``x`` [..., n] and ``h =
    remaining`` [...] (per sample, at most ``horizon``).

    Args:
      game: the LQR game. theta: [k * n] leader parameters.
      resp: the follower's response at theta.
      x: [..., n] start states.
      remaining: [...] steps left h per sample (values above ``horizon`` are cut at it).
      gamma: the leader's discount. horizon: the scan length (max h).
      stochastic: Gaussian (True) or deterministic (False) leader.
    Returns:
      [...] finite-horizon leader values.
    Raises:
      ValueError: a bad scalar setting of ``game``, a ``horizon`` that is not a positive
        integer, or a concrete ``gamma`` outside [0, 1].
    """
    _check_args(game, horizon=horizon, gamma=gamma, theta=theta)
    F, N = closed_loop(game, theta, resp, stochastic)

    def body(c, t):
        Ft, S = c
        r = expected_bump(game, x @ Ft.T, S)
        return (F @ Ft, F @ S @ F.T + N), jnp.where(t < remaining, gamma**t * r, 0.0)

    n = x.shape[-1]
    init = (jnp.eye(n, dtype=x.dtype), jnp.zeros((n, n), x.dtype))
    _, rs = jax.lax.scan(body, init, jnp.arange(horizon, dtype=x.dtype))
    return jnp.sum(rs, 0)


@full_precision
def leader_q(
    game: LQRGame,
    theta: Array,
    resp: GameResponse,
    s: Array,
    a: Array,
    b: Array,
    remaining: Array,
    gamma,
    horizon: int,
    stochastic: bool = True,
) -> Array:
    """Exact Q_L^(h)(s, a, b) = r_L(s) + gamma V_L^(h-1)(A s + B b + C a), h = ``remaining``.

    Args:
      game: the LQR game. theta: [k * n] leader parameters.
      resp: the follower's response at theta.
      s: [..., n] states. a: [..., k] leader actions. b: [..., m] follower actions.
      remaining: [...] steps left h per sample.
      gamma: the leader's discount. horizon: the scan length (max h).
      stochastic: Gaussian (True) or deterministic (False) leader.
    Returns:
      [...] exact finite-horizon leader Q-values.
    Raises:
      ValueError: as :func:`leader_state_values`.
    """
    _check_args(game, horizon=horizon, gamma=gamma, theta=theta)
    s2 = transition(game, s, a, b)
    return leader_reward(game, s) + gamma * leader_state_values(
        game, theta, resp, s2, remaining - 1, gamma, horizon, stochastic
    )


@full_precision
def exact_critic_estimate(
    game: LQRGame,
    theta: Array,
    beta,
    key: Array,
    *,
    episodes: int,
    leader_steps: int,
    extra_steps: int,
    gamma=None,
    stochastic: bool = True,
    guide: str = "benefit",
    direct_baseline: str = "value",
    influence: str = "baseline",
    samples: int = 16,
    tol: float = 1e-6,
    max_iters: int = 50_000,
) -> Array:
    """One batch's hypergradient estimate with *exact* critics (estimator studies and tests).

    Episodes of ``leader_steps + extra_steps`` steps from s0; the objective is the discounted
    ``leader_steps``-step return (exact critics Q_L^(h), h = steps left), the follower's influence
    sums run over the extra steps too (its horizon is infinite). The Benefit subtracts the mean of
    Q_L over ``samples`` follower actions. Stochastic leader (Theorem 2): ``direct_baseline`` in
    ``value`` (exact V_L^(h)(s)), ``same_b`` (mean of Q_L(s, a', b) over ``samples`` a' ~ f: the
    reference's, biased), ``same_noise`` (a' with the follower's noise kept), ``none``;
    ``influence`` in ``raw`` (V_F) or ``baseline`` (V_F - E_a' V_F). Deterministic leader:
    the appendix theorem (Theorem 3) with exact grad_a Q_L and grad_a Q_F.

    Args:
      game: the LQR game. theta: [k * n] leader parameters.
      beta: the follower's entropy weight (> 0), scalar.
      key: PRNG key (episodes, Benefit samples, baseline samples).
      episodes: E.
      leader_steps: T, the leader objective's horizon.
      extra_steps: extra steps that only the follower's influence sums see (a warning when
        ``gamma_F ** extra_steps`` exceeds :data:`INFLUENCE_CUT_WARN`).
      gamma: the leader's discount (default ``game.gamma_L``).
      stochastic: Gaussian leader (Theorem 2) or deterministic (Theorem 3).
      guide: ``"benefit"`` (BC-HG) or ``"none"`` (Naive-PGD).
      direct_baseline: ``"value"``, ``"same_b"``, ``"same_noise"`` or ``"none"``.
      influence: ``"raw"`` or ``"baseline"``.
      samples: Monte Carlo samples of the Benefit (and of the ``same_*`` baselines).
      tol: Riccati stopping tolerance. max_iters: Riccati iteration cap.
    Returns:
      [k * n] the estimate of grad_theta J_L (NaN when the Riccati iteration did not converge
      and the arguments are traced; an error when concrete).
    Raises:
      ValueError: an unknown ``direct_baseline`` or ``influence``, a concrete ``beta`` not
        finite and > 0, a concrete ``gamma`` outside [0, 1], ``episodes`` / ``leader_steps`` /
        ``samples`` not positive integers or ``extra_steps`` not an integer >= 0, a bad scalar
        setting of ``game``, or an unknown ``guide``.
    """
    _check_args(game, beta, gamma=gamma, theta=theta)
    if stochastic:
        game.check_gaussian_leader(
            "exact_critic_estimate(stochastic=True)",
            "pass stochastic=False for a leader without noise (Theorem 3)",
        )
    if direct_baseline not in ("value", "same_b", "same_noise", "none"):
        raise ValueError(f"unknown direct_baseline {direct_baseline!r}")
    if influence not in ("raw", "baseline"):
        raise ValueError(f"influence must be 'raw' or 'baseline', got {influence!r}")
    check_count("episodes", episodes)
    check_count("leader_steps", leader_steps)
    check_count("samples", samples)
    check_int_range("extra_steps", extra_steps, 0, float("inf"))
    cut = float(game.gamma_F) ** int(extra_steps)
    if cut > INFLUENCE_CUT_WARN:
        warnings.warn(
            f"lqr.exact_critic_estimate: extra_steps={extra_steps} cuts the follower's "
            f"influence sums (infinite in Theorem 2) at a discount weight gamma_F^{extra_steps} "
            f"= {cut:.3g} for the last leader step: the estimate is biased by about that share "
            f"of the follower-response term; take extra_steps >= {influence_steps(game)} "
            f"(log({INFLUENCE_CUT_WARN:g}) / log(gamma_F): games.lqr.exact.influence_steps)",
            stacklevel=2,
        )
    gL = game.gamma_L if gamma is None else gamma
    T = leader_steps
    resp = best_response(game, theta, beta, stochastic=stochastic, tol=tol, max_iters=max_iters)
    what = "lqr.exact_critic_estimate: the follower's Riccati iteration"
    checked = lambda grad: nan_unless_converged(resp, grad, what)  # noqa: E731

    def Qfn(s, a, b, rem):
        return leader_q(game, theta, resp, s, a, b, rem, gL, T, stochastic)

    k1, k2, k3 = jax.random.split(key, 3)
    tr = rollout(k1, game, theta, resp, episodes, T + extra_steps, stochastic=stochastic)
    s, a, b = tr.s[:, :-1], tr.a, tr.b
    rem = jnp.broadcast_to(jnp.maximum(T - jnp.arange(T + extra_steps), 1), s.shape[:2])
    q = Qfn(s, a, b, rem)
    bj = jax.vmap(lambda kk: resp.sample(kk, s, a))(jax.random.split(k2, samples))
    ben = q - jax.vmap(lambda bb: Qfn(s, a, bb, rem))(bj).mean(0)
    if not stochastic:
        dQL = jax.grad(lambda aa: Qfn(s, aa, b, rem).sum())(a)
        dQF = jax.grad(lambda aa: follower_q(game, resp, theta, s, aa, b).sum())(a)
        return checked(
            deterministic_hypergradient(
                lambda t_, s_: s_ @ leader_gain(game, t_).T,
                theta,
                s,
                dQL,
                ben,
                dQF,
                beta,
                gL,
                game.gamma_F,
                guide,
                leader_steps=T,
            )
        )
    if direct_baseline == "value":
        base = leader_state_values(game, theta, resp, s, rem, gL, T)
    elif direct_baseline == "none":
        base = 0.0
    elif direct_baseline in ("same_b", "same_noise"):
        K, U = leader_gain(game, theta), jnp.asarray(game.U, theta.dtype)
        eps = jax.random.normal(k3, (samples,) + a.shape, theta.dtype)
        a_alt = s @ K.T + eps @ U.T
        b_alt = (
            jnp.broadcast_to(b, a_alt.shape[:-1] + b.shape[-1:])
            if direct_baseline == "same_b"
            else resp.mean(s, a_alt) + (b - resp.mean(s, a))
        )
        base = jax.vmap(lambda aa, bb: Qfn(s, aa, bb, rem))(a_alt, b_alt).mean(0)
    else:
        raise ValueError(f"unknown direct_baseline {direct_baseline!r}")
    adv = follower_value(game, resp, s, a)
    if influence == "baseline":
        adv = adv - follower_state_value(game, resp, theta, s)
    elif influence != "raw":
        raise ValueError(f"influence must be 'raw' or 'baseline', got {influence!r}")
    w = game_score_weights(q, base, ben, adv, beta, gL, game.gamma_F, guide, leader_steps=T)
    return checked(
        continuous_hypergradient(
            lambda t_, s_, a_: leader_log_prob(game, t_, s_, a_), theta, s, a, w
        )
    )


@full_precision
def hypergradient_split(
    game: LQRGame,
    theta: Array,
    beta,
    *,
    horizon: int | None = None,
    gamma=None,
    stochastic=True,
    tol: float = 1e-6,
    max_iters: int = 50_000,
):
    """(full, direct): the exact hypergradient and its part with the follower's policy held
    fixed (what Naive-PGD estimates); ``full - direct`` is the follower-response part, which the
    Benefit term of BC-HG estimates (the second term of Eq. (hg_MG)).

    "Held fixed" means the follower's policy g(b | s, a) as a function of (s, a): with the
    Gaussian leader (``stochastic=True``) that is Naive-PGD's part exactly. With the
    deterministic leader (``stochastic=False``) the follower still reacts to the leader's action
    a = K s through g(. | s, a), while ``naive_det``'s direct term (Theorem 3) holds the follower's
    action b itself fixed and leaves that reaction to the Benefit term: the two differ (on a
    random 3-d game, 31% of the norm, 36 SE). For the deterministic leader, ``direct`` is
    therefore not ``naive_det``'s target, only ``full`` is BC-HG's.

    Args:
      game, theta, beta, horizon, gamma, stochastic, tol, max_iters: as
        :func:`exact_hypergradient`.
    Returns:
      (full [k * n], direct [k * n]), NaN when the Riccati iteration did not converge (traced).
    Raises:
      ValueError: as :func:`exact_hypergradient`.
    """
    _check_args(game, beta, horizon, gamma, theta=theta)
    g = game.gamma_L if gamma is None else gamma

    def J(th, th_follower):
        resp = best_response(
            game, th_follower, beta, stochastic=stochastic, tol=tol, max_iters=max_iters
        )
        kw = dict(horizon=horizon, gamma=g, stochastic=stochastic, resp=resp)
        return leader_objective(game, th, beta, **kw), resp

    full, resp = jax.grad(lambda th: J(th, th), has_aux=True)(theta)
    direct, _ = jax.grad(lambda th: J(th, jax.lax.stop_gradient(theta)), has_aux=True)(theta)
    what = "lqr.hypergradient_split: the follower's Riccati iteration"
    return tuple(nan_unless_converged(resp, x, what) for x in (full, direct))
