"""Bad input gets a clear error before anything compiles, and nothing already written is lost.

Library entry points raise ``ValueError`` naming the problem; the experiment CLIs exit with
status 2 and an ``error: ...`` line. Every check here runs on the host before a training
program is traced.
"""

import importlib
import os
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from small_problems import cmdp as _cmdp
from small_problems import lq as _lq

from bchg_jax.core.sweep import product_grid
from bchg_jax.games.tabular.game import TabularGame
from bchg_jax.problems.lqr_game import lqr_game

S, B = 3, 2


# ---- problems --------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "make, match",
    [
        (lambda: _cmdp(transition=lambda th: jnp.full((S, B, S + 1), 1.0 / (S + 1))), "shape"),
        (lambda: _cmdp(leader_reward=lambda th: jnp.ones((S, B + 1))), "shape"),
        (lambda: _lq(Qbar=np.eye(3)), "Qbar"),
        (lambda: _lq(B_fn=lambda th: jnp.ones((3, 1))), r"B\(theta\)"),
        (lambda: lqr_game(C=np.zeros((3, 1))), "shape"),
        (lambda: lqr_game(s0=np.zeros(3)), "s0"),
    ],
)
def test_wrong_shapes(make, match):
    with pytest.raises(ValueError, match=match):
        make().validate()


@pytest.mark.parametrize(
    "make",
    [
        lambda: _cmdp(gamma_F=1.0),
        lambda: _cmdp(gamma_L=1.5),
        lambda: _lq(gamma_F=1.0),
        lambda: lqr_game(gamma_L=1.0),
    ],
)
def test_discount_not_below_one(make):
    with pytest.raises(ValueError, match="gamma"):
        make().validate()


def test_non_stochastic_transition_rows():
    with pytest.raises(ValueError, match="sum"):
        _cmdp(transition=lambda th: jnp.full((S, B, S), 0.3)).validate()
    with pytest.raises(ValueError, match="probab"):
        _cmdp(init_dist=lambda th: jnp.array([0.5, 0.6, -0.1])).validate()
    # a row summing to 1 with a negative entry is named (it was reported as "first bad: []")
    neg = np.full((S, B, S), 1.0 / S)
    neg[1, 0] = [1.2, -0.2] + [0.0] * (S - 2)
    with pytest.raises(ValueError, match=r"entries >= 0.*first bad \(s, b\): \[1, 0\]"):
        _cmdp(transition=lambda th: jnp.asarray(neg, th.dtype)).validate()
    # non-finite input is called that, not a bad probability row
    with pytest.raises(ValueError, match=r"transition\(theta\) has non-finite entries"):
        _cmdp(transition=lambda th: jnp.full((S, B, S), jnp.nan)).validate()
    with pytest.raises(ValueError, match=r"leader_regularizer\(theta\) has non-finite"):
        _cmdp(leader_regularizer=lambda th: jnp.asarray(jnp.nan)).validate()
    with pytest.raises(ValueError, match="theta must be finite"):
        _cmdp().validate(jnp.full_like(_cmdp().theta0, jnp.nan))
    game = TabularGame(
        transition=np.full((S, 2, B, S), 0.3),
        init_dist=np.full(S, 1.0 / S),
        follower_reward=np.zeros((S, 2, B)),
        leader_reward=np.zeros((S, 2, B)),
        gamma_F=0.9,
        gamma_L=0.9,
    )
    with pytest.raises(ValueError, match="sum|probab"):
        game.validate()


def test_row_sum_tolerance_scales_with_the_discount():
    """Rows a little off 1 (a table printed to 5 decimals) are refused where the sampled MDP (rows
    normalised) and the solvers' (rows as given) would differ by more than ~0.1%; float32 rows
    normalised in float32 pass at any discount."""
    rng = np.random.default_rng(0)
    P = rng.dirichlet(np.ones(S), size=(S, B))
    P[0, 0] += [2e-5, 0.0, 0.0]  # its sum off 1 by 2e-5, as in a table printed to 5 decimals
    for gamma, ok in ((0.9, True), (0.99, False), (0.999, False)):
        cmdp = _cmdp(transition=lambda th: jnp.asarray(P, th.dtype), gamma_F=gamma, gamma_L=gamma)
        assert cmdp.row_sum_tolerance() == pytest.approx(max(1e-3 * (1 - gamma), 3.8e-6), 0.01)
        if ok:
            cmdp.validate()
        else:
            with pytest.raises(ValueError, match=r"within .*its sum 1.00002.*normalise the rows"):
                cmdp.validate()
            cmdp.validate(atol=1e-4)  # an explicit tolerance still wins
    logits = rng.normal(size=(S, B, S)).astype(np.float32)
    soft = lambda th: jax.nn.softmax(jnp.asarray(logits) + th[0], axis=-1)  # noqa: E731
    _cmdp(transition=soft, gamma_F=0.999, gamma_L=0.999).validate()


def test_unstabilisable_lqr_pairs():
    # an unstable mode (eigenvalue 2) that the follower's input cannot reach
    bad = _lq(
        A_fn=lambda th: jnp.diag(jnp.array([2.0, 0.5])), B_fn=lambda th: jnp.array([[0.0], [1.0]])
    )
    with pytest.raises(ValueError, match="stabilisable"):
        bad.validate()
    with pytest.raises(ValueError, match="stabilisable"):
        lqr_game().validate(theta=np.array([-20.0, -10.0]))


@pytest.mark.parametrize(
    "quadratic, culprit",
    [
        (lambda th: (jnp.full((2, 2), jnp.nan), jnp.eye(1), jnp.zeros(())), "Ms"),
        (lambda th: (jnp.eye(2), jnp.eye(1) * jnp.inf, jnp.zeros(())), "Mb"),
        (lambda th: (jnp.eye(2), jnp.eye(1), jnp.array(jnp.nan)), "c"),
        (lambda th: (jnp.eye(2), jnp.eye(1), jnp.array(jnp.inf)), "c"),
    ],
)
def test_non_finite_leader_quadratic_is_refused(quadratic, culprit):
    with pytest.raises(ValueError, match=f"leader_quadratic\\(theta\\)'s {culprit} is not finite"):
        _lq(leader_quadratic=quadratic).validate()


def test_lq_validate_names_the_theta_it_checks():
    """validate(theta) at another theta does not speak of "the initial theta"."""
    bad = _lq(
        A_fn=lambda th: jnp.diag(jnp.array([2.0, 0.5])) * (1.0 + th[0]),
        B_fn=lambda th: jnp.array([[0.0], [1.0]]),
        theta0=jnp.array([-0.9]),
    )
    bad.validate()
    with pytest.raises(ValueError, match="stabilisable at the theta given") as err:
        bad.validate(jnp.zeros(1))
    assert "initial" not in str(err.value)


# ---- hyperparameters, grids and methods ------------------------------------------------------
def test_negative_beta():
    from bchg_jax import tabular
    from bchg_jax.games import lqr
    from bchg_jax.games import tabular as game

    for make in (
        lambda: tabular.HParams(0.1, 0.5, beta=-1e-3).validate(),
        lambda: game.HParams(1, 1, beta=-0.05).validate(),
        lambda: lqr.HParams(1, 5, beta=0.0).validate(),
    ):
        with pytest.raises(ValueError, match="beta"):
            make()


def test_empty_grids():
    with pytest.raises(ValueError, match="empty"):
        product_grid(lr=[], beta=[1e-3])
    # a repeated value ran the same grid points twice
    with pytest.raises(ValueError, match="'lr' repeats a value"):
        product_grid(lr=[0.1, 0.1], beta=[1e-3])
    # a scalar axis was a TypeError ("object of type 'float' has no len()")
    with pytest.raises(
        ValueError, match=r"'lr' must be a list of values, got 0.1 \(write lr=\[0.1\]\)"
    ):
        product_grid(lr=0.1, beta=[1e-3])
    # ... and so did a plain dict, or values one in the trainer's float32 (an audit: two
    # bit-identical rows of 0.1 in the table); refused before anything compiles
    from bchg_jax import problems, run_grid, tabular

    trainer = tabular.make_train(problems.fourrooms(), "bchg", tabular.TrainConfig(iterations=2))
    for grid in ({"lr": [0.1, 0.1]}, product_grid(lr=[0.1, 0.1 + 1e-9])):
        with pytest.raises(ValueError, match="grid points 0 and 1 are the same setting.*lr=0.1"):
            run_grid(trainer, grid, 1, 2, verbose=False)
    # the same value of one axis beside distinct values of another is two settings
    from bchg_jax.core.hparams import check_distinct_points

    check_distinct_points(trainer.hparams({"lr": [0.1, 0.2], "beta": [1e-3, 1e-3]}))


def test_a_grid_over_a_setting_the_method_never_reads_is_refused():
    """``run_grid`` of HPGD (MC) over sarsa_alpha gave bit-identical grid points, tabled as if
    the step size had been compared (the CLI refused the flag, the library did not)."""
    from bchg_jax import games, problems, run_grid, tabular

    mc = tabular.make_train(problems.fourrooms(), "hpgd_mc", tabular.TrainConfig(iterations=2))
    assert mc.unread == ("sarsa_alpha",)
    with pytest.raises(ValueError, match="varies sarsa_alpha, which hpgd_mc never reads"):
        run_grid(mc, product_grid(lr=[0.1], sarsa_alpha=[0.1, 0.5]), 1, 2, verbose=False)
    bchg = tabular.make_train(problems.fourrooms(), "bchg", tabular.TrainConfig(iterations=2))
    assert bchg.unread == ()
    exact = games.lqr.make_train(problems.lqr_game(), "exact", games.lqr.TrainConfig(iterations=2))
    assert exact.unread == ("critic_steps",)
    with pytest.raises(ValueError, match="varies critic_steps, which exact never reads"):
        run_grid(exact, {"actor_steps": [1, 2], "critic_steps": [1, 2]}, 1, 2, verbose=False)
    assert games.lqr.make_train(problems.lqr_game(), "bchg").unread == ()
    from bchg_jax.tabular import HParams

    with pytest.raises(ValueError, match="lr"):
        HParams(np.array([]), 0.5, 1e-3).validate()
    # a 2-d value failed deep in the vmap ("more dimensions than allowed by the axis remapping")
    with pytest.raises(ValueError, match=r"got shapes \{'lr': \(2, 2\)\}.*product_grid"):
        HParams.from_grid({"lr": np.full((2, 2), 0.1)}, jnp.float32)
    # NumPy read "0.1" as 0.1 and True as lr = 1
    for odd in (["0.1"], [True]):
        with pytest.raises(ValueError, match="grid values are numbers"):
            HParams.from_grid({"lr": odd}, jnp.float32)


def test_unknown_methods():
    from bchg_jax.games.lqr.train import make_train as make_train_lqr_game
    from bchg_jax.games.tabular.train import make_train as make_train_game
    from bchg_jax.lq.train import make_train as make_train_lq
    from bchg_jax.problems.toy_game import toy_game
    from bchg_jax.tabular.train import make_train

    for make in (
        lambda: make_train(_cmdp(), "hpgd"),
        lambda: make_train_lq(_lq(), "sobirl"),
        lambda: make_train_game(toy_game(), "bchg_det"),
        lambda: make_train_lqr_game(lqr_game(), "biac"),
    ):
        with pytest.raises(ValueError, match="method"):
            make()


# ---- the experiment CLIs -----------------------------------------------------------------------
def _cli_error(module, argv, capsys):
    mod = importlib.import_module(f"experiments.{module}")
    with pytest.raises(SystemExit) as e:
        mod.main(argv)
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert "error" in err
    return err


@pytest.mark.parametrize(
    "module, argv, match",
    [
        ("fourrooms", ["--method", "hpgd"], "method"),
        ("fourrooms", ["--beta", "-0.001"], "beta"),
        ("thermal", ["--method", "bogus"], "method"),
        ("toy_game", ["--beta", "0"], "beta"),
        ("lqr_game", ["--method", "biac_on"], "method"),
        ("lqr_game", ["--beta", "-1"], "beta"),
        # --smoke's caps: a larger count was cut silently (a smoke run "extended" stayed put)
        ("fourrooms", ["--iterations", "40"], "--iterations 40 would be cut"),
        ("toy_game", ["--seeds", "5"], "--seeds 5 would be cut"),
    ],
)
def test_cli_bad_arguments(module, argv, match, tmp_path, capsys):
    err = _cli_error(module, ["--smoke", *argv, "--out", str(tmp_path / "r")], capsys)
    assert match in err
    assert not os.path.exists(tmp_path / "r")  # nothing created for a refused run


@pytest.mark.parametrize("module", ["fourrooms", "thermal", "toy_game", "lqr_game"])
def test_cli_unwritable_output(module, tmp_path, capsys):
    blocker = tmp_path / "a_file"
    blocker.write_text("not a folder")
    err = _cli_error(module, ["--smoke", "--out", str(blocker / "run"), "--exact-out"], capsys)
    assert "cannot write" in err
    assert blocker.read_text() == "not a folder"


def test_exact_out_refuses_a_folder_of_other_files(tmp_path, capsys):
    """``--exact-out`` into a non-empty folder that holds no run wrote the run's files beside
    the user's, replacing those of its names (a folder ``bchg/``, ``summary.csv``)."""
    folder = tmp_path / "mine"
    (folder / "bchg").mkdir(parents=True)
    (folder / "bchg" / "notes.txt").write_text("keep")
    err = _cli_error("fourrooms", ["--smoke", "--out", str(folder), "--exact-out"], capsys)
    assert "holds bchg and no run" in err
    assert sorted(os.listdir(folder)) == ["bchg"]
    assert (folder / "bchg" / "notes.txt").read_text() == "keep"


