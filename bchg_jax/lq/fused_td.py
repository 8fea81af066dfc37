"""The MLP critic's TD(0) fit (:func:`bchg_jax.lq.critics.td_fit`, full batch) as two GPU kernels
per Adam step (Pallas, Triton).

On a GPU the fit is a chain of small kernels: XLA makes one Adam step of the paper's critic
(64-64 ReLU MLP, 10,000 transitions) 27 kernels (the forward pass on s and s', the backward
pass with split-K weight gradients, four bias-gradient sums, an Adam update per parameter
array), and at ~1.7 us a kernel the 5,000 steps of one fit take ~0.22 s, the faithful thermal
run's whole iteration (``benchmarks.gpu_kernels``; docs/performance.md). Here a step is two:

1. :func:`block_grads`: a grid of row blocks (``BLOCK_ROWS`` transitions each, one program
   per block), each computing, for its transitions, the forward pass on x and x', the TD errors
   ``delta = r / y_scale + gamma f(x') - f(x)`` (x' without gradient, as in ``td_fit``), and the
   backward pass of ``mean(delta^2)``: its share of every parameter's gradient, written as one
   row block of a ``[blocks, rows, H]`` array;
2. :func:`adam_step`: a grid over the parameter rows, each program summing its row over the
   blocks (a fixed order: the same sum every call) and taking optax's Adam step on it.

All parameters live in one ``[rows, H]`` array (:func:`pack`): W0 (inputs padded with zero rows
to ``in_pad``), b0, W1, b1, W2 transposed (outputs padded to ``out_pad``), b2 (padded to H), so
each program reads and writes plain row slices. Padded inputs, outputs and transitions carry
zero gradients, so they stay zero. The same maths as ``td_fit``: full batch, the semi-gradient
TD(0) loss, optax's ``adam(lr)``; the result differs by float rounding (the sums run in another
order): 6e-8 after 50 full-precision steps that moved the parameters by 0.03-0.05 (the tests
compare the gradients, the fits and the trainer). The products run
at ``precision`` (None: JAX's default, TF32 on an NVIDIA GPU unless the caller set
``jax_default_matmul_precision``; a neural critic may use it, docs/performance.md).

Supported: the critic of :func:`bchg_jax.lq.critics.init_mlp` with two hidden layers of one
width H (a power of two, 16 to 128), one output, ``in_dim + 2 <= 64`` (:func:`supports`).
``interpret=True`` runs the kernels with Pallas' interpreter (any backend, slowly: tests).
"""

from __future__ import annotations

import functools
import os
from typing import NamedTuple

import jax
import jax.numpy as jnp

from bchg_jax.lq.critics import check_td_settings

Array = jax.Array

BLOCK_ROWS = 128  # transitions per program of the gradient kernel
#: the environment variable that says whether the trainers run the kernels in Pallas'
#: interpreter ("1") or compile them ("0"); unset: the interpreter on any backend but a GPU
ENV_INTERPRET = "BCHG_FUSED_INTERPRET"
ADAM_B1, ADAM_B2, ADAM_EPS = 0.9, 0.999, 1e-8  # optax.adam's defaults (td_fit's optimiser)


def interpret_default() -> bool:
    """Whether the kernels run in Pallas' interpreter: ``$BCHG_FUSED_INTERPRET`` (``0`` / ``1``)
    if set (``benchmarks.gpu_kernels`` compiles for a GPU from a CPU machine), else on every
    backend but a GPU (read by :func:`td_fit_fused` with ``interpret=None`` and by the LQ
    trainer's ``make_train``)."""
    value = os.environ.get(ENV_INTERPRET)
    if value is not None:
        if value not in ("0", "1"):
            raise ValueError(f"{ENV_INTERPRET} must be 0 or 1, got {value!r}")
        return value == "1"
    return jax.default_backend() != "gpu"


def _pow2(n: int, least: int = 16) -> int:
    p = least
    while p < n:
        p *= 2
    return p


class Layout(NamedTuple):
    """Where each parameter sits in the packed ``[rows, H]`` array (row offsets)."""

    in_dim: int
    in_pad: int  # inputs padded to this (>= in_dim + 2: a mask and a reward column)
    hidden: int
    out_pad: int  # W2's output rows padded to this
    w0: int
    b0: int
    w1: int
    b1: int
    w2t: int
    b2: int
    rows: int


def layout(in_dim: int, hidden: int) -> Layout:
    """The packed layout of a 2-hidden-layer (``hidden`` wide) MLP with ``in_dim`` inputs."""
    in_pad = _pow2(in_dim + 2)
    out_pad = 16
    w0, b0 = 0, in_pad
    w1 = b0 + 1
    b1 = w1 + hidden
    w2t = b1 + 1
    b2 = w2t + out_pad
    return Layout(in_dim, in_pad, hidden, out_pad, w0, b0, w1, b1, w2t, b2, b2 + 1)


