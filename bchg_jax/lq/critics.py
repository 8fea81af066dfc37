"""Leader critics for linear-Gaussian configurable MDPs: quadratic LSTD (fast, exact class) and
MLP TD.

Quadratic critics: fast critics whose function class is exact for linear-Gaussian problems with
quadratic rewards.

For a zero-mean linear-Gaussian closed loop, the leader's Q_L(s, b) is a quadratic form in
z = (s, b) plus a constant, and grad_theta V_F(s) is, per coordinate of theta, a quadratic form in s
plus a constant. Fitting these classes by LSTD (the fixed point of on-policy TD(0)/SARSA on the
batch, Algorithm 3 "CriticUpdate (TD)" solved in closed form) gives consistent critics at the cost
of one small linear solve per iteration, instead of thousands of network steps.

* :func:`quadratic_features`: vech(z z^T) (upper triangle) and a constant.
* The basis. The follower acts ``b = -K s + noise`` with noise small beside ``K s``, so the
  features of (s, b) are nearly collinear: the scaled SARSA-LSTD matrix of the thermal problem
  has a condition number of 2e6 at 100 episodes, and float32 rounding of its statistics moved the
  fitted weights by a few percent and the hypergradient by 1e-3 (3e-2 at 4 episodes), enough that
  the same run gave another gradient inside a grid or a shard. Given the follower's gain
  (``gain=K``), the critics fit the features of z' = (s, b + K s) instead: an invertible linear
  map of z, so the same function class and, without the ridge, the same fit, but a matrix
  conditioned about 1e2 (float32 against float64 on the same samples: 3e-5 instead of 1e-3; the
  ridge's pull drops from 0.5-2% of the gradient to 2e-4). The fitted form is returned in (s, b).
* :func:`lstd`: weights W solving Phi^T (Phi - gamma Phi') W = Phi^T R (R may be vector-valued);
  features are rescaled to unit RMS first and a small ridge keeps float32 solves stable.
* :class:`QuadraticQ`: Q(s, b) = z^T H z + h0 with the exact Gaussian expectation
  V(s) = E_{b ~ N(mu(s), Sigma_b)} Q(s, b) = zbar^T H zbar + tr(H_bb Sigma_b) + h0.
* :func:`leave_one_out_vector_value`: BC-HG's state baseline, each episode's LSTD fit on the
  other episodes (unbiased: a fit on the episode itself is not).
* :func:`leave_one_out_quadratic_q`: the cross-fitted leader critic, each episode's Q_L the
  SARSA-LSTD fit of :func:`fit_quadratic_q` on the other episodes (the trainer's
  ``critic="quadratic_loo"``). Both leave-one-out fits share :func:`leave_one_out_lstd`.

MLP critics (the paper's neural critics, faithful mode): a 64-64 ReLU network (flax's default
initialisation), re-initialised to the *same* parameters every outer iteration and trained with
``steps`` full-batch Adam steps (lr 1e-4) on the semi-gradient TD loss
``mean((r + gamma sg(f(x')) - f(x))^2)`` (Algorithm 3 "CriticUpdate (TD)"), the whole loop one
``lax.scan``: :func:`init_mlp`, :func:`scales`, :func:`apply_scaled`, :func:`td_fit`. Used for
the leader's Q_L(s, b) (scalar) and HPGD's grad_theta V_F(s) (vector).
"""

from __future__ import annotations

from typing import NamedTuple, Optional, Sequence

import jax
import jax.numpy as jnp
import numpy as np
import optax

from bchg_jax.core.networks import MLP
from bchg_jax.core.precision import full_precision
from bchg_jax.core.validate import (
    check_count,
    check_discount,
    check_if_concrete,
    check_int_range,
    check_positive,
)

Array = jax.Array


def _triu(d):
    return jnp.triu_indices(d)


