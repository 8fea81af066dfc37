"""Eager calls of the exact references run as one cached program (``core.eager``): a user's
Python loop of exact gradients compiled 5 programs per call (~1 s each) and ran out of memory
mappings after a few hundred calls; now it compiles once, gives the plain call's numbers and
keeps every error the plain call raises."""

import dataclasses
import gc
import warnings
import weakref

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from compile_count import compiles as _compiles

from bchg_jax import lq, tabular
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


@pytest.mark.slow
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
        for _ in range(3):  # the first is the plain call, the second compiles the program
            fn(p, p.theta0, 0.1)  # (and the third its float32 warning's best response)
        later = _compiles(lambda fn=fn: [fn(p, theta, 0.1) for theta in thetas])
        assert later == 0, (fn.__name__, later)  # the plain calls compiled 2-5 programs each
        theta = p.theta0 + 0.02
        got, plain = fn(p, theta, 0.1), fn.__wrapped__(p, theta, 0.1)
        for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(plain), strict=True):
            np.testing.assert_allclose(a, b, rtol=2e-5, atol=1e-6)  # float32 rounding


@pytest.mark.slow
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


@pytest.mark.slow
def test_an_eager_beta_sweep_compiles_once_and_keeps_betas_checks():
    """beta was a static argument: each value of a sweep compiled a program of its own (a 6-state
    exact hypergradient: ~1 s and ~340 memory mappings per value, so a few hundred betas reached
    the mapping limit). It is traced now, checked eagerly first."""
    p = random_tabular_cmdp(jax.random.key(0), num_states=5, num_actions=3)
    q = _lq_problem()
    P, r = p.transition(p.theta0), p.follower_reward(p.theta0)
    calls = (
        lambda b: tabular.exact_hypergradient(p, p.theta0, b),
        lambda b: lq.exact_hypergradient(q, q.theta0, b),
        lambda b: tabular.soft_value_iteration(P, r, b, p.gamma_F),
    )
    betas = [0.2, 0.3, np.float32(0.4), jnp.asarray(0.5, jnp.float32)]
    for call in calls:
        call(0.1), call(np.float32(0.1))  # a weak and a strong type: a program each
        assert _compiles(lambda call=call: [call(b) for b in betas]) == 0
    with warnings.catch_warnings():  # NumPy float64 betas warned of truncation at every call
        warnings.simplefilter("error")
        for call in calls:
            [call(b) for b in np.linspace(0.2, 0.4, 3)]
    assert np.all(np.isfinite(lq.best_response(q, q.theta0, 2**31).K))  # overflowed as int32
    for fn, args in (
        (tabular.exact_hypergradient, (p, p.theta0)),
        (lq.exact_hypergradient, (q, q.theta0)),
    ):
        got, plain = fn(*args, 0.3), fn.__wrapped__(*args, 0.3)
        np.testing.assert_allclose(got, plain, rtol=2e-5, atol=1e-6 * np.abs(plain).max())
        for bad in (0.0, -1.0, float("nan"), np.inf, "0.5", [0.5]):
            with pytest.raises(ValueError, match="beta"):
                fn(*args, bad)


@pytest.mark.slow
def test_traced_calls_run_as_written_and_differentiate():
    p = _lq_problem()
    g = jax.jit(jax.grad(lambda t: lq.leader_objective(p, t, 0.1)))(p.theta0)
    np.testing.assert_allclose(g, lq.exact_hypergradient(p, p.theta0, 0.1), rtol=1e-5)
    grads = jax.jit(jax.vmap(lambda t: lq.exact_hypergradient(p, t, 0.1)))
    np.testing.assert_allclose(grads(p.theta0 + jnp.zeros((3, 1)))[1], g, rtol=1e-5)
    # concrete arguments closed over by the caller's jit: the function runs inside that trace
    assert np.isfinite(float(jax.jit(lambda: lq.leader_objective(p, p.theta0, 0.1))()))


@pytest.mark.slow
def test_a_problem_whose_functions_read_a_traced_value_falls_back_alone():
    """A table function that reads theta on the host cannot be traced: that problem is called
    plainly from then on, and another problem is still served by the cached program."""
    reads = []

    def host_reward(th):
        reads.append(1)
        return jnp.zeros((5, 3)) + float(th[0])  # a host read

    q = random_tabular_cmdp(jax.random.key(0), num_states=5, num_actions=3)
    host = dataclasses.replace(q, follower_reward=host_reward)
    for _ in range(3):
        tabular.leader_objective(host, host.theta0, 0.1)
    np.testing.assert_allclose(
        tabular.leader_objective(host, host.theta0, 0.1),
        tabular.leader_objective.__wrapped__(host, host.theta0, 0.1),
        rtol=1e-6,
    )
    for _ in range(3):
        tabular.leader_objective(q, q.theta0, 0.1)
    theta = q.theta0 + 0.01
    assert _compiles(lambda: tabular.leader_objective(q, theta, 0.1)) == 0


