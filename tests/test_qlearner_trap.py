"""benchmarks/qlearner_trap.py: the study's plumbing on a few iterations, and its hard-max control
against the library's soft Q-learning step."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from bchg_jax.problems.fourrooms import fourrooms
from bchg_jax.tabular.follower_models import q_learning_update
from bchg_jax.tabular.rollout import rollout
from benchmarks import qlearner_trap


def test_hard_target_is_the_soft_one_as_beta_vanishes():
    """The control's update equals soft Q-learning in the limit beta -> 0 (logsumexp -> max):
    the only difference between them is the entropy bonus."""
    problem = fourrooms("reference")
    theta = problem.theta0
    S, B = 104, 4
    Q = jax.random.normal(jax.random.key(0), (S, B)) * 0.1
    policy = jnp.full((S, B), 1.0 / B)
    batch = rollout(
        jax.random.key(1),
        policy,
        problem.sampler_transition(theta),
        problem.init_dist(theta),
        jnp.asarray(problem.terminal),
        problem.time_limit,
        1,
        100,
    )
    r = problem.follower_reward(theta)
    hard = qlearner_trap.hard_q_learning_update(Q, batch, r, problem.gamma_F, 0.5)
    soft = q_learning_update(Q, batch, r, 1e-6, problem.gamma_F, 0.5)
    bonus = q_learning_update(Q, batch, r, 1e-3, problem.gamma_F, 0.5)
    np.testing.assert_allclose(hard, soft, atol=1e-5)
    assert float(jnp.max(bonus - hard)) > 1e-4  # beta 1e-3: the bonus shows


@pytest.mark.slow
def test_script_writes_its_table(tmp_path):
    qlearner_trap.main(
        ["--seeds", "2", "--early", "10", "--iterations", "20", "--batches", "500"]
        + ["--out", str(tmp_path)]
    )
    table = (tmp_path / "table.md").read_text()
    rows = [line for line in table.splitlines() if line.startswith("| ") and "---" not in line]
    assert len(rows) == 6  # the header and the five lone learners
    assert "best responder at the leader's theta" in table
    with pytest.raises(SystemExit):
        qlearner_trap.main(["--iterations", "25", "--early", "10"])
