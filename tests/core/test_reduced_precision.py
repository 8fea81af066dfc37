"""The CPU emulation of reduced-precision products (``core.reduced_precision``) and what it shows:
whole trainers whose solvers converge and whose results match the CPU's under TF32 rounding.

Before the sparse solvers' bodies carried the full-precision scope, the Four-Rooms trainer under
TF32 hit the follower's sweep cap in ~70% of its iterations (the structural test of the whole
vmapped program in ``test_precision.py`` fails on that code too).
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from bchg_jax import lq, problems, tabular
from bchg_jax.core import sweep
from bchg_jax.core.precision import full_precision
from bchg_jax.core.reduced_precision import (
    BF16_BITS,
    TF32_BITS,
    emulate_reduced_precision,
    round_mantissa,
)


def test_round_mantissa_keeps_the_bits_asked_for():
    x = jax.random.uniform(jax.random.key(0), (4096,), jnp.float32, -1e3, 1e3)
    for bits in (TF32_BITS, BF16_BITS):
        y = np.asarray(round_mantissa(x, bits), np.float64)
        rel = np.abs(y - np.asarray(x, np.float64)) / np.abs(np.asarray(x, np.float64))
        assert rel.max() <= 2.0 ** -(bits + 1) * (1 + 1e-6)  # half a unit in the last place
        assert rel.max() > 2.0 ** -(bits + 1) * 0.9  # and it does round
        # the result has no bit below the kept mantissa
        u = np.asarray(jax.lax.bitcast_convert_type(round_mantissa(x, bits), jnp.uint32))
        assert np.all(u & ((1 << (23 - bits)) - 1) == 0)
    # ties to even: 1 + 2^-11 lies halfway between 1 and 1 + 2^-10 (TF32) -> 1
    tie = jnp.float32(1.0 + 2.0**-11)
    assert float(round_mantissa(tie, 10)) == 1.0
    assert float(round_mantissa(jnp.float32(1.0 + 3 * 2.0**-11), 10)) == 1.0 + 2 * 2.0**-10
    special = jnp.asarray([jnp.inf, -jnp.inf, jnp.nan, 0.0], jnp.float32)
    out = np.asarray(round_mantissa(special, 7))
    assert out[0] == np.inf and out[1] == -np.inf and np.isnan(out[2]) and out[3] == 0.0
    assert round_mantissa(jnp.ones(3, jnp.int32), 7).dtype == jnp.int32


def test_emulation_rounds_default_products_and_leaves_full_ones():
    a = jax.random.normal(jax.random.key(1), (64, 64))
    b = jax.random.normal(jax.random.key(2), (64, 64))
    exact = np.asarray(a, np.float64) @ np.asarray(b, np.float64)
    err = lambda f: np.abs(np.asarray(jax.jit(f)(a, b)) - exact).max()  # noqa: E731
    plain = lambda x, y: x @ y  # noqa: E731
    before = err(plain)
    with emulate_reduced_precision() as counts:
        rounded = err(plain)
        full = err(full_precision(lambda x, y: x @ y))
    assert counts == {"rounded": 1, "full": 1}
    assert before < 1e-4 and full == pytest.approx(before, rel=0.5)
    assert 1e-3 < rounded < 0.1  # TF32: ~5e-4 relative on entries of |8|
    assert err(lambda x, y: x @ y + 0.0) < 1e-4  # compiled after the block: exact again
    with pytest.raises(ValueError, match="mantissa_bits"):
        with emulate_reduced_precision(23):
            pass


def test_emulation_refuses_a_device_backend(monkeypatch):
    """On a GPU machine the programs compile for the GPU, which the CPU rule cannot round: the
    emulation says so instead of emulating nothing."""
    monkeypatch.setattr(jax, "default_backend", lambda: "gpu")
    with pytest.raises(RuntimeError, match="JAX_PLATFORMS=cpu"):
        with emulate_reduced_precision():
            pass


def test_a_users_table_functions_run_at_full_precision_wherever_they_are_called():
    """A linear model ``P0 + theta . D`` (rows summing to 1 for every theta) evaluated by a
    sampler or an estimator outside any solver's scope: under TF32 its rows summed to 1 +- ~1e-3
    before the problem classes wrapped their table functions (a row sum off by d moves the values
    by about gamma d / (1 - gamma): 10% at gamma 0.99)."""
    key = jax.random.key(4)
    S, B, D = 5, 2, 3
    P0 = jnp.full((S, B, S), 1.0 / S)
    Dir = jax.random.uniform(jax.random.fold_in(key, 1), (D, S, B, S), minval=-0.03, maxval=0.03)
    Dir = Dir - Dir.mean(-1, keepdims=True)  # each direction keeps the row sums
    table = lambda th: P0 + jnp.einsum("d,dsbt->sbt", th, Dir)  # noqa: E731
    problem = tabular.TabularCMDP(
        transition=table,
        init_dist=lambda th: jnp.full((S,), 1.0 / S),
        follower_reward=lambda th: jnp.ones((S, B)) * th[0],
        leader_reward=lambda th: jnp.ones((S, B)),
        gamma_F=0.99,
        gamma_L=0.99,
        theta0=jnp.asarray([0.3, -0.7, 1.1]),
    ).validate()
    th = problem.theta0
    with emulate_reduced_precision():
        rows = jax.jit(problem.transition)(th).sum(-1)
        raw = jax.jit(table)(th).sum(-1)  # the same function, not wrapped
        sampler = jax.jit(problem.sampler_transition)(th).sum(-1)
    assert np.abs(np.asarray(raw) - 1).max() > 1e-5  # the emulation does round it
    assert np.abs(np.asarray(rows) - 1).max() < 1e-6
    assert np.abs(np.asarray(sampler) - 1).max() < 1e-6
    # the LQ family's model functions are wrapped the same way
    thermal = problems.thermal()
    for field in ("A_fn", "B_fn", "leader_quadratic"):
        assert getattr(getattr(thermal, field), "full_precision", False), field


def test_the_command_line_wrapper_runs_a_module_under_emulation(tmp_path, monkeypatch, capsys):
    """``python -m benchmarks.reduced_precision [--bits B] MODULE ARGS``: the module runs with its
    own arguments, its products rounded to B bits, and its exit status is kept."""
    from benchmarks.reduced_precision import main

    (tmp_path / "one_product.py").write_text(
        "import sys, jax, jax.numpy as jnp, numpy as np\n"
        "x = jnp.full((4, 4), 1.0 + 2.0**-9, jnp.float32)\n"
        "out = float(jax.jit(lambda a: a @ a)(x)[0, 0])\n"
        "print('product', out, sys.argv[1:])\n"
        "sys.exit(3 if sys.argv[1:] == ['--fail'] else 0)\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr("sys.argv", ["x"])
    assert main(["one_product", "--a", "1"]) == 0  # TF32 keeps 2^-9
    out = capsys.readouterr()
    assert f"product {4 * (1 + 2.0**-9) ** 2}" in out.out and "['--a', '1']" in out.out
    assert "products compiled rounded" in out.err
    assert main(["--bits", "7", "one_product", "--fail"]) == 3  # bfloat16 drops 2^-9
    assert "product 4.0 ['--fail']" in capsys.readouterr().out


def _grid_run(trainer, grid, seeds, iterations):
    _, metrics = sweep.run_grid(trainer, grid, seeds, iterations, chunk=iterations, verbose=False)
    return metrics


@pytest.mark.slow
def test_fourrooms_trainer_under_tf32_converges_and_matches_the_cpu():
    """The sparse (default) solver inside the vmapped grid program, as the command line runs it."""
    fr = problems.fourrooms()
    make = lambda: tabular.make_train(fr, "bchg", tabular.TrainConfig(iterations=4))  # noqa: E731
    cpu = _grid_run(make(), {"lr": [0.1]}, 2, 4)
    with emulate_reduced_precision():
        emu = _grid_run(make(), {"lr": [0.1]}, 2, 4)
    assert cpu["solve_capped"].sum() == 0
    assert emu["solve_capped"].sum() == 0, "the follower's solves hit their cap under TF32"
    assert np.abs(emu["sweeps"] - cpu["sweeps"]).max() <= 0.1 * cpu["sweeps"].max()
    np.testing.assert_allclose(emu["J"], cpu["J"], atol=1e-5)


@pytest.mark.slow
def test_thermal_trainer_under_tf32_converges_and_matches_the_cpu():
    th = problems.thermal()
    make = lambda: lq.make_train(th, "bchg", lq.TrainConfig(num_episodes=20))  # noqa: E731
    cpu = _grid_run(make(), {"lr": [0.1]}, 2, 3)
    with emulate_reduced_precision():
        emu = _grid_run(make(), {"lr": [0.1]}, 2, 3)
    assert cpu["update_skipped"].sum() == 0
    assert emu["solve_capped"].sum() == 0 and emu["update_skipped"].sum() == 0
    np.testing.assert_allclose(emu["J"], cpu["J"], rtol=1e-5)