def supports(params, in_dim: int) -> str | None:
    """None when :func:`td_fit_fused` can fit this critic, else why not."""
    p = params.get("params", params)
    names = sorted(p)
    if names != ["Dense_0", "Dense_1", "Dense_2"]:
        return f"two hidden layers are supported, got the layers {names}"
    h0, h1 = p["Dense_0"]["kernel"].shape[1], p["Dense_1"]["kernel"].shape[1]
    out = p["Dense_2"]["kernel"].shape[1]
    if h0 != h1 or h0 not in (16, 32, 64, 128):
        return f"hidden layers of one width in (16, 32, 64, 128) are supported, got ({h0}, {h1})"
    if out != 1:
        return f"one output is supported, got {out}"
    if in_dim + 2 > 64:
        return f"at most 62 inputs are supported, got {in_dim}"
    return None


def pack(params, in_dim: int) -> Array:
    """Flax MLP parameters -> the packed ``[rows, H]`` float32 array (module docstring)."""
    p = params.get("params", params)
    H = p["Dense_1"]["kernel"].shape[0]
    L = layout(in_dim, H)
    theta = jnp.zeros((L.rows, H), jnp.float32)
    theta = theta.at[L.w0 : L.w0 + in_dim].set(p["Dense_0"]["kernel"])
    theta = theta.at[L.b0].set(p["Dense_0"]["bias"])
    theta = theta.at[L.w1 : L.w1 + H].set(p["Dense_1"]["kernel"])
    theta = theta.at[L.b1].set(p["Dense_1"]["bias"])
    theta = theta.at[L.w2t].set(p["Dense_2"]["kernel"][:, 0])
    theta = theta.at[L.b2, 0].set(p["Dense_2"]["bias"][0])
    return theta


def unpack(theta: Array, like, in_dim: int):
    """The packed array -> parameters shaped and typed like the flax pytree ``like``."""
    p = like.get("params", like)
    H = theta.shape[1]
    L = layout(in_dim, H)
    dt = p["Dense_0"]["kernel"].dtype
    out = {
        "Dense_0": {"kernel": theta[L.w0 : L.w0 + in_dim], "bias": theta[L.b0]},
        "Dense_1": {"kernel": theta[L.w1 : L.w1 + H], "bias": theta[L.b1]},
        "Dense_2": {"kernel": theta[L.w2t][:, None], "bias": theta[L.b2, :1]},
    }
    out = jax.tree.map(lambda a: a.astype(dt), out)
    return {"params": out} if "params" in like else out


def _grad_kernel(x_ref, xn_ref, th_ref, scal_ref, g_ref, *, L: Layout, precision):
    """One block of transitions: its share of the TD(0) loss' gradient (module docstring)."""
    from jax.experimental import pallas as pl

    dot = functools.partial(jnp.dot, precision=precision, preferred_element_type=jnp.float32)
    H, P, Q = L.hidden, L.in_pad, L.out_pad
    xr = x_ref[...]  # [B, P]: inputs, column P-2 the row mask, column P-1 the scaled reward
    B = xr.shape[0]
    cols = jax.lax.broadcasted_iota(jnp.int32, (B, P), 1)
    x = jnp.where(cols < P - 2, xr, 0.0)
    mask = jnp.sum(jnp.where(cols == P - 2, xr, 0.0), axis=1, keepdims=True)  # [B, 1]
    r = jnp.sum(jnp.where(cols == P - 1, xr, 0.0), axis=1, keepdims=True)
    xn = xn_ref[...]  # its extra columns meet zero rows of W0
    w0 = th_ref[pl.ds(L.w0, P), :]
    b0 = th_ref[pl.ds(L.b0, 1), :]
    w1 = th_ref[pl.ds(L.w1, H), :]
    b1 = th_ref[pl.ds(L.b1, 1), :]
    w2t = th_ref[pl.ds(L.w2t, Q), :]  # [Q, H], row 0 the output's weights
    b2 = th_ref[pl.ds(L.b2, 1), pl.ds(0, Q)]  # [1, Q]
    gamma, scale = scal_ref[0, 0], scal_ref[0, 1]
    # x': the bootstrap target, no gradient
    hn = jnp.maximum(dot(xn, w0) + b0, 0.0)
    hn = jnp.maximum(dot(hn, w1) + b1, 0.0)
    yn = dot(hn, w2t.T) + b2  # [B, Q]
    z1 = dot(x, w0) + b0
    h1 = jnp.maximum(z1, 0.0)
    z2 = dot(h1, w1) + b1
    h2 = jnp.maximum(z2, 0.0)
    y = dot(h2, w2t.T) + b2
    ocols = jax.lax.broadcasted_iota(jnp.int32, (B, Q), 1)
    # d mean(delta^2) / d f(x) = -2 delta / N, on the output column of real transitions only
    gy = jnp.where(ocols == 0, scale * (r + gamma * yn - y) * mask, 0.0)
    gz2 = jnp.where(z2 > 0, dot(gy, w2t), 0.0)
    gz1 = jnp.where(z1 > 0, dot(gz2, w1.T), 0.0)
    g_ref[0, pl.ds(L.w0, P), :] = dot(x.T, gz1)
    g_ref[0, pl.ds(L.b0, 1), :] = jnp.sum(gz1, axis=0, keepdims=True)
    g_ref[0, pl.ds(L.w1, H), :] = dot(h1.T, gz2)
    g_ref[0, pl.ds(L.b1, 1), :] = jnp.sum(gz2, axis=0, keepdims=True)
    g_ref[0, pl.ds(L.w2t, Q), :] = dot(gy.T, h2)
    # b2's row in one store (two overlapping stores of one program need not land in order):
    # the output's error in column 0 of an H-wide tile, zeros elsewhere
    hcols = jax.lax.broadcasted_iota(jnp.int32, (B, H), 1)
    g_ref[0, pl.ds(L.b2, 1), :] = jnp.sum(
        jnp.where(hcols == 0, jnp.sum(gy, axis=1, keepdims=True), 0.0), axis=0, keepdims=True
    )


