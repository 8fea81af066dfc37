"""Small flax networks shared by the actor-critic trainers."""
from __future__ import annotations

from typing import Tuple

import flax.linen as nn


def torch_like_init():
    """U(-1/sqrt(fan_in), 1/sqrt(fan_in)) kernels: PyTorch's nn.Linear default, which the
    reference implementation's networks use (flax's lecun_normal has 3x the variance)."""
    return nn.initializers.variance_scaling(1.0 / 3.0, "fan_in", "uniform")


class MLP(nn.Module):
    """ReLU MLP with ``hidden`` layers and a linear output of size ``out``."""

    hidden: Tuple[int, ...]
    out: int
    torch_init: bool = True

    @nn.compact
    def __call__(self, x):
        kw = {"kernel_init": torch_like_init()} if self.torch_init else {}
        for h in self.hidden:
            x = nn.relu(nn.Dense(h, **kw)(x))
        return nn.Dense(self.out, **kw)(x)
