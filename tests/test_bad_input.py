"""Bad input gets a clear error before anything compiles, and nothing already written is lost.

Library entry points raise ``ValueError`` naming the problem; the experiment CLIs exit with
status 2 and an ``error: ...`` line. Every check here runs on the host before a training
program is traced.
"""
import hashlib
import importlib
import os

import jax.numpy as jnp
import numpy as np
import pytest

from bchg_jax.lq.cmdp import LQConfigurableMDP
from bchg_jax.problems.lqr_game import lqr_game
from bchg_jax.tabular.cmdp import TabularCMDP
from bchg_jax.games.tabular.game import TabularGame
from bchg_jax.core.sweep import product_grid

S, B = 3, 2


def _cmdp(**over):
    kw = dict(transition=lambda th: jnp.full((S, B, S), 1.0 / S),
              init_dist=lambda th: jnp.full(S, 1.0 / S),
              follower_reward=lambda th: jnp.zeros((S, B)) + th[0],
              leader_reward=lambda th: jnp.ones((S, B)),
              gamma_F=0.9, gamma_L=0.9, theta0=jnp.zeros(1))
    kw.update(over)
    return TabularCMDP(**kw)


def _lq(**over):
    kw = dict(A_fn=lambda th: jnp.eye(2) * 0.5, B_fn=lambda th: jnp.ones((2, 1)),
              U=np.eye(2) * 0.1, Qbar=np.eye(2), Rbar=np.eye(1),
              leader_quadratic=lambda th: (jnp.eye(2), jnp.eye(1), jnp.zeros(())),
              init_cov=np.eye(2), gamma_F=0.9, gamma_L=0.9, theta0=jnp.zeros(1))
    kw.update(over)
    return LQConfigurableMDP(**kw)


# ---- problems --------------------------------------------------------------------------------
@pytest.mark.parametrize("make, match", [
    (lambda: _cmdp(transition=lambda th: jnp.full((S, B, S + 1), 1.0 / (S + 1))), "shape"),
    (lambda: _cmdp(leader_reward=lambda th: jnp.ones((S, B + 1))), "shape"),
    (lambda: _lq(Qbar=np.eye(3)), "Qbar"),
    (lambda: _lq(B_fn=lambda th: jnp.ones((3, 1))), r"B\(theta\)"),
    (lambda: lqr_game(C=np.zeros((3, 1))), "shape"),
    (lambda: lqr_game(s0=np.zeros(3)), "s0"),
])
def test_wrong_shapes(make, match):
    with pytest.raises(ValueError, match=match):
        make().validate()


@pytest.mark.parametrize("make", [
    lambda: _cmdp(gamma_F=1.0), lambda: _cmdp(gamma_L=1.5), lambda: _lq(gamma_F=1.0),
    lambda: lqr_game(gamma_L=1.0),
])
def test_discount_not_below_one(make):
    with pytest.raises(ValueError, match="gamma"):
        make().validate()


def test_non_stochastic_transition_rows():
    with pytest.raises(ValueError, match="sum"):
        _cmdp(transition=lambda th: jnp.full((S, B, S), 0.3)).validate()
    with pytest.raises(ValueError, match="probab"):
        _cmdp(init_dist=lambda th: jnp.array([0.5, 0.6, -0.1])).validate()
    game = TabularGame(transition=np.full((S, 2, B, S), 0.3), init_dist=np.full(S, 1.0 / S),
                       follower_reward=np.zeros((S, 2, B)), leader_reward=np.zeros((S, 2, B)),
                       gamma_F=0.9, gamma_L=0.9)
    with pytest.raises(ValueError, match="sum|probab"):
        game.validate()


def test_unstabilisable_lqr_pairs():
    # an unstable mode (eigenvalue 2) that the follower's input cannot reach
    bad = _lq(A_fn=lambda th: jnp.diag(jnp.array([2.0, 0.5])),
              B_fn=lambda th: jnp.array([[0.0], [1.0]]))
    with pytest.raises(ValueError, match="stabilisable"):
        bad.validate()
    with pytest.raises(ValueError, match="stabilisable"):
        lqr_game().validate(theta=np.array([-20.0, -10.0]))


