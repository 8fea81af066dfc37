"""Bad problems that used to pass silently: float32 at long horizons, unvalidated tables given
to the exact functions, LQ matrices of a wider dtype than theta (split from test_bad_input.py to
balance the two test workers)."""

import dataclasses
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from small_problems import cmdp as _cmdp
from small_problems import lq as _lq
from small_problems import tied_cmdp

from bchg_jax import tabular
from bchg_jax.core.validate import warn_float32_long_horizon
from bchg_jax.games import tabular as game_tab
from bchg_jax.games.tabular.game import TabularGame
from bchg_jax.problems import fourrooms, random_tabular_cmdp, random_tabular_game
from bchg_jax.problems.toy_game import toy_game

S, B = 3, 2
TH = jnp.zeros(1)


@pytest.mark.slow
def test_float32_at_a_long_horizon_warns_in_the_tabular_families():
    """float32 above gamma 0.99: the tabular game's exact hypergradient was off by 1-29% of its
    norm at 0.999 against float64 (3% on this game at beta 0.5), with no word. The exact
    hypergradients and make_train of both tabular families now warn; 0.99 (the paper's) and
    float64 stay quiet."""
    policy_fn = lambda th: jax.nn.softmax(th, -1)  # noqa: E731
    theta = jnp.asarray(np.random.default_rng(0).normal(size=(4, 2)), jnp.float32)

    def game(gamma, dtype=jnp.float32):
        g = random_tabular_game(gamma=gamma)
        arrays = (g.transition, g.init_dist, g.follower_reward, g.leader_reward)
        return TabularGame(*(jnp.asarray(x, dtype) for x in arrays), gamma, gamma, 100)

    with pytest.warns(UserWarning, match=r"float32 with a discount of 0\.999"):
        game_tab.exact_hypergradient(policy_fn, theta, game(0.999), 0.5)
    with pytest.warns(UserWarning, match="float32 with a discount of 0.995"):
        game_tab.make_train(game(0.995), "bchg", game_tab.TrainConfig())
    cmdp = random_tabular_cmdp(jax.random.key(0), gamma_F=0.999, gamma_L=0.9)
    with pytest.warns(UserWarning, match="float32 with a discount of 0.999"):
        tabular.make_train(cmdp, "bchg")
    with warnings.catch_warnings():
        warnings.filterwarnings("error", message=".*float32")
        game_tab.make_train(game(0.99), "bchg", game_tab.TrainConfig())
        tabular.make_train(random_tabular_cmdp(jax.random.key(0), gamma_F=0.99), "bchg")
        warn_float32_long_horizon("here", jnp.float64, 0.9999)


def test_tabular_trainer_warns_when_every_episode_ends_by_a_cut():
    """No terminal state: every episode stops at min(time_limit, num_steps), and with 0.4 of the
    discount weight beyond it (gamma 0.99, 100 steps) the estimates target the truncated
    hypergradient (the README's problem cut at 10 steps: 37% off, 11 SE, with no word; the LQ
    trainer refuses such a horizon). make_train now warns; the exact method, a long enough
    batch and a problem with terminal states (Four-Rooms, 0.40 by the formula) stay quiet."""
    cmdp = random_tabular_cmdp(jax.random.key(0), gamma_F=0.99, gamma_L=0.9)
    with pytest.warns(UserWarning, match="no terminal state, so every episode is cut at step 100"):
        tabular.make_train(cmdp, "bchg")
    with warnings.catch_warnings():
        warnings.filterwarnings("error", message=".*no terminal state")
        tabular.make_train(cmdp, "exact")
        tabular.make_train(cmdp, "naive", tabular.TrainConfig(num_steps=3000))
        tabular.make_train(fourrooms(), "bchg")


