"""The references for followers off their best response and the solvers given tables (``riccati``,
``soft_value_iteration``, ...) called eagerly run as one cached program (``core.eager``). Each
eager call compiled 1-4 programs (0.1-1.1 s) and kept them, as the exact references did before
they were cached: a user's Python loop of them ran out of memory mappings. The plain calls'
numbers and errors are kept."""

import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import small_problems
from compile_count import compiles as _compiles

from bchg_jax import lq, tabular
from bchg_jax.core import maxent_lqr
from bchg_jax.games.tabular import check as game_check
from bchg_jax.games.tabular import follower as game_follower
from bchg_jax.lq import follower_models as lq_models
from bchg_jax.lq import follower_references as lq_refs
from bchg_jax.problems import random_tabular_cmdp, random_tabular_game
from bchg_jax.tabular import check as tab_check
from bchg_jax.tabular import follower as tab_follower
from bchg_jax.tabular import follower_models as tab_models
from bchg_jax.tabular import follower_references as tab_refs


def _lq_problem():
    """A validated 2-d problem whose dynamics and input both move with theta."""
    return small_problems.lq(
        A_fn=lambda th: jnp.array([[0.9 + 0.1 * th[0], 0.2], [0.0, 0.8]]),
        B_fn=lambda th: jnp.array([[0.5], [0.3 + 0.1 * th[0]]]),
        U=0.3 * jnp.eye(2),
        Rbar=jnp.array([[0.5]]),
        leader_quadratic=lambda th: (jnp.eye(2), jnp.array([[0.1]]), 0.0),
        theta0=jnp.array([0.3]),
    ).validate()


def _tabular():
    p = random_tabular_cmdp(jax.random.key(0), num_states=4, num_actions=2, dim=2)
    g = tabular.best_response(p, p.theta0, 0.3).policy
    mixed = 0.5 * g + 0.25  # a policy off the best response (rows of 2 actions sum to 1)

    def tables(t):
        return p.transition(t), p.follower_reward(t)

    return [
        ("k_step_hypergradient", tab_refs, lambda t: (p, t, jnp.zeros(4), 0.3, 3)),
        ("lag_hypergradient", tab_refs, lambda t: (p, t, mixed, 0.3, 0.5)),
        ("truncated_hypergradient", tab_check, lambda t: (p, t, 0.3, 12)),
        ("soft_value_iteration", tab_follower, lambda t: (*tables(t), 0.3, 0.85)),
        ("k_step_response", tab_models, lambda t: (*tables(t), 0.3, 0.85, None, jnp.ones(4), 2)),
    ], p.theta0


def _lq():
    p = _lq_problem()
    br = lq.best_response(p, p.theta0, 0.1)
    off = br._replace(K=0.8 * br.K)  # a gain off the best response's

    def pieces(t):
        return p.A_fn(t), p.B_fn(t), p.Qbar, p.Rbar, 0.9

    return [
        ("as_if_optimal_hypergradient", lq_refs, lambda t: (p, t, off, 0.1)),
        ("k_step_hypergradient", lq_refs, lambda t: (p, t, 0.5 * br.P, 0.1, 3)),
        ("k_step_response", lq_models, lambda t: (p, t, 0.1, 0.5 * br.P, 3)),
        ("policy_value", lq_models, lambda t: (p, t, off, 0.1)),
        ("riccati", maxent_lqr, pieces),
    ], p.theta0


def _games():
    game = random_tabular_game(seed=1, S=3, A=2, B=2)

    def policy_fn(theta):
        return jax.nn.softmax(theta, -1)

    return [
        ("soft_q_iteration", game_follower, lambda t: (game, policy_fn(t), 0.3)),
        ("truncated_hypergradient", game_check, lambda t: (game, policy_fn, t, 0.3, 8)),
    ], jnp.zeros((3, 2))


FAMILIES = {"tabular": _tabular, "lq": _lq, "games": _games}


