"""Episode buffers and minibatch sampling distributions (toy-game actor-critic)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from bchg_jax.core.buffers import buffer_add, buffer_init, sample_discounted, sample_uniform


def _batch(value, E=3, T=5):
    return (jnp.full((E, T + 1), value), jnp.full((E, T), value), jnp.full((E, T), value))


def test_on_policy_buffer_holds_exactly_the_newest_batch():
    buf = buffer_init(3, 5)
    for v in (1, 2):
        buf = buffer_add(buf, *_batch(v), "on")
    assert int(buf.count) == 3
    assert np.all(np.asarray(buf.a) == 2)


def test_off_policy_buffer_appends_and_samples_only_stored_episodes():
    buf = buffer_init(9, 5)
    buf = buffer_add(buf, *_batch(1), "off")
    e, t = sample_uniform(jax.random.PRNGKey(0), buf, 10_000)
    assert int(buf.count) == 3 and int(e.max()) == 2 and int(t.max()) == 4
    buf = buffer_add(buf, *_batch(2), "off")
    assert int(buf.count) == 6
    np.testing.assert_array_equal(np.asarray(buf.a[:, 0]), [1, 1, 1, 2, 2, 2, 0, 0, 0])
    e, _ = sample_uniform(jax.random.PRNGKey(1), buf, 60_000)
    counts = np.bincount(np.asarray(e), minlength=9)
    assert counts[6:].sum() == 0
    assert np.all(np.abs(counts[:6] / 60_000 - 1 / 6) < 0.01)
    with pytest.raises(ValueError, match="mode"):
        buffer_add(buf, *_batch(3), "both")


@pytest.mark.parametrize("mode", ["on", "off", "ring"])
def test_every_mode_works_under_x64_inside_jit(x64, mode):
    """With jax_enable_x64 a ring's int32 start next to Python-int zeros made
    dynamic_update_slice refuse its indices (int32, int64, int64): the LQR-game CLI crashed."""
    add = jax.jit(lambda buf, s, a, b: buffer_add(buf, s, a, b, mode))
    buf = buffer_init(6, 5)
    for v in (1, 2, 3):
        buf = add(buf, *_batch(float(v)))
    want = {"on": [3, 3, 3, 0, 0, 0], "off": [1, 1, 1, 3, 3, 3], "ring": [3, 3, 3, 2, 2, 2]}
    np.testing.assert_array_equal(np.asarray(buf.a[:, 0]), want[mode])


def test_discounted_sampling_matches_gamma_power_t():
    buf = buffer_add(buffer_init(3, 150), *_batch(1, 3, 150), "on")
    gamma, M = 0.99, 400_000
    _, t = sample_discounted(jax.random.PRNGKey(2), buf, M, gamma)
    t = np.asarray(t)
    p = gamma ** np.arange(150)
    p /= p.sum()
    hist = np.bincount(t, minlength=150) / M
    assert t.min() >= 0 and t.max() <= 149
    # chi-square over 15 bins of 10 steps each
    obs = hist.reshape(15, 10).sum(1) * M
    exp = p.reshape(15, 10).sum(1) * M
    chi2 = np.sum((obs - exp) ** 2 / exp)
    assert chi2 < 37.7  # 99.9% quantile, 14 degrees of freedom
    np.testing.assert_allclose(t.mean(), np.sum(np.arange(150) * p), rtol=0.01)


@pytest.mark.parametrize("sampler", ["uniform", "discounted"])
def test_minibatch_indices_are_the_same_with_x64_on_or_off(sampler):
    """The indices were drawn in JAX's default int, int64 under jax_enable_x64: other random
    bits, so a float32 game run drew other minibatches with x64 on (J apart by up to 0.08
    within 30 toy-game iterations; the Adam rounding left after the fix: 4e-4)."""
    buf = buffer_add(buffer_init(6, 40), *_batch(1.0, 6, 40), "on")

    def draw():
        key = jax.random.key(3)
        if sampler == "uniform":
            return sample_uniform(key, buf, 64)
        return sample_discounted(key, buf, 64, 0.9)

    off = draw()
    with jax.enable_x64(True):
        on = draw()
    for x, y in zip(off, on, strict=True):
        assert y.dtype == jnp.int32
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y))


def test_a_ring_keeps_cycling_and_an_off_policy_buffer_stops_at_capacity():
    """Ring (N 6, E 3): the 4th batch overwrites the 2nd's slots (the oldest), the 5th the 3rd's;
    count keeps every episode added. Off-policy: count min(count + E, N), a batch past capacity
    written over the last E slots. A ring whose N is not a multiple of E is refused."""
    buf, seen = buffer_init(6, 4), []
    for v in (1, 2, 3, 4, 5):
        buf = buffer_add(buf, *_batch(v, T=4), "ring")
        seen.append(np.asarray(buf.a[:, 0]).tolist())
    assert seen[2:] == [[3, 3, 3, 2, 2, 2], [3, 3, 3, 4, 4, 4], [5, 5, 5, 4, 4, 4]]
    assert int(buf.count) == 15
    buf, counts = buffer_init(6, 4), []
    for v in (1, 2, 3):
        buf = buffer_add(buf, *_batch(v, T=4), "off")
        counts.append(int(buf.count))
    assert counts == [3, 6, 6] and buf.a[:, 0].tolist() == [1, 1, 1, 3, 3, 3]
    with pytest.raises(ValueError, match="multiple"):
        buffer_add(buffer_init(6, 4), *_batch(1, E=4, T=4), "ring")


def test_samplers_reach_every_stored_slot_and_step_and_no_empty_one():
    """A full 3-slot buffer: both samplers draw all 3 slots (the last included); a 3-of-9 filled
    off-policy buffer: discounted draws only stored episodes; gamma 1, T 3: each step drawn 1/3
    of the time (30,000 draws: SE 0.003)."""
    full = buffer_add(buffer_init(3, 4), *_batch(1, T=4), "on")
    for sample, key in ((sample_uniform, 0), (lambda k, b, n: sample_discounted(k, b, n, 0.9), 1)):
        e, _ = sample(jax.random.key(key), full, 3000)
        assert sorted(set(np.asarray(e).tolist())) == [0, 1, 2]
    part = buffer_add(buffer_init(9, 5), *_batch(1), "off")
    e, t = sample_discounted(jax.random.key(0), part, 3000, 0.9)
    assert sorted(set(np.asarray(e).tolist())) == [0, 1, 2]
    assert np.all(np.asarray(part.a)[np.asarray(e), np.asarray(t)] == 1)
    two = buffer_add(buffer_init(2, 3), *_batch(1, E=2, T=3), "on")
    _, t = sample_discounted(jax.random.key(0), two, 30_000, 1.0)
    freq = np.bincount(np.asarray(t), minlength=3) / 30_000
    np.testing.assert_allclose(freq, [1 / 3, 1 / 3, 1 / 3], atol=0.02)
