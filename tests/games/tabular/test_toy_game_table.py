"""Toy Markov game: the whole transition / reward table of the paper's appendix written out
(states S=0, A=1, B=2; leader actions 0, 1; follower actions s=0, a=1, b=2), start at S,
150-step episodes, discounts 0.99, R = 2 by default."""

import numpy as np

from bchg_jax.problems.toy_game import toy_game

S, A, B = 0, 1, 2


def _table(R):
    # (state, leader action or None for both, follower action, next, r_F, r_L): the appendix's table
    rows = [
        (S, None, 0, S, 0, 0),
        (S, None, 1, A, 1, 1),
        (S, None, 2, B, 1, 0),
        (A, 0, 0, S, 0, 0),
        (A, 0, 1, A, 0, 0),
        (A, 0, 2, B, R, 0),
        (A, 1, 0, S, -1, 0),
        (A, 1, 1, S, -1, 0),
        (A, 1, 2, S, -1, 0),
        (B, None, 0, S, 0, 0),
        (B, None, 1, B, 0, 0),
        (B, None, 2, B, 0, 0),
    ]
    P, rF, rL = np.zeros((3, 2, 3, 3)), np.zeros((3, 2, 3)), np.zeros((3, 2, 3))
    for s, a, b, nxt, f, lead in rows:
        for aa in (0, 1) if a is None else (a,):
            P[s, aa, b, nxt], rF[s, aa, b], rL[s, aa, b] = 1.0, f, lead
    return P, rF, rL


def test_toy_game_tables_match_the_appendix():
    for R, game in ((2.0, toy_game()), (1.0, toy_game(1.0))):  # default: the figure's R = 2
        P, rF, rL = _table(R)
        np.testing.assert_array_equal(np.asarray(game.transition), P)
        np.testing.assert_array_equal(np.asarray(game.follower_reward), rF)
        np.testing.assert_array_equal(np.asarray(game.leader_reward), rL)
        np.testing.assert_array_equal(np.asarray(game.init_dist), [1.0, 0.0, 0.0])  # start at S
        assert game.time_limit == 150  # 150-step episodes (time-outs)
        assert game.gamma_F == 0.99  # the follower's discount
        assert game.gamma_L == 0.99  # the leader's discount (reference: gamma 0.99 for both)