@pytest.mark.slow
def test_existing_results_are_never_lost(tmp_path, capsys, digest):
    """A finished run folder survives a rerun with bad arguments, a rerun with other settings,
    and a resume of the complete run, byte for byte."""
    mod = importlib.import_module("experiments.toy_game")
    run = mod.main(["--smoke", "--method", "naive_on", "--out", str(tmp_path / "r"), "--exact-out"])
    before = digest(run)
    _cli_error("toy_game", ["--smoke", "--beta", "-1", "--out", run, "--exact-out"], capsys)
    _cli_error(
        "toy_game",
        ["--smoke", "--method", "naive_on", "--R", "1", "--out", run, "--exact-out"],
        capsys,
    )
    assert digest(run) == before
    mod.main(["--resume", run])  # complete: skipped, files unchanged
    after = digest(run)
    assert {k: v for k, v in after.items() if k != "config.json"} == {
        k: v for k, v in before.items() if k != "config.json"
    }


# ---- public pure functions: concrete bad values, culprits named ------------------------------
# Every public entry point checks its concrete (non-traced) beta, discounts and the problem's
# scalar settings, and names the array at fault in a shape error. Small problems only: each call
# below raises before anything heavy is compiled.
import dataclasses  # noqa: E402
import functools  # noqa: E402

from bchg_jax import lq as lq_family  # noqa: E402
from bchg_jax import tabular  # noqa: E402
from bchg_jax.core.validate import check_beta_if_concrete, is_concrete  # noqa: E402
from bchg_jax.games import estimators as game_est  # noqa: E402
from bchg_jax.games import lqr as game_lqr  # noqa: E402
from bchg_jax.games import tabular as game_tab  # noqa: E402
from bchg_jax.problems.toy_game import leader_policy_from_p, toy_game  # noqa: E402

TH = jnp.zeros(1)
P_TAB = jnp.full((S, B, S), 1.0 / S)
R_TAB = jnp.zeros((S, B))
POL = jnp.full((S, B), 1.0 / B)
CONT = jnp.ones(S)
BATCH = tabular.Batch(
    *(jnp.zeros((1, 2), jnp.int32) for _ in range(4)),
    jnp.zeros((1, 2), bool),
    jnp.array([[False, True]]),
)
F_TOY = leader_policy_from_p(0.5)  # [3, 2]
G_TOY = jnp.full((3, 2, 3), 1.0 / 3)
EP_TOY = game_tab.GameEpisodes(*(jnp.zeros((1, 2), jnp.int32) for _ in range(3)))
TH_LQR = jnp.zeros(2)
K = jax.random.key(0)


def _follower():
    return tabular.BestResponse(POL, jnp.zeros(S), R_TAB, jnp.asarray(0), jnp.asarray(0.0))


@functools.lru_cache(maxsize=None)
def _resp():
    return game_lqr.best_response(lqr_game(), TH_LQR, 0.1)


# (label, call with a bad beta) for every entry point that takes beta
BETA_CALLS = {
    "tabular.soft_value_iteration": lambda b: tabular.soft_value_iteration(P_TAB, R_TAB, b, 0.9),
    "tabular.best_response": lambda b: tabular.best_response(_cmdp(), TH, b),
    "tabular.leader_objective": lambda b: tabular.leader_objective(_cmdp(), TH, b),
    "tabular.exact_hypergradient": lambda b: tabular.exact_hypergradient(_cmdp(), TH, b),
    "tabular.hypergradient": lambda b: tabular.hypergradient(
        _cmdp(), TH, BATCH, _follower(), R_TAB, b
    ),
    "games.tabular.soft_q_iteration": lambda b: game_tab.soft_q_iteration(toy_game(), F_TOY, b),
    "games.tabular.best_response": lambda b: game_tab.best_response(toy_game(), F_TOY, b),
    "games.tabular.leader_objective": lambda b: game_tab.leader_objective(toy_game(), F_TOY, b),
    "games.tabular.exact_hypergradient": lambda b: game_tab.exact_hypergradient(
        leader_policy_from_p, jnp.asarray(0.5), toy_game(), b
    ),
    "games.tabular.hypergradient": lambda b: game_tab.hypergradient(
        leader_policy_from_p, jnp.asarray(0.5), EP_TOY, G_TOY, G_TOY, F_TOY, b, 0.99, 0.99
    ),
    "games.lqr.best_response": lambda b: game_lqr.best_response(lqr_game(), TH_LQR, b),
    "games.lqr.leader_objective": lambda b: game_lqr.leader_objective(lqr_game(), TH_LQR, b),
    "games.lqr.exact_hypergradient": lambda b: game_lqr.exact_hypergradient(lqr_game(), TH_LQR, b),
    "games.lqr.hypergradient_split": lambda b: game_lqr.hypergradient_split(lqr_game(), TH_LQR, b),
    "games.lqr.exact_critic_estimate": lambda b: game_lqr.exact_critic_estimate(
        lqr_game(), TH_LQR, b, K, episodes=2, leader_steps=3, extra_steps=1
    ),
    "games.lqr.deterministic_hypergradient": lambda b: game_lqr.deterministic_hypergradient(
        lambda t, s: s @ t[:, None],
        TH_LQR,
        jnp.zeros((1, 2, 2)),
        jnp.zeros((1, 2, 1)),
        jnp.zeros((1, 2)),
        jnp.zeros((1, 2, 1)),
        b,
        0.99,
        0.95,
    ),
    "games.estimators.game_score_weights": lambda b: game_est.game_score_weights(
        jnp.zeros((1, 2)), 0.0, jnp.zeros((1, 2)), jnp.zeros((1, 2)), b, 0.99, 0.95
    ),
    "games.estimators.score_objective": lambda b: game_est.score_objective(
        jnp.zeros(2),
        jnp.zeros(2),
        jnp.zeros(2),
        jnp.zeros((2, 3)),
        jnp.zeros((2, 3)),
        jnp.zeros((2, 3)),
        b,
    ),
    "games.estimators.deterministic_objective": lambda b: game_est.deterministic_objective(
        jnp.zeros((2, 1)),
        jnp.zeros((2, 1)),
        jnp.zeros(2),
        jnp.zeros((2, 3, 1)),
        jnp.zeros((2, 3, 1)),
        jnp.zeros((2, 3)),
        b,
    ),
    "lq.best_response": lambda b: lq_family.best_response(_lq(), TH, b),
    "lq.leader_objective": lambda b: lq_family.leader_objective(_lq(), TH, b),
    "lq.hypergradient": lambda b: lq_family.hypergradient(
        _lq(),
        TH,
        lq_family.Trajectories(jnp.zeros((1, 3, 2)), jnp.zeros((1, 3, 1))),
        b,
        jnp.zeros((1, 3)),
        jnp.zeros((1, 3)),
        benefit=jnp.zeros((1, 2)),
    ),
}


@pytest.mark.parametrize("name", sorted(BETA_CALLS))
@pytest.mark.parametrize(
    "beta, shown",
    [
        (0.0, "got 0.0"),
        (-1.0, "got -1.0"),
        (float("nan"), "got nan"),
        (np.inf, "got inf"),
        (jnp.asarray(0.0), "got 0.0"),
    ],
)
def test_bad_beta_is_named_with_its_value(name, beta, shown):
    with pytest.raises(ValueError, match="beta") as e:
        BETA_CALLS[name](beta)
    msg = str(e.value)
    assert msg.endswith(shown), msg
    assert "array" not in msg.lower(), msg


def _gamma_L_one(make):
    return dataclasses.replace(make(), gamma_L=np.float64(1.0))


# (label, call, culprit) for the problem's scalar settings, never validate()d
SETTING_CALLS = [
    (
        "tabular.exact_hypergradient",
        lambda: tabular.exact_hypergradient(_gamma_L_one(_cmdp), TH, 0.1),
        "gamma_L",
    ),
    (
        "tabular.leader_values",
        lambda: tabular.leader_values(dataclasses.replace(_cmdp(), gamma_F=-0.5), TH, POL),
        "gamma_F",
    ),
    (
        "tabular.best_response",
        lambda: tabular.best_response(dataclasses.replace(_cmdp(), time_limit=0), TH, 0.1),
        "time_limit",
    ),
    (
        "tabular.hypergradient",
        lambda: tabular.hypergradient(_gamma_L_one(_cmdp), TH, BATCH, _follower(), R_TAB, 0.1),
        "gamma_L",
    ),
    (
        "games.tabular.leader_objective",
        lambda: game_tab.leader_objective(_gamma_L_one(toy_game), F_TOY, 0.1),
        "gamma_L",
    ),
    (
        "games.tabular.leader_values",
        lambda: game_tab.leader_values(_gamma_L_one(toy_game), F_TOY, G_TOY),
        "gamma_L",
    ),
    (
        "games.tabular.soft_q_iteration",
        lambda: game_tab.soft_q_iteration(dataclasses.replace(toy_game(), gamma_F=1.0), F_TOY, 0.1),
        "gamma_F",
    ),
    (
        "games.lqr.exact_hypergradient",
        lambda: game_lqr.exact_hypergradient(_gamma_L_one(lqr_game), TH_LQR, 0.1),
        "gamma_L",
    ),
    (
        "games.lqr.leader_q",
        lambda: game_lqr.leader_q(
            dataclasses.replace(lqr_game(), horizon=0),
            TH_LQR,
            _resp(),
            jnp.zeros(2),
            jnp.zeros(1),
            jnp.zeros(1),
            3,
            0.99,
            3,
        ),
        "horizon",
    ),
    (
        "lq.exact_hypergradient",
        lambda: lq_family.exact_hypergradient(_gamma_L_one(_lq), TH, 0.1),
        "gamma_L",
    ),
    (
        "lq.best_response",
        lambda: lq_family.best_response(dataclasses.replace(_lq(), gamma_F=1.0), TH, 0.1),
        "gamma_F",
    ),
]


@pytest.mark.parametrize("name, call, culprit", SETTING_CALLS, ids=[c[0] for c in SETTING_CALLS])
def test_bad_problem_setting_is_named(name, call, culprit):
    with pytest.raises(ValueError, match=culprit) as e:
        call()
    msg = str(e.value)
    assert "got " in msg and "np.float64" not in msg and "array" not in msg.lower(), msg


# (label, call, culprit, shown) for discounts and other scalars passed as arguments
ARG_CALLS = [
    (
        "tabular.policy_evaluation gamma=1",
        lambda: tabular.policy_evaluation(P_TAB, R_TAB, POL, 1.0, CONT),
        "gamma",
        "got 1.0",
    ),
    (
        "tabular.soft_value_iteration gamma=nan",
        lambda: tabular.soft_value_iteration(P_TAB, R_TAB, 0.1, float("nan")),
        "gamma",
        "got nan",
    ),
    (
        "tabular.monte_carlo_critic gamma_L=1.5",
        lambda: tabular.monte_carlo_critic(BATCH, R_TAB, 1.5),
        "gamma_L",
        "got 1.5",
    ),
    (
        "games.estimators.influence_weights gamma_F=1",
        lambda: game_est.influence_weights(jnp.zeros(2, jnp.int32), 3, 1.0),
        "gamma_F",
        "got 1.0",
    ),
    (
        "games.estimators.hypergradient gamma_F=1",
        lambda: game_est.hypergradient(
            leader_policy_from_p, jnp.asarray(0.5), EP_TOY, G_TOY, G_TOY, F_TOY, 0.1, 0.99, 1.0
        ),
        "gamma_F",
        "got 1.0",
    ),
    (
        "games.estimators.game_score_weights gamma_L=-0.1",
        lambda: game_est.game_score_weights(
            jnp.zeros((1, 2)), 0.0, jnp.zeros((1, 2)), jnp.zeros((1, 2)), 0.1, -0.1, 0.95
        ),
        "gamma_L",
        "got -0.1",
    ),
    (
        "games.lqr.leader_objective gamma=1.5",
        lambda: game_lqr.leader_objective(lqr_game(), TH_LQR, 0.1, gamma=1.5),
        "gamma",
        "got 1.5",
    ),
    (
        "games.lqr.leader_state_values horizon=0",
        lambda: game_lqr.leader_state_values(lqr_game(), TH_LQR, _resp(), jnp.zeros(2), 1, 0.9, 0),
        "horizon",
        "got 0",
    ),
    (
        "games.tabular.leader_return without a horizon",
        lambda: game_tab.leader_return(
            dataclasses.replace(toy_game(), time_limit=None), F_TOY, G_TOY
        ),
        "horizon",
        "got None",
    ),
]


@pytest.mark.parametrize("name, call, culprit, shown", ARG_CALLS, ids=[c[0] for c in ARG_CALLS])
def test_bad_scalar_argument_is_named_with_its_value(name, call, culprit, shown):
    with pytest.raises(ValueError, match=culprit) as e:
        call()
    assert str(e.value).endswith(shown), str(e.value)


def _game3(**over):
    g = toy_game()
    return dataclasses.replace(g, **over)


