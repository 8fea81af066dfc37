"""The parallel forms of the rollout and of the SARSA pass (``parallel=True``,
``TrainConfig.parallel_steps``): the scan's batch bit for bit, the sequential pass's critic up to
rounding, no loop left in either, and clear errors where the form does not apply."""

import dataclasses
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from bchg_jax.core.precision import jaxpr_eqns
from bchg_jax.problems import random_tabular_cmdp
from bchg_jax.problems.fourrooms import fourrooms
from bchg_jax.tabular import critics, rollout
from bchg_jax.tabular.sparse import successors_from_transition
from bchg_jax.tabular.train import HParams, TrainConfig, make_train

LOOPS = {"scan", "while"}


def _step_loops(jaxpr):
    """The loops of ``jaxpr`` other than ``searchsorted``'s binary search over the S = 6 states
    (a scan of 3 trips): a while loop, or a scan of more than 3 trips."""
    return [
        e for e in jaxpr_eqns(jaxpr, LOOPS) if e.primitive.name != "scan" or e.params["length"] > 3
    ]


def _setting(seed, S=6, B=3, terminal=(1, 4)):
    """(policy, transition, init_dist, terminal mask) of a random problem whose streams end
    episodes at terminal states often."""
    prob = random_tabular_cmdp(jax.random.key(seed), num_states=S, num_actions=B)
    th = prob.theta0
    term = np.zeros(S, bool)
    term[list(terminal)] = True
    pol = jax.nn.softmax(2.0 * jax.random.normal(jax.random.key(seed + 100), (S, B)))
    return pol, prob.transition(th), prob.init_dist(th), term


def _both(key, pol, P, rho, term, limit, E, T, successors=None):
    args = (key, pol, P, rho, term, limit, E, T)
    return rollout(*args, successors=successors), rollout(
        *args, successors=successors, parallel=True
    )


@pytest.mark.parametrize(
    "E, T, limit",
    [
        pytest.param(3, 40, None, marks=pytest.mark.slow),
        (2, 25, 25),
        pytest.param(1, 60, 200, marks=pytest.mark.slow),
        (4, 1, None),
    ],
)
def test_the_parallel_rollout_draws_the_scans_batch_bit_for_bit(E, T, limit):
    pol, P, rho, term = _setting(0)
    ends = 0
    for seed in range(4):
        scan, par = _both(jax.random.key(seed), pol, P, rho, term, limit, E, T)
        for name, a, b in zip(scan._fields, scan, par, strict=True):
            assert a.dtype == b.dtype and a.shape == b.shape, name
            np.testing.assert_array_equal(np.asarray(a), np.asarray(b), err_msg=name)
        ends += int(np.sum(np.asarray(scan.done)[:, :-1]))
    if T > 1:
        assert ends > 0  # episodes ended (and streams reset) inside the batches compared


@pytest.mark.slow
def test_the_parallel_rollout_with_a_successor_table_and_a_cut_at_the_last_step():
    """Four-Rooms' sampler through its successor table; 200 steps under the time limit of 200,
    so every stream that never reached the goal is cut at the last step (done there)."""
    prob = fourrooms()
    P = prob.sample_transition(prob.theta0)
    table = successors_from_transition(np.asarray(P))
    pol = jax.nn.softmax(jax.random.normal(jax.random.key(5), (prob.num_states, 4)))
    scan, par = _both(
        jax.random.key(6), pol, P, prob.init_dist(prob.theta0), prob.terminal, 200, 3, 200, table
    )
    for name, a, b in zip(scan._fields, scan, par, strict=True):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b), err_msg=name)
    assert np.asarray(scan.done)[:, -1].any()


def test_neither_parallel_form_holds_a_loop():
    pol, P, rho, term = _setting(1)
    draw = jax.make_jaxpr(lambda k: rollout(k, pol, P, rho, term, None, 2, 30, parallel=True))(
        jax.random.key(0)
    )
    assert not _step_loops(draw)
    batch = rollout(jax.random.key(0), pol, P, rho, term, None, 2, 30)
    Q = jnp.zeros(pol.shape)
    sarsa = jax.make_jaxpr(
        lambda k, q: critics.sarsa_update(k, q, batch, jnp.ones(pol.shape), 0.9, 0.5, True)
    )(jax.random.key(1), Q)
    assert not _step_loops(sarsa)
    # and the scan forms do loop (what the test above would miss if the names were wrong)
    assert jaxpr_eqns(
        jax.make_jaxpr(lambda k: rollout(k, pol, P, rho, term, None, 2, 30))(jax.random.key(0)),
        LOOPS,
    )


def _sequential_sarsa(Q, order, s, b, s2, b2, boot, r, gamma, alpha):
    """Algorithm 2's pass written out in float64, one update after the other."""
    Q = np.array(Q, np.float64)
    for i in order:
        target = r[s[i], b[i]] + gamma * boot[i] * Q[s2[i], b2[i]]
        Q[s[i], b[i]] += alpha * (target - Q[s[i], b[i]])
    return Q


