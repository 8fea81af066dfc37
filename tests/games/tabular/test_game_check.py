"""games.tabular.check_problem: Theorem 2's estimator against the exact hypergradient on a game.

On a random 5-state game (the ``backup_game`` fixture: in exact expectation the estimator
under the reference backup is 76% off that backup's hypergradient, cosine 0.66,
``test_backup_expectation.py``) the check passes BC-HG under the paper backup and exposes both
the reference backup's bias and Naive-PGD's."""

import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from bchg_jax.core.bias_check import discount_weight_beyond
from bchg_jax.games.tabular import TabularGame, check_problem
from bchg_jax.games.tabular.check import _truncated, truncated_hypergradient
from bchg_jax.games.tabular.exact import (
    as_if_optimal_hypergradient,
    best_response,
    exact_hypergradient,
    k_step_hypergradient,
    lag_hypergradient,
    leader_values,
)
from bchg_jax.problems.random_tabular import random_tabular_game


def policy_fn(theta):
    return jax.nn.softmax(theta, -1)


@pytest.mark.slow
def test_game_check_passes_bchg_and_exposes_the_reference_backup(x64, backup_game):
    game = backup_game()
    theta = [jnp.asarray(np.random.default_rng(2).normal(size=(5, 3)))]
    kw = dict(episodes=16, batches=200, verbose=False)
    (paper,) = check_problem(game, policy_fn, theta, 0.1, backup="paper", **kw)
    assert paper["bias_se"] < 4.0 and paper["rel_error"] < 3 * paper["rel_se"], paper
    (reference,) = check_problem(game, policy_fn, theta, 0.1, backup="reference", **kw)
    assert reference["bias_se"] > 10.0 and reference["rel_error"] > 0.5, reference
    (naive,) = check_problem(game, policy_fn, theta, 0.1, backup="paper", guide="none", **kw)
    assert naive["bias_se"] > 10.0, naive
    # each is its own truncated target within its SE; the cut (100 steps) moves it by < 1e-3
    for row in (paper, reference, naive):
        assert row["truncated_bias_se"] < 4.0 and row["cut_bias"] < 1e-3, row


@pytest.mark.slow
def test_game_check_warns_of_a_cut_and_refuses_bad_input(x64, backup_game):
    game = backup_game(time_limit=10)  # 0.9^10 = 0.35 of the weight beyond the cut
    theta = [jnp.zeros((5, 3))]
    with pytest.warns(UserWarning, match="beyond the cut"):
        check_problem(game, policy_fn, theta, 0.1, episodes=2, batches=2, verbose=False)
    for kw, match in (
        (dict(backup="mine"), "backup must be one of"),
        (dict(guide="hpgd"), "guide must be one of"),
        (dict(baseline="sampled"), "baseline must be one of"),
        (dict(batches=1), "batches must be >= 2"),
    ):
        with pytest.raises(ValueError, match=match):
            check_problem(game, policy_fn, theta, 0.1, **kw)
    with pytest.raises(ValueError, match="beta"):
        check_problem(game, policy_fn, theta, 0.0)
    with pytest.raises(ValueError, match="leader policy"):
        check_problem(game, jnp.exp, theta, 0.1)


# a small random game (S = 3, A = 2, B = 2; both discounts 0.8) whose estimates, on episodes of
# 6 steps, are 27% off the exact hypergradient (cut_bias) and whose guiding term is 16% of the
# truncated target (beta 0.3); pooled over 8 x 3000 batches the estimates' mean was within 1.6
# SE of truncated_target (resolution 0.5% of the norm) for BC-HG under both backups and without
# the baseline, and within 0.5 SE (resolution 0.2%) for Naive-PGD without the baseline
BETA, CUT = 0.3, 6


def _short_game(time_limit=CUT):
    return random_tabular_game(3, S=3, A=2, B=2, gamma=0.8, time_limit=time_limit)


def _theta():
    return jnp.asarray(np.random.default_rng(0).normal(size=(3, 2)))