def _adam_kernel(g_ref, th_ref, m_ref, v_ref, t_ref, lr_ref, th_out, m_out, v_out, t_out):
    """One parameter row: its gradient summed over the blocks, then optax's Adam step."""
    g = jnp.sum(g_ref[...], axis=0, keepdims=True)  # [1, H]
    t = t_ref[0, 0] + 1.0  # this row's step count (each row keeps its own: no shared write)
    m = ADAM_B1 * m_ref[...] + (1.0 - ADAM_B1) * g
    v = ADAM_B2 * v_ref[...] + (1.0 - ADAM_B2) * g * g
    # 1 - b^t as optax computes it (float32 power): the fit is sensitive to rounding (a flipped
    # ReLU), so the kernel rounds as td_fit's optimiser does where it can
    f32 = jnp.float32
    m_hat = m / (1.0 - jnp.power(f32(ADAM_B1), t))
    v_hat = v / (1.0 - jnp.power(f32(ADAM_B2), t))
    th_out[...] = th_ref[...] - lr_ref[0, 0] * m_hat / (jnp.sqrt(v_hat) + ADAM_EPS)
    m_out[...] = m
    v_out[...] = v
    t_out[...] = jnp.full((1, 1), t, jnp.float32)


def _compiler_params(interpret: bool):
    if interpret:
        return None
    from jax.experimental.pallas import triton as plgpu

    # 8 warps: a block's [128, 64] activations in registers without spilling (not tuned)
    return plgpu.CompilerParams(num_warps=8, num_stages=1)


def block_grads(
    xa: Array,
    xna: Array,
    theta: Array,
    gamma,
    n: int,
    L: Layout,
    precision=None,
    interpret: bool = False,
) -> Array:
    """``[blocks, rows, H]``: each block's share of the gradient (kernel 1 of the module
    docstring). ``xa`` / ``xna`` are the packed transitions (:func:`pack_inputs`)."""
    from jax.experimental import pallas as pl

    blocks = xa.shape[0] // BLOCK_ROWS
    H, P = L.hidden, L.in_pad
    scal = jnp.stack([jnp.asarray(gamma, jnp.float32), jnp.float32(-2.0 / n)])[None]
    rows = pl.BlockSpec((BLOCK_ROWS, P), lambda i: (i, 0))
    return pl.pallas_call(
        functools.partial(_grad_kernel, L=L, precision=precision),
        out_shape=jax.ShapeDtypeStruct((blocks, L.rows, H), jnp.float32),
        grid=(blocks,),
        in_specs=[
            rows,
            rows,
            pl.BlockSpec((L.rows, H), lambda i: (0, 0)),
            pl.BlockSpec((1, 2), lambda i: (0, 0)),
        ],
        out_specs=pl.BlockSpec((1, L.rows, H), lambda i: (i, 0, 0)),
        interpret=interpret,
        compiler_params=_compiler_params(interpret),
        name="td_block_grads",
    )(xa, xna, theta, scal)


