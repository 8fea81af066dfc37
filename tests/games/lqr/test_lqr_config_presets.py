"""The LQR game trainer's settings: ``ActorConfig``'s cosine rate and checks, the validation of
every nested part, ``TrainConfig.iteration_limit`` and ``check_guide``, and the named presets
(``bchg_jax.games.lqr.presets``) against their module docstring: which methods are clipped and
the values each preset sets."""

import numpy as np
import pytest

from bchg_jax.games import lqr
from bchg_jax.games.lqr import presets
from bchg_jax.games.lqr.config import ActorConfig, EstimatorConfig, ExplorationConfig


def test_cosine_rate_is_zero_from_the_last_update_on():
    """The cosine rate is lr (1 + cos(pi min(c, n) / n)) / 2: lr at 0, lr/2 at n/2, 0 at n and
    past it (a longer run takes no step), and the constant schedule is lr."""
    rate = ActorConfig(lr=0.04, lr_schedule="cosine").learning_rate(10)
    got = [float(rate(c)) for c in (0, 5, 10, 13, 20)]
    np.testing.assert_allclose(got, [0.04, 0.02, 0.0, 0.0, 0.0], atol=1e-9)
    assert ActorConfig(lr=0.04).learning_rate(10) == 0.04


def test_bad_actor_and_estimator_fields_are_refused_by_validate():
    """TrainConfig.validate checks every nested part: a negative clip (which would silently
    switch clipping off) and an unknown estimator influence are refused by name."""
    with pytest.raises(ValueError, match="clip"):
        lqr.TrainConfig(actor=ActorConfig(clip=-1.0)).validate()
    with pytest.raises(ValueError, match="influence"):
        lqr.TrainConfig(estimator=EstimatorConfig(influence="bogus")).validate()
    with pytest.raises(ValueError, match="warmup_steps"):
        lqr.TrainConfig(exploration=ExplorationConfig(warmup_steps=-1)).validate()
    with pytest.raises(ValueError, match="follower_max_iters"):
        lqr.TrainConfig(follower_max_iters=0).validate()


def test_iteration_limit_and_check_guide():
    """A cosine rate limits a run to its iterations (an on-policy constant-rate run has no
    limit); the control variate needs >= 2 episodes per batch (1 is refused, 2 passes)."""
    cos = lqr.TrainConfig(iterations=7, actor=ActorConfig(lr_schedule="cosine"))
    assert cos.iteration_limit() == 7
    assert lqr.TrainConfig(iterations=7).iteration_limit() is None
    cv = EstimatorConfig(influence_cv=True)
    with pytest.raises(ValueError, match="episodes >= 2"):
        lqr.TrainConfig(episodes=1, estimator=cv).check_guide()
    lqr.TrainConfig(episodes=2, estimator=cv).check_guide()


def test_reference_clip_scope_clips_both_bchg_methods_only():
    """``"reference"`` clips BC-HG's gradient (bchg and bchg_det) and no other method's
    (config_for sets their clip to 0); ``"all"`` clips every method."""
    assert presets.clipped("bchg_det", "reference") and presets.clipped("bchg", "reference")
    assert not presets.clipped("naive", "reference") and not presets.clipped("exact", "reference")
    assert presets.clipped("naive_det", "all")
    ref = presets.reference()
    assert ref.config_for("bchg_det").actor.clip == 1.0
    assert ref.config_for("naive_det").actor.clip == 0.0
    assert ref.config_for("naive_det").critic == ref.config.critic
    assert presets.explore().config_for("exact").actor.clip == 1.0


def test_presets_match_their_docstring():
    """explore: 2 own + 6 behaviour episodes, replay 80, 20 critic steps, normalised inputs, 8
    TD samples, tau 0.2, 160,000 warm-up steps, unbiased estimator with the control variate,
    every method clipped, Adam 0.02 cosine, 2000 iterations. reference: TrainConfig's defaults
    (on-policy 4 x 100 = 400 steps, 4000 warm-up steps, 500 iterations), reference estimator,
    only BC-HG clipped, 10 actor and 5 critic steps (the CLI's defaults under --preset
    reference). Both validate."""
    e = presets.explore()
    c = e.config.validate()
    assert (c.iterations, c.episodes, c.exploration.episodes, c.critic.replay) == (2000, 2, 6, 80)
    assert (c.tau, c.critic.normalize, c.critic.target_samples) == (0.2, True, 8)
    assert (c.exploration.warmup_steps, c.actor.lr, c.actor.lr_schedule) == (160000, 0.02, "cosine")
    assert (c.estimator.direct_baseline, c.estimator.influence) == ("same_noise", "baseline")
    assert c.estimator.influence_cv and (e.estimator, e.clip_scope) == ("unbiased", "all")
    assert tuple(float(x) for x in e.hparams) == (1, 20, 0.1)
    r = presets.reference()
    rc = r.config.validate()
    assert rc == lqr.TrainConfig() and (r.estimator, r.clip_scope) == ("reference", "reference")
    assert (rc.buffer, rc.episodes * 100, rc.exploration.warmup_steps, rc.iterations) == (
        "on",
        400,
        4000,
        500,
    )
    assert tuple(float(x) for x in r.hparams) == (10, 5, 0.1)  # the CLI's --preset reference
    assert (rc.estimator.direct_baseline, rc.estimator.influence) == ("reference", "raw")
    assert presets.ESTIMATORS["unbiased"] == dict(
        direct_baseline="same_noise", influence="baseline"
    )
    assert presets.PRESETS["explore"]().config == c and presets.PRESETS["reference"]().config == rc
