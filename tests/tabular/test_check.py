"""tabular.check_problem: the estimator's mean over batches vs the exact hypergradient."""

import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from bchg_jax import tabular
from bchg_jax.core.bias_check import discount_weight_beyond
from bchg_jax.problems import random_tabular_cmdp
from bchg_jax.tabular import TrainConfig
from bchg_jax.tabular.check import truncated_hypergradient
from bchg_jax.tabular.train import resolve_solver


def _problem():
    prob = random_tabular_cmdp(jax.random.key(3), dtype=jnp.float64)
    terminal = np.zeros(5, bool)
    terminal[4] = True  # episodes of ~6 steps, no time limit
    return type(prob)(**{**prob.__dict__, "terminal": terminal})


@pytest.mark.slow
def test_check_problem_passes_the_unbiased_forms_and_flags_the_ratio_forms(x64, capsys):
    prob = _problem()
    thetas = [prob.theta0, prob.theta0 + 0.3]
    unbiased = TrainConfig(
        num_envs=32, num_steps=30, grouping="first_episode", partial="first_episode"
    )
    rows = tabular.check_problem(prob, thetas, 0.5, config=unbiased, batches=400)
    printed = capsys.readouterr().out
    assert printed.count("relative error") == 2 and "cosine" in printed
    for row in rows:
        assert set(row) >= {"exact", "mean", "se", "z", "bias_se", "rel_error", "rel_se", "cosine"}
        assert row["mean"].shape == row["exact"].shape == (4,)
        assert row["bias_se"] < 4.0, row["z"]
        assert row["rel_se"] < 0.05 and row["rel_error"] < 0.1 and row["cosine"] > 0.99
    ratio = TrainConfig(num_envs=32, num_steps=30, grouping="per_visit", partial="trajectory")
    (row,) = tabular.check_problem(prob, thetas[:1], 0.5, config=ratio, batches=400, verbose=False)
    assert row["bias_se"] > 6.0, row["z"]
    assert capsys.readouterr().out == ""


@pytest.mark.slow
def test_check_problem_any_method_and_critic(x64):
    prob = _problem()
    (row,) = tabular.check_problem(
        prob,
        [prob.theta0],
        0.5,
        method="hpgd_mc",
        critic="monte_carlo",
        batches=8,
        verbose=False,
        config=TrainConfig(num_envs=4, num_steps=20),
    )
    assert np.all(np.isfinite(row["mean"])) and -1.0 <= row["cosine"] <= 1.0


@pytest.mark.slow
def test_check_problem_warns_when_the_sampler_is_another_mdp(x64):
    """A problem with its own sampler table is sampled from another MDP than the exact
    hypergradient's: ``model_gap`` is the largest entry difference and a warning says so;
    a sampler equal to the model gives 0 and no warning."""
    prob = _problem()
    cfg = TrainConfig(num_envs=4, num_steps=20)
    P = prob.transition(prob.theta0)
    for sampler, gap in ((lambda th: prob.transition(th), 0.0), (lambda th: P[:, ::-1], None)):
        other = type(prob)(**{**prob.__dict__, "sample_transition": sampler})
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            (row,) = tabular.check_problem(
                other, [prob.theta0], 0.5, batches=4, verbose=False, config=cfg
            )
        warned = [w for w in caught if "another MDP" in str(w.message)]
        if gap is not None:
            assert row["model_gap"] == gap and not warned
        else:
            want = float(np.abs(np.asarray(P[:, ::-1] - P)).max())
            assert row["model_gap"] == pytest.approx(want) and want > 0.1 and warned


def test_check_problem_rejects_bad_arguments():
    prob = random_tabular_cmdp(jax.random.key(0))
    with pytest.raises(ValueError, match="method"):
        tabular.check_problem(prob, [prob.theta0], 0.5, method="exact")
    with pytest.raises(ValueError, match="critic"):
        tabular.check_problem(prob, [prob.theta0], 0.5, critic="sarsa")
    with pytest.raises(ValueError, match="batches"):
        tabular.check_problem(prob, [prob.theta0], 0.5, batches=1)


