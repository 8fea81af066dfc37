"""The game families' exact references called eagerly run as one cached program per game
(``core.eager``): each eager call compiled 2-10 programs (0.2-1.7 s) and kept them, so a
user's Python loop of exact gradients ran out of memory mappings as the single-agent
references did. The plain calls' errors and warnings are kept on the cached path."""

import gc
import inspect
import warnings
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
@pytest.mark.slow
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


@pytest.mark.slow
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


@pytest.mark.slow
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


@pytest.mark.slow
def test_a_warning_is_replayed_only_for_the_dtypes_it_was_given_for(x64):
    """The replayed trace-time warnings were keyed without the traced arguments' dtypes: a
    float64 call after a float32 one repeated the float32 long-horizon warning."""
    game = toy_game(gamma_F=0.995, gamma_L=0.995)

    def pf(t):
        return jax.nn.softmax(t, -1)

    for _ in range(2):
        with pytest.warns(UserWarning, match="float32 with a discount"):
            tab_exact.exact_hypergradient(pf, jnp.zeros((3, 2), jnp.float32), game, 0.5)
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            tab_exact.exact_hypergradient(pf, jnp.zeros((3, 2), jnp.float64), game, 0.5)


def test_a_weak_and_a_strong_beta_of_equal_value_get_their_own_programs(x64):
    """A weak-typed 0-d beta does not widen a float32 policy's compute dtype, a strong
    np.float64 one does: keyed by dtype and bytes alone, the second call got the first's
    float32 program."""
    game = toy_game(gamma_F=0.9, gamma_L=0.9)
    f = jnp.full((3, 2), 0.5, jnp.float32)
    assert tab_exact.best_response(game, f, jnp.asarray(0.5)).Q.dtype == jnp.float32
    assert tab_exact.best_response(game, f, np.float64(0.5)).Q.dtype == jnp.float64


@pytest.mark.slow
def test_a_policy_fn_that_reads_the_game_does_not_keep_it_alive():
    """The program held its static policy_fn strongly; a policy_fn closing over the game kept
    the game (the program's weak key) alive for good."""

    def use():
        game = toy_game(R=3.0)

        def pf(t):
            return jax.nn.softmax(t.reshape(game.num_states, -1), -1)

        for _ in range(2):
            tab_exact.exact_hypergradient(pf, jnp.zeros(6), game, 0.5)
        return weakref.ref(game)

    ref = use()
    gc.collect()
    assert ref() is None


@pytest.mark.slow
def test_a_new_policy_fn_per_call_keeps_a_bounded_number_of_programs():
    """A loop that makes a new lambda per call compiles per call (as the plain call does); the
    game's program is rebuilt once more than DEAD_CALLABLES of its callables have died."""
    from bchg_jax.core import eager

    game = toy_game()
    programs = []
    for i in range(eager.DEAD_CALLABLES + 3):
        tab_exact.exact_hypergradient(lambda t: _policy_fn(t), jnp.array([0.1 * i]), game, 0.05)
        closure = inspect.getclosurevars(tab_exact.exact_hypergradient).nonlocals
        programs.append(closure["programs"].get(game))
    assert len({id(p) for p in programs}) == 2  # rebuilt once


@pytest.mark.slow
def test_the_float32_logits_warning_of_the_solve_inside_a_hypergradient_is_kept():
    """The plain call differentiates eagerly, so its best response sees a concrete Q and warns
    when float32 rounds its logits; the cached program's solve is traced and said nothing."""
    game = toy_game()
    theta = jnp.zeros((3, 2), jnp.float32)

    def pf(t):
        return jax.nn.softmax(t, -1)

    f = pf(theta)
    g_prev = tab_exact.best_response.__wrapped__(game, f, 0.05).policy
    for _ in range(2):
        with pytest.warns(UserWarning, match="logits"):
            tab_exact.exact_hypergradient(pf, theta, game, 1e-4)
        with pytest.warns(UserWarning, match="logits"):
            tab_exact.lag_hypergradient(pf, theta, game, g_prev, 1e-4, 0.5)


def test_calls_that_do_not_fit_the_signature_get_the_plain_calls_type_error():
    lgame, theta = lqr_game(), jnp.array([-1.0, 0.5])
    with pytest.raises(TypeError, match="leader_objective.. takes 3 positional"):
        lqr_exact.leader_objective(lgame, theta, 0.1, 20)
    with pytest.raises(TypeError, match="unexpected keyword argument 'horizn'"):
        lqr_exact.exact_hypergradient(lgame, theta, 0.1, horizn=20)
    with pytest.raises(ValueError, match="gammas must be a non-empty tuple or list"):
        lqr_exact.leader_returns(lgame, theta, 0.1, np.array([0.9, 1.0]))


@pytest.mark.slow
def test_a_python_float_theta_is_traced():
    """A Python float theta was a static argument: a gradient loop compiled every step."""
    game = toy_game()

    def pf(t):
        return leader_policy_from_p(jax.nn.sigmoid(t))

    tab_exact.exact_hypergradient(pf, 0.3, game, 0.05)
    steps = [0.31, 0.32, 0.33]
    assert _compiles(lambda: [tab_exact.exact_hypergradient(pf, t, game, 0.05) for t in steps]) == 0
    np.testing.assert_allclose(
        tab_exact.exact_hypergradient(pf, 0.31, game, 0.05),
        tab_exact.exact_hypergradient.__wrapped__(pf, 0.31, game, 0.05),
        rtol=2e-4,
    )


@pytest.mark.slow
def test_a_dataclass_policy_fn_is_not_taken_for_the_game():
    """The cache took the first dataclass argument for the problem: a user's dataclass
    ``policy_fn`` (a flax module, say) came first, so a mutable one was unhashable and failed,
    and a frozen one held the game strongly in its program (kept alive)."""
    import dataclasses

    @dataclasses.dataclass
    class Soft:
        scale: float = 1.0

        def __call__(self, t):
            return jax.nn.softmax(self.scale * t, -1)

    @dataclasses.dataclass(frozen=True)
    class FrozenSoft:
        scale: float = 1.0

        def __call__(self, t):
            return jax.nn.softmax(self.scale * t, -1)

    theta = jnp.zeros((3, 2))
    for policy in (Soft(), FrozenSoft()):
        game = toy_game(R=2.5)
        got = tab_exact.exact_hypergradient(policy, theta, game, 0.5)
        np.testing.assert_allclose(
            got,
            tab_exact.exact_hypergradient.__wrapped__(policy, theta, game, 0.5),
            rtol=2e-4,  # float32
            atol=1e-6,
        )
        ref = weakref.ref(game)
        del game
        gc.collect()
        assert ref() is None
