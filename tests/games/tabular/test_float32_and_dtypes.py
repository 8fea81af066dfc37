"""The tabular game family's dtypes and float32 accuracy: a float64 game with a float32 leader
policy computes in float64 (JAX's promotion, ``games.tabular.game.compute_dtype``); the float32
exact hypergradient at the paper's gamma 0.99 (``follower_softmax``: the softmax derivative
centred before it is summed); ``rollout`` validates the game as every other function does."""

import dataclasses
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from bchg_jax.games import tabular as gt
from bchg_jax.games.tabular.exact import (
    best_response,
    exact_hypergradient,
    k_step_hypergradient,
    leader_objective,
    leader_return,
    soft_policy_evaluation,
)
from bchg_jax.games.tabular.follower import follower_softmax, soft_q_iteration
from bchg_jax.games.tabular.game import compute_dtype
from bchg_jax.games.tabular.rollout import rollout
from bchg_jax.problems.random_tabular import random_tabular_game
from bchg_jax.problems.toy_game import toy_game


def softmax_policy(theta):
    return jax.nn.softmax(theta, -1)


def toy_theta(p, dtype):
    """Leader logits with f(0 | A) = p (the toy game's only parameter that matters)."""
    return jnp.asarray([[0.0, 0.0], [np.log(p / (1 - p)), 0.0], [0.0, 0.0]], dtype)


def rel(a, b):
    a, b = (np.asarray(x, np.float64).ravel() for x in (a, b))
    return float(np.linalg.norm(a - b) / np.linalg.norm(b))


def cast_game(game, dtype):
    return game.astype(dtype)


# --- mixed dtypes: the game's tables and the policy are promoted ---------------------------


@pytest.mark.slow
def test_float64_game_with_float32_theta_computes_in_float64(x64):
    """The exact hypergradient of a float64 toy game at a float32 theta equals the float64
    computation at the same theta within 2e-4 (measured 3.6e-5 and 1.3e-5: what is left is
    policy_fn's own float32 softmax and its derivative); the tables were cast to the policy's
    float32, 6.8% off at beta 0.05 (p 0.5) and 27% at beta 1e-3 (p 0.55). The solver's
    outputs are float64 and equal the float64 policy's."""
    game = toy_game(dtype=jnp.float64)
    for beta, p in ((0.05, 0.5), (1e-3, 0.55)):
        th32 = toy_theta(p, jnp.float32)
        got = exact_hypergradient(softmax_policy, th32, game, beta)
        assert got.dtype == jnp.float32  # a gradient in theta's dtype
        want = exact_hypergradient(softmax_policy, th32.astype(jnp.float64), game, beta)
        assert rel(got, want) < 2e-4, (beta, p, rel(got, want))
    f32 = softmax_policy(toy_theta(0.5, jnp.float32))
    f64 = f32.astype(jnp.float64)
    br32, br64 = best_response(game, f32, 0.05), best_response(game, f64, 0.05)
    assert br32.Q.dtype == jnp.float64
    np.testing.assert_allclose(br32.Q, br64.Q, rtol=1e-13, atol=1e-12)
    J32, J64 = leader_objective(game, f32, 0.05), leader_objective(game, f64, 0.05)
    assert J32.dtype == jnp.float64 and abs(float(J32) - float(J64)) < 1e-12 * abs(float(J64))
    R = leader_return(game, f32, br64.policy.astype(jnp.float32))
    assert R.dtype == jnp.float64
    np.testing.assert_allclose(R, leader_return(game, f64, br64.policy), rtol=1e-6)
    Qg, Vg = soft_policy_evaluation(game, f32, br32.policy.astype(jnp.float32), 0.05)
    assert Qg.dtype == Vg.dtype == jnp.float64


