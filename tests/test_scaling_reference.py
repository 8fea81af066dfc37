"""``benchmarks.scaling --reference``: a device's speed rows are judged against the CPU's per-run
J (the same J as the CPU, beside the capped and skipped shares)."""

import json

import numpy as np
import pytest

from benchmarks import scaling


def test_agreement_allows_rounding_and_rare_flips_but_not_a_shifted_program():
    ref = np.linspace(-1.0, 1.0, 100)
    ok, text = scaling.agrees_with_reference(ref * (1 + 1e-6), ref)
    assert ok and "100 runs" in text
    flipped = ref.copy()
    flipped[:5] += 0.5  # five runs whose sampled action flipped on a rounding tie
    assert scaling.agrees_with_reference(flipped, ref)[0]
    flipped[:20] += 0.5  # a fifth of the runs off: not rounding
    assert not scaling.agrees_with_reference(flipped, ref)[0]
    assert not scaling.agrees_with_reference(ref + 1e-3, ref)[0]  # every run moved (TF32 solver)
    bad = ref.copy()
    bad[3] = np.nan
    assert not scaling.agrees_with_reference(bad, ref)[0]
    # a row of R runs is compared on its first min(R, len(reference)) runs
    assert scaling.agrees_with_reference(ref[:1], ref)[0]
    assert scaling.agrees_with_reference(np.concatenate([ref, ref + 5]), ref)[0]
    # relative to the size of J: the thermal J of ~ -260 may move by 2.6e-2 at the median ...
    big = np.full(10, -260.0)
    assert scaling.agrees_with_reference(big + 1e-2, big)[0]
    assert not scaling.agrees_with_reference(big + 1.0, big)[0]
    # ... the LQR game's J of ~0.015 by 1.5e-6: its critic at TF32 moved the median run by
    # 1.4e-5, which max(1, |J|) let pass
    small = np.random.default_rng(0).uniform(0.014, 0.046, 100)
    assert scaling.agrees_with_reference(small * (1 + 1e-6), small)[0]
    assert not scaling.agrees_with_reference(small + 1.4e-5, small)[0]
    # runs near J = 0 are judged against the row's typical |J|, not their own (20 such runs
    # off by 1e-7 would be 20% of the runs off by 100x their |J|)
    near0 = small.copy()
    near0[:20] = 1e-9
    assert scaling.agrees_with_reference(near0 + np.r_[np.full(20, 1e-7), np.zeros(80)], near0)[0]
    zero = np.zeros(4)  # a row of J = 0 exactly: any move fails
    assert scaling.agrees_with_reference(zero, zero)[0]
    assert not scaling.agrees_with_reference(zero + 1e-12, zero)[0]


def test_the_committed_reference_covers_every_row_of_the_device_check():
    """Every (experiment, method) the device check's scaling step runs at 1 to 10,000 runs and 2
    timed iterations has 100 per-run J from the CPU."""
    with open(scaling.REFERENCE_FILE) as f:
        data = json.load(f)
    assert data["jax"] and data["machine"]
    assert scaling.same_random_stream(data["random"]), "this JAX draws other random numbers"
    for name in ("fourrooms", "thermal", "toy_game", "lqr_game"):
        for runs in (1, 100, 1000, 10000):
            method = scaling.trainer_for(name, runs)[0]
            entry = data["J"][scaling.reference_key(name, method, 2)]
            assert len(entry) == scaling.REFERENCE_RUNS and np.all(np.isfinite(entry))


def test_write_reference_is_refused_off_the_cpu(monkeypatch, tmp_path):
    monkeypatch.setattr(scaling.jax, "default_backend", lambda: "gpu")
    with pytest.raises(SystemExit) as e:
        scaling.main(["--experiments", "fourrooms", "--write-reference", str(tmp_path / "r.json")])
    assert e.value.code == 2
    with pytest.raises(SystemExit):
        scaling.main(["--experiments", "fourrooms", "--reference", str(tmp_path / "none.json")])


@pytest.mark.slow
def test_a_row_off_its_reference_fails_the_device_check(tmp_path, capsys):
    path = tmp_path / "ref.json"
    args = "--experiments fourrooms --runs 2 --iterations 1".split()
    scaling.main(args + ["--write-reference", str(path)])
    data = json.loads(path.read_text())
    assert len(data["J"]["fourrooms:bchg:2"]) == 2
    scaling.main(args + ["--reference", str(path), "--fail-on-cap"])
    assert "| yes, 2 runs: median" in capsys.readouterr().out
    data["J"]["fourrooms:bchg:2"] = [x + 0.01 for x in data["J"]["fourrooms:bchg:2"]]
    path.write_text(json.dumps(data))
    with pytest.raises(SystemExit) as e:
        scaling.main(args + ["--reference", str(path), "--fail-on-cap"])
    assert e.value.code == 3
    out = capsys.readouterr().out
    assert "| NO, 2 runs" in out and "off the CPU reference" in out


def test_another_random_stream_is_not_judged(monkeypatch, tmp_path, capsys):
    """A JAX that draws other random numbers than the reference's leaves the rows unjudged
    (said on the table), rather than failing every row for a reason that is not the device."""
    data = {"machine": "m", "jax": "0.0", "random": [0.0], "J": {"fourrooms:bchg:2": [0.5]}}
    path = tmp_path / "ref.json"
    path.write_text(json.dumps(data))
    assert not scaling.same_random_stream([0.0]) and not scaling.same_random_stream(None)
    monkeypatch.setattr(
        scaling, "measure", lambda *a, **k: ("bchg", 1.0, 0.1, {}, np.array([9.0]), None)
    )
    scaling.main(
        "--experiments fourrooms --runs 1 --iterations 1 --fail-on-cap".split()
        + ["--reference", str(path)]
    )
    out = capsys.readouterr().out
    assert "not judged: jax" in out and "| not judged (another random stream) |" in out
