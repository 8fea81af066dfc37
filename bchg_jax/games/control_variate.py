"""A cross-fitted control variate for the guiding term of Theorem 2 / Theorem 3.

The guiding term is ``E[(1/beta) Ben(s, a, b) grad_theta Q_F(s, a, b)]`` with the influence
``grad_theta Q_F`` estimated by a segment sum ``G`` (Eq. (nablaQF_MG) / (nablaQF_MG_det)). Because
``E[Ben | s, a] = 0`` (the Benefit is Q_L centred over the follower's own action), any
``c(s, a)`` that does not depend on the sample's follower action can be subtracted from ``G``
without bias: ``E[Ben (G - c(s, a))] = E[Ben G]``. The best such c is ``E[G | s, a]``; most of
``G``'s variance is explained by the state (it is a discounted sum of state-proportional
gradients), while the Benefit's correlation with ``G`` comes from the follower's action.

:func:`crossfit_baseline` fits ``c`` by ridge least squares of ``G`` on features of (s, a), and
*cross-fits* it: the baseline of a sample from episode ``j`` is fitted on the samples of the other
episodes only, so it is independent of that sample's follower action and the estimate stays
unbiased (independent episodes). :func:`quadratic_features` gives ``[1, x, x_i x_j (i <= j)]``.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from bchg_jax.core.precision import full_precision

Array = jax.Array


def quadratic_features(x: Array) -> Array:
    """[1, x, x_i x_j for i <= j] of ``x`` [..., p] -> [..., 1 + p + p (p + 1) / 2]."""
    p = x.shape[-1]
    i, j = jnp.triu_indices(p)
    return jnp.concatenate([jnp.ones(x.shape[:-1] + (1,), x.dtype), x, x[..., i] * x[..., j]], -1)


@full_precision
def crossfit_baseline(
    features: Array, targets: Array, groups: Array, num_groups: int, ridge: float = 1e-3
) -> Array:
    """Cross-fitted least-squares predictions of ``targets`` from ``features``.

    For every group ``j`` (an episode), a ridge regression ``targets ~ features`` is fitted on the
    samples whose group differs from ``j`` and predicts the samples of group ``j``. The features
    are standardised (per column, over the other groups' samples) before the fit, and the
    ridge is relative to the number of samples fitted.

    Args:
      features: [M, p] features of (s, a) per sample (e.g. :func:`quadratic_features`).
      targets: [M, d] the influence sums (gradient vectors) to predict.
      groups: [M] int group (episode) of each sample, in [0, num_groups).
      num_groups: number of groups (>= 2 for a non-zero baseline).
      ridge: ridge penalty per fitted sample on the standardised features.
    Returns:
      [M, d] baseline ``c``: for each sample, the prediction of the fit on the other groups
      (zero where no other group has samples).
    """
    features = jax.lax.stop_gradient(features)
    targets = jax.lax.stop_gradient(targets)

    def fit_predict(j):
        w = (groups != j).astype(features.dtype)[:, None]  # [M, 1]
        n = jnp.maximum(jnp.sum(w), 1.0)
        mu = jnp.sum(w * features, 0) / n
        sd = jnp.sqrt(jnp.sum(w * (features - mu) ** 2, 0) / n)
        sd = jnp.where(sd > 1e-12, sd, 1.0)
        z = (features - mu) / sd
        z = jnp.where(jnp.arange(z.shape[-1]) == 0, 1.0, z)  # the constant column stays 1
        A = (w * z).T @ z + ridge * n * jnp.eye(z.shape[-1], dtype=z.dtype)
        coef = jnp.linalg.solve(A, (w * z).T @ targets)  # [p, d]
        pred = z @ coef
        return jnp.where((groups == j)[:, None] & (jnp.sum(w) > 0), pred, 0.0)

    return jnp.sum(jax.vmap(fit_predict)(jnp.arange(num_groups)), 0)