# (label, call, culprit named, blamed wrongly before) for shape errors
SHAPE_CALLS = [
    (
        "TabularCMDP.validate init_dist",
        lambda: _cmdp(init_dist=lambda th: jnp.full(S + 1, 1.0 / (S + 1))).validate(),
        "init_dist",
        "follower_reward",
    ),
    (
        "TabularCMDP.validate follower_reward",
        lambda: _cmdp(follower_reward=lambda th: jnp.zeros((S, B + 1))).validate(),
        "follower_reward",
        "leader_reward",
    ),
    (
        "tabular.rollout policy",
        lambda: tabular.rollout(
            K, jnp.full((S, B + 1), 1.0 / (B + 1)), P_TAB, jnp.full(S, 1 / S), None, None, 2, 3
        ),
        "policy",
        "transition",
    ),
    (
        "tabular.rollout init_dist",
        lambda: tabular.rollout(K, POL, P_TAB, jnp.full(S + 1, 1 / (S + 1)), None, None, 2, 3),
        "init_dist",
        "transition",
    ),
    (
        "tabular.rollout terminal",
        lambda: tabular.rollout(
            K, POL, P_TAB, jnp.full(S, 1 / S), np.zeros(S + 1, bool), None, 2, 3
        ),
        "terminal",
        "transition",
    ),
    (
        "tabular.leader_values policy",
        lambda: tabular.leader_values(_cmdp(), TH, jnp.full((S, B + 1), 0.5)),
        "policy",
        None,
    ),
    (
        "tabular.benefit policy",
        lambda: tabular.benefit(R_TAB, jnp.full((S, B + 1), 0.5)),
        "policy",
        None,
    ),
    (
        "TabularGame.validate init_dist",
        lambda: _game3(init_dist=jnp.full(4, 0.25)).validate(),
        "init_dist must have shape (3,)",
        None,
    ),
    (
        "games.tabular.rollout f",
        lambda: game_tab.rollout(K, toy_game(), jnp.full((3, 3), 1 / 3), G_TOY, 2, 3),
        "f (leader policy)",
        "g (follower policy)",
    ),
    (
        "games.tabular.rollout g",
        lambda: game_tab.rollout(K, toy_game(), F_TOY, jnp.full((3, 2, 2), 0.5), 2, 3),
        "g (follower policy)",
        "f (leader policy)",
    ),
    (
        "games.tabular.soft_q_iteration f",
        lambda: game_tab.soft_q_iteration(toy_game(), jnp.full((3, 3), 1 / 3), 0.1),
        "f (leader policy)",
        None,
    ),
    (
        "games.lqr.rollout theta",
        lambda: game_lqr.rollout(K, lqr_game(), jnp.zeros(3), _resp(), 2, 3),
        "theta must be the vector [2]",
        None,
    ),
    (
        "games.lqr.rollout resp of another game",
        lambda: game_lqr.rollout(
            K,
            lqr_game(),
            TH_LQR,
            game_lqr.best_response(
                lqr_game(B=np.array([[0.0, 1.0], [0.1, 0.0]]), Rbar=np.eye(2)), TH_LQR, 0.1
            ),
            2,
            3,
        ),
        "resp.K_s",
        None,
    ),
    ("LQRGame.validate C", lambda: lqr_game(C=np.zeros((3, 1))), "C must", None),
    ("LQConfigurableMDP.validate U", lambda: _lq(U=np.eye(3)).validate(), "U must", "Qbar"),
    (
        "LQConfigurableMDP.validate Qbar",
        lambda: _lq(Qbar=np.eye(3)).validate(),
        "Qbar must",
        "U must",
    ),
    (
        "lq.rollout policy of another problem",
        lambda: lq_family.rollout(
            K,
            _lq(),
            TH,
            lq_family.best_response(_lq(B_fn=lambda th: jnp.ones((2, 2)), Rbar=np.eye(2)), TH, 0.1),
            2,
            3,
        ),
        "policy.K",
        None,
    ),
    (
        "lq.as_if_optimal_hypergradient policy of another problem",
        lambda: lq_family.as_if_optimal_hypergradient(_lq(), TH, _other_lq_response(), 0.1),
        "policy.K",
        None,
    ),
    (
        "lq.leader_objective br of another problem",
        lambda: lq_family.leader_objective(_lq(), TH, 0.1, br=_other_lq_response()),
        "br.K",
        None,
    ),
    (
        "lq.k_step_hypergradient P_prev",
        lambda: lq_family.k_step_hypergradient(_lq(), TH, jnp.eye(3), 0.1, 1),
        "P_prev",
        None,
    ),
    (
        "LQConfigurableMDP.validate A against B",
        lambda: _lq(A_fn=lambda th: jnp.eye(3) * 0.5).validate(),
        "A(theta) is (3, 3) and B(theta) is (2, 1)",
        None,
    ),
]


def _other_lq_response():
    """A best response of a problem with a 2-d follower action (this file's has 1)."""
    return lq_family.best_response(_lq(B_fn=lambda th: jnp.ones((2, 2)), Rbar=np.eye(2)), TH, 0.1)


@pytest.mark.parametrize(
    "name, call, culprit, innocent", SHAPE_CALLS, ids=[c[0] for c in SHAPE_CALLS]
)
def test_shape_error_names_the_culprit(name, call, culprit, innocent):
    with pytest.raises(ValueError) as e:
        call()
    msg = str(e.value)
    assert culprit in msg, msg
    # the culprit is the subject; the table the sizes come from may be mentioned after it
    assert innocent is None or innocent not in msg or msg.index(culprit) < msg.index(innocent), msg


@pytest.mark.slow
def test_traced_values_are_not_checked():
    """Under jit / vmap a traced beta (or discount) is skipped: no false error, finite results."""
    seen = []
    jax.jit(lambda b: seen.append(is_concrete(b)) or b)(0.1)
    assert seen == [False] and is_concrete(0.1, jnp.ones(2), None)
    jax.jit(check_beta_if_concrete)(-1.0)  # traced: nothing to check

    toy = toy_game()  # built outside jit: its tables are concrete arrays
    calls = {
        "tabular.soft_value_iteration": lambda b: (
            tabular.soft_value_iteration(
                P_TAB, jnp.arange(S * B, dtype=jnp.float32).reshape(S, B), b, 0.9
            ).V
        ),
        "tabular.leader_objective": lambda b: tabular.leader_objective(_cmdp(), TH, b),
        "tabular.exact_hypergradient": lambda b: tabular.exact_hypergradient(_cmdp(), TH, b),
        "games.tabular.leader_objective": lambda b: game_tab.leader_objective(toy, F_TOY, b),
        "games.lqr.leader_objective": lambda b: game_lqr.leader_objective(
            lqr_game(), TH_LQR, b, horizon=5
        ),
        "games.estimators.game_score_weights": lambda b: game_est.game_score_weights(
            jnp.ones((1, 3)), 0.0, jnp.ones((1, 3)), jnp.ones((1, 3)), b, 0.99, 0.95
        ),
        "lq.leader_objective": lambda b: lq_family.leader_objective(_lq(), TH, b),
    }
    for name, fn in calls.items():
        assert np.all(np.isfinite(np.asarray(jax.jit(fn)(0.5)))), name
    grid = jax.jit(jax.vmap(calls["tabular.leader_objective"]))(jnp.array([0.2, 0.5]))
    assert np.all(np.isfinite(np.asarray(grid)))
    # a traced discount is skipped too (the problem's own settings stay concrete)
    jax.jit(lambda g: tabular.policy_evaluation(P_TAB, R_TAB, POL, g, CONT))(0.9)


# ---- issue 27: the gaps a new user found ------------------------------------------------------
@pytest.mark.parametrize(
    "module, argv, shown",
    [
        ("fourrooms", ["--iterations", "0"], "--iterations must be >= 1, got 0"),
        ("thermal", ["--episodes", "0"], "--episodes must be >= 1, got 0"),
        ("toy_game", ["--seeds", "0"], "--seeds must be >= 1, got 0"),
        ("toy_game", ["--R", "nan"], "--R must be finite in float32 (|R| < 3.4e38), got nan"),
        ("lqr_game", ["--tau", "2"], "--tau (TrainConfig.tau) must be in (0, 1], got 2.0"),
        # an infinite rate or scale is refused like a negative one (it trained on NaN / nothing)
        ("lqr_game", ["--actor-lr", "inf"], "(ActorConfig.lr) must be finite, got inf"),
        ("thermal", ["--init-std", "inf"], "--init-std must be finite and >= 0, got inf"),
        ("thermal", ["--init-std", "nan"], "--init-std must be finite and >= 0, got nan"),
        # --faithful fixes the critic and the follower gradient; asking for others is a clash
        ("thermal", ["--faithful", "--critic", "quadratic"], "drop --critic quadratic"),
        # ... and the paper's critic training: a changed critic is not a faithful run
        ("thermal", ["--faithful", "--mlp-warm-start"], "drop --mlp-warm-start,"),
        ("thermal", ["--faithful", "--mlp-steps", "200"], "drop --mlp-steps 200,"),
        # flags that were silently ignored: another follower model's setting, a grid flag
        # under --grid paper
        ("fourrooms", ["--follower-steps", "5"], "add --follower k_step or drop --follower-steps"),
        ("toy_game", ["--follower", "lag", "--follower-lr", "0.5"], "drop --follower-lr"),
        ("fourrooms", ["--grid", "paper", "--lr", "0.3"], "drop --lr or --grid paper"),
        ("lqr_game", ["--grid", "paper", "--actor-steps", "2"], "drop --actor-steps or --grid"),
    ],
)
def test_cli_errors_name_the_flag_and_value(module, argv, shown, tmp_path, capsys):
    err = _cli_error(module, ["--smoke", *argv, "--out", str(tmp_path / "r")], capsys)
    assert shown in err and "Traceback" not in err
    assert not os.path.exists(tmp_path / "r")


def test_a_faithful_setting_read_from_a_config_file_is_named_as_such(tmp_path, capsys):
    """A --config file of a --faithful run sets --faithful; a clashing flag's error says where
    it came from (the user never typed --faithful, and no flag turns it off)."""
    import json

    cfg = tmp_path / "config.json"
    cfg.write_text(json.dumps({"experiment": "thermal", "args": {"faithful": True}}))
    err = _cli_error(
        "thermal",
        ["--config", str(cfg), "--smoke", "--critic", "quadratic", "--out", str(tmp_path / "r")],
        capsys,
    )
    assert f"--faithful (from --config {cfg})" in err and "drop --critic quadratic" in err


def test_faithful_given_beside_a_config_file_of_another_critic_takes_the_papers(tmp_path):
    """--config FILE --faithful with FILE of an ordinary MLP-critic run (200 Adam steps at 1e-3,
    minibatches, warm start, normalised, 32 value samples) kept FILE's critic, and config.json
    called the run faithful. The flag given wins over the file: the paper's critic."""
    import json

    from experiments import thermal

    mine = dict(mlp_steps=200, mlp_lr=1e-3, mlp_minibatch=1024, mlp_warm_start=True)
    mine.update(mlp_normalize=True, value_samples=32, critic="mlp")
    cfg = tmp_path / "config.json"
    cfg.write_text(json.dumps({"experiment": "thermal", "args": mine}))
    p = thermal.parse_args([])
    a = thermal.parse_args(["--config", str(cfg), "--faithful"])
    assert all(getattr(a, k) == getattr(p, k) for k in thermal.FAITHFUL_CRITIC)
    # without --faithful the file's critic stays
    assert thermal.parse_args(["--config", str(cfg)]).mlp_steps == 200


def test_a_faithful_config_file_edited_to_another_critic_is_refused(tmp_path, capsys):
    """A faithful run's config.json with its critic settings changed by hand ran that critic
    and called the run faithful again. It is refused, naming the file; the values a --smoke
    faithful run saved (5 Adam steps, 8 value samples) are still read back."""
    import json

    from experiments import thermal

    p = thermal.parse_args([])
    cfg = tmp_path / "config.json"
    for edit, named in (
        (dict(mlp_steps=200), "--mlp-steps 200"),
        (dict(mlp_warm_start=True), "--mlp-warm-start"),
        (dict(mlp_lr=1e-3, value_samples=32), "--mlp-lr 0.001 and --value-samples 32"),
    ):
        args = {"faithful": True, "critic": "mlp", **{k: getattr(p, k) for k in edit}, **edit}
        cfg.write_text(json.dumps({"experiment": "thermal", "args": args}))
        for extra in ([], ["--faithful"]):
            err = _cli_error("thermal", ["--config", str(cfg), *extra], capsys)
            assert f"restore {named} in {cfg} to the paper's values" in err, err
    # a --smoke faithful run's own reductions, read back
    smoke = {"faithful": True, "smoke": True, "mlp_steps": 5, "value_samples": 8}
    cfg.write_text(json.dumps({"experiment": "thermal", "args": smoke}))
    a = thermal.parse_args(["--config", str(cfg)])
    assert a.faithful and (a.mlp_steps, a.value_samples) == (5, 8)
    # and a faithful file at the paper's values is taken as it is
    paper = {"faithful": True, **{k: getattr(p, k) for k in thermal.FAITHFUL_CRITIC}}
    cfg.write_text(json.dumps({"experiment": "thermal", "args": paper}))
    assert thermal.parse_args(["--config", str(cfg)]).mlp_steps == p.mlp_steps


def test_thermal_flags_of_the_leaders_mlp_fit_are_refused_for_monte_carlo_methods():
    """hpgd_mc uses Monte Carlo returns: --value-samples and --mlp-kernel were recorded and
    changed nothing (the estimate bit-identical at 7 and 300 samples)."""
    from experiments import thermal

    for flags in (["--value-samples", "7"], ["--mlp-kernel", "fused"]):
        a = thermal.parse_args(["--method", "hpgd_mc", "--critic", "mlp", *flags])
        with pytest.raises(ValueError, match="Monte Carlo returns"):
            thermal.validate_args(a)
        a = thermal.parse_args(["--method", "hpgd_mc,bchg", "--critic", "mlp", *flags])
        thermal.validate_args(a)
    thermal.validate_args(thermal.parse_args(["--method", "hpgd_mc", "--critic", "mlp"]))