@pytest.mark.parametrize("family", list(FAMILIES))
@pytest.mark.slow
def test_a_loop_of_eager_calls_compiles_once_and_matches_the_plain_call(family):
    calls, theta0 = FAMILIES[family]()
    thetas = [theta0 + 0.01 * i for i in range(1, 4)]
    for name, module, args in calls:
        fn = getattr(module, name)
        assert getattr(fn, "cached_when_eager", False), name
        fn(*args(theta0))  # compiles the program
        later = _compiles(lambda fn=fn, args=args: [fn(*args(t)) for t in thetas])
        assert later == 0, (family, name, later)  # the plain calls compiled 1-4 programs each
        theta = theta0 + 0.02
        got, plain = fn(*args(theta)), fn.__wrapped__(*args(theta))
        for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(plain), strict=True):
            np.testing.assert_allclose(a, b, rtol=2e-5, atol=1e-6, err_msg=f"{family} {name}")


@pytest.mark.slow
def test_cached_calls_keep_the_checks_of_their_traced_arguments():
    """The values of arguments traced inside the program (a policy, a value matrix, a warm
    start, the tables) are checked eagerly before it runs, after a first call compiled it."""
    (_, _, k_step), (_, _, lag), *_ = _tabular()[0]
    p, theta, V_prev, beta, K = k_step(_tabular()[1])
    tab_refs.k_step_hypergradient(p, theta, V_prev, beta, K)
    with pytest.raises(ValueError, match="V_prev"):
        tab_refs.k_step_hypergradient(p, theta, V_prev * np.nan, beta, K)
    p, theta, previous, beta, mix = lag(theta)
    tab_refs.lag_hypergradient(p, theta, previous, beta, mix)
    with pytest.raises(ValueError, match="previous"):
        tab_refs.lag_hypergradient(p, theta, 2.0 * previous, beta, mix)
    with pytest.raises(ValueError, match="mix"):
        tab_refs.lag_hypergradient(p, theta, previous, beta, 1.5)

    P, r = p.transition(theta), p.follower_reward(theta)
    tab_follower.soft_value_iteration(P, r, 0.3, 0.85, jnp.array([False, True, False, False]))
    with pytest.raises(ValueError, match="terminal"):
        tab_follower.soft_value_iteration(P, r, 0.3, 0.85, jnp.array([0, 2, 0, 0]))
    with pytest.raises(ValueError, match="K"):
        tab_models.k_step_response(P, r, 0.3, 0.85, None, jnp.ones(4), 0)

    (_, _, as_if), (_, _, lq_k_step), *_ = _lq()[0]
    q, lth, off, lbeta = as_if(jnp.array([0.3]))
    lq_refs.as_if_optimal_hypergradient(q, lth, off, lbeta)
    with pytest.raises(ValueError, match="positive definite"):
        lq_refs.as_if_optimal_hypergradient(q, lth, off._replace(cov=-off.cov), lbeta)
    with pytest.raises(ValueError, match="positive definite"):
        lq_models.policy_value(q, lth, off._replace(cov=-off.cov), lbeta)
    q, lth, P_prev, lbeta, K = lq_k_step(lth)
    with pytest.raises(ValueError, match="P_prev"):
        lq_refs.k_step_hypergradient(q, lth, -P_prev, lbeta, K)
    with pytest.raises(ValueError, match="P_prev"):
        lq_models.k_step_response(q, lth, lbeta, -P_prev, K)
    with pytest.raises(ValueError, match="gamma"):
        maxent_lqr.riccati(q.A_fn(lth), q.B_fn(lth), q.Qbar, q.Rbar, 1.5)

    (_, _, soft_q), _ = _games()[0]
    game, f, gbeta = soft_q(jnp.zeros((3, 2)))
    game_follower.soft_q_iteration(game, f, gbeta)
    with pytest.raises(ValueError, match="f"):
        game_follower.soft_q_iteration(game, f * 2.0, gbeta)
    with pytest.raises(ValueError, match="Q0"):  # an all-NaN response before
        game_follower.soft_q_iteration(game, f, gbeta, Q0=jnp.full((3, 2, 2), jnp.nan))


