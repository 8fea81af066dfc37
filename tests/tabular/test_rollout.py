"""Rollouts: auto-reset, time index, done flags, sampling frequencies."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from bchg_jax.problems import random_tabular_cmdp
from bchg_jax.tabular import rollout


@pytest.mark.slow
def test_time_index_resets_and_done_flags():
    prob = random_tabular_cmdp(jax.random.key(0), num_states=4, num_actions=2)
    th = prob.theta0
    term = np.array([False, False, False, True])
    pol = jnp.full((4, 2), 0.5)
    b = rollout(jax.random.key(1), pol, prob.transition(th), prob.init_dist(th), term, 7, 3, 50)
    s, t, done, terminal = map(np.asarray, (b.s, b.t, b.done, b.terminal))
    assert s.shape == (3, 50)
    np.testing.assert_array_equal(terminal, term[s])
    np.testing.assert_array_equal(done, terminal | (t + 1 >= 7))
    assert np.all(t[:, 0] == 0)
    # after a done step the next step starts a new episode, otherwise the clock ticks and the
    # next state is the sampled s_next
    nxt_t, nxt_s = t[:, 1:], s[:, 1:]
    np.testing.assert_array_equal(nxt_t, np.where(done[:, :-1], 0, t[:, :-1] + 1))
    np.testing.assert_array_equal(nxt_s[~done[:, :-1]], np.asarray(b.s_next)[:, :-1][~done[:, :-1]])
    assert done.any() and terminal.any()


@pytest.mark.slow
def test_empirical_frequencies_match_policy_and_transitions():
    prob = random_tabular_cmdp(jax.random.key(2), num_states=3, num_actions=2)
    th = prob.theta0
    P = np.asarray(prob.transition(th))
    pol = jnp.asarray([[0.2, 0.8], [0.6, 0.4], [0.5, 0.5]])
    b = rollout(jax.random.key(3), pol, jnp.asarray(P), prob.init_dist(th), None, None, 64, 500)
    s, a, s2 = (np.asarray(x).ravel() for x in (b.s, b.b, b.s_next))
    for st in range(3):
        m = s == st
        assert abs((a[m] == 1).mean() - float(pol[st, 1])) < 0.03
        for act in range(2):
            mm = m & (a == act)
            freq = np.bincount(s2[mm], minlength=3) / mm.sum()
            np.testing.assert_allclose(freq, P[st, act], atol=0.04)


def test_streams_start_from_init_dist():
    prob = random_tabular_cmdp(jax.random.key(4), num_states=4, num_actions=2)
    th = prob.theta0
    rho = np.asarray(prob.init_dist(th))
    b = rollout(
        jax.random.key(5),
        jnp.full((4, 2), 0.5),
        prob.transition(th),
        jnp.asarray(rho),
        None,
        1,
        4000,
        1,
    )
    np.testing.assert_allclose(
        np.bincount(np.asarray(b.s).ravel(), minlength=4) / 4000, rho, atol=0.03
    )


@pytest.mark.slow
def test_a_successor_table_that_misses_the_support_is_refused():
    # from state 0, half the mass goes to state 2, which the table does not list: the draw was
    # made from the truncated row renormalised (state 2 never visited) without a word
    from bchg_jax.tabular.sparse import successors_from_support, successors_from_transition

    P = np.zeros((3, 1, 3), np.float32)
    P[0, 0] = [0.5, 0.0, 0.5]
    P[1, 0] = [0.0, 1.0, 0.0]
    P[2, 0] = [1.0, 0.0, 0.0]
    support = np.any(P > 0, axis=1)  # [S, S']
    support[0, 2], support[0, 1] = False, True
    args = (jax.random.key(0), jnp.ones((3, 1)), jnp.asarray(P), jnp.ones(3) / 3, None, None, 4, 20)
    with pytest.raises(ValueError, match="outside the successor table"):
        rollout(*args, successors=successors_from_support(support))
    batch = rollout(*args, successors=successors_from_transition(P))  # the right table is taken
    assert np.any(np.asarray(batch.s) == 2)
    # a NumPy float64 table with x64 off is computed in float32: its rounding is not lost mass
    rng = np.random.default_rng(0)
    P64 = np.zeros((60, 1, 60))
    for s in range(60):
        P64[s, 0, (s + np.arange(7)) % 60] = rng.dirichlet(np.ones(7))
    table = successors_from_transition(P64)
    rollout(jax.random.key(0), jnp.ones((60, 1)), P64, np.ones(60) / 60, None, None, 2, 5, table)


@pytest.mark.parametrize(
    "end,parallel", [("terminal", False), ("terminal", True), ("time_limit", False)]
)
def test_every_reset_is_drawn_from_init_dist(end, parallel):
    """After every episode end (a terminal state, or the time limit) the stream restarts from
    rho_0, not only at step 0: every transition goes to state 3 (terminal, or an absorbing
    non-terminal state under a time limit of 2), so the state after each done step must be
    rho_0-distributed (4 SE per state)."""
    rho = np.array([0.55, 0.3, 0.1, 0.05])
    P = np.zeros((4, 2, 4))
    P[:, :, 3] = 1.0
    term = np.array([False, False, False, end == "terminal"])
    limit = 2 if end == "time_limit" else None
    b = rollout(
        jax.random.key(5),
        jnp.full((4, 2), 0.5),
        jnp.asarray(P),
        jnp.asarray(rho),
        term,
        limit,
        500,
        40,
        parallel=parallel,
    )
    done, s = np.asarray(b.done), np.asarray(b.s)
    after = s[:, 1:][done[:, :-1]]
    assert after.size > 5000
    freq = np.bincount(after, minlength=4) / after.size
    se = np.sqrt(rho * (1 - rho) / after.size)
    assert np.all(np.abs(freq - rho) < 4 * se), (freq, rho)