@pytest.mark.slow
def test_lq_critic_fits_refuse_bad_settings():
    """The public critic fits took gamma 1.5 (H[0, 0] = -3.11), NaN, a negative ridge (another
    finite fit), a negative learning rate (ascent) and 0 Adam steps (the start as the fit)."""
    from bchg_jax.lq import critics
    from bchg_jax.lq.fused_td import td_fit_fused

    rng = np.random.default_rng(0)
    s, b = rng.normal(size=(3, 6, 2)), rng.normal(size=(3, 6, 1))
    r, y = rng.normal(size=(3, 5)), rng.normal(size=(3, 5, 2))
    fits = {
        "fit_quadratic_q": lambda g, ridge: critics.fit_quadratic_q(s, b, r, g, ridge),
        "leave_one_out_quadratic_q": lambda g, ridge: critics.leave_one_out_quadratic_q(
            s, b, r, g, ridge
        ),
        "fit_quadratic_vector_value": lambda g, ridge: critics.fit_quadratic_vector_value(
            s, y, g, ridge
        ),
        "leave_one_out_vector_value": lambda g, ridge: critics.leave_one_out_vector_value(
            s, y, g, ridge
        ),
    }
    for fit in fits.values():
        for g in (1.5, -0.5, float("nan"), 1.0):
            with pytest.raises(ValueError, match="critic's discount"):
                fit(g, 1e-6)
        with pytest.raises(ValueError, match="ridge must be"):
            fit(0.8, -1.0)
        fit(0.8, 0.0)  # no ridge is fine
    from bchg_jax.core.networks import MLP

    model = MLP((8, 8), 1, torch_init=False)
    params = model.init(jax.random.key(0), jnp.zeros((1, 3)))
    x = jnp.asarray(rng.normal(size=(16, 3)), jnp.float32)
    rr = jnp.asarray(rng.normal(size=16), jnp.float32)
    bad = {
        "critic's discount": dict(gamma=1.5),
        "lr": dict(lr=-1.0),
        "steps": dict(steps=0),
        "minibatch": dict(minibatch=-2),
    }
    for match, kw in bad.items():
        kw = {"gamma": 0.9, "steps": 2, "lr": 1e-3, **kw}
        with pytest.raises(ValueError, match=match):
            critics.td_fit(model, params, x, x, rr, **kw)
        if "minibatch" not in kw:
            with pytest.raises(ValueError, match=match):
                td_fit_fused(params, x, x, rr, interpret=True, **kw)


def test_non_finite_or_misshaped_theta_is_refused():
    import jax

    from bchg_jax import games, lq, problems, tabular

    cmdp = problems.random_tabular_cmdp(jax.random.key(0))
    for fn in (tabular.exact_hypergradient, tabular.leader_objective, tabular.best_response):
        with pytest.raises(ValueError, match=r"theta must be finite, got \[nan"):
            fn(cmdp, jnp.array([jnp.nan, 0.0, 0.0, 0.0]), 0.1)
        with pytest.raises(ValueError, match=r"shaped like theta0 \(4,\), got \(9,\)"):
            fn(cmdp, jnp.zeros(9), 0.1)
    # the estimator too (it returned a 3-vector for a (3,) theta, a finite number for a NaN one)
    br = tabular.best_response(cmdp, cmdp.theta0, 0.1)
    _, Q_L = tabular.leader_values(cmdp, cmdp.theta0, br.policy)
    P0, rho0 = cmdp.transition(cmdp.theta0), cmdp.init_dist(cmdp.theta0)
    batch = tabular.rollout(jax.random.key(0), br.policy, P0, rho0, None, None, 2, 5)
    with pytest.raises(ValueError, match=r"theta must be finite, got \[nan"):
        tabular.hypergradient(cmdp, jnp.array([jnp.nan, 0.0, 0.0, 0.0]), batch, br, Q_L, 0.1)
    with pytest.raises(ValueError, match=r"shaped like theta0 \(4,\), got \(3,\)"):
        tabular.hypergradient(cmdp, jnp.zeros(3), batch, br, Q_L, 0.1)
    # a concrete follower policy must be one (rows summing to 2 gave V_L = -1.25 for rewards in
    # [0, 1]: the solve of I - 1.8 P)
    S, B = br.policy.shape
    for fn in (tabular.leader_values, tabular.policy_objective):
        with pytest.raises(ValueError, match="policy must hold probability rows"):
            fn(cmdp, cmdp.theta0, jnp.ones((S, B)))
        fn(cmdp, cmdp.theta0, jnp.full((S, B), 1.0 / B))
    th = problems.thermal()
    for fn in (lq.exact_hypergradient, lq.leader_objective, lq.best_response):
        with pytest.raises(ValueError, match="theta must be finite"):
            fn(th, jnp.full(8, jnp.inf), 0.1)
    game = problems.lqr_game()
    for fn in (games.lqr.exact_hypergradient, games.lqr.leader_objective, games.lqr.best_response):
        with pytest.raises(ValueError, match="theta must be finite"):
            fn(game, jnp.array([jnp.inf, 0.0]), 0.1)
        with pytest.raises(ValueError, match=r"must be the vector \[2\].*got shape \(3,\)"):
            fn(game, jnp.zeros(3), 0.1)
        # a matrix gain K [k, n] = [1, 2] is not read as a batch of one (it failed deep inside
        # with a dot_general shape error)
        with pytest.raises(ValueError, match=r"K.reshape\(-1\).*got shape \(1, 2\)"):
            fn(game, jnp.zeros((1, 2)), 0.1)


@pytest.mark.parametrize(
    "theta0, shown",
    [
        ({"w": jnp.zeros(1)}, "one floating array, got a dict .*ravel_pytree"),
        ((jnp.zeros(1),), "one floating array, got a tuple"),
        (jnp.zeros(1, jnp.int32), "floating array, got dtype int32"),
        (None, "theta0 is required"),
        (jnp.array([jnp.nan, 0.0]), r"theta0 must be finite, got \[nan, 0.0\]"),
    ],
)
def test_a_theta0_that_is_not_one_floating_array_is_refused(theta0, shown):
    """A pytree theta0 used to fail with numpy's 'entry not a 2- or 3- tuple'."""
    for make in (_cmdp, _lq):
        with pytest.raises(ValueError, match=shown):
            make(theta0=theta0).validate()
    with pytest.raises(ValueError, match=r"theta0 must have 1 axis\(es\).*got shape \(1, 1\)"):
        _lq(theta0=jnp.zeros((1, 1))).validate()
    _cmdp(theta0=jnp.zeros((1, 1))).validate()  # any shape is fine for a tabular theta


def test_float64_without_x64_is_refused_before_it_turns_into_float32():
    """A float64 theta0 (numpy's default) or a game TrainConfig(dtype="float64") used to train
    in float32 without a word when jax_enable_x64 is off; under x64 it is a float64 run."""
    with jax.enable_x64(False):
        for make in (_cmdp, _lq):
            with pytest.raises(ValueError, match="theta0 is float64 but jax_enable_x64 is off"):
                make(theta0=np.zeros(1)).validate()
            make(theta0=np.zeros(1, np.float32)).validate()
        with pytest.raises(ValueError, match="TrainConfig.dtype is float64 but jax_enable_x64"):
            game_tab.make_train(toy_game(2.0), "bchg", game_tab.TrainConfig(dtype="float64"))
        with pytest.raises(ValueError, match="TrainConfig.dtype is float64 but jax_enable_x64"):
            game_lqr.make_train(lqr_game(), "bchg", game_lqr.TrainConfig(dtype="float64"))
    with jax.enable_x64(True):
        cmdp = _cmdp(theta0=np.zeros(1)).validate()
        trainer = tabular.make_train(cmdp, "exact", tabular.TrainConfig(iterations=1))
        state, _ = trainer.train(jax.random.key(0), tabular.HParams(lr=0.1, beta=0.1))
        assert state.theta.dtype == jnp.float64


def test_a_wider_table_than_theta_is_refused_by_validate(x64):
    cmdp = _cmdp(
        theta0=jnp.zeros(1, jnp.float32), transition=lambda th: np.full((S, B, S), 1.0 / S)
    )  # float64 under x64
    with pytest.raises(ValueError, match="transition.*float64, wider than theta's float32"):
        cmdp.validate()
    _cmdp(
        theta0=jnp.zeros(1, jnp.float64), transition=lambda th: np.full((S, B, S), 1.0 / S)
    ).validate()  # same dtype: fine


@pytest.mark.slow
def test_train_key_and_dict_hparams():
    import jax

    from bchg_jax import problems, tabular

    cmdp = problems.random_tabular_cmdp(jax.random.key(0))
    trainer = tabular.make_train(
        cmdp, "bchg", tabular.TrainConfig(num_envs=2, num_steps=4, iterations=2)
    )
    hp = tabular.HParams(lr=0.1, sarsa_alpha=0.5, beta=0.1)
    with pytest.raises(ValueError, match=r"key must be a PRNG key such as jax.random.key\(0\)"):
        trainer.train(0, hp)
    _, m = trainer.train(jax.random.key(0), hp)
    _, m_dict = trainer.train(jax.random.key(0), {"lr": 0.1, "sarsa_alpha": 0.5, "beta": 0.1})
    np.testing.assert_array_equal(m["J"], m_dict["J"])
    _, m_raw = trainer.train(jax.random.PRNGKey(0), hp)  # a raw uint32 key works too
    assert np.all(np.isfinite(m_raw["J"]))
    with pytest.raises(ValueError, match="unknown hyperparameter"):
        trainer.train(jax.random.key(0), {"lr": 0.1, "alpha": 0.5, "beta": 0.1})
    # a vector where one run takes a scalar was applied per coordinate of theta (or failed on
    # shapes); a grid goes through run_grid
    with pytest.raises(ValueError, match=r"scalars, got shapes \{'lr': \(2,\)\}.*run_grid"):
        trainer.train(jax.random.key(0), hp._replace(lr=np.array([0.1, 0.2])))
    # ... and a dict of the same: its shapes as given (it read "(1, 2)", the list wrapped
    # into a one-point grid)
    with pytest.raises(ValueError, match=r"scalars, got shapes \{'lr': \(2,\)\}.*run_grid"):
        trainer.train(jax.random.key(0), {"lr": [0.1, 0.2], "sarsa_alpha": 0.5, "beta": 0.1})
    # clip_norm may be inf (no clipping); a finite-only field may not
    tabular.TrainConfig(clip_norm=np.inf).validate()
    with pytest.raises(ValueError, match="vi_tol must be finite, got inf"):
        tabular.TrainConfig(vi_tol=np.inf).validate()


def test_lqr_game_run_inside_the_warmup_warns(capsys):
    from experiments import lqr_game

    a = lqr_game.parse_args(["--iterations", "100", "--seeds", "2", "--method", "bchg_det"])
    lqr_game.validate_args(a)
    err = capsys.readouterr().err
    assert "lasts 200 iterations" in err and "no method updates the leader" in err
    lqr_game.validate_args(lqr_game.parse_args(["--iterations", "201", "--method", "bchg_det"]))
    assert capsys.readouterr().err == ""  # long enough: no warning
    # the exact methods wait out the warm-up too (they used to be exempt from the warning)
    lqr_game.validate_args(lqr_game.parse_args(["--iterations", "10", "--method", "exact"]))
    assert "no method updates the leader" in capsys.readouterr().err


def test_game_configs_refuse_a_half_dtype_empty_layers_and_a_game_without_time_limit():
    import dataclasses

    from bchg_jax.games import lqr
    from bchg_jax.games import tabular as tgame

    with pytest.raises(ValueError, match="TrainConfig.dtype must be float32 or float64"):
        tgame.TrainConfig(dtype="float16").validate()  # it trained on NaN
    with pytest.raises(ValueError, match=r"TrainConfig.hidden must be positive layer sizes"):
        tgame.TrainConfig(hidden=(0,)).validate()  # ZeroDivisionError in the initialiser
    with pytest.raises(ValueError, match=r"CriticConfig.hidden must be positive layer sizes"):
        lqr.CriticConfig(hidden=()).validate()
    with pytest.raises(ValueError, match="needs game.time_limit"):
        tgame.make_train(
            dataclasses.replace(toy_game(), time_limit=None), "bchg", tgame.TrainConfig()
        )


@pytest.mark.slow
def test_follower_references_refuse_k_below_one_and_a_bad_beta():
    """K = 0 used to run K = 1 silently (fori_loop over K - 1 = -1 sweeps) and the tabular
    as-if-optimal reference returned a finite gradient at beta = -0.5."""
    import jax

    from bchg_jax import lq, problems, tabular
    from bchg_jax.lq import follower_models as lq_followers
    from bchg_jax.lq import follower_references as lq_refs
    from bchg_jax.tabular import follower_models as tab_followers

    cmdp = problems.random_tabular_cmdp(jax.random.key(0))
    th, S = cmdp.theta0, cmdp.num_states
    V = jnp.zeros(S)
    for K in (0, -3, True, 1.0):
        with pytest.raises(ValueError, match="K .* must be a positive integer"):
            tabular.k_step_hypergradient(cmdp, th, V, 0.5, K)
        with pytest.raises(ValueError, match="K .* must be a positive integer"):
            tab_followers.k_step_response(
                cmdp.transition(th), cmdp.follower_reward(th), 0.5, 0.85, None, V, K
            )
    g = tabular.best_response(cmdp, th, 0.5).policy
    for beta in (-0.5, 0.0, float("nan")):
        for call in (
            lambda: tabular.as_if_optimal_hypergradient(cmdp, th, g, beta),
            lambda: tabular.k_step_hypergradient(cmdp, th, V, beta, 2),
            lambda: tabular.lag_hypergradient(cmdp, th, g, beta, 0.5),
        ):
            with pytest.raises(ValueError, match="beta"):
                call()
    therm = problems.thermal()
    P0 = jnp.zeros((therm.state_dim, therm.state_dim))
    for K in (0, -2):
        with pytest.raises(ValueError, match="K .* must be a positive integer"):
            lq_followers.k_step_response(therm, therm.theta0, 0.1, P0, K)
        with pytest.raises(ValueError, match="K .* must be a positive integer"):
            lq_refs.k_step_hypergradient(therm, therm.theta0, P0, 0.1, K)
    br = lq.best_response(therm, therm.theta0, 0.1)
    with pytest.raises(ValueError, match="beta"):
        lq_refs.as_if_optimal_hypergradient(therm, therm.theta0, br, -0.1)


