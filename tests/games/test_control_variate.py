"""The cross-fitted control variate of the guiding term (bchg_jax.games.control_variate)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from bchg_jax.games import lqr
from bchg_jax.games.control_variate import crossfit_baseline, quadratic_features
from bchg_jax.problems.lqr_game import lqr_game


@pytest.fixture
def x64():
    jax.config.update("jax_enable_x64", True)
    yield
    jax.config.update("jax_enable_x64", False)


def test_quadratic_features():
    x = jnp.array([[2.0, 3.0]])
    np.testing.assert_allclose(quadratic_features(x), [[1, 2, 3, 4, 6, 9]])


@pytest.mark.slow
def test_crossfit_uses_only_the_other_groups(x64):
    k = jax.random.split(jax.random.key(0), 3)
    x = jax.random.normal(k[0], (90, 2))
    f = quadratic_features(x)
    coef = jax.random.normal(k[1], (6, 3))
    y = f @ coef
    groups = jnp.repeat(jnp.arange(3), 30)
    c = crossfit_baseline(f, y, groups, 3, ridge=1e-10)
    np.testing.assert_allclose(c, y, atol=1e-6)  # an exact model is recovered
    # changing group 0's targets leaves group 0's predictions unchanged
    y2 = y.at[:30].add(jax.random.normal(k[2], (30, 3)))
    c2 = crossfit_baseline(f, y2, groups, 3, ridge=1e-10)
    np.testing.assert_allclose(c2[:30], c[:30], atol=1e-9)
    assert float(jnp.abs(c2[30:] - c[30:]).max()) > 1e-3
    # a single group has nothing to fit on: zero baseline
    np.testing.assert_array_equal(crossfit_baseline(f, y, jnp.zeros(90, int), 1), 0.0)


@pytest.mark.slow
def test_control_variate_keeps_the_guiding_term_unbiased_and_cuts_its_variance(x64):
    """Theorem 3's guiding term ``sum_t gL^t Ben_t G_t / beta`` on batches of 2 episodes at
    K = (-9, -9), with and without the cross-fitted baseline: the difference of the two has mean
    zero within 4 SE over 300 batches, and the baseline cuts the std of the K_1 component at
    least 5-fold. (Unbiasedness needs only E[Ben | s, a] = 0, which holds for any critic, so the
    critic here is the one-step lookahead r_L(s').)"""
    game = lqr_game()
    theta = jnp.array([-9.0, -9.0])
    beta, gL, gF, T, E, nb = 0.1, game.gamma_L, game.gamma_F, 60, 2, 300
    resp = lqr.best_response(game, theta, beta, stochastic=False)

    def Q(s, a, b):
        return lqr.leader_reward(game, lqr.transition(game, s, a, b))

    def batch(key):
        k1, k2 = jax.random.split(key)
        tr = lqr.rollout(k1, game, theta, resp, E, T, stochastic=False)
        s, b = tr.s[:, :-1], tr.b
        a = s @ theta.reshape(1, 2).T
        bj = jax.vmap(lambda kk: resp.sample(kk, s, a))(jax.random.split(k2, 16))
        ben = Q(s, a, b) - jax.vmap(lambda bb: Q(s, a, bb))(bj).mean(0)  # [E, T]
        dQF = jax.grad(lambda aa: lqr.follower_q(game, resp, theta, s, aa, b).sum())(a)
        x = dQF * s  # [E, T, 2]

        def back(c, xk):
            c = xk + gF * c
            return c, c

        _, G = jax.lax.scan(back, jnp.zeros((E, 2)), jnp.swapaxes(x, 0, 1)[::-1])
        G = jnp.swapaxes(G[::-1], 0, 1)  # [E, T, 2]
        w = (gL ** jnp.arange(T))[None, :, None]
        c = crossfit_baseline(
            quadratic_features(s.reshape(-1, 2)), G.reshape(-1, 2), jnp.repeat(jnp.arange(E), T), E
        ).reshape(E, T, 2)
        raw = jnp.sum(w * ben[..., None] * G, (0, 1)) / (E * beta)
        cv = jnp.sum(w * ben[..., None] * (G - c), (0, 1)) / (E * beta)
        return raw, cv

    raw, cv = jax.jit(jax.vmap(batch))(jax.random.split(jax.random.key(3), nb))
    raw, cv = np.asarray(raw), np.asarray(cv)
    d = raw - cv
    se = d.std(0, ddof=1) / np.sqrt(nb)
    assert np.all(np.abs(d.mean(0)) < 4 * se), (d.mean(0), se)
    assert cv[:, 0].std() < 0.2 * raw[:, 0].std(), (cv.std(0), raw.std(0))


@pytest.mark.slow
def test_crossfit_near_constant_float32_column_matches_float64(x64):
    """A column constant in the fitted episode (0.1) and 0.3 in the held-out one: its float32
    spread over the fitted samples is rounding (2.2e-8), so it gets no coefficient, and the
    float32 baselines equal float64's to float32 accuracy. With the absolute threshold of
    before it was standardised to +-1 and the held-out baseline was 9.3e6 (float64: 3.96)."""
    rng = np.random.default_rng(0)
    M, E = 120, 2
    groups = np.repeat(np.arange(E), M // E)
    x = rng.normal(size=M)
    F = np.stack([np.ones(M), x, np.where(groups == 0, 0.3, 0.1)], -1)
    Y = (2.0 + x)[:, None]
    c64 = np.asarray(crossfit_baseline(jnp.asarray(F), jnp.asarray(Y), jnp.asarray(groups), E))
    c32 = crossfit_baseline(
        jnp.asarray(F, jnp.float32), jnp.asarray(Y, jnp.float32), jnp.asarray(groups), E
    )
    assert c32.dtype == jnp.float32
    np.testing.assert_allclose(np.asarray(c32, np.float64), c64, atol=1e-5 * np.abs(Y).max())
    # the reference: the same fit without the (constant-in-fit) column
    c_without = crossfit_baseline(jnp.asarray(F[:, :2]), jnp.asarray(Y), jnp.asarray(groups), E)
    np.testing.assert_allclose(c64, c_without, rtol=1e-12, atol=1e-12)


def test_crossfit_adds_its_own_intercept(x64):
    """Features without a constant column ([x1, x2]) fit as [1, x1, x2]: an exact linear model
    is recovered from either (column 0 was overwritten by 1, so x1 was lost: residual ~90%)."""
    rng = np.random.default_rng(1)
    M, E = 200, 2
    groups = jnp.asarray(np.repeat(np.arange(E), M // E))
    X = rng.normal(size=(M, 2))
    Y = (2.0 + 3.0 * X[:, 0] + X[:, 1])[:, None]
    plain = crossfit_baseline(jnp.asarray(X), jnp.asarray(Y), groups, E, ridge=1e-10)
    const = crossfit_baseline(
        jnp.asarray(np.concatenate([np.ones((M, 1)), X], 1)), jnp.asarray(Y), groups, E, 1e-10
    )
    np.testing.assert_allclose(plain, Y, atol=1e-6)
    np.testing.assert_allclose(plain, const, atol=1e-10)


@pytest.mark.slow
def test_crossfit_leaves_a_nan_target_out_of_the_fits(x64):
    """One NaN target (sample 0, episode 0): every baseline stays finite and equals the fit on
    the data without that sample (it made every episode's baseline NaN: 0 * NaN in the fits)."""
    rng = np.random.default_rng(2)
    M, E = 60, 3
    groups = np.repeat(np.arange(E), M // E)
    F = np.asarray(quadratic_features(jnp.asarray(rng.normal(size=(M, 1)))))
    Y = rng.normal(size=(M, 2))
    Y[0, 0] = np.nan
    c = np.asarray(crossfit_baseline(jnp.asarray(F), jnp.asarray(Y), jnp.asarray(groups), E))
    assert np.all(np.isfinite(c))
    ref = np.asarray(
        crossfit_baseline(jnp.asarray(F[1:]), jnp.asarray(Y[1:]), jnp.asarray(groups[1:]), E)
    )
    np.testing.assert_allclose(c[1:], ref, rtol=1e-12, atol=1e-12)
    # sample 0's own baseline: the fit on the other episodes, which never saw it
    F0 = np.concatenate([F[:1], F[20:]])
    ref0 = crossfit_baseline(
        jnp.asarray(F0),
        jnp.asarray(np.concatenate([np.zeros((1, 2)), Y[20:]])),
        jnp.asarray(np.concatenate([[0], groups[20:]])),
        E,
    )
    np.testing.assert_allclose(c[0], ref0[0], rtol=1e-12, atol=1e-12)