@pytest.mark.parametrize("alpha", [0.05, 0.5, 1.0])
def test_the_triangular_sarsa_pass_is_the_sequential_one(alpha):
    pol, P, rho, term = _setting(2, S=4, B=2, terminal=(3,))
    batch = rollout(jax.random.key(3), pol, P, rho, term, 12, 3, 30)
    assert np.asarray(batch.done).sum() > 3  # terminal and time-limit ends: zero bootstraps
    rL = jax.random.normal(jax.random.key(4), pol.shape)
    Q0 = jax.random.normal(jax.random.key(5), pol.shape)
    key = jax.random.key(6)
    gamma = 0.95
    # the visiting order and the pairs as sarsa_update builds them
    E, T = batch.s.shape
    s, b, d = (np.asarray(x) for x in (batch.s, batch.b, batch.done))
    s2 = np.concatenate([s[:, 1:], s[:, -1:]], 1).ravel()
    b2 = np.concatenate([b[:, 1:], b[:, -1:]], 1).ravel()
    last = np.zeros((E, T), bool)
    last[:, -1] = True
    boot = (~(d | last)).astype(np.float64).ravel()
    order = np.asarray(jax.random.permutation(key, E * T))
    expect = _sequential_sarsa(
        Q0, order, s.ravel(), b.ravel(), s2, b2, boot, np.asarray(rL, np.float64), gamma, alpha
    )
    got = critics.sarsa_update(key, Q0, batch, rL, gamma, alpha, parallel=True)
    scan = critics.sarsa_update(key, Q0, batch, rL, gamma, alpha)
    moved = np.max(np.abs(expect - np.asarray(Q0)))
    assert moved > 0.5  # the pass changed the critic by far more than the tolerance
    np.testing.assert_allclose(np.asarray(got), expect, rtol=0, atol=2e-5 * (1 + moved))
    np.testing.assert_allclose(np.asarray(scan), expect, rtol=0, atol=2e-5 * (1 + moved))


@pytest.mark.slow
@pytest.mark.parametrize("method", ["bchg", "hpgd_oracle"])
def test_a_parallel_trainer_follows_the_scan_trainer(method):
    """Four-Rooms, 40 iterations: the same J up to float rounding (the batches are the same; the
    SARSA critic differs by rounding, which the leader's updates carry on)."""
    prob = fourrooms()
    base = TrainConfig(num_steps=100, iterations=40, oracle_envs=4)
    out = []
    for parallel in (False, True):
        trainer = make_train(prob, method, dataclasses.replace(base, parallel_steps=parallel))
        _, m = jax.jit(trainer.train)(jax.random.key(0), HParams())
        out.append({k: np.asarray(v) for k, v in m.items()})
    scan, par = out
    assert scan["solve_capped"].sum() == par["solve_capped"].sum() == 0
    assert np.ptp(scan["J"]) > 1e-4  # the leader moved
    np.testing.assert_allclose(par["J"], scan["J"], rtol=2e-5, atol=0)
    np.testing.assert_allclose(par["grad_norm"], scan["grad_norm"], rtol=1e-3, atol=1e-6)


def test_the_parallel_forms_say_where_they_do_not_apply():
    pol, P, rho, term = _setting(3)
    with pytest.raises(ValueError, match="time_limit 20 < num_steps 30"):
        rollout(jax.random.key(0), pol, P, rho, term, 20, 1, 30, parallel=True)
    with pytest.raises(ValueError, match="parallel_steps must be True or False"):
        TrainConfig(parallel_steps=1).validate()
    prob = random_tabular_cmdp(jax.random.key(0), num_states=4, num_actions=2, time_limit=50)
    with pytest.raises(ValueError, match="time_limit 50 < num_steps 100"):
        make_train(prob, "bchg", TrainConfig(num_steps=100, parallel_steps=True))
    make_train(prob, "bchg", TrainConfig(num_steps=50, parallel_steps=True))  # at the limit
    make_train(prob, "exact", TrainConfig(num_steps=100, parallel_steps=True))  # draws no batch
    with pytest.raises(ValueError, match="time_limit 50 < num_steps 200"):  # the oracle's
        make_train(prob, "hpgd_oracle", TrainConfig(num_steps=50, parallel_steps=True))


@pytest.mark.slow
def test_both_passes_round_a_wider_reward_into_the_critics_dtype():
    """A float64 leader reward with a float32 critic (x64 on): both forms round it into the
    critic's dtype first (the solve had refused the mixed dtypes; the scan's scatter had cast
    them with JAX's FutureWarning that this will become an error)."""
    with jax.enable_x64(True), warnings.catch_warnings():
        warnings.simplefilter("error", FutureWarning)
        pol, P, rho, term = _setting(4, S=4, B=2, terminal=(2,))
        batch = rollout(jax.random.key(1), pol, P, rho, term, None, 2, 20)
        Q0 = jax.random.normal(jax.random.key(2), pol.shape, jnp.float32)
        rL = jax.random.normal(jax.random.key(3), pol.shape, jnp.float64)
        got = critics.sarsa_update(jax.random.key(4), Q0, batch, rL, 0.9, 0.5, parallel=True)
        scan = critics.sarsa_update(jax.random.key(4), Q0, batch, rL, 0.9, 0.5)
        assert got.dtype == scan.dtype == jnp.float32
        np.testing.assert_allclose(np.asarray(got), np.asarray(scan), rtol=0, atol=1e-5)