@pytest.mark.parametrize(
    "field, value, shown",
    [
        ("steps", True, "steps must be a positive integer, got True"),
        ("mix", "0.5", "mix must be a real number, got '0.5'"),
        ("explore", float("nan"), "explore must be >= 0, got nan"),
        ("explore", 1.5, r"explore must be in \[0, 1\], got 1.5"),
        # passed validation and crashed in JAX (OverflowError) at --follower-steps 3000000000
        ("steps", 3_000_000_000, r"steps must be at most 2147483647 \(an int32 loop count\)"),
    ],
)
def test_follower_model_fields_are_numbers_of_the_right_kind(field, value, shown):
    from bchg_jax.core.follower_model import FollowerModel

    kind = {"steps": "k_step", "mix": "lag", "explore": "q_learning"}[field]
    with pytest.raises(ValueError, match=shown):
        FollowerModel(kind=kind, **{field: value}).validate()


def test_tabular_game_tolerances_and_policy_rows():
    """TabularGame rows off 1 by 9e-7 moved J by 0.9% at gamma 0.9999 and were accepted (a fixed
    1e-6 + numpy's rtol): the tolerance now tightens near gamma = 1 as the CMDP's does. Concrete
    policies given to the exact functions must be distributions (f = -0.5 everywhere gave a
    number)."""
    from bchg_jax.games import tabular as game_tabular
    from bchg_jax.problems.random_tabular import random_tabular_game

    game = random_tabular_game()
    P = np.asarray(game.transition, np.float64).copy()
    P[0, 0, 0, 0] += 9e-7
    for gamma, ok in ((0.9, True), (0.9999, False)):
        other = TabularGame(
            P, game.init_dist, game.follower_reward, game.leader_reward, gamma, gamma, 60
        )
        if ok:
            other.validate()
        else:
            with pytest.raises(ValueError, match=r"summing to 1 within 1e-07.*9\.\d*e-07"):
                other.validate()
    S, A = P.shape[:2]
    for f, shown in (
        (jnp.full((S, A), -0.5), "smallest entry -0.5"),
        (jnp.ones((S, A)), "sum - 1. 1"),
        # a NaN used to be hidden by nanmax / nanmin ("largest |row sum - 1| 1.11e-16")
        (jnp.full((S, A), 1.0 / A).at[1, 0].set(jnp.nan), r"1 non-finite entry .*at \(1, 0\)"),
    ):
        with pytest.raises(
            ValueError, match=f"f \\(leader policy\\) must hold probability rows.*{shown}"
        ):
            game_tabular.leader_objective(game, f, 0.5)
    game_tabular.leader_objective(game, jnp.full((S, A), 1.0 / A), 0.5)


def test_a_discount_given_as_a_string_and_a_bad_solver_setting_are_refused():
    """numpy reads '0.5' as 0.5, so a string discount passed validate() and failed later; the
    game's soft Q-iteration took tol = -1 and max_sweeps = 0."""
    from bchg_jax.games import tabular as game_tabular
    from bchg_jax.problems.random_tabular import random_tabular_game

    game = random_tabular_game()
    with pytest.raises(ValueError, match="gamma_F must be a number in"):
        TabularGame(
            game.transition, game.init_dist, game.follower_reward, game.leader_reward, "0.5", 0.5, 9
        ).validate()
    with pytest.raises(ValueError, match="gamma_L must be a number in"):
        _cmdp(gamma_L=True).validate()
    S, A = np.shape(game.transition)[:2]
    f = jnp.full((S, A), 1.0 / A)
    with pytest.raises(ValueError, match="soft_q_iteration: tol .*must be finite and > 0"):
        game_tabular.soft_q_iteration(game, f, 0.5, tol=-1.0)
    with pytest.raises(ValueError, match="soft_q_iteration: max_sweeps must be an integer >= 1"):
        game_tabular.soft_q_iteration(game, f, 0.5, max_sweeps=0)


def _solver_setting_calls():
    """(label, call(**settings), the settings' names) of every solver with a tolerance or a
    sweep / iteration count, and of functions that pass them on."""
    from bchg_jax.core.maxent_lqr import maxent_lqr, riccati
    from bchg_jax.games.lqr import exact as game_lqr_exact
    from bchg_jax.games.lqr import follower as game_lqr_follower
    from bchg_jax.games.tabular import exact as game_exact
    from bchg_jax.games.tabular import follower as game_follower
    from bchg_jax.problems.toy_game import toy_game
    from bchg_jax.tabular import exact, sparse
    from bchg_jax.tabular import follower_references as refs
    from bchg_jax.tabular.follower import soft_value_iteration

    P, r = jnp.full((S, B, S), 1.0 / S), jnp.ones((S, B))
    table = sparse.successors_from_transition(P)
    A, I2 = 0.9 * jnp.eye(2), jnp.eye(2)
    prob, game, theta = _cmdp(), toy_game(), jnp.array([-1.0, 0.5])
    f = jnp.full(np.shape(game.transition)[:2], 0.5)
    policy = jnp.full((S, B), 1.0 / B)
    return [
        ("svi", lambda **k: soft_value_iteration(P, r, 0.1, 0.9, **k), "tol num_sweeps"),
        (
            "svi to tol",
            lambda **k: soft_value_iteration(P, r, 0.1, 0.9, tol=1e-6, **k),
            "max_sweeps",
        ),
        (
            "sparse svi",
            lambda **k: sparse.sparse_soft_value_iteration(P, r, 0.1, 0.9, table, **k),
            "tol max_sweeps linear_sweeps",
        ),
        (
            "sparse evaluation",
            lambda tol=1e-6, **k: sparse.sparse_policy_evaluation(
                P, r, policy, 0.9, jnp.ones(S), jnp.zeros(S), table, tol, **k
            ),
            "tol max_sweeps",
        ),
        (
            "evaluation",
            lambda tol=1e-6, **k: exact.policy_evaluation_sweeps(
                P, r, policy, 0.9, jnp.ones(S), jnp.zeros(S), tol, **k
            ),
            "tol max_sweeps",
        ),
        (
            "soft_newton",
            lambda **k: exact.soft_newton(P, r, 0.1, 0.9, jnp.ones(S), jnp.zeros(S), **k),
            "iters",
        ),
        (
            "best_response",
            lambda **k: exact.best_response(prob, prob.theta0, 0.1, **k),
            "tol newton_iters polish_sweeps",
        ),
        (
            "leader_objective",
            lambda **k: exact.leader_objective(prob, prob.theta0, 0.1, **k),
            "tol",
        ),
        (
            "lag",
            lambda **k: refs.lag_hypergradient(prob, prob.theta0, policy, 0.1, 0.5, **k),
            "tol",
        ),
        ("riccati", lambda **k: riccati(A, I2, I2, I2, 0.9, **k), "tol max_iters newton_iters"),
        ("maxent_lqr", lambda **k: maxent_lqr(A, I2, I2, I2, I2, 0.9, 0.1, **k), "tol max_iters"),
        (
            "game best_response",
            lambda **k: game_lqr_follower.best_response(lqr_game(), theta, 0.1, **k),
            "tol max_iters",
        ),
        (
            "game exact",
            lambda **k: game_lqr_exact.exact_hypergradient(lqr_game(), theta, 0.1, **k),
            "tol max_iters",
        ),
        ("toy best_response", lambda **k: game_exact.best_response(game, f, 0.05, **k), "tol"),
        (
            "toy soft_q_iteration",
            lambda **k: game_follower.soft_q_iteration(game, f, 0.05, **k),
            "tol max_sweeps",
        ),
        (
            "newton_polish",
            lambda **k: game_exact.newton_polish(
                game, f, 0.05, jnp.zeros(np.shape(game.transition)[:3]), **k
            ),
            "iters",
        ),
    ]


def test_solver_tolerances_and_counts_are_checked():
    """A NaN / negative tolerance is never met and an infinite one by the first sweep; a count
    below its floor ran nothing, a float count failed in lax. riccati(tol=nan) was called
    "unstabilisable", soft_value_iteration(tol=nan) returned 0 sweeps and a residual of inf,
    num_sweeps=-2 reported -2 sweeps, and the sparse solver rounded max_sweeps=2.5 to 2."""
    bad_tols = (float("nan"), -1.0, float("inf"), 0.0)
    for label, call, names in _solver_setting_calls():
        for name in names.split():
            if name == "tol":
                for bad in bad_tols:
                    with pytest.raises(ValueError, match="tol .*must be finite and > 0"):
                        call(tol=bad)
                        pytest.fail(f"{label}: tol={bad} was taken")
                continue
            zero_ok = ("iters", "newton_iters", "polish_sweeps", "linear_sweeps", "num_sweeps")
            low = 0 if name in zero_ok else 1
            for bad in (low - 1, 2.5, True):
                with pytest.raises(ValueError, match=f"{name} must be an integer >= {low}"):
                    call(**{name: bad})
                    pytest.fail(f"{label}: {name}={bad!r} was taken")


@pytest.mark.slow
def test_hypergradients_refuse_indices_out_of_range_and_misshaped_tables():
    """JAX clamps an out-of-range gather index and drops an out-of-range scatter: a user's batch
    with a state index past S gave a finite, wrong estimate. Both tabular families refuse it."""
    from bchg_jax.games import tabular as gt
    from bchg_jax.problems.random_tabular import random_tabular_game
    from bchg_jax.tabular import estimators as te
    from bchg_jax.tabular.exact import best_response
    from bchg_jax.tabular.rollout import Batch

    game = random_tabular_game(0)
    S_, A_, B_ = np.shape(game.transition)[:3]
    g = jnp.full((S_, A_, B_), 1.0 / B_)
    Q, V = jnp.zeros((S_, A_, B_)), jnp.zeros((S_, A_))
    idx = jnp.zeros((2, 5), jnp.int32)
    ok = gt.GameEpisodes(idx, idx, idx)
    args = (lambda th: jax.nn.softmax(th, -1), jnp.zeros((S_, A_)))
    gt.hypergradient(*args, ok, g, Q, V, 0.1, 0.9, 0.5)
    for bad, match in (
        (ok._replace(s=idx + S_), r"ep.s \(states\) must be indices in \[0, 3\]"),
        (ok._replace(a=idx - 1), r"ep.a must be indices"),
        (ok._replace(b=idx.astype(jnp.float32)), r"ep.b must be an integer array"),
    ):
        with pytest.raises(ValueError, match=match):
            gt.hypergradient(*args, bad, g, Q, V, 0.1, 0.9, 0.5)
    with pytest.raises(ValueError, match=r"V_F must have shape \(4, 2\)"):
        gt.hypergradient(*args, ok, g, Q, jnp.zeros((S_, B_ + 1)), 0.1, 0.9, 0.5)

    problem = _cmdp()
    theta = problem.theta0
    br = best_response(problem, theta, 0.1)
    z = jnp.zeros((2, 4), jnp.int32)
    batch = Batch(z, z, z, z, jnp.zeros((2, 4), bool), jnp.zeros((2, 4), bool).at[:, -1].set(True))
    Q_L = jnp.zeros((S, B))
    te.hypergradient(problem, theta, batch, br, Q_L, 0.1)
    for field, value, match in (
        ("s", z + S, r"batch.s must be indices in \[0, 2\]"),
        ("b", z + B, r"batch.b must be indices in \[0, 1\]"),
        ("s_next", z - 1, r"batch.s_next must be indices"),
    ):
        with pytest.raises(ValueError, match=match):
            te.hypergradient(problem, theta, batch._replace(**{field: value}), br, Q_L, 0.1)


@pytest.mark.slow
def test_game_whole_episode_estimate_and_references_refuse_what_is_not_a_policy():
    """games.hypergradient took a log-policy, 2 g or exp(logits) and returned finite numbers
    (relative error 46 / 8 / 24 on a random game); soft_policy_evaluation took beta <= 0 and
    lag_hypergradient a mix of 2. Each is now a ValueError naming the culprit."""
    from bchg_jax.problems.random_tabular import random_tabular_game

    game = random_tabular_game()
    softmax = lambda th: jax.nn.softmax(th, -1)  # noqa: E731
    theta = jnp.zeros((4, 2))
    f = softmax(theta)
    br = game_tab.best_response(game, f, 0.5, "paper")
    V_L, Q_L = game_tab.leader_values(game, f, br.policy)
    ep = game_tab.rollout(jax.random.key(0), game, f, br.policy, 2, 10)

    def est(policy_fn, g):
        return game_tab.hypergradient(policy_fn, theta, ep, g, Q_L, br.V, 0.5, 0.8, 0.8)

    est(softmax, br.policy)  # the valid call
    for g in (jnp.log(br.policy), 2.0 * br.policy):
        with pytest.raises(ValueError, match=r"g \(follower policy\) must hold probability rows"):
            est(softmax, g)
    with pytest.raises(ValueError, match=r"policy_fn\(theta\) \(leader policy\) must hold prob"):
        est(jnp.exp, br.policy)
    for beta in (-0.5, 0.0):
        with pytest.raises(ValueError, match="beta"):
            game_tab.soft_policy_evaluation(game, f, br.policy, beta)
    with pytest.raises(ValueError, match=r"mix .*\(0, 1\]"):
        game_tab.lag_hypergradient(softmax, theta, game, br.policy, 0.5, 2.0)
    # a critic that is not finite (a NaN Q_L, V_F or V_L gave an all-NaN estimate, unsaid)
    critics = dict(Q_L=Q_L, V_F=br.V, V_L=V_L)
    for name in critics:
        bad = {**critics, name: critics[name].at[0].set(jnp.nan)}
        with pytest.raises(ValueError, match=f"{name} must be finite"):
            game_tab.hypergradient(
                softmax,
                theta,
                ep,
                br.policy,
                bad["Q_L"],
                bad["V_F"],
                0.5,
                0.8,
                0.8,
                "benefit",
                bad["V_L"],
            )