@pytest.mark.slow
def test_check_problem_reports_episodes_cut_by_the_time_limit(x64):
    """No terminal state, ``time_limit = num_steps = 10``, gamma_L 0.9: every first episode is cut
    by the time limit, which the exact hypergradient does not have: the report says so
    (``truncated`` 1, ``cut_weight`` the discount weight beyond step 10, 0.61) with a warning,
    and the estimate is biased by ``cut_bias`` (33%; measured 34%, 15.9 SE over 800 batches).
    Episodes that end at a terminal state within the batch: no warning."""
    prob = random_tabular_cmdp(jax.random.key(3), dtype=jnp.float64, time_limit=10)
    config = TrainConfig(
        num_envs=16, num_steps=10, grouping="first_episode", partial="first_episode"
    )
    with pytest.warns(UserWarning, match="cut at step 10"):
        (row,) = tabular.check_problem(
            prob, [prob.theta0], 0.5, config=config, batches=200, verbose=False
        )
    assert row["truncated"] == 1.0
    np.testing.assert_allclose(row["cut_weight"], discount_weight_beyond(0.9, 0.85, 10))
    assert row["bias_se"] > 4.0 and row["rel_error"] > 0.2, (row["z"], row["rel_error"])
    assert abs(row["rel_error"] - row["cut_bias"]) < 3 * row["rel_se"], row
    assert np.abs((row["mean"] - row["truncated_target"]) / row["se"]).max() < 4.0
    terminal = TrainConfig(num_envs=16, num_steps=60, grouping="first_episode")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        ended = _problem()
        (row,) = tabular.check_problem(
            ended, [ended.theta0], 0.5, config=terminal, batches=8, verbose=False
        )
    assert row["truncated"] < 0.1 and row["cut_weight"] < 1e-3


@pytest.mark.slow
def test_check_problem_samples_from_the_whole_table_where_the_support_moved(teleport_chain):
    """The chain teleports only when theta[0] > 100, which no probe sees: ``auto`` takes the
    sparse form. At theta[0] = 102 the successor table has lost half of each 'right' row, and
    check_problem draws its batches as the trainer does (``checked_collect``): from the whole
    table, the very batches of the dense solver's run (``support_lost`` reported). Before, it
    drew from the truncated table (on a ring whose support moved: 100% of the sampled
    transitions had model probability 0, 7.6 SE of sampler bias)."""
    chain = teleport_chain(100.0)
    assert resolve_solver(chain, "auto")[0] == "sparse"
    theta = jnp.asarray([102.0, 0.5])
    rows = {}
    for solver in ("auto", "dense"):
        config = TrainConfig(num_envs=4, num_steps=30, solver=solver)
        with pytest.warns(UserWarning, match="cut at step 30"):  # no terminal state
            rows[solver] = tabular.check_problem(
                chain, [theta, chain.theta0], 0.1, config=config, batches=4, verbose=False
            )
    lost, kept = rows["auto"]
    np.testing.assert_array_equal(lost["mean"], rows["dense"][0]["mean"])
    assert lost["support_lost"] and not kept["support_lost"]
    assert not any(row["support_lost"] for row in rows["dense"])


