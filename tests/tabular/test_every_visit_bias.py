"""The every-visit forms (the reference convention, ``TrainConfig``'s defaults) are biased by a
cut however many episodes a stream holds: their means reuse the segments of visits late in an
episode, which the cut shortens, for every visit. The docs called it an O(1 / episodes per
stream) bias of the ratio forms; ``make_train`` now names it (``every_visit_share``)."""

import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from bchg_jax import tabular
from bchg_jax.core.bias_check import every_visit_share
from bchg_jax.problems import random_tabular_cmdp
from bchg_jax.tabular import TrainConfig


def test_every_visit_share_is_the_mean_discount_lost_by_a_cut():
    """The mean over k < H of gamma^(H - k), ~1 / ((1 - gamma) H)."""
    for gamma, H in ((0.9, 40), (0.85, 7), (0.99, 1000), (0.5, 1)):
        mean = np.mean([gamma ** (H - k) for k in range(H)])
        assert every_visit_share(gamma, H) == pytest.approx(mean, rel=1e-12)
    assert every_visit_share(0.0, 5) == 0.0
    assert every_visit_share(0.9, 200) == pytest.approx(0.9 / (0.1 * 200), rel=1e-6)
    with pytest.raises(ValueError, match="horizon"):
        every_visit_share(0.9, 0)


def _warnings(problem, method, **config):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        tabular.make_train(problem, method, TrainConfig(**config))
    return [str(w.message) for w in caught if "no terminal state" in str(w.message)]


def test_make_train_names_the_every_visit_forms_bias_of_a_cut():
    """No terminal state, a time limit of 40 (gamma_L 0.9, gamma_F 0.85): the every-visit partial
    term loses ~0.22 and the every-visit grouping ~0.14 (the slow test below measures 19%); the
    first-episode forms are named only for the discount weight beyond the cut. Below
    EVERY_VISIT_WARN (0.1) the every-visit forms are not named: a time limit of 100 (0.09, the
    README's example) leaves 2.9e-4 of the discount weight beyond it, and says nothing."""
    p = random_tabular_cmdp(jax.random.key(0), time_limit=40)
    (w,) = _warnings(p, "bchg", num_envs=4, num_steps=400)
    assert "partial='every_visit' (0.22)" in w and "grouping='every_visit' (0.14)" in w
    assert "however many episodes" in w and "0.037 of the discount weight" in w
    first = dict(grouping="first_episode", partial="first_episode")
    (w,) = _warnings(p, "bchg", num_envs=4, num_steps=400, **first)
    assert "every-visit" not in w and "0.037 of the discount weight" in w
    # the guides without FollowerQGrad segments read no grouping; HPGD's is every-visit
    (w,) = _warnings(p, "sobirl", num_envs=4, num_steps=400)
    assert "partial='every_visit'" in w and "grouping" not in w.split("add a bias")[0]
    (w,) = _warnings(p, "hpgd_mc", num_envs=4, num_steps=400, partial="first_episode")
    assert "grouping='every_visit' (0.14)" in w and "partial='every_visit'" not in w
    # gamma_F 0.5: the grouping's share 0.05 is not named, the partial term's 0.22 is
    (w,) = _warnings(random_tabular_cmdp(jax.random.key(0), gamma_F=0.5, time_limit=40), "bchg")
    assert "partial='every_visit' (0.22)" in w and "grouping='every_visit'" not in w
    quiet = random_tabular_cmdp(jax.random.key(0), time_limit=100)
    assert every_visit_share(0.9, 100) == pytest.approx(0.09, abs=1e-3)
    assert not _warnings(quiet, "bchg", num_steps=100)


@pytest.mark.slow
def test_the_every_visit_forms_are_biased_with_ten_episodes_per_stream(x64):
    """Time limit 40, no terminal state, 4 streams of 400 steps (10 episodes each), exact
    critics, 800 batches: the default every-visit form's mean is 19% off the exact gradient
    (every_visit_share 0.22 / 0.14), 7.6 SE from the truncated target, while the ratio forms
    (per_visit / trajectory, which the docs said carried the O(1 / episodes per stream) bias)
    are 0.6 SE from it. Measured (2-core x86_64, float64): relative error 0.190 +- 0.043 and
    0.036 +- 0.063 (the first-episode forms: 0.22 +- 0.20, 1.6 SE; cut_bias 0.015)."""
    p = random_tabular_cmdp(jax.random.key(0), time_limit=40, dtype=jnp.float64)
    theta = [jnp.asarray(p.theta0) + 0.3]

    def row(**forms):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            config = TrainConfig(num_envs=4, num_steps=400, **forms)
            return tabular.check_problem(p, theta, 0.5, config=config, batches=800)[0]

    every = row()
    assert every["truncated_bias_se"] > 5.0 and every["rel_error"] > 0.1
    ratio = row(grouping="per_visit", partial="trajectory")
    assert ratio["truncated_bias_se"] < 3.5
