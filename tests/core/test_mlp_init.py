"""``core.networks``: the MLP's kernel initialisations (PyTorch's U(+-1/sqrt(fan_in)) by default,
flax's lecun_normal otherwise), its forward pass (ReLU hidden layers in the given order, a linear
output), and that ``precision`` and ``param_dtype`` reach every layer.

References: the initialisers' closed-form bounds and standard deviations, and a NumPy forward
pass with the network's own parameters."""

import jax
import jax.numpy as jnp
import numpy as np

from bchg_jax.core.networks import MLP, torch_like_init
from bchg_jax.core.precision import low_precision_dots

D_IN, HIDDEN, OUT = 200, (64, 32), 5


def _kernels(params):
    layers = params["params"]
    return [np.asarray(layers[f"Dense_{i}"]["kernel"]) for i in range(len(layers))]


def test_default_init_is_torch_uniform_over_fan_in():
    """torch_init (the default): every kernel [fan_in, fan_out] is U(-1/sqrt(fan_in),
    1/sqrt(fan_in)): within the bound, reaching it, with std bound / sqrt(3). Layers with
    fan_in != fan_out tell fan_in from fan_out."""
    net = MLP(HIDDEN, OUT)
    params = net.init(jax.random.key(0), jnp.ones((1, D_IN)))
    fans = (D_IN,) + HIDDEN
    for k, fan_in, fan_out in zip(_kernels(params), fans, HIDDEN + (OUT,), strict=True):
        assert k.shape == (fan_in, fan_out)
        bound = 1.0 / np.sqrt(fan_in)
        assert np.max(np.abs(k)) <= bound * (1 + 1e-6)
        assert np.max(np.abs(k)) >= 0.9 * bound
        np.testing.assert_allclose(np.std(k), bound / np.sqrt(3.0), rtol=0.15)
    # the initialiser on its own
    k = np.asarray(torch_like_init()(jax.random.key(1), (400, 100), jnp.float32))
    assert 0.95 * 0.05 <= np.max(np.abs(k)) <= 0.05 * (1 + 1e-6)


def test_flax_init_when_torch_init_is_false():
    """torch_init=False: flax's lecun_normal, std 1/sqrt(fan_in), i.e. sqrt(3) times the torch
    init's (values beyond 1/sqrt(fan_in) occur)."""
    params = MLP(HIDDEN, OUT, torch_init=False).init(jax.random.key(0), jnp.ones((1, D_IN)))
    k = _kernels(params)[0]
    np.testing.assert_allclose(np.std(k), 1.0 / np.sqrt(D_IN), rtol=0.1)
    assert np.max(np.abs(k)) > 1.5 / np.sqrt(D_IN)


def test_forward_pass_is_relu_hidden_layers_and_a_linear_output():
    """x -> relu(x W0 + b0) -> relu(. W1 + b1) -> . W2 + b2 in the order of ``hidden``; the
    output can be negative (no ReLU on it)."""
    net = MLP((3, 7), 4)
    params = net.init(jax.random.key(2), jnp.ones((1, 2)))
    layers = params["params"]
    assert [layers[f"Dense_{i}"]["kernel"].shape for i in range(3)] == [(2, 3), (3, 7), (7, 4)]
    # nonzero biases so a dropped bias or activation shows
    shift = {"Dense_0": 0.1, "Dense_1": 0.1, "Dense_2": -0.3}
    params = {
        "params": {
            n: {"kernel": L["kernel"], "bias": L["bias"] + shift[n]} for n, L in layers.items()
        }
    }
    x = np.asarray(jax.random.normal(jax.random.key(3), (16, 2)), np.float64)
    h = x
    for i in range(2):
        L = params["params"][f"Dense_{i}"]
        h = np.maximum(h @ np.asarray(L["kernel"], np.float64) + np.asarray(L["bias"]), 0.0)
    L = params["params"]["Dense_2"]
    want = h @ np.asarray(L["kernel"], np.float64) + np.asarray(L["bias"])
    got = np.asarray(net.apply(params, jnp.asarray(x, jnp.float32)))
    assert got.shape == (16, 4) and np.min(want) < 0
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


def test_precision_highest_reaches_every_layer():
    """precision="highest" puts every layer's product at full precision (the LQR game's critic
    option); the default leaves them at the user's setting."""
    x = jnp.ones((5, 3))
    for hidden in ((8,), (8, 4)):
        net = MLP(hidden, 2, precision="highest")
        params = net.init(jax.random.key(0), x)
        assert low_precision_dots(net.apply, params, x) == []
        plain = MLP(hidden, 2)
        assert len(low_precision_dots(plain.apply, params, x)) == len(hidden) + 1


def test_param_dtype_float64_is_kept(x64):
    """param_dtype=float64: every parameter and the output are float64 (the float64 trainers)."""
    net = MLP((8, 4), 2, param_dtype=jnp.float64)
    params = net.init(jax.random.key(0), jnp.ones((1, 3), jnp.float64))
    assert {str(p.dtype) for p in jax.tree.leaves(params)} == {"float64"}
    assert net.apply(params, jnp.ones((2, 3), jnp.float64)).dtype == jnp.float64
