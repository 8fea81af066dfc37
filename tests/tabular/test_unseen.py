"""A probability that is 0 at theta but moves with it (a kink of the model: a clip at its bound)
carries a part of the exact hypergradient that no sampled estimate sees. ``check_problem``
reported that part as the time limit's cut (``cut_bias`` 0.25 where the discount weight beyond
the cut was 0.037), ``truncated_hypergradient``'s docstring said it tends to the exact
hypergradient as the cut grows."""

import warnings

import jax
import jax.numpy as jnp
import numpy as np

from bchg_jax import tabular
from bchg_jax.tabular import TabularCMDP, TrainConfig

S, B = 4, 2


def _transition(th):
    """State 0 moves to 1 or 2 (theta_0); from state 1 action 1 reaches state 2 with q =
    clip(theta_1, 0, 0.9) and the terminal state 3 otherwise: at theta_1 = 0 the entry is 0 and
    moves with theta (JAX's derivative of clip at its bound: 1/2)."""
    eye = jnp.eye(S, dtype=th.dtype)
    p = jax.nn.sigmoid(th[0])
    q = jnp.clip(th[1], 0.0, 0.9)
    rows = [
        jnp.stack([p * eye[1] + (1 - p) * eye[2], 0.5 * eye[1] + 0.5 * eye[2]]),
        jnp.stack([0.7 * eye[2] + 0.3 * eye[3], (1 - q) * eye[3] + q * eye[2]]),
        jnp.stack([0.5 * eye[0] + 0.5 * eye[3], 0.2 * eye[1] + 0.8 * eye[3]]),
        jnp.stack([eye[3], eye[3]]),
    ]
    return jnp.stack(rows)


def _problem(theta0, dtype=jnp.float64):
    reward_F = jnp.asarray([[0.0, 0.3], [0.1, 0.5], [0.2, 0.0], [0.0, 0.0]], dtype)
    reward_L = jnp.asarray([[0.0, 0.0], [0.2, 1.0], [0.5, 0.0], [0.0, 0.0]], dtype)
    return TabularCMDP(
        transition=_transition,
        init_dist=lambda th: jnp.asarray([1.0, 0.0, 0.0, 0.0], th.dtype),
        follower_reward=lambda th: reward_F + th[2] * jnp.eye(S, B, dtype=th.dtype),
        leader_reward=lambda th: reward_L,
        gamma_F=0.9,
        gamma_L=0.9,
        theta0=jnp.asarray(theta0, dtype),
        terminal=np.array([False, False, False, True]),
        name="kinked",
    ).validate()


def test_the_unseen_part_is_the_kinks_and_the_truncated_target_tends_to_the_rest(x64):
    at_kink = _problem([0.3, 0.0, 0.1])
    theta = at_kink.theta0
    exact = tabular.exact_hypergradient(at_kink, theta, 0.5)
    unseen = tabular.unseen_hypergradient(at_kink, theta, 0.5)
    visible = tabular.exact_hypergradient(tabular.score_visible(at_kink), theta, 0.5)
    np.testing.assert_allclose(exact - visible, unseen, atol=1e-12)
    assert abs(float(unseen[1])) > 0.05 and np.abs(np.asarray(unseen)[[0, 2]]).max() < 1e-12
    # a long cut reaches the visible part, not the exact gradient (the docstring's old claim)
    far = tabular.truncated_hypergradient(at_kink, theta, 0.5, 2000)
    np.testing.assert_allclose(far, visible, atol=1e-9)
    assert float(jnp.max(jnp.abs(far - exact))) > 0.05
    # the same tables at every theta
    seen = tabular.score_visible(at_kink)
    for t in (theta, theta + 0.2):
        np.testing.assert_array_equal(seen.transition(t), at_kink.transition(t))
    # off the kink nothing is lost, on either side
    for side in (-0.1, 0.1):
        off = theta.at[1].set(side)
        assert float(jnp.max(jnp.abs(tabular.unseen_hypergradient(at_kink, off, 0.5)))) < 1e-12


def test_check_problem_tells_the_unseen_part_from_the_cut(x64):
    """At the kink BC-HG's unbiased form is off the exact gradient but on the visible target;
    episodes end at the terminal state (short), so the cut's share is ~0, not the gap.
    Measured (float64, 300 batches): unseen_share 0.77, cut_bias 6e-16, 342 SE from the exact
    gradient and 1.7 SE from visible_target."""
    at_kink = _problem([0.3, 0.0, 0.1])
    config = TrainConfig(
        num_envs=16, num_steps=60, grouping="first_episode", partial="first_episode"
    )
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        (row,) = tabular.check_problem(
            at_kink, [at_kink.theta0], 0.5, config=config, batches=300, verbose=False
        )
    text = [str(x.message) for x in w]
    assert any("unseen_share" in t and "not the cut's" in t for t in text)
    assert row["unseen_share"] > 0.05 and row["cut_bias"] < 1e-3
    assert row["bias_se"] > 5.0  # against the exact gradient
    visible = tabular.exact_hypergradient(tabular.score_visible(at_kink), at_kink.theta0, 0.5)
    np.testing.assert_allclose(row["visible_target"], visible, atol=1e-12)
    z = (row["mean"] - row["visible_target"]) / row["se"]
    assert np.abs(z).max() < 4.0, z