def quadratic_features(z: Array) -> Array:
    """Quadratic features of z: z_i z_j (i <= j, ``triu_indices`` order) and a constant 1.

    Args:
      z: [..., d] inputs (e.g. the concatenation (s, b)).
    Returns:
      [..., d (d + 1) / 2 + 1] features.
    """
    i, j = _triu(z.shape[-1])
    quad = z[..., i] * z[..., j]
    return jnp.concatenate([quad, jnp.ones(z.shape[:-1] + (1,), z.dtype)], -1)


def _check_ridge(ridge) -> None:
    v = np.asarray(ridge, np.float64)
    if v.ndim or not (np.isfinite(v) and v >= 0):
        raise ValueError(f"ridge must be a finite scalar >= 0, got {ridge!r}")


def check_fit_settings(gamma, ridge=None) -> None:
    """The settings of a critic fit, where concrete (under the trainers they are the problem's
    and the config's constants): ``gamma`` a discount in [0, 1) (the TD fixed point of an
    infinite discounted sum; gamma 1.5 gave a finite, meaningless H) and ``ridge`` finite and
    >= 0 (a negative one a different finite fit).

    Raises:
      ValueError: naming the setting.
    """
    check_if_concrete(check_discount, "gamma (the critic's discount)", gamma)
    if ridge is not None:
        check_if_concrete(_check_ridge, ridge)


def check_td_settings(gamma, steps, lr, minibatch=0) -> None:
    """The settings of a TD fit (:func:`td_fit`, ``fused_td.td_fit_fused``): ``gamma`` as
    :func:`check_fit_settings`, ``steps`` an integer >= 1, a concrete ``lr`` finite and > 0,
    ``minibatch`` an integer >= 0.

    Raises:
      ValueError: naming the setting.
    """
    check_fit_settings(gamma)
    check_count("steps (Adam steps)", steps)
    check_if_concrete(check_positive, "lr (Adam learning rate)", lr)
    check_int_range("minibatch", minibatch, 0, float("inf"))


@full_precision
def lstd(phi: Array, phi_next: Array, rewards: Array, gamma, ridge: float = 1e-6) -> Array:
    """LSTD(0): W with Phi^T (Phi - gamma Phi') W = Phi^T R (the TD(0) fixed point on the batch).

    Features are rescaled to unit RMS before the solve and ``ridge`` is added to the diagonal.

    Args:
      phi: [N, F] features of the current steps.
      phi_next: [N, F] features of the next steps (the bootstrap targets).
      rewards: [N] or [N, D] (vector-valued) rewards.
      gamma: discount, scalar.
      ridge: Tikhonov regularisation of the scaled system.
    Returns:
      [F] or [F, D] weights for the *unscaled* features.
    Raises:
      ValueError: a concrete ``gamma`` outside [0, 1) or ``ridge`` not finite and >= 0.
    """
    check_fit_settings(gamma, ridge)
    scale = jnp.sqrt(jnp.mean(phi**2, 0)) + 1e-12
    p, pn = phi / scale, phi_next / scale
    N = phi.shape[0]
    A = p.T @ (p - gamma * pn) / N
    rhs = p.T @ rewards / N
    A = A + ridge * jnp.eye(A.shape[0], dtype=A.dtype)
    W = jnp.linalg.solve(A, rhs)
    return W / (scale if W.ndim == 1 else scale[:, None])


def _sym_from_triu(w_quad: Array, d: int) -> Array:
    i, j = _triu(d)
    H = jnp.zeros((d, d) + w_quad.shape[1:], w_quad.dtype)
    H = H.at[i, j].add(0.5 * w_quad).at[j, i].add(0.5 * w_quad)
    return H


