"""Float32 Boltzmann policies sum to 1 per row, and the sampler stays inside a row's support.

In float32 ``exp((Q - V) / beta)`` sums to 1 +- 9e-5 per row on Four-Rooms at beta 1e-3 (the
rounding of Q - V, ~|V| eps, over beta); unnormalised, that biased the Benefit baseline
V_L = sum_b g Q_L of a BC-HG estimate by ~9% and let the inverse-CDF draw pick actions of
probability ~0.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from bchg_jax.problems import fourrooms
from bchg_jax.tabular import TrainConfig, exact, make_train, rollout, soft_value_iteration
from bchg_jax.tabular.follower_models import k_step_response
from bchg_jax.tabular.sparse import (
    sparse_soft_value_iteration,
    successors_from_support,
    successors_from_transition,
)

BETA = 1e-3
EPS32 = float(jnp.finfo(jnp.float32).eps)


@pytest.mark.slow
def test_float32_best_responses_sum_to_one_on_fourrooms():
    """Every solver's policy (dense, sparse, the implicitly differentiated reference, the K-step
    learner) sums to 1 within a few float32 ulps at beta 1e-3 (unnormalised: 1 +- 9e-5)."""
    prob = fourrooms(slip_model="paper")
    succ = successors_from_transition(np.asarray(prob.transition(prob.theta0)))
    thetas = jax.random.normal(jax.random.key(0), (3,) + prob.theta0.shape)
    for th in thetas:
        P, r = prob.transition(th), prob.follower_reward(th)
        args = (P, r, BETA, prob.gamma_F)
        policies = {
            "dense": soft_value_iteration(*args, prob.terminal, tol=1e-6, max_sweeps=3000).policy,
            "sparse": sparse_soft_value_iteration(*args, succ, prob.terminal).policy,
            "exact": exact.best_response(prob, th, BETA).policy,
            "k_step": k_step_response(*args, prob.terminal, jnp.zeros(r.shape[0]), 5).policy,
        }
        for name, g in policies.items():
            assert g.dtype == jnp.float32
            err = np.abs(np.asarray(g, np.float64).sum(-1) - 1.0).max()
            assert err <= 4 * EPS32, (name, err)


@pytest.mark.slow
def test_sampler_never_draws_outside_a_row_that_sums_below_one():
    """Rows of the policy, the transition, the successor table and rho_0 whose float32 sum is
    0.99 with a zero last entry: the zero entries are never drawn (before: every uniform above
    the row's sum drew the last entry, ~1% of the draws), and the others keep their ratios."""
    S = B = 3
    policy = jnp.tile(jnp.asarray([0.3, 0.69, 0.0], jnp.float32), (S, 1))
    P = jnp.tile(jnp.asarray([0.5, 0.49, 0.0], jnp.float32), (S, B, 1))
    rho = jnp.asarray([0.6, 0.39, 0.0], jnp.float32)
    assert float(policy.sum(-1)[0]) < 1.0 and float(P.sum(-1)[0, 0]) < 1.0
    full = successors_from_support(np.ones((S, S), bool))  # holds the zero-probability state
    for table in (None, full):
        # traced, as in the trainers (an eager call refuses rows this far off 1, below)
        draw = jax.jit(lambda k, g, p, r: rollout(k, g, p, r, None, 3, 256, 200, successors=table))
        batch = draw(jax.random.key(1), policy, P, rho)
        s, b, s2 = (np.asarray(x).ravel() for x in (batch.s, batch.b, batch.s_next))
        assert (b < 2).all() and (s < 2).all() and (s2 < 2).all()
        # the draws keep the row's proportions (51,200 draws: SE of a frequency ~0.002)
        np.testing.assert_allclose(np.mean(b == 0), 0.3 / 0.99, atol=0.01)
        np.testing.assert_allclose(np.mean(s2 == 0), 0.5 / 0.99, atol=0.01)
        starts = s[np.asarray(batch.t).ravel() == 0]
        np.testing.assert_allclose(np.mean(starts == 0), 0.6 / 0.99, atol=0.02)


@pytest.mark.parametrize("bad", ["logits", "negative", "unnormalised_transition", "init_dist"])
def test_eager_rollout_refuses_tables_that_are_not_distributions(bad):
    """An eager ``rollout`` checks its concrete tables: logits passed as a policy were drawn as
    weights (rows [2, -1]: action 0 every time), unnormalised rows were silently normalised."""
    S = B = 3
    policy = jnp.full((S, B), 1.0 / B)
    P = jnp.full((S, B, S), 1.0 / S)
    rho = jnp.full((S,), 1.0 / S)
    if bad == "logits":
        policy, name = jnp.tile(jnp.asarray([2.0, -1.0, 0.0]), (S, 1)), "policy"
    elif bad == "negative":
        policy, name = policy.at[0].set(jnp.asarray([0.7, -0.2, 0.5])), "policy"
    elif bad == "unnormalised_transition":
        P, name = P.at[1, 2].multiply(0.5), "transition"
    else:
        rho, name = 3 * rho, "init_dist"
    with pytest.raises(ValueError, match=f"{name} must hold probability rows"):
        rollout(jax.random.key(0), policy, P, rho, None, 3, 2, 5)


@pytest.mark.slow
def test_float32_trainer_estimate_agrees_with_float64_on_the_same_batches(x64):
    """The BC-HG estimate of the float32 trainer (``steps["follower"]`` then
    ``steps["estimate"]``, V_L = sum_b g Q_L as with the SARSA critic) on a batch vs the float64
    trainer's on the same batch, Four-Rooms at beta 1e-3, the exact critic Q_L. Measured over
    1000 batches: per-batch relative error median 4.6e-4, mean error 2.6e-6 against a mean
    estimate of norm 4.1e-3; with the unnormalised rows 15% and 8.6e-4 (64 batches: median
    16%, mean error 19% of the mean)."""
    t32, t64 = (
        make_train(fourrooms(slip_model="paper", dtype=d), "bchg", TrainConfig())
        for d in (jnp.float32, jnp.float64)
    )
    prob = t64.problem
    S = prob.num_states
    th64 = jax.random.normal(jax.random.key(0), prob.theta0.shape, jnp.float64)
    th32 = th64.astype(jnp.float32)
    br32 = t32.steps["follower"](th32, jnp.float32(BETA), jnp.zeros(S, jnp.float32))
    br64 = t64.steps["follower"](th64, BETA, jnp.zeros(S))
    _, Q_L = exact.leader_values(prob, th64, br64.policy)

    @jax.jit
    def both(key):
        batch, segments = t64.steps["collect"](key, th64, br64.policy)
        e32 = t32.steps["estimate"](
            th32, jnp.float32(BETA), batch, segments, br32, Q_L.astype(jnp.float32), None
        )
        return e32, t64.steps["estimate"](th64, BETA, batch, segments, br64, Q_L, None)

    e32, e64 = (
        np.asarray(x, np.float64) for x in jax.vmap(both)(jax.random.split(jax.random.key(2), 64))
    )
    rel = np.linalg.norm(e32 - e64, axis=1) / np.linalg.norm(e64, axis=1)
    assert np.median(rel) < 5e-3, np.median(rel)
    bias = np.linalg.norm((e32 - e64).mean(0)) / np.linalg.norm(e64.mean(0))
    assert bias < 1e-2, bias