def test_truncated_hypergradient_without_a_cut_is_the_exact_one(x64):
    """Cut at H = 200 (discount weight beyond it 2e-18) the truncated hypergradient under the
    paper backup is Theorem 2's exact hypergradient to rounding (8e-16 of its largest entry; at
    H = 100, weight 4e-9, it is 2e-10 off: the cut's own share). Under the reference backup and
    for Naive-PGD it is the estimator's own uncut expectation (what ``cut_bias`` measures the
    cut against), not the exact hypergradient they are biased for. The direct term's state
    baseline leaves the truncated target unchanged (zero mean per step), and the function is
    jit-able."""
    game, theta = _short_game(None), _theta()
    assert discount_weight_beyond(0.8, 0.8, 200) < 1e-17

    @jax.jit
    def values(theta):
        f = policy_fn(theta)
        br = best_response(game, f, BETA, "reference")
        V_L, Q_L = leader_values(game, f, br.policy)

        def cut(h, **kw):
            return truncated_hypergradient(game, policy_fn, theta, BETA, h, **kw)

        return dict(
            exact=exact_hypergradient(policy_fn, theta, game, BETA, "paper"),
            long=cut(200, backup="paper"),
            short=cut(CUT, backup="paper"),
            no_base=cut(CUT, backup="paper", baseline="none"),
            **{
                guide: (
                    cut(200, backup="reference", guide=guide),
                    _truncated(game, policy_fn, theta, BETA, None, br, V_L, Q_L, guide),
                )
                for guide in ("benefit", "none")
            },
        )

    out = values(theta)
    np.testing.assert_allclose(out["long"], out["exact"], rtol=1e-12)
    for guide in ("benefit", "none"):
        np.testing.assert_allclose(*out[guide], rtol=1e-12)
    np.testing.assert_allclose(out["no_base"], out["short"], rtol=1e-12, atol=1e-14)
    eager = truncated_hypergradient(game, policy_fn, theta, BETA, CUT, backup="paper")
    np.testing.assert_allclose(eager, out["short"], rtol=1e-12)
    with pytest.raises(ValueError, match="horizon"):
        truncated_hypergradient(game, policy_fn, theta, BETA, 0)
    with pytest.raises(ValueError, match="guide must be one of"):
        truncated_hypergradient(game, policy_fn, theta, BETA, CUT, guide="hpgd")


@pytest.mark.slow
def test_the_estimator_refuses_a_policy_fn_whose_rows_leave_the_simplex():
    """``games.tabular.hypergradient`` checked only the rows at theta: with a direct table its
    means under the state baseline and under none differed by up to ~80 SE (the baselines drop
    the direction off the simplex). It refuses it at a concrete theta, as the references do; a
    softmax passes, and under ``jit`` (the trainers) the check is skipped."""
    from bchg_jax.games.tabular import hypergradient, leader_values, rollout

    game = _short_game(None)
    table = jax.nn.softmax(_theta(), -1).astype(jnp.float32)
    br = best_response(game, table, BETA, "paper")
    V_L, Q_L = leader_values(game, table, br.policy)
    ep = rollout(jax.random.key(0), game, table, br.policy, 4, 20)
    rest = (ep, br.policy, Q_L, br.V, BETA, game.gamma_L, game.gamma_F, "benefit", V_L)
    with pytest.raises(ValueError, match="games.tabular.hypergradient: policy_fn's row sums move"):
        hypergradient(lambda t: t, table, *rest)
    est = hypergradient(lambda t: jax.nn.softmax(t, -1), jnp.log(table), *rest)
    assert np.all(np.isfinite(est)) and est.shape == table.shape
    traced = jax.jit(lambda th: hypergradient(lambda t: t, th, *rest))(table)
    assert traced.shape == table.shape
    # a saturated float32 softmax stays on the simplex: its row sums' tangent is rounding of
    # the logits' (1e-3 of its entries' in float32, which the check took for a leaving policy
    # and refused, in the references too); the check computes it in float64
    Phi = jnp.asarray(np.random.default_rng(0).normal(size=(3, 3)), jnp.float32)
    shared = lambda W: jax.nn.softmax(Phi @ W, -1)  # noqa: E731
    W = jnp.asarray([[40.0, -40.0], [0.0, 0.0], [0.0, 0.0]], jnp.float32)
    assert np.all(np.isfinite(exact_hypergradient(shared, W, game, BETA, "paper")))
    assert not jax.config.jax_enable_x64  # the check's float64 is scoped to it
    # episodes whose arrays disagree in shape: named (JAX's broadcasting error before)
    soft = (lambda t: jax.nn.softmax(t, -1), jnp.log(table))
    for bad, match in (
        (ep._replace(a=ep.a[:, :-1]), r"ep.a must have shape \(4, 20\)"),
        (ep._replace(b=ep.b[:2]), r"ep.b must have shape \(4, 20\)"),
        (ep._replace(s=ep.s[0]), r"ep.s \(states\) must be \[E, T\]"),
    ):
        with pytest.raises(ValueError, match=match):
            hypergradient(*soft, bad, *rest[1:])


