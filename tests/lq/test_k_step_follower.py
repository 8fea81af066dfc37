"""The LQ K-step follower (issue 30): its policy, V^g, the exact references, the trainer (with
the lag follower too: its own tests are in ``test_lag_follower.py``)."""

import pathlib
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from bchg_jax import lq
from bchg_jax.core.follower_model import FollowerModel
from bchg_jax.lq.follower_models import k_step_response, observed_follower, policy_value
from bchg_jax.lq.follower_references import as_if_optimal_hypergradient, k_step_hypergradient
from bchg_jax.problems.thermal import thermal

BETA = 1.0


def _setup():
    prob = thermal(jnp.float64)
    theta = prob.theta0 + 0.3 * jax.random.normal(jax.random.key(0), prob.theta0.shape)
    return prob, theta


@pytest.mark.slow
def test_references_and_value_at_the_best_response(x64):
    """At Proposition 1's best response (Riccati solved to 1e-13): V^g is (P, v) and the
    as-if-optimal reference is the exact hypergradient; K -> infinity steps give the best
    response's gain."""
    prob, theta = _setup()
    br = prob.best_response(theta, BETA, tol=1e-13)
    P, c = policy_value(prob, theta, br, BETA)
    np.testing.assert_allclose(P, br.P, rtol=1e-9)
    np.testing.assert_allclose(c, br.v, rtol=1e-9)
    exact = lq.exact_hypergradient(prob, theta, BETA, tol=1e-13)
    np.testing.assert_allclose(as_if_optimal_hypergradient(prob, theta, br, BETA), exact, 1e-7)
    played, _ = k_step_response(prob, theta, BETA, jnp.zeros((4, 4)), 2000)
    np.testing.assert_allclose(played.K, br.K, atol=1e-9)


@pytest.mark.slow
@pytest.mark.parametrize("K", [1, 3])
def test_k_step_derivative_matches_finite_differences(x64, K):
    prob, theta = _setup()
    P_prev = jnp.asarray(prob.Qbar)

    def J(th):
        played, _ = k_step_response(prob, th, BETA, P_prev, K)
        return lq.leader_objective(prob, th, BETA, br=played)

    grad = np.asarray(k_step_hypergradient(prob, theta, P_prev, BETA, K))
    eps = 1e-6
    fd = [(J(theta.at[i].add(eps)) - J(theta.at[i].add(-eps))) / (2 * eps) for i in range(8)]
    np.testing.assert_allclose(grad, fd, rtol=1e-5, atol=1e-6)
    assert np.abs(grad - np.asarray(lq.exact_hypergradient(prob, theta, BETA))).max() > 1e-2


@pytest.mark.slow
def test_observed_follower_values_the_played_policy(x64):
    """V^g of a K-step policy solves its Bellman expectation equation: Q^g(s, b) averaged over
    b ~ g plus beta H(g) equals V^g(s) (by sampling, 200k actions at 3 states)."""
    prob, theta = _setup()
    played, _ = k_step_response(prob, theta, BETA, jnp.zeros((4, 4)), 2)
    view = observed_follower(prob, theta, played, BETA)
    A, B = prob.A_fn(theta), prob.B_fn(theta)
    s = jax.random.normal(jax.random.key(1), (3, 4))
    b = played.sample(jax.random.key(2), jnp.broadcast_to(s, (200_000, 3, 4)))
    q = lq.soft_q(view, A, B, prob.Qbar, prob.Rbar, prob.U, prob.gamma_F, s, b)
    entropy = -played.log_prob(jnp.broadcast_to(s, b.shape[:-1] + (4,)), b)
    lhs = np.asarray(jnp.mean(q + BETA * entropy, 0))
    np.testing.assert_allclose(lhs, np.asarray(lq.soft_value(view, s)), rtol=2e-3)


@pytest.mark.slow
@pytest.mark.parametrize(
    "model, shrink",
    [(FollowerModel("k_step", steps=2), 0.1), (FollowerModel("lag", mix=0.3), 0.05)],
)
def test_trainer_with_a_follower_off_its_best_response(model, shrink):
    """The thermal trainer with a 2-step learner or a lag follower (mix 0.3: its gap falls by
    0.7 an iteration, behind a moving target): finite J at the played policy, no skipped
    update, its gain gap to the best response shrinking, cos / proj against both references
    recorded."""
    config = lq.TrainConfig(num_episodes=8, iterations=30, follower=model, track_reference=True)
    tr = lq.make_train(thermal(), "bchg", config)
    _, m = jax.jit(tr.train)(jax.random.key(0), lq.HParams(lr=0.1, beta=0.1))
    m = jax.tree.map(np.asarray, m)
    assert np.all(np.isfinite(m["J"])) and np.all(m["update_skipped"] == 0)
    assert m["follower_gap"][-1] < shrink * m["follower_gap"][0]
    for k in ("cos_target", "cos_through"):
        assert np.all(np.abs(m[k]) <= 1 + 1e-5)


def test_lq_refuses_the_tabular_followers():
    with pytest.raises(ValueError, match="the tabular families simulate all of"):
        lq.TrainConfig(follower=FollowerModel("q_learning")).validate()