@pytest.mark.slow
def test_lqr_exact_critic_estimate_warns_when_influence_sums_are_cut():
    game = lqr_game()  # gamma_F 0.95: 0.95^1 = 0.95 of the weight is cut
    with pytest.warns(UserWarning, match="cuts the follower's influence sums.*>= 135"):
        game_lqr.exact_critic_estimate(
            game, TH_LQR, 0.1, jax.random.key(0), episodes=2, leader_steps=3, extra_steps=1
        )
    # influence_steps: the fewest extra steps that stay quiet (0.95^135 = 9.8e-4 <= 1e-3)
    k = game_lqr.influence_steps(game)
    assert k == 135 and 0.95**k <= 1e-3 < 0.95 ** (k - 1)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        game_lqr.exact_critic_estimate(
            game, TH_LQR, 0.1, jax.random.key(0), episodes=2, leader_steps=3, extra_steps=k
        )


def test_check_problem_refuses_a_follower_it_would_ignore():
    """check_problem samples under the best response; a k_step config used to be measured as
    the best response without a word (bit-identical means for best_response, k_step 1, lag)."""
    from bchg_jax.core.follower_model import FollowerModel
    from bchg_jax.lq.check import check_problem as lq_check
    from bchg_jax.problems import random_tabular_cmdp, thermal
    from bchg_jax.tabular.check import check_problem as tab_check

    cmdp = random_tabular_cmdp(jax.random.key(0))
    config = tabular.TrainConfig(follower=FollowerModel("k_step", steps=1))
    with pytest.raises(ValueError, match="not follower='k_step'.*as_if_optimal_hypergradient"):
        tab_check(cmdp, [cmdp.theta0], 0.1, config=config, batches=2)
    config = lq_family.TrainConfig(follower=FollowerModel("k_step", steps=1))
    with pytest.raises(ValueError, match="not follower='k_step'"):
        lq_check(thermal(), [thermal().theta0], 0.1, config=config, batches=2)


@pytest.mark.slow
def test_lqr_game_check_refuses_bad_options_before_estimating():
    from bchg_jax.games.lqr import check_problem

    with pytest.raises(ValueError, match="batches must be >= 2"):
        check_problem(lqr_game(), [TH_LQR], 0.1, batches=1)
    with pytest.raises(ValueError, match="guide"):
        check_problem(lqr_game(), [TH_LQR], 0.1, guide="hpgd", batches=2, leader_steps=2)
    with pytest.raises(ValueError, match="direct_baseline"):
        check_problem(lqr_game(), [TH_LQR], 0.1, direct_baseline="x", batches=2, leader_steps=2)
    with pytest.raises(ValueError, match="beta"):
        check_problem(lqr_game(), [TH_LQR], 0.0, batches=2, leader_steps=2)
    # a theta at which the follower's pair is unstabilisable is named as such (validate(theta),
    # as lq.check_problem does), not as a Riccati iteration that failed
    with pytest.raises(ValueError, match=r"is not stabilisable at theta=\[-20.0, -10.0\]"):
        check_problem(lqr_game(), [np.array([-20.0, -10.0])], 0.1, batches=2, leader_steps=2)


@pytest.mark.slow
def test_a_vector_beta_is_refused_by_the_pure_functions():
    """beta = [0.3, 3.0] broadcast across the columns of the LQR follower's covariance
    (0.5 beta S^-1): J -30.47 where beta 0.3 gives -17.20 and beta 3.0 -38.49, with no error.
    One follower has one entropy weight; several are a vmap (or a trainer's grid)."""
    from bchg_jax import problems

    two = jnp.array([0.3, 3.0])
    shown = r"beta \(follower entropy coefficient\) must be a scalar, got shape \(2,\)"
    th = problems.thermal()
    cmdp = problems.random_tabular_cmdp(jax.random.key(0))
    game = problems.lqr_game()
    calls = (
        lambda b: lq_family.leader_objective(th, th.theta0, b),
        lambda b: lq_family.exact_hypergradient(th, th.theta0, b),
        lambda b: lq_family.best_response(th, th.theta0, b),
        lambda b: tabular.best_response(cmdp, cmdp.theta0, b),
        lambda b: tabular.exact_hypergradient(cmdp, cmdp.theta0, b),
        lambda b: game_lqr.leader_objective(game, jnp.zeros(2), b),
    )
    for call in calls:
        with pytest.raises(ValueError, match=shown):
            call(two)
        with pytest.raises(ValueError, match=shown):  # a traced vector too (a static shape)
            jax.jit(call)(two)
    # a vmap over betas is the way (and a trainer's grid of betas stays valid)
    Js = jax.vmap(lambda b: lq_family.leader_objective(th, th.theta0, b))(two)
    for J, b in zip(Js, two, strict=True):
        np.testing.assert_allclose(J, lq_family.leader_objective(th, th.theta0, b), rtol=1e-5)
    lq_family.HParams(lr=0.1, beta=two).validate()


# ---- the linear-Gaussian families' constant arrays, checked by the pure functions -------------
TH_LQ = jnp.zeros(1)
LQ_PURE_CALLS = {
    "lq.best_response": lambda p: lq_family.best_response(p, TH_LQ, 0.1),
    "lq.leader_objective": lambda p: lq_family.leader_objective(p, TH_LQ, 0.1),
    "lq.exact_hypergradient": lambda p: lq_family.exact_hypergradient(p, TH_LQ, 0.1),
    "lq.exact_hypergradient under jit": lambda p: jax.jit(
        lambda th: lq_family.exact_hypergradient(p, th, 0.1)
    )(TH_LQ),
    "lq.policy_value": lambda p: lq_family.policy_value(
        p, TH_LQ, lq_family.best_response(_lq(), TH_LQ, 0.1), 0.1
    ),
}


@pytest.mark.parametrize(
    "over, shown",
    [
        (dict(Qbar=np.diag([-0.5, 1.0])), "Qbar must be symmetric positive semi-definite"),
        (dict(Rbar=np.full((1, 1), np.nan)), "Rbar is not finite"),
        (dict(U=np.triu(np.ones((2, 2)))), "U must be lower-triangular"),
        (dict(init_cov=-np.eye(2)), "init_cov must be symmetric positive definite"),
        (dict(init_cov=np.eye(3)), r"init_cov must have shape \(2, 2\) \(n=2 from Qbar"),
    ],
)
@pytest.mark.parametrize("call", LQ_PURE_CALLS)
def test_lq_pure_functions_refuse_bad_constant_arrays(over, shown, call):
    """Before: an indefinite Qbar, an upper-triangular U or a negative init_cov gave a finite
    hypergradient (0.0 here) from every exact reference; nobody had called validate()."""
    with pytest.raises(ValueError, match=shown):
        LQ_PURE_CALLS[call](_lq(**over))


GAME_PURE_CALLS = {
    "games.lqr.best_response": lambda g: game_lqr.best_response(g, TH_LQR, 0.1),
    "games.lqr.leader_objective": lambda g: game_lqr.leader_objective(g, TH_LQR, 0.1),
    "games.lqr.exact_hypergradient": lambda g: game_lqr.exact_hypergradient(g, TH_LQR, 0.1),
    "games.lqr.exact_critic_estimate": lambda g: game_lqr.exact_critic_estimate(
        g, TH_LQR, 0.1, K, episodes=2, leader_steps=3, extra_steps=1, stochastic=False
    ),
}


@pytest.mark.parametrize(
    "over, shown",
    [
        (dict(Sigma=-np.eye(2)), "Sigma must be symmetric positive semi-definite"),
        (dict(Qbar=-np.eye(2)), "Qbar must be symmetric positive semi-definite"),
        (dict(U=-np.eye(1)), "U must be lower-triangular with a non-negative diagonal"),
    ],
)
@pytest.mark.parametrize("call", GAME_PURE_CALLS)
def test_lqr_game_pure_functions_refuse_bad_constant_arrays(over, shown, call):
    """Before: Sigma = -I (a bump that is a well) gave a finite hypergradient [0.109, 0.007]."""
    with pytest.raises(ValueError, match=shown):
        GAME_PURE_CALLS[call](dataclasses.replace(lqr_game(), **over))


@pytest.mark.slow
def test_a_leader_without_noise_is_refused_by_the_score_estimate_only():
    """U = 0 is the deterministic leader: its exact J and hypergradient are defined (and equal
    the deterministic leader's), its score log f_theta(a|s) is not (the estimate was NaN)."""
    game = dataclasses.replace(lqr_game(), U=np.zeros((1, 1)))
    g_stoch = game_lqr.exact_hypergradient(game, TH_LQR, 0.1)
    g_det = game_lqr.exact_hypergradient(game, TH_LQR, 0.1, stochastic=False)
    np.testing.assert_allclose(g_stoch, g_det, rtol=1e-5, atol=1e-8)
    opts = dict(episodes=2, leader_steps=3, extra_steps=1)
    est = game_lqr.exact_critic_estimate(game, TH_LQR, 0.1, K, stochastic=False, **opts)
    assert np.all(np.isfinite(est))
    with pytest.raises(ValueError, match=r"positive-definite covariance U U\^T.*stochastic=False"):
        game_lqr.exact_critic_estimate(game, TH_LQR, 0.1, K, **opts)


def test_the_constants_check_runs_once_per_problem_object(monkeypatch):
    """Checked on first use, remembered for that object; a replaced problem is a new object."""
    calls = []
    problem = _lq()
    original = type(problem).check_constants
    monkeypatch.setattr(
        type(problem), "check_constants", lambda self: calls.append(self) or original(self)
    )
    for _ in range(3):
        lq_family.leader_objective(problem, TH_LQ, 0.1)
    assert calls == [problem]
    lq_family.leader_objective(dataclasses.replace(problem, name="other"), TH_LQ, 0.1)
    assert len(calls) == 2


# ---- masks, 16-bit floats and overflows (an audit of user-defined tabular problems) -----------
def test_a_terminal_mask_that_is_not_bool_is_refused_and_read_as_the_sampler_reads_it():
    """The exact solvers took ``1 - terminal`` as the continuation, the sampler ``terminal != 0``:
    a mask entry of 2 (or 0.5) gave two different problems, silently (J +0.07 against -0.64)."""
    from bchg_jax import tabular

    for mask in ([0, 0, 2], [0, 0, 0.5], [0, 0, np.nan]):
        with pytest.raises(ValueError, match="terminal must be a bool mask"):
            _cmdp(terminal=np.asarray(mask)).validate()
    _cmdp(terminal=np.asarray([0, 0, 1])).validate()
    _cmdp(terminal=np.asarray([0.0, 0.0, 1.0])).validate()
    with pytest.raises(ValueError, match="terminal must be a bool mask"):  # the pure functions too
        tabular.leader_objective(_cmdp(terminal=np.array([0, 0, 2])), jnp.ones(1), 1.0)
    # the solvers' continuation reads a mask as the sampler does: any non-zero entry is terminal
    cont = tabular.follower.continuation(np.array([0, 3, 1]), 3, jnp.float32)
    np.testing.assert_array_equal(np.asarray(cont), [1, 0, 0])


@pytest.mark.parametrize("dtype", [jnp.float16, jnp.bfloat16])
def test_a_16_bit_theta_is_refused(dtype):
    """float16 / bfloat16 passed validate(), and a tabular run trained with a row-sum tolerance
    of 0.03 / 0.25 and reported J up to 7% off with no flag; the exact references failed deep
    in a linear solve."""
    from bchg_jax import lq, tabular

    with pytest.raises(ValueError, match=f"theta0 is {np.dtype(dtype).name}"):
        _cmdp(theta0=jnp.zeros(1, dtype)).validate()
    with pytest.raises(ValueError, match=f"theta0 is {np.dtype(dtype).name}"):
        _lq(theta0=jnp.zeros(1, dtype)).validate()
    with pytest.raises(ValueError, match=f"theta is {np.dtype(dtype).name}"):
        tabular.exact_hypergradient(_cmdp(), jnp.zeros(1, dtype), 1.0)
    with pytest.raises(ValueError, match=f"theta is {np.dtype(dtype).name}"):
        lq.exact_hypergradient(_lq(), jnp.zeros(1, dtype), 1.0)


def test_an_overflowing_solve_is_not_called_short(x64):
    """beta = 1e-310 overflows r / beta in float64: the message said to raise the iteration
    caps, which cannot help. (At 1e-200 the eager ops overflow where the compiled program, which
    traces beta, does not: it returns the right uniform policy, V = 10.)"""
    from bchg_jax import tabular

    problem = _cmdp(theta0=jnp.zeros(1, jnp.float64))
    with pytest.raises(ValueError, match="non-finite values .* not a short solve"):
        tabular.best_response(problem, jnp.ones(1, jnp.float64), 1e-310)


