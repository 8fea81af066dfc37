"""Eager calls of the exact references run as one cached program (``core.eager``): a user's
Python loop of exact gradients compiled 5 programs per call (~1 s each) and ran out of memory
mappings after a few hundred calls; now it compiles once, gives the plain call's numbers and
keeps every error the plain call raises."""

import logging

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from bchg_jax import lq, tabular
from bchg_jax.core.eager import cached_when_eager
from bchg_jax.problems import random_tabular_cmdp


def _lq_problem():
    return lq.LQConfigurableMDP(
        A_fn=lambda th: jnp.array([[1.0 + 0.1 * th[0], 0.2], [0.0, 0.95]]),
        B_fn=lambda th: jnp.array([[0.5], [0.3]]),
        U=0.3 * jnp.eye(2),
        Qbar=jnp.eye(2),
        Rbar=jnp.array([[0.5]]),
        leader_quadratic=lambda th: (jnp.eye(2), jnp.array([[0.1]]), 0.0),
        init_cov=jnp.eye(2),
        gamma_F=0.9,
        gamma_L=0.9,
        theta0=jnp.array([0.3]),
    )


class _Compiles(logging.Handler):
    def __init__(self):
        super().__init__()
        self.count = 0

    def emit(self, record):
        self.count += "Finished XLA compilation" in record.getMessage()


def _compiles(call) -> int:
    handler = _Compiles()
    logger = logging.getLogger("jax")
    logger.addHandler(handler)
    try:
        with jax.log_compiles(True):
            call()
    finally:
        logger.removeHandler(handler)
    return handler.count


@pytest.mark.parametrize("family", ["lq", "tabular"])
def test_a_loop_of_eager_exact_calls_compiles_once_and_matches_the_plain_call(family):
    if family == "lq":
        p = _lq_problem()
        fns = (lq.exact_hypergradient, lq.leader_objective, lq.best_response)
    else:
        p = random_tabular_cmdp(jax.random.key(0), num_states=5, num_actions=3)
        fns = (tabular.exact_hypergradient, tabular.leader_objective, tabular.best_response)
    thetas = [p.theta0 + 0.01 * i for i in range(1, 4)]
    for fn in fns:
        assert fn.cached_when_eager
        fn(p, p.theta0, 0.1)  # the first call compiles
        later = _compiles(lambda fn=fn: [fn(p, theta, 0.1) for theta in thetas])
        assert later == 0, (fn.__name__, later)  # the plain calls compiled 2-5 programs each
        theta = p.theta0 + 0.02
        got, plain = fn(p, theta, 0.1), fn.__wrapped__(p, theta, 0.1)
        for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(plain), strict=True):
            np.testing.assert_allclose(a, b, rtol=2e-5, atol=1e-6)  # float32 rounding


def test_eager_cached_calls_keep_the_plain_calls_errors():
    p = _lq_problem()
    with pytest.raises(ValueError, match="beta"):  # a static argument: checked while traced
        lq.exact_hypergradient(p, p.theta0, -1.0)
    with pytest.raises(ValueError, match="theta must be finite"):  # NaN result: the plain call
        lq.exact_hypergradient(p, p.theta0 * np.nan, 0.1)
    q = random_tabular_cmdp(jax.random.key(0), num_states=5, num_actions=3)
    with pytest.raises(ValueError, match="missed its tolerance"):
        tabular.best_response(q, q.theta0, 0.1, newton_iters=0, polish_sweeps=1)
    # a theta at which the problem's tables are not distributions: the eager precheck
    bad = tabular.TabularCMDP(
        transition=lambda th: jnp.full((2, 1, 2), 0.5) * th[0],
        init_dist=lambda th: jnp.array([0.5, 0.5]),
        follower_reward=lambda th: jnp.zeros((2, 1)),
        leader_reward=lambda th: jnp.zeros((2, 1)) + th[0],
        gamma_F=0.9,
        gamma_L=0.9,
        theta0=jnp.array([1.0]),
    )
    tabular.leader_objective(bad, bad.theta0, 0.1)
    with pytest.raises(ValueError, match="transition"):
        tabular.leader_objective(bad, bad.theta0 * 0.9, 0.1)


