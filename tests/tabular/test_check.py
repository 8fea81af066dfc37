"""tabular.check_problem: the estimator's mean over batches vs the exact hypergradient."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from bchg_jax import tabular
from bchg_jax.problems import random_tabular_cmdp
from bchg_jax.tabular import TrainConfig


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


def test_check_problem_rejects_bad_arguments():
    prob = random_tabular_cmdp(jax.random.key(0))
    with pytest.raises(ValueError, match="method"):
        tabular.check_problem(prob, [prob.theta0], 0.5, method="exact")
    with pytest.raises(ValueError, match="critic"):
        tabular.check_problem(prob, [prob.theta0], 0.5, critic="sarsa")
    with pytest.raises(ValueError, match="batches"):
        tabular.check_problem(prob, [prob.theta0], 0.5, batches=1)
