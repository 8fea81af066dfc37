"""The LQR game's episodes (``bchg_jax.games.lqr.rollout``) written out: every recorded step obeys
s' = A s + B b + C a from s0, the leader's noise enters as ``eps U^T`` (a lower-triangular U), the
random warm-up leader acts ``random_std * eps`` with the same per-step draws, the follower samples
around its mean, and an explicit horizon is honoured."""

import jax
import jax.numpy as jnp
import numpy as np

from bchg_jax.games import lqr
from bchg_jax.games.lqr.follower import best_response
from bchg_jax.problems.lqr_game import lqr_game


def _game_2k():
    """lqr_game with two leader inputs (C = I) and a non-symmetric lower-triangular U."""
    return lqr_game(C=np.eye(2), U=np.array([[0.5, 0.0], [0.3, 0.2]]))


def test_rollout_records_the_transition_from_s0():
    """s[:, 0] = s0, s[:, t+1] = A s_t + B b_t + C a_t exactly, shapes [E, T+1, n] / [E, T, .]
    with the horizon passed (not game.horizon); the game's B != C, so a swapped a / b shows."""
    game = lqr_game(U=np.array([[0.3]]))
    assert not np.allclose(game.B, game.C)
    theta = jnp.array([-4.0, 0.2])
    resp = best_response(game, theta, 0.1)
    tj = lqr.rollout(jax.random.key(0), game, theta, resp, 3, 7)
    assert tj.s.shape == (3, 8, 2) and tj.a.shape == (3, 7, 1) and tj.b.shape == (3, 7, 1)
    s, a, b = (np.asarray(x, np.float64) for x in tj)
    np.testing.assert_allclose(s[:, 0], np.broadcast_to(game.s0, (3, 2)), rtol=0, atol=0)
    nxt = s[:, :-1] @ game.A.T + b @ game.B.T + a @ game.C.T
    np.testing.assert_allclose(s[:, 1:], nxt, rtol=1e-5, atol=1e-5)


def test_rollout_leader_noise_is_eps_times_U_transpose():
    """With one key, the warm-up leader's actions (random_std 1) are the per-step draws eps, and
    the Gaussian leader's a - K s is eps U^T (U lower-triangular, not symmetric); a random_std of
    2.5 scales the warm-up actions by 2.5."""
    game = _game_2k()
    theta = jnp.array([-1.0, 0.0, 0.0, -1.0])
    resp = best_response(game, theta, 0.1)
    key = jax.random.key(4)
    eps = np.asarray(lqr.rollout(key, game, theta, resp, 5, 6, random_leader=True).a)
    wide = lqr.rollout(key, game, theta, resp, 5, 6, random_leader=True, random_std=2.5).a
    np.testing.assert_allclose(np.asarray(wide), 2.5 * eps, rtol=1e-6, atol=1e-7)
    tj = lqr.rollout(key, game, theta, resp, 5, 6)
    K = np.asarray(theta).reshape(2, 2)
    dev = np.asarray(tj.a) - np.asarray(tj.s[:, :-1]) @ K.T
    np.testing.assert_allclose(dev, eps @ game.U.T, rtol=1e-5, atol=1e-6)
    det = lqr.rollout(key, game, theta, resp, 5, 6, stochastic=False)
    np.testing.assert_allclose(
        np.asarray(det.a), np.asarray(det.s[:, :-1]) @ K.T, rtol=1e-6, atol=1e-7
    )


def test_rollout_follower_samples_around_its_mean():
    """b - mean_g(s, a) is the follower's Gaussian noise: mean ~0, std ~ its chol (not 0)."""
    game = lqr_game()
    theta = jnp.array([-4.0, 0.0])
    resp = best_response(game, theta, 0.1)
    tj = lqr.rollout(jax.random.key(1), game, theta, resp, 64, 20)
    z = np.asarray(tj.b - resp.mean(tj.s[:, :-1], tj.a))[..., 0] / float(resp.chol[0, 0])
    assert abs(z.std() - 1.0) < 0.05 and abs(z.mean()) < 0.05, (z.mean(), z.std())
