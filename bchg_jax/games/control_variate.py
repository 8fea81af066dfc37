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
unbiased (independent episodes). :func:`quadratic_features` gives ``[1, x, x_i x_j (i <= j)]``
(the fit adds its own intercept, so features may come with or without the constant).
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


# a feature column whose spread over the fitted samples is below this many ulps of its largest
# value counts as constant: it is rounding, not information (see crossfit_baseline)
CONSTANT_COLUMN_ULPS = 64


@full_precision
def crossfit_baseline(
    features: Array, targets: Array, groups: Array, num_groups: int, ridge: float = 1e-3
) -> Array:
    """Cross-fitted least-squares predictions of ``targets`` from ``features``.

    For every group ``j`` (an episode), a ridge regression ``targets ~ 1 + features`` is fitted
    on the samples whose group differs from ``j`` and predicts the samples of group ``j``. The
    intercept is added here, so ``features`` need no constant column (a constant column, e.g.
    :func:`quadratic_features`' leading 1, is dropped as below: the predictions are those of
    the same features without it). The features are standardised (per column, over the other
    groups' samples; the mean in two passes, so that the first pass's rounding cancels), and the
    ridge (on every coefficient, the intercept's too) is relative to the number of samples
    fitted.

    A column whose standard deviation over the fitted samples is at most
    :data:`CONSTANT_COLUMN_ULPS` ulps of its largest magnitude there is constant for the fit
    and gets no coefficient (that spread is rounding, not information). With the absolute
    threshold of before (1e-12), a float32 column of 0.1 in the fitted episode and 0.3 in the
    held-out one had a rounding spread of 2.2e-8, was standardised to +-1 (collinear with the
    intercept), and the held-out baseline was 9.3e6 where float64 gives 3.96.

    Samples whose feature or target row has a non-finite entry are left out of every fit: a
    NaN (or inf) target reaches no baseline, a non-finite feature only its own sample's. Before,
    such a sample entered every fit (``0 * NaN`` is NaN in the held-out ones too) and made every
    sample's baseline NaN. An estimate built from that sample's ``G`` is not finite either way
    (the trainers skip such an update: ``update_skipped``); the other samples' baselines are
    those of the fit without it.

    Args:
      features: [M, p] features of (s, a) per sample (e.g. :func:`quadratic_features`), with
        or without a constant column.
      targets: [M, d] the influence sums (gradient vectors) to predict.
      groups: [M] int group (episode) of each sample, in [0, num_groups).
      num_groups: number of groups (>= 2 for a non-zero baseline).
      ridge: ridge penalty per fitted sample on the standardised features.
    Returns:
      [M, d] baseline ``c``: for each sample, the prediction of the fit on the other groups
      (zero where no other group has samples).
    """
    dtype = jnp.promote_types(jnp.result_type(features, targets), jnp.float32)
    features = jax.lax.stop_gradient(jnp.asarray(features, dtype))
    targets = jax.lax.stop_gradient(jnp.asarray(targets, dtype))
    finite = jnp.all(jnp.isfinite(features), -1) & jnp.all(jnp.isfinite(targets), -1)  # [M]
    x = jnp.where(finite[:, None], features, 0.0)  # the fits' copies: no NaN * 0
    y = jnp.where(finite[:, None], targets, 0.0)
    ulps = CONSTANT_COLUMN_ULPS * jnp.finfo(dtype).eps

    def fit_predict(j):
        used = (groups != j) & finite
        w = used.astype(dtype)[:, None]  # [M, 1]
        n = jnp.maximum(jnp.sum(w), 1.0)
        mu = jnp.sum(w * x, 0) / n
        mu = mu + jnp.sum(w * (x - mu), 0) / n  # the second pass removes the first's rounding
        sd = jnp.sqrt(jnp.sum(w * (x - mu) ** 2, 0) / n)
        varies = sd > ulps * jnp.max(w * jnp.abs(x), 0)  # a constant column gets no weight
        z = jnp.where(varies, (features - mu) / jnp.where(varies, sd, 1.0), 0.0)
        z = jnp.concatenate([jnp.ones_like(z[:, :1]), z], -1)  # the intercept
        zw = jnp.where(used[:, None], z, 0.0)
        A = zw.T @ zw + ridge * n * jnp.eye(z.shape[-1], dtype=dtype)
        coef = jnp.linalg.solve(A, zw.T @ y)  # [1 + p, d]
        pred = z @ coef
        return jnp.where((groups == j)[:, None] & (jnp.sum(w) > 0), pred, 0.0)

    return jnp.sum(jax.vmap(fit_predict)(jnp.arange(num_groups)), 0)