@pytest.mark.slow
def test_a_float32_game_with_a_float64_beta_or_warm_start_is_promoted_consistently(x64):
    """The solvers' loop carries take the promoted dtype: a strongly typed float64 beta with a
    float32 game and policy failed inside the while_loop ("carry input and carry output must
    have equal types"); a float32 warm start of a float64 computation is cast to it."""
    g32 = toy_game(dtype=jnp.float32)
    f32 = softmax_policy(toy_theta(0.45, jnp.float32))
    g_wide = cast_game(g32, jnp.float64)  # the float32 tables' values, in float64
    want = soft_q_iteration(g_wide, f32.astype(jnp.float64), 0.05, tol=1e-12, max_sweeps=100_000)
    for beta in (np.float64(0.05), jnp.asarray(0.05, jnp.float64)):
        br = soft_q_iteration(g32, f32, beta, tol=1e-12, max_sweeps=100_000)
        assert br.Q.dtype == jnp.float64
        np.testing.assert_allclose(br.Q, want.Q, atol=1e-10)
        assert best_response(g32, f32, beta).Q.dtype == jnp.float64
    warm = soft_q_iteration(
        g_wide, f32, 0.05, Q0=want.Q.astype(jnp.float32), tol=1e-12, max_sweeps=100_000
    )
    assert warm.Q.dtype == jnp.float64
    np.testing.assert_allclose(warm.Q, want.Q, atol=1e-10)
    # a weakly typed Python beta does not widen a float32 computation
    assert soft_q_iteration(g32, f32, 0.05).Q.dtype == jnp.float32
    assert compute_dtype(g32, f32, 0.05) == np.float32
    assert compute_dtype(g32, f32, np.float64(0.05)) == np.float64


@pytest.mark.slow
def test_the_trainer_computes_in_its_config_dtype(x64):
    """make_train casts the game to config.dtype once (TabularGame.astype): a float64 game
    under the float32 config trains exactly as the same game given in float32."""
    config = gt.TrainConfig(iterations=2, episodes=2, minibatch=8, hidden=(8,), max_steps=2)
    hp = gt.HParams(actor_steps=1, critic_steps=1, beta=0.05)
    game64 = toy_game(time_limit=10, dtype=jnp.float64)
    runs = []
    for game in (game64, cast_game(game64, jnp.float32)):
        trainer = gt.make_train(game, "bchg", config)
        _, metrics = trainer.train(jax.random.key(0), hp)
        runs.append(metrics)
    assert runs[0]["J"].dtype == jnp.float32
    for name in ("J", "J_discounted", "batch_return"):
        np.testing.assert_array_equal(runs[0][name], runs[1][name])


# --- float32 exact hypergradient at the paper's gamma 0.99 -----------------------------------


@pytest.mark.parametrize(
    "beta, p, old",
    [(0.05, 0.5, 0.016), (0.01, 0.55, 0.027), (1e-3, 0.55, 0.27)],
)
@pytest.mark.slow
def test_float32_exact_hypergradient_of_the_toy_game(x64, beta, p, old):
    """The toy game at gamma 0.99 (the paper's): the float32 exact hypergradient against
    float64 within 2e-3 (measured 2.2e-4, 2e-6, 2e-6), with no warning. With jax.nn.softmax's
    derivative (the leak of a row's common tangent, ``follower_softmax``) it was ``old`` off
    (1.6%, 2.7%, 27%), with every solve converged."""
    g32, g64 = toy_game(dtype=jnp.float32), toy_game(dtype=jnp.float64)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        got = exact_hypergradient(softmax_policy, toy_theta(p, jnp.float32), g32, jnp.float32(beta))
    want = exact_hypergradient(softmax_policy, toy_theta(p, jnp.float64), g64, beta)
    assert rel(got, want) < 2e-3, (rel(got, want), old)


@pytest.mark.slow
def test_float32_exact_hypergradient_of_a_random_game_near_one(x64):
    """A random 4-state game at gamma 0.999 (warned: FLOAT32_GAMMA_WARN): the float32 exact
    hypergradient within 1% of float64 (measured 3.0e-3; 47% before)."""
    g64 = random_tabular_game(seed=1, S=4, A=2, B=3, gamma=0.999, time_limit=50)
    theta = np.random.default_rng(1).normal(size=(4, 2))
    want = exact_hypergradient(softmax_policy, jnp.asarray(theta), g64, 0.01)
    with pytest.warns(UserWarning, match="discount of 0.999"):
        got = exact_hypergradient(
            softmax_policy,
            jnp.asarray(theta, jnp.float32),
            cast_game(g64, jnp.float32),
            jnp.float32(0.01),
        )
    assert rel(got, want) < 1e-2, rel(got, want)


def test_float32_k_step_hypergradient_of_the_toy_game(x64):
    """k_step_hypergradient differentiates softmax(T^K Q / beta) with the same rule: float32
    within 2e-3 of float64 at beta 1e-3, K = 200 (measured 2e-6; 24% before)."""
    g32, g64 = toy_game(dtype=jnp.float32), toy_game(dtype=jnp.float64)
    beta, K = 1e-3, 200
    Q0 = best_response(g64, softmax_policy(toy_theta(0.5, jnp.float64)), beta).Q
    want = k_step_hypergradient(softmax_policy, toy_theta(0.55, jnp.float64), g64, Q0, beta, K)
    got = k_step_hypergradient(
        softmax_policy,
        toy_theta(0.55, jnp.float32),
        g32,
        Q0.astype(jnp.float32),
        jnp.float32(beta),
        K,
    )
    assert rel(got, want) < 2e-3, rel(got, want)