def test_a_float32_leader_objective_stays_float32_under_x64(x64):
    """Without a leader regulariser Phi_L was a zero in JAX's default float (float64 under x64),
    which promoted J."""
    from bchg_jax import tabular

    f32 = jnp.float32
    problem = _cmdp(
        transition=lambda th: jnp.full((S, B, S), 1.0 / S, f32),
        init_dist=lambda th: jnp.full(S, 1.0 / S, f32),
        follower_reward=lambda th: jnp.zeros((S, B), f32) + th[0],
        leader_reward=lambda th: jnp.ones((S, B), f32),
        theta0=jnp.zeros(1, f32),
    )
    assert tabular.leader_objective(problem, jnp.ones(1, f32), 1.0).dtype == f32


# ---- LQ estimators' inputs (an audit of user-defined LQ problems) ---------------------------
def _lq_batch():
    from bchg_jax import lq

    problem = _lq(theta0=jnp.zeros(2))
    theta = jnp.asarray([0.1, -0.2])
    br = lq.best_response(problem, theta, 1.0)
    traj = lq.rollout(jax.random.key(0), problem, theta, br, 4, 6)
    return problem, theta, traj


def test_lq_estimators_refuse_a_short_theta_and_misshapen_batch_arrays():
    """A short theta was indexed past its end inside the user's functions (JAX clamps th[2] to
    th[1]) and a [1, T+1] V_L broadcast over the episodes: wrong estimates, no error."""
    from bchg_jax import lq

    problem, theta, traj = _lq_batch()
    E, T1 = traj.s.shape[:2]
    V = jnp.zeros((E, T1))
    short = theta[:1]
    with pytest.raises(ValueError, match=r"theta must be shaped like theta0 \(2,\), got \(1,\)"):
        lq.rollout(jax.random.key(0), problem, short, lq.best_response(problem, theta, 1.0), 4, 6)
    with pytest.raises(ValueError, match="theta must be shaped like theta0"):
        lq.hypergradient(problem, short, traj, 1.0, V, V, "none")
    with pytest.raises(ValueError, match="theta must be shaped like theta0"):
        lq.per_step_follower_grad_pathwise(problem, short, traj, lambda s: jnp.sum(s, -1))
    with pytest.raises(ValueError, match=r"V_L must have shape \(4, 7\)"):
        lq.hypergradient(problem, theta, traj, 1.0, V[:1], V, "none")
    with pytest.raises(ValueError, match=r"benefit must have shape \(4, 6\)"):
        lq.hypergradient(problem, theta, traj, 1.0, V, V, "benefit", benefit=V)
    with pytest.raises(ValueError, match=r"dQF must have shape \(4, 6, 2\)"):
        lq.hypergradient(problem, theta, traj, 1.0, V, V, "benefit", V[:, 1:], dQF=V[:, 1:])
    with pytest.raises(ValueError, match=r"V_F_next must have shape \(4, 6\)"):
        lq.per_step_follower_grad(problem, theta, traj, V)
    with pytest.raises(ValueError, match=r"traj.b must have shape \(4, 7, 1\)"):
        lq.hypergradient(problem, theta, traj._replace(b=traj.b[:, 1:]), 1.0, V, V, "none")
    # the right shapes pass
    lq.hypergradient(problem, theta, traj, 1.0, V, V, "benefit", V[:, 1:], dQF=jnp.zeros((4, 6, 2)))


def test_lq_pure_functions_refuse_an_integer_theta_and_name_a_wider_A(x64):
    """An int theta gave an OverflowError (or 'grad requires real-valued inputs'); a float64
    A(theta) with a float32 theta failed inside the Riccati while_loop ('carry input and carry
    output must have equal types') when called without validate()."""
    from bchg_jax import lq

    problem = _lq(theta0=jnp.zeros(1, jnp.float32))
    with pytest.raises(ValueError, match="theta must be a floating array, got dtype int32"):
        lq.leader_objective(problem, jnp.zeros(1, jnp.int32), 1.0)
    wide = _lq(
        theta0=jnp.zeros(1, jnp.float32),
        A_fn=lambda th: np.eye(2) * 0.5 + th[0],  # numpy float64 under x64
        B_fn=lambda th: jnp.ones((2, 1), jnp.float32),
    )
    with pytest.raises(ValueError, match=r"A\(theta\) has dtype float64, wider than theta's"):
        lq.best_response(wide, jnp.zeros(1, jnp.float32), 1.0)


def test_lqr_game_leader_objective_checks_an_s0_override():
    """A NaN s0 returned NaN and a wrong-length one a dot_general TypeError."""
    from bchg_jax.games import lqr

    game = lqr_game()
    theta = jnp.zeros(game.num_params)
    with pytest.raises(ValueError, match=r"s0 must have shape \(2,\)"):
        lqr.leader_objective(game, theta, 0.1, s0=jnp.zeros(3))
    with pytest.raises(ValueError, match="s0 must be finite"):
        lqr.leader_objective(game, theta, 0.1, s0=jnp.asarray([np.nan, 0.0]))
    assert np.isfinite(float(lqr.leader_objective(game, theta, 0.1, s0=jnp.ones(2))))


def test_the_lower_level_pure_functions_refuse_a_bad_beta_or_discount():
    """These computed on: q_learning_policy at beta 0 gave NaN, soft_policy_value at beta -1
    finite values, riccati at gamma 1.5 'converged', and the segment sums took gamma 1.5."""
    from bchg_jax import lq, tabular
    from bchg_jax.core.segments import discounted_suffix_sum, forward_discounted_sum
    from bchg_jax.tabular.rollout import Batch

    P = jnp.full((S, B, S), 1.0 / S)
    r, pol, cont = jnp.zeros((S, B)), jnp.full((S, B), 1.0 / B), jnp.ones(S)
    with pytest.raises(ValueError, match="beta"):
        tabular.q_learning_policy(r, 0.0, 0.0)
    with pytest.raises(ValueError, match="beta"):
        tabular.soft_policy_value(P, r, pol, -1.0, 0.9, cont)
    with pytest.raises(ValueError, match=r"gamma \(the follower's discount\)"):
        tabular.soft_policy_value(P, r, pol, 1.0, 1.5, cont)
    z = jnp.zeros((2, 3), jnp.int32)
    batch = Batch(z, z, z, z, z.astype(bool), z.astype(bool))
    with pytest.raises(ValueError, match=r"gamma \(the follower's discount\)"):
        tabular.q_learning_update(r, batch, r, 1.0, 1.5, 0.1)
    for gamma in (1.5, -0.1):
        with pytest.raises(ValueError, match=r"gamma \(the Riccati discount\)"):
            lq.riccati(jnp.eye(2), jnp.ones((2, 1)), jnp.eye(2), jnp.eye(1), gamma)
    x, done = jnp.ones((2, 3)), jnp.zeros((2, 3), bool)
    for fn in (discounted_suffix_sum, forward_discounted_sum):
        with pytest.raises(ValueError, match=r"gamma \(segment discount\) must be a number in"):
            fn(x, 1.5, done)
        fn(x, 1.0, done)  # an undiscounted finite sum is fine


def test_the_followers_references_refuse_a_bad_policy_mix_or_previous_value():
    """From an audit of the off-best-response references: rows summing to 2 gave the tabular
    as-if gradient of no policy (33% off the normalised one), lag_hypergradient took mix 1.5 and
    a [B] previous policy (broadcast), the game's lag took a [B] g_prev, its K-step a wrong
    Q_prev with a scan-carry TypeError, and the LQ K-step learner P_prev = -I (a sign slip) with
    a finite J and gradient from a covariance with negative eigenvalues."""
    from bchg_jax import lq, tabular
    from bchg_jax.games import tabular as games
    from bchg_jax.problems import random_tabular_game
    from bchg_jax.problems.thermal import thermal

    problem, theta = _cmdp(), jnp.ones(1)
    uniform = jnp.full((S, B), 1.0 / B)
    with pytest.raises(ValueError, match="policy must hold probability rows"):
        tabular.as_if_optimal_hypergradient(problem, theta, 2 * uniform, 1.0)
    with pytest.raises(ValueError, match=r"policy must have shape \(3, 2\)"):
        tabular.as_if_optimal_hypergradient(problem, theta, uniform[:1], 1.0)
    with pytest.raises(ValueError, match=r"mix must be in \(0, 1\]"):
        tabular.lag_hypergradient(problem, theta, uniform, 1.0, 1.5)
    with pytest.raises(ValueError, match=r"previous must have shape \(3, 2\)"):
        tabular.lag_hypergradient(problem, theta, uniform[0], 1.0, 0.5)
    with pytest.raises(ValueError, match="explore must be in"):
        tabular.q_learning_policy(uniform, 1.0, 2.0)

    game = random_tabular_game(0, S=4, A=2, B=3)
    th = jnp.zeros((4, 2))

    def policy_fn(t):
        return jax.nn.softmax(t, -1)

    g = jnp.full((4, 2, 3), 1.0 / 3)
    with pytest.raises(
        ValueError, match=r"g_prev \(the follower.s previous policy\) must have shape \(4, 2, 3\)"
    ):
        games.lag_hypergradient(policy_fn, th, game, g[0, 0], 1.0, 0.5)
    with pytest.raises(ValueError, match="must hold probability rows"):
        games.lag_hypergradient(policy_fn, th, game, 2 * g, 1.0, 0.5)
    with pytest.raises(ValueError, match=r"Q_prev must have shape \(4, 2, 3\)"):
        games.k_step_hypergradient(policy_fn, th, game, jnp.zeros((2, 3)), 1.0, 2)

    p = thermal()
    t = jnp.asarray(p.theta0)
    with pytest.raises(ValueError, match="P_prev must be positive semi-definite"):
        lq.k_step_response(p, t, 0.1, -jnp.eye(4), 2)
    with pytest.raises(ValueError, match="P_prev must be positive semi-definite"):
        lq.k_step_hypergradient(p, t, -jnp.eye(4), 0.1, 2)
    with pytest.raises(ValueError, match="beta"):
        lq.k_step_response(p, t, 0.0, jnp.eye(4), 2)


def test_follower_references_name_their_start_values_and_refuse_nan():
    """tabular.k_step_hypergradient named a bad V_prev "V0" (the solver's argument) and took a
    NaN V_prev (an all-NaN gradient); games.tabular.lag_hypergradient named g_prev "g"; its
    k_step_hypergradient took a NaN Q_prev."""
    from bchg_jax import problems, tabular
    from bchg_jax.problems.random_tabular import random_tabular_game

    cmdp = problems.random_tabular_cmdp(jax.random.key(0))
    th, S = cmdp.theta0, cmdp.num_states
    with pytest.raises(ValueError, match=r"V_prev must have shape \(%d,\)" % S):
        tabular.k_step_hypergradient(cmdp, th, jnp.zeros((S, 1)), 0.5, 2)
    with pytest.raises(ValueError, match="V_prev must be finite, got 1 of"):
        tabular.k_step_hypergradient(cmdp, th, jnp.zeros(S).at[0].set(jnp.nan), 0.5, 2)
    game = random_tabular_game()
    softmax = lambda t: jax.nn.softmax(t, -1)  # noqa: E731
    theta = jnp.zeros((4, 2))
    br = game_tab.best_response(game, softmax(theta), 0.5, "paper")
    with pytest.raises(ValueError, match=r"g_prev \(the follower's previous policy\) must have"):
        game_tab.lag_hypergradient(softmax, theta, game, br.policy[..., :1], 0.5, 0.5)
    with pytest.raises(ValueError, match="Q_prev must be finite"):
        game_tab.k_step_hypergradient(softmax, theta, game, br.Q * jnp.nan, 0.5, 2)
    assert np.all(np.isfinite(game_tab.k_step_hypergradient(softmax, theta, game, br.Q, 0.5, 2)))


def test_a_list_theta_is_refused_by_name():
    """A list theta was read as a pytree of scalars: "shaped like theta0 (4,), got [(), (), (),
    ()]"."""
    from bchg_jax import problems, tabular

    cmdp = problems.random_tabular_cmdp(jax.random.key(0))
    for th in ([0.0] * 4, (0.0,) * 4):
        with pytest.raises(
            ValueError,
            match=r"one array shaped like theta0 \(4,\), got a (list|tuple) of 4; pass jnp.asarray",
        ):
            tabular.exact_hypergradient(cmdp, th, 0.5)


@pytest.mark.parametrize(
    "call",
    [
        lambda th: game_tab.exact_hypergradient(
            lambda t: jax.nn.softmax(t, -1), th, toy_game(), 0.5
        ),
        lambda th: game_tab.as_if_optimal_hypergradient(
            lambda t: jax.nn.softmax(t, -1), th, toy_game(), jnp.full((3, 2, 3), 1 / 3), 0.5
        ),
    ],
    ids=["exact_hypergradient", "as_if_optimal_hypergradient"],
)
def test_games_tabular_integer_theta_is_named(call):
    """An integer theta gave JAX's raw 'grad requires real-valued inputs' TypeError; it is refused
    before ``policy_fn`` is traced with it (that printed NumPy's 'invalid value encountered in
    cast' first)."""
    S, A = np.shape(toy_game().transition)[:2]
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)
        with pytest.raises(ValueError, match="theta must be a floating array"):
            call(jnp.zeros((S, A), jnp.int32))


@pytest.mark.parametrize(
    "kind, field, value",
    [("best_response", "steps", 5), ("k_step", "mix", 0.5), ("lag", "explore", 0.3)]
    + [("lag", "lr", 0.2), ("q_learning", "steps", 2)],
)
def test_follower_model_refuses_another_kinds_setting(kind, field, value):
    """``FollowerModel("k_step", mix=0.5)`` validated and trained a K-step follower that ignored
    ``mix`` (the CLI refused the same flag); a setting of another kind must stay at its default."""
    from bchg_jax.core.follower_model import SETTING_OF, FollowerModel

    with pytest.raises(ValueError, match=f"FollowerModel.{field} = {value} is a setting of kind"):
        FollowerModel(kind, **{field: value}).validate()
    with pytest.raises(ValueError, match=f"FollowerModel.{field}"):
        tabular.make_train(
            _cmdp(), "bchg", tabular.TrainConfig(follower=FollowerModel(kind, **{field: value}))
        )
    FollowerModel(SETTING_OF[field], **{field: value}).validate()  # its own kind takes it


