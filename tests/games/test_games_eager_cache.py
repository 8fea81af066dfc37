"""The game families' exact references called eagerly run as one cached program per game
(``core.eager``): each eager call compiled 2-10 programs (0.2-1.7 s) and kept them, so a
user's Python loop of exact gradients ran out of memory mappings as the single-agent
references did. The plain calls' errors and warnings are kept on the cached path."""

import gc
import weakref

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from compile_count import compiles as _compiles

from bchg_jax.games.lqr import exact as lqr_exact
from bchg_jax.games.lqr import follower as lqr_follower
from bchg_jax.games.tabular import exact as tab_exact
from bchg_jax.problems import lqr_game, toy_game
from bchg_jax.problems.toy_game import leader_policy_from_p


def _policy_fn(theta):
    return leader_policy_from_p(jax.nn.sigmoid(theta[0]))


def _tabular_calls(game):
    """(name, call(theta)) for every cached tabular-game reference."""
    f0 = _policy_fn(jnp.array([0.2]))
    br = tab_exact.best_response.__wrapped__(game, f0, 0.05)
    return [
        ("best_response", lambda t: tab_exact.best_response(game, _policy_fn(t), 0.05)),
        ("leader_objective", lambda t: tab_exact.leader_objective(game, _policy_fn(t), 0.05)),
        ("leader_return", lambda t: tab_exact.leader_return(game, _policy_fn(t), br.policy, 20)),
        (
            "leader_returns",
            lambda t: tab_exact.leader_returns(game, _policy_fn(t), br.policy, [1.0, 0.9], 20),
        ),
        ("exact_hypergradient", lambda t: tab_exact.exact_hypergradient(_policy_fn, t, game, 0.05)),
        (
            "k_step_hypergradient",
            lambda t: tab_exact.k_step_hypergradient(_policy_fn, t, game, br.Q, 0.05, 3),
        ),
        (
            "lag_hypergradient",
            lambda t: tab_exact.lag_hypergradient(_policy_fn, t, game, br.policy, 0.05, 0.5),
        ),
    ]


def _lqr_calls(game):
    resp = lqr_follower.best_response.__wrapped__(game, jnp.array([-1.0, 0.5]), 0.1)
    return [
        ("best_response", lambda t: lqr_follower.best_response(game, t, 0.1)),
        ("leader_objective", lambda t: lqr_exact.leader_objective(game, t, 0.1)),
        ("leader_objective resp", lambda t: lqr_exact.leader_objective(game, t, 0.1, resp=resp)),
        ("leader_returns", lambda t: lqr_exact.leader_returns(game, t, 0.1, [1.0, 0.99])),
        ("exact_hypergradient", lambda t: lqr_exact.exact_hypergradient(game, t, 0.1)),
        ("hypergradient_split", lambda t: lqr_exact.hypergradient_split(game, t, 0.1)),
    ]


def _plain(name, call, theta):
    """The same call with every cached function replaced by its plain body."""
    fns = [
        (mod, attr)
        for mod in (tab_exact, lqr_exact, lqr_follower)
        for attr in dir(mod)
        if getattr(getattr(mod, attr), "cached_when_eager", False)
    ]
    saved = [(mod, attr, getattr(mod, attr)) for mod, attr in fns]
    try:
        for mod, attr, fn in saved:
            setattr(mod, attr, fn.__wrapped__)
        return call(theta)
    finally:
        for mod, attr, fn in saved:
            setattr(mod, attr, fn)


@pytest.mark.parametrize("family", ["tabular", "lqr"])
def test_a_loop_of_eager_game_references_compiles_once_and_matches_the_plain_call(family):
    if family == "tabular":
        game, theta0 = toy_game(), jnp.array([0.2])
        calls = _tabular_calls(game)
    else:
        game, theta0 = lqr_game(), jnp.array([-1.0, 0.5])
        calls = _lqr_calls(game)
    thetas = [theta0 + 0.01 * i for i in range(1, 4)]
    for name, call in calls:
        call(theta0)  # compiles the program
        assert _compiles(lambda call=call: [call(t) for t in thetas]) == 0, name
        got = call(thetas[0])
        plain = _plain(name, call, thetas[0])
        for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(plain), strict=True):
            # float32 rounding, amplified up to 1 / (1 - gamma) = 100 by the solves
            np.testing.assert_allclose(a, b, rtol=2e-4, atol=1e-5, err_msg=name)


def test_a_game_and_its_programs_are_freed_with_it():
    """Each game has its own program, which holds it weakly: a loop over many games does not
    keep them (the jit cache of one shared program held every game called twice)."""

    def use(seed):
        game = toy_game(R=2.0 + seed)
        for t in (0.1, 0.2, 0.3):
            tab_exact.exact_hypergradient(_policy_fn, jnp.array([t]), game, 0.05)
            lqr_follower.best_response(lqr_game(), jnp.array([t, 0.0]), 0.1)
        return weakref.ref(game)

    refs = [use(seed) for seed in range(3)]
    gc.collect()
    assert all(r() is None for r in refs)


def test_cached_game_calls_keep_the_plain_calls_errors():
    """The value checks of traced arguments run eagerly before the program (they are skipped
    inside it): each call here compiled a program for that key first."""
    game = toy_game()
    f = _policy_fn(jnp.array([0.2]))
    br = tab_exact.best_response(game, f, 0.05)
    bad_f = f.at[0, 0].add(0.3)  # rows that are not distributions
    for _ in range(2):
        with pytest.raises(ValueError, match="rows"):
            tab_exact.best_response(game, bad_f, 0.05)
        with pytest.raises(ValueError, match="rows"):
            tab_exact.leader_objective(game, bad_f, 0.05)
        with pytest.raises(ValueError, match="rows"):
            tab_exact.leader_return(game, f, br.policy * 1.5, 20)
        with pytest.raises(ValueError, match="g_prev"):
            tab_exact.lag_hypergradient(
                _policy_fn, jnp.array([0.2]), game, br.policy * 0.5, 0.05, 0.5
            )
        with pytest.raises(ValueError, match="Q_prev"):
            tab_exact.k_step_hypergradient(
                _policy_fn, jnp.array([0.2]), game, br.Q * jnp.nan, 0.05, 2
            )
        with pytest.raises(ValueError, match="row sum"):  # a policy_fn off the simplex
            tab_exact.exact_hypergradient(lambda t: f * t[0], jnp.array([1.0]), game, 0.05)
        with pytest.raises(ValueError, match="gamma"):
            tab_exact.leader_returns(game, f, br.policy, (jnp.asarray(1.5),), 20)
    lgame, theta = lqr_game(), jnp.array([-1.0, 0.5])
    for _ in range(2):
        with pytest.raises(ValueError, match="finite"):
            lqr_follower.best_response(lgame, theta * jnp.nan, 0.1)
        with pytest.raises(ValueError, match="finite"):
            lqr_exact.exact_hypergradient(lgame, theta * jnp.nan, 0.1)
        with pytest.raises(ValueError, match="s0 must be finite"):
            lqr_exact.leader_objective(lgame, theta, 0.1, s0=jnp.array([jnp.nan, 0.0]))
        with pytest.raises(ValueError, match="gamma"):
            lqr_exact.leader_returns(lgame, theta, 0.1, (jnp.asarray(1.5),))
        with pytest.raises(ValueError, match="converge"):  # a capped solve: the plain call's error
            lqr_exact.leader_objective(lgame, theta, 0.1, max_iters=2)
    unconverged = lqr_follower.best_response(lgame, theta, 0.1, max_iters=2)
    assert not bool(unconverged.converged)  # returned flagged, as by the plain call
