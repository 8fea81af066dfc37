"""``experiments.lqr_game``'s flags reach the ``games.lqr.TrainConfig`` and grid it trains with
(each flag its own field, under either preset), ``--clip-scope``'s clipping per variant,
``--smoke``'s warm-up cap, the warm-up warning at its boundary and the refusal to extend a
cosine-decay run (a constant-rate run may be extended); an exact method's grid has no critic
steps."""

import dataclasses
import json

import numpy as np
import pytest

from experiments import lqr_game as cli


def test_lqr_game_each_flag_sets_its_config_field():
    """--actor-lr, --actor-lr-schedule, --critic-lr, --explore-std, --explore-episodes,
    --replay, --tau, --minibatch, --iterations and --estimator override the preset's values."""
    from bchg_jax.games.lqr.presets import ESTIMATORS, PRESETS

    argv = ["--actor-lr", "0.05", "--actor-lr-schedule", "constant", "--critic-lr", "0.003"]
    argv += ["--explore-std", "0.7", "--explore-episodes", "2", "--replay", "40", "--tau", "0.5"]
    argv += ["--minibatch", "32", "--iterations", "300", "--estimator", "reference"]
    c = cli.train_config(cli.parse_args(argv), "bchg")
    assert (c.actor.lr, c.actor.lr_schedule, c.critic.lr) == (0.05, "constant", 0.003)
    assert (c.exploration.std, c.exploration.episodes, c.critic.replay) == (0.7, 2, 40)
    assert (c.tau, c.minibatch, c.iterations) == (0.5, 32, 300)
    base = PRESETS["explore"]().config.estimator
    assert c.estimator == dataclasses.replace(base, **ESTIMATORS["reference"])
    assert c.estimator != cli.train_config(cli.parse_args([]), "bchg").estimator


def test_lqr_game_variant_buffers_and_clip_scope():
    """naive / naive_on train on the on-policy buffer, naive_off off-policy; --clip-scope
    reference clips only BC-HG, all clips every variant at --clip."""
    a = cli.parse_args(["--clip", "0.5"])
    assert cli.train_config(a, "naive").buffer == "on"
    assert cli.train_config(a, "naive_off").buffer == "off"
    assert all(cli.train_config(a, m).actor.clip == 0.5 for m in ("bchg", "naive", "bchg_det"))
    r = cli.parse_args(["--preset", "reference", "--clip", "0.5"])
    assert cli.train_config(r, "bchg").actor.clip == 0.5
    assert cli.train_config(r, "naive_on").actor.clip == 0.0


def test_lqr_game_grid_carries_critic_steps_and_beta():
    """The grid's critic_steps and beta columns are the flags', beside each actor step."""
    g = cli.method_grid(
        cli.parse_args(["--actor-steps", "3", "4", "--critic-steps", "7", "--beta", "0.2"])
    )
    assert g["actor_steps"].tolist() == [3, 4]
    assert g["critic_steps"].tolist() == [7, 7] and np.allclose(g["beta"], 0.2)
    g = cli.method_grid(cli.parse_args(["--grid", "paper"]))
    assert g["actor_steps"].tolist() == [1, 2, 5, 10] and g["critic_steps"].tolist() == [20] * 4


def test_lqr_game_smoke_caps_the_warmup():
    """--smoke: at most 800 warm-up steps."""
    assert cli.parse_args(["--smoke"]).warmup_steps == 800
    assert cli.parse_args(["--smoke", "--warmup-steps", "400"]).warmup_steps == 400


def test_lqr_game_warmup_warning_at_its_boundary(capsys):
    """A run whose iterations equal the warm-up's (200 under the explore preset) never updates
    the leader: warned."""
    cli.validate_args(cli.parse_args(["--iterations", "200", "--method", "bchg_det"]))
    assert "no method updates the leader" in capsys.readouterr().err


def test_lqr_game_only_a_cosine_run_refuses_extension():
    """Extending a constant-rate run is fine; a cosine-decay run's extension is refused."""
    a = cli.parse_args(["--iterations", "3000", "--actor-lr-schedule", "constant"])
    a._saved_iterations = 2000
    cli.validate_args(a)
    b = cli.parse_args(["--iterations", "3000"])
    b._saved_iterations = 2000
    with pytest.raises(ValueError, match="would restart the decay"):
        cli.validate_args(b)


