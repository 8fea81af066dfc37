"""Variance reduction of the guiding term of Theorem 2 / Theorem 3, as pieces that compose.

On a minibatch of M segment starts, the guiding term of the estimate is
``mean_m (1/beta) Ben_m G_m`` (Eq. (hg_MG) / (hg_MG_det)), with ``G_m = grad_theta I_m`` the
gradient of sample m's influence sum (FollowerQGrad, Eq. (nablaQF_MG) / (nablaQF_MG_det)).
A *piece* changes that term: ``piece(samples, theta) -> (samples, surrogate)``, where
``samples`` is a :class:`GuideSamples` (every entry held constant) and ``surrogate`` a scalar
whose gradient in theta is the change the piece makes to the estimate. A piece may also pass on
a per-sample baseline ``c`` for the pieces after it, which then see the guiding gradient of
sample m as ``h_m = Ben_m (G_m - c_m) / beta``.

:func:`guide_surrogate` runs a tuple of pieces in order (the LQR trainer's
``Estimator.guide``). Pieces here: :func:`control_variate` (unbiased: the cross-fitted baseline
of :mod:`bchg_jax.games.control_variate`) and :func:`clip` (a per-sample norm bound: biased; an
example of a new idea written as one function, not enabled by any preset); :func:`shrink` is the
bound they share.
"""

from __future__ import annotations

import functools
import operator
from typing import Any, Callable, NamedTuple, Sequence

import jax
import jax.numpy as jnp

from bchg_jax.core.precision import full_precision
from bchg_jax.core.validate import check_positive
from bchg_jax.games.control_variate import crossfit_baseline, quadratic_features

Array = jax.Array


class GuideSamples(NamedTuple):
    """What a guiding-term piece sees of the M minibatch samples (all held constant).

    Attributes:
      G: [M, d] gradient in theta of each sample's influence sum.
      ben: [M] the Benefit Ben(s_m, a_m, b_m).
      x: [M, p] the inputs a baseline may depend on (s_m, and a_m for a stochastic leader: not
        the follower's action, so that ``E[Ben | x] = 0`` keeps a baseline unbiased).
      groups: [M] int episode of each sample, in [0, num_groups).
      num_groups: episodes in the actor's buffer.
      beta: the follower's entropy weight.
      c: [M, d] the baseline subtracted from ``G`` by the pieces so far (0.0: none).
    """

    G: Array
    ben: Array
    x: Array
    groups: Array
    num_groups: int
    beta: Any
    c: Any = 0.0


def guide_surrogate(
    pieces: Sequence[Callable], influence: Callable, theta, ben, x, groups, N, beta
):
    """The sum of the pieces' surrogates on a minibatch (run in order), or None without pieces.

    Args:
      pieces: the pieces.
      influence: ``influence(theta)`` -> [M] each sample's influence sum I_m (its gradient is
        taken with one forward-mode pass: theta is small).
      theta: the leader's parameters [d].
      ben: [M] Benefits. x: [M, p] baseline inputs. groups: [M] episodes. N: their number.
      beta: the follower's entropy weight.
    Returns:
      a scalar whose gradient in theta is the pieces' change of the estimate, or None.
    """
    if not pieces:
        return None
    G = jax.jacfwd(influence)(jax.lax.stop_gradient(theta))  # [M, d]
    samples = GuideSamples(G, jax.lax.stop_gradient(ben), x, groups, N, beta)
    terms = []
    for piece in pieces:
        samples, term = piece(samples, theta)
        terms.append(term)
    return functools.reduce(operator.add, terms)


@full_precision
def control_variate(samples: GuideSamples, theta):
    """Subtracts a cross-fitted prediction ``c_m`` of ``G_m`` from quadratic features of ``x_m``.

    Unbiased because the Benefit has mean zero given (s, a) and ``c_m`` is fitted on the other
    episodes only (:func:`bchg_jax.games.control_variate.crossfit_baseline`): the surrogate
    ``-mean_m Ben_m c_m . theta / beta`` removes ``c`` from the guiding term.
    """
    c = crossfit_baseline(
        quadratic_features(samples.x), samples.G - samples.c, samples.groups, samples.num_groups
    )
    term = -jnp.mean(samples.ben * (jax.lax.stop_gradient(c) @ theta)) / samples.beta
    return samples._replace(c=samples.c + c), term


def shrink(limit: Callable[[Array], Any]) -> Callable:
    """A piece that shrinks every sample's guiding gradient ``h_m = Ben_m (G_m - c_m) / beta`` to
    norm at most ``limit(|h|)`` ([M] norms -> a bound, scalar or [M]), by the surrogate
    ``mean_m (w_m - 1) h_m . theta`` with ``w_m = min(1, limit / |h_m|)`` (biased)."""

    @full_precision
    def piece(samples: GuideSamples, theta):
        h = jax.lax.stop_gradient(samples.ben[:, None] * (samples.G - samples.c) / samples.beta)
        norm = jnp.sqrt(jnp.sum(h**2, -1))
        w = jnp.minimum(1.0, limit(norm) / jnp.maximum(norm, jnp.finfo(norm.dtype).tiny))
        return samples, jnp.mean(((w - 1.0)[:, None] * h) @ theta)

    return piece


def clip(bound: float) -> Callable:
    """A piece that clips every sample's guiding gradient to norm at most ``bound`` (biased,
    bounded: a robust mean of a heavy-tailed term). Not enabled by any preset; the example of a
    new variance-reduction idea in ``docs/architecture.md``.

    Raises:
      ValueError: ``bound`` not finite and > 0 (a negative one flipped every sample's term).
    """
    check_positive("clip bound", bound)
    return shrink(lambda norm: bound)
