"""games.tabular.leader_returns: several discounts' exact returns from one pass over the joint
chain, each the chain's discounted sum propagated by hand."""

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


def _chain_by_hand(game, f, g, gammas, horizon):
    """The joint chain propagated in float64 with NumPy."""
    f, g = np.asarray(f, np.float64), np.asarray(g, np.float64)
    pi = f[:, :, None] * g
    P = np.einsum("sab,sabt->st", pi, np.asarray(game.transition, np.float64))
    r = np.sum(pi * np.asarray(game.leader_reward, np.float64), (1, 2))
    d, out = np.asarray(game.init_dist, np.float64), np.zeros(len(gammas))
    for t in range(horizon):
        out += np.array([float(x) ** t for x in gammas]) * (d @ r)
        d = d @ P
    return out


def test_each_return_is_the_chains_discounted_sum():
    game = toy_game()
    gammas = (1.0, game.gamma_L, 0.5)
    keys = jax.random.split(jax.random.key(0), 32).reshape(1, 32)

    def returns(key):
        f, g = _policies(key, game)
        return games.leader_returns(game, f, g, gammas)

    many = jax.jit(jax.vmap(jax.vmap(returns)))(keys)
    assert many.shape == (1, 32, 3)
    for i in (0, 9, 31):
        f, g = _policies(keys[0, i], game)
        want = _chain_by_hand(game, f, g, gammas, game.time_limit)
        np.testing.assert_allclose(many[0, i], want, rtol=1e-5)
    f, g = _policies(keys[0, 0], game)  # leader_return is its one-gamma case
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
