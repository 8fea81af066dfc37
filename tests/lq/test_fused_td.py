"""lq.fused_td: the MLP critic's TD(0) fit as two Pallas kernels per Adam step (run here in
Pallas' interpreter) is critics.td_fit's fit up to float rounding, in the trainer too."""

import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from bchg_jax import lq
from bchg_jax.core.sweep import grid_functions, grid_hparams, seed_keys
from bchg_jax.lq import critics, fused_td
from bchg_jax.problems.thermal import thermal

HIGHEST = jax.lax.Precision.HIGHEST


def _data(key, N=300, D=6):
    k = jax.random.split(key, 3)
    x = jax.random.normal(k[0], (N, D))
    xn = jax.random.normal(k[1], (N, D))
    r = jax.random.normal(k[2], (N,)) * 3.0
    return x, xn, r


@pytest.mark.parametrize("normalize", [pytest.param(False, marks=pytest.mark.slow), True])
def test_the_fit_is_td_fits_up_to_rounding(normalize):
    """Two data sets (vmapped), 40 Adam steps at lr 1e-3, full precision: the parameters agree
    to 1e-3 of the distance the fit moved them (N = 300: the last block of rows is padded). The
    fit amplifies rounding (a ReLU that flips for one transition), so the precise checks are the
    gradient's and the Adam step's below; this one checks the wiring (measured: ~1e-5)."""
    model, params = critics.init_mlp(jax.random.PRNGKey(1), 6, hidden=(32, 32))
    x, xn, r = jax.vmap(_data)(jax.random.split(jax.random.PRNGKey(2), 2))

    def both(x, xn, r):
        xs, ys = critics.scales(x, r, 0.95, normalize)
        fused = fused_td.td_fit_fused(
            params, x, xn, r, 0.95, 40, 1e-3, xs, ys, precision=HIGHEST, interpret=True
        )
        with jax.default_matmul_precision("highest"):
            plain = critics.td_fit(model, params, x, xn, r, 0.95, 40, 1e-3, None, 0, xs, ys)
        return fused, plain

    fused, plain = jax.jit(jax.vmap(both))(x, xn, r)
    err = jax.tree.map(lambda a, b: float(jnp.max(jnp.abs(a - b))), fused, plain)
    moved = jax.tree.map(lambda a, b: float(jnp.max(jnp.abs(a - b[None]))), plain, params)
    assert max(jax.tree.leaves(err)) < 1e-3 * max(jax.tree.leaves(moved)), (err, moved)
    assert min(jax.tree.leaves(moved)) > 1e-3, moved
    assert jax.tree.map(jnp.shape, fused) == jax.tree.map(jnp.shape, plain)


@pytest.mark.slow
def test_the_block_gradients_sum_to_the_td_losss_gradient():
    """Kernel 1 alone, against jax.grad of td_fit's loss: scale-sensitive (Adam's step hardly
    moves when a gradient is scaled), with N = 200 (the last block padded) and non-unit scales;
    padded inputs and outputs get exactly zero."""
    model, params = critics.init_mlp(jax.random.PRNGKey(4), 6, hidden=(32, 32))
    x, xn, r = _data(jax.random.PRNGKey(5), 200, 6)
    xs, ys = critics.scales(x, r, 0.9, True)
    L = fused_td.layout(6, 32)

    def loss(p):
        target = r[:, None] / ys + 0.9 * jax.lax.stop_gradient(model.apply(p, xn / xs))
        return jnp.mean((target - model.apply(p, x / xs)) ** 2)

    with jax.default_matmul_precision("highest"):
        want = jax.grad(loss)(params)
    xa, xna = fused_td.pack_inputs(x, xn, r, L, xs, ys)
    g = fused_td.block_grads(
        xa, xna, fused_td.pack(params, 6), 0.9, 200, L, HIGHEST, interpret=True
    ).sum(0)
    got = fused_td.unpack(g, params, 6)
    for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(want), strict=True):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-5, atol=1e-6)
    assert float(jnp.abs(g[L.w0 + 6 : L.w0 + L.in_pad]).max()) == 0.0
    assert float(jnp.abs(g[L.w2t + 1 : L.w2t + L.out_pad]).max()) == 0.0
    assert float(jnp.abs(g[L.b2, 1:]).max()) == 0.0