@pytest.mark.slow
def test_check_problem_cut_weight_uses_the_slower_discount():
    """The guiding term's FollowerQGrad segments are discounted by gamma_F: gamma_F 0.99,
    gamma_L 0.5, H 40: cut_weight is the discount weight beyond the cut, 0.676 (>= 0.99^40 =
    0.669), and cut_bias, the exact gap of the truncated hypergradient, 0.676, with a warning
    (before the slower discount: 0.5^40 = 9e-13 and no warning, while the estimate was biased
    by 68%, 225 SE)."""
    P = np.zeros((3, 2, 3))
    P[0, 0, 1] = P[0, 1, 2] = P[1, :, 1] = P[2, :, 2] = 1.0
    P = jnp.asarray(P, jnp.float32)
    prob = tabular.TabularCMDP(
        transition=lambda th: P,
        init_dist=lambda th: jnp.array([1.0, 0.0, 0.0]),
        follower_reward=lambda th: jnp.stack(
            [jnp.zeros(2), jnp.full(2, th[0]), jnp.full(2, th[1])]
        ),
        leader_reward=lambda th: jnp.array([[0.0, 0.0], [1.0, 1.0], [0.0, 0.0]]),
        gamma_F=0.99,
        gamma_L=0.5,
        theta0=jnp.zeros(2),
        time_limit=40,
    ).validate()
    config = TrainConfig(
        num_envs=8, num_steps=40, grouping="first_episode", partial="first_episode"
    )
    with pytest.warns(UserWarning, match="by 0.68 of its norm .* beyond the cut is 0.68"):
        (row,) = tabular.check_problem(prob, [prob.theta0], 1.0, config=config, batches=4)
    assert row["truncated"] == 1.0
    np.testing.assert_allclose(row["cut_weight"], discount_weight_beyond(0.5, 0.99, 40))
    assert row["cut_weight"] > 0.99**40
    np.testing.assert_allclose(row["cut_bias"], 0.6757, atol=2e-4)


def _chain(num_states=6, time_limit=10):
    """A chain whose leader reward lies at its far end, ``num_states - 1`` steps from the start:
    the follower moves forward (action 0, paid theta[0] - 0.2) or back (action 1, paid
    theta[1]), each succeeding with probability 0.8; gamma_L = gamma_F = 0.9, no terminal
    state. Most of the gradient comes late in the episode, where a cut takes most of it."""
    S = num_states
    P = np.zeros((S, 2, S))
    for s in range(S):
        P[s, 0, min(s + 1, S - 1)] += 0.8
        P[s, 0, s] += 0.2
        P[s, 1, max(s - 1, 0)] += 0.8
        P[s, 1, s] += 0.2
    rL = np.zeros((S, 2))
    rL[-1] = 1.0
    return tabular.TabularCMDP(
        transition=lambda th: jnp.asarray(P, th.dtype),
        init_dist=lambda th: jnp.eye(S, dtype=th.dtype)[0],
        follower_reward=lambda th: jnp.stack([jnp.full(S, th[0] - 0.2), jnp.full(S, th[1])], -1),
        leader_reward=lambda th: jnp.asarray(rL, th.dtype),
        gamma_F=0.9,
        gamma_L=0.9,
        theta0=jnp.zeros(2, jnp.float64),
        time_limit=time_limit,
    ).validate()


@pytest.mark.slow
def test_check_problem_reports_the_bias_of_a_cut_at_least_as_measured(x64):
    """Every first episode cut at H = 10 on :func:`_chain`: the first-episode forms' mean is the
    truncated hypergradient (within its SE) and ``cut_bias``, its exact gap to the exact
    hypergradient (0.55), is the measured relative error (0.546 +- 0.023 over 100 batches).
    The figure of the warning before, max(gamma_L, gamma_F)^10 = 0.35, was no bound (the
    guiding term's segments started at k < H lose gamma_F^(H-k) each: ~H gamma^H in all); the
    discount weight beyond the cut, (1 + H (1 - gamma)) gamma^H = 0.70, is above it. Cut at
    2000 instead, the truncated hypergradient is the exact one."""
    prob = _chain()
    config = TrainConfig(
        num_envs=16, num_steps=10, grouping="first_episode", partial="first_episode"
    )
    with pytest.warns(UserWarning, match="cut at step 10") as caught:
        (row,) = tabular.check_problem(
            prob, [prob.theta0], 1.0, config=config, batches=100, verbose=False
        )
    assert row["truncated"] == 1.0
    np.testing.assert_allclose(
        row["truncated_target"], np.ravel(truncated_hypergradient(prob, prob.theta0, 1.0, 10))
    )
    z_cut = np.abs((row["mean"] - row["truncated_target"]) / row["se"]).max()
    assert z_cut < 4.0 and row["truncated_bias_se"] == pytest.approx(z_cut, rel=1e-6), row
    measured, resolution = row["rel_error"], row["rel_se"]
    assert resolution < 0.04 and abs(row["cut_bias"] - measured) < 3 * resolution, row
    assert 0.9**10 < measured - 4 * resolution  # the old figure was below the bias
    np.testing.assert_allclose(row["cut_weight"], 2 * 0.9**10)  # (1 + 10 x 0.1) 0.9^10
    assert row["cut_weight"] > measured + 3 * resolution
    (message,) = [str(w.message) for w in caught if "cut at step" in str(w.message)]
    assert f"by {row['cut_bias']:.2g} of its norm" in message and "max(gamma_L" not in message
    # no cut: the exact hypergradient (Theorem 1 is an identity)
    np.testing.assert_allclose(
        truncated_hypergradient(prob, prob.theta0, 1.0, 2000), row["exact"], rtol=1e-9
    )


