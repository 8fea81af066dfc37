"""games.lqr.leader_returns: several discounts' exact returns from one pass over the moments,
each the discounted sum of the expected bumps (summed by hand), also vmapped over a one-point
grid of many runs (the leading axis of length 1 on which jaxlib 0.10.2's YNNPACK fusion once
summed a broadcast product wrongly: bchg_jax/core/compile_options.py)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from bchg_jax.games import lqr
from bchg_jax.games.lqr import exact
from bchg_jax.problems.lqr_game import lqr_game

BETA = 0.1


def _by_hand(game, theta, resp, gammas):
    """sum_t gamma^t E r_L(s_t) from the moments' scan and the bump, summed in float64."""
    F, G = exact.closed_loop_factor(game, theta, resp)
    mu, L = exact.state_factors(F, G, jnp.asarray(game.s0, theta.dtype), int(game.horizon))
    r = np.asarray(exact.expected_bump(game, mu, factor=L), np.float64)
    t = np.arange(r.shape[-1])
    return np.stack([np.sum(r * float(g) ** t) for g in gammas])


@pytest.mark.slow
def test_each_return_is_the_discounted_sum_of_the_expected_bumps():
    game = lqr_game()
    thetas = 0.3 * jax.random.normal(jax.random.key(0), (1, 64, game.leader_dim * game.state_dim))
    gammas = (1.0, game.gamma_L, 0.5)

    def returns(theta):
        resp = lqr.best_response(game, theta, BETA)
        return lqr.leader_returns(game, theta, BETA, gammas, resp=resp), resp

    many, resp = jax.jit(jax.vmap(jax.vmap(returns)))(thetas)
    assert many.shape == (1, 64, 3)
    for i in (0, 17, 63):
        one = jax.tree.map(lambda x: x[0, i], resp)
        np.testing.assert_allclose(many[0, i], _by_hand(game, thetas[0, i], one, gammas), rtol=2e-6)
    assert np.all(many[..., 1] < many[..., 0]) and np.all(many[..., 2] < many[..., 1])
    theta = thetas[0, 0]  # eagerly, with the solve inside; leader_objective is its one-gamma case
    np.testing.assert_allclose(
        lqr.leader_returns(game, theta, BETA, [1.0, 0.5]),
        [
            lqr.leader_objective(game, theta, BETA),
            lqr.leader_objective(game, theta, BETA, gamma=0.5),
        ],
        rtol=1e-6,
    )


@pytest.mark.parametrize(
    "gammas, match",
    [
        ((), "non-empty tuple"),
        (0.5, "non-empty tuple"),
        (((0.5, 0.6),), "scalar"),
        ((1.5,), r"\[0, 1\]"),
    ],
)
def test_bad_discounts_are_named(gammas, match):
    game = lqr_game()
    theta = np.zeros(game.leader_dim * game.state_dim, np.float32)
    with pytest.raises(ValueError, match=match):
        lqr.leader_returns(game, theta, BETA, gammas)
