"""Bi-level LQR Markov game: the paper's instance written out, and one exact return it pins."""

import jax
import jax.numpy as jnp
import numpy as np

from bchg_jax.games.lqr.exact import leader_objective
from bchg_jax.problems.lqr_game import lqr_game


def test_lqr_game_constants_match_the_paper(x64):
    g = lqr_game()
    np.testing.assert_array_equal(np.asarray(g.A), [[0.0, 1.0], [0.0, 0.0]])  # A
    np.testing.assert_array_equal(np.asarray(g.B), [[0.0], [0.1]])  # follower input B
    np.testing.assert_array_equal(np.asarray(g.C), [[0.1], [0.0]])  # leader input C
    np.testing.assert_array_equal(np.asarray(g.Qbar), np.eye(2))  # Qbar = I_2
    np.testing.assert_array_equal(np.asarray(g.Rbar), [[1.0]])  # Rbar = [1]
    np.testing.assert_array_equal(np.asarray(g.s0), [1.0, 0.0])  # s0 = (1, 0)
    np.testing.assert_array_equal(np.asarray(g.s_star), [-0.8, 0.0])  # s* = (-0.8, 0)
    np.testing.assert_array_equal(np.asarray(g.Sigma), np.diag([25.0, 10000.0]))  # diag(5,100)^2
    np.testing.assert_array_equal(np.asarray(g.U), [[1e-3]])  # leader noise U = 1e-3
    assert g.gamma_F == 0.95 and g.horizon == 100  # follower discount; 100-step episodes
    assert g.gamma_L == 0.99  # the leader's discount


def test_exact_return_at_a_known_gain(x64):
    """The paper's note: exact undiscounted 100-step leader return 0.27 at K = (-6, 0) and 0.07
    at K = (-4, 0) (follower beta 0.1)."""
    g = lqr_game()
    f = jax.jit(lambda K: leader_objective(g, K, 0.1))
    assert abs(float(f(jnp.array([-6.0, 0.0]))) - 0.27) < 0.01
    assert abs(float(f(jnp.array([-4.0, 0.0]))) - 0.07) < 0.005
