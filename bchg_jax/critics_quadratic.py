"""Fast critics whose function class is exact for linear-Gaussian problems with quadratic rewards.

For a zero-mean linear-Gaussian closed loop, the leader's Q_L(s, b) is a quadratic form in
z = (s, b) plus a constant, and grad_theta V_F(s) is, per coordinate of theta, a quadratic form in s
plus a constant. Fitting these classes by LSTD (the fixed point of on-policy TD(0)/SARSA on the
batch, Algorithm "CriticUpdate (TD)" solved in closed form) gives consistent critics at the cost
of one small linear solve per iteration, instead of thousands of network steps.

* :func:`quadratic_features`: vech(z z^T) (upper triangle) and a constant.
* :func:`lstd`: weights W solving Phi^T (Phi - gamma Phi') W = Phi^T R (R may be vector-valued);
  features are rescaled to unit RMS first and a small ridge keeps float32 solves stable.
* :class:`QuadraticQ`: Q(s, b) = z^T H z + h0 with the exact Gaussian expectation
  V(s) = E_{b ~ N(mu(s), Sigma_b)} Q(s, b) = zbar^T H zbar + tr(H_bb Sigma_b) + h0.
"""
from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp

Array = jax.Array


def _triu(d):
    return jnp.triu_indices(d)


def quadratic_features(z: Array) -> Array:
    """[..., d] -> [..., d (d + 1) / 2 + 1]: z_i z_j (i <= j) and 1."""
    i, j = _triu(z.shape[-1])
    quad = z[..., i] * z[..., j]
    return jnp.concatenate([quad, jnp.ones(z.shape[:-1] + (1,), z.dtype)], -1)


def lstd(phi: Array, phi_next: Array, rewards: Array, gamma, ridge: float = 1e-6) -> Array:
    """LSTD(0): W with Phi^T (Phi - gamma Phi') W = Phi^T R. ``phi`` [N, F], ``rewards`` [N] or
    [N, D]. Returns [F] or [F, D] weights for the *unscaled* features."""
    scale = jnp.sqrt(jnp.mean(phi ** 2, 0)) + 1e-12
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
    """Q(s, b) = z^T H z + h0, z = (s, b)."""

    H: Array    # [n + m, n + m]
    h0: Array   # []
    n: int

    @staticmethod
    def from_weights(w: Array, n: int, m: int) -> "QuadraticQ":
        return QuadraticQ(_sym_from_triu(w[:-1], n + m), w[-1], n)

    def q(self, s: Array, b: Array) -> Array:
        z = jnp.concatenate([s, b], -1)
        return jnp.einsum("...i,ij,...j->...", z, self.H, z) + self.h0

    def value(self, s: Array, mean_b: Array, cov_b: Array) -> Array:
        """E_{b ~ N(mean_b, cov_b)} Q(s, b) (exact)."""
        Hbb = self.H[self.n:, self.n:]
        return self.q(s, mean_b) + jnp.trace(Hbb @ cov_b)


def fit_quadratic_q(s: Array, b: Array, r: Array, gamma, ridge: float = 1e-6) -> QuadraticQ:
    """SARSA-LSTD on episodes: ``s`` [E, T+1, n], ``b`` [E, T+1, m], ``r`` [E, T] (rewards of steps
    0..T-1); the last step bootstraps on Q(s_T, b_T)."""
    n, m = s.shape[-1], b.shape[-1]
    phi_all = quadratic_features(jnp.concatenate([s, b], -1))
    phi = phi_all[:, :-1].reshape(-1, phi_all.shape[-1])
    phi_next = phi_all[:, 1:].reshape(-1, phi_all.shape[-1])
    w = lstd(phi, phi_next, r.reshape(-1), gamma, ridge)
    return QuadraticQ.from_weights(w, n, m)


def fit_quadratic_vector_value(s: Array, y: Array, gamma, ridge: float = 1e-6):
    """Vector-valued state value (e.g. grad_theta V_F) by LSTD: ``s`` [E, T+1, n], per-step vector
    rewards ``y`` [E, T, D]. Returns a function s [..., n] -> [..., D]."""
    phi_all = quadratic_features(s)
    F = phi_all.shape[-1]
    phi = phi_all[:, :-1].reshape(-1, F)
    phi_next = phi_all[:, 1:].reshape(-1, F)
    W = lstd(phi, phi_next, y.reshape(-1, y.shape[-1]), gamma, ridge)
    return lambda x: quadratic_features(x) @ W


def expected_quadratic_features(s: Array, mean_b: Array, cov_b: Array) -> Array:
    """E_{b ~ N(mean_b, cov_b)} quadratic_features((s, b)) (exact: E[z_i z_j] = zbar_i zbar_j +
    Cov_ij, non-zero only inside the action block)."""
    n, m = s.shape[-1], mean_b.shape[-1]
    zbar = jnp.concatenate([s, mean_b], -1)
    cov = jnp.zeros((n + m, n + m), s.dtype).at[n:, n:].set(cov_b)
    i, j = _triu(n + m)
    return quadratic_features(zbar) + jnp.concatenate([cov[i, j], jnp.zeros((1,), s.dtype)])


def fit_quadratic_vector_q(s: Array, b: Array, y: Array, gamma, ridge: float = 1e-6):
    """Vector-valued action value (e.g. grad_theta Q_F) by SARSA-LSTD on quadratic features of
    (s, b): ``s`` [E, T+1, n], ``b`` [E, T+1, m], ``y`` [E, T, D]. Returns the weights W [F, D]
    (``quadratic_features(z) @ W``)."""
    phi_all = quadratic_features(jnp.concatenate([s, b], -1))
    F = phi_all.shape[-1]
    return lstd(phi_all[:, :-1].reshape(-1, F), phi_all[:, 1:].reshape(-1, F),
                y.reshape(-1, y.shape[-1]), gamma, ridge)