def test_a_0d_theta_is_traced_and_python_numbers_keep_their_type():
    """A 0-d theta was a static argument (a compile per value: a gradient loop compiled every
    step); horizon=True shared the key of horizon=1 and skipped the plain call's error."""
    R = jnp.arange(15.0).reshape(5, 3) / 15
    P = jax.nn.softmax(jnp.asarray(np.random.default_rng(0).normal(size=(5, 3, 5))), -1)
    q0 = tabular.TabularCMDP(
        transition=lambda th: P,
        init_dist=lambda th: jnp.full(5, 0.2),
        follower_reward=lambda th: R * th,
        leader_reward=lambda th: R + th,
        gamma_F=0.9,
        gamma_L=0.9,
        theta0=jnp.asarray(0.5),
    )
    for _ in range(3):
        tabular.exact_hypergradient(q0, q0.theta0, 0.1)
    steps = [q0.theta0 + 0.01 * i for i in range(1, 4)]
    assert _compiles(lambda: [tabular.exact_hypergradient(q0, t, 0.1) for t in steps]) == 0
    p = _lq_problem()
    for _ in range(2):
        lq.leader_objective(p, p.theta0, 0.1, 1)
    for bad in (True, 1.0):
        with pytest.raises(ValueError, match="horizon"):
            lq.leader_objective(p, p.theta0, 0.1, bad)


@pytest.mark.slow
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
    # the lag follower's reference solves a best response inside (it gave no warning cached)
    previous = jnp.full((3, 2), 0.5, jnp.float32)
    for _ in range(2):
        with pytest.warns(UserWarning, match="logits Q / beta are rounded"):
            tabular.lag_hypergradient(problem, theta, previous, 1e-4, 0.5, tol=None)


@pytest.mark.slow
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
    tabular.leader_objective(problem, problem.theta0, 0.5)  # compiled now
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
    lq.leader_objective(q, q.theta0, 0.1)
    U *= 2.0
    np.testing.assert_allclose(
        lq.leader_objective(q, q.theta0, 0.1), lq.leader_objective.__wrapped__(q, q.theta0, 0.1)
    )
    assert abs(float(lq.leader_objective(q, q.theta0, 0.1)) - float(j0)) > 1e-6


@pytest.mark.slow
def test_a_table_that_hides_its_array_at_theta0_is_still_seen():
    """The digest evaluated the tables at theta0 only: with theta0 = 0, A0 + theta[0] D does not
    show D, and an in-place change of D served the stale program."""
    D = np.array([[0.1, 0.0], [0.0, 0.0]], np.float32)
    base = _lq_problem()
    p = dataclasses.replace(
        base,
        theta0=jnp.zeros(1),
        A_fn=lambda th: jnp.array([[1.0, 0.2], [0.0, 0.95]]) + th[0] * jnp.asarray(D),
    )
    th = jnp.array([0.3])
    lq.leader_objective(p, th, 0.1)
    lq.leader_objective(p, th, 0.1)
    D[0, 0] = 0.2
    np.testing.assert_allclose(
        lq.leader_objective(p, th, 0.1), lq.leader_objective.__wrapped__(p, th, 0.1), rtol=1e-6
    )


@pytest.mark.slow
def test_cached_calls_repeat_the_long_horizon_warning():
    q = dataclasses.replace(
        random_tabular_cmdp(jax.random.key(0), num_states=5, num_actions=3),
        gamma_F=0.995,
        gamma_L=0.995,
    )
    for _ in range(3):
        with pytest.warns(UserWarning, match="discount"):
            tabular.exact_hypergradient(q, q.theta0, 0.1)


@pytest.mark.slow
def test_problems_called_repeatedly_are_freed_with_their_programs():
    """The shared program's jit cache held every problem object called twice (a static
    argument), and the keys of the problems called once held them too (the values of a weak
    dictionary): a loop over many problems kept them all, with their compiled programs. Each
    problem now has its own program, which holds it weakly."""

    def use(seed):
        q = random_tabular_cmdp(jax.random.key(seed), num_states=4, num_actions=2)
        for i in range(3):
            tabular.exact_hypergradient(q, q.theta0 + 0.01 * i, 0.1)
        p = dataclasses.replace(_lq_problem(), gamma_F=0.8 + 0.01 * seed)
        for _ in range(3):
            lq.leader_objective(p, p.theta0, 0.1)
        return weakref.ref(q), weakref.ref(p)

    refs = [r for seed in range(3) for r in use(seed)]
    gc.collect()
    assert [r() is None for r in refs] == [True] * len(refs)