@pytest.mark.slow
def test_a_policy_fn_whose_rows_leave_the_simplex_is_refused(x64):
    """A direct table (``policy_fn = lambda t: t``, theta on the simplex) moves row sums with
    theta: its autodiff gradient is the objective's extended to non-policies, which Theorem 2's
    estimator does not estimate (its baselines drop that direction: in exact expectation the
    estimate was 113% off it, and equal to it to 7e-16 once each row's mean was removed). The
    references and the check refuse it; the same table normalised by its row sums (the same
    policies, moving on the simplex) passes, and there the estimator's uncut expectation is the
    exact hypergradient."""
    game = _short_game(None)
    table = jax.nn.softmax(_theta(), -1)

    def direct(t):
        return t

    def normalised(t):
        return t / t.sum(-1, keepdims=True)

    g = best_response(game, table, BETA, "paper").policy
    calls = {
        "exact_hypergradient": lambda fn: exact_hypergradient(fn, table, game, BETA, "paper"),
        "truncated_hypergradient": lambda fn: truncated_hypergradient(
            game, fn, table, BETA, 200, backup="paper"
        ),
        "check_problem": lambda fn: check_problem(
            game, fn, [table], BETA, backup="paper", horizon=20, batches=2, verbose=False
        ),
        "as_if_optimal_hypergradient": lambda fn: as_if_optimal_hypergradient(
            fn, table, game, g, BETA, "paper"
        ),
        "k_step_hypergradient": lambda fn: k_step_hypergradient(
            fn, table, game, jnp.zeros(g.shape), BETA, 2, "paper"
        ),
        "lag_hypergradient": lambda fn: lag_hypergradient(fn, table, game, g, BETA, 0.5, "paper"),
    }
    for name, call in calls.items():
        with pytest.raises(ValueError, match=f"{name}.*row sums move with theta"):
            call(direct)
    exact = calls["exact_hypergradient"](normalised)
    np.testing.assert_allclose(calls["truncated_hypergradient"](normalised), exact, rtol=1e-10)
    # a softmax of the same policy gives the same gradient in the directions a policy can move
    logits = jnp.log(table)
    soft = exact_hypergradient(policy_fn, logits, game, BETA, "paper")
    np.testing.assert_allclose(
        soft, table * (exact - jnp.sum(table * exact, -1, keepdims=True)), rtol=1e-10, atol=1e-14
    )
    # traced (inside jit) the check is skipped: the direct table's gradient is computed
    jax.jit(lambda t: exact_hypergradient(direct, t, game, BETA, "paper"))(table)


