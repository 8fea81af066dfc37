"""Stability of a discounted linear closed loop, on any backend: ``gamma rho(F)^2 < 1`` decides
whether the discounted sums ``sum_t gamma^t F^t C (F^T)^t`` behind the LQ values, covariances and
leader objectives converge, and whether a Riccati solution is the stabilising one
(:func:`~bchg_jax.core.maxent_lqr.riccati`). Matrix products only (``jnp.linalg.eigvals`` runs
on the host CPU), so it runs under ``jit`` / ``vmap`` and on accelerators."""

from __future__ import annotations

import jax
import jax.numpy as jnp

from bchg_jax.core.precision import full_precision

Array = jax.Array


@full_precision
def log_spectral_radius(M: Array, squarings: int = 32) -> Array:
    """An upper bound of log rho(M) that converges to it, by repeated normalised squaring.

    Gelfand's formula: rho(M) <= ||M^N||^(1/N) for every N (rho(M)^N = rho(M^N) <= ||M^N||, the
    Frobenius norm), with equality as N -> infinity, the excess being
    O((log cond + (m - 1) log N) / N) for Jordan blocks of size m. With ``B_0 = M / c_0`` and
    ``B_{j+1} = B_j^2 / c_{j+1}`` (each c_j the norm of what it divides),
    ``log ||M^(2^k)|| / 2^k = sum_{j<=k} 2^-j log c_j``. Matrix products only, so it runs under
    ``jit`` / ``vmap`` and on accelerators (``jnp.linalg.eigvals`` is CPU-only). A non-finite M
    gives NaN; a finite one does not, however large its entries (each norm is taken as a power
    of two near the largest entry times the norm of the matrix scaled by it, which cannot
    overflow). A power that comes out exactly zero (M = 0, or a nilpotent M such as
    [[0, 5], [0, 0]]: M^2 = 0) means rho(M) = 0 and gives ``-inf``. (Before, a zero squaring
    kept the last partial sum, log||M|| = log 5 there, and a closed loop with rho = 0 was
    called unstable.) Each B_j has norm 1, so a square underflows to exactly zero only when it
    is zero or its spectral radius is below ~1e-19 relative to its norm (float32), which
    normalised squarings of a matrix with rho > 0 do not reach within the default count. N =
    2^32 by default: the excess is below 1e-8 for any reasonable M, and float32 squarings do
    not yet underflow.

    Args:
      M: [n, n] matrix (gradients are not propagated).
      squarings: k, the number of squarings (N = 2^k).
    Returns:
      [] the bound of log rho(M) with N = 2^squarings; ``-inf`` when a power of M is exactly
      zero (rho = 0: :func:`is_discounted_stable` is then True for every gamma).
    """
    M = jax.lax.stop_gradient(M)

    def body(j, carry):
        B, total, done = carry
        # ||B|| as 2^e times the norm of B / 2^e, e the exponent of its largest entry: the sum
        # of squares of M itself overflowed above ~1.8e19 in float32 (a finite M gave NaN), and
        # a division by 3e38 is a product with its reciprocal, a subnormal flushed to zero
        e = jnp.frexp(jnp.max(jnp.abs(B)))[1]
        B = jnp.ldexp(B, -e)  # exact: largest entry in [0.5, 1)
        rest = jnp.sqrt(jnp.sum(B * B))
        zero = rest == 0  # M^(2^j) = 0 (or flushed to it): rho(M) = 0
        # log of ||B|| itself where it is representable (as before, to the last bit), in two
        # parts beyond that
        wide = jnp.abs(e) > 60
        log_c = jnp.where(
            wide,
            e.astype(M.dtype) * jnp.log(jnp.asarray(2.0, M.dtype)) + jnp.log(rest),
            jnp.log(jnp.ldexp(rest, jnp.where(wide, 0, e))),
        )
        term = jnp.where(zero, -jnp.inf, log_c * 2.0 ** (-jnp.asarray(j).astype(M.dtype)))
        total = jnp.where(done, total, total + term)
        B = B / jnp.where(zero, 1.0, rest)
        return B @ B, total, done | zero

    init = (M, jnp.zeros((), M.dtype), jnp.zeros((), bool))
    return jax.lax.fori_loop(0, squarings + 1, body, init)[1]


def is_discounted_stable(F: Array, gamma) -> Array:
    """True when sqrt(gamma) F is stable, i.e. gamma rho(F)^2 < 1 (:func:`log_spectral_radius`):
    the condition for ``sum_t gamma^t F^t C (F^T)^t`` to converge. Bool [], jit-friendly."""
    return log_spectral_radius(F) + 0.5 * jnp.log(jnp.asarray(gamma, F.dtype)) < 0


@full_precision
def discounted_lyapunov(F: Array, C: Array, gamma) -> Array:
    """X solving X = C + gamma F X F^T, i.e. X = sum_t gamma^t F^t C (F^T)^t (a Kronecker-form
    linear solve, n^2 unknowns).

    The sum (the LQ family's infinite-horizon covariances and values,
    :func:`bchg_jax.lq.exact.leader_objective`, and the values of a fixed follower policy)
    converges only when sqrt(gamma) F is stable; otherwise the
    linear system still has a finite but meaningless solution (often of the wrong sign), so the
    result is NaN instead (:func:`is_discounted_stable`): a diverging closed loop is flagged,
    never silently wrong.

    Args:
      F: [n, n] closed-loop matrix. C: [n, n] constant term. gamma: discount, scalar.
    Returns:
      [n, n] symmetric solution X, or NaN when gamma rho(F)^2 >= 1.
    """
    n = F.shape[0]
    Mk = jnp.eye(n * n, dtype=F.dtype) - gamma * jnp.kron(F, F)
    X = jnp.linalg.solve(Mk, C.reshape(-1)).reshape(n, n)
    X = 0.5 * (X + X.T)
    return jnp.where(is_discounted_stable(F, gamma), X, jnp.nan)
