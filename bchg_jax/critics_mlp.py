"""The paper's neural critics for continuous problems (faithful mode): flax MLPs trained by TD(0).

As in the reference implementation (following Thoma et al.'s HPGD code): a 64-64 ReLU network,
re-initialised to the *same* parameters every outer iteration and trained with ``steps``
full-batch Adam steps (lr 1e-4) on the semi-gradient TD loss
``mean((r + gamma sg(f(x')) - f(x))^2)`` (Algorithm "CriticUpdate (TD)"); the whole loop is a
``lax.scan``. Used for the leader's Q_L(s, b) (scalar) and HPGD's grad_theta V_F(s) (vector).
"""
from __future__ import annotations

from typing import Sequence

import flax.linen as nn
import jax
import jax.numpy as jnp
import optax

Array = jax.Array


class MLP(nn.Module):
    hidden: Sequence[int] = (64, 64)
    out: int = 1

    @nn.compact
    def __call__(self, x):
        for h in self.hidden:
            x = nn.relu(nn.Dense(h)(x))
        return nn.Dense(self.out)(x)


def init_mlp(key: Array, in_dim: int, out: int = 1, hidden: Sequence[int] = (64, 64),
             dtype=jnp.float32):
    model = MLP(tuple(hidden), out)
    return model, model.init(key, jnp.zeros((1, in_dim), dtype))


def scales(x: Array, r: Array, gamma, normalize: bool):
    """(x_scale, y_scale) of a normalised critic: inputs divided by their RMS, outputs multiplied
    by RMS(r) / (1 - gamma) (per output); ones when ``normalize`` is False (the paper's MLP)."""
    if not normalize:
        return jnp.ones(x.shape[-1], x.dtype), jnp.ones(r.reshape(r.shape[0], -1).shape[-1], x.dtype)
    xs = jnp.sqrt(jnp.mean(x ** 2, 0)) + 1e-6
    ys = jnp.sqrt(jnp.mean(r.reshape(r.shape[0], -1) ** 2, 0)) / (1.0 - gamma) + 1e-6
    return jax.lax.stop_gradient(xs), jax.lax.stop_gradient(ys)


def apply_scaled(model: MLP, params, x: Array, x_scale: Array, y_scale: Array) -> Array:
    return model.apply(params, x / x_scale) * y_scale


def td_fit(model: MLP, params, x: Array, x_next: Array, r: Array, gamma, steps: int = 5000,
           lr: float = 1e-4, key=None, minibatch: int = 0, x_scale=None, y_scale=None):
    """``steps`` Adam steps on the TD(0) loss (full batch, or ``minibatch`` random samples per
    step with ``key``); ``r`` is [N] or [N, out]. With ``x_scale`` / ``y_scale`` the network
    sees ``x / x_scale`` and predicts ``f / y_scale`` (see :func:`scales`)."""
    opt = optax.adam(lr)
    r2 = r.reshape(r.shape[0], -1)
    xs = jnp.ones(x.shape[-1], x.dtype) if x_scale is None else x_scale
    ys = jnp.ones(r2.shape[-1], x.dtype) if y_scale is None else y_scale
    N = x.shape[0]

    def loss(p, idx):
        xb, xn, rb = (x, x_next, r2) if idx is None else (x[idx], x_next[idx], r2[idx])
        target = rb / ys + gamma * jax.lax.stop_gradient(model.apply(p, xn / xs))
        return jnp.mean((target - model.apply(p, xb / xs)) ** 2)

    def step(c, k):
        p, o = c
        idx = None if not minibatch else jax.random.randint(k, (minibatch,), 0, N)
        g = jax.grad(loss)(p, idx)
        u, o = opt.update(g, o, p)
        return (optax.apply_updates(p, u), o), None

    keys = jax.random.split(jax.random.PRNGKey(0) if key is None else key, steps)
    (params, _), _ = jax.lax.scan(step, (params, opt.init(params)), keys)
    return params