@pytest.mark.slow
def test_check_problem_estimates_the_truncated_hypergradient(x64):
    """Episodes of 6 steps, paper backup: the mean of 3000 batches is within 4 SE of
    truncated_target (measured 1.6 SE) and far off the exact hypergradient (50 SE; relative
    error 27.5% +- 1.4%, cut_bias 26.8%, within 3 resolutions), with a warning that says so.
    The check has the power to tell the cut's place: the targets cut one step earlier or later
    and Naive-PGD's truncated target are 11.9, 10.3 and 14.9 SE from the mean."""
    game, theta = _short_game(), _theta()
    with pytest.warns(UserWarning, match="cut at step 6") as caught:
        (row,) = check_problem(
            game, policy_fn, [theta], BETA, backup="paper", episodes=16, batches=3000, verbose=False
        )
    options = (dict(horizon=CUT), dict(horizon=CUT - 1), dict(horizon=CUT + 1))
    options += (dict(horizon=CUT, guide="none"),)
    target, *others = jax.jit(
        lambda th: [
            truncated_hypergradient(game, policy_fn, th, BETA, backup="paper", **kw)
            for kw in options
        ]
    )(theta)
    np.testing.assert_allclose(row["truncated_target"], np.ravel(target), rtol=1e-12)
    z = (row["mean"] - row["truncated_target"]) / row["se"]
    assert row["truncated_bias_se"] < 4.0 and np.abs(z).max() < 4.0, z
    assert row["bias_se"] > 20.0 and row["cut_bias"] > 0.2, row
    assert abs(row["rel_error"] - row["cut_bias"]) < 3 * row["rel_se"] < 0.05, row
    np.testing.assert_allclose(row["cut_weight"], discount_weight_beyond(0.8, 0.8, CUT))
    (message,) = [str(w.message) for w in caught if "cut at step" in str(w.message)]
    assert f"by {row['cut_bias']:.2g} of the exact" in message and "beyond the cut" in message
    for kw, other in zip(options[1:], others, strict=True):
        assert np.abs((row["mean"] - np.ravel(other)) / row["se"]).max() > 6.0, kw


@pytest.mark.slow
def test_check_problem_truncated_target_of_naive_pgd_without_a_baseline(x64):
    """guide="none", baseline="none" on the same 6-step episodes: the mean is within 4 SE of
    that estimator's own truncated target (measured 1.9 SE), 380 SE off the exact hypergradient
    (relative error 34.7%: the cut's 24.9% and Naive-PGD's own bias) and 127 SE off BC-HG's
    truncated target."""
    game, theta = _short_game(), _theta()
    kw = dict(backup="paper", guide="none", baseline="none", episodes=16, batches=3000)
    with pytest.warns(UserWarning, match="cut at step 6"):
        (row,) = check_problem(game, policy_fn, [theta], BETA, verbose=False, **kw)
    target = truncated_hypergradient(
        game, policy_fn, theta, BETA, CUT, backup="paper", guide="none", baseline="none"
    )
    np.testing.assert_allclose(row["truncated_target"], np.ravel(target), rtol=1e-12)
    assert row["truncated_bias_se"] < 4.0 and row["bias_se"] > 20.0, row
    bchg = truncated_hypergradient(game, policy_fn, theta, BETA, CUT, backup="paper")
    assert np.abs((row["mean"] - np.ravel(bchg)) / row["se"]).max() > 6.0


def test_a_policy_fn_of_another_shape_or_axis_is_named_as_such():
    """A policy_fn that returns the table transposed ([A, S]) or normalises the wrong axis is
    refused with what is wrong with it (its shape, its rows), before any solve; it used to read
    "row sums move with theta"."""
    game = _short_game(None)  # S = 3, A = 2
    theta = jnp.zeros((3, 2), jnp.float32)
    transposed = lambda t: jax.nn.softmax(t, -1).T  # noqa: E731
    columns = lambda t: jax.nn.softmax(t, 0)  # noqa: E731
    calls = {
        "exact_hypergradient": lambda fn: exact_hypergradient(fn, theta, game, BETA),
        "check_problem": lambda fn: check_problem(
            game, fn, [theta], BETA, horizon=5, batches=2, verbose=False
        ),
    }
    for name, call in calls.items():
        with pytest.raises(ValueError, match=rf"{name}.*must have shape \(3, 2\).*got \(2, 3\)"):
            call(transposed)
        with pytest.raises(ValueError, match=f"{name}.*must hold probability rows"):
            call(columns)