def test_the_adam_kernel_is_optaxs_step():
    """Kernel 2 on a summed gradient of three blocks, three steps (gradients from 1 down to 1e-6,
    where eps matters): optax.adam(1e-3)'s parameters, in Pallas' interpreter bit for bit."""
    import optax

    R, H = 5, 16
    theta = jax.random.normal(jax.random.PRNGKey(0), (R, H))
    opt = optax.adam(1e-3)
    state = opt.init(theta)
    th, m, v, t = theta, jnp.zeros((R, H)), jnp.zeros((R, H)), jnp.zeros((R, 1))
    for i in range(3):
        g = jax.random.normal(jax.random.PRNGKey(10 + i), (3, R, H)) * 10.0 ** (-3 * i)
        u, state = opt.update(g.sum(0), state, theta)
        theta = optax.apply_updates(theta, u)
        th, m, v, t = fused_td.adam_step(g, th, m, v, t, 1e-3, interpret=True)
        np.testing.assert_array_equal(np.asarray(th), np.asarray(theta))
        assert float(t[0, 0]) == i + 1


def test_pack_and_unpack_are_inverse_and_the_padding_is_zero():
    _, params = critics.init_mlp(jax.random.PRNGKey(0), 5, hidden=(16, 16))
    theta = fused_td.pack(params, 5)
    L = fused_td.layout(5, 16)
    assert theta.shape == (L.rows, 16) and L.in_pad == 16
    back = fused_td.unpack(theta, params, 5)
    for a, b in zip(jax.tree.leaves(back), jax.tree.leaves(params), strict=True):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    assert float(jnp.abs(theta[L.w0 + 5 : L.w0 + L.in_pad]).max()) == 0.0
    assert float(jnp.abs(theta[L.w2t + 1 : L.w2t + L.out_pad]).max()) == 0.0


@pytest.mark.parametrize(
    "hidden, out, match",
    [
        ((32, 32, 32), 1, "two hidden layers"),
        ((32, 64), 1, "one width"),
        ((32, 32), 2, "one output"),
    ],
)
def test_an_unsupported_critic_is_refused(hidden, out, match):
    _, params = critics.init_mlp(jax.random.PRNGKey(0), 4, out=out, hidden=hidden)
    x, xn, r = _data(jax.random.PRNGKey(0), 16, 4)
    with pytest.raises(ValueError, match=match):
        fused_td.td_fit_fused(params, x, xn, r, 0.9, 2, interpret=True)


@pytest.mark.parametrize(
    "change, match",
    [(dict(mlp_minibatch=64), "full batch"), (dict(mlp_hidden=(64, 32)), "one width")],
)
def test_the_config_refuses_what_the_kernels_cannot_fit(change, match):
    with pytest.raises(ValueError, match=match):
        lq.TrainConfig(critic="mlp", mlp_kernel="fused", **change).validate()
    with pytest.raises(ValueError, match="mlp_kernel"):
        lq.TrainConfig(mlp_kernel="pallas").validate()


def _faithful(kernel):
    return lq.TrainConfig(
        critic="mlp",
        follower_grad="score",
        state_baseline=False,
        control_variates=False,
        num_episodes=3,
        mlp_steps=6,
        mlp_lr=1e-3,
        value_samples=4,
        mlp_kernel=kernel,
    ).validate()


@pytest.mark.slow
def test_the_trainer_with_the_fused_fit_follows_the_xla_one(monkeypatch):
    """The faithful estimator at toy sizes, 2 runs x 3 iterations: theta and J as with
    critics.td_fit up to rounding (the products at full precision in both)."""
    problem = thermal(horizon=88)
    grid = {"lr": np.array([0.1])}
    out, fused_calls = {}, []
    real = fused_td.td_fit_fused

    def spy(*args, **kw):  # the trainer's fused branch is the one that ran
        fused_calls.append(kw.get("interpret"))
        return real(*args, **kw)

    monkeypatch.setattr(fused_td, "td_fit_fused", spy)
    for kernel in ("xla", "fused"):
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            trainer = lq.make_train(problem, "bchg", _faithful(kernel))
        said = [str(w.message) for w in caught if "interpreter" in str(w.message)]
        assert bool(said) == (kernel == "fused")
        init, run = grid_functions(trainer)
        hp = grid_hparams(trainer, grid)
        with jax.default_matmul_precision("highest"):
            state, m = run(init(seed_keys(2), hp), hp, 3)
        out[kernel] = (np.asarray(state.theta), np.asarray(m["J"]))
        assert bool(fused_calls) == (kernel == "fused")  # traced once, in the fused trainer
    np.testing.assert_allclose(out["fused"][0], out["xla"][0], rtol=0, atol=1e-5)
    np.testing.assert_allclose(out["fused"][1], out["xla"][1], rtol=1e-5)
    assert not np.allclose(out["xla"][0][..., 0, :], out["xla"][0][..., 1, :])  # runs differ