class QuadraticQ(NamedTuple):
    """A quadratic leader critic Q(s, b) = z^T H z + h0, z = (s, b).

    ``H`` and ``h0`` may carry leading batch dimensions that broadcast against those of the
    inputs (:func:`leave_one_out_quadratic_q`: ``H`` [E, 1, n + m, n + m], ``h0`` [E, 1], so that
    on [E, T, .] inputs episode e is evaluated with its own critic).

    Attributes:
      H: [..., n + m, n + m] symmetric quadratic form.
      h0: [...] constant.
      n: the state dimension (splits z into s and b).
    """

    H: Array  # [n + m, n + m], or [..., n + m, n + m] (a batch of critics)
    h0: Array  # [], or [...]
    n: int

    @staticmethod
    def from_weights(w: Array, n: int, m: int) -> "QuadraticQ":
        """From LSTD weights ``w`` [(n + m)(n + m + 1) / 2 + 1] of :func:`quadratic_features`."""
        return QuadraticQ(_sym_from_triu(w[:-1], n + m), w[-1], n)

    @full_precision
    def q(self, s: Array, b: Array) -> Array:
        """Q(s, b) for ``s`` [..., n], ``b`` [..., m] -> [...]."""
        z = jnp.concatenate([s, b], -1)
        return jnp.einsum("...i,...ij,...j->...", z, self.H, z) + self.h0

    @full_precision
    def value(self, s: Array, mean_b: Array, cov_b: Array) -> Array:
        """V(s) = E_{b ~ N(mean_b, cov_b)} Q(s, b) (exact), Algorithm 1 line 10 for a Gaussian g.

        Args:
          s: [..., n] states.
          mean_b: [..., m] the follower's mean action at s.
          cov_b: [m, m] the follower's action covariance.
        Returns:
          [...] values.
        """
        Hbb = self.H[..., self.n :, self.n :]
        return self.q(s, mean_b) + jnp.trace(Hbb @ cov_b, axis1=-2, axis2=-1)


def _basis(s: Array, b: Array, gain) -> Array:
    """The critic's inputs: z = (s, b), or with a follower ``gain`` K [m, n] the
    innovation basis z' = (s, b + K s) (module docstring)."""
    return jnp.concatenate([s, b if gain is None else b + s @ jnp.asarray(gain, s.dtype).T], -1)


def _from_basis(H: Array, n: int, gain) -> Array:
    """A quadratic form ``H`` [..., n + m, n + m] in z' = T z (T = [[I, 0], [K, I]]) as the
    form T^T H T in z = (s, b); ``H`` itself when ``gain`` is None."""
    if gain is None:
        return H
    K = jnp.asarray(gain, H.dtype)
    m = K.shape[0]
    T = jnp.block(
        [[jnp.eye(n, dtype=H.dtype), jnp.zeros((n, m), H.dtype)], [K, jnp.eye(m, dtype=H.dtype)]]
    )
    return jnp.swapaxes(T, -1, -2) @ H @ T


def _check_episodes(s: Array, b: Optional[Array], steps: Array, name: str) -> None:
    """``s`` [E, T+1, n], ``b`` [E, T+1, m] (or None) and the per-step ``steps`` [E, T] (``r``)
    or [E, T, D] (``y``) on one episode grid: a transposed [T, E] reward was fitted as other
    episodes (a different H, unsaid) and a [E, T+1] one failed in a matmul. Static shapes:
    checked for traced values too.

    Raises:
      ValueError: the first array that does not fit, named.
    """
    if np.ndim(s) != 3:
        raise ValueError(f"s must be [E, T+1, n], got shape {np.shape(s)}")
    E, T1 = np.shape(s)[:2]
    src = f"E={E}, T={T1 - 1} from s [E, T+1, n]"
    if b is not None and (np.ndim(b) != 3 or np.shape(b)[:2] != (E, T1)):
        raise ValueError(f"b must be [E, T+1, m] ({src}), got shape {np.shape(b)}")
    want = (E, T1 - 1) if b is not None else (E, T1 - 1, "D")
    got = np.shape(steps)
    if got[:2] != (E, T1 - 1) or len(got) != len(want):
        raise ValueError(f"{name} must be {list(want)} ({src}), got shape {got}")