@pytest.mark.slow
def test_a_problem_free_solver_serves_each_shape_and_dtype_from_its_own_program(x64):
    """``riccati`` / ``soft_value_iteration`` have no problem to key a program by: their calls
    share one, traced anew for each shape and dtype of the tables, each then reused."""
    rng = np.random.default_rng(0)
    for S in (3, 5):
        for dtype in (np.float32, np.float64):
            P = rng.dirichlet(np.ones(S), size=(S, 2)).astype(dtype)
            r = rng.normal(size=(S, 2)).astype(dtype)
            br = tab_follower.soft_value_iteration(P, r, 0.5, 0.9, tol=1e-6)
            assert br.V.dtype == dtype and br.V.shape == (S,)
            plain = tab_follower.soft_value_iteration.__wrapped__(P, r, 0.5, 0.9, tol=1e-6)
            np.testing.assert_allclose(br.V, plain.V, rtol=1e-6)
            assert (
                _compiles(
                    lambda P=P, r=r: tab_follower.soft_value_iteration(P, r, 0.5, 0.9, tol=1e-6)
                )
                == 0
            )
    # under a trace the function runs as written (the trainers' path)
    P = rng.dirichlet(np.ones(3), size=(3, 2))
    r = rng.normal(size=(3, 2))
    V = jax.jit(jax.vmap(lambda b: tab_follower.soft_value_iteration(P, r, b, 0.9).V))(
        jnp.array([0.5, 1.0])
    )
    np.testing.assert_allclose(
        V[0], tab_follower.soft_value_iteration(P, r, 0.5, 0.9).V, rtol=1e-10
    )


@pytest.mark.slow
def test_eager_sparse_solves_run_one_program_per_successor_table():
    """The sparse solvers ran their cached per-table solver eagerly, tracing its loops anew:
    a compile per call. An eager call now runs it as one kept ``jit`` program; the numbers are
    those of the same solve inside a caller's ``jit``."""
    p = random_tabular_cmdp(jax.random.key(1), num_states=6, num_actions=2, dim=2)
    succ = tabular.problem_successors(p)
    cont = jnp.ones(6)

    def solves(t):
        P, r = p.transition(t), p.follower_reward(t)
        br = tabular.sparse_soft_value_iteration(P, r, 0.3, p.gamma_F, succ)
        V = tabular.sparse_policy_evaluation(P, r, br.policy, p.gamma_F, cont, br.V, succ, 1e-7)
        return br.V, V

    solves(p.theta0)
    theta = p.theta0 + 0.05
    assert _compiles(lambda: solves(theta)) == 0  # 1 per solver and call before
    for a, b in zip(solves(theta), jax.jit(solves)(theta), strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)


def test_a_problem_free_call_converts_numpy_arrays_as_its_plain_call_does():
    # riccati's plain call converts float64 NumPy tables without asking for their dtype (no
    # truncation warning with x64 off); the cached call asked, and gave 4 warnings
    A, B = np.array([[0.9, 0.2], [0.0, 0.8]]), np.array([[0.5], [0.3]])
    Q, R = np.eye(2), np.eye(1)
    with warnings.catch_warnings(record=True) as plain:
        warnings.simplefilter("always")
        want, _ = maxent_lqr.riccati.__wrapped__(A, B, Q, R, 0.9)
    with warnings.catch_warnings(record=True) as cached:
        warnings.simplefilter("always")
        got, _ = maxent_lqr.riccati(A, B, Q, R, 0.9)
    assert [str(w.message) for w in cached] == [str(w.message) for w in plain]
    np.testing.assert_allclose(got, want, rtol=1e-6)