def adam_step(
    grads: Array, theta: Array, m: Array, v: Array, t: Array, lr, interpret: bool = False
):
    """(theta, m, v, t) after one Adam step on the block-summed gradient (kernel 2); ``t``
    ``[rows, 1]``: the steps taken, per row."""
    from jax.experimental import pallas as pl

    blocks, R, H = grads.shape
    row = pl.BlockSpec((1, H), lambda i: (i, 0))
    count = pl.BlockSpec((1, 1), lambda i: (i, 0))
    return pl.pallas_call(
        _adam_kernel,
        out_shape=[jax.ShapeDtypeStruct((R, H), jnp.float32)] * 3
        + [jax.ShapeDtypeStruct((R, 1), jnp.float32)],
        grid=(R,),
        in_specs=[
            pl.BlockSpec((blocks, None, H), lambda i: (0, i, 0)),
            row,
            row,
            row,
            count,
            pl.BlockSpec((1, 1), lambda i: (0, 0)),
        ],
        out_specs=[row, row, row, count],
        input_output_aliases={1: 0, 2: 1, 3: 2, 4: 3},  # in place: each program owns its row
        interpret=interpret,
        compiler_params=_compiler_params(interpret),
        name="td_adam",
    )(grads, theta, m, v, t, jnp.asarray(lr, jnp.float32).reshape(1, 1))


def pack_inputs(x: Array, x_next: Array, r: Array, L: Layout, x_scale, y_scale):
    """``(xa, xna)`` ``[Np, in_pad]`` float32: the scaled inputs, with the row mask and the
    scaled reward in the last two columns of ``xa``; rows padded with zeros (mask 0) to a
    power-of-two number of blocks (the padded programs add zero gradients)."""
    N, d = x.shape
    blocks = _pow2(-(-N // BLOCK_ROWS), least=1)
    Np = blocks * BLOCK_ROWS
    P = L.in_pad
    f32 = jnp.float32
    xs = jnp.asarray(x_scale, f32)
    xa = jnp.zeros((Np, P), f32).at[:N, :d].set(x.astype(f32) / xs)
    xa = xa.at[:N, P - 2].set(1.0)
    xa = xa.at[:N, P - 1].set(r.reshape(N).astype(f32) / jnp.asarray(y_scale, f32).reshape(()))
    xna = jnp.zeros((Np, P), f32).at[:N, :d].set(x_next.astype(f32) / xs)
    return xa, xna


def td_fit_fused(
    params,
    x: Array,
    x_next: Array,
    r: Array,
    gamma,
    steps: int = 5000,
    lr: float = 1e-4,
    x_scale=None,
    y_scale=None,
    precision=None,
    interpret: bool | None = None,
):
    """:func:`bchg_jax.lq.critics.td_fit` at full batch, two kernels per Adam step (module
    docstring): the same arguments (the model is the 2-hidden-layer MLP of ``params``).

    Args:
      params: the flax parameters of the critic (:func:`bchg_jax.lq.critics.init_mlp`).
      x: [N, in] inputs of the transitions.
      x_next: [N, in] inputs of the next steps.
      r: [N] or [N, 1] rewards.
      gamma: discount, scalar.
      steps: number of Adam steps.
      lr: Adam learning rate.
      x_scale: optional [in] input scale (default ones).
      y_scale: optional [1] output scale (default ones).
      precision: the products' precision (None: JAX's default; ``lax.Precision.HIGHEST``: full
        float32).
      interpret: run the kernels in Pallas' interpreter (any backend; tests); None:
        :func:`interpret_default` (the interpreter off a GPU).
    Returns:
      the fitted parameters, shaped like ``params``.
    Raises:
      ValueError: a critic :func:`supports` does not take, or bad settings as
        :func:`bchg_jax.lq.critics.td_fit`.
    """
    check_td_settings(gamma, steps, lr)
    N, d = x.shape
    interpret = interpret_default() if interpret is None else interpret
    why = supports(params, d)
    if why is not None:
        raise ValueError(f"td_fit_fused: {why}")
    H = params.get("params", params)["Dense_1"]["kernel"].shape[0]
    L = layout(d, H)
    xs = jnp.ones(d, jnp.float32) if x_scale is None else x_scale
    ys = jnp.ones(1, jnp.float32) if y_scale is None else y_scale
    xa, xna = pack_inputs(x, x_next, r, L, xs, ys)
    theta = pack(params, d)

    def step(c, _):
        th, m, v, t = c
        g = block_grads(xa, xna, th, gamma, N, L, precision, interpret)
        return adam_step(g, th, m, v, t, lr, interpret), None

    zeros = jnp.zeros_like(theta)
    init = (theta, zeros, zeros, jnp.zeros((theta.shape[0], 1), jnp.float32))
    (theta, _, _, _), _ = jax.lax.scan(step, init, None, length=steps)
    return unpack(theta, params, d)
