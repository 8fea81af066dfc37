"""The Four-Rooms problem's facts pinned one by one: the paper's 13 x 13 grid written out cell by
cell (free cells in row-major order, S 31 at (4, 1), G 7 at (1, 9), T 66 at (8, 4)); each action's
direction (0 up, 1 right, 2 down, 3 left: relabelling two actions leaves every value the same,
so no start-value test sees it) in the model and the sampler; the 200-step time limit."""

import numpy as np
import pytest

from bchg_jax.problems import fourrooms
from bchg_jax.problems.fourrooms import fourrooms_cells

PAPER_GRID = (  # the paper's Four-Rooms figure ('#' wall)
    "#############",
    "#.....#..G..#",
    "#.....#.....#",
    "#...........#",
    "#S....#.....#",
    "#.....#.....#",
    "##.####.....#",
    "#.....###.###",
    "#...T.#.....#",
    "#.....#.....#",
    "#...........#",
    "#.....#.....#",
    "#############",
)


def test_free_cells_are_exactly_the_papers_grid():
    want = [(r, c) for r, row in enumerate(PAPER_GRID) for c, ch in enumerate(row) if ch != "#"]
    cells, marks = fourrooms_cells()
    assert len(want) == 104
    assert list(cells) == want
    assert marks == {"S": 31, "G": 7, "T": 66}


@pytest.mark.parametrize("slip_model", ["paper", "reference"])
def test_each_action_moves_in_its_documented_direction(slip_model):
    prob = fourrooms(slip_model)
    cells, _ = fourrooms_cells()
    idx = {rc: i for i, rc in enumerate(cells)}
    centre = idx[(9, 3)]  # open cell, four free neighbours
    moves = {0: (-1, 0), 1: (0, 1), 2: (1, 0), 3: (0, -1)}  # the paper's action numbering
    # the paper's slip: intended move 2/3; the reference code's follower model: 0.56
    p_model = 2 / 3 if slip_model == "paper" else 0.56
    model = np.asarray(prob.transition(prob.theta0), np.float64)
    sampler = np.asarray(prob.sampler_transition(prob.theta0), np.float64)
    for b, (dr, dc) in moves.items():
        dest = idx[(9 + dr, 3 + dc)]
        assert model[centre, b, dest] == pytest.approx(p_model, abs=1e-6), b
        assert sampler[centre, b, dest] == pytest.approx(2 / 3, abs=1e-6), b
        assert int(np.argmax(model[centre, b])) == dest


def test_fourrooms_episode_time_limit_is_200():
    for slip_model in ("paper", "reference"):
        assert fourrooms(slip_model).time_limit == 200  # the reference's episode time limit