@pytest.mark.slow
def test_truncated_hypergradient_tends_to_the_exact_one_with_terminal_states(x64):
    """Episodes ended by a terminal state (~6 steps): cut at 2000 the truncated hypergradient is
    the exact one (Theorem 1 is an identity; no transition out of a terminal state), cut at 5
    it is not; a horizon below 1 is refused. (Without terminal states: the test above.)"""
    prob = _problem()
    theta = prob.theta0 + 0.1
    exact = tabular.exact_hypergradient(prob, theta, 0.5)
    np.testing.assert_allclose(
        truncated_hypergradient(prob, theta, 0.5, 2000), exact, rtol=1e-9, atol=1e-12
    )
    short = truncated_hypergradient(prob, theta, 0.5, 5)
    assert np.linalg.norm(short - exact) > 1e-3 * np.linalg.norm(exact)
    with pytest.raises(ValueError, match="horizon"):
        truncated_hypergradient(prob, theta, 0.5, 0)


def test_discount_weight_beyond_the_cut():
    """P(K + J >= H) for geometric K, J (gamma_L, gamma_F): (1 + H (1 - gamma)) gamma^H for equal
    discounts, at least max(gamma_L, gamma_F)^H, gamma_F^H for a myopic leader, 1 at H = 0."""
    assert discount_weight_beyond(0.9, 0.9, 10) == pytest.approx(2 * 0.9**10)
    assert discount_weight_beyond(0.95, 0.9, 30) == pytest.approx(0.3697, abs=1e-4)
    for gL, gF in ((0.9, 0.85), (0.5, 0.99), (0.95, 0.9)):
        for H in (1, 10, 40):
            assert discount_weight_beyond(gL, gF, H) >= max(gL, gF) ** H
    assert discount_weight_beyond(0.0, 0.5, 3) == pytest.approx(0.5**3)
    assert discount_weight_beyond(0.9, 0.8, 0) == 1.0
    rng = np.random.default_rng(0)
    K, J = rng.geometric(0.1, 200_000) - 1, rng.geometric(0.15, 200_000) - 1
    assert discount_weight_beyond(0.9, 0.85, 10) == pytest.approx(np.mean(K + J >= 10), abs=0.01)


