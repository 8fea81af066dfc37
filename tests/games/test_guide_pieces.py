"""The guiding-term pieces of bchg_jax.games.guide on a hand-made minibatch: the gradient of each
piece's surrogate is the change the docstrings promise (shrink / clip, the control variate, and
their composition by guide_surrogate), checked against numpy written out."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from bchg_jax.games import guide
from bchg_jax.games.control_variate import crossfit_baseline, quadratic_features


def _samples(x64_on=True, c=0.0):
    rng = np.random.default_rng(0)
    M, d, p = 12, 3, 2
    G = jnp.asarray(rng.normal(size=(M, d)))
    ben = jnp.asarray(rng.normal(size=M))
    x = jnp.asarray(rng.normal(size=(M, p)))
    groups = jnp.asarray(np.repeat(np.arange(3), 4))
    return guide.GuideSamples(G, ben, x, groups, 3, 0.25, c)


def _grad(piece, samples, theta):
    return np.asarray(jax.grad(lambda th: piece(samples, th)[1])(theta))


def test_clip_gradient_is_the_clipped_minus_the_plain_guiding_term(x64):
    """clip(bound): grad = mean_m (w_m - 1) h_m with h_m = Ben_m (G_m - c_m) / beta and
    w_m = min(1, bound / |h_m|_2) (the baseline c of earlier pieces is subtracted first)."""
    rng = np.random.default_rng(1)
    c = jnp.asarray(rng.normal(size=(12, 3)))
    s = _samples(c=c)
    theta = jnp.asarray([0.3, -0.2, 0.5])
    h = np.asarray(s.ben)[:, None] * (np.asarray(s.G) - np.asarray(c)) / 0.25
    norm = np.linalg.norm(h, axis=1)
    bound = float(np.median(norm))  # about half the samples are clipped
    w = np.minimum(1.0, bound / norm)
    want = np.mean((w - 1.0)[:, None] * h, axis=0)
    assert np.any(w < 1) and np.any(w == 1)
    np.testing.assert_allclose(_grad(guide.clip(bound), s, theta), want, rtol=1e-10, atol=1e-12)
    # the clipped guiding term itself: every sample's norm is at most the bound
    clipped = w[:, None] * h
    assert np.all(np.linalg.norm(clipped, axis=1) <= bound * (1 + 1e-12))
    # the piece passes the samples on unchanged
    out, _ = guide.clip(bound)(s, theta)
    assert out is s
    for bad in (-1.0, 0.0, float("nan")):  # a negative bound flipped every sample's term
        with pytest.raises(ValueError, match="clip bound"):
            guide.clip(bad)


def test_control_variate_subtracts_the_crossfit_baseline_of_the_residual(x64):
    """control_variate: grad = -mean_m Ben_m c_m / beta with c fitted (cross-fitted) to
    G - c_prev, and it passes on c_prev + c."""
    rng = np.random.default_rng(2)
    c_prev = jnp.asarray(rng.normal(size=(12, 3)))
    s = _samples(c=c_prev)
    theta = jnp.asarray([0.3, -0.2, 0.5])
    c = crossfit_baseline(quadratic_features(s.x), s.G - c_prev, s.groups, 3)
    want = -np.mean(np.asarray(s.ben)[:, None] * np.asarray(c), axis=0) / 0.25
    np.testing.assert_allclose(_grad(guide.control_variate, s, theta), want, rtol=1e-10)
    out, _ = guide.control_variate(s, theta)
    np.testing.assert_allclose(out.c, np.asarray(c_prev) + np.asarray(c), rtol=1e-12)


def test_guide_surrogate_sums_the_pieces_in_order(x64):
    """guide_surrogate: G = jacobian of the influence sums at theta, beta passed on, the pieces
    run in order (a clip after the control variate sees G - c) and their surrogates add up."""
    rng = np.random.default_rng(3)
    M, d = 12, 3
    W = jnp.asarray(rng.normal(size=(M, d)))
    theta = jnp.asarray([0.3, -0.2, 0.5])
    influence = lambda th: W @ th + 0.5 * (W @ th) ** 2  # noqa: E731
    ben = jnp.asarray(rng.normal(size=M))
    x = jnp.asarray(rng.normal(size=(M, 2)))
    groups = jnp.asarray(np.repeat(np.arange(3), 4))
    beta = 0.25
    G = np.asarray(W) * (1 + np.asarray(W @ theta))[:, None]
    s = guide.GuideSamples(jnp.asarray(G), ben, x, groups, 3, beta)
    c = np.asarray(crossfit_baseline(quadratic_features(x), jnp.asarray(G), groups, 3))
    cv = -np.mean(np.asarray(ben)[:, None] * c, axis=0) / beta
    h = np.asarray(ben)[:, None] * (G - c) / beta
    norm = np.linalg.norm(h, axis=1)
    bound = float(np.median(norm))
    w = np.minimum(1.0, bound / norm)
    cl = np.mean((w - 1.0)[:, None] * h, axis=0)

    def total(th, pieces):
        return guide.guide_surrogate(pieces, influence, th, ben, x, groups, 3, beta)

    pieces = (guide.control_variate, guide.clip(bound))
    got = np.asarray(jax.grad(total)(theta, pieces))
    np.testing.assert_allclose(got, cv + cl, rtol=1e-9, atol=1e-12)
    assert np.linalg.norm(cl) > 1e-3 * np.linalg.norm(cv)  # both pieces matter
    assert guide.guide_surrogate((), influence, theta, ben, x, groups, 3, beta) is None
    del s