@full_precision
def fit_quadratic_q(
    s: Array, b: Array, r: Array, gamma, ridge: float = 1e-6, gain=None
) -> QuadraticQ:
    """Leader critic Q_L(s, b) by SARSA-LSTD on episodes (Algorithms 2/3, in closed form).

    The fixed point of on-policy TD(0) / SARSA with target ``r_t + gamma Q(s_{t+1}, b_{t+1})`` over
    the quadratic class of :func:`quadratic_features`; the last step bootstraps on Q(s_T, b_T)
    (episodes are truncated, not terminated).

    Args:
      s: [E, T+1, n] states s_0..s_T.
      b: [E, T+1, m] follower actions b_0..b_T.
      r: [E, T] leader rewards of steps 0..T-1.
      gamma: the leader's discount gamma_L, scalar.
      ridge: regularisation of :func:`lstd`.
      gain: the follower's state gain K [m, n] (its mean action -K s), or None: the features
        are then those of (s, b + K s), the same class in a far better conditioned basis
        (module docstring); the answer is returned in (s, b).
    Returns:
      :class:`QuadraticQ` (``H`` [n + m, n + m], ``h0`` []).
    """
    _check_episodes(s, b, r, "r (leader rewards)")
    n, m = s.shape[-1], b.shape[-1]
    phi_all = quadratic_features(_basis(s, b, gain))
    phi = phi_all[:, :-1].reshape(-1, phi_all.shape[-1])
    phi_next = phi_all[:, 1:].reshape(-1, phi_all.shape[-1])
    w = lstd(phi, phi_next, r.reshape(-1), gamma, ridge)
    q = QuadraticQ.from_weights(w, n, m)
    return q._replace(H=_from_basis(q.H, n, gain))


@full_precision
def fit_quadratic_vector_value(s: Array, y: Array, gamma, ridge: float = 1e-6):
    """Vector-valued state value (e.g. grad_theta V_F) by LSTD on quadratic features of s.

    With ``y`` the per-step follower gradients of Eq. (nablaQF)
    (:func:`bchg_jax.lq.estimators.per_step_follower_grad` or its pathwise form), the fitted value
    approximates
    ``grad_theta V_F(s) = E_{b ~ g(.|s)} grad_theta Q_F(s, b)`` (Eq. (bellman_eq_value_q_gradient)):
    HPGD's ``dVF``. Fitted on the batch it is evaluated on, it depends on each episode's own
    actions, so BC-HG's state baseline uses :func:`leave_one_out_vector_value` instead.

    Args:
      s: [E, T+1, n] states s_0..s_T.
      y: [E, T, D] per-step vector rewards.
      gamma: discount (gamma_F for grad V_F), scalar.
      ridge: regularisation of :func:`lstd`.
    Returns:
      a function s [..., n] -> [..., D].
    """
    _check_episodes(s, None, y, "y (per-step vector rewards)")
    phi_all = quadratic_features(s)
    F = phi_all.shape[-1]
    phi = phi_all[:, :-1].reshape(-1, F)
    phi_next = phi_all[:, 1:].reshape(-1, F)
    W = lstd(phi, phi_next, y.reshape(-1, y.shape[-1]), gamma, ridge)
    return full_precision(lambda x: quadratic_features(x) @ W)