@pytest.mark.slow
def test_the_expectation_splits_by_leader_pair(x64):
    # the estimator's expectation is a sum over the leader's (s, a) of its visits' terms: the
    # parts of a set of pairs and of its complement add up to the whole (what rare_share uses)
    game = _short_game(None)
    theta = _theta() * 3.0
    f = policy_fn(theta)
    br = best_response(game, f, BETA, "paper")
    V_L, Q_L = leader_values(game, f, br.policy)
    keep = np.array([[True, False], [False, False], [True, True]])
    args = (game, policy_fn, theta, BETA, None, br, V_L, Q_L, "benefit", "state")
    whole = np.asarray(_truncated(*args))
    part, rest = (np.asarray(_truncated(*args, jnp.asarray(k))) for k in (keep, ~keep))
    np.testing.assert_allclose(part + rest, whole, rtol=1e-10, atol=1e-14)
    assert np.linalg.norm(part) > 1e-3 * np.linalg.norm(whole)
    np.testing.assert_allclose(whole, exact_hypergradient(policy_fn, theta, game, BETA, "paper"))


def test_the_part_of_a_leader_action_of_probability_zero_is_its_exact_share(x64):
    # a leader table divided by its row sums (a policy_fn the docs accept) with f(1|0) = 0:
    # the action is never sampled, but theta moves it. Its part (rare_share's) is what it
    # carries in the exact gradient, the limit of f(1|0) -> 0, not 0 (the check then read the
    # estimator's miss of it as bias with rare_share 0)
    game = _short_game(None)
    table = lambda x: x / x.sum(-1, keepdims=True)  # noqa: E731
    x = jnp.asarray([[1.0, 0.0], [0.3, 0.7], [0.5, 0.5]])
    f = table(x)
    br = best_response(game, f, BETA, "paper")
    V_L, Q_L = leader_values(game, f, br.policy)
    args = (game, table, x, BETA, None, br, V_L, Q_L, "benefit", "state")
    every = jnp.ones(f.shape, bool)
    exact = np.asarray(exact_hypergradient(table, x, game, BETA, "paper"))
    assert abs(exact[0, 1]) > 0.1  # theta's effect through the unsampled action
    np.testing.assert_allclose(_truncated(*args, every), exact, rtol=1e-9, atol=1e-12)
    # the estimator's expectation (never sampled: nothing of that pair) and the rest's part
    rest = np.asarray(_truncated(*args, jnp.asarray(f > 0)))
    np.testing.assert_allclose(_truncated(*args), rest, rtol=1e-12, atol=1e-14)
    assert abs(rest[0, 1]) < 1e-9


def test_the_cut_and_uncut_expectations_agree_for_rows_within_their_tolerance(x64):
    # leader rows summing to 1 - 5e-5 (accepted: POLICY_ROW_TOL 1e-4): the scan over t < H
    # must carry state masses as the linear solves do; read off P(s_t, a_t, b_t) it put the row
    # sum into every mass and, at H = 200 (beyond-cut weight 2e-18), sat 5e-5 off the uncut
    game = _short_game(None)
    scaled = lambda t: (1.0 - 5e-5) * policy_fn(t)  # noqa: E731
    theta = _theta()
    f = scaled(theta)
    br = best_response(game, f, BETA, "paper")
    V_L, Q_L = leader_values(game, f, br.policy)
    for guide in ("benefit", "none"):
        cut, uncut = (
            _truncated(game, scaled, theta, BETA, h, br, V_L, Q_L, guide, "state")
            for h in (200, None)
        )
        np.testing.assert_allclose(cut, uncut, rtol=1e-10, atol=1e-13 * np.abs(uncut).max())


