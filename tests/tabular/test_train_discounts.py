"""The tabular trainer's steps on a problem whose discounts differ (gamma_F 0.5, gamma_L 0.95):
the follower's best response (dense and sparse), a k-step follower's play, the values of the
policy it plays and the leader's values against NumPy written out, and the discount each
sampled learner is handed. Four-Rooms has gamma_F = gamma_L, so a step that used the other
player's discount passed every other test (a sweep of every discount in the trainer found 9)."""

import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from bchg_jax.core.follower_model import FollowerModel
from bchg_jax.problems import random_tabular_cmdp
from bchg_jax.tabular import critics
from bchg_jax.tabular import train as tabular_train
from bchg_jax.tabular.train import HParams, TrainConfig, make_train

GF, GL, BETA = 0.5, 0.95, 0.5


def _problem():
    prob = random_tabular_cmdp(
        jax.random.key(3), 5, 3, gamma_F=GF, gamma_L=GL, time_limit=200, dtype=jnp.float64
    )
    theta = prob.theta0 + 0.3 * jax.random.normal(jax.random.key(1), prob.theta0.shape)
    return prob, theta


def test_trainer_steps_use_each_players_discount(x64):
    prob, theta = _problem()
    P, rF, rL = (
        np.asarray(x)
        for x in (prob.transition(theta), prob.follower_reward(theta), prob.leader_reward(theta))
    )
    S, B = rF.shape
    cont = 1.0 - np.asarray(prob.terminal_mask, float)

    def soft_backup(V):  # Q = r_F + gamma_F cont P V, V = beta logsumexp(Q / beta)
        Q = rF + GF * cont[:, None] * (P @ V)
        m = Q.max(1)
        return Q, m + BETA * np.log(np.exp((Q - m[:, None]) / BETA).sum(1))

    def softmax(Q):
        z = np.exp((Q - Q.max(1, keepdims=True)) / BETA)
        return z / z.sum(1, keepdims=True)

    V = np.zeros(S)
    for _ in range(200):  # gamma_F^200 ~ 6e-61
        Q, V = soft_backup(V)
    best = softmax(Q)
    cfg = TrainConfig(
        num_envs=2, num_steps=10, iterations=1, follower=FollowerModel("k_step", steps=2)
    )
    steps = make_train(prob, "bchg", cfg).steps
    beta = jnp.float64(BETA)
    br = steps["follower"](theta, beta, jnp.zeros(S))
    np.testing.assert_allclose(np.asarray(br.policy), best, atol=1e-6)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the sparse solver on a dense 5-state table
        sparse_cfg = TrainConfig(num_envs=2, num_steps=10, iterations=1, solver="sparse")
        sparse = make_train(prob, "bchg", sparse_cfg).steps
    brs = sparse["follower"](theta, beta, jnp.zeros(S))
    np.testing.assert_allclose(np.asarray(brs.policy), best, atol=1e-5)
    # k = 2 steps: two soft backups from the follower's own values
    V0 = np.linspace(-1.0, 1.0, S)
    Q2, _ = soft_backup(soft_backup(V0)[1])
    played, _ = steps["play"](theta, beta, br, jnp.asarray(V0))
    np.testing.assert_allclose(np.asarray(played), softmax(Q2), atol=1e-8)
    # the follower's values of the policy it plays, and the leader's
    g = 0.5 / B + 0.5 * best
    P_g = np.einsum("sb,sbt->st", g, P)
    V_g = np.linalg.solve(
        np.eye(S) - GF * cont[:, None] * P_g, (g * (rF - BETA * np.log(g))).sum(1)
    )
    np.testing.assert_allclose(
        np.asarray(steps["seen"](theta, beta, jnp.asarray(g), 0).V), V_g, atol=1e-8
    )
    V_L = np.linalg.solve(np.eye(S) - GL * cont[:, None] * P_g, (g * rL).sum(1))
    got = steps["evaluate"](theta, jnp.asarray(g), jnp.zeros(S))[1]
    np.testing.assert_allclose(np.asarray(got), V_L, atol=1e-3)


@pytest.mark.parametrize(
    "method, follower, learner",
    [
        ("bchg", FollowerModel("q_learning", lr=0.5, explore=0.1), "q_learning"),
        ("bchg", None, "sarsa"),
        ("hpgd_mc", None, "monte_carlo"),
    ],
    ids=["q_learning", "sarsa", "monte_carlo"],
)
def test_sampled_learners_get_their_own_discount(x64, monkeypatch, method, follower, learner):
    """The learning follower's soft Q-learning bootstraps with gamma_F; the leader's SARSA and
    Monte Carlo critics discount with gamma_L (recorded as the trainer calls them)."""
    seen = {}

    def spy(name, fn, position):
        def wrapped(*args, **kw):
            seen[name] = float(args[position])
            return fn(*args, **kw)

        return wrapped

    monkeypatch.setattr(
        tabular_train, "q_learning_update", spy("q_learning", tabular_train.q_learning_update, 4)
    )
    monkeypatch.setattr(critics, "sarsa_update", spy("sarsa", critics.sarsa_update, 4))
    monkeypatch.setattr(
        critics, "monte_carlo_critic", spy("monte_carlo", critics.monte_carlo_critic, 2)
    )
    prob, _ = _problem()
    kw = {} if follower is None else dict(follower=follower)
    tr = make_train(prob, method, TrainConfig(num_envs=2, num_steps=10, iterations=1, **kw))
    hp = HParams(lr=0.1, sarsa_alpha=0.5, beta=BETA)
    tr.run(tr.init(jax.random.key(0), hp), hp, 1)
    assert seen[learner] == (GF if learner == "q_learning" else GL), seen
