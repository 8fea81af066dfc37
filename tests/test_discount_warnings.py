"""The tabular families' set-up warnings at discounts that differ: a float32 run warns when
either discount is above 0.99, and the share of the discount weight beyond a cut is
P(K + J >= H) of the two discounts (written out). With one discount standing for both, each
passed the tests, which ran at equal discounts or with the follower's the larger."""

import re
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from bchg_jax import tabular
from bchg_jax.games import tabular as game_tabular
from bchg_jax.games.tabular.game import TabularGame
from bchg_jax.problems import random_tabular_cmdp, random_tabular_game


def _messages(fn):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        fn()
    return [str(w.message) for w in caught]


def _game(gamma_F, gamma_L, time_limit=100):
    g = random_tabular_game(gamma=0.9)
    tables = (g.transition, g.init_dist, g.follower_reward, g.leader_reward)
    return TabularGame(*(jnp.asarray(x, jnp.float32) for x in tables), gamma_F, gamma_L, time_limit)


def _weight(gL, gF, H):
    k = np.arange(H)
    return gL**H + (1 - gL) * np.sum(gL**k * gF ** (H - k))


@pytest.mark.parametrize("gamma_F, gamma_L", [(0.999, 0.9), (0.9, 0.999)])
def test_float32_warns_for_either_discount_above_0_99(gamma_F, gamma_L):
    key = jax.random.key(0)
    cmdp = random_tabular_cmdp(key, gamma_F=gamma_F, gamma_L=gamma_L, time_limit=20000)
    for make in (
        lambda: tabular.make_train(cmdp, "bchg"),
        lambda: game_tabular.make_train(
            _game(gamma_F, gamma_L), "bchg", game_tabular.TrainConfig()
        ),
    ):
        assert any("float32 with a discount of 0.999" in m for m in _messages(make))


def test_the_warned_cut_share_is_that_of_both_discounts():
    """Tabular CMDP without terminal states, gamma_L 0.99, gamma_F 0.5, cut at 100: the warning
    quotes P(K + J >= 100); the tabular game's reference warning fires both ways round."""
    cmdp = random_tabular_cmdp(jax.random.key(0), gamma_F=0.5, gamma_L=0.99)
    msgs = [m for m in _messages(lambda: tabular.make_train(cmdp, "bchg")) if "no terminal" in m]
    got = float(re.search(r"leaves (\S+) of the discount weight", msgs[0]).group(1))
    assert got == float(f"{_weight(0.99, 0.5, 100):.2g}"), (got, _weight(0.99, 0.5, 100))
    config = game_tabular.TrainConfig(iterations=2, actor="tabular", track_reference=True)
    for gamma_F, gamma_L in [(0.5, 0.99), (0.99, 0.5)]:
        assert _weight(gamma_L, gamma_F, 150) > 1e-3
        game = _game(gamma_F, gamma_L, 150)
        msgs = _messages(lambda: game_tabular.make_train(game, "bchg", config))
        assert any("truncat" in m for m in msgs), (gamma_F, gamma_L, msgs)
