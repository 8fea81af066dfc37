"""bchg_jax.core.follower_model's shared pieces against hand-computed values: FollowerModel's
validation boundaries and labels, the lag / exploration mixtures, sequential soft Q-learning
(terminal steps not bootstrapped) and the agreement metrics (0, not NaN, for a zero vector)."""

import dataclasses

import jax.numpy as jnp
import numpy as np
import pytest

from bchg_jax.core.follower_model import (
    MAX_STEPS,
    FollowerModel,
    FollowerSettings,
    agreement,
    explore_mix,
    lag_mix,
    mix_in_range,
    soft_q_learning,
)


def test_follower_model_validate_boundaries():
    """The documented ranges' ends: explore in [0, 1] (1 accepted), steps up to MAX_STEPS
    (itself accepted), mix in (0, 1], and another kind's setting off its default refused."""
    FollowerModel("q_learning", explore=1.0).validate()
    FollowerModel("q_learning", explore=0.0, lr=1.0).validate()
    FollowerModel("k_step", steps=MAX_STEPS).validate()
    FollowerModel("lag", mix=1.0).validate()
    with pytest.raises(ValueError, match="FollowerModel.steps"):
        FollowerModel("k_step", steps=MAX_STEPS + 1).validate()
    with pytest.raises(ValueError, match="FollowerModel.explore"):
        FollowerModel("q_learning", explore=-0.01).validate()
    with pytest.raises(ValueError, match="FollowerModel.explore"):
        FollowerModel("q_learning", explore=1.01).validate()
    for model, field in (
        (FollowerModel("k_step", mix=0.5), "mix"),
        (FollowerModel("lag", steps=3), "steps"),
        (FollowerModel("best_response", lr=0.2), "lr"),
        (FollowerModel("lag", explore=0.1), "explore"),
    ):
        with pytest.raises(ValueError, match=f"FollowerModel.{field} = "):
            model.validate()


def test_follower_model_defaults_and_labels():
    """The documented defaults and the label of each kind (its own setting in the name)."""
    d = FollowerModel()
    assert (d.kind, d.steps, d.mix, d.lr, d.explore) == ("best_response", 1, 0.1, 0.1, 0.0)
    assert d.best_response and not FollowerModel("lag").best_response
    assert FollowerModel("k_step", steps=3).label == "k_step3"
    assert FollowerModel("lag", mix=0.25).label == "lag0.25"
    assert FollowerModel("q_learning", lr=0.5).label == "q_learning0.5"
    assert FollowerModel("q_learning", lr=0.5, explore=0.2).label == "q_learning0.5_eps0.2"
    assert d.label == "best_response"


def test_follower_settings_checks_the_familys_kinds():
    """A family that restricts FOLLOWER_KINDS refuses the others; track_reference must be a
    bool (an int 1 is refused)."""

    @dataclasses.dataclass(frozen=True)
    class Narrow(FollowerSettings):
        FOLLOWER_KINDS = ("best_response", "k_step")

    Narrow(FollowerModel("k_step", steps=2)).check_follower()
    with pytest.raises(ValueError, match="this family simulates"):
        Narrow(FollowerModel("lag", mix=0.5)).check_follower()
    with pytest.raises(ValueError, match="track_reference"):
        FollowerSettings(track_reference=1).check_follower()
    FollowerSettings(track_reference=np.bool_(True)).check_follower()


def test_lag_and_explore_mixtures(x64):
    """lag_mix = (1 - mix) previous + mix best; explore_mix adds explore / B over the LAST axis
    (B actions, here with more states than actions); mix_in_range is 0 < mix <= 1."""
    prev = jnp.asarray([[0.2, 0.8], [1.0, 0.0], [0.5, 0.5]])
    best = jnp.asarray([[1.0, 0.0], [0.0, 1.0], [0.3, 0.7]])
    np.testing.assert_allclose(lag_mix(prev, best, 0.25), 0.75 * prev + 0.25 * best, rtol=1e-15)
    pol = jnp.asarray([[0.2, 0.3, 0.5], [1.0, 0.0, 0.0], [0.0, 0.0, 1.0], [0.4, 0.4, 0.2]])
    got = explore_mix(pol, 0.3)
    np.testing.assert_allclose(got, 0.7 * np.asarray(pol) + 0.1, rtol=1e-14)
    np.testing.assert_allclose(np.asarray(got).sum(-1), 1.0, rtol=1e-14)
    assert [bool(mix_in_range(m)) for m in (0.0, 1e-9, 0.5, 1.0, 1.0 + 1e-9, -0.5)] == [
        False,
        True,
        True,
        True,
        False,
        False,
    ]


def test_soft_q_learning_sequential_and_terminal(x64):
    """Three steps on a 3-entry table, each reading the table the previous left: the second
    step revisits entry 0; the third's next state is terminal (cont 0: no bootstrap)."""
    Q0 = jnp.asarray([1.0, 2.0, -1.0])
    index = jnp.asarray([0, 0, 2])
    reward = jnp.asarray([0.5, 1.0, 2.0])
    cont = jnp.asarray([1.0, 1.0, 0.0])
    lr, gamma = 0.5, 0.9
    nv = lambda Q, j: Q[1] + Q[2]  # noqa: E731  (a next value that reads the table)
    got = soft_q_learning(Q0, index, reward, nv, cont, lr, gamma)
    q = [1.0, 2.0, -1.0]
    for j in range(3):
        target = float(reward[j]) + gamma * float(cont[j]) * (q[1] + q[2])
        q[int(index[j])] += lr * (target - q[int(index[j])])
    np.testing.assert_allclose(got, q, rtol=1e-14)
    assert q[2] == -1.0 + 0.5 * (2.0 + 1.0)  # the terminal step's target is its reward


def test_agreement_cosine_projection_and_zero(x64):
    """cos = <e, r> / (|e| |r|), proj = <e, r> / |r|^2 over pytrees; a zero estimate or
    reference gives 0, not NaN; no reference gives NaN."""
    e = {"a": jnp.asarray([1.0, 2.0]), "b": jnp.asarray([[2.0]])}
    r = {"a": jnp.asarray([2.0, 0.0]), "b": jnp.asarray([[1.0]])}
    got = agreement(e, r, "x")
    ev, rv = np.array([1.0, 2.0, 2.0]), np.array([2.0, 0.0, 1.0])
    np.testing.assert_allclose(got["cos_x"], ev @ rv / 3.0 / np.sqrt(5.0), rtol=1e-14)
    np.testing.assert_allclose(got["proj_x"], ev @ rv / 5.0, rtol=1e-14)
    zero = agreement(jnp.zeros(3), jnp.asarray([1.0, 2.0, 3.0]), "z")
    assert float(zero["cos_z"]) == 0.0 and float(zero["proj_z"]) == 0.0
    zref = agreement(jnp.asarray([1.0, 2.0, 3.0]), jnp.zeros(3), "z")
    assert float(zref["cos_z"]) == 0.0 and float(zref["proj_z"]) == 0.0
    none = agreement(jnp.ones(2), None, "n")
    assert np.isnan(none["cos_n"]) and np.isnan(none["proj_n"])
