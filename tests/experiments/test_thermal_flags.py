"""``experiments.thermal``'s flags reach the ``lq.TrainConfig`` it trains with: every estimator
and MLP-critic flag, ``--faithful``'s estimator, the ``--smoke`` caps, the learning-rate and
beta grid, and the documented defaults (docs/experiments.md: 10 seeds x 2000 iterations of 100
episodes, lr in {0.1, 0.01, 0.001}, initial weights N(0, 0.01^2), a 100-iteration window)."""

import numpy as np
import pytest

from experiments import thermal as cli


def test_thermal_defaults_match_the_documents():
    """The documented protocol and the default estimator (pathwise, baseline and control
    variates on, cross-fitted quadratic critic)."""
    a = cli.parse_args([])
    assert (a.seeds, a.iterations, a.episodes, a.lr, a.beta) == (10, 2000, 100, [0.1], 0.1)
    assert (a.init_std, a.critic, a.follower_grad) == (0.01, "quadratic_loo", "pathwise")
    c = cli.train_config(a)
    assert (c.state_baseline, c.control_variates, c.weights_init_std) == (True, True, 0.01)
    assert (c.num_episodes, c.iterations) == (100, 2000)
    assert cli.SUMMARY_WINDOW == 100
    assert cli.COMPONENTS == ("J", "stability", "hvac_energy", "insulation", "airflow")


def test_thermal_every_estimator_flag_reaches_the_config():
    """Each flag sets its own TrainConfig field (none is dropped or fixed at its default)."""
    argv = ["--critic", "mlp", "--follower-grad", "score", "--no-baseline"]
    argv += ["--no-control-variates", "--init-std", "0.5", "--episodes", "7"]
    argv += ["--mlp-steps", "33", "--mlp-warm-start", "--mlp-minibatch", "128"]
    argv += ["--mlp-normalize", "--value-samples", "16", "--mlp-lr", "0.001"]
    a = cli.parse_args(argv)
    cli.validate_args(a)
    c = cli.train_config(a)
    assert (c.critic, c.follower_grad) == ("mlp", "score")
    assert (c.state_baseline, c.control_variates) == (False, False)
    assert (c.weights_init_std, c.num_episodes, c.mlp_steps) == (0.5, 7, 33)
    assert (c.mlp_warm_start, c.mlp_minibatch, c.mlp_normalize) == (True, 128, True)
    assert (c.value_samples, c.mlp_lr) == (16, 0.001)
    # each negation alone touches only its own field
    c = cli.train_config(cli.parse_args(["--no-baseline"]))
    assert (c.state_baseline, c.control_variates) == (False, True)
    c = cli.train_config(cli.parse_args(["--no-control-variates"]))
    assert (c.state_baseline, c.control_variates) == (True, False)


def test_thermal_faithful_is_the_papers_estimator():
    """--faithful: MLP critic, score-function FollowerQGrad, no baseline, no control variates."""
    a = cli.parse_args(["--faithful"])
    c = cli.train_config(a)
    assert (c.critic, c.follower_grad) == ("mlp", "score")
    assert (c.state_baseline, c.control_variates) == (False, False)
    assert (c.mlp_steps, c.value_samples, c.mlp_lr) == (5000, 256, 1e-4)


def test_thermal_smoke_caps_episodes_and_the_mlp_critic():
    """--smoke: at most 4 episodes, 5 MLP critic steps and 8 value samples (explicit smaller
    values are kept)."""
    a = cli.parse_args(["--smoke"])
    assert (a.episodes, a.mlp_steps, a.value_samples) == (4, 5, 8)
    a = cli.parse_args(["--smoke", "--episodes", "2"])
    assert a.episodes == 2


def test_thermal_grid_carries_lr_and_beta():
    """The grid's learning rates and its beta column come from --lr / --grid paper and --beta."""
    g = cli.method_grid(cli.parse_args(["--lr", "0.3", "0.03", "--beta", "0.2"]))
    assert np.allclose(g["lr"], [0.3, 0.03]) and np.allclose(g["beta"], [0.2, 0.2])
    g = cli.method_grid(cli.parse_args(["--grid", "paper", "--beta", "0.05"]))
    assert np.allclose(g["lr"], [0.1, 0.01, 0.001]) and np.allclose(g["beta"], 0.05)


def test_thermal_init_std_zero_is_allowed():
    """--init-std must be finite and >= 0: 0 (theta exactly 0.5) is a valid start."""
    cli.validate_args(cli.parse_args(["--init-std", "0"]))
    assert cli.train_config(cli.parse_args(["--init-std", "0"])).weights_init_std == 0.0


def test_thermal_takes_the_lag_follower():
    """--follower lag --follower-mix reaches the trainer's config (the LQ family simulates it);
    q_learning is no choice of this command."""
    from bchg_jax.core.follower_model import FollowerModel

    a = cli.parse_args(["--follower", "lag", "--follower-mix", "0.3"])
    assert cli.train_config(a).follower == FollowerModel("lag", mix=0.3)
    with pytest.raises(SystemExit):
        cli.parse_args(["--follower", "q_learning"])