@pytest.mark.slow
def test_float32_logits_rounded_by_a_small_beta_warn():
    """Follower values ~5e3 at beta 1e-4 (two tied actions): float32 rounds the logits Q / beta
    by ~6 and the exact hypergradient was 24% off (the policy 0.99 / 0.5 for 0.71 in every
    state) with every solve converged and no word; the exact references of both tabular
    families now warn. Four-Rooms at beta 1e-3 (rounding 1.2e-4) and float64 stay quiet."""
    theta = jnp.asarray([0.1, 0.2], jnp.float32)
    problem = tied_cmdp(1e3, 1e-4, jnp.float32)
    with pytest.warns(UserWarning, match=r"logits Q / beta are rounded by ~5\.8"):
        tabular.exact_hypergradient(problem, theta, 1e-4)
    policy_fn = lambda th: jax.nn.softmax(th, -1)  # noqa: E731
    g = random_tabular_game(gamma=0.9)
    big = TabularGame(
        *(jnp.asarray(x, jnp.float32) for x in (g.transition, g.init_dist)),
        jnp.asarray(1e3 * g.follower_reward, jnp.float32),
        jnp.asarray(g.leader_reward, jnp.float32),
        0.9,
        0.9,
        100,
    )
    f_theta = jnp.zeros((g.transition.shape[0], g.transition.shape[1]), jnp.float32)
    with pytest.warns(UserWarning, match="logits Q / beta are rounded"):
        game_tab.exact_hypergradient(policy_fn, f_theta, big, 1e-3)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        fourrooms_problem = fourrooms()
        tabular.best_response(fourrooms_problem, fourrooms_problem.theta0, 1e-3)
        with jax.enable_x64(True):
            tabular.best_response(
                tied_cmdp(1e3, 1e-4, jnp.float64), theta.astype(jnp.float64), 1e-4
            )


@pytest.mark.slow
def test_exact_functions_check_the_tables_of_an_unvalidated_problem():
    """docs/api.md: a problem that fails validate() is refused by every public function. The
    exact references of both tabular families took an unvalidated problem whose rows summed to
    0.9 (or an init_dist summing to 7) and gave finite numbers (a gradient ~8x too large)."""
    short = _cmdp(transition=lambda th: jnp.full((S, B, S), 0.3))  # rows sum to 0.9
    with pytest.raises(ValueError, match="transition"):
        tabular.exact_hypergradient(short, TH, 0.5)
    with pytest.raises(ValueError, match="transition"):
        tabular.leader_objective(short, TH, 0.5)
    heavy = _cmdp(init_dist=lambda th: jnp.full(S, 7.0 / S))
    with pytest.raises(ValueError, match="init_dist"):
        tabular.best_response(heavy, TH, 0.5)
    tabular.exact_hypergradient(_cmdp(), TH, 0.5)  # a valid one passes
    toy = toy_game()
    bad = dataclasses.replace(toy, transition=0.9 * toy.transition)
    f = jnp.full(toy.init_dist.shape + (toy.transition.shape[1],), 1.0 / toy.transition.shape[1])
    policy_fn = lambda th: jax.nn.softmax(th, -1)  # noqa: E731
    with pytest.raises(ValueError, match="transition"):
        game_tab.exact_hypergradient(policy_fn, jnp.log(f), bad, 0.05)
    with pytest.raises(ValueError, match="transition"):
        game_tab.leader_objective(bad, f, 0.05)
    game_tab.leader_objective(toy, f, 0.05)


def test_lq_function_of_a_wider_dtype_than_theta_is_refused(x64):
    """Under jax_enable_x64 a float32 theta0 with an A_fn returning float64 (a numpy constant)
    passed validate() and then failed inside the Riccati while_loop ("carry input and carry
    output must have equal types"); validate() now names the function, as TabularCMDP's does."""
    with pytest.raises(
        ValueError, match=r"A\(theta\) has dtype float64, wider than theta's float32"
    ):
        _lq(A_fn=lambda th: np.eye(2) * 0.5, theta0=jnp.zeros(1, jnp.float32)).validate()
    with pytest.raises(ValueError, match="leader_quadratic.*Ms has dtype float64"):
        _lq(
            A_fn=lambda th: jnp.eye(2, dtype=th.dtype) * 0.5,
            B_fn=lambda th: jnp.ones((2, 1), th.dtype),
            leader_quadratic=lambda th: (np.eye(2), jnp.eye(1, dtype=th.dtype), jnp.zeros(())),
            theta0=jnp.zeros(1, jnp.float32),
        ).validate()
    _lq(A_fn=lambda th: np.eye(2) * 0.5, theta0=jnp.zeros(1, jnp.float64)).validate()


