"""``experiments.toy_game``'s flags reach the ``games.tabular.TrainConfig``, game and grid it
trains with: the documented defaults (docs/experiments.md: R = 2, beta 0.05, 10 seeds x 500
iterations, a 50-iteration window), every estimator flag, the (actor, critic) steps grid of
``--grid paper`` ({1, 2, 5, 10, 20}^2), and each variant's buffer (captured in-process,
nothing trained)."""

import numpy as np
from cli_capture import captured_run

from experiments import toy_game as cli


def _captured_run(argv, name, monkeypatch, tmp_path):
    return captured_run(
        monkeypatch,
        tmp_path,
        cli,
        argv,
        name,
        ("bchg_jax.problems.toy_game", "toy_game"),
        "bchg_jax.games.tabular",
        "validate_args",
    )


def test_toy_game_defaults_match_the_documents():
    """R = 2, beta 0.05, one actor and one critic step, the reference estimator settings,
    10 seeds x 500 iterations, window 50."""
    a = cli.parse_args([])
    assert (a.R, a.beta, a.seeds, a.iterations) == (2.0, 0.05, 10, 500)
    assert (a.actor_steps, a.critic_steps) == ([1], [1])
    assert (a.backup, a.critic_target, a.direct_baseline) == ("reference",) * 3
    assert (a.actor, a.init) == ("mlp", "torch")
    assert cli.SUMMARY_WINDOW == 50
    assert cli.methods_of("all") == ["bchg", "naive_on", "naive_off", "biac_on", "biac_off"]


def test_toy_game_estimator_flags_reach_the_config():
    """--backup, --critic-target, --direct-baseline, --actor, --init and --iterations each set
    their own TrainConfig field."""
    argv = ["--backup", "paper", "--critic-target", "paper", "--direct-baseline", "state"]
    argv += ["--actor", "tabular", "--init", "flax", "--iterations", "37"]
    c = cli.train_config(cli.parse_args(argv), "off")
    assert (c.backup, c.critic_target, c.direct_baseline) == ("paper", "paper", "state")
    assert (c.actor, c.init, c.iterations, c.buffer) == ("tabular", "flax", 37, "off")
    c = cli.train_config(cli.parse_args(["--direct-baseline", "none"]), "on")
    assert (c.direct_baseline, c.backup, c.buffer) == ("none", "reference", "on")


def test_toy_game_grid_pairs_actor_and_critic_steps():
    """--actor-steps / --critic-steps form their product, actor steps in the actor column;
    --grid paper is {1, 2, 5, 10, 20}^2; the beta column is --beta."""
    g = cli.method_grid(cli.parse_args(["--actor-steps", "2", "5", "--critic-steps", "10"]))
    pairs = set(zip(g["actor_steps"].tolist(), g["critic_steps"].tolist(), strict=True))
    assert pairs == {(2, 10), (5, 10)}
    g = cli.method_grid(cli.parse_args(["--grid", "paper", "--beta", "0.2"]))
    pairs = set(zip(g["actor_steps"].tolist(), g["critic_steps"].tolist(), strict=True))
    steps = (1, 2, 5, 10, 20)
    assert len(g["actor_steps"]) == 25 and pairs == {(x, y) for x in steps for y in steps}
    assert np.allclose(g["beta"], 0.2)


def test_toy_game_variants_train_their_buffer_and_game(monkeypatch, tmp_path):
    """Each variant's method and buffer reach make_train, with the game of --R."""
    for name, method, buffer in (
        ("bchg", "bchg", "on"),
        ("bchg_off", "bchg", "off"),
        ("naive_on", "naive", "on"),
        ("naive_off", "naive", "off"),
        ("biac_on", "biac", "on"),
        ("biac_off", "biac", "off"),
    ):
        seen = _captured_run(["--R", "3", "--method", name], name, monkeypatch, tmp_path)
        assert (seen["method"], seen["config"].buffer) == (method, buffer), name
        args, kw = seen["problem_args"]
        assert 3.0 in list(args) + list(kw.values()), name
        assert seen["window"] == 50 and "R=3" in seen["title"]
        assert seen["describe"] == f"toy game R=3 {method} buffer={buffer}"
