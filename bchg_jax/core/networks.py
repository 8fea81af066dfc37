"""Small flax networks shared by the actor-critic trainers."""

from __future__ import annotations

from typing import Any, Optional, Tuple

import flax.linen as nn
import jax.numpy as jnp


def torch_like_init():
    """U(-1/sqrt(fan_in), 1/sqrt(fan_in)) kernels: PyTorch's nn.Linear default, which the
    reference implementation's networks use (flax's lecun_normal has 3x the variance).

    Returns:
      a flax initializer ``init(key, shape, dtype)`` for [fan_in, fan_out] kernels.
    """
    return nn.initializers.variance_scaling(1.0 / 3.0, "fan_in", "uniform")


class MLP(nn.Module):
    """ReLU MLP with ``hidden`` layers and a linear output of size ``out`` (every network of the
    library: the game actors and critics, the LQ MLP critics).

    ``torch_init=True``: U(+-1/sqrt(fan_in)) kernels (:func:`torch_like_init`); False: flax's
    default lecun_normal. ``param_dtype``: the parameters' dtype (computations follow it).
    ``precision``: the layers' matmul precision; ``None`` (default) follows
    ``jax_default_matmul_precision`` (TF32 on a GPU), ``"highest"`` is full float32 on every
    backend (for a network that must resolve input differences below ~1e-3 of its inputs).

    Attributes:
      hidden: widths of the hidden layers (e.g. (64, 64)).
      out: size of the linear output layer.
      torch_init: kernel initialisation (see above).
      param_dtype: the parameters' dtype.
      precision: ``None`` or a ``jax.lax.Precision`` name (``"highest"``).
    """

    hidden: Tuple[int, ...]
    out: int
    torch_init: bool = True
    param_dtype: Any = jnp.float32
    precision: Optional[str] = None

    @nn.compact
    def __call__(self, x):
        """Applies the network: ``x`` [..., d_in] -> [..., out]."""
        kw = {"kernel_init": torch_like_init()} if self.torch_init else {}
        kw["param_dtype"] = self.param_dtype
        kw["precision"] = self.precision
        for h in self.hidden:
            x = nn.relu(nn.Dense(h, **kw)(x))
        return nn.Dense(self.out, **kw)(x)
