"""games.tabular.rollout against episodes known in advance: in a game whose policies and moves are
deterministic every record is fixed (s_t is the state the actions a_t, b_t were taken in,
b answers the leader's a, s' follows (s, a, b)), entries a hair below 0 (accepted by validate)
are never drawn, the follower's action and the next state are drawn independently, and a horizon
below 1 is refused."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from bchg_jax.games.tabular.game import TabularGame
from bchg_jax.games.tabular.rollout import rollout

S, A, B = 3, 2, 3


def _next(s, a, b):
    return (s + 1 + a + b) % S


def _deterministic_game(init_state=2):
    P = np.zeros((S, A, B, S))
    for s in range(S):
        for a in range(A):
            for b in range(B):
                P[s, a, b, _next(s, a, b)] = 1.0
    init = np.zeros(S)
    init[init_state] = 1.0
    r = np.zeros((S, A, B))
    return TabularGame(
        jnp.asarray(P, jnp.float32),
        jnp.asarray(init, jnp.float32),
        jnp.asarray(r, jnp.float32),
        jnp.asarray(r, jnp.float32),
        0.9,
        0.9,
        None,
    ).validate()


def _leader(s):
    return (s + 1) % A


def _follower(s, a):
    return (s + 2 * a + 1) % B  # depends on a: g(.|s, 0) != g(.|s, 1)


def _one_hot_policies():
    f = np.zeros((S, A))
    g = np.zeros((S, A, B))
    for s in range(S):
        f[s, _leader(s)] = 1.0
        for a in range(A):
            g[s, a, _follower(s, a)] = 1.0
    return jnp.asarray(f, jnp.float32), jnp.asarray(g, jnp.float32)


def test_game_rollout_deterministic_episode_by_hand():
    """s_0 from init_dist (one-hot, not uniform), a_t = f's action at s_t, b_t = g's answer to
    (s_t, a_t), s_{t+1} = p's successor of (s_t, a_t, b_t): every record of every episode is
    the hand-computed chain, time on axis 1 (a record of s_{t+1}, b of g(.|s, 0), p(.|s, a, 0)
    or a / b swapped all differ)."""
    game = _deterministic_game(init_state=2)
    f, g = _one_hot_policies()
    ep = rollout(jax.random.key(0), game, f, g, 4, 7)
    s, want_s, want_a, want_b = 2, [], [], []
    for _ in range(7):
        a = _leader(s)
        b = _follower(s, a)
        want_s.append(s)
        want_a.append(a)
        want_b.append(b)
        s = _next(s, a, b)
    for name, got, want in (("s", ep.s, want_s), ("a", ep.a, want_a), ("b", ep.b, want_b)):
        assert got.shape == (4, 7), name
        np.testing.assert_array_equal(np.asarray(got), np.tile(want, (4, 1)), err_msg=name)


def test_game_rollout_never_draws_a_slightly_negative_entry():
    """An entry of -1e-10 (validate accepts rounding down to -1e-9) is never drawn: its log is
    NaN, which jax.random.categorical (an argmax) would pick every time."""
    P = np.zeros((S, A, B, S))
    P[..., 0] = 0.5
    P[..., 1] = 0.5 + 1e-10
    P[..., 2] = -1e-10
    game = TabularGame(
        jnp.asarray(P, jnp.float32),
        jnp.asarray([1.0, 0.0, 0.0], jnp.float32),
        jnp.zeros((S, A, B), jnp.float32),
        jnp.zeros((S, A, B), jnp.float32),
        0.9,
        0.9,
        None,
    ).validate()
    f = jnp.full((S, A), 1.0 / A, jnp.float32)
    g = jnp.full((S, A, B), 1.0 / B, jnp.float32)
    ep = rollout(jax.random.key(1), game, f, g, 50, 20)
    s = np.asarray(ep.s)
    assert not np.any(s == 2)
    # both other states are drawn (about half each)
    assert 0.4 < np.mean(s[:, 1:] == 1) < 0.6


def test_game_rollout_follower_action_and_next_state_are_independent():
    """g uniform over B = 3 and p uniform over S = 3 (the same shape): b_t and s_{t+1} are drawn
    from independent keys, so b_t == s_{t+1} about 1/3 of the time (one key for both draws
    gives identical Gumbel noise: b_t == s_{t+1} always)."""
    game = TabularGame(
        jnp.full((S, A, B, S), 1.0 / S, jnp.float32),
        jnp.full((S,), 1.0 / S, jnp.float32),
        jnp.zeros((S, A, B), jnp.float32),
        jnp.zeros((S, A, B), jnp.float32),
        0.9,
        0.9,
        None,
    ).validate()
    f = jnp.full((S, A), 1.0 / A, jnp.float32)
    g = jnp.full((S, A, B), 1.0 / B, jnp.float32)
    ep = rollout(jax.random.key(2), game, f, g, 200, 20)
    same = np.mean(np.asarray(ep.b[:, :-1]) == np.asarray(ep.s[:, 1:]))
    # 3800 pairs: SE = sqrt(2/9 / 3800) = 0.0076
    assert abs(same - 1.0 / 3) < 0.04, same


@pytest.mark.parametrize(
    "num_episodes, horizon, name",
    [(0, 5, "num_episodes"), (3, 0, "horizon"), (-1, 5, "num_episodes"), (3, -2, "horizon")]
    + [(2.0, 5, "num_episodes"), (3, True, "horizon")],
)
def test_game_rollout_refuses_a_count_below_one(num_episodes, horizon, name):
    """num_episodes or horizon < 1 is refused by name (0 would return empty episodes), and so
    is a float or a bool (they got past a comparison)."""
    game = _deterministic_game()
    f, g = _one_hot_policies()
    with pytest.raises(ValueError, match=f"{name} must be a positive integer"):
        rollout(jax.random.key(0), game, f, g, num_episodes, horizon)