def test_a_problem_function_reading_past_theta0_is_refused():
    """A theta0 shorter than the problem's functions read was accepted: JAX clamps the index,
    so ``th[1]`` of a [1] theta read th[0] and every table, J and gradient was finite and not
    the model's (this problem's exact hypergradient is [0.] with the clamp, where the user
    meant two parameters). validate() and the functions that run it (make_train, the exact
    references) now trace each function once with checkify's index checks and name it;
    an index whose out-of-range mode is chosen (``jnp.take(th, i, mode="clip")``) passes."""
    reads_two = _cmdp(follower_reward=lambda th: jnp.zeros((S, B)) + th[0] - th[1])
    with pytest.raises(ValueError, match=r"follower_reward\(theta\) indexes out of range.*index 1"):
        reads_two.validate()
    with pytest.raises(ValueError, match="indexes out of range"):
        tabular.exact_hypergradient(reads_two, TH, 0.5)
    with pytest.raises(ValueError, match="indexes out of range"):
        tabular.make_train(reads_two, "bchg")
    _cmdp(follower_reward=lambda th: jnp.zeros((S, B)) + th[0] - th[0:2].sum()).validate()
    clamped = _cmdp(follower_reward=lambda th: jnp.zeros((S, B)) + th.at[1].get(mode="clip"))
    clamped.validate()
    # a computed index (here 1: out of range) with its mode chosen passes; plain indexing is
    # named (and so is x.at[i].get(mode="clip") with a computed scalar i: JAX lowers it to the
    # same clamped slice as x[i], so the two cannot be told apart)
    at = lambda th: (th[0] + 1.0).astype(jnp.int32)  # noqa: E731
    for chosen in (
        lambda th: jnp.take(th, at(th), mode="clip"),
        lambda th: jnp.nan_to_num(jnp.take(th, at(th), mode="fill")),
        lambda th: th.at[at(th)].set(5.0)[0],  # a scatter's default: dropped
    ):
        _cmdp(follower_reward=lambda th, g=chosen: jnp.zeros((S, B)) + g(th)).validate()
    with pytest.raises(ValueError, match=r"follower_reward\(theta\) indexes out of range"):
        _cmdp(follower_reward=lambda th: jnp.zeros((S, B)) + th[at(th)]).validate()
    # only functions that index where the check looks pay its compile: thermal's A(theta), all
    # scatters that drop, does not
    from bchg_jax.core.validate import _indexes
    from bchg_jax.problems import thermal

    th_w = thermal().theta0
    assert not _indexes(jax.make_jaxpr(thermal().A_fn)(th_w).jaxpr)
    assert _indexes(jax.make_jaxpr(lambda th: th[at(th)])(jnp.zeros(1)).jaxpr)
    # checkify's own rules are as they were afterwards (a user's checkify flags the clip mode)
    from jax.experimental import checkify

    err, _ = checkify.checkify(
        lambda th: jnp.take(th, at(th), mode="clip"), errors=checkify.index_checks
    )(jnp.zeros(1))
    assert "out of bounds" in str(err.get())
    two = _cmdp(follower_reward=lambda th: jnp.zeros((S, B)) + th[0] - th[1], theta0=jnp.zeros(2))
    two.validate()
    # the LQ family: A(theta) reading theta[2] of a [2] theta0
    with pytest.raises(ValueError, match=r"A\(theta\) indexes out of range.*index 2"):
        _lq(A_fn=lambda th: jnp.eye(2) * (0.5 + th[2]), theta0=jnp.zeros(2)).validate()
    _lq(A_fn=lambda th: jnp.eye(2) * (0.5 + th[1]), theta0=jnp.zeros(2)).validate()
    # a game leader's policy_fn reading a parameter its theta lacks
    toy = toy_game()
    S_g, A_g = toy.transition.shape[:2]

    def policy_fn(th):  # meant: per-state logits plus one shared bias th[-1] of a longer theta
        return jax.nn.softmax(th[:, :A_g] + th[0, A_g], -1)

    with pytest.raises(ValueError, match=r"exact_hypergradient: policy_fn\(theta\) indexes out"):
        game_tab.exact_hypergradient(policy_fn, jnp.zeros((S_g, A_g)), toy, 0.05)
    game_tab.exact_hypergradient(policy_fn, jnp.zeros((S_g, A_g + 1)), toy, 0.05)
