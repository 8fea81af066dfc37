"""The two forms of the sparse soft solver's round of expectation sweeps: the CPU's loop and the
unrolled form compiled for a GPU (fewer kernels). The same iterates, and each chosen where it
should be."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from bchg_jax.problems import fourrooms
from bchg_jax.tabular import sparse
from bchg_jax.tabular.follower import soft_value_iteration


def _round_inputs(dtype, S=40, k=4, R=3, seed=0):
    """A sweep order of a random table with k successors per state (self-loops included) and
    a random (reward, step) of a policy at discount 0.95, as the solver forms them."""
    rng = np.random.default_rng(seed)
    support = np.zeros((S, S), bool)
    for s in range(S):
        support[s, rng.choice(S, size=k, replace=False)] = True
    support[np.arange(S), np.arange(S)] = True
    succ = sparse.successors_from_support(support)
    order = sparse._gauss_seidel_order(np.asarray(succ.index))
    J = order.index.shape[1]
    weights = rng.dirichlet(np.ones(J), size=(S, R)).transpose(0, 2, 1)  # [S, J, R]
    step = jnp.asarray(0.95 * np.where(np.asarray(succ.valid)[..., None], weights, 0.0), dtype)
    reward = jnp.asarray(rng.normal(size=(S, R)), dtype)
    reward, step = sparse._diagonal_solved(reward, step, order.self_mask)
    V0 = jnp.asarray(rng.normal(size=(S, R)), dtype)
    return order, reward, step, V0


@pytest.fixture(autouse=True)
def _default_form(monkeypatch):
    """Every test here starts from the default form, whatever the caller's environment."""
    monkeypatch.delenv(sparse.ROUND_ENV_VAR, raising=False)


def _loop(order, reward, step, V, sweeps):
    for _ in range(sweeps):
        V = sparse._gauss_seidel_sweep(order, reward, step, V)
    return V


@pytest.mark.parametrize(
    "terms, dtype",
    [
        pytest.param(None, "float32", marks=pytest.mark.slow),
        pytest.param(None, "float64", marks=pytest.mark.slow),
        (4, "float32"),
        pytest.param(4, "float64", marks=pytest.mark.slow),
    ],
)
def test_unrolled_round_gives_the_loops_iterates(x64, monkeypatch, dtype, terms):
    """Up to the order of each state's sum over its successors: float64 to 1e-13, float32 to a
    few ulps; and both move V (a wiring error would show as a large difference). At the default
    ROUND_UNROLL_TERMS (25 terms a sweep: 5 sweeps unrolled whole, 16 as 10 and 6) and at 4.5
    sweeps' worth of it (``terms``: 4 a trip, so 5 sweeps leave a remainder of 1 and 16 none)."""
    dtype = jnp.dtype(dtype)
    order, reward, step, V0 = _round_inputs(dtype)
    assert len(order.bounds) >= 3  # several colour classes, so the blocks matter
    per_sweep = len(order.bounds) * order.index.shape[1]
    if terms is not None:
        monkeypatch.setattr(sparse, "ROUND_UNROLL_TERMS", terms * per_sweep + per_sweep // 2)
        assert [sparse._round_unroll(order, n) for n in (1, 3, 5, 16)] == [1, 3, 4, 4]
    else:
        assert [sparse._round_unroll(order, n) for n in (1, 5, 16)] == [1, 5, 10], per_sweep
    for sweeps in (1, 5, 16):
        want = jax.jit(lambda r, s, v, n=sweeps: _loop(order, r, s, v, n))(reward, step, V0)
        got = jax.jit(lambda r, s, v, n=sweeps: sparse._unrolled_round(order, r, s, v, n))(
            reward, step, V0
        )
        assert np.abs(np.asarray(want - V0)).max() > 0.1
        scale = float(np.abs(np.asarray(want)).max())
        tol = 1e-13 * scale if dtype == jnp.float64 else 16 * 2**-23 * scale
        np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=0, atol=tol)


def test_each_platform_is_lowered_with_its_form():
    """Lowered for the CPU: the loop and no optimization barrier; for CUDA: the unrolled form
    (barriers: at least one per colour block and the tables'; JAX writes the unrolled body once
    and calls it) and no loop but the solver's. Lowering needs no GPU."""
    fr = fourrooms()
    succ = sparse.problem_successors(fr)
    P, r = fr.transition(fr.theta0), fr.follower_reward(fr.theta0)
    solve = jax.jit(
        lambda r: sparse.sparse_soft_value_iteration(P, r, 1e-3, 0.99, succ, fr.terminal).V
    )
    colours = len(sparse._gauss_seidel_order(np.asarray(succ.index)).bounds)
    cpu = solve.trace(r).lower(lowering_platforms=("cpu",)).as_text()
    cuda = solve.trace(r).lower(lowering_platforms=("cuda",)).as_text()
    assert cpu.count("optimization_barrier") == 0
    assert cpu.count("stablehlo.while") == 2  # the solver's loop and the round's
    assert cuda.count("optimization_barrier") >= colours + 1
    assert cuda.count("stablehlo.while") == 1


