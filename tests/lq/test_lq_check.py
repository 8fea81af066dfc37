"""``lq.check_problem``: the trainer's own estimate step against the exact hypergradient on a
user's problem. It passes the unbiased forms and flags the biased ones, by the numbers the
library documents (docs/experiments.md, section 2: HPGD (MC)'s bias and the in-sample
critic's)."""

import dataclasses

import jax.numpy as jnp
import numpy as np
import pytest

from bchg_jax import lq
from bchg_jax.lq.train import TrainConfig

THETA = [jnp.array([0.3, -0.2])]


@pytest.mark.slow
def test_unbiased_bchg_passes_and_naive_pgd_is_flagged(random_lq, capsys):
    """1000 batches of 4 episodes (float32): BC-HG with the default cross-fitted critic and with
    the exact critic within 4 SE; Naive-PGD (no guiding term) ~7% off, > 8 SE."""
    p = random_lq(jnp.float32)
    cfg = TrainConfig(num_episodes=4)
    for config in (cfg, TrainConfig(num_episodes=4, critic="exact")):
        (row,) = lq.check_problem(p, THETA, 0.3, config, batches=1000)
        assert row["bias_se"] < 4 and row["rel_error"] < 3 * row["rel_se"], row
        assert row["cosine"] > 0.999
    (naive,) = lq.check_problem(p, THETA, 0.3, cfg, batches=1000, method="naive")
    assert naive["bias_se"] > 8 and naive["rel_error"] > 0.03, naive
    out = capsys.readouterr().out
    assert "[bchg, critic=quadratic_loo, 4 episodes x 60 steps, 1000 batches]" in out
    assert "[naive, critic=quadratic_loo," in out


@pytest.mark.slow
def test_zero_discounts_estimate_without_nan(random_lq):
    """gamma_L = 0 or gamma_F = 0 (legal discounts): the score terms' control variate
    E[V(s') | s, b] = (Q - r) / gamma was 0 / 0, so every estimate was NaN and every update
    skipped, with nothing to say why; now BC-HG (score-function FollowerQGrad, control variates)
    is within 4 SE of the exact hypergradient."""
    for field in ("gamma_L", "gamma_F"):
        p = dataclasses.replace(random_lq(jnp.float32), **{field: 0.0}).validate()
        cfg = TrainConfig(num_episodes=4, follower_grad="score")
        (row,) = lq.check_problem(p, THETA, 0.3, cfg, batches=200, verbose=False)
        assert np.all(np.isfinite(row["mean"])) and row["bias_se"] < 4, (field, row)


@pytest.mark.slow
def test_in_sample_critic_and_hpgd_mc_are_flagged(random_lq):
    """The two biases the library documents: the in-sample LSTD critic at 2 episodes (~4%,
    the cross-fitted one within the resolution) and HPGD (MC)'s same-episode return (~68%)."""
    p = random_lq(jnp.float32)
    for critic, biased in (("quadratic", True), ("quadratic_loo", False)):
        cfg = TrainConfig(num_episodes=2, critic=critic)
        (row,) = lq.check_problem(p, THETA, 0.3, cfg, batches=4000, verbose=False)
        assert (row["bias_se"] > 5) == biased, (critic, row)
    (mc,) = lq.check_problem(p, THETA, 0.3, TrainConfig(num_episodes=4), 1000, "hpgd_mc")
    assert mc["bias_se"] > 8 and mc["rel_error"] > 0.3, mc


@pytest.mark.slow
def test_bad_requests_are_refused(random_lq):
    p = random_lq(jnp.float32)
    with pytest.raises(ValueError, match="estimating method"):
        lq.check_problem(p, THETA, 0.3, method="exact")
    with pytest.raises(ValueError, match="batches must be >= 2"):
        lq.check_problem(p, THETA, 0.3, batches=1)
    with pytest.raises(ValueError, match="beta"):
        lq.check_problem(p, THETA, -0.3)
    with pytest.raises(ValueError, match="theta must be finite"):
        lq.check_problem(p, [jnp.array([jnp.nan, 0.0])], 0.3, batches=2)
    cfg = TrainConfig(num_episodes=2, riccati_max_iters=2)
    with pytest.raises(ValueError, match="Riccati solve did not converge"):
        lq.check_problem(p, THETA, 0.3, cfg, batches=2, verbose=False)