@full_precision
def leave_one_out_lstd(
    phi: Array, phi_next: Array, rewards: Array, gamma, ridge: float = 1e-6
) -> Array:
    """Leave-one-out :func:`lstd`: episode e's weights from the E - 1 *other* episodes.

    From per-episode sufficient statistics ``A_e = phi_e^T (phi_e - gamma phi'_e)``,
    ``c_e = phi_e^T r_e`` and ``q_e = sum_t phi_e^2``, episode e solves the :func:`lstd` system
    (unit-RMS feature scaling, ``ridge`` on the scaled diagonal) of ``(sum - own)`` of each:
    one batched F x F solve, no loop over episodes. Each fit is exactly :func:`lstd` on the
    other episodes' transitions (up to rounding).

    Args:
      phi: [E, T, F] features of the current steps.
      phi_next: [E, T, F] features of the next steps (the bootstrap targets).
      rewards: [E, T] or [E, T, D] (vector-valued) rewards.
      gamma: discount, scalar.
      ridge: Tikhonov regularisation of the scaled system, as :func:`lstd`.
    Returns:
      [E, F] or [E, F, D] weights for the *unscaled* features, row e fitted without episode e.
    Raises:
      ValueError: fewer than 2 episodes (no other episode to fit on), or bad settings as
        :func:`lstd`.
    """
    check_fit_settings(gamma, ridge)
    E, T = phi.shape[0], phi.shape[1]
    if E < 2:
        raise ValueError(f"leave-one-out fits need at least 2 episodes, got {E}")
    y = rewards[..., None] if rewards.ndim == 2 else rewards
    A_own = jnp.einsum("etf,etg->efg", phi, phi - gamma * phi_next)
    c_own = jnp.einsum("etf,etd->efd", phi, y)
    q_own = jnp.sum(phi**2, 1)
    N = (E - 1) * T
    A, c, q = (jnp.sum(x, 0, keepdims=True) - x for x in (A_own, c_own, q_own))
    scale = jnp.sqrt(q / N) + 1e-12  # [E, F]
    A = A / (scale[:, :, None] * scale[:, None, :]) / N
    A = A + ridge * jnp.eye(A.shape[-1], dtype=A.dtype)
    W = jnp.linalg.solve(A, c / scale[:, :, None] / N) / scale[:, :, None]  # [E, F, D]
    return W[..., 0] if rewards.ndim == 2 else W


@full_precision
def leave_one_out_quadratic_q(
    s: Array, b: Array, r: Array, gamma, ridge: float = 1e-6, gain=None
) -> QuadraticQ:
    """Cross-fitted leader critic: episode e's Q_L(s, b) is :func:`fit_quadratic_q` on the
    E - 1 *other* episodes (the trainer's ``critic="quadratic_loo"``).

    BC-HG's guide ``Ben_t = Q_L(s_t, b_t) - V_L(s_t)`` multiplies FollowerQGrad's ``dQF_t``; a
    critic fitted on the batch it is evaluated on depends on episode e's own actions and
    rewards, so ``Ben_t`` correlates with episode e's ``dQF_t`` and the estimate is biased at few
    episodes. A fit on the other episodes is independent of episode e, so (the LSTD class being
    exact for linear-Gaussian problems) only the fit's finite-sample error on E - 1 episodes
    remains, which does not correlate with episode e. Its mean is not zero (LSTD solves a
    random linear system): a bias that shrinks with E and depends on the problem, 1.15% of the
    gradient's norm at E = 2 and 0.23% at E = 5 on one small problem, 4.0% / 2.7% / 0.9% at
    E = 2 / 4 / 10 on another, 8.0% / 3.1% at E = 4 / 10 on a third (a myopic follower),
    below resolution at E = 100 on thermal (docs/experiments.md).
    With E = 2 each fit sees one episode and can be nearly singular. Same SARSA-LSTD system,
    scaling and ridge as :func:`fit_quadratic_q`
    (:func:`leave_one_out_lstd`).

    Args:
      s: [E, T+1, n] states s_0..s_T.
      b: [E, T+1, m] follower actions b_0..b_T.
      r: [E, T] leader rewards of steps 0..T-1.
      gamma: the leader's discount gamma_L, scalar.
      ridge: regularisation of :func:`lstd`.
      gain: the follower's state gain K [m, n], or None, as in :func:`fit_quadratic_q` (the
        trainer passes the played policy's).
    Returns:
      :class:`QuadraticQ` with ``H`` [E, 1, n + m, n + m] and ``h0`` [E, 1]: its ``q`` /
      ``value`` on [E, T', .] inputs evaluate episode e with the fit without it.
    Raises:
      ValueError: fewer than 2 episodes.
    """
    _check_episodes(s, b, r, "r (leader rewards)")
    n, m = s.shape[-1], b.shape[-1]
    phi_all = quadratic_features(_basis(s, b, gain))
    w = leave_one_out_lstd(phi_all[:, :-1], phi_all[:, 1:], r, gamma, ridge)  # [E, F]
    H = jax.vmap(lambda wq: _sym_from_triu(wq, n + m))(w[:, :-1])
    return QuadraticQ(_from_basis(H, n, gain)[:, None], w[:, -1:], n)