@pytest.mark.slow
def test_check_problem_judges_the_cut_by_its_exact_bias(x64, capsys):
    """gamma_L = 0, gamma_F 0.9, H 20: the discount weight beyond the cut is 0.12 but the
    first-episode forms' exact cut bias is ~1e-11, so no warning (it used to warn on the
    weight). The printed line compares the mean with the truncated target too (a check whose
    only gap was the cut read "EXACT MISMATCH" and nothing else). The only warning is the one
    on its resolution (85% of the gradient's norm at 20 batches)."""
    prob = random_tabular_cmdp(jax.random.key(3), gamma_F=0.9, gamma_L=0.0, dtype=jnp.float64)
    prob = type(prob)(**{**prob.__dict__, "time_limit": 20})
    config = TrainConfig(
        num_envs=16, num_steps=20, grouping="first_episode", partial="first_episode"
    )
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        (row,) = tabular.check_problem(prob, [prob.theta0], 0.5, config=config, batches=20)
    said = [str(w.message) for w in caught]
    assert len(said) == 1 and "this pass says little" in said[0] and row["rel_se"] > 0.5, said
    assert row["truncated"] == 1.0 and row["cut_weight"] > 0.1 and row["cut_bias"] < 1e-9
    out = capsys.readouterr().out
    assert "vs the truncated target: bias" in out and "cut_bias" in out
    # the reference convention keeps the bound: it warns
    with pytest.warns(UserWarning, match="cut at step 20"):
        tabular.check_problem(
            prob,
            [prob.theta0],
            0.5,
            config=TrainConfig(num_envs=16, num_steps=20),
            batches=4,
            verbose=False,
        )


def _rare_guide_problem():
    """3 states (state 2 terminal), 2 actions: theta pays the follower's action 0, which it plays
    with probability 1 - 7e-6 at state 1 (beta 0.05), so theta never acts at the rare action 1,
    yet the follower's response there carries a guiding term as large as the exact gradient."""
    S, B = 3, 2
    rng = np.random.default_rng(4)
    logits, rF0, rL0 = rng.normal(size=(S, B, S)), rng.normal(size=(S, B)), rng.normal(size=(S, B))
    return tabular.TabularCMDP(
        transition=lambda th: jax.nn.softmax(jnp.asarray(logits), -1),
        init_dist=lambda th: jnp.ones(S) / S,
        follower_reward=lambda th: jnp.asarray(rF0).at[:, 0].add(th[0] + 0.5),
        leader_reward=lambda th: jnp.asarray(rL0),
        gamma_F=0.95,
        gamma_L=0.6,
        theta0=jnp.array([0.1]),
        terminal=np.array([False, False, True]),
    ).validate()


@pytest.mark.slow
def test_the_rare_part_is_theorem_1s_term_of_the_rare_pairs(x64):
    # the part of the expectation from the episodes that visit a rare pair is that pair's term of
    # Theorem 1, d_L(s) g(b|s) Ben(s, b) dQF(s, b) / beta (paths through it weigh ~g more
    # again); stopping theta's effect on the tables there (the check before) left it whole
    from bchg_jax.tabular.check import _truncated

    prob, beta = _rare_guide_problem(), 0.05
    theta = prob.theta0
    br = tabular.best_response(prob, theta, beta)
    V_L, Q_L = tabular.leader_values(prob, theta, br.policy)
    rare = np.asarray(br.policy) < 1e-3
    assert rare.sum() == 3 and br.policy[1, 1] > 1e-6
    whole = _truncated(prob, theta, beta, 300, br, V_L, Q_L)
    np.testing.assert_allclose(whole, tabular.exact_hypergradient(prob, theta, beta), rtol=1e-9)
    every = np.ones(3, bool)
    kept_all = _truncated(prob, theta, beta, 300, br, V_L, Q_L, np.ones((3, 2), bool), every)
    np.testing.assert_array_equal(kept_all, whole)
    part = whole - _truncated(prob, theta, beta, 300, br, V_L, Q_L, ~rare, every)
    # Theorem 1's term of each pair: first-episode occupancy (state 2 ends it) x guiding weight
    dQF = jax.jacobian(lambda t: tabular.best_response(prob, t, beta).Q)(theta)[..., 0]
    P = prob.transition(theta) * np.array([1.0, 1.0, 0.0])[:, None, None]
    P_g = jnp.einsum("sb,sbt->st", br.policy, P)
    d = jnp.linalg.solve(jnp.eye(3) - prob.gamma_L * P_g.T, prob.init_dist(theta))
    term = d[:, None] * br.policy * (Q_L - V_L[:, None]) * dQF / beta
    np.testing.assert_allclose(part, jnp.sum(jnp.where(rare, term, 0.0)), rtol=1e-3)
    assert abs(float(part[0])) > 0.5 * abs(float(whole[0]))  # as large as the gradient


