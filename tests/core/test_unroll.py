"""core.unroll: the steps per trip of the Four-Rooms chains (rollout, SARSA pass) come from
BCHG_SCAN_UNROLL when set, and any value gives the same batch and critic bit for bit."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from bchg_jax.core import unroll
from bchg_jax.problems.fourrooms import fourrooms
from bchg_jax.tabular import exact
from bchg_jax.tabular.critics import sarsa_update
from bchg_jax.tabular.rollout import rollout


def test_default_and_environment(monkeypatch):
    monkeypatch.delenv(unroll.ENV_VAR, raising=False)
    assert unroll.scan_unroll() == unroll.DEFAULT_UNROLL == 4
    monkeypatch.setenv(unroll.ENV_VAR, "25")
    assert unroll.scan_unroll() == 25
    for bad in ("0", "-1", "4.0", "four", ""):
        monkeypatch.setenv(unroll.ENV_VAR, bad)
        with pytest.raises(ValueError, match="BCHG_SCAN_UNROLL must be a positive integer"):
            unroll.scan_unroll()


@pytest.mark.slow
def test_any_unroll_gives_the_same_batch_and_critic(monkeypatch):
    prob = fourrooms()
    th = prob.theta0
    br = exact.best_response(prob, th, 1e-3)
    P, rho, rL = prob.transition(th), prob.init_dist(th), prob.leader_reward(th)
    term, limit = prob.terminal, prob.time_limit

    def make_chain():  # a new function per value: the knob is read when it is traced
        def chain(key):
            k1, k2 = jax.random.split(key)
            batch = rollout(k1, br.policy, P, rho, term, limit, 3, 100)
            return batch, sarsa_update(k2, jnp.zeros_like(rL), batch, rL, prob.gamma_L, 0.5)

        return chain

    out = {}
    for k in (1, 4, 25):
        monkeypatch.setenv(unroll.ENV_VAR, str(k))
        chain = make_chain()
        out[k] = jax.jit(chain)(jax.random.key(0))
        jaxpr = jax.make_jaxpr(chain)(jax.random.key(0)).jaxpr
        unrolls = [e.params["unroll"] for e in jaxpr.eqns if e.primitive.name == "scan"]
        assert unrolls == [k, k]  # the rollout's scan and the SARSA pass's
    assert np.any(np.asarray(out[1][1]) != 0)  # the pass moved the critic
    for k in (4, 25):
        for a, b in zip(jax.tree.leaves(out[1]), jax.tree.leaves(out[k]), strict=True):
            np.testing.assert_array_equal(a, b)