def test_tabular_hypergradient_names_the_table_of_the_wrong_shape():
    # S and B come from the problem's transition table, so the array at fault is the one named
    # (a Q_L with a state too many used to blame follower.policy)
    good = tabular.hypergradient(_cmdp(), TH, BATCH, _follower(), R_TAB, 0.1)
    assert np.all(np.isfinite(np.asarray(good)))
    bad_q = jnp.zeros((S + 1, B))
    with pytest.raises(
        ValueError, match=rf"Q_L must have shape \({S}, {B}\).*got \({S + 1}, {B}\)"
    ):
        tabular.hypergradient(_cmdp(), TH, BATCH, _follower(), bad_q, 0.1)
    with pytest.raises(ValueError, match=rf"V_L must have shape \({S},\)"):
        tabular.hypergradient(_cmdp(), TH, BATCH, _follower(), R_TAB, 0.1, V_L=jnp.zeros(S + 1))
    short = _follower()._replace(V=jnp.zeros(S - 1))
    with pytest.raises(ValueError, match=r"follower.V must have shape"):
        tabular.hypergradient(_cmdp(), TH, BATCH, short, R_TAB, 0.1)


@pytest.mark.slow
def test_lq_exact_hypergradient_refuses_a_leader_objective_that_is_not_finite():
    """c(theta) = log(theta_0 - 1) at theta_0 = 0: leader_objective refused it, but the
    gradient of a NaN J has finite pieces (d/dtheta log(theta_0 - 1) = -1), and
    exact_hypergradient returned them without a word. Now it names c too, and is NaN traced."""
    p = _lq(leader_quadratic=lambda th: (jnp.eye(2), jnp.eye(1), jnp.log(th[0] - 1.0)))
    theta = jnp.zeros(1)
    for fn in (lq_family.leader_objective, lq_family.exact_hypergradient):
        with pytest.raises(ValueError, match="leader_quadratic\\(theta\\)'s c is not finite"):
            fn(p, theta, 0.5)
    traced = jax.jit(lambda th: lq_family.exact_hypergradient(p, th, 0.5))(theta)
    assert np.all(np.isnan(np.asarray(traced)))


def test_lq_constant_arrays_given_as_functions_of_theta_are_refused_by_name():
    """A Qbar that depends on theta (a function) raised a bare TypeError from np.asarray."""
    with pytest.raises(ValueError, match="Qbar must be an array.*A_fn, B_fn and leader_quad"):
        _lq(Qbar=lambda th: jnp.eye(2) * th[0])


def test_lqr_game_rollout_refuses_a_nan_theta():
    """lq.rollout refused a NaN theta by name; the game's rollout returned NaN states."""
    game, theta = lqr_game(), jnp.asarray(TH_LQR)
    resp = game_lqr.best_response(game, theta, 0.1)
    game_lqr.rollout(jax.random.key(0), game, theta, resp, 2, 5)
    with pytest.raises(ValueError, match="theta must be finite"):
        game_lqr.rollout(jax.random.key(0), game, theta.at[0].set(jnp.nan), resp, 2, 5)


@pytest.mark.parametrize("preset", ["fourrooms", "thermal", "toy_game", "random_tabular_cmdp"])
def test_presets_refuse_a_dtype_their_tables_cannot_hold(preset):
    """toy_game(R=2.5, dtype=int32) was a valid game paying R = 2 (bfloat16: R = 2.1 read
    2.09375); float64 without x64 built float32 tables for a user who asked for float64."""
    from bchg_jax import problems

    make = {
        "fourrooms": lambda dt: problems.fourrooms(dtype=dt),
        "thermal": lambda dt: problems.thermal(dtype=dt),
        "toy_game": lambda dt: problems.toy_game(2.5, dtype=dt),
        "random_tabular_cmdp": lambda dt: problems.random_tabular_cmdp(jax.random.key(0), dtype=dt),
    }[preset]
    for dt, shown in ((jnp.int32, "float dtype"), (jnp.bfloat16, "bfloat16"), ("x", "'x'")):
        with pytest.raises(ValueError, match=shown):
            make(dt)
    if not jax.config.jax_enable_x64:
        with pytest.raises(ValueError, match="jax_enable_x64"):
            make(jnp.float64)
    make(jnp.float32)


def test_random_tabular_presets_name_a_size_that_is_not_a_positive_integer():
    """num_states=-1 was an MLIRError from inside jax.random, 2.5 a TypeError about shapes,
    dim=0 a problem with an empty theta; the game's S=-1 numpy's 'negative dimensions'."""
    from bchg_jax import problems

    key = jax.random.key(0)
    for kw in ({"num_states": -1}, {"num_states": 2.5}, {"num_actions": 0}, {"dim": 0}):
        (name,) = kw
        with pytest.raises(ValueError, match=f"random_tabular_cmdp: {name} must be a positive"):
            problems.random_tabular_cmdp(key, **kw)
    for kw in ({"S": -1}, {"A": 0}, {"B": 1.5}):
        (name,) = kw
        with pytest.raises(ValueError, match=f"random_tabular_game: {name} must be a positive"):
            problems.random_tabular_game(**kw)
    assert problems.random_tabular_cmdp(key, num_states=1).validate().num_states == 1
    assert problems.random_tabular_game(S=1).num_states == 1


def test_integer_pieces_and_wrong_lq_shapes_are_named_not_failed_inside_jax():
    """From a new user's audit: an integer follower reward passed TabularCMDP.validate() and
    failed in soft_newton with "data type int32 not inexact"; an integer B(theta) such as
    [[0], [1]] passed LQConfigurableMDP.validate() and failed with "jacfwd requires real-valued
    inputs"; without validate(), an A(theta), Ms or c of the wrong shape failed inside JAX
    (dot_general / add / grad TypeErrors) in lq.best_response / leader_objective."""
    from bchg_jax import lq, tabular

    P = jax.nn.softmax(jnp.asarray(np.random.default_rng(0).normal(size=(5, 3, 5))), -1)
    cmdp = tabular.TabularCMDP(
        transition=lambda th: P,
        init_dist=lambda th: jnp.ones(5) / 5,
        follower_reward=lambda th: jnp.ones((5, 3), jnp.int32),
        leader_reward=lambda th: jnp.zeros((5, 3)) + th[0],
        gamma_F=0.9,
        gamma_L=0.9,
        theta0=jnp.array([0.1, 0.2]),
    )
    for call in (cmdp.validate, lambda: tabular.exact_hypergradient(cmdp, cmdp.theta0, 0.1)):
        with pytest.raises(ValueError, match=r"follower_reward\(theta\) has dtype int32"):
            call()

    def problem(A=None, B=None, Ms=None, c=0.0):
        return lq.LQConfigurableMDP(
            A_fn=lambda th: jnp.array([[1.0 + 0.1 * th[0], 0.2], [0.0, 0.95]]) if A is None else A,
            B_fn=lambda th: jnp.array([[0.5], [0.3]]) if B is None else B,
            U=0.3 * jnp.eye(2),
            Qbar=jnp.eye(2),
            Rbar=jnp.array([[0.5]]),
            leader_quadratic=lambda th: (jnp.eye(2) if Ms is None else Ms, jnp.eye(1), c),
            init_cov=jnp.eye(2),
            gamma_F=0.9,
            gamma_L=0.9,
            theta0=jnp.array([0.3]),
        )

    cases = [  # (pieces, the error, whether best_response reads them)
        (dict(B=jnp.array([[0], [1]])), r"B\(theta\) has dtype int", True),
        (dict(A=jnp.eye(3)), r"A\(theta\)", True),
        (dict(Ms=jnp.eye(3)), r"Ms must have shape \(2, 2\)", False),
        (dict(c=jnp.zeros(2)), r"c must have shape \(\)", False),
    ]
    for kw, says, dynamics in cases:
        p = problem(**kw)
        calls = [
            p.validate,
            lambda p=p: lq.leader_objective(p, p.theta0, 0.1),
            lambda p=p: lq.exact_hypergradient(p, p.theta0, 0.1),
        ]
        if dynamics:
            calls.append(lambda p=p: lq.best_response(p, p.theta0, 0.1))
        for call in calls:
            with pytest.raises(ValueError, match=says):
                call()
    # float pieces still work
    ok = problem(B=jnp.array([[0.0], [1.0]]))
    assert np.isfinite(float(lq.leader_objective(ok.validate(), ok.theta0, 0.1)))


@pytest.mark.slow
def test_check_problem_wants_a_list_of_thetas_and_exact_hypergradient_its_order():
    """One theta passed to a ``check_problem`` was iterated over its entries ("theta must be
    shaped like theta0 (2,), got ()"); ``games.tabular.exact_hypergradient`` called in its
    siblings' order (the game first) failed inside JAX ("Cannot determine dtype of
    <function>")."""
    from bchg_jax import lq, tabular
    from bchg_jax.games import lqr
    from bchg_jax.games import tabular as game_tabular
    from bchg_jax.problems import random_tabular_cmdp, random_tabular_game

    p = random_tabular_cmdp(jax.random.key(0), num_states=3, num_actions=2, dim=2)
    q = _lq()
    g = lqr_game()
    calls = {
        "tabular.check_problem": lambda t: tabular.check_problem(p, t, 0.5),
        "lq.check_problem": lambda t: lq.check_problem(q, t, 0.5),
        "games.lqr.check_problem": lambda t: lqr.check_problem(g, t, 0.5),
    }
    for where, call in calls.items():
        theta0 = jnp.zeros(2) if where == "games.lqr.check_problem" else p.theta0
        if where == "lq.check_problem":
            theta0 = q.theta0
        with pytest.raises(ValueError, match=rf"{where}: theta_list .* one theta.*\[theta\]"):
            call(theta0)
        with pytest.raises(ValueError, match=rf"{where}: theta_list is empty"):
            call([])
        with pytest.raises(ValueError, match=r"theta must be (shaped like theta0|finite with)"):
            call([jnp.zeros(theta0.size + 1), theta0])  # "inhomogeneous shape"
    game = random_tabular_game(seed=1, S=3, A=2, B=2)

    def policy_fn(theta):
        return jax.nn.softmax(theta, -1)

    with pytest.raises(ValueError, match="games.tabular.check_problem: theta_list is empty"):
        game_tabular.check_problem(game, policy_fn, [], 0.3, horizon=4)
    theta = jnp.zeros((3, 2))
    with pytest.raises(ValueError, match=r"takes \(policy_fn, theta, game, beta\).*TabularGame"):
        game_tabular.exact_hypergradient(game, policy_fn, theta, 0.3)
    assert game_tabular.exact_hypergradient(policy_fn, theta, game, 0.3).shape == (3, 2)


@pytest.mark.slow
def test_lq_shapes_the_audit_found_unchecked(x64):
    """A ``components`` term with Ms given as a vector passed validate() and made the metric
    wrong (4.72 for 5.36); ``validate(theta)`` took a theta shorter than theta0 (A read t[1] of
    a [1] theta as t[0]); the critic fitters took transposed [T, E] rewards (another H) and a
    wrong-shape ``P0`` failed as a bare TypeError; ``exact_hypergradient`` on dynamics that do
    not depend on theta blamed a "br.K" the caller never gave for a failed Riccati solve."""
    from bchg_jax import lq
    from bchg_jax.lq import critics

    f64 = jnp.float64
    quad = (jnp.eye(2, dtype=f64), jnp.eye(1, dtype=f64), jnp.zeros((), f64))
    ok = _lq(theta0=jnp.zeros(2, f64), leader_quadratic=lambda th: quad).validate()
    vector_ms = (jnp.ones(2, f64),) + quad[1:]
    with pytest.raises(ValueError, match=r"components\(theta\)\['state'\]'s Ms must have shape"):
        _lq(theta0=ok.theta0, components=lambda th: {"state": vector_ms}).validate()
    with pytest.raises(ValueError, match=r"theta must be shaped like theta0 \(2,\), got \(1,\)"):
        ok.validate(jnp.zeros(1, f64))
    rng = np.random.default_rng(0)
    s, b, r = rng.normal(size=(5, 41, 2)), rng.normal(size=(5, 41, 1)), rng.normal(size=(5, 40))
    critics.fit_quadratic_q(s, b, r, 0.9)
    for fit in (critics.fit_quadratic_q, critics.leave_one_out_quadratic_q):
        with pytest.raises(ValueError, match=r"r \(leader rewards\) must be \[5, 40\]"):
            fit(s, b, r.T, 0.9)
    for fit in (critics.fit_quadratic_vector_value, critics.leave_one_out_vector_value):
        with pytest.raises(ValueError, match=r"y .* must be \[5, 40, 'D'\]"):
            fit(s, r, 0.9)
    with pytest.raises(ValueError, match=r"P0 .* must have shape \(2, 2\)"):
        lq.best_response(ok, ok.theta0, 0.1, P0=jnp.eye(3, dtype=f64))
    stuck = _lq(  # (A, B) not stabilisable, and neither moves with theta
        A_fn=lambda th: jnp.diag(jnp.array([1.5, 0.5], th.dtype)),
        B_fn=lambda th: jnp.array([[0.0], [1.0]], th.dtype),
        theta0=jnp.zeros(1, f64),
    )
    for fn in (lq.leader_objective, lq.exact_hypergradient):
        with pytest.raises(ValueError, match="Riccati iteration did not converge"):
            fn(stuck, stuck.theta0, 0.1)