def _readme_problem():
    """The README's 6-state problem: the follower is paid theta[1] for action 0, which it
    takes with probability 4e-6 at beta 0.08."""
    S, B = 6, 2
    return tabular.TabularCMDP(
        transition=lambda th: jax.nn.softmax(jnp.zeros((S, B, S)).at[:, 0, 0].add(th[0]), -1),
        init_dist=lambda th: jnp.ones(S) / S,
        follower_reward=lambda th: jnp.stack([jnp.full(S, th[1]), jnp.ones(S)], -1),
        leader_reward=lambda th: jnp.zeros((S, B)).at[:, 0].set(1.0).at[0, 0].set(3.0),
        leader_regularizer=lambda th: -0.05 * jnp.sum(th**2),
        gamma_F=0.9,
        gamma_L=0.9,
        theta0=jnp.zeros(2),
        time_limit=100,
    ).validate()


@pytest.mark.slow
def test_check_problem_does_not_call_a_rare_actions_response_bias():
    # BC-HG's first-episode form is unbiased here, but the rare action's guiding segments are
    # never sampled: the mean is ~40 SE off the exact value and within 2 SE of the rest (the
    # check compared with the exact value less theta's effect on the tables, that is with the
    # exact value itself, and read bias with p = 1e-16 and no warning)
    prob = _rare_guide_problem()
    config = TrainConfig(
        num_envs=16, num_steps=300, grouping="first_episode", partial="first_episode"
    )
    with pytest.warns(UserWarning, match="not resolved rather than biased"):
        (row,) = tabular.check_problem(
            prob, [prob.theta0], 0.05, config=config, batches=400, verbose=False
        )
    assert row["p_value"] < 1e-6 and row["truncated"] == 0
    assert row["rare_share"] > 0.5 and row["resolved_p_value"] > 0.01


@pytest.mark.slow
def test_check_problem_tells_pairs_it_never_sampled_from_bias(capsys):
    # BC-HG is unbiased, but theta acts only through an action of probability 4e-6 that 400
    # batches of 4 x 100 steps sample about once: the plain comparison reads as bias
    prob = _readme_problem()
    config = TrainConfig(num_envs=4, num_steps=100)
    with pytest.warns(UserWarning, match="not resolved rather than biased"):
        (row,) = tabular.check_problem(prob, [prob.theta0], 0.08, config=config, batches=400)
    assert row["p_value"] < 1e-3 and row["bias_se"] > 100
    assert row["rare_share"] > 0.99 and row["resolved_p_value"] > 0.01
    assert "of the exact value carried by pairs sampled < 30 times" in capsys.readouterr().out
    # at beta 0.25 (probability 0.018) nothing is rare and the plain comparison passes
    (row,) = tabular.check_problem(prob, [prob.theta0], 0.25, config=config, batches=400)
    assert row["p_value"] > 0.01 and np.isnan(row["rare_share"])
    # a biased estimator stays biased on what the batches resolve (Naive-PGD misses the
    # follower's response; some of its pairs have probabilities down to 1e-14)
    rnd = random_tabular_cmdp(jax.random.key(3), num_states=6, dim=4, scale=3.0)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        (row,) = tabular.check_problem(
            rnd,
            [rnd.theta0],
            0.1,
            config=TrainConfig(num_envs=4, num_steps=50),
            batches=200,
            method="naive",
            verbose=False,
        )
    assert row["p_value"] < 1e-6 and row["resolved_p_value"] < 1e-6
    assert 0 < row["rare_share"] < 0.1
    assert not any("not resolved" in str(w.message) for w in caught)
