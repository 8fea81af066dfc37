"""games.tabular.leader_returns: several discounts' exact returns from one pass over the joint
chain, each equal to leader_return's."""

import jax
import numpy as np
import pytest

from bchg_jax.games import tabular as games
from bchg_jax.problems.toy_game import toy_game


def _policies(key, game):
    S, A, B = game.transition.shape[:3]
    k1, k2 = jax.random.split(key)
    f = jax.nn.softmax(jax.random.normal(k1, (S, A)), -1)
    g = jax.nn.softmax(jax.random.normal(k2, (S, A, B)), -1)
    return f, g


def test_each_return_is_leader_returns():
    game = toy_game()
    gammas = (1.0, game.gamma_L, 0.5)
    keys = jax.random.split(jax.random.key(0), 32).reshape(1, 32)

    def both(key):
        f, g = _policies(key, game)
        one = [games.leader_return(game, f, g, gamma=x) for x in gammas]
        return games.leader_returns(game, f, g, gammas), jax.numpy.stack(one)

    many, one = jax.jit(jax.vmap(jax.vmap(both)))(keys)
    assert many.shape == (1, 32, 3)
    np.testing.assert_array_equal(many, one)  # the same operations, one scan
    f, g = _policies(keys[0, 0], game)
    np.testing.assert_array_equal(
        games.leader_returns(game, f, g, [0.9], horizon=7),
        [games.leader_return(game, f, g, 7, 0.9)],
    )


@pytest.mark.parametrize(
    "gammas, match",
    [
        ((), "non-empty tuple"),
        (0.5, "non-empty tuple"),
        (((0.5, 0.6),), "scalar"),
        ((-0.1,), "gamma"),
    ],
)
def test_bad_discounts_are_named(gammas, match):
    game = toy_game()
    f, g = _policies(jax.random.key(1), game)
    with pytest.raises(ValueError, match=match):
        games.leader_returns(game, f, g, gammas)