@pytest.mark.slow
def test_game_check_tells_leader_actions_it_never_sampled_from_bias(x64, capsys):
    # a sharp leader (logits x12, actions of probability ~1e-5): BC-HG under the paper backup is
    # unbiased, but its mean misses the never-sampled actions' part, 1e-5 of a component whose
    # standard error is as small: the plain comparison reads as bias, the resolved one does not
    theta = [jnp.asarray(np.random.default_rng(0).normal(size=(3, 2))) * 12.0]
    kw = dict(backup="paper", episodes=16, horizon=40, batches=300)
    game = random_tabular_game(3, S=3, A=2, B=2, gamma=0.8, time_limit=40)
    with pytest.warns(UserWarning, match="not resolved rather than biased"):
        (row,) = check_problem(game, policy_fn, theta, 0.1, **kw)
    assert row["p_value"] < 1e-6 and row["resolved_p_value"] > 0.01
    # (2% of it: the leader pairs' 0.05% and a follower action never sampled at a frequent
    # leader pair, which the check missed before)
    assert 0 < row["rare_share"] < 0.05 and row["rare_component_share"] > 0.5
    out = capsys.readouterr().out
    assert "of the exact value carried by leader pairs or follower actions sampled < 30" in out
    # Naive-PGD, 26% off at 5.6% resolution on another game, stays biased on the rest
    game = random_tabular_game(4, S=3, A=2, B=2, gamma=0.8, time_limit=40)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        (row,) = check_problem(game, policy_fn, theta, 0.1, guide="none", verbose=False, **kw)
    assert row["p_value"] < 1e-6 and row["resolved_p_value"] < 1e-3
    assert not any("not resolved" in str(w.message) for w in caught)


def _rare_follower_game():
    """2 states, 2 x 2 actions: the follower's second action costs it 0.9 and moves to state 1,
    the only one that pays the leader; at beta 0.05 it is played with probability ~1.5e-8 at
    every (s, a), while every leader pair is sampled often."""
    P = np.zeros((2, 2, 2, 2))
    P[:, :, 0, :] = 0.5
    P[:, :, 1, 1] = 1.0
    x = np.eye(2)  # the follower's reward depends on the leader's action
    rF = np.stack([x, x - 0.9], -1)
    rL = np.zeros((2, 2, 2))
    rL[:, :, 1] = 1.0
    return TabularGame(
        jnp.asarray(P), jnp.asarray([0.5, 0.5]), jnp.asarray(rF), jnp.asarray(rL), 0.5, 0.5, 40
    )


@pytest.mark.slow
def test_game_check_tells_a_follower_action_it_never_sampled_from_bias(x64):
    # BC-HG (paper backup) is unbiased, but the never-sampled follower action's influence terms
    # are 4x the exact gradient (its Benefit and the frequent action's cancel there): the check
    # read 312 SE, p = 0, rare_share 0 and no warning, every leader pair being frequent
    game, theta = _rare_follower_game(), jnp.asarray([[0.3, -0.2], [-0.4, 0.1]])
    f = policy_fn(theta)
    br = best_response(game, f, 0.05, "paper")
    assert np.all(br.policy[..., 1] < 1e-7)
    V_L, Q_L = leader_values(game, f, br.policy)
    args = (game, policy_fn, theta, 0.05, None, br, V_L, Q_L, "benefit", "state")
    np.testing.assert_array_equal(
        _truncated(*args, None, jnp.zeros((2, 2, 2), bool)), _truncated(*args)
    )
    with pytest.warns(UserWarning, match="not resolved rather than biased"):
        (row,) = check_problem(
            game,
            policy_fn,
            [theta],
            0.05,
            backup="paper",
            episodes=16,
            horizon=40,
            batches=1000,
            verbose=False,
        )
    assert row["p_value"] < 1e-6 and row["cut_bias"] < 1e-9
    assert row["rare_share"] > 1.0 and row["resolved_p_value"] > 0.01