def test_traced_calls_run_as_written_and_differentiate():
    p = _lq_problem()
    g = jax.jit(jax.grad(lambda t: lq.leader_objective(p, t, 0.1)))(p.theta0)
    np.testing.assert_allclose(g, lq.exact_hypergradient(p, p.theta0, 0.1), rtol=1e-5)
    grads = jax.jit(jax.vmap(lambda t: lq.exact_hypergradient(p, t, 0.1)))
    np.testing.assert_allclose(grads(p.theta0 + jnp.zeros((3, 1)))[1], g, rtol=1e-5)
    # concrete arguments closed over by the caller's jit: the function runs inside that trace
    assert np.isfinite(float(jax.jit(lambda: lq.leader_objective(p, p.theta0, 0.1))()))


def test_a_function_that_reads_a_traced_value_falls_back_to_the_plain_call():
    calls = []

    @cached_when_eager()
    def host_reader(x, scale):
        calls.append(1)
        return np.asarray(x) * float(scale)  # a host read: not traceable

    np.testing.assert_allclose(host_reader(jnp.ones(3), 2.0), 2.0)
    np.testing.assert_allclose(host_reader(jnp.ones(3), 3.0), 3.0)
    assert len(calls) == 3  # one failed trace, then the plain calls


def test_cached_float32_calls_still_warn_of_rounded_logits():
    """The plain eager calls warn when float32 rounds the soft policy's logits (a concrete Q);
    inside the cached program Q is traced, so the warning is given after it, on every call."""
    from small_problems import tied_cmdp

    theta = jnp.asarray([0.1, 0.2], jnp.float32)
    problem = tied_cmdp(1e3, 1e-4, jnp.float32)
    for fn in (tabular.best_response, tabular.leader_objective):
        for _ in range(2):  # the second call is the cached program's
            with pytest.warns(UserWarning, match="logits Q / beta are rounded"):
                fn(problem, theta, 1e-4)


def test_a_numpy_table_changed_in_place_is_not_served_from_the_cache():
    """The cached program bakes in the problem's tables: a NumPy array the user changes in place
    between two calls (closed over by a table function, or a field) must give the new answer."""
    rng = np.random.default_rng(0)
    P = rng.dirichlet(np.ones(4), size=(4, 2)).astype(np.float32)
    problem = tabular.TabularCMDP(
        transition=lambda th: jnp.asarray(P),
        init_dist=lambda th: jnp.full(4, 0.25),
        follower_reward=lambda th: jnp.zeros((4, 2)) + th[0],
        leader_reward=lambda th: jnp.arange(8.0).reshape(4, 2) * th[1],
        gamma_F=0.9,
        gamma_L=0.9,
        theta0=jnp.array([0.1, 1.0]),
    )
    before = tabular.leader_objective(problem, problem.theta0, 0.5)
    P[:] = P[::-1]  # in place
    after = tabular.leader_objective(problem, problem.theta0, 0.5)
    plain = tabular.leader_objective.__wrapped__(problem, problem.theta0, 0.5)
    assert abs(float(after) - float(before)) > 1e-3
    np.testing.assert_allclose(after, plain, rtol=1e-5)
    p = _lq_problem()
    U = np.asarray(p.U).copy()
    q = lq.LQConfigurableMDP(
        **{
            **{f: getattr(p, f) for f in ("A_fn", "B_fn", "Qbar")},
            "U": U,
            **{
                f: getattr(p, f)
                for f in ("Rbar", "leader_quadratic", "init_cov", "gamma_F", "gamma_L", "theta0")
            },
        }
    )
    j0 = lq.leader_objective(q, q.theta0, 0.1)
    U *= 2.0
    np.testing.assert_allclose(
        lq.leader_objective(q, q.theta0, 0.1), lq.leader_objective.__wrapped__(q, q.theta0, 0.1)
    )
    assert abs(float(lq.leader_objective(q, q.theta0, 0.1)) - float(j0)) > 1e-6
