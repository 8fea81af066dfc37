"""Follower models off the best response (``tabular.follower_models``) against hand-written
references: the fixed-policy soft value and the observed view with a terminal state, the
Q-learner's visiting order and its bootstrap at a time-limit cut, the K-step learner's recorded
sweep count, and ``policy_gap``."""

import jax.numpy as jnp
import numpy as np

from bchg_jax.tabular import follower_models as fm
from bchg_jax.tabular.rollout import Batch


def _tables(seed=0, S=3, B=2):
    rng = np.random.default_rng(seed)
    P = rng.dirichlet(np.ones(S), size=(S, B))
    r = rng.normal(size=(S, B))
    g = rng.dirichlet(np.ones(B), size=S)
    return P, r, g


def _policy_value_by_hand(P, r, g, beta, gamma, cont):
    S = r.shape[0]
    Pg = np.einsum("sb,sbt->st", g, P)
    rhs = (g * r).sum(-1) - beta * (g * np.log(g)).sum(-1)
    return np.linalg.solve(np.eye(S) - gamma * cont[:, None] * Pg, rhs)


def test_soft_policy_value_stops_at_a_terminal_state(x64):
    """V^g with a terminal state: the continuation zeroes the terminal row's future value
    (V(term) = sum_b g (r - beta log g)), not discounted onward as if non-terminal."""
    P, r, g = _tables()
    beta, gamma = 0.7, 0.9
    cont = np.array([1.0, 0.0, 1.0])
    V = fm.soft_policy_value(*map(jnp.asarray, (P, r, g)), beta, gamma, jnp.asarray(cont))
    ref = _policy_value_by_hand(P, r, g, beta, gamma, cont)
    np.testing.assert_allclose(V, ref, rtol=1e-12)
    np.testing.assert_allclose(V[1], (g[1] * (r[1] - beta * np.log(g[1]))).sum(), rtol=1e-12)


def test_observed_follower_q_uses_the_continuation(x64):
    """The observed view's Q^g = r + gamma cont P V^g: a terminal row's Q is r alone."""
    P, r, g = _tables(1)
    beta, gamma = 0.5, 0.8
    cont = np.array([1.0, 1.0, 0.0])
    view = fm.observed_follower(*map(jnp.asarray, (P, r, g)), beta, gamma, jnp.asarray(cont), 4)
    V = _policy_value_by_hand(P, r, g, beta, gamma, cont)
    Q = r + gamma * cont[:, None] * np.einsum("sbt,t->sb", P, V)
    np.testing.assert_allclose(view.V, V, rtol=1e-12)
    np.testing.assert_allclose(view.Q, Q, rtol=1e-12)
    np.testing.assert_allclose(view.Q[2], r[2], rtol=1e-12)
    np.testing.assert_array_equal(view.policy, g)


def _soft_v(row, beta):
    return beta * np.log(np.exp(np.asarray(row) / beta).sum())


def _q_learning_by_hand(Q, s, b, s2, term, r, beta, gamma, lr):
    """Sequential soft Q-learning, time step by time step, streams in order inside a step."""
    q = np.asarray(Q, float).copy()
    E, T = s.shape
    for t in range(T):
        for e in range(E):
            target = r[s[e, t], b[e, t]]
            if not term[e, t]:
                target += gamma * _soft_v(q[s2[e, t]], beta)
            q[s[e, t], b[e, t]] += lr * (target - q[s[e, t], b[e, t]])
    return q


def test_q_learning_visits_time_steps_in_order(x64):
    """Two streams x two steps that all update Q(0, 0) and read row 0: the result depends on
    the visiting order, which is time order (both streams' step 0, bootstrapping from row 0, then
    both streams' step 1, from row 1), not one stream after the other."""
    Q = jnp.array([[0.3, -0.2], [1.0, 0.5]])
    r = jnp.array([[1.0, 0.0], [0.0, 0.0]])
    s = np.array([[0, 0], [0, 0]])
    b = np.array([[0, 0], [0, 0]])
    s2 = np.array([[0, 1], [0, 1]])
    term = np.zeros((2, 2), bool)
    t = np.array([[0, 1], [0, 1]])
    batch = Batch(*map(jnp.asarray, (s, b, s2, t, term, term)))
    beta, gamma, lr = 0.5, 0.9, 0.6
    out = fm.q_learning_update(Q, batch, r, beta, gamma, lr)
    ref = _q_learning_by_hand(Q, s, b, s2, term, np.asarray(r), beta, gamma, lr)
    np.testing.assert_allclose(out, ref, rtol=1e-12)


def test_q_learning_bootstraps_across_a_time_limit_cut(x64):
    """A step that ends its episode by the time limit (done, not terminal) still bootstraps
    from the soft value of its s_next (the state before the reset)."""
    Q = jnp.arange(6.0).reshape(3, 2) / 4
    r = jnp.ones((3, 2))
    beta, gamma, lr = 0.5, 0.9, 0.5
    batch = Batch(
        s=jnp.array([[1]]),
        b=jnp.array([[0]]),
        s_next=jnp.array([[2]]),
        t=jnp.array([[4]]),
        terminal=jnp.array([[False]]),
        done=jnp.array([[True]]),
    )
    out = np.asarray(fm.q_learning_update(Q, batch, r, beta, gamma, lr))
    q = np.asarray(Q).copy()
    q[1, 0] += lr * (1.0 + gamma * _soft_v(q[2], beta) - q[1, 0])
    np.testing.assert_allclose(out, q, rtol=1e-12)


def test_k_step_response_records_K_sweeps(x64):
    """``k_step_response(...).sweeps`` is K (documented), for K = 1 and 3."""
    P, r, _ = _tables(2)
    for K in (1, 3):
        br = fm.k_step_response(jnp.asarray(P), jnp.asarray(r), 0.5, 0.9, None, jnp.zeros(3), K)
        assert int(br.sweeps) == K


def test_policy_gap_is_the_largest_entry_difference():
    """``policy_gap`` is max |g - g_dagger| over all entries (not a mean)."""
    g = jnp.array([[0.5, 0.5], [0.9, 0.1]])
    best = jnp.array([[0.5, 0.5], [0.6, 0.4]])
    np.testing.assert_allclose(fm.policy_gap(g, best), 0.3, rtol=1e-6)