@pytest.mark.slow
@pytest.mark.parametrize(
    "model", [FollowerModel("k_step", steps=1), FollowerModel("lag", mix=0.3)], ids=str
)
def test_bchg_off_the_best_response_targets_the_as_if_optimal_reference(x64, random_lq, model):
    """Sampling under the K = 1 learner's policy (or the lag follower's, mix 0.3, one step
    from its start) with V^g (what the trainer's estimate step sees), BC-HG with the exact
    leader critic is unbiased for the as-if-optimal reference (measured 0.9 SE over the test's
    4000 batches; lag: 0.97 and 0.20 SE) and far from the reference through the follower's
    next update (89 SE, cosine 0.37; from the state before its reaction, as the trainer once
    took it: 115 SE, cosine -0.84; lag: 18 and 96 SE, cosine 0.58): the LQ counterpart of the
    tabular test (docs/followers.md)."""
    p = random_lq()
    theta, beta = jnp.array([0.3, -0.2]), jnp.asarray(0.3)
    cfg = lq.TrainConfig(num_episodes=4, critic="exact", follower=model)
    trainer = lq.make_train(p, "bchg", cfg)
    steps = trainer.steps
    br = steps["follower"](theta, beta, jnp.asarray(p.Qbar))
    own = trainer.init(jax.random.key(1), lq.HParams(lr=0.1, beta=beta)).follower  # its start
    played, view, after = steps["play"](theta, beta, br, own)
    # "through" starts where the follower's next reaction does: its state after this one
    target, through = (np.asarray(g) for g in steps["references"](theta, beta, played, after))
    est = jax.jit(
        jax.vmap(lambda k: steps["estimate"](k, jax.random.fold_in(k, 7), theta, beta, view, ())[0])
    )
    keys = jax.random.split(jax.random.key(0), 4000)
    g = np.concatenate([np.asarray(est(k)) for k in jnp.split(keys, 2)])
    se = g.std(0) / np.sqrt(len(g))
    assert np.all(np.abs(g.mean(0) - target) < 4 * se), (g.mean(0), target, se)
    assert np.max(np.abs(g.mean(0) - through) / se) > 15, (g.mean(0), through, se)


def test_followers_doc_quotes_the_lq_through_reference_the_trainer_takes(x64, random_lq):
    """docs/followers.md's LQ paragraph gives the cosine between the one-step learner's estimate
    (mean: the as-if-optimal reference) and the reference through its next update. That
    reference starts from the learner's state after its reaction (the trainer's ``references``);
    the docs once quoted the cosine of the one from the state before it (-0.84; now 0.37)."""
    p = random_lq()
    theta, beta = jnp.array([0.3, -0.2]), 0.3
    # as the trainer: the learner's play and its state after it, from P = 0
    played, after = k_step_response(p, theta, beta, jnp.zeros((2, 2)), 1)
    target = np.asarray(as_if_optimal_hypergradient(p, theta, played, beta))
    through = np.asarray(k_step_hypergradient(p, theta, after, beta, 1))
    cos = float(target @ through / np.linalg.norm(target) / np.linalg.norm(through))
    doc = pathlib.Path(__file__).parents[2] / "docs" / "followers.md"
    quoted = re.search(r"SE from the one through the update \(cosine (-?[0-9.]+)", doc.read_text())
    assert quoted, "docs/followers.md no longer quotes the LQ cosine"
    assert abs(float(quoted.group(1)) - cos) < 0.01, (quoted.group(1), cos)


@pytest.mark.slow
def test_a_covariance_that_is_no_covariance_is_refused(x64, random_lq):
    """The as-if-optimal reference checked the played policy's shapes only: ``-cov`` gave a
    finite gradient of no policy, and ``0`` an error that blamed a stable closed loop."""
    p, theta = random_lq(), jnp.array([0.3, -0.2])
    br = p.best_response(theta, 0.3)
    for bad, says in (
        (br._replace(cov=-br.cov), "positive definite"),
        (br._replace(cov=0.0 * br.cov), "positive definite"),
        (br._replace(cov=br.cov.at[0, 1].add(0.5)), "symmetric"),
        (br._replace(K=br.K * jnp.nan), "gain"),
    ):
        with pytest.raises(ValueError, match=says):
            as_if_optimal_hypergradient(p, theta, bad, 0.3)
        with pytest.raises(ValueError, match=says):
            policy_value(p, theta, bad, 0.3)
        for _ in range(2):  # eager, then the cached program's call: br is traced in it
            with pytest.raises(ValueError, match=says):
                lq.leader_objective(p, theta, 0.3, br=bad)
    np.testing.assert_allclose(
        lq.leader_objective(p, theta, 0.3, br=br), lq.leader_objective(p, theta, 0.3), rtol=1e-10
    )


def test_best_response_is_optimal_under_gamma_F_with_distinct_discounts(x64, random_lq):
    """random_lq has gamma_F 0.8 != gamma_L 0.85 (thermal, where the other best-response checks
    run, has them equal): Proposition 1's (P, v) are V^g of the played policy under gamma_F,
    by the Lyapunov equation of policy_value (a Riccati solved with gamma_L: v 0.74 vs 0.28)."""
    p = random_lq()
    th = jnp.array([0.3, -0.2])
    br = p.best_response(th, 0.7, tol=1e-13)
    P, c = policy_value(p, th, br, 0.7)
    np.testing.assert_allclose(np.asarray(br.P), np.asarray(P), rtol=1e-9, atol=1e-12)
    np.testing.assert_allclose(float(br.v), float(c), rtol=1e-9)


def test_k_step_learner_reaches_the_best_response_under_gamma_F(x64, random_lq):
    """random_lq (gamma_F 0.8 != gamma_L 0.85): 500 soft Riccati steps from P = 0 give the best
    response's gain and value, each step and the played gain under gamma_F (the learner's other
    tests run on thermal, whose discounts are equal; gamma_L in any of its three places
    passed)."""
    p = random_lq()
    th = jnp.array([0.3, -0.2])
    br = p.best_response(th, 0.7, tol=1e-13)
    played, P_next = k_step_response(p, th, 0.7, jnp.zeros((2, 2)), 500)
    np.testing.assert_allclose(np.asarray(played.K), np.asarray(br.K), atol=1e-8)
    np.testing.assert_allclose(np.asarray(P_next), np.asarray(br.P), atol=1e-8)