@full_precision
def leave_one_out_vector_value(s: Array, y: Array, gamma, ridge: float = 1e-6) -> Array:
    """BC-HG's state baseline h(s) ~ grad_theta V_F(s), each episode's from the *other* episodes.

    The guiding term of Eq. (hg_configurable) with a baseline, ``Ben_t (dQF_t - h(s_t))``, keeps
    its expectation only when ``h`` does not depend on episode e's own actions: then
    ``E[Ben_t h(s_t)] = E[h(s_t) E_{b ~ g}[Ben(s_t, b)]] = 0``. A fit on the same batch
    (:func:`fit_quadratic_vector_value`) breaks this and shrinks the estimate towards zero
    (about 12% at E = 100 thermal episodes, 60% at E = 10). Here episode e's ``h`` is the LSTD
    fit of Eq. (bellman_eq_value_q_gradient) (the :func:`lstd` system, unit-RMS feature scaling,
    ``ridge``) on the E - 1 other episodes, which are independent of episode e, so the baseline
    is exactly unbiased while using almost all of the data.

    All E fits come from per-episode sufficient statistics (:func:`leave_one_out_lstd` on the
    :func:`quadratic_features` of the states, F = n (n + 1) / 2 + 1 unknowns per output).

    Args:
      s: [E, T+1, n] states s_0..s_T.
      y: [E, T, D] per-step vector rewards (Eq. (nablaQF)'s terms, e.g.
        :func:`bchg_jax.lq.estimators.per_step_follower_grad_pathwise`).
      gamma: discount (gamma_F), scalar.
      ridge: regularisation of the scaled system, as :func:`lstd`.
    Returns:
      [E, T, D] h at s_0..s_{T-1}, episode e's from the fit without it. With E = 1 there is no
      other episode: zeros (no baseline, which is unbiased too).
    """
    _check_episodes(s, None, y, "y (per-step vector rewards)")
    if y.shape[0] < 2:
        return jnp.zeros_like(y)
    phi_all = quadratic_features(s)
    W = leave_one_out_lstd(phi_all[:, :-1], phi_all[:, 1:], y, gamma, ridge)  # [E, F, D]
    return jnp.einsum("etf,efd->etd", phi_all[:, :-1], W)


# --- MLP critics (TD(0)) ---


def init_mlp(
    key: Array, in_dim: int, out: int = 1, hidden: Sequence[int] = (64, 64), dtype=jnp.float32
):
    """An MLP critic (flax default initialisation) and its parameters.

    Args:
      key: PRNG key.
      in_dim: input size (n + m for Q_L(s, b), n for grad V_F(s)).
      out: output size (1, or d for a vector value).
      hidden: hidden layer sizes.
      dtype: the parameters' dtype (and that of the dummy input used for initialisation).
    Returns:
      (model, params).
    """
    model = MLP(tuple(hidden), out, torch_init=False, param_dtype=dtype)
    return model, model.init(key, jnp.zeros((1, in_dim), dtype))


