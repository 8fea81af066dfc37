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


def td_fit(model: MLP, params, x: Array, x_next: Array, r: Array, gamma, steps: int = 5000,
           lr: float = 1e-4):
    """``steps`` full-batch Adam steps on the TD(0) loss; ``r`` is [N] or [N, out]."""
    opt = optax.adam(lr)
    r2 = r.reshape(r.shape[0], -1)

    def loss(p):
        target = r2 + gamma * jax.lax.stop_gradient(model.apply(p, x_next))
        return jnp.mean((target - model.apply(p, x)) ** 2)

    def step(c, _):
        p, o = c
        g = jax.grad(loss)(p)
        u, o = opt.update(g, o, p)
        return (optax.apply_updates(p, u), o), None

    (params, _), _ = jax.lax.scan(step, (params, opt.init(params)), None, length=steps)
    return params
