"""The tabular game trainer's buffer holds every index of a game with more than 127 states
(``core.buffers.index_dtype``; an int8 buffer wrapped state 128 to -128)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from bchg_jax.games import tabular as tgame
from bchg_jax.games.tabular.follower import response_from_q
from bchg_jax.games.tabular.game import TabularGame


def test_index_dtype_is_the_smallest_that_holds_every_index():
    from bchg_jax.core.buffers import index_dtype

    assert index_dtype(3, 2, 3) == jnp.int8
    assert index_dtype(128) == jnp.int8  # indices 0 .. 127
    assert index_dtype(129, 2) == jnp.int16
    assert index_dtype(2, 40_000) == jnp.int32
    with pytest.raises(ValueError, match="positive"):
        index_dtype(0)


def _ring_game(S=200):
    """The follower moves +1 or +2 around a ring of S states from state 0 (150-step episodes
    reach states above 127)."""
    rng = np.random.default_rng(0)
    P = np.zeros((S, 2, 2, S))
    for s in range(S):
        P[s, :, 0, (s + 1) % S] = 1
        P[s, :, 1, (s + 2) % S] = 1
    init = np.zeros(S)
    init[0] = 1
    rF, rL = rng.normal(size=(2, S, 2, 2))
    arrays = (P, init, rF, rL)
    return TabularGame(*(jnp.asarray(x, jnp.float32) for x in arrays), 0.9, 0.9, 150).validate()


@pytest.mark.slow
def test_a_200_state_game_stores_its_episodes_exactly():
    game = _ring_game()
    tr = tgame.make_train(game, "bchg", tgame.TrainConfig(actor="tabular", iterations=2))
    hp = tgame.HParams(1, 1, 0.05)
    state = jax.jit(tr.init)(jax.random.key(0), hp)
    resp = response_from_q(state.follower, 0.05, 0, 0.0)
    new, ep = jax.jit(tr.steps["collect"])(jax.random.key(1), state, resp)
    assert int(ep.s.max()) > 127  # the episodes do reach the states an int8 cannot hold
    for stored, drawn in ((new.buffer.s, ep.s), (new.buffer.a, ep.a), (new.buffer.b, ep.b)):
        np.testing.assert_array_equal(np.asarray(stored, np.int32), np.asarray(drawn))
    assert new.buffer.s.dtype == jnp.int16
    _, m = jax.jit(tr.train)(jax.random.key(2), hp)
    assert np.all(np.isfinite(np.asarray(m["J"])))
