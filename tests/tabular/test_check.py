"""tabular.check_problem: the estimator's mean over batches vs the exact hypergradient."""

import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from bchg_jax import tabular
from bchg_jax.problems import random_tabular_cmdp
from bchg_jax.tabular import TrainConfig
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
    (``truncated`` 1, ``cut_weight`` 0.9^10) with a warning, and the estimate is biased (measured
    34%, 15.9 SE over 800 batches). Episodes that end at a terminal state within the batch: no
    warning."""
    prob = random_tabular_cmdp(jax.random.key(3), dtype=jnp.float64, time_limit=10)
    config = TrainConfig(
        num_envs=16, num_steps=10, grouping="first_episode", partial="first_episode"
    )
    with pytest.warns(UserWarning, match="cut at step 10"):
        (row,) = tabular.check_problem(
            prob, [prob.theta0], 0.5, config=config, batches=200, verbose=False
        )
    assert row["truncated"] == 1.0
    np.testing.assert_allclose(row["cut_weight"], 0.9**10)
    assert row["bias_se"] > 4.0 and row["rel_error"] > 0.2, (row["z"], row["rel_error"])
    terminal = TrainConfig(num_envs=16, num_steps=60, grouping="first_episode")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        ended = _problem()
        (row,) = tabular.check_problem(
            ended, [ended.theta0], 0.5, config=terminal, batches=8, verbose=False
        )
    assert row["truncated"] < 0.1 and row["cut_weight"] < 1e-3


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


def test_check_problem_cut_weight_uses_the_slower_discount():
    """The guiding term's FollowerQGrad segments are discounted by gamma_F: a cut at H loses
    ~max(gamma_L, gamma_F)^H of the gradient. gamma_F 0.99, gamma_L 0.5, H 40: cut_weight is
    0.99^40 = 0.67 with a warning (before: 0.5^40 = 9e-13 and no warning, while the estimate was
    biased by 68%, 225 SE)."""
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
    with pytest.warns(UserWarning, match=r"max\(gamma_L, gamma_F\)\^40 = 0.669"):
        (row,) = tabular.check_problem(prob, [prob.theta0], 1.0, config=config, batches=4)
    assert row["truncated"] == 1.0
    np.testing.assert_allclose(row["cut_weight"], 0.99**40)