# ---- hyperparameters, grids and methods ------------------------------------------------------
def test_negative_beta():
    from bchg_jax.games import lqr, tabular as game
    from bchg_jax import tabular
    for make in (lambda: tabular.HParams(0.1, 0.5, beta=-1e-3).validate(),
                 lambda: game.HParams(1, 1, beta=-0.05).validate(),
                 lambda: lqr.HParams(1, 5, beta=0.0).validate()):
        with pytest.raises(ValueError, match="beta"):
            make()


def test_empty_grids():
    with pytest.raises(ValueError, match="empty"):
        product_grid(lr=[], beta=[1e-3])
    from bchg_jax.tabular import HParams
    with pytest.raises(ValueError, match="lr"):
        HParams(np.array([]), 0.5, 1e-3).validate()


def test_unknown_methods():
    from bchg_jax.problems.toy_game import toy_game
    from bchg_jax.tabular.train import make_train
    from bchg_jax.games.tabular.train import make_train as make_train_game
    from bchg_jax.lq.train import make_train as make_train_lq
    from bchg_jax.games.lqr.train import make_train as make_train_lqr_game
    for make in (lambda: make_train(_cmdp(), "hpgd"), lambda: make_train_lq(_lq(), "sobirl"),
                 lambda: make_train_game(toy_game(), "bchg_det"),
                 lambda: make_train_lqr_game(lqr_game(), "biac")):
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


@pytest.mark.parametrize("module, argv, match", [
    ("fourrooms", ["--method", "hpgd"], "method"),
    ("fourrooms", ["--beta", "-0.001"], "beta"),
    ("thermal", ["--method", "bogus"], "method"),
    ("toy_game", ["--beta", "0"], "beta"),
    ("lqr_game", ["--method", "biac_on"], "method"),
    ("lqr_game", ["--beta", "-1"], "beta"),
])
def test_cli_bad_arguments(module, argv, match, tmp_path, capsys):
    err = _cli_error(module, ["--smoke", *argv, "--out", str(tmp_path / "r")], capsys)
    assert match in err
    assert not os.path.exists(tmp_path / "r")          # nothing created for a refused run


@pytest.mark.parametrize("module", ["fourrooms", "thermal", "toy_game", "lqr_game"])
def test_cli_unwritable_output(module, tmp_path, capsys):
    blocker = tmp_path / "a_file"
    blocker.write_text("not a folder")
    err = _cli_error(module, ["--smoke", "--out", str(blocker / "run"), "--exact-out"], capsys)
    assert "cannot write" in err
    assert blocker.read_text() == "not a folder"


def _digest(folder):
    h = {}
    for root, _, files in os.walk(folder):
        for f in files:
            p = os.path.join(root, f)
            h[os.path.relpath(p, folder)] = hashlib.sha256(open(p, "rb").read()).hexdigest()
    return h


def test_existing_results_are_never_lost(tmp_path, capsys):
    """A finished run folder survives a rerun with bad arguments, a rerun with other settings,
    and a resume of the complete run, byte for byte."""
    mod = importlib.import_module("experiments.toy_game")
    run = mod.main(["--smoke", "--method", "naive_on", "--out", str(tmp_path / "r"), "--exact-out"])
    before = _digest(run)
    _cli_error("toy_game", ["--smoke", "--beta", "-1", "--out", run, "--exact-out"], capsys)
    _cli_error("toy_game", ["--smoke", "--method", "naive_on", "--R", "1", "--out", run,
                            "--exact-out"], capsys)
    assert _digest(run) == before
    mod.main(["--resume", run])                     # complete: skipped, files unchanged
    after = _digest(run)
    assert {k: v for k, v in after.items() if k != "config.json"} == \
        {k: v for k, v in before.items() if k != "config.json"}
