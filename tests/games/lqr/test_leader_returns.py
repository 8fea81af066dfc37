"""games.lqr.leader_returns: several discounts' exact returns from one pass over the moments,
each equal to leader_objective's, also vmapped over a one-point grid of many runs (the leading
axis of length 1 on which jaxlib 0.10.2's YNNPACK fusion once summed a broadcast product wrongly:
bchg_jax/core/compile_options.py)."""

import jax
import numpy as np
import pytest

from bchg_jax.games import lqr
from bchg_jax.problems.lqr_game import lqr_game

BETA = 0.1


def test_each_return_is_leader_objectives():
    game = lqr_game()
    thetas = 0.3 * jax.random.normal(jax.random.key(0), (1, 64, game.leader_dim * game.state_dim))
    gammas = (1.0, game.gamma_L, 0.5)

    def both(theta):
        resp = lqr.best_response(game, theta, BETA)
        many = lqr.leader_returns(game, theta, BETA, gammas, resp=resp)
        one = [lqr.leader_objective(game, theta, BETA, gamma=g, resp=resp) for g in gammas]
        return many, jax.numpy.stack(one)

    many, one = jax.jit(jax.vmap(jax.vmap(both)))(thetas)
    assert many.shape == (1, 64, 3)
    np.testing.assert_allclose(many, one, rtol=1e-6, atol=0)
    assert np.all(many[..., 1] < many[..., 0]) and np.all(many[..., 2] < many[..., 1])
    theta = thetas[0, 0]  # eagerly, with the solve inside
    np.testing.assert_allclose(
        lqr.leader_returns(game, theta, BETA, [1.0]),
        [lqr.leader_objective(game, theta, BETA)],
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
