"""The follower's Boltzmann policy ``softmax(Q_F / beta)`` with a derivative that stays accurate
in float32 (:func:`follower_softmax`), for every family that differentiates through it."""

from __future__ import annotations

import jax
import jax.numpy as jnp

Array = jax.Array


@jax.custom_jvp
def follower_softmax(logits: Array) -> Array:
    """``jax.nn.softmax(logits, -1)`` (the same values) whose derivative stays accurate in
    float32 where the tangent of the logits is large.

    The softmax's derivative ``g (dz - sum_b g dz)`` vanishes along a constant ``dz`` only if
    ``sum_b g = 1``; a float32 g sums to 1 within ~eps, so a tangent common to a row leaks
    ``g dz (1 - sum_b g)`` off the simplex. The follower's logits are ``Q_F / beta``, and the
    leader moves ``Q_F`` of all actions of a row together by up to ~|Q_F| / (1 - gamma_F), so
    at a small beta that leak dominates a hypergradient taken through the policy, with every
    solve converged:

    * the tabular game's exact hypergradient (the toy game's float32 value was 1.6% off at
      beta 0.05, 27% at beta 1e-3; random games at gamma 0.999 up to 300%);
    * the tabular CMDP's as-if-optimal reference at a K-step policy (random 5-state CMDPs at
      gamma_F 0.999, beta 0.02: 3.5% off, 12% on single components).

    The rule here centres each row's tangent at its most likely action first (the derivative is
    invariant to a shift of ``dz`` when the rows sum to 1), which leaves those errors at 2e-4
    and 4e-5 (``docs/architecture.md``, "Tolerances the dtype can meet").
    """
    return jax.nn.softmax(logits, axis=-1)


@follower_softmax.defjvp
def _follower_softmax_jvp(primals, tangents):
    (z,), (dz,) = primals, tangents
    g = follower_softmax(z)
    top = jnp.take_along_axis(dz, jnp.argmax(g, axis=-1, keepdims=True), axis=-1)
    dz = dz - top
    return g, g * (dz - jnp.sum(g * dz, axis=-1, keepdims=True))