@pytest.mark.skipif(jax.config.jax_enable_x64, reason="float64 is available")
@pytest.mark.slow
def test_a_float64_numpy_theta_is_still_said_to_be_truncated():
    """With float64 off the plain call's operations warn that a NumPy float64 theta is
    truncated to float32; ``jit`` truncates its arguments silently, so the cached call said
    nothing."""
    p = _lq_problem()
    theta = np.array([0.3])
    for _ in range(2):
        with pytest.warns(UserWarning, match="float64 requested in asarray is not available"):
            lq.leader_objective(p, theta, 0.1)


def test_a_scalar_theta_of_an_lq_problem_is_refused_by_name():
    """An LQ theta is one vector [d]: a Python float (with a 0-d theta0, which validate()
    refuses) failed in the plain call with "'float' object has no attribute 'dtype'" and
    passed in the cached program, where it is traced."""
    p = dataclasses.replace(_lq_problem(), theta0=jnp.asarray(0.3))
    for fn in (lq.leader_objective, lq.best_response, lq.leader_objective.__wrapped__):
        for theta in (0.3, jnp.asarray(0.3)):
            with pytest.raises(ValueError, match="theta must be one array of 1 axis"):
                fn(p, theta, 0.5)


def test_an_integer_beta_beyond_int32_is_its_float():
    """A Python int beta is a float to the cached call as to the plain one: 2**33 (finite and >
    0) overflowed int32 in the float32 logit-rounding check run after the cached program (the
    plain call, under ``jax.disable_jit``, gave the float's 2.9e-10)."""
    from small_problems import cmdp

    problem = cmdp(
        follower_reward=lambda th: jnp.zeros((3, 2)) + th[0] * jnp.arange(2),
        leader_reward=lambda th: jnp.ones((3, 2)) * jnp.arange(2),
    )
    theta = jnp.array([0.5])
    got = tabular.exact_hypergradient(problem, theta, 2**33)
    want = tabular.exact_hypergradient(problem, theta, float(2**33))
    np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=1e-6, atol=0)


@dataclasses.dataclass(frozen=True, eq=False)  # hashed by identity, as the problems
class _Toy:
    theta0: jax.Array


def test_a_partly_broken_cached_result_gives_the_plain_calls_error():
    """A cached result with any non-finite entry, or any False ``converged`` flag, is recomputed
    by the plain call, which raises the error it stands for: the cached program's partly broken
    answer ([x, inf]; flags [True, False]) is never returned."""
    from typing import NamedTuple

    from bchg_jax.core.eager import cached_when_eager
    from bchg_jax.core.validate import is_concrete

    class Solved(NamedTuple):
        value: jax.Array
        converged: jax.Array

    @cached_when_eager()
    def one_entry_infinite(problem, theta):
        out = jnp.stack([theta[0], theta[0] / 0.0])
        if is_concrete(theta) and not bool(jnp.all(jnp.isfinite(out))):
            raise ValueError("non-finite values")
        return out

    @cached_when_eager()
    def one_solve_unconverged(problem, theta):
        flags = jnp.stack([theta[0] > -1.0, theta[0] > 1.0])
        if is_concrete(theta) and not bool(jnp.all(flags)):
            raise ValueError("did not converge")
        return Solved(theta * 2.0, flags)

    toy, theta = _Toy(jnp.zeros(1)), jnp.array([0.5])
    for _ in range(2):  # the first call (traced now) and a cached one
        with pytest.raises(ValueError, match="non-finite values"):
            one_entry_infinite(toy, theta)
        with pytest.raises(ValueError, match="did not converge"):
            one_solve_unconverged(toy, theta)


def test_warnings_replay_per_static_value_and_array_arguments_are_traced():
    """A cached program's warnings are replayed only for calls with its key (a static discount
    of 0.5 does not repeat 0.999's), and array arguments of one axis or more are traced: new
    values reuse the one program (a static array compiled one per value)."""
    from bchg_jax.core.eager import cached_when_eager
    from bchg_jax.core.validate import warn_float32_long_horizon

    traces = []

    @cached_when_eager()
    def discounted(problem, theta, gamma):
        warn_float32_long_horizon("toy", theta.dtype, gamma)
        return theta * gamma

    @cached_when_eager()
    def scaled(problem, theta, weights):
        traces.append(1)  # runs only when the program is traced
        return theta * 2.0 + weights.sum()

    toy, theta = _Toy(jnp.zeros(1, jnp.float32)), jnp.ones(1, jnp.float32)
    for _ in range(2):
        with pytest.warns(UserWarning, match="discount of 0.999"):
            discounted(toy, theta, 0.999)
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            discounted(toy, theta, 0.5)
    toy2 = _Toy(jnp.zeros(2))
    for k in range(4):
        out = scaled(toy2, jnp.full(2, float(k)), np.arange(3.0) + k)
        np.testing.assert_allclose(np.asarray(out), 2.0 * k + 3.0 * k + 3.0)
    assert len(traces) == 1
