"""Four-Rooms layout, slip model and rewards (docs/experiments.md)."""

import jax
import numpy as np
import pytest

from bchg_jax.problems import fourrooms
from bchg_jax.problems.fourrooms import fourrooms_cells


def test_layout_has_104_states_and_marked_cells():
    cells, marks = fourrooms_cells()
    assert len(cells) == 104
    assert marks == {"S": 31, "G": 7, "T": 66}
    assert cells[31] == (4, 1) and cells[7] == (1, 9) and cells[66] == (8, 4)
    for door in ((3, 6), (6, 2), (7, 9), (10, 6)):
        assert door in cells


def test_paper_slip_probabilities_and_rows():
    prob = fourrooms("paper")
    P = np.asarray(prob.transition(prob.theta0), np.float64)
    assert P.shape == (104, 4, 104)
    np.testing.assert_allclose(P.sum(-1), 1.0, atol=1e-6)
    cells, _ = fourrooms_cells()
    centre = cells.index((9, 3))  # an open cell with four free neighbours
    idx = {rc: i for i, rc in enumerate(cells)}
    up, right, down, left = idx[(8, 3)], idx[(9, 4)], idx[(10, 3)], idx[(9, 2)]
    np.testing.assert_allclose(
        P[centre, 0, [up, right, down, left]], [2 / 3, 1 / 9, 1 / 9, 1 / 9], atol=1e-6
    )
    # a move into a wall stays: (1,1) going up or left stays in place with 2/3 + 1/9
    corner = idx[(1, 1)]
    np.testing.assert_allclose(P[corner, 0, corner], 2 / 3 + 1 / 9, atol=1e-6)


def test_reference_slip_model_differs_only_in_the_follower_model():
    prob = fourrooms("reference")
    model = np.asarray(prob.transition(prob.theta0))
    sampler = np.asarray(prob.sampler_transition(prob.theta0))
    cells, _ = fourrooms_cells()
    c = cells.index((9, 3))
    assert model[c, 0].max() == pytest.approx(0.56, abs=1e-6)
    assert sampler[c, 0].max() == pytest.approx(2 / 3, abs=1e-6)
    np.testing.assert_allclose(model.sum(-1), 1.0, atol=1e-6)


def test_rewards_budget_and_goal():
    prob = fourrooms()
    x = jax.random.normal(jax.random.key(0), (105,))
    rF, rL = np.asarray(prob.follower_reward(x)), np.asarray(prob.leader_reward(x))
    pen = -0.2 * np.asarray(jax.nn.softmax(x))[:104]
    assert rF[7, 0] == pytest.approx(1.0)  # no penalty at G
    np.testing.assert_allclose(rF[31], pen[31], rtol=1e-5)  # state-only reward
    assert rL[66, 2] == pytest.approx(1.0)
    assert rL[7, 1] == pytest.approx(-5.0 * np.abs(pen).sum(), rel=1e-5)
    assert np.abs(pen).sum() < 0.2
    assert prob.terminal_mask[7] and int(prob.terminal_mask.sum()) == 1


def test_reward_conventions_that_depart_from_the_paper_are_documented():
    """The paper's r_L sums |penalty| over (s, a), 4 times the code's per-cell cost (V_L(S) at
    the start -2.965 instead of -0.7406 at beta 1e-3), and its r_F penalises G too: both follow
    the reference code, which the docs must say (they gave the formulas as if the paper's)."""
    import importlib
    import os

    # the module itself: the package's attribute of that name is the function
    module = importlib.import_module("bchg_jax.problems.fourrooms")
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    with open(os.path.join(root, "docs", "experiments.md")) as f:
        docs = " ".join(f.read().split())
    assert "*Reward conventions.*" in docs
    assert "no penalty at G (the paper's" in docs and "once per action, 4 times" in docs
    text = " ".join(module.__doc__.split())
    assert "no follower penalty at G (the paper adds it there too)" in text
    assert "counts it once per action" in text


def test_bad_options_raise():
    with pytest.raises(ValueError, match="slip_model"):
        fourrooms("sticky")
    # an array was numpy's "truth value ... ambiguous"; NaN reached the tables
    for kw in ({"penalty_budget": np.array([0.1, 0.2])}, {"lam": float("nan")}, {"lam": -1.0}):
        (name,) = kw
        with pytest.raises(ValueError, match=f"fourrooms: {name} must be a finite number >= 0"):
            fourrooms(**kw)
