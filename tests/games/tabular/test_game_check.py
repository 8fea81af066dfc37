"""games.tabular.check_problem: Theorem 2's estimator against the exact hypergradient on a game.

On a random 5-state game (the ``backup_game`` fixture: in exact expectation the estimator
under the reference backup is 76% off that backup's hypergradient, cosine 0.66,
``test_backup_expectation.py``) the check passes BC-HG under the paper backup and exposes both
the reference backup's bias and Naive-PGD's."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from bchg_jax.games.tabular import check_problem


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