def test_a_large_table_keeps_the_loop_on_a_gpu_too():
    """Where not even two sweeps fit in ROUND_UNROLL_TERMS (here 2 x 26 colours x 40
    successors), CUDA is lowered with the loop: no barrier, a compile of seconds, not minutes."""
    S, k = 2000, 40
    rng = np.random.default_rng(0)
    support = np.zeros((S, S), bool)
    for s in range(S):
        support[s, rng.choice(S, size=k, replace=False)] = True
    succ = sparse.successors_from_support(support)
    order = sparse._gauss_seidel_order(np.asarray(succ.index))
    assert 2 * len(order.bounds) * order.index.shape[1] > sparse.ROUND_UNROLL_TERMS
    assert sparse._round_unroll(order, 16) == 1
    P = jnp.zeros((S, 1, S), jnp.float32)
    r = jnp.zeros((S, 1), jnp.float32)
    solve = jax.jit(lambda P, r: sparse.sparse_soft_value_iteration(P, r, 0.1, 0.9, succ).V)
    cuda = solve.trace(P, r).lower(lowering_platforms=("cuda",)).as_text()
    assert cuda.count("optimization_barrier") == 0 and cuda.count("stablehlo.while") == 2


def _use_unrolled_form(monkeypatch):
    """The sparse soft solver with the GPU's form on this CPU from here on
    (``BCHG_SPARSE_ROUND``, read when it is traced: the caller traces a new ``jit``; the
    solver cache is cleared too, though it does not hold the form, and again at the end)."""
    monkeypatch.setenv(sparse.ROUND_ENV_VAR, "unrolled")
    sparse._soft_solver.cache_clear()


def test_round_form_knob(monkeypatch):
    """``BCHG_SPARSE_ROUND``: auto by default; loop or unrolled forced on any platform (lowered
    for CUDA with loop: no barrier; for the CPU with unrolled: barriers); anything else refused
    by name when the solver is traced."""
    assert sparse.round_form() == "auto"
    fr = fourrooms()
    succ = sparse.problem_successors(fr)
    P, r = fr.transition(fr.theta0), fr.follower_reward(fr.theta0)
    try:
        monkeypatch.setenv(sparse.ROUND_ENV_VAR, "loop")
        sparse._soft_solver.cache_clear()
        solve = jax.jit(lambda r: sparse.sparse_soft_value_iteration(P, r, 1e-3, 0.99, succ).V)
        cuda = solve.trace(r).lower(lowering_platforms=("cuda",)).as_text()
        assert cuda.count("optimization_barrier") == 0
        monkeypatch.setenv(sparse.ROUND_ENV_VAR, "unrolled")
        sparse._soft_solver.cache_clear()
        solve = jax.jit(lambda r: sparse.sparse_soft_value_iteration(P, r, 1e-3, 0.99, succ).V)
        cpu = solve.trace(r).lower(lowering_platforms=("cpu",)).as_text()
        assert cpu.count("optimization_barrier") > 0
        monkeypatch.setenv(sparse.ROUND_ENV_VAR, "fast")
        sparse._soft_solver.cache_clear()
        with pytest.raises(ValueError, match="BCHG_SPARSE_ROUND must be one of"):
            jax.jit(lambda r: sparse.sparse_soft_value_iteration(P, r, 1e-3, 0.99, succ).V)(r)
    finally:
        sparse._soft_solver.cache_clear()


@pytest.mark.slow
def test_the_gpu_form_solves_fourrooms_as_the_loop_form_does(x64, monkeypatch):
    """Four-Rooms in float32 at random thetas and the figure's betas, tolerance 1e-6, batched:
    every lane converges, no farther from the float64 fixed point than dense soft value iteration
    is (both within tol / (1 - gamma) = 1e-4 of it; the loop form's test in test_sparse), within
    one round of the loop form's sweeps, and with the rounds in use (fewer soft sweeps than plain
    soft value iteration: each round is 1 + 16 sweeps)."""
    fr32, fr64 = fourrooms(), fourrooms(dtype=jnp.float64)
    succ = sparse.problem_successors(fr32)
    P32, P64 = fr32.transition(fr32.theta0), fr64.transition(fr64.theta0)
    thetas = jnp.asarray(0.3 * np.random.default_rng(2).standard_normal((8, 105)), jnp.float32)

    @jax.jit
    def solve(theta, beta):
        r = fr32.follower_reward(theta)
        b32 = beta.astype(jnp.float32)
        d = soft_value_iteration(P32, r, b32, 0.99, fr32.terminal, tol=1e-6, max_sweeps=3000)
        s = sparse.sparse_soft_value_iteration(P32, r, b32, 0.99, succ, fr32.terminal)
        r64 = fr64.follower_reward(theta.astype(jnp.float64))
        t = soft_value_iteration(P64, r64, beta, 0.99, fr64.terminal, tol=1e-12, max_sweeps=20000)
        return d, s, t.V

    betas = (1e-3, 3e-3, 5e-3)
    loop_sweeps = [np.asarray(jax.vmap(solve, (0, None))(thetas, b)[1].sweeps) for b in betas]
    try:
        _use_unrolled_form(monkeypatch)
        solve = jax.jit(solve.__wrapped__)
        for beta, loop in zip(betas, loop_sweeps, strict=True):
            d, s, t = jax.vmap(solve, (0, None))(thetas, jnp.float64(beta))
            sweeps = np.asarray(s.sweeps)
            assert np.all(np.abs(sweeps - loop) <= 17), (beta, sweeps, loop)
            assert np.all(sweeps / 17 < 0.5 * np.asarray(d.sweeps)), (beta, sweeps, d.sweeps)
            err_dense, err_sparse = np.abs(d.V - t).max(), np.abs(s.V - t).max()
            assert err_sparse <= 1.2 * err_dense + 1e-6, (beta, err_sparse, err_dense)
            assert err_sparse < 1e-4
    finally:
        sparse._soft_solver.cache_clear()