def scales(x: Array, r: Array, gamma, normalize: bool):
    """(x_scale, y_scale) of a normalised critic: inputs divided by their RMS, outputs multiplied
    by RMS(r) / (1 - gamma) (per output); ones when ``normalize`` is False (the paper's MLP).

    Args:
      x: [N, in] inputs.
      r: [N] or [N, out] rewards.
      gamma: discount, scalar.
      normalize: whether to scale.
    Returns:
      (x_scale [in], y_scale [out]), gradient-stopped.
    Raises:
      ValueError: a concrete ``gamma`` outside [0, 1).
    """
    check_fit_settings(gamma)
    if not normalize:
        return jnp.ones(x.shape[-1], x.dtype), jnp.ones(
            r.reshape(r.shape[0], -1).shape[-1], x.dtype
        )
    xs = jnp.sqrt(jnp.mean(x**2, 0)) + 1e-6
    ys = jnp.sqrt(jnp.mean(r.reshape(r.shape[0], -1) ** 2, 0)) / (1.0 - gamma) + 1e-6
    return jax.lax.stop_gradient(xs), jax.lax.stop_gradient(ys)


def apply_scaled(model: MLP, params, x: Array, x_scale: Array, y_scale: Array) -> Array:
    """The critic's prediction ``model(x / x_scale) * y_scale``: x [..., in] -> [..., out]."""
    return model.apply(params, x / x_scale) * y_scale


def td_fit(
    model: MLP,
    params,
    x: Array,
    x_next: Array,
    r: Array,
    gamma,
    steps: int = 5000,
    lr: float = 1e-4,
    key=None,
    minibatch: int = 0,
    x_scale=None,
    y_scale=None,
):
    """Fits an MLP critic by TD(0): Algorithm 3 "CriticUpdate (TD)", one ``lax.scan``.

    ``steps`` Adam steps on the semi-gradient TD(0) loss
    ``mean((r / y_scale + gamma sg(f(x' / x_scale)) - f(x / x_scale))^2)`` (full batch, or
    ``minibatch`` random samples per step with ``key``), bootstrapping on the network being fitted
    (no target network). With ``x_scale`` / ``y_scale`` the network sees ``x / x_scale`` and
    predicts ``f / y_scale`` (see :func:`scales`, :func:`apply_scaled`).

    Args:
      model: the :class:`~bchg_jax.core.networks.MLP`.
      params: its starting parameters (pytree).
      x: [N, in] inputs of the transitions (e.g. (s_t, b_t)).
      x_next: [N, in] inputs of the next steps (e.g. (s_{t+1}, b_{t+1}), SARSA targets).
      r: [N] or [N, out] rewards.
      gamma: discount, scalar.
      steps: number of Adam steps.
      lr: Adam learning rate.
      key: PRNG key of the minibatch draws (default ``PRNGKey(0)``).
      minibatch: samples per step; 0 means full batch.
      x_scale: optional [in] input scale (default ones).
      y_scale: optional [out] output scale (default ones).
    Returns:
      the fitted parameters (pytree like ``params``).
    Raises:
      ValueError: a concrete ``gamma`` outside [0, 1), ``steps`` not an integer >= 1 (0
        returned the starting parameters as a fit), a concrete ``lr`` not finite and > 0 (a
        negative one ascended the TD loss), or ``minibatch`` not an integer >= 0.
    """
    check_td_settings(gamma, steps, lr, minibatch)
    opt = optax.adam(lr)
    r2 = r.reshape(r.shape[0], -1)
    xs = jnp.ones(x.shape[-1], x.dtype) if x_scale is None else x_scale
    ys = jnp.ones(r2.shape[-1], x.dtype) if y_scale is None else y_scale
    N = x.shape[0]

    def loss(p, idx):
        xb, xn, rb = (x, x_next, r2) if idx is None else (x[idx], x_next[idx], r2[idx])
        target = rb / ys + gamma * jax.lax.stop_gradient(model.apply(p, xn / xs))
        return jnp.mean((target - model.apply(p, xb / xs)) ** 2)

    def step(c, k):
        p, o = c
        idx = None if not minibatch else jax.random.randint(k, (minibatch,), 0, N, jnp.int32)
        g = jax.grad(loss)(p, idx)
        u, o = opt.update(g, o, p)
        return (optax.apply_updates(p, u), o), None

    keys = jax.random.split(jax.random.PRNGKey(0) if key is None else key, steps)
    (params, _), _ = jax.lax.scan(step, (params, opt.init(params)), keys)
    return params
