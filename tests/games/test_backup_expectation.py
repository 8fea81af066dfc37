"""What Theorem 2's estimator targets under each follower backup, in exact expectation.

The expectation of the estimator (Eq. (hg_MG) with the influence sums of Eq. (nablaQF_MG),
V_F(s_k, a_k) - sum_a' f V_F along (f, g), exact critics) is written with linear solves over
the discounted visitation: it is ``exact_hypergradient(..., backup="paper")`` to rounding, and
not ``exact_hypergradient(..., backup="reference")`` (the reference implementation's follower,
the trainer's default). Under the reference backup the derivative of Q_F is the influence of
W(s, a) = sum_b h(b|s) Q_F(s, a, b) along the chain (f, h), h = softmax_b(sum_a f Q_F / beta):
that form is the reference backup's hypergradient (the explanation ``docs/followers.md`` gives).
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from bchg_jax.games.tabular.exact import (
    best_response,
    exact_hypergradient,
    joint_chain,
    leader_values,
)
from bchg_jax.problems.toy_game import toy_game


def policy_fn(theta):
    return jax.nn.softmax(theta, -1)


def expectation(game, theta, beta, backup, corrected=False):
    """E[estimate] with exact critics: Theorem 2's form, or (``corrected``) the influence of W
    along (f, h) of the reference backup. d/dtheta is taken for softmax logits [S, A]."""
    f = policy_fn(theta)
    S, A = f.shape
    br = best_response(game, f, beta, backup)
    g, P = br.policy, jnp.asarray(game.transition)
    V_L, Q_L = leader_values(game, f, g)
    P_fg, _ = joint_chain(game, f, g)
    d_L = jnp.linalg.solve((jnp.eye(S) - game.gamma_L * P_fg).T, jnp.asarray(game.init_dist))
    glog = jnp.eye(S)[:, None, :, None] * (jnp.eye(A)[None, :, None, :] - f[:, None, None, :])
    direct = jnp.einsum("s,sa,sab,sauv->uv", d_L, f, g * (Q_L - V_L[:, None, None]), glog)
    if corrected:
        h = jax.nn.softmax(jnp.einsum("sa,sab->sb", f, br.Q) / beta, -1)
        value, chain = jnp.einsum("sb,sab->sa", h, br.Q), jnp.einsum("sa,sb,sabt->st", f, h, P)
    else:
        value, chain = br.V, P_fg
    adv = value - jnp.sum(f * value, -1, keepdims=True)
    u = jnp.einsum("sa,sa,sauv->suv", f, adv, glog)  # E_a[score x adv] per state
    H = jnp.linalg.solve(jnp.eye(S) - game.gamma_F * chain, u.reshape(S, -1)).reshape(u.shape)
    dQ = game.gamma_F * jnp.einsum("sabt,tuv->sabuv", P, H)  # the k >= 1 terms
    if not corrected:  # the k = 0 term (zero mean against the Benefit)
        dQ = dQ + adv[:, :, None, None, None] * glog[:, :, None]
    ben = Q_L - jnp.sum(g * Q_L, -1, keepdims=True)
    return direct + jnp.einsum("s,sa,sab,sab,sabuv->uv", d_L, f, g, ben, dQ) / beta


def _rel(x, y):
    return float(jnp.linalg.norm(x - y) / jnp.linalg.norm(y))


@pytest.mark.slow
def test_theorem2_estimator_targets_the_paper_backup_not_the_reference_one(x64, backup_game):
    game, beta = backup_game(), 0.1
    theta = jnp.asarray(np.random.default_rng(2).normal(size=(5, 3)))
    paper = exact_hypergradient(policy_fn, theta, game, beta, "paper")
    reference = exact_hypergradient(policy_fn, theta, game, beta, "reference")
    assert _rel(expectation(game, theta, beta, "paper"), paper) < 1e-10
    est = expectation(game, theta, beta, "reference")
    assert _rel(est, reference) > 0.5  # 0.76 measured, cosine 0.66
    assert _rel(expectation(game, theta, beta, "reference", corrected=True), reference) < 1e-10


@pytest.mark.slow
def test_toy_game_gap_under_the_reference_backup(x64):
    """The toy game (R = 2, beta 0.05, gamma 0.99) at p = 0.45: 2.5% (the same direction)."""
    game = toy_game(2.0, dtype=jnp.float64)
    theta = jnp.asarray([[0.0, 0.0], [np.log(0.45), np.log(0.55)], [0.0, 0.0]])
    reference = exact_hypergradient(policy_fn, theta, game, 0.05, "reference")
    paper = exact_hypergradient(policy_fn, theta, game, 0.05, "paper")
    assert _rel(expectation(game, theta, 0.05, "paper"), paper) < 1e-10
    assert 0.01 < _rel(expectation(game, theta, 0.05, "reference"), reference) < 0.05
    corrected = expectation(game, theta, 0.05, "reference", corrected=True)
    assert _rel(corrected, reference) < 1e-10