def test_follower_softmax_values_and_derivative():
    """Its values are jax.nn.softmax's; its float32 derivative along a tangent common to a row
    (all actions tied) is exactly 0, where jax.nn.softmax's leaks ~eps |dz| off the simplex;
    along random tangents it matches float64 to float32 accuracy."""
    z = jnp.asarray([[1.0, 1.0, 1.0], [3.0, 1.0, -2.0], [0.5, 0.5, 0.4]], jnp.float32) / 1e-3
    np.testing.assert_array_equal(follower_softmax(z), jax.nn.softmax(z, -1))
    common = jnp.full_like(z, 2.3e4)  # dQ / beta of the toy game at beta 1e-3
    _, d = jax.jvp(follower_softmax, (z,), (common,))
    np.testing.assert_array_equal(d, 0.0)
    _, leak = jax.jvp(lambda x: jax.nn.softmax(x, -1), (z,), (common,))
    assert float(jnp.max(jnp.abs(leak))) > 1e-4  # what the hypergradient inherited
    dz = jax.random.normal(jax.random.key(0), z.shape, jnp.float32) * 100.0
    _, d32 = jax.jvp(follower_softmax, (z,), (dz,))
    z64 = np.asarray(z, np.float64)
    g = np.exp(z64 - z64.max(-1, keepdims=True))
    g /= g.sum(-1, keepdims=True)
    dz64 = np.asarray(dz, np.float64)
    d64 = g * (dz64 - np.sum(g * dz64, -1, keepdims=True))
    np.testing.assert_allclose(np.asarray(d32, np.float64), d64, atol=1e-5 * np.abs(dz64).max())


def test_follower_softmax_centres_at_the_most_likely_action():
    """The tangent is centred at each row's most likely action: there the float32 derivative
    ``g (dz - sum g dz)`` of a near-1 g cancels exactly (g rounds to 1), so centring at any other
    action left the top action's derivative at 0 (100% off, by the float64 formula); centred at
    the top, every entry is within 1e-6 relative (the top action in column 0 and in column 1)."""
    z = jnp.asarray([[0.0, -18.0, -17.0], [-17.0, 0.0, -18.0]], jnp.float32)
    dz = jnp.asarray([[1e4, 0.0, 3e3], [-2e3, 1e4, 0.0]], jnp.float32)
    _, d = jax.jvp(follower_softmax, (z,), (dz,))
    z64, dz64 = np.asarray(z, np.float64), np.asarray(dz, np.float64)
    g = np.exp(z64 - z64.max(-1, keepdims=True))
    g /= g.sum(-1, keepdims=True)
    want = g * (dz64 - np.sum(g * dz64, -1, keepdims=True))
    np.testing.assert_allclose(np.asarray(d, np.float64), want, rtol=1e-6)


# --- rollout validates the game -----------------------------------------------------------


@pytest.mark.parametrize(
    "change, message",
    [
        (lambda g: {"transition": g.transition * 0.99}, "transition rows must be probability"),
        (lambda g: {"transition": g.transition.at[0, 0, 0, 0].set(jnp.nan)}, "non-finite"),
        (lambda g: {"init_dist": jnp.asarray([1.0, 1.0, 0.0])}, "init_dist must be a prob"),
        (lambda g: {"gamma_F": 1.0}, "gamma_F"),
    ],
)
def test_rollout_refuses_an_invalid_game(change, message):
    """rows summing to 0.99, a NaN transition, an init_dist summing to 2: rollout sampled
    episodes from them (the sampler normalises), while every other function raised."""
    base = toy_game(time_limit=10)
    game = dataclasses.replace(base, **change(base))
    f = softmax_policy(jnp.zeros((3, 2)))
    g = jnp.full((3, 2, 3), 1.0 / 3.0)
    with pytest.raises(ValueError, match=message):
        rollout(jax.random.key(0), game, f, g, 2, 5)
    with pytest.raises(ValueError, match=message):  # also under jit, where its tables are concrete
        jax.jit(lambda k: rollout(k, game, f, g, 2, 5))(jax.random.key(0))
