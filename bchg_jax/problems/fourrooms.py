"""Four-Rooms configurable MDP (paper Sec. "Configurable MDPs (Discrete)", appendix "Four-Rooms").

104 free cells, 4 actions (0 up, 1 right, 2 down, 3 left), a move into a wall stays. The leader
places a penalty budget of -0.2 over the cells through a softmax of x in R^{105} (one logit per
cell plus one "ineffective" slot):

    penalty(s) = -0.2 softmax(x)[s]
    r_F(s, b) = 1{s = G} + penalty(s)            (no penalty at G)
    r_L(s, b) = 1{s = T} - lambda 1{s = G} sum_cells |penalty|,   lambda = 5

Both rewards follow the authors' code rather than the paper's formulas: no follower penalty at G
(the paper adds it there too), and the leader's cost counts each cell's penalty once (the paper's
sum over (s, b) counts it once per action; ``docs/experiments.md``, "Reward conventions").

G is terminal. Slip: the intended move happens with probability ``p_intended``, each of the three
other moves with ``(1 - p_intended) / 3``. ``slip_model="paper"`` uses 2/3 everywhere;
``slip_model="reference"`` reproduces the authors' code, whose follower model / exact evaluator use
0.56 while its sampler uses 2/3 (the setting behind the paper's figure).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from bchg_jax.core.validate import check_float_dtype
from bchg_jax.tabular.cmdp import TabularCMDP

LAYOUT = (
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
MOVES = ((-1, 0), (0, 1), (1, 0), (0, -1))
PAPER_P_INTENDED = 2.0 / 3.0
REFERENCE_MODEL_P_INTENDED = 0.56
SLIP_MODELS = ("paper", "reference")


def _cells(layout=LAYOUT):
    cells = [(r, c) for r, row in enumerate(layout) for c, ch in enumerate(row) if ch != "#"]
    index = {rc: i for i, rc in enumerate(cells)}
    marks = {
        ch: index[(r, c)]
        for r, row in enumerate(layout)
        for c, ch in enumerate(row)
        if ch not in "#."
    }
    return cells, index, marks


def slip_transition(p_intended: float, layout=LAYOUT) -> np.ndarray:
    """[S, 4, S] transition table of the slippery grid (numpy, theta-independent).

    Args:
      p_intended: probability of the intended move (each other move: (1 - p_intended) / 3).
      layout: the grid as strings ('#' wall); S = number of non-wall cells.
    Returns:
      [S, 4, S] float64 p(s'|s, b) (a move into a wall stays).
    """
    cells, index, _ = _cells(layout)
    S = len(cells)
    dest = np.zeros((S, 4), dtype=np.int64)
    for i, (r, c) in enumerate(cells):
        for a, (dr, dc) in enumerate(MOVES):
            dest[i, a] = index.get((r + dr, c + dc), i)
    p_other = (1.0 - p_intended) / 3.0
    P = np.zeros((S, 4, S))
    for i in range(S):
        for b in range(4):
            for a in range(4):
                P[i, b, dest[i, a]] += p_intended if a == b else p_other
    return P


def fourrooms(
    slip_model: str = "reference",
    penalty_budget: float = 0.2,
    lam: float = 5.0,
    gamma: float = 0.99,
    time_limit: int = 200,
    dtype=jnp.float32,
) -> TabularCMDP:
    """Builds the Four-Rooms :class:`TabularCMDP` (theta = x, 105 logits, theta0 = zeros).

    The task of Section "Configurable MDPs (Discrete)" (Figure "Four-Rooms Environment") and the
    appendix "Four-Rooms Environment", trained by Algorithm 8. Only the rewards depend on theta.

    Args:
      slip_model: ``"reference"`` (model 0.56, sampler 2/3) or ``"paper"`` (2/3 for both).
      penalty_budget: total penalty 0.2 distributed by the softmax (>= 0).
      lam: weight lambda of the leader's penalty cost at the goal (>= 0).
      gamma: discount of both players (gamma_F = gamma_L).
      time_limit: episode length of the sampler.
      dtype: float dtype of the tables and of theta.
    Returns:
      :class:`TabularCMDP` with S = 104 states, B = 4 actions, theta0 [105] zeros, start cell
      'S' (rho_0 one-hot), terminal goal 'G'.
    Raises:
      ValueError: an unknown ``slip_model``, a ``penalty_budget`` / ``lam`` that is not a
        finite number >= 0, or a ``dtype`` that is not float32 (or float64 with
        ``jax_enable_x64``).
    """
    check_float_dtype("fourrooms: dtype", dtype)
    if slip_model not in SLIP_MODELS:
        raise ValueError(f"slip_model must be one of {SLIP_MODELS}, got {slip_model!r}")
    for name, value in (("penalty_budget", penalty_budget), ("lam", lam)):
        v = np.asarray(value)
        if v.ndim != 0 or not np.issubdtype(v.dtype, np.number) or not 0 <= float(v) < np.inf:
            raise ValueError(f"fourrooms: {name} must be a finite number >= 0, got {value!r}")
    cells, _, marks = _cells()
    S, start, goal, target = len(cells), marks["S"], marks["G"], marks["T"]
    sampler = jnp.asarray(slip_transition(PAPER_P_INTENDED), dtype)
    model = (
        sampler
        if slip_model == "paper"
        else jnp.asarray(slip_transition(REFERENCE_MODEL_P_INTENDED), dtype)
    )
    is_goal = jnp.zeros((S,), dtype).at[goal].set(1.0)
    is_target = jnp.zeros((S,), dtype).at[target].set(1.0)
    rho = jnp.zeros((S,), dtype).at[start].set(1.0)

    def penalty(x):
        return -penalty_budget * jax.nn.softmax(x)[:S]

    def follower_reward(x):
        r = is_goal + penalty(x) * (1.0 - is_goal)
        return jnp.broadcast_to(r[:, None], (S, 4))

    def leader_reward(x):
        r = is_target - lam * is_goal * jnp.sum(jnp.abs(penalty(x)))
        return jnp.broadcast_to(r[:, None], (S, 4))

    terminal = np.zeros((S,), dtype=bool)
    terminal[goal] = True
    return TabularCMDP(
        transition=lambda x: model,
        init_dist=lambda x: rho,
        follower_reward=follower_reward,
        leader_reward=leader_reward,
        gamma_F=gamma,
        gamma_L=gamma,
        theta0=jnp.zeros((S + 1,), dtype),
        terminal=terminal,
        sample_transition=(None if slip_model == "paper" else (lambda x: sampler)),
        time_limit=time_limit,
        name=f"fourrooms[{slip_model}]",
    )


def fourrooms_cells():
    """(cells, marks): the (row, col) of each state index and the indices of 'S', 'G', 'T'.

    Returns:
      (cells, marks): list of S (row, col) tuples, and dict mark -> state index.
    """
    cells, _, marks = _cells()
    return cells, marks