def test_lqr_game_actor_steps_bound_follows_critic_steps():
    """The actor-steps bound is max(10, --critic-steps): 15 actor steps with 5 critic steps are
    refused, with 15 critic steps accepted (the trainer's max_steps is that bound)."""
    a = cli.parse_args(["--actor-steps", "15", "--critic-steps", "5"])
    assert cli.train_config(a, "bchg").max_steps == 10
    with pytest.raises(ValueError):
        cli.validate_args(a)
    b = cli.parse_args(["--actor-steps", "15", "--critic-steps", "15"])
    assert cli.train_config(b, "bchg").max_steps == 15
    cli.validate_args(b)


def test_lqr_game_follower_flags():
    """--follower k_step --follower-steps K and --track-reference reach TrainConfig.follower /
    track_reference of every variant; the best response is the default; the tabular families'
    models are refused by the parser, --follower-steps without k_step by name."""
    from bchg_jax.core.follower_model import FollowerModel

    a = cli.parse_args(["--follower", "k_step", "--follower-steps", "3"])
    for name in ("bchg", "bchg_det", "exact"):
        assert cli.train_config(a, name).follower == FollowerModel("k_step", steps=3)
    assert cli.train_config(cli.parse_args([]), "bchg").follower == FollowerModel()
    assert cli.train_config(cli.parse_args([]), "bchg").track_reference is False
    tracked = cli.parse_args(["--track-reference"])
    assert all(cli.train_config(tracked, m).track_reference for m in ("bchg", "exact"))
    with pytest.raises(SystemExit):
        cli.parse_args(["--follower", "lag"])
    with pytest.raises(ValueError, match="--follower-steps"):
        cli.train_config(cli.parse_args(["--follower-steps", "3"]), "bchg")
    assert "follower_steps" in cli.SETTING_KEYS


def test_lqr_game_reaction_flag():
    """--reaction policy_score reaches EstimatorConfig.reaction (default q_gradient, Theorem 3);
    without bchg_det among the methods the flag is refused as unread."""
    a = cli.parse_args(["--reaction", "policy_score", "--method", "bchg_det"])
    assert cli.train_config(a, "bchg_det").estimator.reaction == "policy_score"
    assert cli.train_config(cli.parse_args([]), "bchg_det").estimator.reaction == "q_gradient"
    cli.validate_args(a)
    with pytest.raises(ValueError, match="reaction"):
        cli.validate_args(cli.parse_args(["--reaction", "policy_score", "--method", "bchg"]))
    assert "reaction" in cli.SETTING_KEYS


def test_lqr_game_influence_cv_flag():
    """--influence-cv sets EstimatorConfig.influence_cv (default: the preset's, on in explore
    and off in reference) and is refused as unread without a BC-HG method; runs saved before
    the flag read as their preset's value."""
    from experiments.cli import with_legacy

    def cv(argv, method="bchg"):
        return cli.train_config(cli.parse_args(argv), method).estimator.influence_cv

    assert cv([]) is True and cv(["--preset", "reference"]) is False
    assert cv(["--influence-cv", "off"]) is False
    assert cv(["--influence-cv", "off"], "bchg_det") is False
    cli.validate_args(cli.parse_args(["--influence-cv", "off", "--method", "bchg_det"]))
    with pytest.raises(ValueError, match="--influence-cv would be ignored"):
        cli.validate_args(cli.parse_args(["--influence-cv", "off", "--method", "naive,exact"]))
    assert cv(["--preset", "reference", "--influence-cv", "on"]) is True
    assert "influence_cv" in cli.SETTING_KEYS
    # runs saved before the flag had the preset's value (a resumed one keeps it)
    dests = vars(cli.parse_args([]))
    assert with_legacy({"preset": "explore"}, dests)["influence_cv"] == "on"
    assert with_legacy({"preset": "reference"}, dests)["influence_cv"] == "off"


@pytest.mark.slow
def test_an_axis_the_method_never_reads_is_left_out_of_its_grid(tmp_path, capsys):
    """The exact methods train no critic (``trainer.unread``): their grid, config.json, tables
    and summary.csv carried critic_steps 20, a setting with no effect. It is left out (the
    trainer takes its default), and the run's table names the actor steps alone."""
    run = tmp_path / "run"
    argv = ["--smoke", "--method", "exact", "--seeds", "1", "--iterations", "2", "--chunk", "2"]
    cli.main(argv + ["--out", str(run), "--exact-out"])
    assert json.loads((run / "exact" / "config.json").read_text())["grid"].keys() == {
        "actor_steps",
        "beta",
    }
    assert "critic_steps" not in (run / "exact" / "summary.csv").read_text()
    assert "exact  actor_steps=1 beta=0.1 " in capsys.readouterr().out
